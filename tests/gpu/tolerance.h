// The GPU suite's tolerances, defined once (STYLE habit 7), from how the backends differ.
//
// The fused kernels, the GPU reference and the CPU reference form the same exact products
// (e4m3 * 2^s times e2m1 * 2^s is exact in fp32 and in the bf16 MMA). They differ only in
//   (a) summation: fp32 in MMA order, fp32 in index order, or exact (double): g and u differ by
//       about sqrt(K) * 2^-24 ~ 4e-6 of their size;
//   (b) the activation: glibc's expf / tanhf / erff on the CPU; on the device the exponential from
//       MUFU.EX2 and tanh from a series or 1 - 2 / (1 + e^2y) (activation_math.h), held to 1e-5
//       relative of double (DeviceActivation.*): the order of (a), so it adds to (c)'s flips
//       (their count stays small; the bounds below are per flip);
//   (c) the MXFP8 re-quantization of the intermediate: when a_i sits within that 4e-6 of an e4m3
//       rounding boundary the two sides round it one e4m3 step apart (2^-3 of a_i). That happens
//       to ~1e-4 of the intermediates: a Kimi-K3 token (k * I = 49152 of them) sees a few, and
//       each moves out[t, n] by w_j * step(a_i) * W2[n, i], ~5e-4 of the output's RMS, ~8 times
//       that for the largest a_i and W2[n, i];
//   (d) bf16 outputs: each side rounds to bf16 once; values that straddle a rounding boundary
//       come out one bf16 ulp (2^-7 relative) apart.
// A single flip moves out[t, n] by at most ~ (2/sqrt(k)) * 2^-3 * (|a|max/rms ~5) * (|W2|max/rms ~4)
// / sqrt(I) ~ 5/sqrt(k I) of the output RMS (out's RMS grows as sqrt(k I) times one term's; one
// flip is one term). First device run (DeepSeek shape, k I = 16384): the largest difference was
// 0.016 RMS, i.e. 0.4 of that bound; Kimi-K3 (k I = 49152): 0.0025 RMS.
// Hence |got - ref| <= atol + rel * |ref| with atol = RMS(ref) * clamp(8 / sqrt(k I), 1/64, 1/8)
// (two worst-case flips on one element), rel one bf16 ulp (2^-7) for bf16 outputs and 2^-12 (far
// above (a), far below a flip) for fp32; and normwise ||got - ref|| / ||ref|| <= max(4e-3,
// atol / RMS / sqrt(T)) (flips are rare: at most about one token's worth of worst-case flips).
// Results that differ only in fp32 association (parallel slices summed, no re-quantization
// difference) get kTolSliceRel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/compare.h"
#include "mxmoe/formats.h"

namespace mxmoe::test {

inline constexpr double kMoeAbsOfRmsMin = 1.0 / 64;
inline constexpr double kMoeAbsOfRmsMax = 1.0 / 8;
inline constexpr double kMoeRelBf16 = 1.0 / 128;
inline constexpr double kMoeRelF32 = 1.0 / 4096;
inline constexpr double kMoeNormwise = 4e-3;
inline constexpr double kTolSliceRel = 1e-5;

// atol / RMS for pairs of k * I_local intermediates (see above).
inline double MoeAbsOfRms(int64_t pair_width) {
  const double v = 8.0 / std::sqrt(static_cast<double>(std::max<int64_t>(pair_width, 1)));
  return std::min(kMoeAbsOfRmsMax, std::max(kMoeAbsOfRmsMin, v));
}

inline double Rms(const std::vector<float>& v) {
  double s = 0.0;
  size_t n = 0;
  for (float f : v)
    if (std::isfinite(f)) s += static_cast<double>(f) * f, ++n;
  return n ? std::sqrt(s / static_cast<double>(n)) : 0.0;
}
inline std::vector<float> ToF32(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

inline Tolerance MoeTolF32(const std::vector<float>& ref, int64_t pair_width) {
  return {MoeAbsOfRms(pair_width) * Rms(ref), kMoeRelF32, "moe f32 (RMS*clamp(8/sqrt(kI)) + 2^-12 |ref|)"};
}
inline Tolerance MoeTolBf16(const std::vector<uint16_t>& ref, int64_t pair_width) {
  return {MoeAbsOfRms(pair_width) * Rms(ToF32(ref)), kMoeRelBf16, "moe bf16 (RMS*clamp(8/sqrt(kI)) + 2^-7 |ref|)"};
}
inline Tolerance SliceTol(const std::vector<float>& ref) {
  return {kTolSliceRel * Rms(ref), kTolSliceRel, "slices summed (1e-5 RMS + 1e-5 |ref|)"};
}

// Elementwise within tol and normwise within kMoeNormwise; prints the observed errors on success
// too, so the logs show how much margin the tolerances leave.
inline ::testing::AssertionResult MoeClose(const std::vector<float>& got, const std::vector<float>& ref,
                                           const Tolerance& tol, const std::vector<int64_t>& dims,
                                           int64_t pair_width) {
  auto elementwise = AllClose(got, ref, tol, dims);
  if (!elementwise) return elementwise;
  double worst = 0.0, num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    worst = std::max(worst, d / tol.Allowed(ref[i]));
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  const double normwise = den > 0 ? std::sqrt(num / den) : (num > 0 ? HUGE_VAL : 0.0);
  const double tokens = dims.empty() ? 1.0 : static_cast<double>(std::max<int64_t>(dims[0], 1));
  const double bound = std::max(kMoeNormwise, MoeAbsOfRms(pair_width) / std::sqrt(tokens));
  if (normwise > bound)
    return ::testing::AssertionFailure() << "normwise relative error " << normwise << " > " << bound;
  return ::testing::AssertionSuccess() << "max |diff|/allowed " << worst << ", normwise " << normwise;
}
// pair_width = k * I_local of the layer (slice) that produced the outputs.
inline ::testing::AssertionResult MoeCloseBf16(const std::vector<uint16_t>& got,
                                               const std::vector<uint16_t>& ref,
                                               const std::vector<int64_t>& dims, int64_t pair_width) {
  return MoeClose(ToF32(got), ToF32(ref), MoeTolBf16(ref, pair_width), dims, pair_width);
}
inline ::testing::AssertionResult MoeCloseF32(const std::vector<float>& got, const std::vector<float>& ref,
                                              const std::vector<int64_t>& dims, int64_t pair_width) {
  return MoeClose(got, ref, MoeTolF32(ref, pair_width), dims, pair_width);
}

}  // namespace mxmoe::test
