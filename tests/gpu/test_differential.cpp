// Randomized differential testing (issue 7): random layers and calls, the fused pipeline
// (CudaMoe::Run) against the CPU reference for small problems (ReferenceMoe itself for the smallest,
// CpuMoe, which is bitwise equal to it, threaded, above that) and against the unfused GPU reference
// (CudaMoe::RunReference, plus the first tokens on the CPU) for large ones. Zero mismatches.
//
// Each configuration is made from one seed alone and printed with it:
//   MXMOE_DIFF_SEED=<seed> MXMOE_DIFF_CONFIGS=1 mxmoe_gpu_tests --gtest_filter='Differential.*'
// reruns exactly that line. MXMOE_DIFF_SEED (default 20261203) is the first configuration's seed,
// configuration i uses seed + i; MXMOE_DIFF_CONFIGS (default 1000) the number of configurations.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
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

// Work bounds that keep 1000 configurations near a minute on an H200 host with 16 cores: MACs of a
// call are T*k*3*I_local*K (all slots), weight elements generated E_local*3*I*K.
constexpr double kMacBudget = 1.2e10;        // per configuration (the GPU reference's share)
constexpr double kWeightBudget = 6e7;        // per configuration
constexpr double kCpuMacBudget = 1.5e8;      // the whole call on the CPU (CpuMoe, every core)
constexpr double kReferenceMacBudget = 2e6;  // ReferenceMoe itself (one thread, ~30 ns per MAC)
constexpr int64_t kCpuSubsetTokens = 4;      // large calls: these first tokens on the CPU too

constexpr ActivationType kKinds[] = {ActivationType::Situ, ActivationType::Swiglu, ActivationType::SwigluBias,
                                     ActivationType::Geglu, ActivationType::GegluTanh};
constexpr RoutingPattern kPatterns[] = {RoutingPattern::kUniform, RoutingPattern::kOneExpert,
                                        RoutingPattern::kFewExperts, RoutingPattern::kWithInvalid,
                                        RoutingPattern::kHeavyHitters};

enum class XForm { kBf16, kFp8FromBf16, kFp8Arbitrary };
const char* XFormName(XForm x) {
  return x == XForm::kBf16 ? "bf16" : x == XForm::kFp8FromBf16 ? "fp8(quantized bf16)" : "fp8(arbitrary)";
}

struct Config {
  uint64_t seed = 0;
  LayerShape shape;
  ParallelSlice slice;
  ActivationType kind = ActivationType::Situ;
  bool per_expert = false;  // per-expert activation parameters (Situ beta / beta_lin, SwigluBias alpha / limit)
  bool bias = false;        // SwigluBias gate / up biases
  int64_t tokens = 0;
  RoutingPattern pattern = RoutingPattern::kUniform;
  double bad_rate = 0.0;     // share of slots given an id outside [-1, E)
  bool duplicates = false;   // tokens that pick one expert more than once
  bool all_skipped = false;  // every id -1
  bool nan_weights = false;  // skipped slots (-1, bad ids) carry NaN weights: never read
  bool scaled = false;       // token magnitudes 2^-8 .. 2^8
  XForm x = XForm::kBf16;
  OutputDType dtype = OutputDType::kBF16;
  bool debug_check = false;  // CudaMoe::SetDebugCheck(true)

  int64_t LocalInter() const { return shape.intermediate / slice.tp_size; }
  int64_t LocalExperts() const { return shape.num_experts / slice.ep_size; }
  double Macs(int64_t tokens_) const {
    return static_cast<double>(tokens_) * shape.top_k * 3.0 * LocalInter() * shape.hidden;
  }
  double WeightElements() const { return LocalExperts() * 3.0 * shape.intermediate * shape.hidden; }

  std::string Describe() const {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "seed=%llu E=%lld K=%lld I=%lld k=%lld tp=%d/%d ep=%d/%d T=%lld %s%s%s %s%s%s%s%s x=%s out=%s%s",
                  static_cast<unsigned long long>(seed), static_cast<long long>(shape.num_experts),
                  static_cast<long long>(shape.hidden), static_cast<long long>(shape.intermediate),
                  static_cast<long long>(shape.top_k), slice.tp_rank, slice.tp_size, slice.ep_rank, slice.ep_size,
                  static_cast<long long>(tokens), ActivationName(kind), per_expert ? "(per-expert)" : "",
                  bias ? "(bias)" : "", RoutingPatternName(pattern), bad_rate > 0 ? " bad-ids" : "",
                  duplicates ? " duplicates" : "", all_skipped ? " all-skipped" : "", scaled ? " scaled" : "",
                  XFormName(x), OutputDTypeName(dtype), debug_check ? " debug-check" : "");
    return buf;
  }
};

