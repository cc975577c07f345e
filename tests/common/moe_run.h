// Running a MoE backend into poisoned outputs (STYLE habit 8): every helper fills the output with
// 0xFF first, runs, and adds a failure if the call fails or leaves an element unwritten.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/compare.h"
#include "mxmoe/formats.h"
#include "mxmoe/moe.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {

inline MoeInput InputOf(const SyntheticInput& s) {
  MoeInput in;
  in.num_tokens = s.num_tokens;
  in.x_bf16 = s.x_bf16.data();
  in.topk_ids = s.topk_ids.data();
  in.topk_weights = s.topk_weights.data();
  return in;
}

// fn(experts, in, out) -> Status, e.g. ReferenceMoe or a lambda around CpuMoe.
template <class Fn>
std::vector<float> RunF32(Fn&& fn, const ExpertSet& experts, const MoeInput& in) {
  std::vector<float> y(static_cast<size_t>(in.num_tokens * experts.shape.hidden));
  Poison(&y);
  MoeOutput out;
  out.dtype = OutputDType::kF32;
  out.data = y.data();
  const Status st = fn(experts, in, out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(AllWritten(y, {in.num_tokens, experts.shape.hidden}));
  return y;
}

template <class Fn>
std::vector<uint16_t> RunBf16(Fn&& fn, const ExpertSet& experts, const MoeInput& in) {
  std::vector<uint16_t> y(static_cast<size_t>(in.num_tokens * experts.shape.hidden));
  Poison(&y);
  MoeOutput out;
  out.dtype = OutputDType::kBF16;
  out.data = y.data();
  const Status st = fn(experts, in, out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(AllWritten(y, {in.num_tokens, experts.shape.hidden}));
  return y;
}

inline std::vector<float> ReferenceF32(const ExpertSet& experts, const MoeInput& in) {
  return RunF32(ReferenceMoe, experts, in);
}
inline std::vector<uint16_t> ReferenceBf16(const ExpertSet& experts, const MoeInput& in) {
  return RunBf16(ReferenceMoe, experts, in);
}

// ReferenceMoe's output from the CPU backend on every core: the same bits (CpuMoe's contract, held
// to ReferenceMoe and an independent implementation by tests/cpu/test_reference.cpp) in a fraction
// of the time, for the GPU tests' larger references. The CPU tests keep ReferenceF32.
inline Status CpuBackendAllCores(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out) {
  return CpuMoe(experts, in, out);
}
inline std::vector<float> CpuBackendF32(const ExpertSet& experts, const MoeInput& in) {
  return RunF32(CpuBackendAllCores, experts, in);
}
inline std::vector<uint16_t> CpuBackendBf16(const ExpertSet& experts, const MoeInput& in) {
  return RunBf16(CpuBackendAllCores, experts, in);
}

// A synthetic expert set; adds a failure if it cannot be made.
inline ExpertSet SyntheticSet(const LayerShape& shape, const ActivationSpec& act, uint64_t seed,
                              const ParallelSlice& slice = {}, bool with_bias = false) {
  SyntheticOptions opt;
  opt.seed = seed;
  opt.with_bias = with_bias;
  opt.num_threads = 1;
  ExpertSet set;
  const Status st = MakeSyntheticExperts(shape, act, slice, opt, &set);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return set;
}

inline ActivationSpec Act(ActivationType t) {
  ActivationSpec a;
  a.type = t;
  return a;
}

// Situ with per-expert beta / beta_lin around Kimi-K3's, or the kind's defaults.
inline ActivationSpec SpecFor(ActivationType t, int64_t num_experts) {
  ActivationSpec a = Act(t);
  if (t == ActivationType::Situ) {
    for (int64_t e = 0; e < num_experts; ++e) {
      ActParams p;
      p.beta = 2.0f + 0.5f * static_cast<float>(e % 5);
      p.linear_beta = 10.0f + 3.0f * static_cast<float>(e % 7);
      a.per_expert.push_back(p);
    }
  }
  return a;
}

// bf16 rows quantized on the host with the formats' own MXFP8 rule: E4M3 codes and UE8M0 scales.
inline void QuantizeMxfp8(const std::vector<uint16_t>& x_bf16, std::vector<uint8_t>* codes,
                          std::vector<uint8_t>* scales) {
  codes->resize(x_bf16.size());
  scales->resize(x_bf16.size() / kMxBlock);
  for (size_t b = 0; b < scales->size(); ++b) {
    float v[kMxBlock];
    for (int i = 0; i < kMxBlock; ++i) v[i] = bf16_to_float(x_bf16[b * kMxBlock + i]);
    (*scales)[b] = mxfp8_quantize_block(v, codes->data() + b * kMxBlock);
  }
}

}  // namespace mxmoe::test
