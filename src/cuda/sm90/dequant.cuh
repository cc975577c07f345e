// The weights' dequantization into A registers, shared by the mma.sync kernels (moe_gemm.cuh) and
// the wgmma consumers (moe_wgmma.cuh): a lane's packed word of one k16 step (weight_layout.h) and
// the scales of its MX block become the four bf16x2 registers of mma.m16n8k16's A fragment, which
// is also the register form of wgmma's A.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ptx.cuh"
#include "cuda/weight_layout.h"

namespace mxmoe::cuda::sm90 {

// Word i (0..3) of a lane's 16-byte piece of a prepacked tile: k16 step i's codes.
__device__ __forceinline__ uint32_t WordOf(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One k16 step's A registers from its decoded word `raw` (DecodeWord) and `scales`, the bf16x2 pair
// of its MX block's scales (row g low, row g + 8 high; ptx::ScalePairBf16x2): registers 0 and 2
// hold row g, 1 and 3 row g + 8.
__device__ __forceinline__ void ScaleDecoded(const uint32_t (&raw)[4], uint32_t scales, uint32_t (&a)[4]) {
  a[0] = ptx::MulBf16x2Half<false>(raw[0], scales);
  a[1] = ptx::MulBf16x2Half<true>(raw[1], scales);
  a[2] = ptx::MulBf16x2Half<false>(raw[2], scales);
  a[3] = ptx::MulBf16x2Half<true>(raw[3], scales);
}

// One k16 step's A registers from its packed word and scale pair (ScaleDecoded); kFunnel as in
// DecodeWord.
template <bool kFunnel = true>
__device__ __forceinline__ void DequantWord(uint32_t word, uint32_t scales, uint32_t (&a)[4]) {
  uint32_t raw[4];
  DecodeWord<kFunnel>(word, raw);
  ScaleDecoded(raw, scales, a);
}

}  // namespace mxmoe::cuda::sm90