int64_t RoundDown32(int64_t v) { return std::max<int64_t>(32, v / 32 * 32); }

// Makes K / 32 odd (K not a multiple of 64) or even, never growing K.
int64_t WithParity(int64_t v, bool odd) {
  const int64_t m = v / 32;
  if ((m % 2 == 1) == odd || m == 1) return v;
  return (m - 1) * 32;
}

Config MakeConfig(uint64_t seed) {
  TestRng rng(seed);
  Config c;
  c.seed = seed;
  const double ut = rng.Uniform();  // T weighted to small counts
  c.tokens = ut < 0.03 ? 0
             : ut < 0.45 ? 1 + rng.Below(16)
             : ut < 0.75 ? 17 + rng.Below(112)
             : ut < 0.92 ? 129 + rng.Below(896)
                         : 1025 + rng.Below(3072);
  const double ue = rng.Uniform();
  int64_t e = ue < 0.25 ? 1 + rng.Below(8) : ue < 0.8 ? 9 + rng.Below(56) : 65 + rng.Below(192);
  const int ep = rng.Below(10) < 4 ? 1 << (1 + rng.Below(3)) : 1;
  e = std::max<int64_t>(ep, e / ep * ep);
  const double utp = rng.Uniform();
  const int tp = utp < 0.7 ? 1 : utp < 0.9 ? 2 : 4;
  int64_t k = rng.Below(7) == 0 ? std::min<int64_t>(e, 16) : 1 + rng.Below(std::min<int64_t>(e, 16));
  int64_t il = 32 * (1 + rng.Below(rng.Below(5) == 0 ? 32 : 8));
  int64_t kd = 32 * (1 + rng.Below(rng.Below(10) < 3 ? 64 : 16));
  const bool k_odd = rng.Below(2) == 0, i_odd = rng.Below(2) == 0;
  c.slice.ep_size = ep;
  c.slice.ep_rank = static_cast<int32_t>(rng.Below(ep));
  c.slice.tp_size = tp;
  c.slice.tp_rank = static_cast<int32_t>(rng.Below(tp));
  auto set_shape = [&] { c.shape = LayerShape{e, kd, il * tp, k}; };
  set_shape();
  while (c.Macs(c.tokens) > kMacBudget || c.WeightElements() > kWeightBudget) {
    if (kd > 32 && kd >= il) kd = RoundDown32(kd / 2);
    else if (il > 32) il = RoundDown32(il / 2);
    else if (k > 1) k = (k + 1) / 2;
    else if (e > ep) e = std::max<int64_t>(ep, e / 2 / ep * ep);
    else break;
    set_shape();
  }
  kd = WithParity(kd, k_odd);
  il = WithParity(il, i_odd);
  set_shape();

  c.kind = kKinds[rng.Below(5)];
  c.per_expert = (c.kind == ActivationType::Situ && rng.Below(10) < 7) ||
                 (c.kind == ActivationType::SwigluBias && rng.Below(10) < 4);
  c.bias = c.kind == ActivationType::SwigluBias && rng.Below(10) < 8;
  c.pattern = kPatterns[rng.Below(5)];
  if (rng.Below(4) == 0) c.bad_rate = 0.01 + 0.3 * rng.Uniform();
  c.duplicates = rng.Below(10) == 0;
  c.all_skipped = rng.Below(30) == 0;
  c.nan_weights = rng.Below(2) == 0;
  c.scaled = rng.Below(5) == 0;
  const int64_t ux = rng.Below(20);
  c.x = ux < 14 ? XForm::kBf16 : ux < 17 ? XForm::kFp8FromBf16 : XForm::kFp8Arbitrary;
  c.dtype = rng.Below(2) == 0 ? OutputDType::kBF16 : OutputDType::kF32;
  c.debug_check = rng.Below(10) < 3;
  return c;
}

ActivationSpec MakeActivation(const Config& c, TestRng& rng) {
  ActivationSpec a;
  a.type = c.kind;
  if (!c.per_expert) return a;
  for (int64_t e = 0; e < c.shape.num_experts; ++e) {  // the whole layer's; each rank keeps its own
    ActParams p;
    p.beta = static_cast<float>(rng.Uniform(0.5, 8.0));
    p.linear_beta = static_cast<float>(rng.Uniform(2.0, 40.0));
    p.alpha = static_cast<float>(rng.Uniform(1.0, 2.5));
    p.limit = static_cast<float>(rng.Uniform(2.0, 10.0));
    a.per_expert.push_back(p);
  }
  return a;
}

