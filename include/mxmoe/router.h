// Kimi-K3's router (SPEC section 5) on the CPU: which k experts each token goes to, and with which
// weights. The operator itself takes topk_ids / topk_weights from any router; this one is here so
// that engines and tests can produce exactly Kimi-K3's routing next to the operator.
#pragma once

#include <cstdint>

#include "mxmoe/status.h"

namespace mxmoe {

struct RouterOptions {
  int64_t top_k = 16;                  // Kimi-K3: 16 of 896
  float routed_scaling_factor = 1.0f;  // Kimi-K3: 1.0
};

// For each token t, with s[e] = sigmoid(logits[t, e]) in fp32:
//   1. selection score b[e] = s[e] + correction_bias[e] (the bias steers selection only);
//   2. the top_k experts by b, in descending order of b; equal b: the lower expert id first
//      (deterministic, so every rank and every run routes alike); NaN ranks below every number;
//   3. topk_weights[t, j] = s[id_j] / (sum_j s[id_j] + 1e-20) * routed_scaling_factor, the unbiased
//      scores renormalized to sum 1 (the 1e-20 guards a sum that underflowed to 0, as in the
//      DeepSeek-V3-style reference implementations Kimi's router follows).
// logits [T, E] f32, correction_bias [E] f32, topk_ids [T, top_k] int32, topk_weights [T, top_k]
// f32, all row-major host memory. Refuses T < 0, E < 1, top_k outside [1, E] and a non-finite
// routed_scaling_factor before writing anything.
Status KimiK3Route(const float* logits, const float* correction_bias, int64_t num_tokens,
                   int64_t num_experts, const RouterOptions& options, int32_t* topk_ids,
                   float* topk_weights);

}  // namespace mxmoe
