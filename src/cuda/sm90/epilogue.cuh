// The fused epilogues of the SM90 grouped GEMMs, shared by the mma.sync kernels (moe_gemm.cuh) and
// the wgmma kernels (moe_wgmma.cuh). Both keep their accumulators in the same per-warp layout:
// fragment f of a warp covers one 16-row group of the prepacked weights, and
//   acc[f][nt][0..1] = rows g     of tokens nt*8 + 2c, +1   (g = lane / 4, c = lane % 4)
//   acc[f][nt][2..3] = rows g + 8 of the same tokens
// (PTX ISA 9.7.14.5.8 for mma.m16n8k16's C fragment; 9.7.15.5.1.1.1, Figure 149, for wgmma's D
// fragment, which repeats that 16x8 pattern over N in each warp's 16 rows).
//
// Row groups: a CTA covers the 16 row groups (256 rows) of one prepacked block, or (wg128h) 8 of
// them, half a block. Warp w of warpgroup wg holds, as its fragment f, row group
// R w + kMFrags wg + f, R = kMFrags * warpgroups row groups per warp index (4, or 2 for half
// blocks; FragRowGroup). For FC1, row group rg holds gate rows 8 rg .. 8 rg + 7 then the up rows of
// the same intermediate indices; its epilogue re-arranges the tile through shared memory
// (StageFc1).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "core/activation_math.h"
#include "cuda/moe_kernels.h"
#include "cuda/mx_device.cuh"
#include "cuda/ptx.cuh"
#include "cuda/weight_layout.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda::sm90 {

// Where a CTA's tile starts and which of its columns are real.
struct TileCoords {
  int expert;      // local expert
  int seg_begin;   // first sorted position of the tile
  int n_valid;     // real columns (tokens) of the tile
  int64_t group0;  // first row group of the CTA's block
};

// All of a thread's accumulators to zero (before a tile's main loop).
template <int kMFrags, int kNTiles>
__device__ __forceinline__ void ZeroAccumulators(float (&acc)[kMFrags][kNTiles][4]) {
#pragma unroll
  for (int f = 0; f < kMFrags; ++f)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][nt][i] = 0.0f;
}

// kMFrags * kWGs row groups per warp index: 4 for CTAs of a whole block (256 rows), 2 for the
// half-block CTAs of wg128h (128 rows, one fragment per warp).
template <int kMFrags, int kWGs>
__device__ __forceinline__ int FragRowGroup(int warp, int wg, int f) {
  static_assert(kMFrags * kWGs == kWarpRowGroups || kMFrags * kWGs == kWarpRowGroups / 2,
                "a warp index's fragments over all warpgroups = 4 (or, half blocks, 2) row groups");
  return kMFrags * kWGs * warp + kMFrags * wg + f;
}

// A non-finite activation makes its MX block's scale NaN; encoding it as +inf keeps one
// max-reduction for both (finite magnitudes are <= FLT_MAX, and fmaxf drops NaN but keeps inf).
__device__ __forceinline__ float AmaxTerm(float a) {
  const float m = fabsf(a);
  return m <= FLT_MAX ? m : __int_as_float(0x7F800000);
}

// FC1 goes through shared memory. Kept in registers, the activation and re-quantization of a
// fragment layout unrolled into one copy per accumulator pair (the wg128 FC1 kernel was ~48 K lines
// of SASS against FC2's ~7 K; perf-log v6). Staged, one loop serves every tile width:
//   1. every thread writes its gate and up accumulators into two fp32 planes
//      [kBlockN][StagedStride<kIdx>] (row = token column, index = the CTA's intermediate index
//      8 rg + g; kIdx = 128 intermediates for a block of 256 rows, 64 for wg128h's half blocks);
//   2. every warp takes whole token columns (RequantizeColumns): kIdx / 8 lanes per column, each
//      with 8 consecutive intermediates; the 4 lanes of an MX block reduce its amax with two
//      shuffles, and each lane stores its 8 values into h.
// The stride kIdx + 4 (132 or 68, both 4 mod 32) keeps step 1 free of bank conflicts (a warp
// writes 8 consecutive indices of 4 columns two apart: 2 * 4 mod 32 = 8 banks apart) and lets
// step 2 read 16-byte aligned runs (the stride is a multiple of 4).
template <int kIdx>
inline constexpr int StagedStride = kIdx + 4;
inline constexpr int kBlockIdx = kBlockRowGroups * 8;  // the intermediates of a whole block
inline constexpr int kStagedStride = StagedStride<kBlockIdx>;

