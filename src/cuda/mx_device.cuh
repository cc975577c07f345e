// MXFP8 re-quantization on the device with the hardware conversions (sm_89 and later), bit for bit
// the software rule of mxmoe/formats.h (the GPU suite checks every fp32 input:
// tests/gpu/test_mx_device.cu). Counted in the PTX of the FC1 epilogue: ~215 instructions per value
// with the software rule, ~80 with these, the scale and the store included (perf-log v6.1).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/formats.h"

namespace mxmoe::cuda {

// 2^e as fp32 for e in [-149, 127] (normal or subnormal). a * Pow2(-s) rounds as ldexpf(a, -s):
// both are the exact product rounded once to nearest even.
__device__ __forceinline__ float Pow2(int e) {
  return e >= -126 ? __int_as_float((e + 127) << 23) : __int_as_float(1 << (e + 149));
}

// float_to_e4m3: round to nearest even, saturating to +-448 (infinities too); PTX ISA, cvt with
// .satfinite to .e4m3x2 (the second source goes to the low byte).
__device__ __forceinline__ uint8_t FloatToE4m3(float f) {
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(packed) : "f"(0.0f), "f"(f));
  return static_cast<uint8_t>(packed & 0xFFu);
}

// e4m3_to_float, exact (through f16, which holds every e4m3 value).
__device__ __forceinline__ float E4m3ToFloat(uint8_t code) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(static_cast<uint16_t>(code)));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(halves & 0xFFFFu)));
}

// e4m3_to_float(float_to_e4m3(ldexpf(a, -s))): a's MXFP8 value in units of the block scale 2^s,
// s in [-127, 127].
__device__ __forceinline__ float QuantizeE4m3Units(float a, int s) { return E4m3ToFloat(FloatToE4m3(a * Pow2(-s))); }

// mxfp8_quantize_block with the conversions above: 32 E4M3 codes, the UE8M0 scale byte returned.
__device__ __forceinline__ uint8_t QuantizeMxfp8Block(const float* v, uint8_t* codes) {
  bool finite;
  const float amax = block_amax(v, kMxBlock, &finite);
  const int s = mxfp8_scale_exponent(amax);
  const float inv_scale = Pow2(-s);
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i) codes[i] = FloatToE4m3(v[i] * inv_scale);
  return finite ? static_cast<uint8_t>(s + 127) : kUe8m0Nan;
}

}  // namespace mxmoe::cuda