// A call's host data: ids with the configuration's routing (bad ids included), the same ids with
// bad ones as -1 (what the CPU reference accepts), x in the configuration's form.
struct Call {
  SyntheticInput in;
  std::vector<int32_t> clean_ids;
  std::vector<uint8_t> x_e4m3, x_scale;
  int64_t bad_ids = 0;

  MoeInput Host(bool clean) const {
    MoeInput m = InputOf(in);
    if (clean) m.topk_ids = clean_ids.data();
    if (!x_e4m3.empty()) {
      m.x_bf16 = nullptr;
      m.x_e4m3 = x_e4m3.data();
      m.x_scale = x_scale.data();
    }
    return m;
  }
};

Call MakeCall(const Config& c, TestRng& rng) {
  Call call;
  const int64_t t_count = c.tokens, k = c.shape.top_k, e = c.shape.num_experts, kd = c.shape.hidden;
  MakeSyntheticInput(c.shape, t_count, c.pattern, c.seed * 31 + 7, &call.in);
  std::vector<int32_t>& ids = call.in.topk_ids;
  std::vector<float>& w = call.in.topk_weights;
  if (c.all_skipped) std::fill(ids.begin(), ids.end(), -1);
  if (c.duplicates)
    for (int64_t t = 0; t < t_count; ++t)
      for (int64_t j = 1; j < k; ++j)
        if (ids[t * k] >= 0 && rng.Below(3) == 0) {
          ids[t * k + j] = ids[t * k];
          w[t * k + j] = static_cast<float>(rng.Uniform(0.05, 1.0));
        }
  const int64_t junk[] = {e, e + 1, e + k, e + 1000, int64_t{1} << 24, std::numeric_limits<int32_t>::max(),
                          -2, -3, -100, std::numeric_limits<int32_t>::min()};
  call.clean_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (c.bad_rate > 0 && rng.Uniform() < c.bad_rate) {
      ids[i] = static_cast<int32_t>(junk[rng.Below(10)]);
      call.clean_ids[i] = -1;
      ++call.bad_ids;
    }
    if (c.nan_weights && call.clean_ids[i] == -1) w[i] = NAN;
  }
  if (c.scaled)
    for (int64_t t = 0; t < t_count; ++t) {
      const float f = std::ldexp(1.0f, static_cast<int>(rng.Below(17)) - 8);  // exact in bf16
      for (int64_t n = 0; n < kd; ++n) call.in.x_bf16[t * kd + n] = float_to_bf16(bf16_to_float(call.in.x_bf16[t * kd + n]) * f);
    }
  if (c.x == XForm::kFp8FromBf16) {
    QuantizeMxfp8(call.in.x_bf16, &call.x_e4m3, &call.x_scale);
  } else if (c.x == XForm::kFp8Arbitrary) {
    // Codes no bf16 tensor quantizes to (any finite E4M3, subnormals included), scales around 2^-8.
    call.x_e4m3.resize(call.in.x_bf16.size());
    call.x_scale.resize(call.in.x_bf16.size() / kMxBlock);
    for (uint8_t& b : call.x_e4m3) {
      b = static_cast<uint8_t>(rng.Next());
      if ((b & 0x7F) == 0x7F) b ^= 0x01;  // 0x7F / 0xFF are NaN
    }
    for (uint8_t& s : call.x_scale) s = static_cast<uint8_t>(127 - 11 + rng.Below(6));
  }
  return call;
}

