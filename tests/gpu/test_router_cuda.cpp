// The CUDA router (KimiK3RouteCuda) against the CPU KimiK3Route: the same ids and the same weight
// bits for every token, ties included, for f32 and bf16 logits, token counts 0, 1, 2, 33 and 4096,
// the model shapes and the edges of the kernel's configurations; under CUDA graph replay; the
// refusals; and Kimi-K3's shape timed (printed as "[ router ] T=... us GB/s").
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_harness.h"
#include "mxmoe/cuda.h"
#include "mxmoe/formats.h"
#include "mxmoe/router.h"

namespace mxmoe::test {
namespace {

#define MXMOE_REQUIRE_GPU()                                                  \
  do {                                                                       \
    if (::mxmoe::CudaDevices().empty()) GTEST_SKIP() << "needs a CUDA device"; \
  } while (0)

enum class Logits {
  kContinuous,  // N(0, 3): distinct scores, the common case
  kTies,        // a grid of 1/4 in [-5, 5] and a bias in {0, 1/4}: many exactly equal scores
  kSpecial,     // NaN, +-inf, +-0, values at the sigmoid's cut-offs (20, -87) and beyond
};

struct RouterCase {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  float factor = 1.0f;
};

std::string Name(const RouterCase& c, int64_t t, Logits kind, bool bf16) {
  return "E=" + std::to_string(c.num_experts) + " k=" + std::to_string(c.top_k) + " T=" + std::to_string(t) +
         " logits=" + std::to_string(static_cast<int>(kind)) + (bf16 ? " bf16" : " f32");
}

// Logits as f32 values; with bf16 they are rounded to bf16 first, so the CPU sees exactly what the
// kernel widens.
std::vector<float> MakeLogits(int64_t t, int64_t e, Logits kind, bool bf16, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> grid(-20, 20);
  const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 20.0f, 19.999f, -87.0f, -86.99f, 100.0f, -100.0f};
  std::uniform_int_distribution<int> pick(0, static_cast<int>(std::size(specials)) - 1);
  std::vector<float> v(static_cast<size_t>(t * e));
  for (float& x : v) {
    switch (kind) {
      case Logits::kContinuous: x = normal(rng); break;
      case Logits::kTies: x = static_cast<float>(grid(rng)) * 0.25f; break;
      case Logits::kSpecial: x = (rng() % 4 == 0) ? specials[pick(rng)] : normal(rng); break;
    }
    if (bf16) x = bf16_to_float(float_to_bf16(x));
  }
  return v;
}

std::vector<float> MakeBias(int64_t e, Logits kind, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> b(static_cast<size_t>(e));
  std::uniform_real_distribution<float> small(-0.05f, 0.05f);
  for (float& x : b) x = kind == Logits::kTies ? 0.25f * static_cast<float>(rng() % 2) : small(rng);
  return b;
}

bool SameWeight(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);  // NaN payloads may differ
  return float_bits(a) == float_bits(b);
}

