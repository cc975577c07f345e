// The fused grouped GEMMs of the MoE on SM90: one kernel template for FC1 (with the activation and
// the MXFP8 re-quantization of the intermediate in its epilogue) and FC2 (with the router weight,
// writing one fp32 row per (token, slot) for the deterministic combine).
//
// Formulation ("swapped AB"): the MMA M dimension is weight rows, N is tokens. A CTA computes a
// tile of 256 weight rows x BLOCK_N tokens of one expert, over the whole reduction in 64-wide
// steps. Each of the 4 warps owns 64 rows (4 MMA row tiles) and all BLOCK_N tokens.
//   A: prepacked MXFP4 (weight_layout.h), cp.async'ed to shared memory, read one 16-byte piece per
//      lane per row tile and step, and dequantized in registers to bf16 exactly (E2M1 bit pattern
//      times a bf16 power of two built from the scale byte).
//   B: bf16 rows (the exact dequantized MXFP8 activations), gathered by cp.async into a swizzled
//      shared tile and read with ldmatrix.
//   Products are exact in the bf16 MMA; accumulation is fp32.
// MoeGemmTmaKernel (n32t, n8t) runs the same warps with A, its scales and B (rows in sorted order)
// brought by bulk copies and TMA onto mbarriers instead, as the wgmma kernels are fed.
// For FC1 a warp's 64 rows are 32 gate rows and the 32 up rows of the same intermediate indices
// (row groups interleave gate and up by 8); the epilogue re-arranges the tile through the stages'
// shared memory (epilogue.cuh, StageFc1), so that one warp quantizes one MX block of one token.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "cuda/kernel_timeline.cuh"
#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/ptx.cuh"
#include "cuda/sm90/dequant.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/phase_timing.cuh"
#include "cuda/sm90/stage_ring.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tile_loader.cuh"
#include "cuda/weight_layout.h"
#include "mxmoe/formats.h"

#ifndef MXMOE_KB_MUX
#define MXMOE_KB_MUX 0
#endif
#ifndef MXMOE_LATE_TRIGGER
#define MXMOE_LATE_TRIGGER 0
#endif

namespace mxmoe::cuda::sm90 {

// ---- config -----------------------------------------------------------------------------------
// kAdaptiveWidth: the MMAs cover only the tile's valid tokens rounded up to 8 (one instantiation of
// the step per 8-token count) instead of all BLOCK_N columns.
// kSplitK: sets of 4 warps that split each stage's kKSub steps between them (set s takes steps
// j with j % kSplitK == s) and add their sums at the end: more warps per CTA for calls with too
// few CTAs to fill the SMs (decode of one or two tokens). The sums are grouped differently from the
// one-set kernels', so the result's last bits depend on the config (as between any two configs).
// kClusterK: CTAs (a thread block cluster) that split the reduction of one tile into contiguous
// parts; CTA r of the cluster takes part r and the others' sums come to CTA 0 through distributed
// shared memory, added in rank order (perf-log v12). Each CTA keeps its own copy pipeline, so a
// call with few tiles gets kClusterK times the CTAs, each streaming 1/kClusterK of the weights.
template <int kBlockN_, int kStages_, int kKSub_, bool kAdaptiveWidth_ = false, int kSplitK_ = 1,
          int kClusterK_ = 1>
struct GemmConfig {
  static constexpr int kSplitK = kSplitK_;
  static constexpr int kClusterK = kClusterK_;
  static constexpr int kRowWarps = 4;  // warps of one set: 64 rows each
  static constexpr int kWarps = kRowWarps * kSplitK;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMFrags = kWarpRowGroups;  // 16-row MMA tiles per warp
  static constexpr int kBlockGroups = kRowWarps * kMFrags;
  static constexpr int kBlockM = kBlockGroups * kTileRows;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNTiles = kBlockN / 8;  // 8-token MMA tiles
  static constexpr int kBlockK = kTileCols;  // one 64-wide step of 4 MMA k16 steps
  static constexpr int kKSub = kKSub_;       // steps per pipeline stage (one barrier each)
  static constexpr bool kAdaptiveWidth = kAdaptiveWidth_;
  static constexpr int kStages = kStages_;
  static constexpr int kSubA = kBlockGroups * kTileBytes;
  static constexpr int kSubScales = kBlockGroups * kTileScaleBytes;
  static constexpr int kSubB = kBlockN * kBlockK * 2;  // bf16, 128 bytes per token row
  static constexpr int kSmemA = kKSub * kSubA;
  static constexpr int kSmemScales = kKSub * kSubScales;
  static constexpr int kSmemB = kKSub * kSubB;
  static constexpr int kSmemStage = kSmemA + kSmemScales + kSmemB;
  static constexpr int kSmemBytes = kStages * kSmemStage;
  // Tiles of one token run the reduction-block multiplexed steps (ComputeStepMux) when built with
  // -DMXMOE_KB_MUX=1 (perf-log v16; not measured yet, off by default).
  static constexpr bool kMuxKb = MXMOE_KB_MUX && kBlockN == 8 && kSplitK == 1;

  static_assert(kBlockGroups == kBlockRowGroups, "the prepacked layout groups 256 rows per CTA");
  static_assert(kMFrags * kTileRows == 64, "FC1: one warp = 32 gate + 32 up rows = one MX block");
  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 128, "whole 8-token MMA tiles");
  static_assert(kBlockK == 64, "one 16-byte A piece per lane covers 4 k16 steps");
  static_assert(kStages >= 2 && kStages <= 8, "cp.async pipeline depth");
  static_assert(kKSub >= 1 && kKSub <= 4, "steps per stage");
  static_assert(kSplitK >= 1 && kKSub % kSplitK == 0, "every warp set gets a step of each full stage");
  // The other sets' partial sums pass through the stages' memory at the end.
  static_assert(kSplitK == 1 || (kSplitK - 1) * kThreads / kSplitK * kMFrags * kNTiles * 16 <= kSmemBytes,
                "split-K partial sums fit the stages");
  static_assert(kClusterK >= 1 && kClusterK <= 8, "portable cluster size");
  // The cluster's partial sums pass through the stages' memory of each CTA.
  static_assert(kClusterK == 1 || kThreads * kMFrags * kNTiles * 16 <= kSmemBytes, "cluster partial sums fit");
  static_assert(kSmemStage % 128 == 0, "stages stay 128-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "SM90 shared memory per block");
  static_assert(kFc1StagedBytes<kBlockN> <= kSmemBytes, "FC1's epilogue reuses the stages");
};

// ---- device pieces ----------------------------------------------------------------------------
// Half of a 64-wide step: k16 steps 2*kHalf and 2*kHalf+1, which share the 32-block kHalf, on the
// first kNT 8-token MMA tiles. kFunnel: DecodeWord's form (false for kernels at a register cap).
template <class Cfg, int kHalf, int kNT, bool kFunnel = true>
__device__ __forceinline__ void ComputeHalfStep(const uint4 (&frag_a)[Cfg::kMFrags],
                                                const uint32_t (&frag_s)[Cfg::kMFrags], const uint8_t* smem_b, int lane,
                                                float (&acc)[Cfg::kMFrags][Cfg::kNTiles][4]) {
  // B fragments: matrix q of the x4 load is 16-byte unit 4*kHalf + q of token row nt*8 + r,
  // i.e. (b0, b1) of step 2*kHalf, then (b0, b1) of step 2*kHalf + 1.
  const int r = lane & 7, q = lane >> 3;
  uint32_t frag_b[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int unit = 4 * kHalf + q;
    ptx::LdMatrixX4(frag_b[nt], smem_b + (nt * 8 + r) * 128 + ((unit ^ r) << 4));
  }
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f) {
    const uint32_t scales = ptx::ScalePairBf16x2<2 * kHalf>(frag_s[f]);  // rows g (low), g + 8 (high)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      uint32_t a[4];
      DequantWord<kFunnel>(WordOf(frag_a[f], 2 * kHalf + s), scales, a);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        ptx::MmaBf16(acc[f][nt], a, frag_b[nt][2 * s], frag_b[nt][2 * s + 1]);
    }
  }
}

