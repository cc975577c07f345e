// Activation kinds (SPEC section 3): the FlashInfer numbering, the gated set, name and integer
// lookups, refusal by name of what is not implemented, and the fp32 math of every implemented kind
// against its formula evaluated in double here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "common/activation_double.h"
#include "common/compare.h"
#include "core/activation_math.h"
#include "mxmoe/activation.h"

namespace mxmoe {
namespace {

using test::GegluD;
using test::GegluTanhD;
using test::kTolF32Math;
using test::SituD;
using test::SwigluBiasD;
using test::SwigluD;

// ---- the enum -----------------------------------------------------------------------------------

static_assert(static_cast<int>(ActivationType::Gelu) == 0);
static_assert(static_cast<int>(ActivationType::Situ) == 10);
static_assert(static_cast<int>(ActivationType::InvalidType) == 11);

struct Kind {
  const char* name;
  int value;
  bool gated;
};
// SPEC section 3, FlashInfer's ActivationType.
const Kind kKinds[] = {
    {"Gelu", 0, false},      {"Relu", 1, false},      {"Silu", 2, false},      {"Swiglu", 3, true},
    {"Geglu", 4, true},      {"SwigluBias", 5, true}, {"Relu2", 6, false},     {"SwigluStep", 7, true},
    {"GegluTanh", 8, true},  {"Identity", 9, false},  {"Situ", 10, true},      {"InvalidType", 11, false},
};
const ActivationType kImplemented[] = {ActivationType::Swiglu, ActivationType::Geglu,
                                       ActivationType::SwigluBias, ActivationType::GegluTanh,
                                       ActivationType::Situ};

TEST(ActivationEnum, FlashInferNumberingAndNames) {
  for (const Kind& k : kKinds) {
    const auto t = static_cast<ActivationType>(k.value);
    EXPECT_STREQ(ActivationName(t), k.name) << k.value;
    auto by_name = ActivationFromName(k.name);
    ASSERT_TRUE(by_name.has_value()) << k.name;
    EXPECT_EQ(static_cast<int>(*by_name), k.value) << k.name;
  }
  EXPECT_EQ(static_cast<int>(ActivationType::Relu), 1);
  EXPECT_EQ(static_cast<int>(ActivationType::Silu), 2);
  EXPECT_EQ(static_cast<int>(ActivationType::Swiglu), 3);
  EXPECT_EQ(static_cast<int>(ActivationType::Geglu), 4);
  EXPECT_EQ(static_cast<int>(ActivationType::SwigluBias), 5);
  EXPECT_EQ(static_cast<int>(ActivationType::Relu2), 6);
  EXPECT_EQ(static_cast<int>(ActivationType::SwigluStep), 7);
  EXPECT_EQ(static_cast<int>(ActivationType::GegluTanh), 8);
  EXPECT_EQ(static_cast<int>(ActivationType::Identity), 9);
  EXPECT_STREQ(ActivationName(static_cast<ActivationType>(42)), "InvalidType");
  EXPECT_STREQ(ActivationName(static_cast<ActivationType>(-1)), "InvalidType");
}

TEST(ActivationEnum, GatedSet) {
  for (const Kind& k : kKinds) EXPECT_EQ(IsGated(static_cast<ActivationType>(k.value)), k.gated) << k.name;
  EXPECT_FALSE(IsGated(static_cast<ActivationType>(12)));
  EXPECT_FALSE(IsGated(static_cast<ActivationType>(-5)));
  static_assert(IsGated(ActivationType::Situ) && !IsGated(ActivationType::Silu));
}

TEST(ActivationEnum, FromNameIsCaseInsensitiveAndExact) {
  EXPECT_EQ(ActivationFromName("situ"), ActivationType::Situ);
  EXPECT_EQ(ActivationFromName("SITU"), ActivationType::Situ);
  EXPECT_EQ(ActivationFromName("swiglubias"), ActivationType::SwigluBias);
  EXPECT_EQ(ActivationFromName("GEGLUTANH"), ActivationType::GegluTanh);
  for (const char* bad : {"", "situ ", " situ", "sit", "gelu_tanh", "swiglu-bias", "10", "Situx"})
    EXPECT_FALSE(ActivationFromName(bad).has_value()) << "'" << bad << "'";
}

TEST(ActivationEnum, FromInt) {
  for (const Kind& k : kKinds) {
    ActivationType t = ActivationType::Gelu;
    const Status st = ActivationFromInt(k.value, &t);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(static_cast<int>(t), k.value);
  }
  for (int64_t bad : {int64_t{-1}, int64_t{12}, int64_t{100}, int64_t{1} << 40}) {
    ActivationType t = ActivationType::Situ;
    const Status st = ActivationFromInt(bad, &t);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.message();
    EXPECT_EQ(t, ActivationType::Situ) << "output untouched on error";
  }
}

TEST(ActivationEnum, CheckSupportedRefusesByName) {
  for (ActivationType t : kImplemented) {
    const Status st = CheckActivationSupported(t);
    EXPECT_TRUE(st.ok()) << ActivationName(t) << ": " << st.ToString();
  }
  for (const Kind& k : kKinds) {
    const auto t = static_cast<ActivationType>(k.value);
    bool implemented = false;
    for (ActivationType i : kImplemented) implemented |= (i == t);
    if (implemented) continue;
    const Status st = CheckActivationSupported(t);
    EXPECT_FALSE(st.ok()) << k.name;
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << k.name;
    EXPECT_NE(st.message().find(k.name), std::string::npos) << st.message();
  }
  // Out-of-range values are refused too, naming the value.
  for (int v : {12, 42, -3}) {
    const Status st = CheckActivationSupported(static_cast<ActivationType>(v));
    EXPECT_FALSE(st.ok()) << v;
    EXPECT_NE(st.message().find(std::to_string(v)), std::string::npos) << st.message();
  }
}

// ---- the math, against double formulas ------------------------------------------------------------

// (g, u) points of the interesting range (g and u of order 1, a few far out).
const std::vector<std::pair<float, float>>& Points() {
  static const std::vector<std::pair<float, float>> p = [] {
    std::vector<std::pair<float, float>> v;
    const float vals[] = {-30.0f, -9.5f, -7.0f, -4.0f, -2.5f, -1.0f, -0.3f, -1e-3f, 0.0f, 1e-3f,
                          0.25f,  0.7f,  1.0f,  1.7f,  3.0f,  6.9f,  7.0f,  7.1f,  12.0f, 40.0f};
    for (float g : vals)
      for (float u : vals) v.emplace_back(g, u);
    return v;
  }();
  return p;
}

template <class F, class D>
void CheckAgainstDouble(F f32, D f64, const char* what) {
  std::vector<float> got;
  std::vector<double> want;
  for (auto [g, u] : Points()) {
    got.push_back(f32(g, u));
    want.push_back(f64(g, u));
  }
  EXPECT_TRUE(test::AllClose(got, want, kTolF32Math, {20, 20})) << what << " at [g index, u index]";
}

// The GELU forms compute 1 + erf(g) (or 1 + tanh) in fp32, which for g << 0 cancels: the error is
// about an ulp of 1 times |g * u|, not relative to the (tiny) result. Points with g > -3 are held
// to kTolF32Math, the others to 4 * 2^-24 * |g * u|.
template <class F, class D>
void CheckGeluFormAgainstDouble(F f32, D f64, const char* what) {
  std::vector<float> got;
  std::vector<double> want;
  for (auto [g, u] : Points()) {
    const double d = f64(g, u);
    const float f = f32(g, u);
    if (g > -3.0f) {
      got.push_back(f);
      want.push_back(d);
    } else {
      EXPECT_LE(std::fabs(f - d), std::ldexp(4.0, -24) * std::fabs(double{g} * u) + 1e-30)
          << what << "(" << g << ", " << u << "): got " << f << ", want " << d;
    }
  }
  EXPECT_TRUE(test::AllClose(got, want, kTolF32Math)) << what;
}

TEST(ActivationMath, SituKimiK3Parameters) {
  EXPECT_EQ(kSituDefaultBeta, 4.0f);
  EXPECT_EQ(kSituDefaultLinearBeta, 25.0f);
  CheckAgainstDouble([](float g, float u) { return act_situ(g, u, 4.0f, 25.0f); },
                     [](double g, double u) { return SituD(g, u, 4.0, 25.0); }, "situ(4, 25)");
  // A few values written out: situ(1, 1) = 4 tanh(1/4) sigma(1) * 25 tanh(1/25).
  EXPECT_NEAR(act_situ(1.0f, 1.0f, 4.0f, 25.0f),
              4 * std::tanh(0.25) * (1 / (1 + std::exp(-1.0))) * 25 * std::tanh(0.04), 1e-6);
  EXPECT_EQ(act_situ(0.0f, 3.0f, 4.0f, 25.0f), 0.0f);
  EXPECT_EQ(act_situ(3.0f, 0.0f, 4.0f, 25.0f), 0.0f);
}

TEST(ActivationMath, SituOtherBetas) {
  for (const auto& bl : std::vector<std::pair<float, float>>{{1, 1}, {2, 10}, {8, 50}, {0.5f, 3}, {25, 4}}) {
    const float b = bl.first, l = bl.second;  // named copies: lambdas below capture them
    CheckAgainstDouble([b, l](float g, float u) { return act_situ(g, u, b, l); },
                       [b, l](double g, double u) { return SituD(g, u, b, l); },
                       ("situ(" + std::to_string(b) + ", " + std::to_string(l) + ")").c_str());
  }
}

TEST(ActivationMath, SituIsBoundedByBetaTimesLinearBeta) {
  const float big[] = {1e4f, -1e4f, 1e3f, -1e3f, 100.0f, -100.0f, 1e30f, -1e30f, FLT_MAX, -FLT_MAX,
                       INFINITY, -INFINITY, 5.0f, -5.0f};
  for (auto [b, l] : std::vector<std::pair<float, float>>{{4, 25}, {2, 10}, {8, 50}}) {
    for (float g : big)
      for (float u : big) {
        const float a = act_situ(g, u, b, l);
        ASSERT_FALSE(std::isnan(a)) << g << ", " << u;
        ASSERT_LE(std::fabs(a), b * l) << "situ(" << g << ", " << u << ") beta " << b << ", " << l;
      }
    // Saturated: g, u -> +inf gives beta * beta_lin (tanh and sigma reach 1 in fp32).
    EXPECT_EQ(act_situ(1e4f, 1e4f, b, l), b * l);
    EXPECT_EQ(act_situ(1e4f, -1e4f, b, l), -b * l);
    // g -> -inf: sigma(g) -> 0.
    EXPECT_EQ(act_situ(-1e4f, 1e4f, b, l), 0.0f);
  }
}

TEST(ActivationMath, SituIsAsymmetric) {
  // Gate and up play different roles: swapping them changes the value (why every layout test
  // uses SiTU).
  for (auto [g, u] : std::vector<std::pair<float, float>>{{1.3f, -0.7f}, {0.5f, 2.0f}, {-1.0f, 1.0f},
                                                          {2.0f, 3.0f}, {0.1f, 0.9f}}) {
    EXPECT_NE(act_situ(g, u, 4.0f, 25.0f), act_situ(u, g, 4.0f, 25.0f)) << g << ", " << u;
    EXPECT_GT(std::fabs(SituD(g, u, 4, 25) - SituD(u, g, 4, 25)), 1e-3) << g << ", " << u;
  }
}

TEST(ActivationMath, Swiglu) {
  CheckAgainstDouble(act_swiglu, SwigluD, "swiglu");
  EXPECT_NEAR(act_swiglu(2.0f, 3.0f), 2 * 3 / (1 + std::exp(-2.0)), 1e-6);
}

TEST(ActivationMath, SwigluBiasFormulaAndClamps) {
  EXPECT_EQ(kSwigluBiasDefaultAlpha, 1.702f);
  EXPECT_EQ(kSwigluBiasDefaultLimit, 7.0f);
  for (const auto& al : std::vector<std::pair<float, float>>{{1.702f, 7.0f}, {1.0f, 3.0f}, {2.5f, 10.0f}}) {
    const float alpha = al.first, limit = al.second;  // named copies: lambdas below capture them
    CheckAgainstDouble([=](float g, float u) { return act_swiglu_bias(g, u, alpha, limit); },
                       [=](double g, double u) { return SwigluBiasD(g, u, alpha, limit); },
                       "swiglu_bias");
    // g above the limit is clamped to it; below -limit it is not clamped.
    for (float u : {-2.0f, 0.5f, 3.0f}) {
      EXPECT_EQ(act_swiglu_bias(limit + 3.0f, u, alpha, limit), act_swiglu_bias(limit, u, alpha, limit));
      EXPECT_EQ(act_swiglu_bias(1e30f, u, alpha, limit), act_swiglu_bias(limit, u, alpha, limit));
      EXPECT_NE(act_swiglu_bias(-limit - 1.0f, u, alpha, limit), act_swiglu_bias(-limit, u, alpha, limit));
    }
    // u is clamped on both sides.
    for (float g : {-1.0f, 0.5f, 2.0f}) {
      EXPECT_EQ(act_swiglu_bias(g, limit + 5.0f, alpha, limit), act_swiglu_bias(g, limit, alpha, limit));
      EXPECT_EQ(act_swiglu_bias(g, -limit - 5.0f, alpha, limit), act_swiglu_bias(g, -limit, alpha, limit));
      EXPECT_EQ(act_swiglu_bias(g, -1e30f, alpha, limit), act_swiglu_bias(g, -limit, alpha, limit));
    }
  }
  // alpha enters the sigmoid only: at g = 1, u = 0 the value is sigma(alpha).
  EXPECT_NEAR(act_swiglu_bias(1.0f, 0.0f, 1.702f, 7.0f), 1 / (1 + std::exp(-1.702)), 1e-6);
  EXPECT_NEAR(act_swiglu_bias(1.0f, 0.0f, 0.5f, 7.0f), 1 / (1 + std::exp(-0.5)), 1e-6);
  // Worked GPT-OSS value: g = 10 -> 7, u = -9 -> -7: 7 sigma(11.914) (-6).
  EXPECT_NEAR(act_swiglu_bias(10.0f, -9.0f, 1.702f, 7.0f), 7 * test::SigmoidD(1.702 * 7) * -6, 1e-5);
}

TEST(ActivationMath, GegluErf) {
  CheckGeluFormAgainstDouble(act_geglu, GegluD, "geglu");
  EXPECT_NEAR(act_geglu(1.0f, 2.0f), 1.0 * (1 + std::erf(1 / std::sqrt(2.0))), 1e-6);
}

TEST(ActivationMath, GegluTanh) {
  CheckGeluFormAgainstDouble(act_geglu_tanh, GegluTanhD, "geglu_tanh");
  // The two GELU forms are close but not equal.
  EXPECT_NE(act_geglu_tanh(1.0f, 1.0f), act_geglu(1.0f, 1.0f));
  EXPECT_NEAR(act_geglu_tanh(1.0f, 1.0f), act_geglu(1.0f, 1.0f), 1e-3);
}

TEST(ActivationMath, DispatchMatchesEachKind) {
  ActParams p;
  p.beta = 3.0f, p.linear_beta = 20.0f, p.alpha = 1.5f, p.limit = 5.0f;
  for (auto [g, u] : Points()) {
    EXPECT_EQ(float_bits(apply_activation(ActivationType::Situ, g, u, p)), float_bits(act_situ(g, u, 3.0f, 20.0f)));
    EXPECT_EQ(float_bits(apply_activation(ActivationType::Swiglu, g, u, p)), float_bits(act_swiglu(g, u)));
    EXPECT_EQ(float_bits(apply_activation(ActivationType::SwigluBias, g, u, p)),
              float_bits(act_swiglu_bias(g, u, 1.5f, 5.0f)));
    EXPECT_EQ(float_bits(apply_activation(ActivationType::Geglu, g, u, p)), float_bits(act_geglu(g, u)));
    EXPECT_EQ(float_bits(apply_activation(ActivationType::GegluTanh, g, u, p)), float_bits(act_geglu_tanh(g, u)));
  }
  // A kind nobody implements never silently becomes another: the dispatch gives NaN.
  EXPECT_TRUE(std::isnan(apply_activation(ActivationType::SwigluStep, 1.0f, 1.0f, p)));
  EXPECT_TRUE(std::isnan(apply_activation(ActivationType::Gelu, 1.0f, 1.0f, p)));
}

TEST(ActivationMath, NanPropagatesThroughEveryKind) {
  const float nan = NAN;
  ActParams p;
  for (ActivationType t : kImplemented) {
    for (float other : {-100.0f, -7.0f, -1.0f, 0.0f, 0.5f, 7.0f, 100.0f, INFINITY, -INFINITY}) {
      EXPECT_TRUE(std::isnan(apply_activation(t, nan, other, p))) << ActivationName(t) << "(NaN, " << other << ")";
      EXPECT_TRUE(std::isnan(apply_activation(t, other, nan, p))) << ActivationName(t) << "(" << other << ", NaN)";
    }
    EXPECT_TRUE(std::isnan(apply_activation(t, nan, nan, p))) << ActivationName(t);
  }
  // The SwigluBias clamps in particular (fminf / fmaxf would return the limit).
  EXPECT_TRUE(std::isnan(act_swiglu_bias(nan, 1.0f, 1.702f, 7.0f)));
  EXPECT_TRUE(std::isnan(act_swiglu_bias(1.0f, nan, 1.702f, 7.0f)));
  EXPECT_TRUE(std::isnan(act_swiglu_bias(1.0f, -nan, 1.702f, 7.0f)));
}

}  // namespace
}  // namespace mxmoe
