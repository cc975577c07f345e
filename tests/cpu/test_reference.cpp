// The CPU reference MoE (the definition of correct, SPEC section 1) against an implementation
// written here from the SPEC alone, its invariants (empty calls, NaN isolation, -1 ids, output
// dtypes, TP and EP slices, pre-quantized input, per-expert parameters), the CPU backend's bitwise
// agreement with it, and the refusals of invalid calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/moe_run.h"
#include "common/random.h"
#include "mxmoe/formats.h"
#include "mxmoe/layouts.h"
#include "mxmoe/moe.h"
#include "mxmoe/synthetic.h"

namespace mxmoe {
namespace {

using test::TestRng;

// =================================================================================================
// An independent implementation of SPEC section 1, from formats.h's element encode/decode only:
// its own scale rule (brute force), its own nibble and scale indexing, its own activation
// formulas. Dot products are summed in double: every product of an E4M3 and an E2M1 value with
// power-of-two scales is exact, and at these sizes and scales so is their sum, so the order does
// not matter and the result, rounded to fp32 once, is the unique correctly rounded g, u and y.
// =================================================================================================

// fp32 a * b without FMA contraction, whatever flags the tests are built with.
float Mul(float a, float b) {
  volatile float p = a * b;
  return p;
}

// Smallest s in [-127, 127] with amax <= elem_max * 2^s (exact in double).
int MyScale(double amax, double elem_max) {
  for (int s = -127; s <= 127; ++s)
    if (amax <= std::ldexp(elem_max, s)) return s;
  return 127;
}

// deq(mxfp8_quantize(v)) per 32 consecutive elements; a block with NaN or Inf is all NaN.
std::vector<double> MyMxfp8RoundTrip(const std::vector<float>& v) {
  std::vector<double> out(v.size());
  for (size_t b = 0; b < v.size(); b += 32) {
    double amax = 0;
    bool finite = true;
    for (size_t i = b; i < b + 32; ++i) {
      if (!std::isfinite(v[i])) finite = false;
      else amax = std::max(amax, std::fabs(static_cast<double>(v[i])));
    }
    const int s = MyScale(amax, 448.0);
    for (size_t i = b; i < b + 32; ++i) {
      const uint8_t code = float_to_e4m3(static_cast<float>(std::ldexp(static_cast<double>(v[i]), -s)));
      out[i] = finite ? static_cast<double>(e4m3_to_float(code)) * std::ldexp(1.0, s) : NAN;
    }
  }
  return out;
}

// Element (r, c) of an MXFP4 matrix: element 2i in the low nibble of byte i of the row, one
// UE8M0 byte per 32 columns.
double MyWeight(const Mxfp4Matrix& m, int64_t r, int64_t c) {
  const uint8_t byte = m.packed[static_cast<size_t>(r * (m.cols / 2) + c / 2)];
  const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  const uint8_t sb = m.scales[static_cast<size_t>(r * (m.cols / 32) + c / 32)];
  if (sb == 0xFF) return NAN;
  return static_cast<double>(e2m1_to_float(code)) * std::ldexp(1.0, sb - 127);
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// SPEC section 3, in fp32.
float MyAct(ActivationType t, float g, float u, const ActParams& p) {
  switch (t) {
    case ActivationType::Situ:
      return Mul(Mul(Mul(p.beta, std::tanh(g / p.beta)), Sigmoid(g)), Mul(p.linear_beta, std::tanh(u / p.linear_beta)));
    case ActivationType::Swiglu:
      return Mul(Mul(g, Sigmoid(g)), u);
    case ActivationType::SwigluBias: {
      const float gc = g > p.limit ? p.limit : g;
      const float uc = u > p.limit ? p.limit : (u < -p.limit ? -p.limit : u);
      return Mul(Mul(gc, Sigmoid(Mul(p.alpha, gc))), uc + 1.0f);
    }
    case ActivationType::Geglu:
      return Mul(Mul(Mul(0.5f, g), 1.0f + std::erf(Mul(g, 0.70710678118654752f))), u);
    case ActivationType::GegluTanh: {
      const float inner = Mul(0.79788456080286536f, g + Mul(Mul(Mul(0.044715f, g), g), g));
      return Mul(Mul(Mul(0.5f, g), 1.0f + std::tanh(inner)), u);
    }
    default:
      ADD_FAILURE() << "MyAct: " << ActivationName(t);
      return NAN;
  }
}

// deq(mxfp8_quantize(x)) of bf16 input, [T, K].
std::vector<double> MyQuantizedInput(const std::vector<uint16_t>& x_bf16) {
  std::vector<float> xf(x_bf16.size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_float(x_bf16[i]);
  return MyMxfp8RoundTrip(xf);  // blocks never straddle rows: K is a multiple of 32
}

// The rank's fp32 partial output [T, K] from the dequantized input xd [T, K].
std::vector<float> MyMoe(const ExpertSet& s, const std::vector<double>& xd, const std::vector<int32_t>& ids,
                         const std::vector<float>& weights, int64_t t_count) {
  const int64_t k_dim = s.shape.hidden, top_k = s.shape.top_k;
  const int64_t i_loc = s.shape.intermediate / s.slice.tp_size;
  const int64_t e_loc = s.shape.num_experts / s.slice.ep_size, e0 = s.slice.ep_rank * e_loc;
  std::vector<float> out(static_cast<size_t>(t_count * k_dim), 0.0f);
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t id = ids[t * top_k + j];
      if (id < e0 || id >= e0 + e_loc) continue;  // -1, or another rank's expert
      const int64_t e = id - e0;
      const ExpertWeights& w = s.experts[e];
      const ActParams& p = s.activation.per_expert.empty() ? s.activation.params : s.activation.per_expert[e];
      std::vector<float> a(i_loc);
      for (int64_t i = 0; i < i_loc; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < k_dim; ++c) {
          g += xd[t * k_dim + c] * MyWeight(w.w1, i, c);
          u += xd[t * k_dim + c] * MyWeight(w.w3, i, c);
        }
        float gf = static_cast<float>(g), uf = static_cast<float>(u);
        if (!w.gate_bias.empty()) gf = gf + w.gate_bias[i];
        if (!w.up_bias.empty()) uf = uf + w.up_bias[i];
        a[i] = MyAct(s.activation.type, gf, uf, p);
      }
      const std::vector<double> aq = MyMxfp8RoundTrip(a);
      const float tw = weights[t * top_k + j];
      for (int64_t n = 0; n < k_dim; ++n) {
        double y = 0;
        for (int64_t i = 0; i < i_loc; ++i) y += aq[i] * MyWeight(w.w2, n, i);
        out[t * k_dim + n] = out[t * k_dim + n] + Mul(tw, static_cast<float>(y));
      }
    }
  }
  return out;
}

std::vector<float> MyMoe(const ExpertSet& s, const SyntheticInput& in) {
  return MyMoe(s, MyQuantizedInput(in.x_bf16), in.topk_ids, in.topk_weights, in.num_tokens);
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
  return h;
}

ExpertSet MakeSet(const LayerShape& shape, const ActivationSpec& act, uint64_t seed, int jitter = 1,
                  bool with_bias = false, const ParallelSlice& slice = {}) {
  SyntheticOptions opt;
  opt.seed = seed;
  opt.scale_exp_jitter = jitter;
  opt.with_bias = with_bias;
  opt.num_threads = 1;
  ExpertSet s;
  const Status st = MakeSyntheticExperts(shape, act, slice, opt, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

SyntheticInput MakeInput(const LayerShape& shape, int64_t t, RoutingPattern p, uint64_t seed) {
  SyntheticInput in;
  MakeSyntheticInput(shape, t, p, seed, &in);
  return in;
}

auto CpuMoeWith(int threads) {
  return [threads](const ExpertSet& s, const MoeInput& in, const MoeOutput& out) {
    return CpuMoe(s, in, out, threads);
  };
}

// =================================================================================================
// Against the independent implementation
// =================================================================================================

TEST(Reference, TinyCasesMatchTheIndependentImplementation) {
  uint64_t seed = 100;
  for (int64_t top_k : {1, 2}) {
    for (int64_t t : {1, 2}) {
      const LayerShape shape{/*E=*/2, /*K=*/32, /*I=*/32, top_k};
      const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), ++seed);
      const SyntheticInput input = MakeInput(shape, t, RoutingPattern::kUniform, ++seed);
      const std::vector<float> want = MyMoe(s, input);
      const std::vector<float> got = test::ReferenceF32(s, test::InputOf(input));
      EXPECT_TRUE(test::BitwiseEqual(got, want, {t, 32})) << "k " << top_k << ", T " << t;
      // Not trivially zero: the case exercises the arithmetic.
      size_t nonzero = 0;
      for (float v : want) nonzero += v != 0.0f;
      EXPECT_GT(nonzero, want.size() / 2);
    }
  }
}

TEST(Reference, EveryActivationMatchesTheIndependentImplementation) {
  uint64_t seed = 200;
  for (ActivationType act : {ActivationType::Situ, ActivationType::Swiglu, ActivationType::SwigluBias,
                             ActivationType::Geglu, ActivationType::GegluTanh}) {
    for (int jitter : {1, 4}) {
      const LayerShape shape{/*E=*/4, /*K=*/64, /*I=*/96, /*k=*/2};
      const ExpertSet s = MakeSet(shape, test::Act(act), ++seed, jitter, act == ActivationType::SwigluBias);
      const SyntheticInput input = MakeInput(shape, 5, RoutingPattern::kWithInvalid, ++seed);
      const std::vector<float> want = MyMoe(s, input);
      const MoeInput in = test::InputOf(input);
      EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(s, in), want, {5, 64}))
          << ActivationName(act) << ", jitter " << jitter;
      EXPECT_TRUE(test::BitwiseEqualBf16(test::ReferenceBf16(s, in), ToBf16(want), {5, 64}))
          << ActivationName(act) << ", jitter " << jitter;
    }
  }
}

