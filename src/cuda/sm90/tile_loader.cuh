// The parts of a grouped-GEMM CTA that do not depend on the MMA instruction, shared by the
// mma.sync kernels (moe_gemm.cuh) and the wgmma kernels (moe_wgmma.cuh): which tile a CTA owns,
// and the cp.async copies of one 64-wide reduction step (the block's prepacked A tiles and scales,
// and the BLOCK_N gathered B rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe_kernels.h"
#include "cuda/ptx.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/weight_layout.h"

namespace mxmoe::cuda::sm90 {

// Work item `item` of a GEMM: item = tile_idx * m_units + m_unit, so consecutive items share one
// token tile (its B rows stay in L2) and walk the expert's row blocks. A unit is a whole block of
// kBlockRowGroups row groups, or with kSplit = 2 (wg128h) half of one: m_units = kSplit * m_tiles.
// The caller has checked tile_idx < *p.num_tiles.
template <int kBlockN, int kSplit = 1>
__device__ __forceinline__ TileCoords TileOf(const GemmParams& p, uint32_t item) {
  const uint32_t m_units = static_cast<uint32_t>(p.m_tiles) * kSplit;
  const int m_unit = static_cast<int>(item % m_units);
  const int tile_idx = static_cast<int>(item / m_units);
  const int2 tile = p.tiles[tile_idx];
  TileCoords tc;
  tc.expert = tile.x;
  tc.seg_begin = p.expert_offsets[tile.x] + tile.y;
  tc.n_valid = min(kBlockN, p.expert_offsets[tile.x + 1] - tc.seg_begin);
  tc.group0 = static_cast<int64_t>(m_unit) * (kBlockRowGroups / kSplit);
  return tc;
}

// The real row groups (of 16 rows) of the block that holds a tile's rows: kBlockRowGroups, or fewer
// in the last block. A block's tiles of one reduction step are that many kTileBytes apart.
__device__ __forceinline__ int BlockGroupsOf(const GemmParams& p, const TileCoords& tc) {
  return static_cast<int>(p.a_shape.GroupsInBlock(tc.group0 / kBlockRowGroups));
}

// The real row groups of a tile's unit (kSplit as in TileOf): all of its block's for whole blocks;
// for a half block those of its half, 0 for a second half past the last real row.
template <int kSplit = 1>
__device__ __forceinline__ int GroupsOf(const GemmParams& p, const TileCoords& tc) {
  constexpr int kUnitGroups = kBlockRowGroups / kSplit;
  const int left = BlockGroupsOf(p, tc) - static_cast<int>(tc.group0 % kBlockRowGroups);
  return left < 0 ? 0 : left < kUnitGroups ? left : kUnitGroups;
}

// The CTA's tile, work item `item` (TileOf). Unless smem_rows is null, fills smem_rows[n] with the
// B source row of tile column n (-1 past the segment). Returns false for items past the real tile
// count (the grid is sized for the worst case before the routing is known). Ends with a barrier.
template <int kBlockN, bool kFc1, int kSplit = 1>
__device__ __forceinline__ bool ReadTile(const GemmParams& p, uint32_t item, int tid, int threads,
                                         int32_t* smem_rows, TileCoords* tc) {
  if (static_cast<int64_t>(item / (static_cast<uint32_t>(p.m_tiles) * kSplit)) >= *p.num_tiles) return false;
  *tc = TileOf<kBlockN, kSplit>(p, item);
  for (int n = tid; smem_rows != nullptr && n < kBlockN; n += threads) {
    int row = -1;
    if (n < tc->n_valid) row = kFc1 ? p.sorted_pairs[tc->seg_begin + n] / p.top_k : tc->seg_begin + n;
    smem_rows[n] = row;
  }
  __syncthreads();
  return true;
}

// The copies of the 64-wide steps, in order, issued by all kThreads threads. Every thread copies
// the same 16-byte pieces at every step, so the sources are computed once and then advanced: a
// step costs each thread a few 16-byte cp.async and a handful of address increments.
template <int kBlockN, int kThreads>
struct StepLoader {
  static constexpr int kAUnits = kBlockRowGroups * kTileBytes / 16;
  static constexpr int kSUnits = kBlockRowGroups * kTileScaleBytes / 16;
  static constexpr int kBUnits = kBlockN * 8;  // 128-byte rows of 64 bf16
  static constexpr int kAIters = kAUnits / kThreads;
  static constexpr int kBIters = (kBUnits + kThreads - 1) / kThreads;
  static_assert(kAUnits % kThreads == 0 && kSUnits <= kThreads, "copy split");

