// The fused grouped GEMMs of the MoE on SM120: one kernel template for FC1 (bias, activation and
// MXFP8 re-quantization of the intermediate in its epilogue) and FC2 (router weight, one fp32 row
// per (token, slot) for the deterministic combine), built on the block-scaled warp MMA
// mma.sync.m16n8k32.kind::mxf8f6f4 (e4m3 A x e2m1 B, a UE8M0 scale per 32 of K for each, fp32
// accumulation): the MX blocks go to the tensor core as they are, no dequantization.
//
// Orientation: MMA M is tokens, N is weight rows. A CTA computes BLOCK_M token rows of one
// expert's segment by BLOCK_N weight rows, over the whole reduction in 128-wide k-tiles (four
// k32 MMA steps, four MX blocks: one byte of each scale register per step).
//   A: e4m3 rows (FC1: the quantized input, gathered by token; FC2: the intermediate at the
//      sorted positions), cp.async'ed into an XOR-swizzled tile and read with ldmatrix, which
//      hands out exactly the m16n8k32 A fragment (8-bit data moved as b16 pairs). Their scales,
//      4 bytes per row and k-tile, go to the lanes SfaLane names.
//   B: the packed weights (weight_layout_sm120.h): one 16-byte load per lane and n8 tile holds
//      the lane's B registers for the four steps; a shift and a mask per register.
// Each warp owns 16 * kMFrags tokens by one 64-row weight group (8 n8 tiles). For FC1 a group is
// 32 intermediates as (gate, up) column pairs, so the activation is lane-local and one MX block of
// the intermediate is one quad's 8 x 4 values: the re-quantization reduces over 4 lanes and
// writes e4m3 codes + UE8M0 scales, exactly FC2's A operand.
//
// Emulation: under MXMOE_SM120_EMULATION the sm_90a build of this file runs the software model of
// the MMA (mma_mxf8f6f4.cuh) in place of the instruction; nothing else differs.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "core/activation_math.h"
#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/ptx.cuh"
#include "cuda/sm120/mma_mxf8f6f4.cuh"
#include "cuda/sm120/sm120_kernels.h"
#include "cuda/sm120/weight_layout_sm120.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda::sm120 {

// ---- config -----------------------------------------------------------------------------------
// NOTE: SM120 (compute capability 12.0) gives a block at most 99 KB of shared memory and an SM
// 100 KB (SPEC section 6; the same limits as 8.6 / 8.9), 1 KB of each block's reserved by the
// runtime. kMinBlocks is the residency the config is sized for.
inline constexpr int kSmemPerBlockMax = 99 * 1024;
inline constexpr int kSmemPerSm = 100 * 1024;
inline constexpr int kSmemReservedPerBlock = 1024;

template <int kWarpsM_, int kWarpsN_, int kMFrags_, int kStages_, int kMinBlocks_>
struct GemmConfig {
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kWarps = kWarpsM * kWarpsN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMFrags = kMFrags_;       // m16 token tiles per warp
  static constexpr int kNFrags = kGroupNTiles;   // n8 weight tiles per warp: one 64-row group
  static constexpr int kWarpM = 16 * kMFrags;
  static constexpr int kBlockM = kWarpsM * kWarpM;
  static constexpr int kBlockN = kWarpsN * kGroupRows;
  static constexpr int kBlockK = kKTile;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  // One stage: A codes (128 bytes per token row), B pieces, B scales, A scales (4 bytes per row).
  static constexpr int kSmemA = kBlockM * kBlockK;
  static constexpr int kSmemB = kWarpsN * kPieceBytes;
  static constexpr int kSmemSfb = kWarpsN * kPieceScaleBytes;
  static constexpr int kSmemSfa = kBlockM * 4;
  static constexpr int kOffB = kSmemA;
  static constexpr int kOffSfb = kOffB + kSmemB;
  static constexpr int kOffSfa = kOffSfb + kSmemSfb;
  static constexpr int kSmemStage = kOffSfa + kSmemSfa;
  static constexpr int kSmemBytes = kStages * kSmemStage;
  static constexpr int kSmemStatic = kBlockM * 4;  // the tile's source rows