// Pre-quantized input that no bf16 tensor produces: random E4M3 codes (NaN codes excluded) and
// scales over a wide range.
TEST(Reference, ArbitraryMxfp8InputMatchesTheIndependentImplementation) {
  const LayerShape shape{4, 96, 64, 2};
  const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), 301);
  const SyntheticInput input = MakeInput(shape, 6, RoutingPattern::kUniform, 302);
  TestRng rng(303);
  std::vector<uint8_t> codes(6 * 96), scales(6 * 3);
  for (auto& c : codes) {
    do c = static_cast<uint8_t>(rng.Next()); while ((c & 0x7F) == 0x7F);
  }
  for (auto& b : scales) b = static_cast<uint8_t>(127 - 12 + rng.Below(8));
  std::vector<double> xd(codes.size());
  for (size_t i = 0; i < codes.size(); ++i)
    xd[i] = static_cast<double>(e4m3_to_float(codes[i])) * std::ldexp(1.0, scales[i / 32] - 127);
  MoeInput in;
  in.num_tokens = 6;
  in.x_e4m3 = codes.data();
  in.x_scale = scales.data();
  in.topk_ids = input.topk_ids.data();
  in.topk_weights = input.topk_weights.data();
  const std::vector<float> want = MyMoe(s, xd, input.topk_ids, input.topk_weights, 6);
  EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(s, in), want, {6, 96}));
  EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(2), s, in), want, {6, 96}));
}

// Inputs whose blocks span a wide range of scales (2^-40 .. 2^40 per block, and fp32 subnormal
// bf16 values), so the MX scales of x and of the intermediate move far from 2^0.
TEST(Reference, WideInputScalesMatchTheIndependentImplementation) {
  const LayerShape shape{4, 128, 64, 2};
  for (ActivationType act : {ActivationType::Situ, ActivationType::Swiglu}) {
    const ExpertSet s = MakeSet(shape, test::Act(act), 351, 3);
    SyntheticInput input = MakeInput(shape, 6, RoutingPattern::kUniform, 352);
    TestRng rng(353);
    for (size_t b = 0; b < input.x_bf16.size() / 32; ++b) {
      const int e = static_cast<int>(rng.Below(81)) - 40;
      for (size_t i = b * 32; i < b * 32 + 32; ++i)
        input.x_bf16[i] = float_to_bf16(std::ldexp(bf16_to_float(input.x_bf16[i]), e));
    }
    for (int i = 0; i < 32; ++i) input.x_bf16[5 * 128 + i] = static_cast<uint16_t>(0x0001 + i);  // subnormal
    const MoeInput in = test::InputOf(input);
    const std::vector<float> want = MyMoe(s, input);
    EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(s, in), want, {6, 128})) << ActivationName(act);
    EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(3), s, in), want, {6, 128})) << ActivationName(act);
  }
}

