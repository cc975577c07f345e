// Kimi-K3's router on the GPU (include/mxmoe/router.h): sigmoid, biased top-k and renormalized
// weights fused into one kernel, bitwise equal to the CPU KimiK3Route.
//
// One warp routes one token. Lane l holds the selection keys of experts l, l + 32, l + 64, ... in
// registers (kSlotsPerLane of them), so the scores are read once, coalesced, and never leave the
// chip. Each of the top_k rounds takes the warp's largest key with two redux.sync instructions
// (max of the keys, then min of the ids holding it: the lower id wins a tie, as on the CPU) and
// the winning lane retires that slot. The weights then need the picked experts' unbiased scores,
// which are recomputed from the logits (the same bits: router_sigmoid is deterministic) and summed
// in pick order by every lane alike, as the CPU sums them.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/router_math.h"
#include "mxmoe/formats.h"
#include "mxmoe/router.h"

namespace mxmoe {

namespace {

// ---------------------------------------------------------------------------------------------
// Config

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;  // tokens per block; small, so short batches still spread out
constexpr int kThreads = kWarpsPerBlock * kWarpSize;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
// A retired (or absent) expert's key: below NaN's 1, so it is never picked while top_k <= E.
constexpr uint32_t kTakenKey = 0;
constexpr uint32_t kNoId = 0xFFFFFFFFu;

// The instantiations: experts per lane, so E <= 32 * kSlotsPerLane. Three, to keep the build short;
// the unused slots of a narrower layer cost a compare each per round.
template <int kSlotsPerLane>
struct RouterConfig {
  static_assert(kSlotsPerLane >= 1 && kSlotsPerLane <= 128,
                "keys live in registers: 128 slots (E = 4096) is the most a thread can hold");
  static constexpr int kMaxExperts = kSlotsPerLane * kWarpSize;
};
using SmallConfig = RouterConfig<8>;     // E <= 256 (GPT-OSS 128, DeepSeek-V3 256)
using MediumConfig = RouterConfig<32>;   // E <= 1024 (Kimi-K3 896)
using LargeConfig = RouterConfig<128>;   // E <= 4096
static_assert(LargeConfig::kMaxExperts == kRouterCudaMaxExperts, "router.h promises this bound");

__device__ __forceinline__ float LoadLogit(const float* row, int expert_idx) { return row[expert_idx]; }
__device__ __forceinline__ float LoadLogit(const uint16_t* row, int expert_idx) {
  return bf16_to_float(row[expert_idx]);
}

// ---------------------------------------------------------------------------------------------
// Kernel

template <class Config, typename LogitT>
__global__ void __launch_bounds__(kThreads)
    KimiK3RouteKernel(const LogitT* __restrict__ gmem_logits, const float* __restrict__ gmem_bias,
                      int64_t num_tokens, int num_experts, int top_k, float routed_scaling_factor,
                      int32_t* __restrict__ gmem_topk_ids, float* __restrict__ gmem_topk_weights) {
  constexpr int kSlots = Config::kMaxExperts / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t token_idx = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (token_idx >= num_tokens) return;  // the whole warp leaves together
  const LogitT* gmem_row = gmem_logits + token_idx * num_experts;
  int32_t* gmem_ids = gmem_topk_ids + token_idx * top_k;
  float* gmem_weights = gmem_topk_weights + token_idx * top_k;

  // Slot s of lane l is expert s * 32 + l: within a lane a lower slot is a lower id, so the lane's
  // best (strict > keeps the first of equal keys) is its lowest id among its largest keys.
  uint32_t frag_key[kSlots];
  uint32_t best_key = kTakenKey;
  int best_slot = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int expert_idx = s * kWarpSize + lane;
    frag_key[s] = kTakenKey;
    if (expert_idx < num_experts) {
      const float score = router_sigmoid(LoadLogit(gmem_row, expert_idx));
      frag_key[s] = router_selection_key(router_add(score, gmem_bias[expert_idx]));
    }
    if (frag_key[s] > best_key) {
      best_key = frag_key[s];
      best_slot = s;
    }
  }

  // Selection: round j picks the j-th expert. Lane j % 32 keeps it until its chunk of 32 is written.
  int32_t chunk_id = 0;
  for (int j = 0; j < top_k; ++j) {
    const uint32_t max_key = __reduce_max_sync(kFullMask, best_key);
    const uint32_t candidate = best_key == max_key ? static_cast<uint32_t>(best_slot * kWarpSize + lane) : kNoId;
    const uint32_t winner = __reduce_min_sync(kFullMask, candidate);
    if (lane == j % kWarpSize) chunk_id = static_cast<int32_t>(winner);
    if (lane == static_cast<int>(winner % kWarpSize)) {
      const int taken_slot = static_cast<int>(winner / kWarpSize);
      best_key = kTakenKey;
      best_slot = 0;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {  // compile-time slot indices: frag_key stays in registers
        if (s == taken_slot) frag_key[s] = kTakenKey;
        if (frag_key[s] > best_key) {
          best_key = frag_key[s];
          best_slot = s;
        }
      }
    }
    const int chunk_base = j - j % kWarpSize;
    if ((j % kWarpSize == kWarpSize - 1 || j == top_k - 1) && lane <= j - chunk_base)
      gmem_ids[chunk_base + lane] = chunk_id;
  }