  static_assert(kBlockK == 4 * 32, "a k-tile is four k32 steps: one byte of a scale register each");
  static_assert(kMFrags >= 1 && kMFrags <= 4, "m16 tiles per warp");
  static_assert(kWarps >= 1 && kWarps <= 8, "warps per CTA");
  static_assert(kStages >= 2 && kStages <= 8, "cp.async pipeline depth");
  static_assert(kSmemStage % 16 == 0 && kOffB % 128 == 0 && kOffSfb % 16 == 0 && kOffSfa % 16 == 0,
                "16-byte cp.async destinations");
  static_assert((kBlockM * 8) % kThreads == 0, "A copies split evenly over the threads");
  static_assert((kWarpsN * kPieceBytes / 16) % kThreads == 0, "B copies split evenly over the threads");
  static_assert(kWarpsN * kPieceScaleBytes / 16 <= kThreads && kBlockM <= kThreads, "scale copies: one per thread");
  static_assert(kSmemBytes + kSmemStatic <= kSmemPerBlockMax, "SM120: 99 KB of shared memory per block");
  static_assert(kMinBlocks * (kSmemBytes + kSmemStatic + kSmemReservedPerBlock) <= kSmemPerSm,
                "the intended CTAs per SM do not fit SM120's 100 KB of shared memory");
};

// The instantiations, one per translation unit (moe_gemm_sm120_m*.cu); ChooseGemmConfig picks.
// Decode: a few tokens per expert; the weights stream from DRAM once, 2 CTAs per SM keep
// 2 x 3 stages of 8 KB in flight per SM.
using ConfigM16 = GemmConfig</*warps M*/ 1, /*warps N*/ 2, /*m16 per warp*/ 1, /*stages*/ 4, /*CTAs/SM*/ 2>;
// Prefill: 64 tokens x 256 weight rows, 8 warps of 32 x 64, 3 stages of 25 KB.
using ConfigM64 = GemmConfig<2, 4, 2, 3, 1>;

// The selectors every MMA uses: step s reads byte s of the scale registers (a k-tile's four MX
// blocks); the A scales come from the lane pair thread-id-a = 0 names, the B scales from lane
// 4 n (every lane of a quad holds its column's scales, so any thread-id-b would do).
inline constexpr int kThreadIdA = 0;
inline constexpr int kThreadIdB = 0;

// ---- device pieces ----------------------------------------------------------------------------
// 4-byte global -> shared copy; bytes past src_bytes (0..4) are zero-filled (PTX ISA, cp.async:
// cp-size 4 needs .ca). The A scales of a k-tile are 4 bytes per row, fewer at the end of K.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(ptx::SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ uint32_t WordOf(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The fragments of one k-tile a warp reads once: its 8 tiles' B words and B scales, its m16
// tiles' A scales.
template <class Cfg>
struct TileFrags {
  uint4 b_words[Cfg::kNFrags];
  FragS sfb[Cfg::kNFrags];
  FragS sfa[Cfg::kMFrags];
};

// sfa_row: the row within an m16 tile whose scales this lane carries (SfaRowOfLane).
template <class Cfg>
__device__ __forceinline__ void LoadTileFrags(const uint8_t* stage, int warp_m, int warp_n, int lane,
                                              int sfa_row, TileFrags<Cfg>& f) {
  const uint8_t* piece = stage + Cfg::kOffB + warp_n * kPieceBytes;
#pragma unroll
  for (int j = 0; j < Cfg::kNFrags; ++j) f.b_words[j] = *reinterpret_cast<const uint4*>(piece + LaneCodeOffset(j, lane));
  const uint4* sfb = reinterpret_cast<const uint4*>(stage + Cfg::kOffSfb + warp_n * kPieceScaleBytes + LaneScaleOffset(lane));
  const uint4 s0 = sfb[0], s1 = sfb[1];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f.sfb[j][0] = WordOf(s0, j);
    f.sfb[4 + j][0] = WordOf(s1, j);
  }