// The same expert twice in one token's slots counts twice.
TEST(Reference, RepeatedExpertInOneTokenCountsTwice) {
  const LayerShape shape{4, 64, 64, 3};
  const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), 361);
  SyntheticInput input = MakeInput(shape, 3, RoutingPattern::kUniform, 362);
  input.topk_ids = {1, 1, 1, /**/ 2, 0, 2, /**/ 3, -1, 3};
  const MoeInput in = test::InputOf(input);
  const std::vector<float> want = MyMoe(s, input);
  EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(s, in), want, {3, 64}));
  for (int threads : {0, 1, 3})
    EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(threads), s, in), want, {3, 64})) << threads;
}

// =================================================================================================
// Invariants
// =================================================================================================

TEST(Reference, ZeroTokensIsOkAndWritesNothing) {
  const LayerShape shape{4, 64, 64, 2};
  const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), 401);
  std::vector<uint8_t> sentinel(256, 0xFF);
  for (OutputDType dt : {OutputDType::kBF16, OutputDType::kF32}) {
    MoeInput in;  // T = 0, every pointer null
    MoeOutput out;
    out.dtype = dt;
    out.data = sentinel.data();
    Status st = ReferenceMoe(s, in, out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    st = CpuMoe(s, in, out, 3);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(test::Untouched(sentinel.data(), sentinel.size()));
    out.data = nullptr;
    EXPECT_TRUE(ReferenceMoe(s, in, out).ok());
    EXPECT_TRUE(CpuMoe(s, in, out, 1).ok());
  }
}

// The rows of `in` listed in `keep`.
SyntheticInput SelectTokens(const SyntheticInput& in, int64_t k_dim, int64_t top_k, const std::vector<int64_t>& keep) {
  SyntheticInput r;
  r.num_tokens = static_cast<int64_t>(keep.size());
  for (int64_t t : keep) {
    r.x_bf16.insert(r.x_bf16.end(), in.x_bf16.begin() + t * k_dim, in.x_bf16.begin() + (t + 1) * k_dim);
    r.topk_ids.insert(r.topk_ids.end(), in.topk_ids.begin() + t * top_k, in.topk_ids.begin() + (t + 1) * top_k);
    r.topk_weights.insert(r.topk_weights.end(), in.topk_weights.begin() + t * top_k,
                          in.topk_weights.begin() + (t + 1) * top_k);
  }
  return r;
}

TEST(Reference, NonFiniteInputPoisonsOnlyItsToken) {
  const int64_t t_count = 5, k_dim = 128;
  const LayerShape shape{4, k_dim, 64, 2};
  uint64_t seed = 500;
  for (ActivationType act : {ActivationType::Situ, ActivationType::SwigluBias}) {
    const ExpertSet s = MakeSet(shape, test::Act(act), ++seed, 1, act == ActivationType::SwigluBias);
    for (uint16_t bad : {uint16_t{0x7FC0}, uint16_t{0x7F80}, uint16_t{0xFF80}, uint16_t{0xFFC1}}) {
      SyntheticInput input = MakeInput(shape, t_count, RoutingPattern::kUniform, ++seed);
      const int64_t bad_t = 2, bad_c = 77;
      input.x_bf16[bad_t * k_dim + bad_c] = bad;
      const SyntheticInput clean = SelectTokens(input, k_dim, 2, {0, 1, 3, 4});
      for (auto run : {std::function<std::vector<float>(const ExpertSet&, const MoeInput&)>(test::ReferenceF32),
                       std::function<std::vector<float>(const ExpertSet&, const MoeInput&)>(
                           [](const ExpertSet& e, const MoeInput& in) { return test::RunF32(CpuMoeWith(3), e, in); })}) {
        const std::vector<float> got = run(s, test::InputOf(input));
        const std::vector<float> want_clean = run(s, test::InputOf(clean));
        for (int64_t n = 0; n < k_dim; ++n)
          ASSERT_TRUE(std::isnan(got[bad_t * k_dim + n])) << "bf16 0x" << std::hex << bad << std::dec << " n " << n;
        std::vector<float> others;
        for (int64_t t : {0, 1, 3, 4}) others.insert(others.end(), got.begin() + t * k_dim, got.begin() + (t + 1) * k_dim);
        EXPECT_TRUE(test::BitwiseEqual(others, want_clean, {4, k_dim})) << ActivationName(act);
      }
    }
  }
}

TEST(Reference, NanScaleInPrequantizedInputPoisonsOnlyItsToken) {
  const LayerShape shape{4, 64, 64, 2};
  const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), 511);
  const SyntheticInput input = MakeInput(shape, 3, RoutingPattern::kUniform, 512);
  std::vector<uint8_t> codes(3 * 64), scales(3 * 2);
  std::vector<float> v(32);
  for (int64_t b = 0; b < 6; ++b) {
    for (int i = 0; i < 32; ++i) v[i] = bf16_to_float(input.x_bf16[b * 32 + i]);
    scales[b] = mxfp8_quantize_block(v.data(), codes.data() + b * 32);
  }
  scales[3] = 0xFF;  // token 1, block 1
  MoeInput in = test::InputOf(input);
  in.x_bf16 = nullptr;
  in.x_e4m3 = codes.data();
  in.x_scale = scales.data();
  const std::vector<float> got = test::ReferenceF32(s, in);
  const std::vector<float> plain = test::ReferenceF32(s, test::InputOf(input));
  for (int64_t n = 0; n < 64; ++n) {
    EXPECT_TRUE(std::isnan(got[64 + n])) << n;
    EXPECT_EQ(float_bits(got[n]), float_bits(plain[n])) << n;
    EXPECT_EQ(float_bits(got[128 + n]), float_bits(plain[128 + n])) << n;
  }
}