template <class Cfg, int kNT, bool kFunnel = true>
__device__ __forceinline__ void ComputeStep(const uint8_t* smem_a, const uint8_t* smem_s, const uint8_t* smem_b,
                                            int warp, int lane, float (&acc)[Cfg::kMFrags][Cfg::kNTiles][4]) {
  const int g = lane >> 2;
  uint4 frag_a[Cfg::kMFrags];
  uint32_t frag_s[Cfg::kMFrags];
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f) {
    const int group = warp * Cfg::kMFrags + f;
    frag_a[f] = *reinterpret_cast<const uint4*>(smem_a + group * kTileBytes + lane * 16);
    frag_s[f] = *reinterpret_cast<const uint32_t*>(smem_s + group * kTileScaleBytes + g * 4);
  }
  ComputeHalfStep<Cfg, 0, kNT, kFunnel>(frag_a, frag_s, smem_b, lane, acc);
  ComputeHalfStep<Cfg, 1, kNT, kFunnel>(frag_a, frag_s, smem_b, lane, acc);
}

// ComputeStep on the tile's first n_tiles MMA tiles (uniform over the CTA), one instantiation per
// count, for configs with kAdaptiveWidth; the others run all kNTiles. (Choosing the width once per
// tile, for one main loop per width, tied with this per-step choice at T = 256-1024: perf-log v24.)
template <class Cfg, int kNT = 1>
__device__ __forceinline__ void ComputeStepOfWidth(int n_tiles, const uint8_t* smem_a, const uint8_t* smem_s,
                                                   const uint8_t* smem_b, int warp, int lane,
                                                   float (&acc)[Cfg::kMFrags][Cfg::kNTiles][4]) {
  if constexpr (!Cfg::kAdaptiveWidth || kNT >= Cfg::kNTiles) {
    ComputeStep<Cfg, Cfg::kNTiles>(smem_a, smem_s, smem_b, warp, lane, acc);
  } else {
    if (n_tiles <= kNT) ComputeStep<Cfg, kNT>(smem_a, smem_s, smem_b, warp, lane, acc);
    else ComputeStepOfWidth<Cfg, kNT + 1>(n_tiles, smem_a, smem_s, smem_b, warp, lane, acc);
  }
}

// ---- reduction-block multiplexing, for tiles of one token (kMuxKb) ----------------------------
// With one valid token, 7 of an n8 MMA's 8 columns would multiply zeros. Instead column j of the
// MMAs of a group of 4 steps (8 MX blocks of 32) takes MX block j of the group alone: B's rows
// (ldmatrix row addresses) are the token's 16-byte piece for the lanes of column j and a zero row
// for the others, so each accumulator column sums one block's products. The weights then enter
// the MMAs as their E2M1 bit patterns without the scale (the value times 2^-126, bf16 subnormals
// for the codes +-0.5), the token times 2^64 (so that no product falls below fp32's normal range),
// and each block's scale is applied once per group and accumulator in fp32 (PromoteMux):
// instead of 64 HMUL2 and 16 scale conversions per step and thread, 8 HMUL2 on B, 4 selects and,
// per group, 16 FFMA with their 16 scale conversions. Column j of thread c is block 2 c + j % 2 of
// the group, that is block j % 2 of the group's step c: the thread keeps that step's scale words.
inline constexpr uint32_t kMuxTokenScale = 0x5F805F80u;  // bf16x2 2^64
inline constexpr float kMuxUnscale = 0x1p-64f;
inline constexpr int kMuxGroupSteps = 4;  // 8 columns, two MX blocks per 64-wide step

template <class Cfg>
__device__ __forceinline__ void ComputeStepMux(const uint8_t* smem_a, const uint8_t* smem_s, const uint8_t* smem_b,
                                               const uint8_t* smem_zero, int warp, int lane, int t,
                                               float (&blk)[Cfg::kMFrags][4], uint32_t (&kept_s)[Cfg::kMFrags]) {
  const int g = lane >> 2, c = lane & 3, r = lane & 7, q = lane >> 3;
  // (ComputeStep's loads, repeated: read through one shared helper, ptxas gave the FC1 kernels 85-91
  // registers instead of 80, and n8c4's 91 would leave 5 CTAs per SM instead of 6.)
  uint4 frag_a[Cfg::kMFrags];
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f) {
    const int group = warp * Cfg::kMFrags + f;
    frag_a[f] = *reinterpret_cast<const uint4*>(smem_a + group * kTileBytes + lane * 16);
    const uint32_t s = *reinterpret_cast<const uint32_t*>(smem_s + group * kTileScaleBytes + g * 4);
    if (t == c) kept_s[f] = s;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    // Matrix q of the x4 load: 16-byte unit 4 half + q of the token's row (row 0 of the tile, whose
    // swizzle is the identity), on the lanes that supply column 2 t + half.
    uint32_t frag_b[4];
    ptx::LdMatrixX4(frag_b, r == 2 * t + half ? smem_b + ((4 * half + q) << 4) : smem_zero);
#pragma unroll
    for (int i = 0; i < 4; ++i) frag_b[i] = ptx::MulBf16x2(frag_b[i], kMuxTokenScale);
#pragma unroll
    for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t raw[4];
        DecodeWord(WordOf(frag_a[f], 2 * half + s), raw);
        ptx::MmaBf16(blk[f], raw, frag_b[2 * s], frag_b[2 * s + 1]);
      }
  }
}

// sum[f][h] += the group's blocks of this thread's columns times their scales (2^(stored - 127),
// the stored byte's bf16 exponent as an fp32 one; the 2^-64 comes at the end), then blk = 0 and
// kept_s = 0 (a last group without step c then adds 0 * 0, not 0 * a NaN block's infinity).
// kept_s[f] holds the bytes (row g, block 0), (g + 8, 0), (g, 1), (g + 8, 1): accumulator
// (h, j) = register 2 h + j of the fragment (row g + 8 h, column 2 c + j) takes byte 2 j + h.
template <class Cfg>
__device__ __forceinline__ void PromoteMux(float (&blk)[Cfg::kMFrags][4], uint32_t (&kept_s)[Cfg::kMFrags],
                                           float (&sum)[Cfg::kMFrags][2]) {
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f) {
    const uint32_t w = kept_s[f];
    const float scale[4] = {__uint_as_float((w << 23) & 0x7F800000u), __uint_as_float((w << 15) & 0x7F800000u),
                            __uint_as_float((w << 7) & 0x7F800000u), __uint_as_float((w >> 1) & 0x7F800000u)};
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[f][h] = fmaf(blk[f][2 * h + j], scale[2 * j + h], sum[f][h]);
        blk[f][2 * h + j] = 0.0f;
      }
    kept_s[f] = 0;
  }
}