#pragma unroll
  for (int mf = 0; mf < Cfg::kMFrags; ++mf) {
    const int row = warp_m * Cfg::kWarpM + mf * 16 + sfa_row;
    f.sfa[mf][0] = *reinterpret_cast<const uint32_t*>(stage + Cfg::kOffSfa + row * 4);
  }
}

// One k32 step: the A fragments by ldmatrix, then kMFrags x 8 MMAs.
template <class Cfg, int kStep>
__device__ __forceinline__ void MmaStep(const uint8_t* stage, int warp_m, int lane, const TileFrags<Cfg>& f,
                                        FragC (&acc)[Cfg::kMFrags][Cfg::kNFrags]) {
  // NOTE: PTX ISA §9.7.14.5.10 (Fig. 88): A registers 0..3 are (rows 0-7, k 0-15), (rows 8-15,
  // k 0-15), (rows 0-7, k 16-31), (rows 8-15, k 16-31), 4 consecutive k per lane at 4 t: as b16
  // pairs these are four 8x8 ldmatrix matrices (lane l receives row l / 4, bytes 4 (l % 4) ..),
  // so lanes 8q .. 8q + 7 address the rows of matrix q.
  const int r = (lane & 7) + 8 * ((lane >> 3) & 1);
  const int unit = 2 * kStep + (lane >> 4);  // 16-byte unit of the 128-byte row
  FragA frag_a[Cfg::kMFrags];
#pragma unroll
  for (int mf = 0; mf < Cfg::kMFrags; ++mf) {
    const int row = warp_m * Cfg::kWarpM + mf * 16 + r;
    ptx::LdMatrixX4(frag_a[mf].elems, stage + row * Cfg::kBlockK + ((unit ^ (row & 7)) << 4));
  }
#pragma unroll
  for (int j = 0; j < Cfg::kNFrags; ++j) {
    FragB frag_b;
    BWordToFragB(WordOf(f.b_words[j], kStep), &frag_b[0], &frag_b[1]);
#pragma unroll
    for (int mf = 0; mf < Cfg::kMFrags; ++mf)
      mma_mxf8f6f4_m16n8k32<kStep, kThreadIdA, kStep, kThreadIdB>(acc[mf][j], frag_a[mf], frag_b, acc[mf][j],
                                                                  f.sfa[mf], f.sfb[j]);
  }
}