TEST(Reference, MinusOneIdsContributeNothing) {
  const LayerShape shape{4, 64, 96, 2};
  const ExpertSet s2 = MakeSet(shape, test::Act(ActivationType::Situ), 601);
  const SyntheticInput base = MakeInput(shape, 4, RoutingPattern::kUniform, 602);
  // Slots with -1 carry a NaN weight: reading it would poison the token.
  SyntheticInput in2 = base;
  in2.topk_ids = {1, -1, /**/ -1, 2, /**/ -1, -1, /**/ 0, 3};
  in2.topk_weights = {0.75f, NAN, /**/ NAN, 0.5f, /**/ NAN, NAN, /**/ 0.25f, 0.75f};
  // The same pairs with top_k = 1 (the all-(-1) token stays all -1).
  ExpertSet s1 = s2;
  s1.shape.top_k = 1;
  SyntheticInput in1 = SelectTokens(base, 64, 2, {0, 1, 2});
  in1.topk_ids = {1, 2, -1};
  in1.topk_weights = {0.75f, 0.5f, 3.0f};
  for (int threads : {0, 1, 3}) {
    const std::vector<float> got = threads == 0 ? test::ReferenceF32(s2, test::InputOf(in2))
                                                : test::RunF32(CpuMoeWith(threads), s2, test::InputOf(in2));
    const std::vector<float> one = threads == 0 ? test::ReferenceF32(s1, test::InputOf(in1))
                                                : test::RunF32(CpuMoeWith(threads), s1, test::InputOf(in1));
    const std::vector<float> first3(got.begin(), got.begin() + 3 * 64);
    EXPECT_TRUE(test::BitwiseEqual(first3, one, {3, 64})) << "threads " << threads;
    for (int64_t n = 0; n < 64; ++n) EXPECT_EQ(float_bits(got[2 * 64 + n]), 0u) << "all -1 token is +0";
    EXPECT_TRUE(test::BitwiseEqual(got, MyMoe(s2, in2), {4, 64})) << "threads " << threads;
  }
}

TEST(Reference, Bf16OutputIsRneOfF32Output) {
  const LayerShape shape{8, 128, 64, 3};
  uint64_t seed = 700;
  for (RoutingPattern p : {RoutingPattern::kUniform, RoutingPattern::kWithInvalid, RoutingPattern::kHeavyHitters}) {
    const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), ++seed);
    const SyntheticInput input = MakeInput(shape, 9, p, ++seed);
    const MoeInput in = test::InputOf(input);
    const std::vector<float> f32 = test::ReferenceF32(s, in);
    EXPECT_TRUE(test::BitwiseEqualBf16(test::ReferenceBf16(s, in), ToBf16(f32), {9, 128})) << RoutingPatternName(p);
    EXPECT_TRUE(test::BitwiseEqualBf16(test::RunBf16(CpuMoeWith(3), s, in), ToBf16(f32), {9, 128}))
        << RoutingPatternName(p);
  }
}

TEST(Reference, PrequantizedInputEqualsBf16Input) {
  const LayerShape shape{4, 96, 64, 2};
  const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), 801);
  const SyntheticInput input = MakeInput(shape, 7, RoutingPattern::kUniform, 802);
  std::vector<uint8_t> codes(7 * 96), scales(7 * 3);
  std::vector<float> v(32);
  for (size_t b = 0; b < scales.size(); ++b) {
    for (int i = 0; i < 32; ++i) v[i] = bf16_to_float(input.x_bf16[b * 32 + i]);
    scales[b] = mxfp8_quantize_block(v.data(), codes.data() + b * 32);
  }
  MoeInput q = test::InputOf(input);
  q.x_bf16 = nullptr;
  q.x_e4m3 = codes.data();
  q.x_scale = scales.data();
  const std::vector<float> want = test::ReferenceF32(s, test::InputOf(input));
  EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(s, q), want, {7, 96}));
  EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(3), s, q), want, {7, 96}));
}

std::vector<ActParams> VariedSituParams(int64_t n) {
  std::vector<ActParams> p(static_cast<size_t>(n));
  const float betas[][2] = {{4, 25}, {2, 10}, {8, 50}, {1, 3}, {0.5f, 1}, {6, 12}, {3, 30}, {1.5f, 7}};
  for (int64_t e = 0; e < n; ++e) {
    p[e].beta = betas[e % 8][0];
    p[e].linear_beta = betas[e % 8][1];
  }
  return p;
}

TEST(Reference, PerExpertSituParameters) {
  const LayerShape shape{4, 64, 64, 2};
  ActivationSpec act = test::Act(ActivationType::Situ);
  act.per_expert = VariedSituParams(4);
  const ExpertSet s = MakeSet(shape, act, 901);
  ASSERT_EQ(s.activation.per_expert.size(), 4u);
  const SyntheticInput input = MakeInput(shape, 8, RoutingPattern::kUniform, 902);
  const MoeInput in = test::InputOf(input);
  const std::vector<float> got = test::ReferenceF32(s, in);
  EXPECT_TRUE(test::BitwiseEqual(got, MyMoe(s, input), {8, 64}));
  EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(3), s, in), got, {8, 64}));
  // Changing expert 2's beta changes exactly the tokens routed to expert 2.
  ExpertSet s2 = s;
  s2.activation.per_expert[2].beta = 3.0f;
  const std::vector<float> got2 = test::ReferenceF32(s2, in);
  for (int64_t t = 0; t < 8; ++t) {
    const bool routed = input.topk_ids[t * 2] == 2 || input.topk_ids[t * 2 + 1] == 2;
    const std::vector<float> a(got.begin() + t * 64, got.begin() + (t + 1) * 64);
    const std::vector<float> b(got2.begin() + t * 64, got2.begin() + (t + 1) * 64);
    if (routed) {
      EXPECT_FALSE(test::BitwiseEqual(a, b)) << "token " << t << " uses expert 2";
    } else {
      EXPECT_TRUE(test::BitwiseEqual(a, b)) << "token " << t;
    }
  }
  // The same parameters for every expert through per_expert or params give the same result.
  ActivationSpec uniform = test::Act(ActivationType::Situ);
  uniform.params.beta = 2.0f;
  uniform.params.linear_beta = 10.0f;
  ExpertSet su = s;
  su.activation = uniform;
  ExpertSet sp = s;
  sp.activation.per_expert.assign(4, uniform.params);
  EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(su, in), test::ReferenceF32(sp, in)));
  EXPECT_FALSE(test::BitwiseEqual(test::ReferenceF32(su, in), got));
}

