// The gated activations as device code computes them (activation_math.h's device forms: the
// exponential from MUFU.EX2, tanh from a series near 0 and 1 - 2 / (1 + e^2y) elsewhere) against
// their formulas in double, over a dense sweep of (g, u): every sign, magnitudes from 2^-24 to the
// saturated range, and the points where tanh switches from the series to the closed form.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "common/activation_double.h"
#include "common/compare.h"
#include "core/activation_math.h"
#include "gpu_harness.h"

namespace mxmoe {
namespace {

__global__ void ActivationKernel(ActivationType kind, ActParams p, const float* g, const float* u, int n,
                                 float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = apply_activation(kind, g[i], u[i], p);
}

// Magnitudes 2^-24 .. 2^7 in steps of 2^(1/4), [0, 12] in steps of 1/64, and for every beta of
// the tests the values around the series' edge |x / beta| = 1/8; each with both signs and 0.
std::vector<float> SweepValues() {
  std::vector<float> v{0.0f};
  for (int e = -96; e <= 28; ++e) v.push_back(std::exp2(e / 4.0f));
  for (int i = 1; i <= 12 * 64; ++i) v.push_back(i / 64.0f);
  for (float beta : {0.5f, 1.0f, 2.0f, 3.0f, 4.0f, 8.0f, 10.0f, 25.0f, 50.0f})
    for (float f : {0.99f, 0.999999f, 1.0f, 1.000001f, 1.01f}) v.push_back(beta / 8 * f);
  const size_t positive = v.size();
  for (size_t i = 1; i < positive; ++i) v.push_back(-v[i]);
  return v;
}

class DeviceActivation : public ::testing::Test {
 protected:
  void SetUp() override { MXMOE_REQUIRE_SM90(); }