// The token's sums in the accumulators' usual place (column 0: register 0 for row g, 2 for g + 8,
// on the lanes with c = 0), the other columns zero: the four lanes of a row add their columns.
template <class Cfg>
__device__ __forceinline__ void FinishMux(const float (&sum)[Cfg::kMFrags][2], int lane,
                                          float (&acc)[Cfg::kMFrags][Cfg::kNTiles][4]) {
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = sum[f][h];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
      acc[f][0][2 * h] = (lane & 3) == 0 ? v * kMuxUnscale : 0.0f;
      acc[f][0][2 * h + 1] = 0.0f;
    }
}

// The tile's epilogue, after every warp's main loop: FC1 stages the accumulators in the planes at
// `smem` (the stages, free once every warp of the CTA is past them; the barriers are CTA-wide) and
// re-quantizes them with all warps; FC2 writes its rows straight from the accumulators. Warps whose
// rows are padding (or, with kSplitK / kClusterK, that hold no sums) pass holds_sums false.
template <class Cfg, bool kFc1>
__device__ __forceinline__ void MmaTileEpilogue(const GemmParams& p, const TileCoords& tc, int groups,
                                                const float (&acc)[Cfg::kMFrags][Cfg::kNTiles][4], bool holds_sums,
                                                int row_warp, int warp, int lane, uint8_t* smem) {
  if constexpr (kFc1) {
    float* staged = reinterpret_cast<float*>(smem);
    __syncthreads();
    if (holds_sums) StageFc1<Cfg::kMFrags, Cfg::kNTiles, 1, Cfg::kBlockN>(acc, row_warp, 0, lane, staged);
    __syncthreads();
    Fc1Epilogue<Cfg::kBlockN>(p, tc, groups, staged, warp, Cfg::kWarps, lane);
  } else {
    if (holds_sums) Fc2Epilogue<Cfg::kMFrags, Cfg::kNTiles, 1>(p, acc, tc, row_warp, 0, lane);
  }
}

// ---- the early prefetch (GemmParams::early_steps) ----------------------------------------------
// FC1's guess of the local expert of tile `tile` from the call's ids, in warp 0 (every lane gets
// it; -1 for none): the tile-th smallest distinct local expert among p.early_ids.
__device__ __forceinline__ int GuessTileExpert(const GemmParams& p, int tile, int lane) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  int e = INT_MAX;
  if (lane < p.early_pairs) {
    const int64_t local = static_cast<int64_t>(__ldcg(p.early_ids + lane)) - p.early_first_expert;
    if (local >= 0 && local < p.early_num_local) e = static_cast<int>(local);
  }
  static_assert(kEarlyGuessMaxPairs <= 32, "one id a lane");
  // This lane holds the first occurrence of its expert. (Every lane must reach the match: under
  // `e != INT_MAX && ...` the lanes without an id skipped it and the warp hung, perf-log v34.)
  const unsigned same = __match_any_sync(kAll, e);
  const bool first = e != INT_MAX && __ffs(same) - 1 == lane;
  const unsigned firsts = __ballot_sync(kAll, first);
  int rank = 0;
  for (int i = 0; i < p.early_pairs; ++i) {
    const int v = __shfl_sync(kAll, e, i);
    if (((firsts >> i) & 1u) != 0 && v < e) ++rank;
  }
  const unsigned hit = __ballot_sync(kAll, first && rank == tile);
  // (Every lane shuffles, tests/python/test_cuda_sources.py; with no hit lane -1 reads lane 31,
  // unused.)
  const int guess = __shfl_sync(kAll, e, __ffs(hit) - 1);
  return hit != 0 ? guess : -1;
}

// One thread: asks the L2 for `steps` steps from step k_first of local expert `expert`'s row block
// `block` (weights and scales; a block's steps are consecutive in the prepacked layout: two bulk
// prefetches).
__device__ __forceinline__ void PrefetchBlockSteps(const GemmParams& p, int expert, int block, int k_first, int steps) {
  if (steps <= 0) return;
  TileCoords tc;
  tc.expert = expert;
  tc.group0 = static_cast<int64_t>(block) * kBlockRowGroups;
  const int groups = GroupsOf(p, tc);
  const int64_t first_tile = static_cast<int64_t>(expert) * p.a_shape.Tiles() + p.a_shape.TileIndex(tc.group0, k_first);
  ptx::PrefetchBulkL2(p.a_tiles + first_tile * kTileBytes, static_cast<uint32_t>(steps * groups * kTileBytes));
  ptx::PrefetchBulkL2(p.a_scales + first_tile * kTileScaleBytes,
                      static_cast<uint32_t>(steps * groups * kTileScaleBytes));
}

// (PrefetchFc2Steps repeats PrefetchBlockSteps' arithmetic for FC2's shape: one function for both
// moved the registers of the default early instances (perf-log v33). The hand-on instance was
// measured in v34 and stays off by default, so the default instances keep their measured SASS.)
// One thread of an FC1 CTA past its main loop (GemmParams::next_steps): FC2's CTA `j` of the tile
// (its row block j / next_k_parts, its part of the reduction j % next_k_parts) of local expert
// `expert`, its first next_steps steps asked of the L2 (two bulk prefetches; none for j past FC2's
// CTAs of a tile).
__device__ __forceinline__ void PrefetchFc2Steps(const GemmParams& p, int expert, int j) {
  if (j >= p.next_m_tiles * p.next_k_parts) return;
  const int block = j / p.next_k_parts, part = j % p.next_k_parts;
  const int k_all = static_cast<int>(p.next_a_shape.col_tiles);
  const int k_per = (k_all + p.next_k_parts - 1) / p.next_k_parts;
  const int k_first = min(k_all, part * k_per);
  const int steps = min(p.next_steps, min(k_all - k_first, k_per));
  if (steps <= 0) return;
  const int64_t groups = p.next_a_shape.GroupsInBlock(block);
  const int64_t first_tile = static_cast<int64_t>(expert) * p.next_a_shape.Tiles() +
                             p.next_a_shape.TileIndex(static_cast<int64_t>(block) * kBlockRowGroups, k_first);
  ptx::PrefetchBulkL2(p.next_a_tiles + first_tile * kTileBytes, static_cast<uint32_t>(steps * groups * kTileBytes));
  ptx::PrefetchBulkL2(p.next_a_scales + first_tile * kTileScaleBytes,
                      static_cast<uint32_t>(steps * groups * kTileScaleBytes));
}

