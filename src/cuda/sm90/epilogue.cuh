// The fused epilogues of the SM90 grouped GEMMs, shared by the mma.sync kernels (moe_gemm.cuh) and
// the wgmma kernels (moe_wgmma.cuh). Both keep their accumulators in the same per-warp layout:
// fragment f of a warp covers one 16-row group of the prepacked weights, and
//   acc[f][nt][0..1] = rows g     of tokens nt*8 + 2c, +1   (g = lane / 4, c = lane % 4)
//   acc[f][nt][2..3] = rows g + 8 of the same tokens
// (PTX ISA 9.7.14.5.8 for mma.m16n8k16's C fragment; 9.7.15.5.1.1.1, Figure 149, for wgmma's D
// fragment, which repeats that 16x8 pattern over N in each warp's 16 rows).
//
// Row groups: a CTA covers the 16 row groups (256 rows) of one prepacked block. Warp w of warpgroup
// wg holds, as its fragment f, row group 4 w + kMFrags wg + f (kMFrags fragments per warp, kMFrags *
// warpgroups = 4). For FC1, row group rg holds gate rows 8 rg .. 8 rg + 7 then the up rows of the
// same intermediate indices; its epilogue re-arranges the tile through shared memory (StageFc1).
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

template <int kMFrags, int kWGs>
__device__ __forceinline__ int FragRowGroup(int warp, int wg, int f) {
  static_assert(kMFrags * kWGs == kWarpRowGroups, "a warp's fragments over all warpgroups = 4 row groups");
  return kWarpRowGroups * warp + kMFrags * wg + f;
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
//   1. every thread writes its gate and up accumulators into two fp32 planes [kBlockN][kStagedStride]
//      (row = token column, index = the block's intermediate index 8 rg + g);
//   2. every warp takes whole token columns (RequantizeColumns): lane l computes intermediates
//      64 h + 2 l, +1 (h = 0, 1), each half-warp reduces its MX block's amax with shuffles, and
//      the warp stores 64 consecutive bf16 of h per h.
// The stride 132 = 128 + 4 keeps step 1 free of bank conflicts (a warp writes 8 consecutive indices
// of 4 columns two apart: 2 * 132 * 4 bytes apart = 8 banks) and step 2 reads 64 consecutive floats
// (8-byte aligned pairs: 132 is even).
inline constexpr int kStagedStride = kBlockRowGroups * 8 + 4;

template <int kBlockN>
inline constexpr int kFc1StagedBytes = 2 * kBlockN * kStagedStride * 4;

// Step 1 for this thread's fragments (kNTiles * 8 columns of planes kBlockN wide). Callers then
// hold a barrier over every thread of the tile.
template <int kMFrags, int kNTiles, int kWGs, int kBlockN>
__device__ __forceinline__ void StageFc1(const float (&acc)[kMFrags][kNTiles][4], int warp, int wg, int lane,
                                         float* staged) {
  static_assert(kNTiles * 8 <= kBlockN, "columns of the planes");
  const int g = lane >> 2, c = lane & 3;
  float* up = staged + kBlockN * kStagedStride;
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    const int i = FragRowGroup<kMFrags, kWGs>(warp, wg, f) * 8 + g;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int at = (nt * 8 + 2 * c + q) * kStagedStride + i;
        staged[at] = acc[f][nt][q];
        up[at] = acc[f][nt][2 + q];
      }
  }
}

// Step 2, the MXFP8 re-quantization of a tile's token columns by `warps` warps with ids
// 0 .. warps - 1. Lane l of a warp holds the intermediates 64 h + 2 l and 64 h + 2 l + 1 (h = 0, 1)
// of a column, value(col, idx) giving both as a float2: half-warp l / 16 holds MX block 2 h + l / 16,
// whose amax takes four shuffles, and each lane stores its two values as one bf16x2 into
// h[sorted position, i]. A warp takes kEpilogueCols columns per pass for independent work. (The
// version before, one value per lane and item = column * blocks + block, spent ~220 instructions per
// value with the Situ activation and the FC1 kernels a third of their time here: perf-log v9.)
inline constexpr int kEpilogueCols = 2;