// ---- kernel -----------------------------------------------------------------------------------
template <class Cfg, bool kFc1>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) MoeGemmSm120Kernel(const __grid_constant__ GemmParams p) {
#if defined(MXMOE_SM120_MMA_AVAILABLE)
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t smem_rows[Cfg::kBlockM];  // A source row of each tile row, -1 past the segment
  ptx::EnterPipelineKernel();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  const int n_block = static_cast<int>(blockIdx.x % static_cast<uint32_t>(p.n_blocks));
  const int tile_idx = static_cast<int>(blockIdx.x / static_cast<uint32_t>(p.n_blocks));
  if (tile_idx >= *p.num_tiles) return;
  const int2 tile = p.tiles[tile_idx];
  const int expert = tile.x;
  const int seg_begin = p.expert_offsets[expert] + tile.y;
  const int m_valid = min(Cfg::kBlockM, p.expert_offsets[expert + 1] - seg_begin);

  for (int m = tid; m < Cfg::kBlockM; m += Cfg::kThreads) {
    int row = -1;
    if (m < m_valid) row = kFc1 ? p.sorted_pairs[seg_begin + m] / p.top_k : seg_begin + m;
    smem_rows[m] = row;
  }
  __syncthreads();

  const PackedShape& shape = p.b_shape;
  const int group0 = n_block * Cfg::kWarpsN;
  const int groups = static_cast<int>(min(static_cast<int64_t>(Cfg::kWarpsN), shape.groups - group0));
  const int k_tiles = static_cast<int>(shape.k_tiles);
  const int k_valid = static_cast<int>(p.k_valid);
  const int k_blocks = k_valid / kMxBlock;
  const int64_t first_piece = static_cast<int64_t>(expert) * shape.Pieces() + shape.Piece(group0, 0);
  const uint8_t* gmem_b = p.b_codes + first_piece * kPieceBytes;
  const uint8_t* gmem_sfb = p.b_scales + first_piece * kPieceScaleBytes;

  // Every thread copies the same pieces at every k-tile, so their sources are fixed here.
  constexpr int kAUnits = Cfg::kBlockM * 8, kBUnits = Cfg::kWarpsN * (kPieceBytes / 16);
  constexpr int kSfbUnits = Cfg::kWarpsN * (kPieceScaleBytes / 16);
  constexpr int kAIters = kAUnits / Cfg::kThreads, kBIters = kBUnits / Cfg::kThreads;
  const uint8_t* a_src[kAIters];
  int a_dst[kAIters], a_col[kAIters];
#pragma unroll
  for (int i = 0; i < kAIters; ++i) {
    const int u = tid + i * Cfg::kThreads;
    const int m = u >> 3, unit = u & 7;
    const int row = smem_rows[m];
    a_src[i] = row >= 0 ? p.a_codes + static_cast<int64_t>(row) * p.a_stride + unit * 16 : nullptr;
    a_col[i] = unit * 16;
    // NOTE: ldmatrix reads 8 rows of one 16-byte unit; rows are 128 bytes apart, so without the
    // XOR swizzle all 8 would hit the same 4 banks.
    a_dst[i] = m * Cfg::kBlockK + ((unit ^ (m & 7)) << 4);
  }
  const int sfa_row = tid < Cfg::kBlockM ? smem_rows[tid] : -1;
  const uint8_t* sfa_src = sfa_row >= 0 ? p.a_scales + static_cast<int64_t>(sfa_row) * p.a_scale_stride : nullptr;
  // B pieces of groups past the expert's last are not copied: their warps skip the MMAs.
  const uint8_t* b_src[kBIters];
  int b_dst[kBIters];
#pragma unroll
  for (int i = 0; i < kBIters; ++i) {
    const int u = tid + i * Cfg::kThreads;
    const int grp = u / (kPieceBytes / 16), c = u % (kPieceBytes / 16);
    b_src[i] = grp < groups ? gmem_b + static_cast<int64_t>(grp) * k_tiles * kPieceBytes + c * 16 : nullptr;
    b_dst[i] = grp * kPieceBytes + c * 16;
  }
  const uint8_t* sfb_src = nullptr;
  if (tid < kSfbUnits) {
    const int grp = tid / (kPieceScaleBytes / 16), c = tid % (kPieceScaleBytes / 16);
    if (grp < groups) sfb_src = gmem_sfb + static_cast<int64_t>(grp) * k_tiles * kPieceScaleBytes + c * 16;
  }

  auto load_stage = [&](int stage_idx, int kt) {
    uint8_t* stage = smem + stage_idx * Cfg::kSmemStage;
    const int col0 = kt * Cfg::kBlockK;
#pragma unroll
    for (int i = 0; i < kAIters; ++i) {
      // K is a multiple of 32, so a 16-byte unit is all valid or all past the end (zero-filled:
      // e4m3 zeros; an unfilled NaN code would poison the row's sum in the MMA).
      const bool ok = a_src[i] != nullptr && col0 + a_col[i] < k_valid;
      ptx::CpAsync16(stage + a_dst[i], ok ? a_src[i] + col0 : p.a_codes, ok ? 16u : 0u);
    }
    if (tid < Cfg::kBlockM) {
      const int left = k_blocks - 4 * kt;
      const uint32_t bytes = sfa_src == nullptr ? 0u : static_cast<uint32_t>(left < 0 ? 0 : (left > 4 ? 4 : left));
      CpAsync4(stage + Cfg::kOffSfa + tid * 4, bytes ? sfa_src + 4 * kt : p.a_scales, bytes);
    }
#pragma unroll
    for (int i = 0; i < kBIters; ++i)
      if (b_src[i] != nullptr) ptx::CpAsync16(stage + Cfg::kOffB + b_dst[i], b_src[i] + static_cast<int64_t>(kt) * kPieceBytes);
    if (sfb_src != nullptr)
      ptx::CpAsync16(stage + Cfg::kOffSfb + tid * 16, sfb_src + static_cast<int64_t>(kt) * kPieceScaleBytes);
  };

  FragC acc[Cfg::kMFrags][Cfg::kNFrags];
#pragma unroll
  for (int mf = 0; mf < Cfg::kMFrags; ++mf)
#pragma unroll
    for (int j = 0; j < Cfg::kNFrags; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mf][j][i] = 0.0f;

  // A warp whose group is past the expert's last row skips the MMAs (warp-uniform, as the MMA's
  // .sync.aligned requires).
  const bool warp_active = warp_n < groups;
  // Lane pair thread-id-a of quad g carries rows g and g + 8; the other pair loads the rows it
  // would carry under the other selector, so either selector reads the right scales.
  const int lane_sfa_row = SfaRowOfLane(lane, (lane % 4) / 2);

#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    ptx::CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::CpAsyncWait<Cfg::kStages - 2>();  // k-tile kt has landed (one commit per stage, empty ones too)
    __syncthreads();                        // ... for every thread, and stage kt - 1 is free
    const int next = kt + Cfg::kStages - 1;
    if (next < k_tiles) load_stage(next % Cfg::kStages, next);
    ptx::CpAsyncCommit();
    if (warp_active) {
      const uint8_t* stage = smem + (kt % Cfg::kStages) * Cfg::kSmemStage;
      TileFrags<Cfg> frags;
      LoadTileFrags<Cfg>(stage, warp_m, warp_n, lane, lane_sfa_row, frags);
      MmaStep<Cfg, 0>(stage, warp_m, lane, frags, acc);
      MmaStep<Cfg, 1>(stage, warp_m, lane, frags, acc);
      MmaStep<Cfg, 2>(stage, warp_m, lane, frags, acc);
      MmaStep<Cfg, 3>(stage, warp_m, lane, frags, acc);
    }
  }
  ptx::CpAsyncWait<0>();
  if (!warp_active) return;

  // NOTE: PTX ISA §9.7.14.5.10 (Fig. 92): accumulator i of a lane is row g + 8 (i / 2), column
  // 2 t + i % 2 of the 16 x 8 tile.
  const int g = lane >> 2, t = lane & 3;
  const int group = group0 + warp_n;
  const ExpertParams ep = p.experts[expert];
  if constexpr (kFc1) {
    // Tile j, columns 2t / 2t + 1 = gate / up of intermediate 32 group + 8 t + j
    // (weight_layout_sm120.h): this lane's 8 consecutive intermediates, one quad's 32 one MX block.
    const int64_t i0 = static_cast<int64_t>(group) * 32 + 8 * t;
    const int64_t bias_at = static_cast<int64_t>(expert) * p.inter + i0;
    float gate_bias[Cfg::kNFrags], up_bias[Cfg::kNFrags];
#pragma unroll
    for (int j = 0; j < Cfg::kNFrags; ++j) {
      gate_bias[j] = ep.has_gate_bias ? p.gate_bias[bias_at + j] : 0.0f;
      up_bias[j] = ep.has_up_bias ? p.up_bias[bias_at + j] : 0.0f;
    }
#pragma unroll
    for (int mf = 0; mf < Cfg::kMFrags; ++mf)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float a[Cfg::kNFrags];
        float amax = 0.0f;
        int finite = 1;
#pragma unroll
        for (int j = 0; j < Cfg::kNFrags; ++j) {
          float gv = acc[mf][j][2 * half], uv = acc[mf][j][2 * half + 1];
          if (ep.has_gate_bias) gv += gate_bias[j];
          if (ep.has_up_bias) uv += up_bias[j];
          a[j] = apply_activation(p.act, gv, uv, ep.act);
          const float m = fabsf(a[j]);
          if (!(m <= FLT_MAX)) finite = 0;  // NaN or Inf: the block's scale is NaN
          else amax = fmaxf(amax, m);
        }
        // The 4 lanes of a quad hold the same token row's 32 intermediates.
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
          amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
          finite &= __shfl_xor_sync(0xFFFFFFFFu, finite, off);
        }
        const int s = mxfp8_scale_exponent(amax);
        // A block with a NaN scale also gets NaN codes: it reads as NaN whether or not the
        // hardware honours the NaN scale (the reference dequantizes it to NaN either way).
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < Cfg::kNFrags; ++j) {
          const uint32_t code = finite ? float_to_e4m3(ldexpf(a[j], -s)) : 0x7Fu;
          if (j < 4) lo |= code << (8 * j);
          else hi |= code << (8 * (j - 4));
        }
        const int row = warp_m * Cfg::kWarpM + mf * 16 + g + 8 * half;
        if (row < m_valid) {
          const int64_t pos = seg_begin + row;
          *reinterpret_cast<uint2*>(p.h_codes + pos * p.h_stride + i0) = make_uint2(lo, hi);
          if (t == 0) p.h_scales[pos * p.h_scale_stride + group] = finite ? static_cast<uint8_t>(s + 127) : kUe8m0Nan;
        }
      }
  } else {
    // Tile j, columns 2t, 2t + 1 = output rows 64 group + 8 j + 2 t, + 1. The thread's pairs are
    // read together, then their weights, before any store (one read after another's stores, they
    // waited for 4 kMFrags reads in a row; the SM90 FC2 epilogue reads in batches, epilogue.cuh,
    // and here one batch holds all 2 kMFrags rows).
    int32_t pairs[Cfg::kMFrags][2];
    float weights[Cfg::kMFrags][2];
#pragma unroll
    for (int mf = 0; mf < Cfg::kMFrags; ++mf)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m * Cfg::kWarpM + mf * 16 + g + 8 * half;
        pairs[mf][half] = row < m_valid ? p.sorted_pairs[seg_begin + row] : -1;
      }