template <int kBlockN, int kIdx = kBlockIdx>
inline constexpr int kFc1StagedBytes = 2 * kBlockN * StagedStride<kIdx> * 4;

// Step 1 for this thread's fragments (kNTiles * 8 columns of planes kBlockN wide). Callers then
// hold a barrier over every thread of the tile.
template <int kMFrags, int kNTiles, int kWGs, int kBlockN, int kIdx = kBlockIdx>
__device__ __forceinline__ void StageFc1(const float (&acc)[kMFrags][kNTiles][4], int warp, int wg, int lane,
                                         float* staged) {
  static_assert(kNTiles * 8 <= kBlockN, "columns of the planes");
  constexpr int kStride = StagedStride<kIdx>;
  const int g = lane >> 2, c = lane & 3;
  float* up = staged + kBlockN * kStride;
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    const int i = FragRowGroup<kMFrags, kWGs>(warp, wg, f) * 8 + g;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int at = (nt * 8 + 2 * c + q) * kStride + i;
        staged[at] = acc[f][nt][q];
        up[at] = acc[f][nt][2 + q];
      }
  }
}

// Step 2, the MXFP8 re-quantization of a tile's token columns by `warps` warps with ids
// 0 .. warps - 1. A warp takes 32 / (kIdx / 8) columns per pass: lane l holds the 8 intermediates
// 8 (l % L) .. + 7 of column l / L (L = kIdx / 8 lanes per column), value(col, idx) giving 4 of
// them as a float4; lanes 4 b .. 4 b + 3 of a column hold MX block b, whose amax takes two
// shuffles, and each lane stores its 8 values into h[sorted position, i] as two 8-byte runs. (Before
// v9, one value per lane and item = column * blocks + block spent ~220 instructions per value with
// the Situ activation; from v9 to v19, two values per lane and a half-warp per MX block took four
// shuffles and the scale rule per pair of values.)
template <int kIdx, class Value>
__device__ __forceinline__ void RequantizeColumns(const GemmParams& p, const TileCoords& tc, int groups,
                                                  int warp_id, int warps, int lane, const Value& value) {
  static_assert(kIdx == 64 || kIdx == 128, "a CTA's intermediates: a half or a whole block");
  constexpr int kLanesPerCol = kIdx / 8, kColsPerPass = 32 / kLanesPerCol;
  const int idx = 8 * (lane % kLanesPerCol), col_in_pass = lane / kLanesPerCol;
  // Rows are padded to 64: whole MX blocks of 32 intermediates (4 row groups each).
  const bool real_block = idx / kMxBlock < groups / kWarpRowGroups;
  // NOTE: h is 256-byte aligned and its stride a multiple of 64 (cuda_moe.cu), and group0 is a
  // multiple of 8 row groups: the 8-byte stores align.
  uint16_t* const h_tile = p.h + static_cast<int64_t>(tc.seg_begin) * p.h_stride + tc.group0 * 8 + idx;
  // Lanes 4..7 of every 8 take their second four values first: the 8 lanes of a 16-byte load's
  // phase then cover all 32 banks (in order, lanes k and k + 4 would read the same banks, 128 bytes
  // apart). Each four goes back to its own place with an 8-byte store.
  const int first = lane & 4;
  for (int col0 = warp_id * kColsPerPass; col0 < tc.n_valid; col0 += warps * kColsPerPass) {
    const int col = col0 + col_in_pass;
    const bool real = real_block && col < tc.n_valid;
    float4 v[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
    if (real) v[0] = value(col, idx + first), v[1] = value(col, idx + 4 - first);
    float m = fmaxf(fmaxf(fmaxf(AmaxTerm(v[0].x), AmaxTerm(v[0].y)), fmaxf(AmaxTerm(v[0].z), AmaxTerm(v[0].w))),
                    fmaxf(fmaxf(AmaxTerm(v[1].x), AmaxTerm(v[1].y)), fmaxf(AmaxTerm(v[1].z), AmaxTerm(v[1].w))));
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
    if (!real) continue;
    uint2 out[2];
    if (m <= FLT_MAX) {
      const int s = Mxfp8ScaleExponent(m);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        out[i] = make_uint2(DequantizedMxfp8PairBf16(v[i].x, v[i].y, s), DequantizedMxfp8PairBf16(v[i].z, v[i].w, s));
    } else {
      // A block holding NaN or Inf has a NaN scale: all its values are NaN.
      out[0] = out[1] = make_uint2(0x7FFF7FFFu, 0x7FFF7FFFu);
    }
    uint16_t* const h_col = h_tile + static_cast<int64_t>(col) * p.h_stride;
    *reinterpret_cast<uint2*>(h_col + first) = out[0];
    *reinterpret_cast<uint2*>(h_col + 4 - first) = out[1];
  }
}

// Step 2 for one activation kind (a compile-time constant: the loop holds only its code).
template <ActivationType kAct, int kBlockN, int kIdx>
__device__ __forceinline__ void RequantizeStaged(const GemmParams& p, const TileCoords& tc, int groups,
                                                 const float* staged, int warp_id, int warps, int lane) {
  constexpr int kStride = StagedStride<kIdx>;
  const ExpertParams ep = p.experts[tc.expert];
  const float* up = staged + kBlockN * kStride;
  const int64_t bias0 = static_cast<int64_t>(tc.expert) * (p.a_shape.rows / 2) + tc.group0 * 8;
  RequantizeColumns<kIdx>(p, tc, groups, warp_id, warps, lane, [&](int col, int idx) {
    const float4 g4 = *reinterpret_cast<const float4*>(staged + col * kStride + idx);
    const float4 u4 = *reinterpret_cast<const float4*>(up + col * kStride + idx);
    const auto act = [&](float gv, float uv, int i) {
      gv *= ep.fc1_scale;  // a power of two: exact
      uv *= ep.fc1_scale;
      if (ep.has_gate_bias) gv += p.gate_bias[bias0 + i];  // (adding 0 would turn -0 into +0)
      if (ep.has_up_bias) uv += p.up_bias[bias0 + i];
      return apply_activation(kAct, gv, uv, ep.act);
    };
    return make_float4(act(g4.x, u4.x, idx), act(g4.y, u4.y, idx + 1), act(g4.z, u4.z, idx + 2),
                       act(g4.w, u4.w, idx + 3));
  });
}

// The persistent FC1 kernel's split of the same work (moe_wgmma.cuh): the consumers apply the
// activation to their accumulators and stage one fp32 plane of activations [kBlockN][kStagedStride]
// (ActivateToStaged), and separate warps re-quantize it (QuantizeStagedActs) while the consumers
// go on with the next tile. Each thread holds gate and up of the same intermediate indices (rows
// g and g + 8 of a row group), so the activation needs no exchange; the plane is written like
// StageFc1's (no bank conflicts). Columns past the tile's valid ones get harmless values nobody
// reads. Inactive (padding) warps must not call it.
template <ActivationType kAct, int kMFrags, int kNTiles, int kWGs>
__device__ __forceinline__ void ActivateToStaged(const GemmParams& p, const TileCoords& tc,
                                                 const float (&acc)[kMFrags][kNTiles][4], int warp, int wg,
                                                 int lane, float* staged) {
  const ExpertParams ep = p.experts[tc.expert];
  const int g = lane >> 2, c = lane & 3;
  const int64_t bias0 = static_cast<int64_t>(tc.expert) * (p.a_shape.rows / 2) + tc.group0 * 8;
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    const int i = FragRowGroup<kMFrags, kWGs>(warp, wg, f) * 8 + g;
    const float gate_bias = ep.has_gate_bias ? p.gate_bias[bias0 + i] : 0.0f;
    const float up_bias = ep.has_up_bias ? p.up_bias[bias0 + i] : 0.0f;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        float gv = acc[f][nt][q] * ep.fc1_scale;  // a power of two: exact
        float uv = acc[f][nt][2 + q] * ep.fc1_scale;
        if (ep.has_gate_bias) gv += gate_bias;  // (adding 0 would turn -0 into +0)
        if (ep.has_up_bias) uv += up_bias;
        staged[(nt * 8 + 2 * c + q) * kStagedStride + i] = apply_activation(kAct, gv, uv, ep.act);
      }
  }
}

