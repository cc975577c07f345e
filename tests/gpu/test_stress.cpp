// Large and repeated use (issue 7): T = 65536 with k = 16 on Kimi-K3-shaped experts, and 10 000
// back-to-back calls of varying T on one CudaMoe (no drift, no memory growth, bitwise-stable).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/compare.h"
#include "common/moe_run.h"
#include "common/random.h"
#include "gpu/gpu_harness.h"
#include "gpu/tolerance.h"
#include "mxmoe/cuda.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Resident set of this process, bytes (Linux /proc/self/statm; 0 where it cannot be read).
int64_t ResidentBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (!(f >> pages_total >> pages_resident)) return 0;
  return pages_resident * 4096;
}

// A call of t_count tokens routed uniformly (k distinct experts of E per token), x N(0, 1) in bf16,
// made on every core (MakeSyntheticInput is single-threaded: minutes at T = 65536, K = 3584).
SyntheticInput LargeInput(const LayerShape& s, int64_t t_count, uint64_t seed) {
  SyntheticInput in;
  in.num_tokens = t_count;
  in.x_bf16.resize(static_cast<size_t>(t_count * s.hidden));
  in.topk_ids.resize(static_cast<size_t>(t_count * s.top_k));
  in.topk_weights.resize(in.topk_ids.size());
  const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  const int64_t per = (t_count + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int64_t th = 0; th < threads; ++th)
    pool.emplace_back([&, th] {
      TestRng rng(seed * 1000003 + static_cast<uint64_t>(th));
      std::vector<int32_t> experts(static_cast<size_t>(s.num_experts));
      for (int64_t t = th * per; t < std::min(t_count, (th + 1) * per); ++t) {
        for (int64_t n = 0; n < s.hidden; ++n) in.x_bf16[t * s.hidden + n] = float_to_bf16(static_cast<float>(rng.Normal()));
        for (int64_t e = 0; e < s.num_experts; ++e) experts[e] = static_cast<int32_t>(e);
        double sum = 0.0;
        for (int64_t j = 0; j < s.top_k; ++j) {
          std::swap(experts[j], experts[j + rng.Below(s.num_experts - j)]);
          in.topk_ids[t * s.top_k + j] = experts[j];
          in.topk_weights[t * s.top_k + j] = static_cast<float>(0.05 + rng.Uniform());
          sum += in.topk_weights[t * s.top_k + j];
        }
        for (int64_t j = 0; j < s.top_k; ++j) in.topk_weights[t * s.top_k + j] /= static_cast<float>(sum);
      }
    });
  for (std::thread& t : pool) t.join();
  return in;
}

// The listed tokens of `in`, in order.
SyntheticInput Rows(const SyntheticInput& in, const LayerShape& s, const std::vector<int64_t>& tokens) {
  SyntheticInput r;
  r.num_tokens = static_cast<int64_t>(tokens.size());
  for (int64_t t : tokens) {
    r.x_bf16.insert(r.x_bf16.end(), in.x_bf16.begin() + t * s.hidden, in.x_bf16.begin() + (t + 1) * s.hidden);
    r.topk_ids.insert(r.topk_ids.end(), in.topk_ids.begin() + t * s.top_k, in.topk_ids.begin() + (t + 1) * s.top_k);
    r.topk_weights.insert(r.topk_weights.end(), in.topk_weights.begin() + t * s.top_k,
                          in.topk_weights.begin() + (t + 1) * s.top_k);
  }
  return r;
}

// Some slots -1 and some bad ids (outside [-1, E)), spread over the whole call; returns how many
// bad ids were written into tokens [0, t) for every t (prefix counts, size T + 1).
std::vector<int64_t> SprinkleIds(SyntheticInput* in, const LayerShape& s, int64_t every_skip, int64_t every_bad) {
  const int32_t junk[] = {static_cast<int32_t>(s.num_experts), static_cast<int32_t>(s.num_experts + 5), -2, -1000000};
  std::vector<int64_t> prefix(static_cast<size_t>(in->num_tokens + 1), 0);
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(in->topk_ids.size()); ++i) {
    if (i % every_bad == every_bad / 2) in->topk_ids[i] = junk[(bad++) % 4];
    else if (i % every_skip == 0) in->topk_ids[i] = -1;
    if ((i + 1) % s.top_k == 0) prefix[(i + 1) / s.top_k] = bad;
  }
  return prefix;
}

