// The gated activations of SPEC section 3 in fp32, shared by the CPU reference and every kernel.
// NaN propagates through every kind (clamps are written with comparisons, not fminf/fmaxf, which
// would swallow a NaN).
#pragma once

#include <cmath>

#include "mxmoe/activation.h"
#include "mxmoe/formats.h"

namespace mxmoe {

// a / b. Device code multiplies by the approximate reciprocal (rcp.approx.ftz: MUFU.RCP, within
// 1 ulp): the IEEE division is ~10 instructions with a slow path, and the FC1 epilogues that apply
// the activation are bound by instruction issue (docs/perf-log.md, v9). __fdividef did the same
// plus ~4 instructions per call that rescale subnormal divisors, which never occur here: the
// divisors are 1 + e^-x >= 1 and Situ's betas, which ExpertSet validation keeps within
// [2^-126, 2^126] (core/moe.cpp). With them Kimi-K3's layer took 0.3% (T = 4096) to 1.1%
// (T = 16384) longer (perf-log v14).
// The CPU divides exactly; the GPU suite's tolerance covers a few ulp of the activation
// (tests/gpu/tolerance.h, (b)). A divisor above 2^126 gives 0 (its reciprocal is subnormal and
// flushed): 1 + e^-x for x < -87, where the exact quotient is below 2^-126 anyway.
MXMOE_HD float act_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return a * r;
#else
  return a / b;
#endif
}

// Device code uses the faster forms below unless built with MXMOE_ACT_LIBM (the libm forms, for an
// A/B on the device).
#if defined(__CUDA_ARCH__) && !defined(MXMOE_ACT_LIBM)
#define MXMOE_ACT_DEVICE_FORMS 1
#else
#define MXMOE_ACT_DEVICE_FORMS 0
#endif

// e^x. Device code takes 2^(x log2 e) from MUFU.EX2 (ex2.approx.ftz, relative error about 2^-22;
// the rounded product adds |x| 2^-24 relative, ~2^-18 at |x| = 40): two instructions against
// expf's ~8 with its extra-precise range reduction, which the FC1 epilogues, bound by instruction
// issue (perf-log v9, v19), paid per value. Results below 2^-126 are flushed to 0.
MXMOE_HD float act_exp(float x) {
#if MXMOE_ACT_DEVICE_FORMS
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
  return r;
#else
  return expf(x);
#endif
}

MXMOE_HD float act_sigmoid(float x) { return act_div(1.0f, 1.0f + act_exp(-x)); }

// beta * tanh(x / beta). The CPU calls tanhf. Device code (libdevice's tanhf is ~20 instructions
// with two MUFU ops, and Situ takes two of them per value) uses, with y = x / beta:
//   |y| < 1/8: the odd Taylor series to y^7; the first term left out, 62 y^9 / 2835, is below
//     2^-29 of tanh(y) there;
//   otherwise: 1 - 2 / (1 + e^(2y)), whose absolute error (a few 2^-24 from e^(2y) and the
//     reciprocal) is at most ~2^-19 of tanh(y) for |y| >= 1/8. It saturates to +-1 exactly
//     (e^(2y) = inf or 0) and passes NaN on; |result| <= beta.
// tests/gpu/test_activation_device.cu holds the device forms to kTolDeviceActivation against double.
MXMOE_HD float act_tanh_scaled(float x, float beta) {
#if MXMOE_ACT_DEVICE_FORMS
  const float y = act_div(x, beta);
  const float y2 = y * y;
  const float series = y * fmaf(y2, fmaf(y2, fmaf(y2, -17.0f / 315.0f, 2.0f / 15.0f), -1.0f / 3.0f), 1.0f);
  const float closed = fmaf(-2.0f, act_div(1.0f, 1.0f + act_exp(2.0f * y)), 1.0f);
  return beta * (fabsf(y) < 0.125f ? series : closed);
#else
  return beta * tanhf(act_div(x, beta));
#endif
}

// Situ (Kimi-K3): beta*tanh(g/beta)*sigmoid(g) * beta_lin*tanh(u/beta_lin); |act| <= beta*beta_lin.
#if defined(MXMOE_DIAG_SITU_AS_PRODUCT)
// A diagnostic build only (perf-log v26; wrong results): Situ as g * u, to bound what the
// activation's arithmetic costs the FC1 epilogues. The unfused GPU reference is built with it too,
// so the benchmark's check compares like with like.
MXMOE_HD float act_situ(float g, float u, float, float) { return g * u; }
#else
MXMOE_HD float act_situ(float g, float u, float beta, float linear_beta) {
  return act_tanh_scaled(g, beta) * act_sigmoid(g) * act_tanh_scaled(u, linear_beta);
}
#endif

MXMOE_HD float act_swiglu(float g, float u) { return g * act_sigmoid(g) * u; }

// GPT-OSS: biases are already in g and u.
MXMOE_HD float act_swiglu_bias(float g, float u, float alpha, float limit) {
  const float gc = g > limit ? limit : g;
  const float uc = u > limit ? limit : (u < -limit ? -limit : u);
  return gc * act_sigmoid(alpha * gc) * (uc + 1.0f);
}

MXMOE_HD float act_geglu(float g, float u) {
  return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)) * u;
}

MXMOE_HD float act_geglu_tanh(float g, float u) {
  const float kSqrt2OverPi = 0.79788456080286536f;
  return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * u;
}

// Dispatch for the implemented gated kinds; callers have refused the others up front.
MXMOE_HD float apply_activation(ActivationType type, float g, float u, const ActParams& p) {
  switch (type) {
    case ActivationType::Situ:
      return act_situ(g, u, p.beta, p.linear_beta);
    case ActivationType::Swiglu:
      return act_swiglu(g, u);
    case ActivationType::SwigluBias:
      return act_swiglu_bias(g, u, p.alpha, p.limit);
    case ActivationType::Geglu:
      return act_geglu(g, u);
    case ActivationType::GegluTanh:
      return act_geglu_tanh(g, u);
    default:
      return bits_float(0x7FC00000u);  // unreachable after CheckActivationSupported
  }
}

}  // namespace mxmoe