TEST(Reference, SwigluBiasWithBiases) {
  const LayerShape shape{4, 64, 96, 2};
  ActivationSpec act = test::Act(ActivationType::SwigluBias);
  const ExpertSet s = MakeSet(shape, act, 1001, 1, /*with_bias=*/true);
  ASSERT_EQ(s.experts[0].gate_bias.size(), 96u);
  ASSERT_EQ(s.experts[0].up_bias.size(), 96u);
  const SyntheticInput input = MakeInput(shape, 6, RoutingPattern::kUniform, 1002);
  const MoeInput in = test::InputOf(input);
  const std::vector<float> got = test::ReferenceF32(s, in);
  EXPECT_TRUE(test::BitwiseEqual(got, MyMoe(s, input), {6, 64}));
  EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(3), s, in), got, {6, 64}));
  // The biases matter, each on its own, and alpha / limit per expert too.
  ExpertSet no_gate = s, no_up = s;
  for (auto& w : no_gate.experts) w.gate_bias.clear();
  for (auto& w : no_up.experts) w.up_bias.clear();
  EXPECT_FALSE(test::BitwiseEqual(test::ReferenceF32(no_gate, in), got));
  EXPECT_FALSE(test::BitwiseEqual(test::ReferenceF32(no_up, in), got));
  EXPECT_TRUE(test::BitwiseEqual(test::ReferenceF32(no_gate, in), MyMoe(no_gate, input)));
  ExpertSet limited = s;
  limited.activation.per_expert.assign(4, ActParams{});
  limited.activation.per_expert[1].limit = 0.5f;
  limited.activation.per_expert[3].alpha = 1.0f;
  const std::vector<float> lim = test::ReferenceF32(limited, in);
  EXPECT_TRUE(test::BitwiseEqual(lim, MyMoe(limited, input)));
  EXPECT_FALSE(test::BitwiseEqual(lim, got));
}

// =================================================================================================
// Parallel slices
// =================================================================================================

// The full set with W2 columns outside [col0, col0 + n) set to the code 0: the unsplit pipeline
// then computes exactly one TP rank's terms (its MX blocks of the intermediate are the rank's).
ExpertSet MaskW2Columns(const ExpertSet& full, int64_t col0, int64_t n) {
  ExpertSet r = full;
  for (ExpertWeights& w : r.experts)
    for (int64_t row = 0; row < w.w2.rows; ++row)
      for (int64_t c = 0; c < w.w2.cols; ++c) {
        if (c >= col0 && c < col0 + n) continue;
        uint8_t& b = w.w2.packed[row * (w.w2.cols / 2) + c / 2];
        b = static_cast<uint8_t>((c % 2 == 0) ? (b & 0xF0) : (b & 0x0F));
      }
  return r;
}

// The input with every id outside [e0, e0 + n) replaced by -1.
SyntheticInput MaskIds(const SyntheticInput& in, int64_t e0, int64_t n) {
  SyntheticInput r = in;
  for (int32_t& id : r.topk_ids)
    if (id < e0 || id >= e0 + n) id = -1;
  return r;
}

std::vector<float> SumRanks(const std::vector<std::vector<float>>& parts) {
  std::vector<double> acc(parts[0].size(), 0.0);
  for (const auto& p : parts)
    for (size_t i = 0; i < p.size(); ++i) acc[i] += p[i];
  return std::vector<float>(acc.begin(), acc.end());
}

// Summing the ranks' fp32 partial outputs reproduces the unsplit output only up to fp32 rounding:
// each rank rounds its own y = aq . W2^T and its weighted slot sum to fp32, where the unsplit
// call rounds the whole sum once, so each element differs by a few 2^-24 of the sum of the
// partials' magnitudes, which cancellation can make large relative to that element; the normwise
// relative error stays a small multiple of 2^-24 (~6e-8). 1e-5 leaves a wide margin while still
// catching any real error (a lost block or rank is >= 1e-2).
constexpr double kRankSumTolerance = 1e-5;

TEST(ReferenceParallel, TensorParallelSlices) {
  const LayerShape shape{4, 64, 128, 2};
  const ExpertSet full = MakeSet(shape, test::Act(ActivationType::Situ), 1101);
  const SyntheticInput input = MakeInput(shape, 6, RoutingPattern::kWithInvalid, 1102);
  const MoeInput in = test::InputOf(input);
  const std::vector<float> want = test::ReferenceF32(full, in);
  for (int tp : {2, 4}) {
    std::vector<std::vector<float>> parts;
    for (int r = 0; r < tp; ++r) {
      ParallelSlice slice;
      slice.tp_size = tp;
      slice.tp_rank = r;
      ExpertSet rank;
      const Status st = SliceExperts(full, slice, &rank);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_EQ(rank.LocalIntermediate(), 128 / tp);
      ASSERT_TRUE(rank.Validate().ok());
      parts.push_back(test::ReferenceF32(rank, in));
      const int64_t il = 128 / tp;
      EXPECT_TRUE(test::BitwiseEqual(parts.back(), test::ReferenceF32(MaskW2Columns(full, r * il, il), in), {6, 64}))
          << "tp " << tp << " rank " << r << " vs the unsplit pipeline with the other W2 columns zeroed";
      EXPECT_TRUE(test::BitwiseEqual(parts.back(), MyMoe(rank, input), {6, 64})) << "tp " << tp << " rank " << r;
      EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(3), rank, in), parts.back(), {6, 64}));
      // A synthetic layer made directly for the slice is the slice of the synthetic layer.
      const ExpertSet direct = MakeSet(shape, test::Act(ActivationType::Situ), 1101, 1, false, slice);
      for (int64_t e = 0; e < 4; ++e) {
        EXPECT_TRUE(test::BytesEqual(direct.experts[e].w1.packed, rank.experts[e].w1.packed));
        EXPECT_TRUE(test::BytesEqual(direct.experts[e].w3.scales, rank.experts[e].w3.scales));
        EXPECT_TRUE(test::BytesEqual(direct.experts[e].w2.packed, rank.experts[e].w2.packed));
        EXPECT_TRUE(test::BytesEqual(direct.experts[e].w2.scales, rank.experts[e].w2.scales));
      }
    }
    const std::vector<float> sum = SumRanks(parts);
    EXPECT_TRUE(test::NormwiseClose(sum, want, kRankSumTolerance, {6, 64})) << "tp " << tp;
    EXPECT_TRUE(test::AllClose(sum, want, test::kTolF32, {6, 64})) << "tp " << tp;
  }
}