template <int kBlockN>
inline constexpr int kActStagedBytes = kBlockN * kStagedStride * 4;

// Re-quantizes the activations ActivateToStaged wrote for the tile's valid columns, by `warps`
// warps with ids 0 .. warps - 1.
__device__ __forceinline__ void QuantizeStagedActs(const GemmParams& p, const TileCoords& tc, int groups,
                                                   const float* staged, int warp_id, int warps, int lane) {
  RequantizeColumns<kBlockIdx>(p, tc, groups, warp_id, warps, lane, [&](int col, int idx) {
    return *reinterpret_cast<const float4*>(staged + col * kStagedStride + idx);
  });
}

// FC1: activation of (gate, up) and MXFP8 re-quantization of the intermediate into h[sorted
// position, i], from the planes StageFc1 wrote (step 2 above). Every warp of the tile calls it,
// `warps` of them with ids 0 .. warps - 1; groups = the CTA's real row groups (its block's, or its
// half's).
template <int kBlockN, int kIdx = kBlockIdx>
__device__ __forceinline__ void Fc1Epilogue(const GemmParams& p, const TileCoords& tc, int groups,
                                            const float* staged, int warp_id, int warps, int lane) {
  switch (p.act) {
#define MXMOE_FC1_CASE(kind) \
  case ActivationType::kind: \
    return RequantizeStaged<ActivationType::kind, kBlockN, kIdx>(p, tc, groups, staged, warp_id, warps, lane);
    MXMOE_FC1_CASE(Situ)
    MXMOE_FC1_CASE(Swiglu)
    MXMOE_FC1_CASE(SwigluBias)
    MXMOE_FC1_CASE(Geglu)
    MXMOE_FC1_CASE(GegluTanh)
#undef MXMOE_FC1_CASE
    default:
      return;  // refused by CheckActivationSupported before any launch
  }
}