// Warp 0, before the dependency wait: thread 0 asks the L2 for the CTA's first p.early_steps steps
// of weights and scales (PrefetchBlockSteps). FC2 reads its tile through the L2 (__ldcg); FC1 guesses it
// (GuessTileExpert).
template <class Cfg, bool kFc1>
__device__ __forceinline__ void PrefetchBeforeWait(const GemmParams& p, int warp, int lane) {
  if (warp != 0) return;
  const uint32_t item = blockIdx.x / Cfg::kClusterK;
  const int tile = static_cast<int>(item / static_cast<uint32_t>(p.m_tiles));
  int expert = -1;
  if constexpr (kFc1) {
    if (p.early_ids != nullptr) expert = GuessTileExpert(p, tile, lane);
  } else {
    if (lane == 0 && tile < __ldcg(p.num_tiles)) expert = __ldcg(&p.tiles[tile].x);
  }
  if (lane != 0 || expert < 0) return;
  const int k_all = static_cast<int>(p.a_shape.col_tiles);
  const int k_per = (k_all + Cfg::kClusterK - 1) / Cfg::kClusterK;
  const int k_first = Cfg::kClusterK > 1 ? min(k_all, static_cast<int>(ptx::ClusterCtaRank()) * k_per) : 0;
  PrefetchBlockSteps(p, expert, static_cast<int>(item % static_cast<uint32_t>(p.m_tiles)), k_first,
                     min(p.early_steps, min(k_all - k_first, k_per)));
}

// ---- the combine of one row block (FC2's folded combine, n8f's combine units) -------------------
// out[t, rows [block * 256, + 256) of K] = the sum in slot order of p.y's rows t * top_k + j over the
// slots j of token t whose expert is in [first_expert, + num_local) (ids of -1 and of other ranks'
// experts add nothing): CombineKernel's sum, bit for bit. Two rows a thread (of at least 128); a
// batch of kCombineSlots slots' rows is loaded before any is added, so that many loads are in
// flight. y is read through the L2: the caller has acquired its writers' stores.
template <int kThreads>
__device__ __forceinline__ void CombineRowBlock(const GemmParams& p, const int32_t* ids, int64_t first_expert,
                                                int32_t num_local, int32_t block, int32_t t, void* out,
                                                OutputDType dtype) {
  const float* y = p.y;
  const int64_t y_stride = p.y_stride, hidden = p.a_shape.rows;
  const int32_t top_k = p.top_k;
  constexpr int kCombineSlots = 8;
  static_assert(2 * kThreads >= kBlockRowGroups * kTileRows, "one pair of rows a thread covers the block");
  const int64_t row = static_cast<int64_t>(block) * kBlockRowGroups * kTileRows + 2 * static_cast<int>(threadIdx.x);
  // (Threads past the block's rows (n8k2's second set) or past K: nothing to add. K is a multiple of
  // 32, LayerShape::Validate: a thread's two rows are both real or both not.)
  if ((2 * kThreads > kBlockRowGroups * kTileRows &&
       2 * static_cast<int>(threadIdx.x) >= kBlockRowGroups * kTileRows) ||
      row >= hidden)
    return;
  float2 acc = make_float2(0.0f, 0.0f);
  for (int j0 = 0; j0 < top_k; j0 += kCombineSlots) {
    float2 v[kCombineSlots];
    bool use[kCombineSlots];
#pragma unroll
    for (int b = 0; b < kCombineSlots; ++b) {
      const int64_t pair = static_cast<int64_t>(t) * top_k + j0 + b;
      const int64_t local = j0 + b < top_k ? static_cast<int64_t>(ids[pair]) - first_expert : -1;
      use[b] = local >= 0 && local < num_local;
      v[b] = use[b] ? __ldcg(reinterpret_cast<const float2*>(y + pair * y_stride + row)) : make_float2(0.0f, 0.0f);
    }
#pragma unroll
    for (int b = 0; b < kCombineSlots; ++b) {
      if (!use[b]) continue;
      acc.x += v[b].x;
      acc.y += v[b].y;
    }
  }
  const int64_t at = static_cast<int64_t>(t) * hidden + row;
  if (dtype == OutputDType::kF32) {
    *reinterpret_cast<float2*>(static_cast<float*>(out) + at) = acc;
  } else {
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + at) =
        float_to_bf16(acc.x) | (static_cast<uint32_t>(float_to_bf16(acc.y)) << 16);
  }
}

// Every token's CombineRowBlock of W2's row block `block`, from the call's fold_* parameters.
template <class Cfg>
__device__ __forceinline__ void CombineRowBlockOfCall(const GemmParams& p, int32_t block) {
  for (int32_t t = 0; t < p.fold_tokens; ++t)
    CombineRowBlock<Cfg::kThreads>(p, p.fold_ids, p.fold_first_expert, p.fold_num_local, block, t, p.fold_out,
                                   p.fold_dtype);
}

// FC2's folded combine (GemmParams::fold_done), every thread of a CTA that has written its tile's y
// rows: n8f's order of memory (moe_decode.cu) with one count per row block. The CTA's stores, a
// barrier, thread 0's count (acq_rel); the last of the *num_tiles tiles to arrive acquires the
// others' rows for the CTA (the barrier) and combines the row block for each token.
template <class Cfg>
__device__ __forceinline__ void FoldedCombine(const GemmParams& p, const TileCoords& tc, int tid) {
  __shared__ int32_t smem_last;
  __syncthreads();
  const int32_t block = static_cast<int32_t>(tc.group0 / kBlockRowGroups);
  if (tid == 0) smem_last = ptx::AtomicAddAcqRelGpu(p.fold_done + block, 1) == *p.num_tiles - 1 ? 1 : 0;
  __syncthreads();
  if (smem_last == 0) return;  // (uniform)
  CombineRowBlockOfCall<Cfg>(p, block);
}

// ---- kernel -----------------------------------------------------------------------------------
// kL2Ahead: the instance that reads p.l2_ahead (launched when it is positive, for configs with
// kLooksAhead). The other has none of its code: the look-ahead's checks and addresses cost n8's
// kernels 6 registers, and n64's FC1 would spill.
template <class Cfg>
inline constexpr bool kLooksAhead = Cfg::kBlockN <= 32;
// kEarly: the instance that prefetches before its wait (launched when p.early_steps is positive and
// p.l2_ahead is not), for the decode configs only.
template <class Cfg>
inline constexpr bool kPrefetchesEarly = Cfg::kBlockN == 8;
// kHandOn: the early instance that also hands work on to the next kernel (perf-log v33, launched
// where the call asks for it): FC1 asks the L2 for FC2's first steps past its main loop
// (GemmParams::next_steps), FC2 folds the combine in (GemmParams::fold_done). The other instances
// have none of its code.