template <class Value>
__device__ __forceinline__ void RequantizeColumns(const GemmParams& p, const TileCoords& tc, int groups,
                                                  int warp_id, int warps, int lane, const Value& value) {
  constexpr int kCols = kEpilogueCols;
  const int blocks = groups / kWarpRowGroups;  // rows are padded to 64: whole MX blocks of 32
  // NOTE: h is 256-byte aligned and its stride a multiple of 64 (cuda_moe.cu): bf16x2 stores align.
  uint16_t* const h_tile = p.h + static_cast<int64_t>(tc.seg_begin) * p.h_stride + tc.group0 * 8;
  for (int col0 = warp_id * kCols; col0 < tc.n_valid; col0 += warps * kCols) {
    float2 v[kCols][2];
    float m[kCols][2];
    bool real[kCols][2];
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        real[c][h] = col0 + c < tc.n_valid && 2 * h + (lane >> 4) < blocks;
        v[c][h] = real[c][h] ? value(col0 + c, 64 * h + 2 * lane) : make_float2(0.0f, 0.0f);
        m[c][h] = fmaxf(AmaxTerm(v[c][h].x), AmaxTerm(v[c][h].y));
      }
#pragma unroll
    for (int off = 1; off < 16; off <<= 1)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) m[c][h] = fmaxf(m[c][h], __shfl_xor_sync(0xFFFFFFFFu, m[c][h], off));
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!real[c][h]) continue;
        // A block holding NaN or Inf has a NaN scale: all its values are NaN.
        const uint32_t out = m[c][h] <= FLT_MAX
                                 ? DequantizedMxfp8PairBf16(v[c][h].x, v[c][h].y, Mxfp8ScaleExponent(m[c][h]))
                                 : 0x7FFF7FFFu;
        *reinterpret_cast<uint32_t*>(h_tile + static_cast<int64_t>(col0 + c) * p.h_stride + 64 * h + 2 * lane) = out;
      }
  }
}

// Step 2 for one activation kind (a compile-time constant: the loop holds only its code).
template <ActivationType kAct, int kBlockN>
__device__ __forceinline__ void RequantizeStaged(const GemmParams& p, const TileCoords& tc, int groups,
                                                 const float* staged, int warp_id, int warps, int lane) {
  const ExpertParams ep = p.experts[tc.expert];
  const float* up = staged + kBlockN * kStagedStride;
  const int64_t bias0 = static_cast<int64_t>(tc.expert) * (p.a_shape.rows / 2) + tc.group0 * 8;
  RequantizeColumns(p, tc, groups, warp_id, warps, lane, [&](int col, int idx) {
    const float2 g2 = *reinterpret_cast<const float2*>(staged + col * kStagedStride + idx);
    const float2 u2 = *reinterpret_cast<const float2*>(up + col * kStagedStride + idx);
    const auto act = [&](float gv, float uv, int i) {
      gv *= ep.fc1_scale;  // a power of two: exact
      uv *= ep.fc1_scale;
      if (ep.has_gate_bias) gv += p.gate_bias[bias0 + i];  // (adding 0 would turn -0 into +0)
      if (ep.has_up_bias) uv += p.up_bias[bias0 + i];
      return apply_activation(kAct, gv, uv, ep.act);
    };
    return make_float2(act(g2.x, u2.x, idx), act(g2.y, u2.y, idx + 1));
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
  RequantizeColumns(p, tc, groups, warp_id, warps, lane, [&](int col, int idx) {
    return *reinterpret_cast<const float2*>(staged + col * kStagedStride + idx);
  });
}

// FC1: activation of (gate, up) and MXFP8 re-quantization of the intermediate into h[sorted
// position, i], from the planes StageFc1 wrote (step 2 above). Every warp of the tile calls it,
// `warps` of them with ids 0 .. warps - 1; groups = the block's real row groups.
template <int kBlockN>
__device__ __forceinline__ void Fc1Epilogue(const GemmParams& p, const TileCoords& tc, int groups,
                                            const float* staged, int warp_id, int warps, int lane) {
  switch (p.act) {
#define MXMOE_FC1_CASE(kind) \
  case ActivationType::kind: \
    return RequantizeStaged<ActivationType::kind, kBlockN>(p, tc, groups, staged, warp_id, warps, lane);
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
template <int kMFrags, int kNTiles, int kWGs>
__device__ __forceinline__ void Fc2Epilogue(const GemmParams& p, const float (&acc)[kMFrags][kNTiles][4],
                                            const TileCoords& tc, int warp, int wg, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const float fc2_scale = p.experts[tc.expert].fc2_scale;
  int32_t pair[kNTiles][2];
  float weight[kNTiles][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int col = nt * 8 + 2 * c + q;
      pair[nt][q] = col < tc.n_valid ? p.sorted_pairs[tc.seg_begin + col] : -1;
      weight[nt][q] = col < tc.n_valid ? p.topk_weights[pair[nt][q]] : 0.0f;
    }
#pragma unroll
  for (int f = 0; f < kMFrags; ++f)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = (tc.group0 + FragRowGroup<kMFrags, kWGs>(warp, wg, f)) * kTileRows + g + 8 * half;
      if (row >= p.a_shape.rows) continue;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (pair[nt][q] < 0) continue;
          const float y = acc[f][nt][2 * half + q] * fc2_scale;  // exact: a power of two
          p.y[static_cast<int64_t>(pair[nt][q]) * p.y_stride + row] = weight[nt][q] * y;
        }
    }
}

}  // namespace mxmoe::cuda::sm90
