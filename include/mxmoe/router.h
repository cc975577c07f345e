// Kimi-K3's router (SPEC section 5) on the CPU and on a CUDA device: which k experts each token
// goes to, and with which weights. The operator itself takes topk_ids / topk_weights from any
// router; this one is here so that engines and tests can produce exactly Kimi-K3's routing next to
// the operator. No CUDA header is needed to include it.
#pragma once

#include <cstdint>

#include "mxmoe/status.h"

namespace mxmoe {

struct RouterOptions {
  int64_t top_k = 16;                  // Kimi-K3: 16 of 896
  float routed_scaling_factor = 1.0f;  // Kimi-K3: 1.0
};

// For each token t, with s[e] = sigmoid(logits[t, e]) in fp32 (within 2.5 ulp of the exact value,
// as 1 / (1 + expf(-x)) is; 1 from 20 up, 0 from -87 down, NaN for NaN; src/core/router_math.h
// defines the bits):
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

// The element type of the logits the CUDA router reads. bf16 logits are widened to f32 exactly, so
// KimiK3RouteCuda on bf16 logits equals KimiK3Route on their f32 values.
enum class RouterLogits : int { kF32 = 0, kBF16 = 1 };

// The widest layer KimiK3RouteCuda takes (one warp per token keeps every expert's score in
// registers); wider ones are refused with kUnsupported.
inline constexpr int64_t kRouterCudaMaxExperts = 4096;

// KimiK3Route on a CUDA device, fused into one kernel launched on `stream` (a cudaStream_t, null
// for the legacy default stream): no host synchronization, no allocation, so it can be captured
// into a CUDA graph. Every pointer is device memory of `device` (made current for the launch and
// restored after; -1 keeps the current device): logits [T, E] row-major f32 or bf16 bits (4- or
// 2-byte aligned), correction_bias [E] f32, topk_ids [T, top_k] int32, topk_weights [T, top_k]
// f32. The results are bitwise those of KimiK3Route (the same ties, the same weights): both
// compute the scores with the same correctly rounded operations. Refuses what KimiK3Route refuses,
// plus num_experts > kRouterCudaMaxExperts (kUnsupported), an unknown logits type and misaligned
// pointers, before launching; a CUDA launch error comes back as kCudaError. T = 0 launches nothing.
// In a build without CUDA it returns kUnsupported.
Status KimiK3RouteCuda(const void* logits, RouterLogits logits_type, const float* correction_bias,
                       int64_t num_tokens, int64_t num_experts, const RouterOptions& options,
                       int32_t* topk_ids, float* topk_weights, int device, void* stream);

}  // namespace mxmoe
