// Kimi-K3's router (see router.h): sigmoid scores, biased selection, renormalized weights.
#include "mxmoe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/router_math.h"

namespace mxmoe {

Status KimiK3Route(const float* logits, const float* correction_bias, int64_t num_tokens,
                   int64_t num_experts, const RouterOptions& options, int32_t* topk_ids,
                   float* topk_weights) {
  const int64_t t_count = num_tokens, e_count = num_experts, k = options.top_k;
  if (t_count < 0) return Status::Invalid("logits: num_tokens = " + std::to_string(t_count) + ", expected >= 0");
  if (e_count < 1) return Status::Invalid("logits: num_experts = " + std::to_string(e_count) + ", expected >= 1");
  if (k < 1 || k > e_count)
    return Status::Invalid("top_k = " + std::to_string(k) + " is outside [1, num_experts = " +
                           std::to_string(e_count) + "]");
  if (!std::isfinite(options.routed_scaling_factor))
    return Status::Invalid("routed_scaling_factor must be finite");
  if (t_count == 0) return Status::Ok();
  if (logits == nullptr) return Status::Invalid("logits: missing");
  if (correction_bias == nullptr) return Status::Invalid("correction_bias: missing");
  if (topk_ids == nullptr || topk_weights == nullptr) return Status::Invalid("topk_ids / topk_weights: missing");

  std::vector<float> score(e_count), biased(e_count);
  std::vector<int32_t> order(e_count);
  // Descending biased score; NaN below every number; ties to the lower id. A strict weak order,
  // so partial_sort's result is fully determined.
  auto ranks_before = [&](int32_t a, int32_t b) {
    const float x = biased[a], y = biased[b];
    const bool x_nan = std::isnan(x), y_nan = std::isnan(y);
    if (x_nan != y_nan) return y_nan;
    if (!x_nan && x != y) return x > y;
    return a < b;
  };
  for (int64_t t = 0; t < t_count; ++t) {
    const float* row = logits + t * e_count;
    for (int64_t e = 0; e < e_count; ++e) {
      // router_sigmoid, not expf: the CUDA router computes the same bits (see router_math.h).
      score[e] = router_sigmoid(row[e]);
      biased[e] = score[e] + correction_bias[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), ranks_before);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += score[order[j]];
    const float denom = sum + 1e-20f;
    int32_t* ids = topk_ids + t * k;
    float* w = topk_weights + t * k;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = order[j];
      w[j] = score[order[j]] / denom * options.routed_scaling_factor;
    }
  }
  return Status::Ok();
}

}  // namespace mxmoe
