// The arithmetic of Kimi-K3's router (router.h), shared by the CPU router and the CUDA kernel so
// that both compute every score, and therefore every tie, bit for bit alike.
//
// Why not expf: the C library's expf and CUDA's differ in the last bit for some inputs, and a
// 1-ulp difference in a sigmoid score is enough to turn a tie into an order (or the reverse), so
// the GPU would route some tokens differently from the CPU. Here exp is written out with only
// correctly rounded IEEE operations (fmaf, floorf, multiplications by powers of two), which give
// the same bits on any conforming host and on the GPU. On the device the plain operators are
// replaced by the __f*_rn intrinsics, which nvcc never contracts into an FMA; the host side relies
// on the core library's -ffp-contract=off.
#pragma once

#include <cmath>
#include <cstdint>

#include "mxmoe/formats.h"

namespace mxmoe {

MXMOE_HD float router_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

MXMOE_HD float router_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MXMOE_HD float router_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MXMOE_HD float router_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// exp(z) for z in [-20, 87] (callers keep z in that range). Cody-Waite reduction
// z = n*ln2 + r with |r| <= ln2/2 (ln2 split so that n*kLn2Hi is exact for |n| < 2^15), Cephes'
// degree-7 polynomial for exp(r), then the factor 2^n (n in [-29, 126]: a normal float, and the
// product stays normal and finite).
MXMOE_HD float router_exp(float z) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const float n = floorf(router_fma(z, kLog2e, 0.5f));
  float r = router_fma(-n, kLn2Hi, z);
  r = router_fma(-n, kLn2Lo, r);
  float p = 1.9875691500e-4f;
  p = router_fma(p, r, 1.3981999507e-3f);
  p = router_fma(p, r, 8.3334519073e-3f);
  p = router_fma(p, r, 4.1665795894e-2f);
  p = router_fma(p, r, 1.6666665459e-1f);
  p = router_fma(p, r, 5.0000001201e-1f);
  const float y = router_add(router_fma(p, router_mul(r, r), r), 1.0f);
  const uint32_t biased_exponent = static_cast<uint32_t>(static_cast<int32_t>(n) + 127);
  return router_mul(y, bits_float(biased_exponent << 23));
}

// sigmoid(x) = 1 / (1 + exp(-x)) in fp32. Measured over every float in (-87, 20): at most 2.48 ulp
// from the exact sigmoid, the same worst case as 1 / (1 + expf(-x)) (the rounding of 1 + e near
// x = 16 dominates), and bitwise equal to it for 99.7% of inputs. NaN stays NaN. For x >= 20,
// exp(-x) < 2^-28 vanishes next to 1 and the result is exactly 1 (as the formula rounds it); for
// x <= -87 the result would be below 1.7e-38, at the edge of the subnormals (which a
// flush-to-zero build would treat differently), and is 0.
MXMOE_HD float router_sigmoid(float x) {
  if (x != x) return x;
  if (x >= 20.0f) return 1.0f;
  if (x <= -87.0f) return 0.0f;
  return router_div(1.0f, router_add(1.0f, router_exp(-x)));
}

// The selection key of a biased score: unsigned order equals the router's order of scores
// (descending score first when keys are compared descending). -0 ties with +0, as the CPU
// comparator's `x != y` has it; every NaN maps to 1, below every number (the smallest number,
// -inf, maps to 0x007FFFFF); 0 is left free for "taken" in the kernel.
MXMOE_HD uint32_t router_selection_key(float biased) {
  if (biased != biased) return 1u;
  if (biased == 0.0f) return 0x80000000u;
  const uint32_t u = float_bits(biased);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace mxmoe