// T = 65536, k = 16, each expert Kimi-K3's shape (K 3584, I 3072) but E = 128 of them (896 would
// make setup minutes of weight generation; the token count, k and the chunking are what is under
// test). The call runs in workspace chunks; its first and last 256 tokens are checked against the
// unfused GPU reference run on those tokens alone, and the whole output must be written and finite.
TEST(Stress, KimiK3ShapeT65536Top16RunsInChunks) {
  MXMOE_REQUIRE_SM90();
  LayerShape s = kKimiK3Shape;
  s.num_experts = 128;
  const int64_t t_count = 65536, edge = 256;
  auto t0 = std::chrono::steady_clock::now();
  SyntheticOptions opt;
  opt.seed = 301;
  opt.num_threads = 0;
  ExpertSet set;
  ActivationSpec act;
  act.type = ActivationType::Situ;
  ASSERT_TRUE(MakeSyntheticExperts(s, act, {}, opt, &set).ok());
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  moe->SetDebugCheck(false);  // these calls hold bad ids on purpose; the error word counts them
  set.experts.clear();
  set.experts.shrink_to_fit();
  SyntheticInput in = LargeInput(s, t_count, 302);
  const std::vector<int64_t> bad_prefix = SprinkleIds(&in, s, 4099, 100003);
  const int64_t bad_total = bad_prefix.back();
  std::printf("setup (weights, upload, input): %.1f s\n", Seconds(t0));

  const size_t need = moe->WorkspaceSize(t_count);
  std::printf("WorkspaceSize(%lld) = %.2f GiB\n", static_cast<long long>(t_count), need / 1073741824.0);
  DeviceCase dc(*moe, in);  // allocates WorkspaceSize(T)
  ASSERT_NE(dc.workspace(), nullptr) << "cudaMalloc of " << need << " workspace bytes failed";
  // One byte short is refused, naming the workspace and what it needs.
  const Status small = moe->Run(dc.Input(), dc.Output(OutputDType::kF32), dc.workspace(), need - 1, nullptr);
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("WorkspaceSize(65536) = " + std::to_string(need)), std::string::npos)
      << small.message();

  ASSERT_TRUE(moe->ResetErrors().ok());
  t0 = std::chrono::steady_clock::now();
  const std::vector<float> got = dc.RunF32();  // poisoned first; every element checked written
  std::printf("Run T=%lld k=%lld: %.3f s (with the output copy)\n", static_cast<long long>(t_count),
              static_cast<long long>(s.top_k), Seconds(t0));
  int64_t count = -1;
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  EXPECT_EQ(count, bad_total);
  EXPECT_GT(bad_total, 0);
  int64_t non_finite = 0;
  for (float v : got) non_finite += std::isfinite(v) ? 0 : 1;
  EXPECT_EQ(non_finite, 0);

  std::vector<int64_t> tokens;
  for (int64_t t = 0; t < edge; ++t) tokens.push_back(t);
  for (int64_t t = t_count - edge; t < t_count; ++t) tokens.push_back(t);
  const SyntheticInput sub = Rows(in, s, tokens);
  DeviceCase dsub(*moe, sub);
  const std::vector<float> ref = dsub.RunF32(/*reference=*/true);
  std::vector<float> got_rows;
  for (int64_t t : tokens) got_rows.insert(got_rows.end(), got.begin() + t * s.hidden, got.begin() + (t + 1) * s.hidden);
  EXPECT_TRUE(MoeCloseF32(got_rows, ref, {2 * edge, s.hidden}, s.top_k * s.intermediate));
  // The subset also through the fused path on its own: the same tokens in a call of 512.
  EXPECT_TRUE(MoeCloseF32(dsub.RunF32(), ref, {2 * edge, s.hidden}, s.top_k * s.intermediate));
}