#pragma unroll
    for (int mf = 0; mf < Cfg::kMFrags; ++mf)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        weights[mf][half] = pairs[mf][half] >= 0 ? p.topk_weights[pairs[mf][half]] : 0.0f;
#pragma unroll
    for (int mf = 0; mf < Cfg::kMFrags; ++mf)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int32_t pair = pairs[mf][half];
        if (pair < 0) continue;  // a row past the tile's valid ones
        const float weight = weights[mf][half];
        float* dst = p.y + static_cast<int64_t>(pair) * p.y_stride;
#pragma unroll
        for (int j = 0; j < Cfg::kNFrags; ++j) {
          const int64_t n = static_cast<int64_t>(group) * kGroupRows + 8 * j + 2 * t;
          if (n < shape.rows)  // rows is even (K is a multiple of 32): n + 1 is valid too
            *reinterpret_cast<float2*>(dst + n) =
                make_float2(weight * acc[mf][j][2 * half], weight * acc[mf][j][2 * half + 1]);
        }
      }
  }
#else
  __trap();  // no MMA here (neither sm_120a nor the emulation build); cuda_moe.cu never launches it
#endif
}

// ---- launch -----------------------------------------------------------------------------------
template <class Cfg>
cudaError_t PrepareGemmConfig() {
  return AllowDynamicSmem(MoeGemmSm120Kernel<Cfg, true>, MoeGemmSm120Kernel<Cfg, false>, Cfg::kSmemBytes);
}

template <class Cfg>
cudaError_t LaunchGemmConfig(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  dim3 grid;
  bool launch = false;
  if (const cudaError_t e = GridOf(grid_ctas, &grid, &launch); e != cudaSuccess || !launch) return e;
  return LaunchKernel(fc1 ? MoeGemmSm120Kernel<Cfg, true> : MoeGemmSm120Kernel<Cfg, false>, GemmPdlSite(fc1), grid,
                      dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p);
}

template <class Cfg>
GemmConfigInfo InfoOf(const char* name) {
  return {name, Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads, Cfg::kStages, Cfg::kSmemBytes, Cfg::kMinBlocks};
}

}  // namespace mxmoe::cuda::sm120