TEST(ReferenceParallel, ExpertParallelSlicesPartitionTheOutput) {
  const LayerShape shape{8, 64, 64, 3};
  ActivationSpec act = test::Act(ActivationType::Situ);
  act.per_expert = VariedSituParams(8);  // the per-expert parameters follow the experts
  const ExpertSet full = MakeSet(shape, act, 1201);
  for (RoutingPattern p : {RoutingPattern::kUniform, RoutingPattern::kFewExperts, RoutingPattern::kWithInvalid}) {
    const SyntheticInput input = MakeInput(shape, 9, p, 1202);
    const MoeInput in = test::InputOf(input);
    const std::vector<float> want = test::ReferenceF32(full, in);
    for (int ep : {2, 4}) {
      std::vector<std::vector<float>> parts;
      for (int r = 0; r < ep; ++r) {
        ParallelSlice slice;
        slice.ep_size = ep;
        slice.ep_rank = r;
        ExpertSet rank;
        const Status st = SliceExperts(full, slice, &rank);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(rank.NumLocalExperts(), 8 / ep);
        ASSERT_EQ(rank.activation.per_expert.size(), static_cast<size_t>(8 / ep));
        parts.push_back(test::ReferenceF32(rank, in));
        const int64_t n = 8 / ep;
        // Exactly the contributions of the rank's experts (ids are global).
        const SyntheticInput masked = MaskIds(input, r * n, n);
        EXPECT_TRUE(test::BitwiseEqual(parts.back(), test::ReferenceF32(full, test::InputOf(masked)), {9, 64}))
            << RoutingPatternName(p) << " ep " << ep << " rank " << r;
        EXPECT_TRUE(test::BitwiseEqual(parts.back(), MyMoe(rank, input), {9, 64}));
        EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(3), rank, in), parts.back(), {9, 64}));
      }
      EXPECT_TRUE(test::NormwiseClose(SumRanks(parts), want, kRankSumTolerance, {9, 64}))
          << RoutingPatternName(p) << " ep " << ep;
    }
  }
}

TEST(ReferenceParallel, TensorTimesExpertParallel) {
  const LayerShape shape{4, 64, 64, 2};
  const ExpertSet full = MakeSet(shape, test::Act(ActivationType::SwigluBias), 1301, 1, true);
  const SyntheticInput input = MakeInput(shape, 5, RoutingPattern::kUniform, 1302);
  const MoeInput in = test::InputOf(input);
  std::vector<std::vector<float>> parts;
  for (int tr = 0; tr < 2; ++tr)
    for (int er = 0; er < 2; ++er) {
      ParallelSlice slice{/*tp_size=*/2, tr, /*ep_size=*/2, er};
      ExpertSet rank;
      ASSERT_TRUE(SliceExperts(full, slice, &rank).ok());
      parts.push_back(test::ReferenceF32(rank, in));
      const std::vector<float> want =
          test::ReferenceF32(MaskW2Columns(full, tr * 32, 32), test::InputOf(MaskIds(input, er * 2, 2)));
      EXPECT_TRUE(test::BitwiseEqual(parts.back(), want, {5, 64})) << "tp rank " << tr << ", ep rank " << er;
      EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(2), rank, in), parts.back(), {5, 64}));
    }
  EXPECT_TRUE(test::NormwiseClose(SumRanks(parts), test::ReferenceF32(full, in), kRankSumTolerance));
}

// =================================================================================================
// The CPU backend: bitwise the reference
// =================================================================================================

TEST(ReferenceCpuMoe, BitwiseEqualAcrossShapesPatternsAndThreads) {
  const LayerShape shapes[] = {
      {2, 32, 32, 1}, {4, 64, 96, 2}, {3, 96, 64, 3}, {8, 128, 256, 3}, {16, 256, 160, 4},
  };
  const int64_t tokens[] = {1, 7, 5, 13, 33};
  const RoutingPattern patterns[] = {RoutingPattern::kUniform, RoutingPattern::kOneExpert,
                                     RoutingPattern::kFewExperts, RoutingPattern::kWithInvalid,
                                     RoutingPattern::kHeavyHitters};
  uint64_t seed = 1400;
  for (size_t si = 0; si < std::size(shapes); ++si) {
    const LayerShape& shape = shapes[si];
    const ExpertSet s = MakeSet(shape, test::Act(ActivationType::Situ), ++seed);
    for (RoutingPattern p : patterns) {
      const SyntheticInput input = MakeInput(shape, tokens[si], p, ++seed);
      const MoeInput in = test::InputOf(input);
      const std::vector<float> want = test::ReferenceF32(s, in);
      const std::vector<uint16_t> want_bf16 = test::ReferenceBf16(s, in);
      for (int threads : {1, 3}) {
        EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(threads), s, in), want, {tokens[si], shape.hidden}))
            << "E " << shape.num_experts << " K " << shape.hidden << " I " << shape.intermediate << " k "
            << shape.top_k << " T " << tokens[si] << " " << RoutingPatternName(p) << " threads " << threads;
        EXPECT_TRUE(test::BitwiseEqualBf16(test::RunBf16(CpuMoeWith(threads), s, in), want_bf16))
            << "shape " << si << " " << RoutingPatternName(p) << " threads " << threads;
      }
    }
  }
}

TEST(ReferenceCpuMoe, BitwiseEqualForEveryActivation) {
  const LayerShape shape{6, 96, 192, 2};
  uint64_t seed = 1500;
  for (ActivationType act : {ActivationType::Swiglu, ActivationType::SwigluBias, ActivationType::Geglu,
                             ActivationType::GegluTanh}) {
    const ExpertSet s = MakeSet(shape, test::Act(act), ++seed, 2, act == ActivationType::SwigluBias);
    const SyntheticInput input = MakeInput(shape, 11, RoutingPattern::kHeavyHitters, ++seed);
    const MoeInput in = test::InputOf(input);
    const std::vector<float> want = test::ReferenceF32(s, in);
    for (int threads : {1, 3})
      EXPECT_TRUE(test::BitwiseEqual(test::RunF32(CpuMoeWith(threads), s, in), want, {11, 96}))
          << ActivationName(act) << " threads " << threads;
  }
}

