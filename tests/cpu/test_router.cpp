// Kimi-K3's router (SPEC section 5): biased selection, unbiased renormalized weights, ties to the
// lower expert id, refusals before any write. The Python suite checks it against numpy too.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mxmoe/router.h"

namespace mxmoe {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(Router, BiasSelectsWeightsAreUnbiased) {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, -3.0f, -4.0f};
  std::vector<float> bias(8, 0.0f);
  bias[7] = 10.0f;  // the lowest logit is picked first
  RouterOptions opt;
  opt.top_k = 3;
  opt.routed_scaling_factor = 2.0f;
  std::vector<int32_t> ids(3, -7);
  std::vector<float> w(3, -7.0f);
  ASSERT_TRUE(KimiK3Route(logits.data(), bias.data(), 1, 8, opt, ids.data(), w.data()).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 0, 1}));
  const float s[3] = {Sigmoid(-4.0f), Sigmoid(3.0f), Sigmoid(2.0f)};
  const float sum = s[0] + s[1] + s[2];
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(w[j], s[j] / sum * 2.0f) << j;
}

TEST(Router, TiesGoToTheLowerId) {
  std::vector<float> logits(2 * 10, -1.0f);
  for (int t = 0; t < 2; ++t)
    for (int e : {8, 3, 6}) logits[t * 10 + e] = 2.0f;
  const std::vector<float> bias(10, 0.0f);
  RouterOptions opt;
  opt.top_k = 5;
  std::vector<int32_t> ids(10);
  std::vector<float> w(10);
  ASSERT_TRUE(KimiK3Route(logits.data(), bias.data(), 2, 10, opt, ids.data(), w.data()).ok());
  for (int t = 0; t < 2; ++t)
    EXPECT_EQ(std::vector<int32_t>(ids.begin() + 5 * t, ids.begin() + 5 * t + 5), (std::vector<int32_t>{3, 6, 8, 0, 1}));
}

TEST(Router, NanRanksLast) {
  const std::vector<float> logits = {NAN, 0.5f, NAN, 0.1f};
  const std::vector<float> bias(4, 0.0f);
  RouterOptions opt;
  opt.top_k = 3;
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  ASSERT_TRUE(KimiK3Route(logits.data(), bias.data(), 1, 4, opt, ids.data(), w.data()).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 0}));
}

TEST(Router, RefusesBeforeWriting) {
  const std::vector<float> logits(8, 0.0f), bias(8, 0.0f);
  std::vector<int32_t> ids(16, -7);
  std::vector<float> w(16, -7.0f);
  RouterOptions opt;
  opt.top_k = 9;
  Status s = KimiK3Route(logits.data(), bias.data(), 1, 8, opt, ids.data(), w.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_k = 9"), std::string::npos) << s.message();
  opt.top_k = 2;
  opt.routed_scaling_factor = INFINITY;
  EXPECT_FALSE(KimiK3Route(logits.data(), bias.data(), 1, 8, opt, ids.data(), w.data()).ok());
  EXPECT_EQ(ids[0], -7);
  EXPECT_EQ(w[0], -7.0f);
  opt.routed_scaling_factor = 1.0f;
  EXPECT_TRUE(KimiK3Route(nullptr, nullptr, 0, 8, opt, nullptr, nullptr).ok());  // T = 0
}

}  // namespace
}  // namespace mxmoe
