// Number formats of OCP MX v1.0 (SPEC section 2): E2M1, E4M3 (e4m3fn), UE8M0 and bf16, and the MX
// block quantizers. Header-only and usable from host and device code alike, so every backend runs
// the very same rounding rules; no CUDA is needed to include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MXMOE_HD __host__ __device__ __forceinline__
#else
#define MXMOE_HD inline
#endif

namespace mxmoe {

inline constexpr int kMxBlock = 32;         // elements sharing one UE8M0 scale
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr uint8_t kUe8m0Nan = 0xFF;
inline constexpr int kScaleExpMin = -127;
inline constexpr int kScaleExpMax = 127;

MXMOE_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
MXMOE_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// ---------------------------------------------------------------------------------------------
// bf16
MXMOE_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays a quiet NaN of the same sign.
MXMOE_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---------------------------------------------------------------------------------------------
// UE8M0: byte b is 2^(b-127); 0xFF is NaN.
MXMOE_HD float ue8m0_to_float(uint8_t b) {
  if (b == kUe8m0Nan) return bits_float(0x7FC00000u);
  if (b == 0) return bits_float(0x00400000u);  // 2^-127 is an fp32 subnormal
  return bits_float(static_cast<uint32_t>(b) << 23);
}

// ---------------------------------------------------------------------------------------------
// E4M3 (e4m3fn): bias 7, no infinities, 0x7F / 0xFF are NaN, max 448, subnormal step 2^-9.
MXMOE_HD float e4m3_to_float(uint8_t c) {
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xFu;
  const uint32_t man = c & 0x7u;
  if (exp == 0xF && man == 0x7) return bits_float(sign | 0x7FC00000u);
  if (exp == 0) {  // subnormal: man * 2^-9, exact in fp32
    return bits_float(sign | float_bits(static_cast<float>(man) * 0.001953125f));
  }
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// Round to nearest even, saturating to +-448 (infinities too); NaN maps to 0x7F with its sign.
MXMOE_HD uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7F;
  const float a = bits_float(abs_bits);
  if (a >= kE4M3Max) return sign | 0x7E;
  if (a < 0.015625f) {  // below 2^-6: subnormal grid of 2^-9; n == 8 is 2^-6, code 0x08
    return sign | static_cast<uint8_t>(rintf(a * 512.0f));
  }
  const int e = static_cast<int>((abs_bits >> 23) & 0xFFu) - 127;  // a is normal here: e in [-6, 8]
  float q = rintf(ldexpf(a, 3 - e));                                // in [8, 16]
  int exp = e;
  if (q >= 16.0f) {
    q = 8.0f;
    exp += 1;
  }
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | (static_cast<int>(q) - 8));
}

// ---------------------------------------------------------------------------------------------
// E2M1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0..7, bit 3 the sign.
MXMOE_HD float e2m1_to_float(uint8_t c) {
  const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[c & 0x7u];
  return (c & 0x8u) ? -m : m;
}

// Round to nearest even, saturating to +-6. E2M1 has no NaN: NaN maps to +0 (weights only;
// mxfp4_quantize_block marks a block holding NaN through its NaN scale).
MXMOE_HD uint8_t float_to_e2m1(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return 0;
  const float a = bits_float(abs_bits);
  uint8_t code;
  if (a >= kE2M1Max) {
    code = 7;
  } else if (a < 2.0f) {  // grid 0.5: codes 0..4 are 0, 0.5, 1, 1.5, 2
    code = static_cast<uint8_t>(rintf(a * 2.0f));
  } else if (a < 4.0f) {  // grid 1: 2, 3, 4 are codes 4, 5, 6
    code = static_cast<uint8_t>(rintf(a) + 2.0f);
  } else {  // grid 2: 4, 6 are codes 6, 7
    code = static_cast<uint8_t>(rintf(a * 0.5f) + 4.0f);
  }
  return sign | code;
}

// ---------------------------------------------------------------------------------------------
// The MX scale rule (SPEC section 2): the smallest power of two 2^s with amax <= elem_max * 2^s,
// computed exactly from amax's binary exponent, clamped to [-127, 127]; amax == 0 gives -127.
// elem_max = m_max * 2^e_max with m_max in [0.5, 1): 448 = 0.875 * 2^9, 6 = 0.75 * 2^3.
MXMOE_HD int mx_scale_exponent(float amax, float elem_max_mantissa, int elem_max_exp) {
  if (!(amax > 0.0f)) return kScaleExpMin;
  int e;
  const float m = frexpf(amax, &e);  // amax = m * 2^e, m in [0.5, 1)
  int s = (m <= elem_max_mantissa) ? e - elem_max_exp : e - elem_max_exp + 1;
  if (s < kScaleExpMin) s = kScaleExpMin;
  if (s > kScaleExpMax) s = kScaleExpMax;
  return s;
}
MXMOE_HD int mxfp8_scale_exponent(float amax) { return mx_scale_exponent(amax, 0.875f, 9); }
MXMOE_HD int mxfp4_scale_exponent(float amax) { return mx_scale_exponent(amax, 0.75f, 3); }

// amax over a block; *finite is false when any element is NaN or Inf (the block's scale is NaN).
MXMOE_HD float block_amax(const float* v, int n, bool* finite) {
  float amax = 0.0f;
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(v[i]);
    if (!(a <= 3.4028234663852886e38f)) ok = false;
    else if (a > amax) amax = a;
  }
  *finite = ok;
  return amax;
}

// One block of 32 values to MXFP8: writes 32 E4M3 codes, returns the UE8M0 scale byte.
MXMOE_HD uint8_t mxfp8_quantize_block(const float* v, uint8_t* codes) {
  bool finite;
  const float amax = block_amax(v, kMxBlock, &finite);
  const int s = mxfp8_scale_exponent(amax);
  for (int i = 0; i < kMxBlock; ++i) codes[i] = float_to_e4m3(ldexpf(v[i], -s));
  return finite ? static_cast<uint8_t>(s + 127) : kUe8m0Nan;
}

// One block of 32 values to MXFP4: writes 16 packed bytes (element 2i in the low nibble of byte
// i), returns the UE8M0 scale byte.
MXMOE_HD uint8_t mxfp4_quantize_block(const float* v, uint8_t* packed) {
  bool finite;
  const float amax = block_amax(v, kMxBlock, &finite);
  const int s = mxfp4_scale_exponent(amax);
  for (int i = 0; i < kMxBlock / 2; ++i) {
    const uint8_t lo = float_to_e2m1(ldexpf(v[2 * i], -s));
    const uint8_t hi = float_to_e2m1(ldexpf(v[2 * i + 1], -s));
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return finite ? static_cast<uint8_t>(s + 127) : kUe8m0Nan;
}

// Element i of a packed E2M1 row.
MXMOE_HD uint8_t e2m1_unpack(const uint8_t* packed, int64_t i) {
  const uint8_t b = packed[i >> 1];
  return (i & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
}

}  // namespace mxmoe