// 10 000 calls of varying T on one CudaMoe and one stream, back to back. Every 97th call repeats
// T = 7 and every 101st T = 777 (same inputs): each must equal the first result bitwise. Device
// memory (cudaMemGetInfo) and the host's resident set must not grow, the error word must hold
// exactly the bad ids of all 10 000 calls, and the whole run must take under a minute.
TEST(Stress, TenThousandCallsNoDriftNoGrowth) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{32, 256, 128, 4};
  ActivationSpec act;
  act.type = ActivationType::Situ;
  for (int64_t e = 0; e < s.num_experts; ++e) {
    ActParams p;
    p.beta = 2.0f + 0.25f * static_cast<float>(e % 9);
    p.linear_beta = 10.0f + static_cast<float>(e % 11);
    act.per_expert.push_back(p);
  }
  ExpertSet set = SyntheticSet(s, act, 311);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  moe->SetDebugCheck(false);  // these calls hold bad ids on purpose; the error word counts them
  const int64_t max_t = 2048, t_a = 7, t_b = 777, calls = 10000;
  SyntheticInput in;
  MakeSyntheticInput(s, max_t, RoutingPattern::kWithInvalid, 312, &in);
  const std::vector<int64_t> bad_prefix = SprinkleIds(&in, s, 1000000, 53);
  DeviceCase dc(*moe, in);
  cudaStream_t stream;
  MXMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Token counts: every T up to 48 (decode), 48 more up to 2048 (prefill), and the two repeated.
  TestRng rng(313);
  std::vector<int64_t> pool;
  for (int64_t t = 1; t <= 48; ++t) pool.push_back(t);
  for (int i = 0; i < 48; ++i) pool.push_back(49 + rng.Below(max_t - 48));
  pool.push_back(t_b);
  auto launch = [&](int64_t t, OutputDType dtype) {
    MoeInput call = dc.Input();
    call.num_tokens = t;
    return moe->Run(call, dc.Output(dtype), dc.workspace(), dc.workspace_bytes(), stream);
  };
  auto fetch = [&](int64_t t) {
    std::vector<float> v(static_cast<size_t>(t * s.hidden));
    cudaMemcpyAsync(v.data(), dc.Output(OutputDType::kF32).data, v.size() * sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    return v;
  };
  // Warm-up: every token count of the run once in each dtype (kernels load lazily on first use).
  for (int64_t t : pool)
    for (OutputDType d : {OutputDType::kF32, OutputDType::kBF16}) ASSERT_TRUE(launch(t, d).ok());
  ASSERT_TRUE(launch(t_a, OutputDType::kF32).ok());
  const std::vector<float> first_a = fetch(t_a);
  ASSERT_TRUE(launch(t_b, OutputDType::kF32).ok());
  const std::vector<float> first_b = fetch(t_b);
  ASSERT_TRUE(AllWritten(first_b, {t_b, s.hidden}));
  {
    // The repeated results are right to begin with (the reference refuses bad ids: -1 there).
    MoeInput host = InputOf(in);
    host.num_tokens = t_a;
    std::vector<int32_t> clean(in.topk_ids.begin(), in.topk_ids.begin() + t_a * s.top_k);
    for (int32_t& id : clean)
      if (id < -1 || id >= s.num_experts) id = -1;
    host.topk_ids = clean.data();
    EXPECT_TRUE(MoeCloseF32(first_a, ReferenceF32(set, host), {t_a, s.hidden}, s.top_k * s.intermediate));
  }
  MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_TRUE(moe->ResetErrors().ok());
  size_t free_before = 0, free_after = 0, total = 0;
  MXMOE_CUDA_OK(cudaMemGetInfo(&free_before, &total));
  const int64_t rss_before = ResidentBytes();

  const auto t0 = std::chrono::steady_clock::now();
  int64_t expected_bad = 0, checks = 0, drifts = 0;
  for (int64_t i = 0; i < calls; ++i) {
    const bool check_a = i % 97 == 0, check_b = i % 101 == 50;
    const int64_t t = check_a ? t_a : check_b ? t_b : pool[rng.Below(static_cast<int64_t>(pool.size()))];
    const OutputDType dtype = check_a || check_b || rng.Below(2) == 0 ? OutputDType::kF32 : OutputDType::kBF16;
    const Status st = launch(t, dtype);
    ASSERT_TRUE(st.ok()) << "call " << i << " T=" << t << ": " << st.ToString();
    expected_bad += bad_prefix[t];
    if (check_a || check_b) {
      ++checks;
      const auto r = BitwiseEqual(fetch(t), check_a ? first_a : first_b, {t, s.hidden});
      if (!r && drifts++ == 0) ADD_FAILURE() << "call " << i << " (T=" << t << ") drifted: " << r.message();
    }
  }
  MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
  const double secs = Seconds(t0);
  MXMOE_CUDA_OK(cudaMemGetInfo(&free_after, &total));
  const int64_t rss_after = ResidentBytes();
  int64_t count = -1;
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  const int64_t device_growth = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
  std::printf("stress: %lld calls (T 1..%lld, %zu distinct), %lld bitwise checks of T=%lld/%lld, %lld drifted; "
              "device memory growth %lld bytes, host RSS growth %lld bytes; error word %lld (expected %lld); %.2f s\n",
              static_cast<long long>(calls), static_cast<long long>(max_t), pool.size() + 1,
              static_cast<long long>(checks), static_cast<long long>(t_a), static_cast<long long>(t_b),
              static_cast<long long>(drifts), static_cast<long long>(device_growth),
              static_cast<long long>(rss_after - rss_before), static_cast<long long>(count),
              static_cast<long long>(expected_bad), secs);
  EXPECT_EQ(drifts, 0);
  // No allocation happens per call; the slack is below one 2 MiB device page, i.e. below what any
  // per-call allocation would add over 10 000 calls.
  EXPECT_LE(device_growth, int64_t{2} << 20);
  EXPECT_LE(rss_after - rss_before, int64_t{16} << 20);
  EXPECT_EQ(count, expected_bad);
  EXPECT_LT(secs, 60.0);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace mxmoe::test