// One output in the call's dtype.
struct Output {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

Output FetchOutput(DeviceCase& dc, OutputDType dtype) {
  Output o;
  if (dtype == OutputDType::kF32) o.f32 = dc.Fetch<float>();
  else o.bf16 = dc.Fetch<uint16_t>();
  return o;
}

::testing::AssertionResult Written(const Output& o, const std::vector<int64_t>& dims) {
  return o.f32.empty() && !o.bf16.empty() ? AllWritten(o.bf16, dims) : AllWritten(o.f32, dims);
}

// Within the GPU suite's tolerance (tests/gpu/tolerance.h); *worst gets max |diff| / allowed.
::testing::AssertionResult Close(const Output& got, const Output& ref, const std::vector<int64_t>& dims,
                                 int64_t pair_width, double* worst) {
  const bool f32 = !ref.f32.empty() || ref.bf16.empty();
  const std::vector<float> g = f32 ? got.f32 : ToF32(got.bf16), r = f32 ? ref.f32 : ToF32(ref.bf16);
  const Tolerance tol = f32 ? MoeTolF32(ref.f32, pair_width) : MoeTolBf16(ref.bf16, pair_width);
  *worst = 0.0;
  for (size_t i = 0; i < std::min(g.size(), r.size()); ++i)
    if (std::isfinite(r[i])) *worst = std::max(*worst, std::fabs(static_cast<double>(g[i]) - r[i]) / tol.Allowed(r[i]));
  return f32 ? MoeCloseF32(got.f32, ref.f32, dims, pair_width) : MoeCloseBf16(got.bf16, ref.bf16, dims, pair_width);
}

// The first n tokens of a call (x in either form, ids cleaned), for the CPU.
MoeInput FirstTokens(const Call& call, int64_t n) {
  MoeInput m = call.Host(/*clean=*/true);
  m.num_tokens = n;
  return m;
}

Output CpuOutput(const ExpertSet& set, const MoeInput& in, OutputDType dtype, bool reference_itself) {
  Output o;
  auto cpu = [](const ExpertSet& e, const MoeInput& i, const MoeOutput& out) { return CpuMoe(e, i, out, 0); };
  if (dtype == OutputDType::kF32)
    o.f32 = reference_itself ? RunF32(ReferenceMoe, set, in) : RunF32(cpu, set, in);
  else
    o.bf16 = reference_itself ? RunBf16(ReferenceMoe, set, in) : RunBf16(cpu, set, in);
  return o;
}

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long r = std::strtoull(v, &end, 10);
  if (end == nullptr || *end != '\0') {
    ADD_FAILURE() << name << "='" << v << "' is not a non-negative integer; using " << fallback;
    return fallback;
  }
  return r;
}

struct Tally {
  int64_t configs = 0, vs_reference = 0, vs_cpu = 0, vs_gpu = 0, with_bad = 0, debug = 0, mismatches = 0;
  int64_t max_tokens = 0;
  double worst = 0.0;
  uint64_t worst_seed = 0;
  std::vector<uint64_t> failed_seeds;
};

// One configuration; adds a failure (with the configuration) for every mismatch.
void RunConfig(const Config& c, Tally* tally) {
  const std::string what = c.Describe();
  SCOPED_TRACE(what);
  TestRng rng(c.seed ^ 0xD1FFull);
  const ActivationSpec act = MakeActivation(c, rng);
  SyntheticOptions opt;
  opt.seed = c.seed;
  opt.with_bias = c.bias;
  opt.num_threads = 0;
  ExpertSet set;
  const Status made = MakeSyntheticExperts(c.shape, act, c.slice, opt, &set);
  ASSERT_TRUE(made.ok()) << made.ToString();
  std::unique_ptr<CudaMoe> moe;
  const Status created = CudaMoe::Create(set, 0, &moe);
  ASSERT_TRUE(created.ok()) << created.ToString();
  moe->SetDebugCheck(c.debug_check);
  const Call call = MakeCall(c, rng);
  const int64_t t_count = c.tokens, kd = c.shape.hidden;
  const std::vector<int64_t> dims{t_count, kd};
  const int64_t pair_width = c.shape.top_k * c.LocalInter();

  DeviceCase dc(*moe, call.in);
  if (!call.x_e4m3.empty()) dc.UseFp8(call.x_e4m3, call.x_scale);
  bool ok = true;
  // A call's status: ok, or (debug mode) the refusal naming this call's bad ids.
  auto check_status = [&](const Status& st, const char* which) {
    if (c.debug_check && call.bad_ids > 0 && t_count > 0) {
      const std::string want = "topk_ids: " + std::to_string(call.bad_ids) + " expert ids";
      if (st.code() == StatusCode::kInvalidArgument && st.message().find(want) != std::string::npos) return;
      ADD_FAILURE() << which << ": expected the debug check's refusal '" << want << "...', got " << st.ToString();
      ok = false;
    } else if (!st.ok()) {
      ADD_FAILURE() << which << ": " << st.ToString();
      ok = false;
    }
  };
  auto check = [&](const ::testing::AssertionResult& r, const char* which) {
    if (r) return;
    ADD_FAILURE() << which << ": " << r.message();
    ok = false;
  };
  auto check_errors = [&](int64_t calls) {
    int64_t count = -1;
    const Status st = moe->ReadErrors(&count);
    if (!st.ok() || count != calls * call.bad_ids) {
      ADD_FAILURE() << "error word: " << count << " after " << calls << " call(s), expected " << calls * call.bad_ids
                    << " (" << st.ToString() << ")";
      ok = false;
    }
  };

  dc.Poison();
  check_status(dc.Launch(c.dtype, /*reference=*/false), "Run");
  const Output got = FetchOutput(dc, c.dtype);
  check(Written(got, dims), "Run output");
  check_errors(1);

  double worst = 0.0;
  const char* against;
  if (t_count == 0) {
    against = "nothing (T = 0)";
  } else if (c.Macs(t_count) <= kCpuMacBudget) {
    const bool itself = c.Macs(t_count) <= kReferenceMacBudget;
    against = itself ? "ReferenceMoe" : "CpuMoe";
    ++(itself ? tally->vs_reference : tally->vs_cpu);
    check(Close(got, CpuOutput(set, call.Host(/*clean=*/true), c.dtype, itself), dims, pair_width, &worst),
          against);
  } else {
    against = "RunReference + CpuMoe(first tokens)";
    ++tally->vs_gpu;
    dc.Poison();
    check_status(dc.Launch(c.dtype, /*reference=*/true), "RunReference");
    const Output ref = FetchOutput(dc, c.dtype);
    check(Written(ref, dims), "RunReference output");
    check(Close(got, ref, dims, pair_width, &worst), "RunReference");
    check_errors(2);
    // The first tokens against the CPU too, so large shapes are anchored to the definition.
    const int64_t n = std::min(t_count, kCpuSubsetTokens);
    Output head;
    if (c.dtype == OutputDType::kF32) head.f32.assign(got.f32.begin(), got.f32.begin() + n * kd);
    else head.bf16.assign(got.bf16.begin(), got.bf16.begin() + n * kd);
    double worst_head = 0.0;
    check(Close(head, CpuOutput(set, FirstTokens(call, n), c.dtype, false), {n, kd}, pair_width, &worst_head),
          "CpuMoe (first tokens)");
    worst = std::max(worst, worst_head);
  }
  std::printf("[diff %4lld] %s vs %s: max |diff|/allowed %.3f%s%s\n", static_cast<long long>(tally->configs),
              what.c_str(), against, worst,
              call.bad_ids > 0 ? (", bad ids " + std::to_string(call.bad_ids) + " counted").c_str() : "",
              ok ? "" : "  MISMATCH");
  std::fflush(stdout);
  ++tally->configs;
  tally->with_bad += call.bad_ids > 0 ? 1 : 0;
  tally->debug += c.debug_check ? 1 : 0;
  tally->max_tokens = std::max(tally->max_tokens, t_count);
  if (worst > tally->worst) tally->worst = worst, tally->worst_seed = c.seed;
  if (!ok) {
    ++tally->mismatches;
    tally->failed_seeds.push_back(c.seed);
  }
}