// The named barrier the FC1 epilogue's warpgroups meet at (0 is __syncthreads').
inline constexpr int kEpilogueBarrier = 1;

// FC2: y[pair, n] = topk_weight * (aq . W2^T) in fp32, one row per (token, slot) for the ordered
// combine. Inactive warps must not call it.
// A thread's columns go in batches of kBatchTiles * 2: the batch's pairs are read together, then
// their weights, then its rows are stored, so a batch waits for two reads from memory. (Read one
// column at a time, behind the stores of the column before that the compiler may not move them
// past, the 2 kNTiles columns waited for 4 kNTiles reads in a row: 64 at a 128-wide tile. Read
// for all columns before any store, they made wg128h's consumers spill when it had 96 registers,
// v19; up to 8 tiles, one batch, that is what happens now, and wg128h's FC2 takes 123 of its 128.)
template <int kMFrags, int kNTiles, int kWGs>
__device__ __forceinline__ void Fc2Epilogue(const GemmParams& p, const float (&acc)[kMFrags][kNTiles][4],
                                            const TileCoords& tc, int warp, int wg, int lane) {
  constexpr int kBatchTiles = kNTiles < 8 ? kNTiles : 8;
  const int g = lane >> 2, c = lane & 3;
  const float fc2_scale = p.experts[tc.expert].fc2_scale;
#pragma unroll
  for (int nt0 = 0; nt0 < kNTiles; nt0 += kBatchTiles) {
    constexpr int kCols = 2 * kBatchTiles;  // this thread's columns of a batch: (nt, q) as 2 nt + q
    int32_t pair[kCols];
    float weight[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int col = (nt0 + j / 2) * 8 + 2 * c + j % 2;
      pair[j] = nt0 + j / 2 < kNTiles && col < tc.n_valid ? p.sorted_pairs[tc.seg_begin + col] : -1;
    }
#pragma unroll
    for (int j = 0; j < kCols; ++j) weight[j] = pair[j] >= 0 ? p.topk_weights[pair[j]] : 0.0f;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int nt = nt0 + j / 2, q = j % 2;
      if (nt >= kNTiles || pair[j] < 0) continue;
      float* const y_pair = p.y + static_cast<int64_t>(pair[j]) * p.y_stride;
#pragma unroll
      for (int f = 0; f < kMFrags; ++f)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t row = (tc.group0 + FragRowGroup<kMFrags, kWGs>(warp, wg, f)) * kTileRows + g + 8 * half;
          if (row >= p.a_shape.rows) continue;
          const float y = acc[f][nt][2 * half + q] * fc2_scale;  // exact: a power of two
          y_pair[row] = weight[j] * y;
        }
    }
  }
}

}  // namespace mxmoe::cuda::sm90