template <class Cfg, bool kFc1, bool kL2Ahead = false, bool kEarly = false, bool kHandOn = false>
__global__ void __launch_bounds__(Cfg::kThreads) MoeGemmKernel(const __grid_constant__ GemmParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t smem_rows[Cfg::kBlockN];  // B source row of each tile column, -1 past the segment
  // (kernel_timeline.cuh; empty unless built with MXMOE_KERNEL_TIMELINE)
  TimelineClock timeline(kTimelineEveryCta || blockIdx.x == 0);
  timeline.Start();
  static_assert(!kEarly || kPrefetchesEarly<Cfg>, "only the decode configs have the instance");
  static_assert(!kHandOn || (kEarly && !kL2Ahead), "an early instance's variant");
  if constexpr (kEarly) PrefetchBeforeWait<Cfg, kFc1>(p, threadIdx.x >> 5, threadIdx.x & 31);
#if MXMOE_LATE_TRIGGER
  // -DMXMOE_LATE_TRIGGER=1 (an experiment, perf-log v22): the next kernel's CTAs may be placed only
  // once this grid's CTAs are past their main loops, not from the start (matters only under PDL).
  ptx::GridDependencyWait();
#else
  ptx::EnterPipelineKernel();
#endif
  timeline.Waited(kFc1 ? TimelineKernel::kFc1 : TimelineKernel::kFc2);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The cluster's CTAs share one work item; CTA k_part takes the reduction's steps
  // [k_part * k_per, (k_part + 1) * k_per) (all of them without clusters).
  const uint32_t item = blockIdx.x / Cfg::kClusterK;
  const int k_part = Cfg::kClusterK > 1 ? static_cast<int>(ptx::ClusterCtaRank()) : 0;
  TileCoords tc;
  if constexpr (!kFc1 && kHandOn) {
    // The folded combine of a call with no tile (every slot -1 or another rank's): no CTA counts
    // in, so tile 0's CTAs (the host launches at least one tile's) write the combine's zeros.
    if (p.fold_done != nullptr && *p.num_tiles == 0) {
      if (item < static_cast<uint32_t>(p.m_tiles) && k_part == 0)
        CombineRowBlockOfCall<Cfg>(p, static_cast<int32_t>(item));
      return;
    }
  }
  // (All CTAs of a cluster have the same item, so they leave here together or not at all.)
  if (!ReadTile<Cfg::kBlockN, kFc1>(p, item, tid, Cfg::kThreads, smem_rows, &tc)) return;
  const int k_all = static_cast<int>(p.a_shape.col_tiles);
  const int k_per = (k_all + Cfg::kClusterK - 1) / Cfg::kClusterK;
  // Spelled out for one CTA per tile: ptxas cannot fold min(k_all, 0) (it does not know k_all >= 0),
  // and the folded-out offset arithmetic cost n64 spills and n8 registers.
  const int k_first = Cfg::kClusterK > 1 ? min(k_all, k_part * k_per) : 0;
  const int k_tiles = Cfg::kClusterK > 1 ? min(k_all - k_first, k_per) : k_all;  // this CTA's steps (may be 0)
  const PhaseClock clock;  // (phase_timing.cuh; empty unless built with MXMOE_PHASE_TIMING)
  clock.Start();
  StepLoader<Cfg::kBlockN, Cfg::kThreads> loader;
  loader.Init(p, tc, smem_rows, tid, k_first);
  const int groups = loader.groups;

  // The L2 look-ahead (GemmParams::l2_ahead): before copying step kt, thread 0 asks the L2 for step
  // kt + ahead. Steps below kFirstLoop are copied before the main loop, so only later ones are asked
  // for; those up to ahead - 1 are asked for here.
  static_assert(!kL2Ahead || kLooksAhead<Cfg>, "only the configs that look ahead have the instance");
  constexpr int kFirstLoop = (Cfg::kStages - 1) * Cfg::kKSub;
  const int l2_ahead = kL2Ahead ? p.l2_ahead : 0;
  if (kL2Ahead && tid == 0) {
    for (int kt = kFirstLoop; kt < min(l2_ahead, k_tiles); ++kt) loader.PrefetchL2(kt);
  }

  // Stage `chunk` holds steps chunk * kKSub .. + kKSub - 1 (those before k_tiles).
  auto load_stage = [&](int stage, int chunk) {
#pragma unroll
    for (int j = 0; j < Cfg::kKSub; ++j) {
      const int kt = chunk * Cfg::kKSub + j;
      if (kt >= k_tiles) break;
      if (kL2Ahead && tid == 0 && kt + l2_ahead >= kFirstLoop && kt + l2_ahead < k_tiles)
        loader.PrefetchL2(l2_ahead);
      const uint32_t smem_stage = ptx::SmemAddr(smem + stage * Cfg::kSmemStage);
      loader.IssueNext(smem_stage + j * Cfg::kSubA, smem_stage + Cfg::kSmemA + j * Cfg::kSubScales,
                       smem_stage + Cfg::kSmemA + Cfg::kSmemScales + j * Cfg::kSubB, tid, p.b);
    }
  };

  // (The loop spelled out: ZeroAccumulators here moved instructions of n8c2's and n32's FC1 kernels,
  // whose SASS this keeps as measured.)
  float acc[Cfg::kMFrags][Cfg::kNTiles][4];
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
    for (int nt = 0; nt < Cfg::kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][nt][i] = 0.0f;

  // Rows are padded to 64 per warp, so a warp's 4 row tiles are all real or all padding.
  const int row_warp = warp % Cfg::kRowWarps, k_set = warp / Cfg::kRowWarps;
  const bool warp_active = row_warp * Cfg::kMFrags < groups;
  const int n_tiles = (tc.n_valid + 7) / 8;  // MMA tiles with a real column (kAdaptiveWidth)

  const int chunks = (k_tiles + Cfg::kKSub - 1) / Cfg::kKSub;
  // The pipeline over the CTA's steps; compute(a, scales, b, step) runs each of this warp's.
  auto main_loop = [&](const auto& compute) {
#pragma unroll
    for (int s = 0; s < Cfg::kStages - 1; ++s) {
      if (s < chunks) load_stage(s, s);
      ptx::CpAsyncCommit();
    }
    for (int chunk = 0; chunk < chunks; ++chunk) {
      clock.Time([] {
        ptx::CpAsyncWait<Cfg::kStages - 2>();  // stage `chunk` has landed (one commit per stage, empty ones too)
        __syncthreads();                        // ... for every thread, and stage chunk-1 is free
      });
      const int next = chunk + Cfg::kStages - 1;
      if (next < chunks) load_stage(next % Cfg::kStages, next);
      ptx::CpAsyncCommit();
      if (warp_active) {
        const uint8_t* stage = smem + (chunk % Cfg::kStages) * Cfg::kSmemStage;
#pragma unroll
        for (int j = 0; j < Cfg::kKSub; ++j) {
          if (chunk * Cfg::kKSub + j >= k_tiles) break;
          if (Cfg::kSplitK > 1 && j % Cfg::kSplitK != k_set) continue;
          compute(stage + j * Cfg::kSubA, stage + Cfg::kSmemA + j * Cfg::kSubScales,
                  stage + Cfg::kSmemA + Cfg::kSmemScales + j * Cfg::kSubB, chunk * Cfg::kKSub + j);
        }
      }
    }
    ptx::CpAsyncWait<0>();
  };
  bool muxed = false;
  if constexpr (Cfg::kMuxKb) {
    if (tc.n_valid == 1) {
      muxed = true;
      __shared__ __align__(16) uint4 smem_zero;  // the zero row of B (read after the loop's first barrier)
      if (tid == 0) smem_zero = make_uint4(0, 0, 0, 0);
      float blk[Cfg::kMFrags][4] = {};
      float sum[Cfg::kMFrags][2] = {};
      uint32_t kept_s[Cfg::kMFrags] = {};
      main_loop([&](const uint8_t* a, const uint8_t* sc, const uint8_t* b, int step) {
        ComputeStepMux<Cfg>(a, sc, b, reinterpret_cast<const uint8_t*>(&smem_zero), row_warp, lane, step % kMuxGroupSteps,
                            blk, kept_s);
        if (step % kMuxGroupSteps == kMuxGroupSteps - 1) PromoteMux<Cfg>(blk, kept_s, sum);
      });
      if (warp_active) {
        if (k_tiles % kMuxGroupSteps != 0) PromoteMux<Cfg>(blk, kept_s, sum);
        FinishMux<Cfg>(sum, lane, acc);
      }
    }
  }
  if (!muxed) {
    main_loop([&](const uint8_t* a, const uint8_t* sc, const uint8_t* b, int) {
      ComputeStepOfWidth<Cfg>(n_tiles, a, sc, b, row_warp, lane, acc);
    });
  }
  clock.MainEnd();
  if constexpr (kFc1 && kHandOn) {
    if (tid == 0 && p.next_steps > 0)
      PrefetchFc2Steps(p, tc.expert, static_cast<int>(item % static_cast<uint32_t>(p.m_tiles)) * Cfg::kClusterK + k_part);
  }
#if MXMOE_LATE_TRIGGER
  ptx::LaunchDependents();
#endif
  if constexpr (Cfg::kSplitK > 1) {
    // Sets 1.. hand their partial sums to set 0 through the stages (free once every warp is past
    // its last step), which adds them in set order: a fixed order, so runs repeat bit for bit.
    constexpr int kPer = Cfg::kMFrags * Cfg::kNTiles * 4;  // accumulators per thread
    constexpr int kSetThreads = Cfg::kThreads / Cfg::kSplitK;
    float* const flat = &acc[0][0][0];
    // Set s > 0 writes block s - 1 of the buffer; the thread's slot is its place within its set.
    auto slot = [&](int s) {
      return reinterpret_cast<float*>(smem) + ((s - 1) * kSetThreads + tid % kSetThreads) * kPer;
    };
    __syncthreads();
    if (k_set > 0 && warp_active) {
      float* const dst = slot(k_set);
#pragma unroll
      for (int i = 0; i < kPer; ++i) dst[i] = flat[i];
    }
    __syncthreads();
    if (k_set == 0 && warp_active) {
      for (int s = 1; s < Cfg::kSplitK; ++s) {
        const float* const src = slot(s);
#pragma unroll
        for (int i = 0; i < kPer; ++i) flat[i] += src[i];
      }
    }
  }
  const bool holds_sums = warp_active && k_set == 0;
  if constexpr (Cfg::kClusterK > 1) {
    // CTAs 1.. of the cluster leave their sums in their own stages (free: every warp is past its
    // last step and every copy has landed); CTA 0 reads them through distributed shared memory and
    // adds them in rank order, so runs repeat bit for bit. The second cluster barrier keeps each
    // CTA's memory alive until CTA 0 has read it.
    constexpr int kPer = Cfg::kMFrags * Cfg::kNTiles * 4;
    static_assert(kPer % 4 == 0, "whole float4s");
    float* const frag_flat = &acc[0][0][0];
    const uint32_t smem_mine = ptx::SmemAddr(smem) + tid * kPer * 4;
    __syncthreads();
    if (k_part > 0 && holds_sums) {
      float4* const smem_dst = reinterpret_cast<float4*>(smem + tid * kPer * 4);
#pragma unroll
      for (int i = 0; i < kPer / 4; ++i)
        smem_dst[i] = make_float4(frag_flat[4 * i], frag_flat[4 * i + 1], frag_flat[4 * i + 2], frag_flat[4 * i + 3]);
    }
    ptx::ClusterSync();
    if (k_part == 0 && holds_sums) {
      for (int r = 1; r < Cfg::kClusterK; ++r) {
        const uint32_t dsmem_src = ptx::MapSharedToRank(smem_mine, static_cast<uint32_t>(r));
#pragma unroll
        for (int i = 0; i < kPer / 4; ++i) {
          const float4 v = ptx::LdSharedCluster128(dsmem_src + 16 * i);
          frag_flat[4 * i] += v.x;
          frag_flat[4 * i + 1] += v.y;
          frag_flat[4 * i + 2] += v.z;
          frag_flat[4 * i + 3] += v.w;
        }
      }
    }
    ptx::ClusterSync();
    if (k_part > 0) {
      timeline.End();
      return;
    }
  }
  // (The stages become the staging planes once every warp is done reading them.)
  MmaTileEpilogue<Cfg, kFc1>(p, tc, groups, acc, holds_sums, row_warp, warp, lane, smem);
  if constexpr (!kFc1 && kHandOn) {
    if (p.fold_done != nullptr) FoldedCombine<Cfg>(p, tc, tid);
  }
  RecordConsumerPhases<kFc1>(clock, tid == 0);
  timeline.End();
#else
  __trap();  // built for SM90 only; cuda_moe.cu refuses other devices before launching
#endif
}

