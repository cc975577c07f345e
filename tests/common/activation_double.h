// The gated activations of SPEC section 3 evaluated in double: what the CPU suite holds the fp32
// forms to (tests/cpu/test_activation.cpp) and the GPU suite the device forms
// (tests/gpu/test_activation_device.cu).
#pragma once

#include <algorithm>
#include <cmath>

namespace mxmoe::test {

inline double SigmoidD(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double SituD(double g, double u, double beta, double lin) {
  return beta * std::tanh(g / beta) * SigmoidD(g) * lin * std::tanh(u / lin);
}
inline double SwigluD(double g, double u) { return g * SigmoidD(g) * u; }
inline double SwigluBiasD(double g, double u, double alpha, double limit) {
  const double gc = std::min(g, limit), uc = std::clamp(u, -limit, limit);
  return gc * SigmoidD(alpha * gc) * (uc + 1.0);
}
inline double GegluD(double g, double u) { return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))) * u; }
inline double GegluTanhD(double g, double u) {
  const double k = 0.79788456080286535588;  // sqrt(2 / pi)
  return 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g))) * u;
}

}  // namespace mxmoe::test
