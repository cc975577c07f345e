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

// mxfp8_scale_exponent(amax) for a finite amax >= 0 from its bits: amax = 1.f * 2^(E - 127) has
// frexpf's exponent E - 126 and mantissa 0.f / 2, which is <= 0.875 exactly when the fraction field is
// <= 0x600000 (1.75). Subnormals and zero (E = 0) fall below the clamp. ~5 integer instructions against
// frexpf's branches; checked against the software rule for every finite amax (test_mx_device.cu).
__device__ __forceinline__ int Mxfp8ScaleExponent(float amax) {
  const uint32_t bits = __float_as_uint(amax);
  const int s = static_cast<int>(bits >> 23) - 135 + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  return max(kScaleExpMin, min(kScaleExpMax, s));
}

// Two values of one MX block with scale exponent s, quantized to E4M3 and dequantized again, as
// bf16x2 (lo in the low half): e4m3_to_float(float_to_e4m3(ldexpf(v, -s))) * 2^s, rounded to bf16
// (exact for every finite result: an e4m3 value times a power of two fits bf16's 8 bits of
// precision, and products below bf16's normal range round as float_to_bf16 does).
__device__ __forceinline__ uint32_t DequantizedMxfp8PairBf16(float lo, float hi, int s) {
  const float inv_scale = Pow2(-s), scale = Pow2(s);
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(hi * inv_scale), "f"(lo * inv_scale));
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(codes));
  const __half2 h2 = *reinterpret_cast<const __half2*>(&halves);
  uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n"
      : "=r"(out)
      : "f"(__high2float(h2) * scale), "f"(__low2float(h2) * scale));
  return out;
}

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