// ---- the same tiles fed by the copy engine (perf-log v20) ----------------------------------------
// TmaGemmConfig: the mma.sync warps of GemmConfig (4 warps of 64 rows, MMAs on the tile's valid
// tokens with kAdaptiveWidth) over the wgmma kernels' ring of stages (stage_ring.cuh): per 64-wide
// step, one bulk copy of the block's weights, one of their scales and the tile's token rows through
// the tensor maps (rows in sorted order: FC1's tokens are gathered first), completing on the stage's
// "full" mbarrier. At step i lane 0 of warp i % 4 (in turn, so that no warp carries all the copies)
// refills the stage of step i - kRefillLag once every warp has handed it back on its "empty"
// mbarrier (TileCopies::Refill): kStages - kRefillLag steps ahead. So no CTA barrier per step and
// no per-thread copies: in n32 those (cp.async of the step's pieces, the wait, the barrier, the
// loop) are ~90 of the ~400 instructions a warp issues per 24-wide step (perf-log v17).
template <int kBlockN_, int kStages_, bool kAdaptiveWidth_ = false, int kRefillLag_ = 2>
struct TmaGemmConfig {
  static constexpr int kSplitK = 1;
  static constexpr int kClusterK = 1;
  static constexpr int kRowWarps = 4;
  static constexpr int kWarps = kRowWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMFrags = kWarpRowGroups;
  static constexpr int kBlockGroups = kRowWarps * kMFrags;
  static constexpr int kBlockM = kBlockGroups * kTileRows;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr bool kAdaptiveWidth = kAdaptiveWidth_;
  static constexpr int kStages = kStages_;
  static constexpr int kRefillLag = kRefillLag_;
  // StageMap's and TileCopies' names (stage_ring.cuh): one step per stage, token rows first.
  static constexpr int kStepsPerStage = 1;
  static constexpr int kSubB = kBlockN * 128;
  static constexpr int kSubA = kBlockGroups * kTileBytes;
  static constexpr int kSubScales = kBlockGroups * kTileScaleBytes;
  static constexpr int kSmemStage = (kSubB + kSubA + kSubScales + 1023) / 1024 * 1024;
  // Dynamic shared memory is only 16-byte aligned: 1 KB of slack to align the stages.
  static constexpr int kSmemBytes = 1024 + kStages * kSmemStage + 2 * kStages * 8;

