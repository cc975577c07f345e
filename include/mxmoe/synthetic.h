// Synthetic layers and inputs from a fixed seed: the embedded default of `mxmoe run` and the data
// of the tests and benchmarks. Expert e's weights depend only on (seed, e), so any TP or EP slice
// of a synthetic layer is the slice of the same unsplit layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe {

// The Kimi-K3 routed-expert shape of SPEC section 5.
inline constexpr LayerShape kKimiK3Shape{/*num_experts=*/896, /*hidden=*/3584,
                                         /*intermediate=*/3072, /*top_k=*/16};

struct SyntheticOptions {
  uint64_t seed = 1;
  // Codes are uniform over the 16 E2M1 values; each block's scale exponent is drawn uniformly from
  // center +- scale_exp_jitter, with the center chosen from the reduction length so that a matrix
  // times a unit-variance vector has about unit variance (g and u land in the activations'
  // interesting range; for Kimi-K3's K = 3584 the center is 2^-7).
  int scale_exp_jitter = 1;
  bool with_bias = false;  // SwigluBias gate/up biases
  int num_threads = 0;     // 0 = hardware concurrency
};

// The rank's slice of a synthetic layer.
Status MakeSyntheticExperts(const LayerShape& shape, const ActivationSpec& activation,
                            const ParallelSlice& slice, const SyntheticOptions& options,
                            ExpertSet* out);

enum class RoutingPattern : int32_t {
  kUniform = 0,       // k distinct experts uniformly at random per token
  kOneExpert = 1,     // every token's first choice is one expert; the rest -1
  kFewExperts = 2,    // all picks from a handful of experts (most experts empty)
  kWithInvalid = 3,   // uniform, about a quarter of the slots -1
  kHeavyHitters = 4,  // half of the picks go to a few experts
};
const char* RoutingPatternName(RoutingPattern p);
// From the name RoutingPatternName gives; an error listing the names otherwise.
Status RoutingPatternFromName(const std::string& name, RoutingPattern* out);

struct SyntheticInput {
  int64_t num_tokens = 0;
  std::vector<uint16_t> x_bf16;       // [T, K], N(0, 1) rounded to bf16
  std::vector<int32_t> topk_ids;      // [T, k]
  std::vector<float> topk_weights;    // [T, k], positive, summing to 1 per token
};

void MakeSyntheticInput(const LayerShape& shape, int64_t num_tokens, RoutingPattern pattern,
                        uint64_t seed, SyntheticInput* out);

}  // namespace mxmoe