// =================================================================================================
// Refusals: each names the field, before any work (the output stays untouched)
// =================================================================================================

struct Call {
  ExpertSet experts;
  SyntheticInput input;
  std::vector<float> out;
  MoeInput in;
  MoeOutput mo;
  explicit Call(const LayerShape& shape, ActivationType act = ActivationType::Situ, uint64_t seed = 1601) {
    experts = MakeSet(shape, test::Act(act), seed);
    input = MakeInput(shape, 3, RoutingPattern::kUniform, seed + 1);
    Rebind();
  }
  void Rebind() {
    in = test::InputOf(input);
    out.assign(static_cast<size_t>(input.num_tokens * experts.shape.hidden), 0.0f);
    test::Poison(&out);
    mo.dtype = OutputDType::kF32;
    mo.data = out.data();
  }
};

// Both backends refuse with a message containing every one of `needles`, writing nothing.
void ExpectRefused(Call& c, std::vector<std::string> needles, const std::string& what) {
  for (int backend = 0; backend < 2; ++backend) {
    c.Rebind();
    const Status st = backend == 0 ? ReferenceMoe(c.experts, c.in, c.mo) : CpuMoe(c.experts, c.in, c.mo, 2);
    const char* name = backend == 0 ? "ReferenceMoe" : "CpuMoe";
    ASSERT_FALSE(st.ok()) << name << " accepted " << what;
    for (const std::string& n : needles)
      EXPECT_NE(st.message().find(n), std::string::npos) << name << ", " << what << ": '" << st.message()
                                                         << "' does not mention '" << n << "'";
    EXPECT_TRUE(test::Untouched(c.out.data(), c.out.size() * sizeof(float))) << name << ", " << what;
  }
}

TEST(ReferenceValidation, ExpertIdsOutsideTheRange) {
  const LayerShape shape{4, 64, 64, 2};
  for (int32_t bad : {4, 5, 1000, -2, -100}) {
    Call c(shape);
    c.input.topk_ids[1 * 2 + 1] = bad;
    ExpectRefused(c, {"topk_ids", "[1, 1]", std::to_string(bad)}, "id " + std::to_string(bad));
    EXPECT_EQ(ValidateMoeCall(c.experts, c.in, c.mo, true).code(), StatusCode::kInvalidArgument);
  }
  // Out-of-rank but valid ids are fine on an EP rank.
  Call c(shape);
  ParallelSlice slice;
  slice.ep_size = 2;
  slice.ep_rank = 1;
  ExpertSet rank;
  ASSERT_TRUE(SliceExperts(c.experts, slice, &rank).ok());
  c.experts = rank;
  c.input.topk_ids = {0, 1, 2, 3, 1, -1};
  c.Rebind();
  EXPECT_TRUE(ReferenceMoe(c.experts, c.in, c.mo).ok());
}

TEST(ReferenceValidation, Shapes) {
  const LayerShape good{4, 64, 64, 2};
  {
    Call c(good);
    c.experts.shape.hidden = 48;
    ExpectRefused(c, {"K", "48"}, "K = 48");
  }
  {
    Call c(good);
    c.experts.shape.hidden = 0;
    ExpectRefused(c, {"K"}, "K = 0");
  }
  {
    Call c(good);
    c.experts.shape.intermediate = 40;
    ExpectRefused(c, {"I", "40"}, "I = 40");
  }
  {
    Call c(good);
    c.experts.shape.top_k = 5;
    ExpectRefused(c, {"top_k", "5"}, "top_k > E");
  }
  {
    Call c(good);
    c.experts.shape.top_k = 0;
    ExpectRefused(c, {"top_k"}, "top_k = 0");
  }
  {
    Call c(good);
    c.experts.shape.num_experts = 0;
    ExpectRefused(c, {"num_experts"}, "E = 0");
  }
  {
    Call c(good);
    c.experts.slice.tp_size = 4;  // I / tp = 16
    ExpectRefused(c, {"tp_size"}, "I / tp = 16");
  }
  {
    Call c(LayerShape{6, 64, 64, 2});
    c.experts.slice.ep_size = 4;  // 6 % 4 != 0
    ExpectRefused(c, {"ep_size"}, "E % ep != 0");
  }
  {
    Call c(good);
    c.experts.slice.tp_size = 2;
    c.experts.slice.tp_rank = 2;
    ExpectRefused(c, {"tp_rank"}, "tp_rank out of range");
  }
  {
    Call c(good);
    c.experts.slice.ep_size = 2;
    c.experts.slice.ep_rank = -1;
    ExpectRefused(c, {"ep_rank"}, "ep_rank out of range");
  }
  // The same through the shape's and slice's own checks and the synthetic layer maker.
  EXPECT_NE((LayerShape{4, 96 + 16, 64, 2}).Validate().message().find("K"), std::string::npos);
  EXPECT_NE((LayerShape{4, 64, 64 + 8, 2}).Validate().message().find("I"), std::string::npos);
  EXPECT_TRUE((LayerShape{1, 32, 32, 1}).Validate().ok());
  ParallelSlice tp3;
  tp3.tp_size = 3;
  EXPECT_NE(tp3.Validate(LayerShape{4, 64, 64, 2}).message().find("tp_size"), std::string::npos);  // 64 % 3
  EXPECT_TRUE(tp3.Validate(LayerShape{4, 64, 96 * 2, 2}).ok());  // 192 / 3 = 64
  ExpertSet out;
  EXPECT_FALSE(MakeSyntheticExperts(LayerShape{4, 50, 64, 2}, test::Act(ActivationType::Situ), {}, {}, &out).ok());
}

TEST(ReferenceValidation, UnsupportedActivations) {
  const LayerShape shape{4, 64, 64, 2};
  for (auto [type, name] : std::vector<std::pair<int, std::string>>{
           {7, "SwigluStep"}, {0, "Gelu"}, {2, "Silu"}, {9, "Identity"}, {11, "InvalidType"}, {42, "42"}}) {
    Call c(shape);
    c.experts.activation.type = static_cast<ActivationType>(type);
    ExpectRefused(c, {name}, "activation " + name);
  }
}