  // Weights: sum_j s[id_j] in pick order, as the CPU adds them (every lane computes the same sum
  // from the same shuffled values), then s / (sum + 1e-20) * factor. Each lane reads back the ids
  // it wrote itself above, so program order makes them visible.
  float sum = 0.0f;
  for (int chunk_base = 0; chunk_base < top_k; chunk_base += kWarpSize) {
    const int j = chunk_base + lane;
    const float score = j < top_k ? router_sigmoid(LoadLogit(gmem_row, gmem_ids[j])) : 0.0f;
    const int count = min(kWarpSize, top_k - chunk_base);
    for (int i = 0; i < count; ++i) sum = router_add(sum, __shfl_sync(kFullMask, score, i));
  }
  const float denom = router_add(sum, 1e-20f);
  for (int j = lane; j < top_k; j += kWarpSize) {
    const float score = router_sigmoid(LoadLogit(gmem_row, gmem_ids[j]));
    gmem_weights[j] = router_mul(router_div(score, denom), routed_scaling_factor);
  }
}

// ---------------------------------------------------------------------------------------------
// Launcher

std::string Str(int64_t v) { return std::to_string(v); }

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Cuda(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Makes `device` current for the scope (when >= 0 and not already) and restores the caller's.
class ScopedDevice {
 public:
  Status Enter(int device) {
    if (device < 0) return Status::Ok();
    MXMOE_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice"));
    if (previous_ == device) return Status::Ok();
    MXMOE_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice(" + Str(device) + ")"));
    switched_ = true;
    return Status::Ok();
  }
  ~ScopedDevice() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class Config, typename LogitT>
void Launch(const void* logits, const float* bias, int64_t num_tokens, int num_experts, int top_k, float factor,
            int32_t* ids, float* weights, cudaStream_t stream) {
  const int64_t blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  KimiK3RouteKernel<Config, LogitT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const LogitT*>(logits), bias, num_tokens, num_experts, top_k, factor, ids, weights);
}

template <typename LogitT>
void LaunchFor(const void* logits, const float* bias, int64_t num_tokens, int num_experts, int top_k, float factor,
               int32_t* ids, float* weights, cudaStream_t stream) {
  if (num_experts <= SmallConfig::kMaxExperts)
    Launch<SmallConfig, LogitT>(logits, bias, num_tokens, num_experts, top_k, factor, ids, weights, stream);
  else if (num_experts <= MediumConfig::kMaxExperts)
    Launch<MediumConfig, LogitT>(logits, bias, num_tokens, num_experts, top_k, factor, ids, weights, stream);
  else
    Launch<LargeConfig, LogitT>(logits, bias, num_tokens, num_experts, top_k, factor, ids, weights, stream);
}

}  // namespace

Status KimiK3RouteCuda(const void* logits, RouterLogits logits_type, const float* correction_bias,
                       int64_t num_tokens, int64_t num_experts, const RouterOptions& options,
                       int32_t* topk_ids, float* topk_weights, int device, void* stream) {
  const int64_t t_count = num_tokens, e_count = num_experts, k = options.top_k;
  if (t_count < 0) return Status::Invalid("logits: num_tokens = " + Str(t_count) + ", expected >= 0");
  if (e_count < 1) return Status::Invalid("logits: num_experts = " + Str(e_count) + ", expected >= 1");
  if (k < 1 || k > e_count)
    return Status::Invalid("top_k = " + Str(k) + " is outside [1, num_experts = " + Str(e_count) + "]");
  if (!std::isfinite(options.routed_scaling_factor))
    return Status::Invalid("routed_scaling_factor must be finite");
  if (e_count > kRouterCudaMaxExperts)
    return Status::Unsupported("logits: num_experts = " + Str(e_count) + " exceeds the CUDA router's " +
                               Str(kRouterCudaMaxExperts) + " (use the CPU router)");
  if (logits_type != RouterLogits::kF32 && logits_type != RouterLogits::kBF16)
    return Status::Invalid("logits: unknown element type " + Str(static_cast<int>(logits_type)) +
                           " (expected f32 or bf16)");
  if (device < -1) return Status::Invalid("device = " + Str(device) + ", expected -1 (current) or an index");
  // Blocks are counted in 32 bits.
  if (t_count > int64_t{0x7FFFFFFF} * kWarpsPerBlock)
    return Status::Invalid("logits: num_tokens = " + Str(t_count) + " is more than one launch covers");
  if (t_count == 0) return Status::Ok();
  if (logits == nullptr) return Status::Invalid("logits: missing");
  if (correction_bias == nullptr) return Status::Invalid("correction_bias: missing");
  if (topk_ids == nullptr || topk_weights == nullptr) return Status::Invalid("topk_ids / topk_weights: missing");
  const bool f32 = logits_type == RouterLogits::kF32;
  if (!Aligned(logits, f32 ? 4 : 2))
    return Status::Invalid(std::string("logits: must be ") + (f32 ? "4" : "2") + "-byte aligned");
  if (!Aligned(correction_bias, 4)) return Status::Invalid("correction_bias: must be 4-byte aligned");
  if (!Aligned(topk_ids, 4) || !Aligned(topk_weights, 4))
    return Status::Invalid("topk_ids / topk_weights: must be 4-byte aligned");

  ScopedDevice scoped;
  MXMOE_RETURN_IF_ERROR(scoped.Enter(device));
  const auto s = static_cast<cudaStream_t>(stream);
  const int e = static_cast<int>(e_count), top_k = static_cast<int>(k);
  if (f32)
    LaunchFor<float>(logits, correction_bias, t_count, e, top_k, options.routed_scaling_factor, topk_ids,
                     topk_weights, s);
  else
    LaunchFor<uint16_t>(logits, correction_bias, t_count, e, top_k, options.routed_scaling_factor, topk_ids,
                        topk_weights, s);
  return CudaStatus(cudaGetLastError(), "KimiK3RouteKernel launch");
}

}  // namespace mxmoe