  int groups;           // row groups in the block (16, or fewer in the last block)
  const uint8_t* src_a;  // this thread's first A piece of the next step
  const uint8_t* src_s;
  int a_units;          // this thread's A pieces that exist (the block may have fewer row groups)
  bool s_ok;
  int a_step;           // bytes from one step's A tiles to the next
  int col;              // first reduction column of the next step
  int k_valid;          // valid reduction length
  const uint16_t* b_src[kBIters];  // this thread's B pieces at column 0 (null: zero-fill)
  int b_dst[kBIters];
  int b_col[kBIters];

  // The copies start at step first_step (a CTA that takes part of the reduction).
  __device__ __forceinline__ void Init(const GemmParams& p, const TileCoords& tc, const int32_t* smem_rows,
                                       int tid, int first_step) {
    const PackedShape& shape = p.a_shape;
    groups = GroupsOf(p, tc);
    const int64_t first_tile =
        static_cast<int64_t>(tc.expert) * shape.Tiles() + shape.TileIndex(tc.group0, first_step);
    src_a = p.a_tiles + first_tile * kTileBytes + tid * 16;
    src_s = p.a_scales + first_tile * kTileScaleBytes + tid * 16;
    a_units = 0;
#pragma unroll
    for (int i = 0; i < kAIters; ++i) a_units += tid + i * kThreads < groups * (kTileBytes / 16) ? 1 : 0;
    s_ok = tid < groups * (kTileScaleBytes / 16);
    a_step = groups * kTileBytes;
    col = first_step * kTileCols;
    k_valid = static_cast<int>(shape.cols);
#pragma unroll
    for (int i = 0; i < kBIters; ++i) {
      const int u = tid + i * kThreads;
      const int n = u >> 3, unit = u & 7;
      const int row = u < kBUnits ? smem_rows[n] : -1;
      b_src[i] = row >= 0 ? p.b + static_cast<int64_t>(row) * p.b_stride + unit * 8 : nullptr;
      b_col[i] = unit * 8;
      // NOTE: the 16-byte unit of row n goes to unit ^ (n % 8). ldmatrix reads 8 rows of one unit
      // (rows 128 bytes apart would hit the same 4 banks unswizzled), and this is exactly wgmma's
      // 128-byte swizzle of a K-major operand when the tile starts 1024-byte aligned (PTX ISA
      // 9.7.15.5.1.2, Table 38: the 128B atom is 8 rows x 8 units; the swizzle XORs address
      // bits 4..6 with bits 7..9).
      b_dst[i] = n * 128 + ((unit ^ (n & 7)) << 4);
    }
  }

  // Thread 0 only (its pieces are the first of each step, so its sources are the block's): asks
  // the L2 for the weights and scales of the step `ahead` steps after the one IssueNext copies
  // next. The caller keeps that step within the CTA's reduction.
  __device__ __forceinline__ void PrefetchL2(int ahead) const {
    ptx::PrefetchBulkL2(src_a + ahead * a_step, static_cast<uint32_t>(a_step));
    ptx::PrefetchBulkL2(src_s + ahead * groups * kTileScaleBytes, static_cast<uint32_t>(groups * kTileScaleBytes));
  }

  // The next step into the shared-window addresses smem_a (groups A tiles), smem_s (their scales)
  // and smem_b (BLOCK_N rows); columns past k_valid and rows past the segment are zero-filled
  // (cp.async with 0 source bytes, from any valid address).
  __device__ __forceinline__ void IssueNext(uint32_t smem_a, uint32_t smem_s, uint32_t smem_b, int tid,
                                            const uint16_t* any_b) {
#pragma unroll
    for (int i = 0; i < kAIters; ++i)
      if (i < a_units) ptx::CpAsync16(smem_a + (tid + i * kThreads) * 16, src_a + i * kThreads * 16);
    if (s_ok) ptx::CpAsync16(smem_s + tid * 16, src_s);
#pragma unroll
    for (int i = 0; i < kBIters; ++i) {
      if (kBUnits % kThreads != 0 && tid + i * kThreads >= kBUnits) continue;
      const bool ok = b_src[i] != nullptr && col + b_col[i] < k_valid;
      ptx::CpAsync16(smem_b + b_dst[i], ok ? b_src[i] + col : any_b, ok ? 16u : 0u);
    }
    src_a += a_step;
    src_s += groups * kTileScaleBytes;
    col += kTileCols;
  }
};

}  // namespace mxmoe::cuda::sm90