TEST(Differential, RandomConfigsMatchTheReferences) {
  MXMOE_REQUIRE_SM90();
  const uint64_t first_seed = EnvU64("MXMOE_DIFF_SEED", 20261203);
  const uint64_t count = EnvU64("MXMOE_DIFF_CONFIGS", 1000);
  const auto t0 = std::chrono::steady_clock::now();
  Tally tally;
  for (uint64_t i = 0; i < count; ++i) {
    const Config c = MakeConfig(first_seed + i);
    const int64_t before = tally.configs;
    RunConfig(c, &tally);
    if (tally.configs == before) {  // an assertion ended the configuration early
      ++tally.configs;
      ++tally.mismatches;
      tally.failed_seeds.push_back(c.seed);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string failed;
  for (size_t i = 0; i < std::min<size_t>(tally.failed_seeds.size(), 20); ++i)
    failed += (i ? "," : " failed seeds: ") + std::to_string(tally.failed_seeds[i]);
  std::printf("differential: %lld configs (seeds %llu..%llu; %lld vs ReferenceMoe, %lld vs CpuMoe, %lld vs "
              "RunReference), T up to %lld, %lld with bad ids, %lld debug-checked; %lld mismatches; "
              "max |diff|/allowed %.3f (seed %llu); %.1f s%s\n",
              static_cast<long long>(tally.configs), static_cast<unsigned long long>(first_seed),
              static_cast<unsigned long long>(first_seed + count - 1), static_cast<long long>(tally.vs_reference),
              static_cast<long long>(tally.vs_cpu), static_cast<long long>(tally.vs_gpu),
              static_cast<long long>(tally.max_tokens), static_cast<long long>(tally.with_bad),
              static_cast<long long>(tally.debug), static_cast<long long>(tally.mismatches), tally.worst,
              static_cast<unsigned long long>(tally.worst_seed), secs, failed.c_str());
  EXPECT_EQ(tally.mismatches, 0);
}

}  // namespace
}  // namespace mxmoe::test