  // launch(g, u, n, out) on device copies of g and u (u may be empty), n = g.size(); the outputs.
  template <class Launch>
  void RunOnDevice(const std::vector<float>& g, const std::vector<float>& u, const Launch& launch,
                   std::vector<float>* got) {
    const int n = static_cast<int>(g.size());
    test::DeviceMem dg(n * sizeof(float)), du(u.size() * sizeof(float)), dout(n * sizeof(float));
    ASSERT_TRUE(dg.ptr && dout.ptr && (u.empty() || du.ptr));
    MXMOE_CUDA_OK(cudaMemcpy(dg.ptr, g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (!u.empty()) MXMOE_CUDA_OK(cudaMemcpy(du.ptr, u.data(), u.size() * sizeof(float), cudaMemcpyHostToDevice));
    launch(dg.As<float>(), du.As<float>(), n, dout.As<float>());
    MXMOE_CUDA_OK(cudaGetLastError());
    got->resize(n);
    MXMOE_CUDA_OK(cudaMemcpy(got->data(), dout.ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
  }

  // f(g, u) for every pair of the sweep (each g with every 7th u, ~490 K pairs in all)
  // against `want` in double.
  template <class D>
  void Check(ActivationType kind, const ActParams& p, D want, const std::string& what) {
    const std::vector<float> vals = SweepValues();
    std::vector<float> g, u;
    for (size_t i = 0; i < vals.size(); ++i)
      for (size_t j = i % 7; j < vals.size(); j += 7) g.push_back(vals[i]), u.push_back(vals[j]);
    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(RunOnDevice(g, u, [&](const float* dg, const float* du, int n, float* out) {
      ActivationKernel<<<(n + 255) / 256, 256>>>(kind, p, dg, du, n, out);
    }, &got));
    std::vector<double> ref(g.size());
    for (size_t i = 0; i < g.size(); ++i) ref[i] = want(g[i], u[i]);
    EXPECT_TRUE(test::AllClose(got, ref, test::kTolDeviceActivation)) << what << " (index into the pairs)";
  }
};

TEST_F(DeviceActivation, SituMatchesDouble) {
  for (auto [b, l] : std::vector<std::pair<float, float>>{{4, 25}, {1, 1}, {2, 10}, {8, 50}, {0.5f, 3}, {25, 4}}) {
    ActParams p;
    p.beta = b;
    p.linear_beta = l;
    Check(ActivationType::Situ, p, [b, l](double g, double u) { return test::SituD(g, u, b, l); },
          "situ(" + std::to_string(b) + ", " + std::to_string(l) + ")");
  }
}

TEST_F(DeviceActivation, SwigluFormsMatchDouble) {
  Check(ActivationType::Swiglu, ActParams{}, [](double g, double u) { return test::SwigluD(g, u); }, "swiglu");
  const ActParams p;  // GPT-OSS's alpha 1.702, limit 7
  Check(ActivationType::SwigluBias, p,
        [&](double g, double u) { return test::SwigluBiasD(g, u, p.alpha, p.limit); }, "swiglu_bias");
}

// beta * tanh(x / beta) alone, held tighter than the products above: in the series range
// |x / beta| < 1/8 to 6e-7 relative (~5 ulp: x / beta through an approximate reciprocal, then the
// rounded series, exact to 2^-29 before rounding),
// above it to 4e-6 (the closed form's bound near the switch, ~2^-19, with MUFU.EX2's and
// MUFU.RCP's own errors).
__global__ void TanhScaledKernel(const float* x, int n, float beta, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = act_tanh_scaled(x[i], beta);
}

TEST_F(DeviceActivation, TanhScaledMatchesDouble) {
  const std::vector<float> x = SweepValues();
  const int n = static_cast<int>(x.size());
  const test::Tolerance series_tol{1e-30, 6e-7, "series range"}, closed_tol{1e-30, 4e-6, "closed form"};
  for (float beta : {0.5f, 1.0f, 3.0f, 4.0f, 25.0f, 50.0f}) {
    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(RunOnDevice(x, {}, [beta](const float* dx, const float*, int count, float* out) {
      TanhScaledKernel<<<(count + 255) / 256, 256>>>(dx, count, beta, out);
    }, &got));
    std::vector<float> got_series, got_closed;
    std::vector<double> ref_series, ref_closed;
    for (int i = 0; i < n; ++i) {
      const double ref = beta * std::tanh(static_cast<double>(x[i]) / beta);
      // (The device's x / beta is x times an approximate reciprocal: points within 1e-6 of the
      // switch may take either form, and are held to the looser bound.)
      const bool series = std::fabs(static_cast<double>(x[i]) / beta) < 0.125 * (1 - 1e-6);
      (series ? got_series : got_closed).push_back(got[i]);
      (series ? ref_series : ref_closed).push_back(ref);
    }
    EXPECT_FALSE(got_series.empty() || got_closed.empty()) << "the sweep covers both forms";
    EXPECT_TRUE(test::AllClose(got_series, ref_series, series_tol)) << "beta " << beta;
    EXPECT_TRUE(test::AllClose(got_closed, ref_closed, closed_tol)) << "beta " << beta;
  }
}

// The device forms keep the bounds and limits the CPU tests check: |situ| <= beta * beta_lin,
// exact saturation, NaN passed on.
__global__ void SituLimitsKernel(float beta, float lin, float* out) {
  out[0] = act_situ(1e4f, 1e4f, beta, lin);
  out[1] = act_situ(1e4f, -1e4f, beta, lin);
  out[2] = act_situ(-1e4f, 1e4f, beta, lin);
  out[3] = act_situ(INFINITY, INFINITY, beta, lin);
  out[4] = act_situ(__int_as_float(0x7FC00000), 1.0f, beta, lin);
  out[5] = act_situ(1.0f, __int_as_float(0x7FC00000), beta, lin);
  out[6] = act_situ(FLT_MAX, -FLT_MAX, beta, lin);
  out[7] = act_situ(0.0f, 3.0f, beta, lin);
}

TEST_F(DeviceActivation, SituLimits) {
  test::DeviceMem d(8 * sizeof(float));
  ASSERT_TRUE(d.ptr);
  for (auto [b, l] : std::vector<std::pair<float, float>>{{4, 25}, {2, 10}, {8, 50}}) {
    SituLimitsKernel<<<1, 1>>>(b, l, d.As<float>());
    MXMOE_CUDA_OK(cudaGetLastError());
    float o[8];
    MXMOE_CUDA_OK(cudaMemcpy(o, d.ptr, sizeof(o), cudaMemcpyDeviceToHost));
    EXPECT_EQ(o[0], b * l);
    EXPECT_EQ(o[1], -b * l);
    EXPECT_EQ(o[2], 0.0f);
    EXPECT_EQ(o[3], b * l);
    EXPECT_TRUE(std::isnan(o[4]));
    EXPECT_TRUE(std::isnan(o[5]));
    EXPECT_EQ(o[6], -b * l);
    EXPECT_EQ(o[7], 0.0f);
  }
}

}  // namespace
}  // namespace mxmoe