  static_assert(kBlockGroups == kBlockRowGroups, "the prepacked layout groups 256 rows per CTA");
  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= kNarrowLoadWidth,
                "token rows in 8-row boxes, as many as the tile's width");
  static_assert(kStages - kRefillLag >= 2 && kStages <= 8, "the copies run at least 2 steps ahead");
  static_assert(kSmemBytes <= 227 * 1024, "SM90 shared memory per block");
  static_assert(kFc1StagedBytes<kBlockN> <= kStages * kSmemStage, "FC1's epilogue reuses the stages");
};

// p.b (rows in sorted order) through a tensor map of 64 columns x 8 rows boxes (BLOCK_N <= 32 keeps
// every tile narrow: TileCopies never reads its wide map).
template <class Cfg, bool kFc1>
__global__ void __launch_bounds__(Cfg::kThreads)
    MoeGemmTmaKernel(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_rows) {
#if MXMOE_WGMMA_AVAILABLE
  extern __shared__ uint8_t smem_raw[];
  const StageMap<Cfg> sm{(ptx::SmemAddr(smem_raw) + 1023u) & ~1023u};
  uint8_t* const smem = smem_raw + (sm.base - ptx::SmemAddr(smem_raw));  // the stages, generic
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    InitStageBarriers(sm, Cfg::kWarps);
    wgmma::FenceMbarInit();
  }
  ptx::EnterPipelineKernel();
  TileCoords tc;
  // B rows are the tile's sorted positions for both GEMMs: no per-column row table.
  if (!ReadTile<Cfg::kBlockN, kFc1>(p, blockIdx.x, tid, Cfg::kThreads, nullptr, &tc)) return;  // (a barrier)
  const int k_tiles = static_cast<int>(p.a_shape.col_tiles);
  const int groups = GroupsOf(p, tc);
  const TileCopies<Cfg> copies(p, tc, sm, &map_rows, &map_rows, groups, TileWidth<Cfg::kBlockN>(tc.n_valid),
                               k_tiles);
  sm.clock.Start();

  float acc[Cfg::kMFrags][Cfg::kNTiles][4];
  ZeroAccumulators(acc);
  // Rows are padded to 64 per warp, so a warp's 4 row tiles are all real or all padding. Padding
  // warps still wait for each stage and hand it back: the "empty" barriers count every warp, and an
  // arrival may not run ahead of the stage's round.
  const bool warp_active = warp * Cfg::kMFrags < groups;
  const int n_tiles = (tc.n_valid + 7) / 8;  // MMA tiles with a real column (kAdaptiveWidth)

  // The copies and the L2 look-ahead (TileCopies::IssueFirst / Refill): step i's refill by lane 0
  // of warp i % 4.
  if (tid == 0) copies.IssueFirst(k_tiles, p.l2_ahead);
  for (int i = 0; i < k_tiles; ++i) {
    const int s = i % Cfg::kStages;
    if (lane == 0 && warp == i % Cfg::kWarps) copies.template Refill<Cfg::kRefillLag>(i, k_tiles, p.l2_ahead);
    sm.WaitLoaded(i);
    __syncwarp();  // (lane 0 may come from the copies' branch: converged for ldmatrix and mma)
    if (warp_active) {
      const uint8_t* stage = smem + s * Cfg::kSmemStage;
      ComputeStepOfWidth<Cfg>(n_tiles, stage + Cfg::kSubB, stage + Cfg::kSubB + Cfg::kSubA, stage, warp, lane, acc);
    }
    __syncwarp();  // every lane's reads of the stage are done
    if (lane == 0) wgmma::MbarArrive(sm.Empty(s));
  }
  sm.clock.MainEnd();
  // (The stages become the staging planes once every warp is past its last one: every copy has
  // landed, each was waited for.)
  MmaTileEpilogue<Cfg, kFc1>(p, tc, groups, acc, warp_active, warp, warp, lane, smem);
  RecordConsumerPhases<kFc1>(sm.clock, tid == 0);
#else
  __trap();  // built for sm_90a only; cuda_moe.cu refuses other devices before launching
#endif
}

// ---- launch -----------------------------------------------------------------------------------
template <class Cfg>
cudaError_t PrepareGemmConfig() {
  RegisterPhaseCycles("mma.sync BLOCK_N %d, %d stages, split %d ways in the CTA, %d CTAs per cluster", Cfg::kBlockN,
                      Cfg::kStages, Cfg::kSplitK, Cfg::kClusterK);
  RegisterTimeline();
  cudaError_t e = AllowDynamicSmem(MoeGemmKernel<Cfg, true>, MoeGemmKernel<Cfg, false>, Cfg::kSmemBytes);
  if constexpr (kLooksAhead<Cfg>) {
    if (e == cudaSuccess)
      e = AllowDynamicSmem(MoeGemmKernel<Cfg, true, true>, MoeGemmKernel<Cfg, false, true>, Cfg::kSmemBytes);
  }
  if constexpr (kPrefetchesEarly<Cfg>) {
    if (e == cudaSuccess)
      e = AllowDynamicSmem(MoeGemmKernel<Cfg, true, false, true>, MoeGemmKernel<Cfg, false, false, true>,
                           Cfg::kSmemBytes);
    if (e == cudaSuccess)
      e = AllowDynamicSmem(MoeGemmKernel<Cfg, true, false, true, true>, MoeGemmKernel<Cfg, false, false, true, true>,
                           Cfg::kSmemBytes);
    // (FC2's capped launches, GemmParams::launch_smem: the limit is the most a launch may ask for,
    // not what it takes.)
    static_assert(kMaxFc2Smem <= 227 * 1024, "SM90 shared memory per block");
    if (e == cudaSuccess && kMaxFc2Smem > Cfg::kSmemBytes) {
      e = AllowDynamicSmem(MoeGemmKernel<Cfg, false>, MoeGemmKernel<Cfg, false, false, true>, kMaxFc2Smem);
      if (e == cudaSuccess)
        e = AllowDynamicSmem(MoeGemmKernel<Cfg, false, true>, MoeGemmKernel<Cfg, false, false, true, true>,
                             kMaxFc2Smem);
    }
  }
  return e;
}