TEST(ReferenceValidation, ActivationParameters) {
  const LayerShape shape{4, 64, 64, 2};
  {
    Call c(shape);
    c.experts.activation.params.beta = 0.0f;
    ExpectRefused(c, {"beta"}, "beta = 0");
  }
  {
    Call c(shape);
    c.experts.activation.params.linear_beta = NAN;
    ExpectRefused(c, {"beta"}, "linear_beta NaN");
  }
  {
    // Above 2^126 the device's approximate division gives 0 (activation_math.h, act_div).
    Call c(shape);
    c.experts.activation.params.beta = 0x1p127f;
    ExpectRefused(c, {"beta", "2^126"}, "beta = 2^127");
  }
  {
    // Subnormal divisors are flushed by the device's reciprocal (activation_math.h, act_div).
    Call c(shape);
    c.experts.activation.params.linear_beta = 0x1p-127f;
    ExpectRefused(c, {"beta", "2^-126"}, "linear_beta = 2^-127");
  }
  {
    Call c(shape);
    c.experts.activation.per_expert.assign(3, ActParams{});
    ExpectRefused(c, {"per-expert", "3"}, "3 per-expert entries for 4 experts");
  }
  {
    Call c(shape);
    c.experts.activation.per_expert.assign(4, ActParams{});
    c.experts.activation.per_expert[2].beta = -1.0f;
    ExpectRefused(c, {"expert 2", "beta"}, "expert 2 beta < 0");
  }
  {
    Call c(shape, ActivationType::SwigluBias);
    c.experts.activation.params.limit = 0.0f;
    ExpectRefused(c, {"limit"}, "swiglu limit 0");
  }
  {
    // Biases only exist for SwigluBias.
    Call c(shape);
    c.experts.experts[1].gate_bias.assign(64, 0.5f);
    ExpectRefused(c, {"expert 1", "bias"}, "bias with Situ");
  }
  {
    Call c(shape, ActivationType::SwigluBias);
    c.experts.experts[3].up_bias.assign(63, 0.5f);
    ExpectRefused(c, {"expert 3", "bias", "63"}, "bias of 63 entries");
  }
}

TEST(ReferenceValidation, Tensors) {
  const LayerShape shape{4, 64, 64, 2};
  {
    Call c(shape);
    c.experts.experts.pop_back();
    ExpectRefused(c, {"3", "experts"}, "3 experts of 4");
  }
  {
    Call c(shape);
    c.experts.experts[1].w2 = SliceCols(c.experts.experts[1].w2, 0, 32);
    ExpectRefused(c, {"expert 1 w2"}, "w2 of the wrong shape");
  }
  {
    Call c(shape);
    c.experts.experts[2].w1.scales.pop_back();
    ExpectRefused(c, {"expert 2 w1", "scales"}, "w1 scales truncated");
  }
  {
    Call c(shape);
    c.experts.experts[0].w3.packed.push_back(0);
    ExpectRefused(c, {"expert 0 w3", "packed"}, "w3 packed too long");
  }
}

TEST(ReferenceValidation, CallArguments) {
  const LayerShape shape{4, 64, 64, 2};
  Call c(shape);
  std::vector<uint8_t> codes(3 * 64, 0x38), scales(3 * 2, 127);
  auto refuse = [&](auto mutate, std::vector<std::string> needles, const std::string& what) {
    for (int backend = 0; backend < 2; ++backend) {
      c.Rebind();
      mutate();
      const Status st = backend == 0 ? ReferenceMoe(c.experts, c.in, c.mo) : CpuMoe(c.experts, c.in, c.mo, 1);
      ASSERT_FALSE(st.ok()) << what;
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what;
      for (const auto& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << what << ": " << st.message();
      EXPECT_TRUE(test::Untouched(c.out.data(), c.out.size() * sizeof(float))) << what;
    }
  };
  refuse([&] { c.in.x_bf16 = nullptr; }, {"x"}, "no x");
  refuse([&] { c.in.x_e4m3 = codes.data(), c.in.x_scale = scales.data(); }, {"x_bf16", "x_e4m3"}, "both x forms");
  refuse([&] { c.in.x_bf16 = nullptr, c.in.x_e4m3 = codes.data(); }, {"x_scale"}, "x_e4m3 without x_scale");
  refuse([&] { c.in.x_bf16 = nullptr, c.in.x_scale = scales.data(); }, {"x_e4m3"}, "x_scale without x_e4m3");
  refuse([&] { c.in.topk_ids = nullptr; }, {"topk_ids"}, "no ids");
  refuse([&] { c.in.topk_weights = nullptr; }, {"topk_weights"}, "no weights");
  refuse([&] { c.in.num_tokens = -1; }, {"num_tokens"}, "T < 0");
  refuse([&] { c.mo.dtype = static_cast<OutputDType>(7); }, {"dtype"}, "bad dtype");
  c.Rebind();
  c.mo.data = nullptr;
  EXPECT_FALSE(ReferenceMoe(c.experts, c.in, c.mo).ok());
  EXPECT_FALSE(CpuMoe(c.experts, c.in, c.mo, 1).ok());
}

TEST(ReferenceValidation, SliceExpertsRefusals) {
  const LayerShape shape{4, 64, 64, 2};
  const ExpertSet full = MakeSet(shape, test::Act(ActivationType::Situ), 1701);
  ExpertSet out;
  ParallelSlice bad;
  bad.tp_size = 4;  // 64 / 4 = 16
  Status st = SliceExperts(full, bad, &out);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tp_size"), std::string::npos) << st.message();
  bad = {};
  bad.ep_size = 3;
  st = SliceExperts(full, bad, &out);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ep_size"), std::string::npos) << st.message();
  ParallelSlice half;
  half.ep_size = 2;
  ASSERT_TRUE(SliceExperts(full, half, &out).ok());
  ExpertSet twice;
  EXPECT_FALSE(SliceExperts(out, half, &twice).ok()) << "a slice of a slice";
}

}  // namespace
}  // namespace mxmoe
