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
// warpgroups = 4). So the 4 warps of a CTA hold the block's 4 groups of 4 consecutive row groups,
// and for FC1, where row group rg holds gate rows 8 rg .. 8 rg + 7 then the up rows of the same
// intermediate indices, warp w (of every warpgroup) holds the 32 intermediate indices of one MX
// block: the re-quantization reduces within the warp, and across the warpgroups through shared
// memory when there are two.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "core/activation_math.h"
#include "cuda/moe_kernels.h"
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

// Quantizes a warp's kMFrags activations of one token column into the MX block whose (encoded)
// amax is `amax` and stores them, dequantized to bf16, into h.
template <int kMFrags>
__device__ __forceinline__ void StoreRequantized(const GemmParams& p, const float (&a)[kMFrags], float amax,
                                                 int64_t h_row, int64_t i_first) {
  const bool finite = amax <= FLT_MAX;
  const int s = mxfp8_scale_exponent(finite ? amax : 0.0f);
  const float scale = ue8m0_to_float(finite ? static_cast<uint8_t>(s + 127) : kUe8m0Nan);
  uint16_t* dst = p.h + h_row * p.h_stride + i_first;
#pragma unroll
  for (int f = 0; f < kMFrags; ++f)
    dst[8 * f] = float_to_bf16(e4m3_to_float(float_to_e4m3(ldexpf(a[f], -s))) * scale);
}

// The named barrier the FC1 epilogue's warpgroups exchange amax through (0 is __syncthreads').
inline constexpr int kEpilogueBarrier = 1;

// FC1: activation of (gate, up) and MXFP8 re-quantization of the intermediate into h[sorted
// position, i]. With two warpgroups, every thread of both must call this (it holds a barrier);
// smem_amax then has 2 * 4 * kNTiles * 8 floats. Inactive warps (row groups past the matrix) pass
// active = false: they take part in the exchange with zeros and store nothing.
template <int kMFrags, int kNTiles, int kWGs>
__device__ __forceinline__ void Fc1Epilogue(const GemmParams& p, float (&acc)[kMFrags][kNTiles][4],
                                            const TileCoords& tc, int warp, int wg, int lane, bool active,
                                            float* smem_amax) {
  const int g = lane >> 2, c = lane & 3;
  const ExpertParams ep = p.experts[tc.expert];
  const int64_t bias_row = static_cast<int64_t>(tc.expert) * (p.a_shape.rows / 2);
  int64_t i_first[kMFrags];
  float gate_bias[kMFrags], up_bias[kMFrags];
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    i_first[f] = (tc.group0 + FragRowGroup<kMFrags, kWGs>(warp, wg, f)) * 8 + g;
    gate_bias[f] = active && ep.has_gate_bias ? p.gate_bias[bias_row + i_first[f]] : 0.0f;
    up_bias[f] = active && ep.has_up_bias ? p.up_bias[bias_row + i_first[f]] : 0.0f;
  }
  // The activation replaces the gate accumulator; the warp's amax per token column is reduced over
  // the 8 lanes that share c (lane bits 2..4).
  float amax[kNTiles][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      float m = 0.0f;
#pragma unroll
      for (int f = 0; f < kMFrags; ++f) {
        float gv = acc[f][nt][q] * ep.fc1_scale;  // the scale is a power of two: exact
        float uv = acc[f][nt][2 + q] * ep.fc1_scale;
        if (ep.has_gate_bias) gv += gate_bias[f];  // (adding 0 would turn -0 into +0)
        if (ep.has_up_bias) uv += up_bias[f];
        const float a = active ? apply_activation(p.act, gv, uv, ep.act) : 0.0f;
        acc[f][nt][q] = a;
        m = fmaxf(m, AmaxTerm(a));
      }
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
      amax[nt][q] = m;
    }
  if constexpr (kWGs > 1) {
    // The other warpgroup's warp with the same index holds the other half of each MX block.
    constexpr int kCols = kNTiles * 8;
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int q = 0; q < 2; ++q) smem_amax[(wg * kWarpRowGroups + warp) * kCols + nt * 8 + 2 * c + q] = amax[nt][q];
    }
    ptx::NamedBarrierSync(kEpilogueBarrier, kWGs * 128);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int other = 0; other < kWGs; ++other)
          amax[nt][q] = fmaxf(amax[nt][q], smem_amax[(other * kWarpRowGroups + warp) * kCols + nt * 8 + 2 * c + q]);
  }
  if (!active) return;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int col = nt * 8 + 2 * c + q;
      if (col >= tc.n_valid) continue;
      float a[kMFrags];
#pragma unroll
      for (int f = 0; f < kMFrags; ++f) a[f] = acc[f][nt][q];
      // Fragment f's index is i_first[0] + 8 f: the warp's fragments are consecutive row groups.
      StoreRequantized<kMFrags>(p, a, amax[nt][q], tc.seg_begin + col, i_first[0]);
    }
}

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