template <class Cfg>
cudaError_t LaunchGemmConfig(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  dim3 grid;
  bool launch = false;
  if (const cudaError_t e = GridOf(grid_ctas * Cfg::kClusterK, &grid, &launch); e != cudaSuccess || !launch) return e;
  auto kernel = fc1 ? MoeGemmKernel<Cfg, true> : MoeGemmKernel<Cfg, false>;
  if constexpr (kPrefetchesEarly<Cfg>) {
    if (p.early_steps > 0)
      kernel = fc1 ? MoeGemmKernel<Cfg, true, false, true> : MoeGemmKernel<Cfg, false, false, true>;
  }
  if constexpr (kLooksAhead<Cfg>) {
    if (p.l2_ahead > 0) kernel = fc1 ? MoeGemmKernel<Cfg, true, true> : MoeGemmKernel<Cfg, false, true>;
  }
  if constexpr (kPrefetchesEarly<Cfg>) {
    // (Last: the fold must run wherever it is asked for, so it takes the place of the look-ahead,
    // a hint; with early_steps 0 the instance's early prefetch asks for nothing.)
    if (fc1 ? p.next_steps > 0 : p.fold_done != nullptr)
      kernel = fc1 ? MoeGemmKernel<Cfg, true, false, true, true> : MoeGemmKernel<Cfg, false, false, true, true>;
  }
  int smem = Cfg::kSmemBytes;
  if (kPrefetchesEarly<Cfg> && !fc1 && p.launch_smem > smem) {
    if (p.launch_smem > kMaxFc2Smem) return cudaErrorInvalidValue;  // (beyond the limit PrepareGemmConfig set)
    smem = p.launch_smem;
    CountCappedFc2Launch();
  }
  return LaunchKernelInClusters(kernel, GemmPdlSite(fc1), grid, dim3(Cfg::kThreads), smem, stream, Cfg::kClusterK, p);
}

template <class Cfg>
int ResidentCtasOf(bool fc1) {
  return ResidentCtas(fc1 ? MoeGemmKernel<Cfg, true> : MoeGemmKernel<Cfg, false>, Cfg::kThreads, Cfg::kSmemBytes);
}

template <class Cfg>
GemmConfigInfo InfoOf(const char* name) {
  return {name, Cfg::kBlockM,     Cfg::kBlockN,         Cfg::kThreads, Cfg::kStages, Cfg::kSmemBytes, false,
          0,    kLooksAhead<Cfg>, &ResidentCtasOf<Cfg>, Cfg::kClusterK};
}

template <class Cfg>
cudaError_t PrepareTmaGemmConfig() {
  RegisterPhaseCycles("mma.sync fed by TMA, BLOCK_N %d, %d stages", Cfg::kBlockN, Cfg::kStages);
  return AllowDynamicSmem(MoeGemmTmaKernel<Cfg, true>, MoeGemmTmaKernel<Cfg, false>, Cfg::kSmemBytes);
}

template <class Cfg>
cudaError_t LaunchTmaGemmConfig(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  if (p.fold_done != nullptr) return cudaErrorInvalidValue;  // (only MoeGemmKernel folds the combine)
  dim3 grid;
  bool launch = false;
  if (const cudaError_t e = GridOf(grid_ctas, &grid, &launch); e != cudaSuccess || !launch) return e;
  CUtensorMap rows;
  if (const cudaError_t e = MakeTokenMap(p, 8, &rows); e != cudaSuccess) return e;
  return LaunchKernel(fc1 ? MoeGemmTmaKernel<Cfg, true> : MoeGemmTmaKernel<Cfg, false>, GemmPdlSite(fc1), grid,
                      dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p, rows);
}

template <class Cfg>
int TmaResidentCtasOf(bool fc1) {
  return ResidentCtas(fc1 ? MoeGemmTmaKernel<Cfg, true> : MoeGemmTmaKernel<Cfg, false>, Cfg::kThreads,
                      Cfg::kSmemBytes);
}

template <class Cfg>
GemmConfigInfo TmaInfoOf(const char* name) {
  return {name, Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads, Cfg::kStages, Cfg::kSmemBytes, true, 0, true,
          &TmaResidentCtasOf<Cfg>};
}

// The instantiations, one per translation unit (moe_gemm_n*.cu).
// Decode, 1-8 tokens per expert, weights streamed from HBM. Three stages (29 KB) let 7 CTAs share
// an SM, 28 warps to hide the dequantization's dependent chains; six stages (3 CTAs) left the
// kernels latency-bound (T = 8: 647.5 -> 581.0 µs, perf-log v10).
using ConfigN8 = GemmConfig<8, 3, 1>;
// Tens of tokens per expert; the MMAs cover only the tile's valid tokens rounded up to 8 (T = 1024,
// ~18 pairs per expert: 6874 -> 6391 µs, perf-log v10). Its ring is MXMOE_N32_STAGES stages of
// MXMOE_N32_KSUB steps (default 4 x 1, 50 KB). -DMXMOE_N32_STAGES=2 -DMXMOE_N32_KSUB=2 is the A/B of
// one CTA barrier per two steps at the same 50 KB (2 steps in flight instead of 3; perf-log v23).
// 3 x 2 would be 75 KB, which with the static 128 bytes and the 1 KB the SM keeps per CTA leaves
// room for 2 CTAs per SM, not 3.
#ifndef MXMOE_N32_STAGES
#define MXMOE_N32_STAGES 4
#endif
#ifndef MXMOE_N32_KSUB
#define MXMOE_N32_KSUB 1
#endif
using ConfigN32 = GemmConfig<32, MXMOE_N32_STAGES, MXMOE_N32_KSUB, true>;
using ConfigN64 = GemmConfig<64, 3, 2>;  // prefill
// n8 with the steps of each stage split between two sets of 4 warps (perf-log v10.1: GPT-OSS-120B
// and DeepSeek-V3 at T = 1 11-12% faster than n8, Kimi-K3 5% slower). Forced only since n8c2
// (v12), which was faster on every row measured.
using ConfigN8SplitK = GemmConfig<8, 3, 2, false, 2>;
// n8 with each tile's reduction split between the two CTAs of a cluster (perf-log v12): twice the
// CTAs, each streaming half the weights, for calls whose tiles give the SMs only a few CTAs each
// (Kimi-K3 at T = 1: ~381 FC1 and ~222 FC2 CTAs become twice as many).
using ConfigN8Cluster2 = GemmConfig<8, 3, 1, false, 1, 2>;
// n8c2 with clusters of four CTAs, each a quarter of the reduction, for calls with still fewer tiles
// (GPT-OSS-120B at T = 1: ~91 FC1 and ~47 FC2 tiles). perf-log v13.2.
using ConfigN8Cluster4 = GemmConfig<8, 3, 1, false, 1, 4>;
// n8c2 with 5 stages (48 KB: 4 CTAs per SM instead of 7) for FC2 at T = 1, whose 448 CTAs (Kimi-K3)
// fill 3-4 slots of an SM: 4 steps in flight per CTA instead of 2 (perf-log v23). Forced only
// (MXMOE_GEMM_CONFIG=/n8c2d): as FC2 it was 2-10% slower than n8c2 / n8 on 8 of 9 decode rows (v24).
using ConfigN8Cluster2Deep = GemmConfig<8, 5, 1, false, 1, 2>;
// n32 and n8 fed by the copy engine (MoeGemmTmaKernel; forced only, not yet measured: perf-log v20).
// n32t: 5 stages of 13 KB, so that 3 CTAs still share an SM and 3 steps are in flight as in n32.
// n8t: 4 stages of 10 KB refilled with a lag of one step (3 in flight; 5 CTAs per SM by shared
// memory, against n8's 7 with 2 in flight).
using ConfigN32Tma = TmaGemmConfig<32, 5, true>;
using ConfigN8Tma = TmaGemmConfig<8, 4, false, 1>;

}  // namespace mxmoe::cuda::sm90