// Runs both routers and expects identical results; every output element is poisoned first.
void ExpectGpuEqualsCpu(const RouterCase& c, int64_t t, Logits kind, bool bf16, uint64_t seed) {
  SCOPED_TRACE(Name(c, t, kind, bf16));
  const int64_t e = c.num_experts, k = c.top_k;
  const std::vector<float> logits = MakeLogits(t, e, kind, bf16, seed);
  const std::vector<float> bias = MakeBias(e, kind, seed + 1);
  RouterOptions opt;
  opt.top_k = k;
  opt.routed_scaling_factor = c.factor;
  std::vector<int32_t> want_ids(static_cast<size_t>(t * k));
  std::vector<float> want_w(static_cast<size_t>(t * k));
  ASSERT_TRUE(KimiK3Route(logits.data(), bias.data(), t, e, opt, want_ids.data(), want_w.data()).ok());

  DeviceMem d_logits(std::max<size_t>(4, logits.size() * (bf16 ? 2 : 4))), d_bias(bias.size() * 4),
      d_ids(std::max<size_t>(4, want_ids.size() * 4)), d_w(std::max<size_t>(4, want_w.size() * 4));
  if (bf16 && t > 0) {
    std::vector<uint16_t> bits(logits.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(logits[i]);
    MXMOE_CUDA_OK(cudaMemcpy(d_logits.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  } else if (t > 0) {
    MXMOE_CUDA_OK(cudaMemcpy(d_logits.ptr, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
  }
  MXMOE_CUDA_OK(cudaMemcpy(d_bias.ptr, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  MXMOE_CUDA_OK(cudaMemset(d_ids.ptr, 0xFF, d_ids.bytes));  // ids -1, weights NaN: unwritten shows
  MXMOE_CUDA_OK(cudaMemset(d_w.ptr, 0xFF, d_w.bytes));
  cudaStream_t stream;
  MXMOE_CUDA_OK(cudaStreamCreate(&stream));
  const Status st = KimiK3RouteCuda(d_logits.ptr, bf16 ? RouterLogits::kBF16 : RouterLogits::kF32, d_bias.As<float>(),
                                    t, e, opt, d_ids.As<int32_t>(), d_w.As<float>(), 0, stream);
  ASSERT_TRUE(st.ok()) << st.ToString();
  MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
  MXMOE_CUDA_OK(cudaStreamDestroy(stream));
  if (t == 0) {  // Ok without a launch: the poisoned buffer is untouched
    int32_t first = 0;
    MXMOE_CUDA_OK(cudaMemcpy(&first, d_ids.ptr, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(first, -1);
    return;
  }
  std::vector<int32_t> ids(want_ids.size());
  std::vector<float> w(want_w.size());
  MXMOE_CUDA_OK(cudaMemcpy(ids.data(), d_ids.ptr, ids.size() * 4, cudaMemcpyDeviceToHost));
  MXMOE_CUDA_OK(cudaMemcpy(w.data(), d_w.ptr, w.size() * 4, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < t * k; ++i) {
    ASSERT_EQ(ids[i], want_ids[i]) << "token " << i / k << " slot " << i % k;
    ASSERT_TRUE(SameWeight(w[i], want_w[i]))
        << "token " << i / k << " slot " << i % k << ": gpu " << w[i] << " cpu " << want_w[i];
  }
}

const RouterCase kShapes[] = {
    {896, 16, 1.0f},   // Kimi-K3
    {1024, 32, 2.5f},  // the widest of the middle config, k = one full chunk
    {128, 4, 1.0f},    // GPT-OSS
    {256, 8, 2.5f},    // DeepSeek-V3, the widest of the small config
    {257, 40, 1.0f},   // the middle config's narrowest, k beyond one chunk of 32
    {7, 7, 1.0f},      // k = E, fewer experts than lanes
    {1, 1, 1.0f},
    {4096, 16, 1.0f},  // the widest the CUDA router takes
};

TEST(RouterCuda, MatchesCpuOnModelShapesAndTokenCounts) {
  MXMOE_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const RouterCase& c : kShapes)
    for (int64_t t : {0, 1, 2, 33, 4096})
      for (Logits kind : {Logits::kContinuous, Logits::kTies}) ExpectGpuEqualsCpu(c, t, kind, false, seed++);
}

TEST(RouterCuda, TiesAndSpecialValuesMatchCpu) {
  MXMOE_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const RouterCase& c : kShapes)
    for (int64_t t : {1, 33, 4096}) {
      ExpectGpuEqualsCpu(c, t, Logits::kTies, false, seed++);
      ExpectGpuEqualsCpu(c, t, Logits::kSpecial, false, seed++);
    }
}

TEST(RouterCuda, Bf16LogitsMatchCpuOnWidenedValues) {
  MXMOE_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const RouterCase& c : kShapes)
    for (int64_t t : {0, 1, 33, 4096})
      for (Logits kind : {Logits::kContinuous, Logits::kTies, Logits::kSpecial})
        ExpectGpuEqualsCpu(c, t, kind, true, seed++);
}

// Every score equal: the top k are experts 0..k-1 in order (the lower id wins every tie), each
// weighted factor / k.
TEST(RouterCuda, AllEqualScoresPickTheLowestIds) {
  MXMOE_REQUIRE_GPU();
  const int64_t t = 3, e = 896, k = 16;
  std::vector<float> logits(t * e, 0.5f), bias(e, 0.0f);
  DeviceMem d_logits(logits.size() * 4), d_bias(e * 4), d_ids(t * k * 4), d_w(t * k * 4);
  MXMOE_CUDA_OK(cudaMemcpy(d_logits.ptr, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
  MXMOE_CUDA_OK(cudaMemcpy(d_bias.ptr, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  RouterOptions opt;
  opt.top_k = k;
  ASSERT_TRUE(KimiK3RouteCuda(d_logits.ptr, RouterLogits::kF32, d_bias.As<float>(), t, e, opt, d_ids.As<int32_t>(),
                              d_w.As<float>(), -1, nullptr)
                  .ok());
  std::vector<int32_t> ids(t * k);
  std::vector<float> w(t * k);
  MXMOE_CUDA_OK(cudaMemcpy(ids.data(), d_ids.ptr, ids.size() * 4, cudaMemcpyDeviceToHost));
  MXMOE_CUDA_OK(cudaMemcpy(w.data(), d_w.ptr, w.size() * 4, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < t * k; ++i) {
    EXPECT_EQ(ids[i], i % k);
    EXPECT_NEAR(w[i], 1.0f / k, 1e-7f);
  }
}

// Captured once, replayed with new logits copied into the same buffer: the CPU router's results
// for the new logits.
TEST(RouterCuda, GraphReplayWithNewLogitsMatchesCpu) {
  MXMOE_REQUIRE_GPU();
  const int64_t t = 33, e = 896, k = 16;
  RouterOptions opt;
  opt.top_k = k;
  DeviceMem d_logits(t * e * 4), d_bias(e * 4), d_ids(t * k * 4), d_w(t * k * 4);
  const std::vector<float> bias = MakeBias(e, Logits::kTies, 7);
  MXMOE_CUDA_OK(cudaMemcpy(d_bias.ptr, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  MXMOE_CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  MXMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status st = KimiK3RouteCuda(d_logits.ptr, RouterLogits::kF32, d_bias.As<float>(), t, e, opt,
                                    d_ids.As<int32_t>(), d_w.As<float>(), 0, stream);
  MXMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st.ToString();
  cudaGraphExec_t exec;
  MXMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed : {11, 12, 13}) {
    const std::vector<float> logits = MakeLogits(t, e, Logits::kTies, false, seed);
    MXMOE_CUDA_OK(cudaMemcpy(d_logits.ptr, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    MXMOE_CUDA_OK(cudaMemset(d_ids.ptr, 0xFF, d_ids.bytes));
    MXMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
    MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<int32_t> ids(t * k), want_ids(t * k);
    std::vector<float> w(t * k), want_w(t * k);
    ASSERT_TRUE(KimiK3Route(logits.data(), bias.data(), t, e, opt, want_ids.data(), want_w.data()).ok());
    MXMOE_CUDA_OK(cudaMemcpy(ids.data(), d_ids.ptr, ids.size() * 4, cudaMemcpyDeviceToHost));
    MXMOE_CUDA_OK(cudaMemcpy(w.data(), d_w.ptr, w.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(ids, want_ids) << "seed " << seed;
    EXPECT_EQ(0, std::memcmp(w.data(), want_w.data(), w.size() * 4)) << "seed " << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Kimi-K3's shape at decode and prefill sizes: the median of 50 launches (warm L2: the logits are
// what the previous layer just wrote), printed with the bytes read and written, after checking the
// timed results against the CPU router.
TEST(RouterCuda, KimiK3ShapeTimedAndChecked) {
  MXMOE_REQUIRE_GPU();
  const int64_t e = 896, k = 16;
  RouterOptions opt;
  opt.top_k = k;
  for (int64_t t : {1, 32, 4096, 16384}) {
    const std::vector<float> logits = MakeLogits(t, e, Logits::kContinuous, false, 300 + t);
    const std::vector<float> bias = MakeBias(e, Logits::kContinuous, 301);
    DeviceMem d_logits(logits.size() * 4), d_bias(e * 4), d_ids(t * k * 4), d_w(t * k * 4);
    MXMOE_CUDA_OK(cudaMemcpy(d_logits.ptr, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    MXMOE_CUDA_OK(cudaMemcpy(d_bias.ptr, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
    cudaEvent_t start, stop;
    MXMOE_CUDA_OK(cudaEventCreate(&start));
    MXMOE_CUDA_OK(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int rep = 0; rep < 55; ++rep) {
      MXMOE_CUDA_OK(cudaEventRecord(start));
      ASSERT_TRUE(KimiK3RouteCuda(d_logits.ptr, RouterLogits::kF32, d_bias.As<float>(), t, e, opt, d_ids.As<int32_t>(),
                                  d_w.As<float>(), 0, nullptr)
                      .ok());
      MXMOE_CUDA_OK(cudaEventRecord(stop));
      MXMOE_CUDA_OK(cudaEventSynchronize(stop));
      float elapsed = 0;
      MXMOE_CUDA_OK(cudaEventElapsedTime(&elapsed, start, stop));
      if (rep >= 5) ms.push_back(elapsed);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    const double us = ms[ms.size() / 2] * 1e3;
    const double bytes = static_cast<double>(t * e * 4 + e * 4 + t * k * 8);
    std::printf("[ router ] T=%-6lld E=%lld k=%lld  %8.2f us  %8.1f GB/s\n", static_cast<long long>(t),
                static_cast<long long>(e), static_cast<long long>(k), us, bytes / (us * 1e-6) / 1e9);
    std::vector<int32_t> ids(t * k), want_ids(t * k);
    std::vector<float> w(t * k), want_w(t * k);
    ASSERT_TRUE(KimiK3Route(logits.data(), bias.data(), t, e, opt, want_ids.data(), want_w.data()).ok());
    MXMOE_CUDA_OK(cudaMemcpy(ids.data(), d_ids.ptr, ids.size() * 4, cudaMemcpyDeviceToHost));
    MXMOE_CUDA_OK(cudaMemcpy(w.data(), d_w.ptr, w.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(ids, want_ids) << "T=" << t;
    EXPECT_EQ(0, std::memcmp(w.data(), want_w.data(), w.size() * 4)) << "T=" << t;
  }
}

TEST(RouterCuda, RefusesBeforeLaunching) {
  MXMOE_REQUIRE_GPU();
  DeviceMem d_logits(64 * 4), d_bias(64 * 4), d_ids(64 * 4), d_w(64 * 4);
  RouterOptions opt;
  opt.top_k = 4;
  auto run = [&](const void* logits, int64_t t, int64_t e, const RouterOptions& o) {
    return KimiK3RouteCuda(logits, RouterLogits::kF32, d_bias.As<float>(), t, e, o, d_ids.As<int32_t>(),
                           d_w.As<float>(), 0, nullptr);
  };
  Status s = run(d_logits.ptr, 1, kRouterCudaMaxExperts + 1, opt);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("num_experts = 4097"), std::string::npos) << s.message();
  RouterOptions bad = opt;
  bad.top_k = 17;
  s = run(d_logits.ptr, 1, 16, bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_k = 17"), std::string::npos) << s.message();
  bad = opt;
  bad.routed_scaling_factor = NAN;
  EXPECT_EQ(run(d_logits.ptr, 1, 16, bad).code(), StatusCode::kInvalidArgument);
  s = run(static_cast<const char*>(d_logits.ptr) + 2, 1, 16, opt);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("logits: must be 4-byte aligned"), std::string::npos) << s.message();
  s = run(nullptr, 1, 16, opt);
  EXPECT_NE(s.message().find("logits: missing"), std::string::npos) << s.message();
  EXPECT_TRUE(run(nullptr, 0, 16, opt).ok());  // T = 0: nothing to read or write
  s = KimiK3RouteCuda(d_logits.ptr, static_cast<RouterLogits>(7), d_bias.As<float>(), 1, 16, opt, d_ids.As<int32_t>(),
                      d_w.As<float>(), 0, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  MXMOE_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace mxmoe::test
