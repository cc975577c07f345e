// CudaMoe: upload and repack at Create, the fused pipeline (Run) and the unfused GPU reference
// (RunReference) on the caller's stream and workspace, for SM90 and SM120. The two share all of it
// but the weight layout, the activation operands' format and the GEMM launches (KernelPath).
// Launch code only: the kernels are in routing.cu, weight_prepack.cu, reference_kernels.cu, sm90/
// and sm120/; the choices in heuristics.cu and sm120/moe_gemm_sm120_dispatch.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/heuristics.h"
#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/sm120/sm120_kernels.h"
#include "cuda/weight_layout.h"
#include "mxmoe/cuda.h"

#ifndef MXMOE_CUDA_ARCHS
#define MXMOE_CUDA_ARCHS ""
#endif

namespace mxmoe {

namespace {

using cuda::ExpertParams;
using cuda::PackedShape;

std::string Str(int64_t v) { return std::to_string(v); }

Status CudaCheck(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  if (e == cudaErrorMemoryAllocation)
    return Status(StatusCode::kOutOfMemory, what + ": " + cudaGetErrorString(e));
  return Status::Cuda(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Makes `device` current for the scope and restores the caller's device after.
class DeviceGuard {
 public:
  Status Enter(int device) {
    MXMOE_RETURN_IF_ERROR(CudaCheck(cudaGetDevice(&previous_), "cudaGetDevice"));
    if (previous_ != device) {
      MXMOE_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(device), "cudaSetDevice(" + Str(device) + ")"));
      switched_ = true;
    }
    return Status::Ok();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  Status Allocate(size_t n, const std::string& what) {
    bytes = n;
    if (n == 0) return Status::Ok();
    return CudaCheck(cudaMalloc(&ptr, n), "cudaMalloc " + Str(static_cast<int64_t>(n)) + " bytes for " + what);
  }
  void Free() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
  }
  template <class T>
  T* As() const {
    return static_cast<T*>(ptr);
  }
};

// Sub-allocations of one caller-provided workspace, 256-byte aligned.
struct Arena {
  size_t used = 0;
  size_t Take(size_t bytes) {
    const size_t at = (used + 255) / 256 * 256;
    used = at + bytes;
    return at;
  }
};

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Where a workspace layout (token or pair chunks) keeps the routing: the sort's keys and pair ids
// of n pairs, then (after what a layout puts between) the experts' offsets, the tile list, the
// tile count and the sort's scratch. Both layouts take them in this order through the two calls.
struct RoutingLayout {
  size_t keys_in, keys_out, vals_in, vals_out, offsets, tile_offsets, tiles, num_tiles, sort_temp;
  void TakeSort(Arena& a, size_t n) {
    keys_in = a.Take(n * 4);
    keys_out = a.Take(n * 4);
    vals_in = a.Take(n * 4);
    vals_out = a.Take(n * 4);
  }
  // experts: num_local + 1 offsets; tile_pairs: the pairs the tile list covers (every tile holds
  // >= 1 pair).
  void TakeTiles(Arena& a, size_t experts, size_t tile_pairs, size_t sort_temp_bytes) {
    offsets = a.Take(experts * 4);
    tile_offsets = a.Take(experts * 4);
    tiles = a.Take(tile_pairs * 8);
    num_tiles = a.Take(8);  // the tile count, then the persistent FC1 kernel's work counter
    sort_temp = a.Take(sort_temp_bytes);
  }
};

// The routing's buffers in the workspace at ws.
struct RoutingBuffers {
  int32_t *keys_in, *keys_out, *vals_in, *vals_out, *offsets, *tile_offsets;
  int2* tiles;
  int32_t* num_tiles;
};
RoutingBuffers RoutingIn(const RoutingLayout& r, uint8_t* ws) {
  const auto i32 = [ws](size_t off) { return reinterpret_cast<int32_t*>(ws + off); };
  return {i32(r.keys_in),      i32(r.keys_out),  i32(r.vals_in), i32(r.vals_out), i32(r.offsets),
          i32(r.tile_offsets), reinterpret_cast<int2*>(ws + r.tiles), i32(r.num_tiles)};
}

// Largest finite UE8M0 byte of a scale tensor.
int MaxFiniteScale(const std::vector<uint8_t>& scales, int start) {
  int m = start;
  for (uint8_t b : scales)
    if (b != kUe8m0Nan && b > m) m = b;
  return m;
}

// ---- what differs between the SM90 and the SM120 kernels --------------------------------------
// The prepacked weights (layout, buffers, repack kernel), the format of the GEMMs' activation
// operands in the workspace (the quantized input xq and the intermediate h) and the GEMM
// launches. CudaMoeImpl shares everything else: upload staging, expert parameters, routing, the
// combine, the unfused reference and the error word.

// One chunk's buffers and routing, as the shared part of Run leaves them for the GEMMs.
struct GemmCall {
  int64_t chunk_tokens = 0;   // the chunk size the workspace was planned for: xq's capacity
  int64_t pair_capacity = 0;  // h's and y's rows: chunk_tokens * top_k, or a pair chunk's
  uint8_t* xq = nullptr;      // XqBytes(chunk_tokens)
  uint8_t* h = nullptr;       // HBytes(pair_capacity)
  float* y = nullptr;         // [pair_capacity, K] fp32 rows for the combine
  const int32_t* sorted_pairs = nullptr;
  const int32_t* expert_offsets = nullptr;
  const int2* tiles = nullptr;
  int32_t* num_tiles = nullptr;  // [2]: the tile count, then the persistent FC1 kernel's work counter
  int64_t max_tiles = 0;  // an upper bound of *num_tiles, known on the host
  int32_t top_k = 0;
  const float* topk_weights = nullptr;
  // FC2's pair ids and router weights by sorted position where they are not FC1's (pair chunks:
  // 0, 1, ... and the weights in sorted order, so that FC2 writes y at positions; null: FC1's).
  const int32_t* fc2_pairs = nullptr;
  const float* fc2_weights = nullptr;
  const ExpertParams* experts = nullptr;
  ActivationType act = ActivationType::Situ;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  // The fused decode kernel's buffers (KernelPath::DecodeBytes of the chunk's pairs), and whether
  // this call runs it, with which plan for how many pairs (set by KernelPath::PlanFusedDecode,
  // which also has the input quantization's launch clear its synchronization words).
  uint8_t* decode_ws = nullptr;
  bool fused_decode = false;
  int64_t decode_pairs = 0;
  cuda::DecodePlan decode_plan;
  // The chunk's ids, tokens and output rows, for the combine where the fused decode kernel or FC2
  // folds it in (fold_combine, set by PlanFusedDecode or PlanFoldedCombine: the call then launches
  // no combine kernel; FC2 folds it where the call is not fused).
  const int32_t* topk_ids = nullptr;
  int64_t tokens = 0;
  int64_t first_expert = 0;
  void* out = nullptr;
  OutputDType out_dtype = OutputDType::kF32;
  bool fold_combine = false;
};

// A chunk's GEMM configs (FC1's and FC2's, the same unless forced apart) and its routing tile
// (tokens per tile).
struct GemmChoice {
  int config = 0;
  int config_fc2 = 0;
  int tile_tokens = 1;
  std::string name;  // "n8c2", or "n8c2/n8c4" for two configs
};

class KernelPath {
 public:
  virtual ~KernelPath() = default;
  virtual const char* Name() const = 0;  // what CudaMoe::Kernels() reports
  // The weight buffers of dims.num_local experts (freed by Free, on the caller's device).
  virtual Status Allocate(const cuda::LayerDims& dims) = 0;
  virtual void Free() = 0;
  virtual cudaError_t Repack(const cuda::ExpertSource* sources, int count, int64_t first_local,
                             const ExpertParams* params, cudaStream_t stream) const = 0;
  virtual cudaError_t PrepareKernels() const = 0;
  virtual size_t XqBytes(int64_t tokens) const = 0;
  virtual size_t HBytes(int64_t pairs) const = 0;
  virtual GemmChoice Choose(const cuda::LaunchChoice& launch) const = 0;
  // Points the input quantization at call.xq, in this path's format.
  virtual void SetQuantOutput(const GemmCall& call, cuda::PrepareParams* pp) const = 0;
  virtual Status LaunchGemms(const GemmChoice& choice, const GemmCall& call, cudaStream_t stream) const = 0;
  virtual void SetReferenceWeights(cuda::ReferenceParams* p) const = 0;
  // The workspace of the fused decode kernel for calls of up to `pairs` pairs (0: the path has
  // none), non-decreasing in pairs.
  virtual size_t DecodeBytes(int64_t /*pairs*/) const { return 0; }
  // Whether a call whose chunks hold at most `pairs` pairs runs the fused decode kernel under
  // `choice` (Run and Plan decide by the largest chunk, so that the plan names what every chunk runs).
  virtual bool FusesDecode(const GemmChoice& /*choice*/, int64_t /*pairs*/) const { return false; }
  // The plan's name of `choice` (Plan, the bench's config column), run fused or not.
  virtual std::string RunName(const GemmChoice& choice, bool /*fused*/) const { return choice.name; }
  // For a call that does (FusesDecode; its routing in LaunchPrepareAndRoute, *pp): its buffers in
  // *call, and pp's cleared words pointed at them.
  virtual void PlanFusedDecode(int64_t /*pairs*/, GemmCall* /*call*/, cuda::PrepareParams* /*pp*/) const {}
  // For a call that does not fuse, routed by LaunchPrepareAndRoute (*pp): whether FC2 folds the
  // combine in under `choice`; where it does, sets call->fold_combine and points pp's cleared words
  // at FC2's counts.
  virtual void PlanFoldedCombine(const GemmChoice& /*choice*/, GemmCall* /*call*/, cuda::PrepareParams* /*pp*/) const {}

 protected:
  cuda::LayerDims dims_;
};

// SM90: bf16 operands for mma.sync / wgmma, weights in weight_layout.h (sm90/).
class Sm90Path final : public KernelPath {
 public:
  const char* Name() const override { return "sm90"; }
  Status Allocate(const cuda::LayerDims& dims) override {
    dims_ = dims;
    int device = 0;
    MXMOE_RETURN_IF_ERROR(CudaCheck(cudaGetDevice(&device), "cudaGetDevice"));
    MXMOE_RETURN_IF_ERROR(
        CudaCheck(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device), "the device's SM count"));
    w13_ = PackedShape::Of(2 * dims.inter, dims.hidden);
    w2_ = PackedShape::Of(dims.hidden, dims.inter);
    const int64_t n = dims.num_local;
    MXMOE_RETURN_IF_ERROR(w13_tiles_.Allocate(n * w13_.Tiles() * cuda::kTileBytes, "W13"));
    MXMOE_RETURN_IF_ERROR(w13_scales_.Allocate(n * w13_.Tiles() * cuda::kTileScaleBytes, "W13 scales"));
    MXMOE_RETURN_IF_ERROR(w2_tiles_.Allocate(n * w2_.Tiles() * cuda::kTileBytes, "W2"));
    return w2_scales_.Allocate(n * w2_.Tiles() * cuda::kTileScaleBytes, "W2 scales");
  }
  void Free() override {
    for (DeviceBuffer* b : {&w13_tiles_, &w13_scales_, &w2_tiles_, &w2_scales_}) b->Free();
  }
  cudaError_t Repack(const cuda::ExpertSource* sources, int count, int64_t first_local, const ExpertParams* params,
                     cudaStream_t stream) const override {
    return cuda::LaunchRepackExperts(sources, count, first_local, dims_.hidden, dims_.inter, w13_, w2_, params,
                                     w13_tiles_.As<uint8_t>(), w13_scales_.As<uint8_t>(), w2_tiles_.As<uint8_t>(),
                                     w2_scales_.As<uint8_t>(), stream);
  }
  cudaError_t PrepareKernels() const override { return cuda::PrepareGemmKernels(); }
  size_t XqBytes(int64_t tokens) const override { return tokens * XStride() * 2; }
  size_t HBytes(int64_t pairs) const override { return pairs * HStride() * 2; }
  GemmChoice Choose(const cuda::LaunchChoice& launch) const override {
    const cuda::GemmConfigInfo info = cuda::GemmInfo(launch.gemm);
    const cuda::GemmConfigInfo info2 = cuda::GemmInfo(launch.gemm_fc2);
    std::string name = info.name;
    if (launch.gemm_fc2 != launch.gemm) name += std::string("/") + info2.name;
    // The L2 look-ahead, where a config that reads it runs.
    const int l2_ahead = cuda::L2Ahead();
    if (l2_ahead > 0 && (info.looks_ahead || info2.looks_ahead)) name += " l2+" + std::to_string(l2_ahead);
    return {static_cast<int>(launch.gemm), static_cast<int>(launch.gemm_fc2), info.block_n, name};
  }
  void SetQuantOutput(const GemmCall& call, cuda::PrepareParams* pp) const override {
    pp->xq = reinterpret_cast<uint16_t*>(call.xq);
    pp->x_stride = XStride();
  }
  Status LaunchGemms(const GemmChoice& choice, const GemmCall& call, cudaStream_t stream) const override {
    const cuda::GemmConfigId id = static_cast<cuda::GemmConfigId>(choice.config);
    const cuda::GemmConfigId id2 = static_cast<cuda::GemmConfigId>(choice.config_fc2);
    const cuda::GemmConfigInfo info = cuda::GemmInfo(id), info2 = cuda::GemmInfo(id2);
    const int32_t m_tiles13 = RowBlocks(w13_), m_tiles2 = RowBlocks(w2_);
    uint16_t* h = reinterpret_cast<uint16_t*>(call.h);
    cuda::GemmParams g;
    g.sorted_pairs = call.sorted_pairs;
    g.expert_offsets = call.expert_offsets;
    g.tiles = call.tiles;
    g.num_tiles = call.num_tiles;
    g.work_counter = call.num_tiles + 1;
    g.top_k = call.top_k;
    g.experts = call.experts;
    g.act = call.act;
    g.gate_bias = call.gate_bias;
    g.up_bias = call.up_bias;
    g.h = h;
    g.h_stride = HStride();
    g.y = call.y;
    g.y_stride = dims_.hidden;
    g.topk_weights = call.topk_weights;
    g.early_steps = cuda::EarlySteps();

    cuda::GemmParams g1 = g;
    // FC1's guess of its tiles' experts for the early prefetch (GemmParams::early_ids): the call's
    // ids, where one warp holds them all.
    if (call.topk_ids != nullptr && call.tokens * call.top_k <= cuda::kEarlyGuessMaxPairs) {
      g1.early_ids = call.topk_ids;
      g1.early_pairs = static_cast<int32_t>(call.tokens * call.top_k);
      g1.early_num_local = static_cast<int32_t>(dims_.num_local);
      g1.early_first_expert = call.first_expert;
    }
    g1.a_tiles = w13_tiles_.As<uint8_t>();
    g1.a_scales = w13_scales_.As<uint8_t>();
    g1.a_shape = w13_;
    g1.b = reinterpret_cast<const uint16_t*>(call.xq);
    g1.b_stride = XStride();
    g1.b_rows = call.chunk_tokens;
    if (info.loads_sorted_rows) {
      // The configs fed by TMA load a tile's tokens as boxes of rows: gather them in sorted order
      // first, into y's space (y is written only by FC2, and a bf16 row of XStride() fits in an fp32
      // row of K).
      uint16_t* xs = reinterpret_cast<uint16_t*>(call.y);
      const int64_t max_rows = call.pair_capacity;
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchGatherRows(g1.b, XStride(), dims_.hidden, call.sorted_pairs,
                                                             call.expert_offsets + dims_.num_local, call.top_k,
                                                             max_rows, xs, stream),
                                      "token gather kernel"));
      g1.b = xs;
      g1.b_rows = max_rows;
    }
    g1.m_tiles = m_tiles13;
    // The L2 look-ahead for a config that reads it (Choose names it where it does); the others,
    // n8f's fallback to n8's kernels too, get none.
    g1.l2_ahead = info.looks_ahead ? cuda::L2Ahead() : 0;
    cuda::GemmParams g2 = g;
    g2.l2_ahead = info2.looks_ahead ? cuda::L2Ahead() : 0;
    if (call.fc2_pairs != nullptr) g2.sorted_pairs = call.fc2_pairs;
    if (call.fc2_weights != nullptr) g2.topk_weights = call.fc2_weights;
    if (call.fold_combine && !call.fused_decode) {  // (PlanFoldedCombine)
      g2.fold_done = reinterpret_cast<int32_t*>(call.decode_ws);
      g2.fold_ids = call.topk_ids;
      g2.fold_tokens = static_cast<int32_t>(call.tokens);
      g2.fold_num_local = static_cast<int32_t>(dims_.num_local);
      g2.fold_first_expert = call.first_expert;
      g2.fold_out = call.out;
      g2.fold_dtype = call.out_dtype;
    }
    g2.a_tiles = w2_tiles_.As<uint8_t>();
    g2.a_scales = w2_scales_.As<uint8_t>();
    g2.a_shape = w2_;
    g2.b = h;
    g2.b_stride = g.h_stride;
    g2.b_rows = call.pair_capacity;
    g2.m_tiles = m_tiles2;
    // (GemmParams::next_steps)
    if (const int next = cuda::Fc1PrefetchFc2Steps(info);
        next > 0 && OnDecodeMmaKernel(info) && OnDecodeMmaKernel(info2)) {
      g1.next_steps = next;
      g1.next_a_tiles = g2.a_tiles;
      g1.next_a_scales = g2.a_scales;
      g1.next_a_shape = g2.a_shape;
      g1.next_m_tiles = m_tiles2;
      g1.next_k_parts = info2.cluster_ctas;
    }
    if (call.fused_decode) {
      cuda::DecodeParams d;
      d.fc1 = g1;
      d.fc2 = g2;
      d.plan = call.decode_plan;
      d.max_tiles = static_cast<int32_t>(call.max_tiles);
      d.sync = reinterpret_cast<int32_t*>(call.decode_ws);
      d.pairs = static_cast<int32_t>(call.decode_pairs);
      if (call.fold_combine) {
        d.topk_ids = call.topk_ids;
        d.first_expert = call.first_expert;
        d.num_local = static_cast<int32_t>(dims_.num_local);
        d.out = call.out;
        d.out_dtype = call.out_dtype;
      }
      if (d.plan.s1 > 1 || d.plan.s2 > 1)
        d.partials = reinterpret_cast<float*>(call.decode_ws + DecodeSyncBytes(d.plan, call.max_tiles));
      return CudaCheck(cuda::LaunchFusedDecode(d, stream), "fused decode GEMMs (" + choice.name + ")");
    }
    // A decode call whose FC1 fills the SMs launches FC2 with PDL too, its CTAs capped
    // (kFc2CapMinFc1CtasPerSm, perf-log v32). MXMOE_PDL, where set, still decides the sites: without
    // PDL on FC2's edge, FC2 keeps its own shared memory.
    const bool fc1_fills =
        (cuda::PdlDefaultSites() & static_cast<unsigned>(cuda::PdlSite::kFc1)) != 0 &&
        cuda::Fc2CapSmem() > info2.smem_bytes && OnDecodeMmaKernel(info2) &&
        m_tiles13 * call.max_tiles * info.cluster_ctas >= int64_t{cuda::kFc2CapMinFc1CtasPerSm} * sms_;
    const cuda::ScopedPdlDefault pdl(cuda::PdlDefaultSites() |
                                     (fc1_fills ? static_cast<unsigned>(cuda::PdlSite::kFc2) : 0u));
    if (fc1_fills && cuda::PdlAt(cuda::PdlSite::kFc2)) g2.launch_smem = cuda::Fc2CapSmem();
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchGemm(id, true, g1, m_tiles13 * call.max_tiles, stream),
                                    std::string("FC1 grouped GEMM (") + choice.name + ")"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchGemm(id2, false, g2, m_tiles2 * call.max_tiles, stream),
                                    std::string("FC2 grouped GEMM (") + choice.name + ")"));
    if (g2.fold_done != nullptr) cuda::CountFoldedCombine();
    return Status::Ok();
  }
  void SetReferenceWeights(cuda::ReferenceParams* p) const override {
    p->w13_tiles = w13_tiles_.As<uint8_t>();
    p->w13_scales = w13_scales_.As<uint8_t>();
    p->w13 = w13_;
    p->w2_tiles = w2_tiles_.As<uint8_t>();
    p->w2_scales = w2_scales_.As<uint8_t>();
    p->w2 = w2_;
  }
  // The synchronization words of at most `pairs` tiles, then the bound of the parts' sums.
  size_t DecodeBytes(int64_t pairs) const override {
    pairs = std::min<int64_t>(pairs, cuda::kDecodeMaxPairs);
    const cuda::DecodePlan plan = DecodePlanOf(pairs);
    return DecodeSyncBytes(plan, pairs) +
           static_cast<size_t>(cuda::DecodePartialBound(plan.m1, plan.m2, pairs)) * sizeof(float);
  }
  bool FusesDecode(const GemmChoice& choice, int64_t pairs) const override {
    const int n8f = static_cast<int>(cuda::GemmConfigId::kN8f);
    return choice.config == n8f && choice.config_fc2 == n8f && pairs <= cuda::kDecodeMaxPairs;
  }
  // n8f where it does not fuse (past kDecodeMaxPairs, in pair chunks) runs n8's two kernels; where
  // it does, with MXMOE_DECODE_COMBINE, the combine too.
  std::string RunName(const GemmChoice& choice, bool fused) const override {
    const int n8f = static_cast<int>(cuda::GemmConfigId::kN8f);
    if (choice.config != n8f || choice.config_fc2 != n8f) return choice.name;
    return choice.name + (!fused ? " as n8" : cuda::DecodeCombineEnabled() ? "+combine" : "");
  }
  void PlanFusedDecode(int64_t pairs, GemmCall* call, cuda::PrepareParams* pp) const override {
    call->fused_decode = true;
    call->decode_pairs = pairs;
    call->fold_combine = cuda::DecodeCombineEnabled();
    call->decode_plan = DecodePlanOf(pairs, call->fold_combine ? call->tokens : 0);
    pp->zero = reinterpret_cast<int32_t*>(call->decode_ws);
    pp->zero_words = cuda::DecodeSyncWords(call->decode_plan, call->max_tiles);
  }
  // FC2 on the mma.sync kernel's 8-token tiles (GemmParams::fold_done), one count word per W2 row
  // block at the start of the decode workspace (DecodeBytes holds n8f's words, of which the last
  // RowBlocks(w2_) are its done words: never fewer).
  void PlanFoldedCombine(const GemmChoice& choice, GemmCall* call, cuda::PrepareParams* pp) const override {
    if (call->tokens > cuda::Fc2CombineTokens() ||
        !OnDecodeMmaKernel(cuda::GemmInfo(static_cast<cuda::GemmConfigId>(choice.config_fc2))) ||
        choice.config_fc2 == static_cast<int>(cuda::GemmConfigId::kN8f) || call->fc2_pairs != nullptr ||
        call->decode_ws == nullptr)
      return;
    call->fold_combine = true;
    pp->zero = reinterpret_cast<int32_t*>(call->decode_ws);
    pp->zero_words = RowBlocks(w2_);
  }

 private:
  // Row blocks and steps of the two GEMMs, the parts for a call of `pairs` pairs, and the tokens of
  // the folded combine (0: none).
  cuda::DecodePlan DecodePlanOf(int64_t pairs, int64_t combine_tokens = 0) const {
    cuda::DecodePlan plan;
    plan.m1 = RowBlocks(w13_);
    plan.m2 = RowBlocks(w2_);
    plan.k1 = static_cast<int32_t>(w13_.col_tiles);
    plan.k2 = static_cast<int32_t>(w2_.col_tiles);
    plan.s1 = cuda::DecodeSplitFor(pairs, plan.k1);
    plan.s2 = cuda::DecodeSplitFor(pairs, plan.k2);
    plan.combine_tokens = static_cast<int32_t>(combine_tokens);
    return plan;
  }
  // The words for calls of at most max_tiles tiles, in whole 256-byte units (the sums follow).
  static size_t DecodeSyncBytes(const cuda::DecodePlan& plan, int64_t max_tiles) {
    return (static_cast<size_t>(cuda::DecodeSyncWords(plan, max_tiles)) * 4 + 255) / 256 * 256;
  }
  // The CTAs' row blocks of a GEMM of weights `shape` (GemmParams::m_tiles), as an int32.
  static int32_t RowBlocks(const PackedShape& shape) { return static_cast<int32_t>(shape.RowBlocks()); }
  // Whether a config runs the mma.sync kernel on 8-token tiles (MoeGemmKernel's decode configs,
  // the ones with an early and a hand-on instance; not the TMA-fed n8t).
  static bool OnDecodeMmaKernel(const cuda::GemmConfigInfo& info) {
    return info.block_n == 8 && !info.loads_sorted_rows;
  }
  int64_t XStride() const { return w13_.col_tiles * cuda::kTileCols; }  // bf16 elements
  int64_t HStride() const { return w2_.col_tiles * cuda::kTileCols; }
  PackedShape w13_, w2_;
  int sms_ = 0;  // the device's SMs (the FC2 cap rule in LaunchGemms)
  DeviceBuffer w13_tiles_, w13_scales_, w2_tiles_, w2_scales_;
};

// SM120: e4m3 codes + UE8M0 scales as the block-scaled MMA takes them, weights in
// sm120/weight_layout_sm120.h (sm120/). `emulated`: an SM90 device running the sm_90a build of the
// same kernels with the software model of the MMA (docs/sm120.md).
class Sm120Path final : public KernelPath {
 public:
  explicit Sm120Path(bool emulated) : emulated_(emulated) {}
  const char* Name() const override { return emulated_ ? "sm120-emulated" : "sm120"; }
  Status Allocate(const cuda::LayerDims& dims) override {
    dims_ = dims;
    w13_ = cuda::sm120::PackedShape::Of(2 * dims.inter, dims.hidden);
    w2_ = cuda::sm120::PackedShape::Of(dims.hidden, dims.inter);
    const int64_t n = dims.num_local;
    MXMOE_RETURN_IF_ERROR(w13_codes_.Allocate(n * w13_.CodeBytes(), "W13 (SM120 layout)"));
    MXMOE_RETURN_IF_ERROR(w13_scales_.Allocate(n * w13_.ScaleBytes(), "W13 scales (SM120 layout)"));
    MXMOE_RETURN_IF_ERROR(w2_codes_.Allocate(n * w2_.CodeBytes(), "W2 (SM120 layout)"));
    return w2_scales_.Allocate(n * w2_.ScaleBytes(), "W2 scales (SM120 layout)");
  }
  void Free() override {
    for (DeviceBuffer* b : {&w13_codes_, &w13_scales_, &w2_codes_, &w2_scales_}) b->Free();
  }
  cudaError_t Repack(const cuda::ExpertSource* sources, int count, int64_t first_local, const ExpertParams*,
                     cudaStream_t stream) const override {
    return cuda::sm120::LaunchRepackExperts(sources, count, first_local, dims_.hidden, dims_.inter, w13_, w2_,
                                            w13_codes_.As<uint8_t>(), w13_scales_.As<uint8_t>(),
                                            w2_codes_.As<uint8_t>(), w2_scales_.As<uint8_t>(), stream);
  }
  cudaError_t PrepareKernels() const override { return cuda::sm120::PrepareGemmKernels(); }
  size_t XqBytes(int64_t tokens) const override { return tokens * (XStride() + XStride() / kMxBlock); }
  size_t HBytes(int64_t pairs) const override { return pairs * (HStride() + HStride() / kMxBlock); }
  GemmChoice Choose(const cuda::LaunchChoice& launch) const override {
    const cuda::sm120::GemmConfigId id = cuda::sm120::ChooseGemmConfig(launch.pairs_per_expert);
    const cuda::sm120::GemmConfigInfo info = cuda::sm120::GemmInfo(id);
    return {static_cast<int>(id), static_cast<int>(id), info.block_m, info.name};
  }
  void SetQuantOutput(const GemmCall& call, cuda::PrepareParams* pp) const override {
    pp->xq_codes = call.xq;
    pp->xq_scales = call.xq + call.chunk_tokens * XStride();
    pp->x_stride = XStride();
  }
  Status LaunchGemms(const GemmChoice& choice, const GemmCall& call, cudaStream_t stream) const override {
    const cuda::sm120::GemmConfigId id = static_cast<cuda::sm120::GemmConfigId>(choice.config);
    const int64_t groups_per_cta = cuda::sm120::GemmInfo(id).block_n / cuda::sm120::kGroupRows;
    const int64_t pair_capacity = call.pair_capacity;
    cuda::sm120::GemmParams g;
    g.sorted_pairs = call.sorted_pairs;
    g.expert_offsets = call.expert_offsets;
    g.tiles = call.tiles;
    g.num_tiles = call.num_tiles;
    g.top_k = call.top_k;
    g.experts = call.experts;
    g.act = call.act;
    g.gate_bias = call.gate_bias;
    g.up_bias = call.up_bias;
    g.inter = dims_.inter;
    g.h_codes = call.h;
    g.h_scales = call.h + pair_capacity * HStride();
    g.h_stride = HStride();
    g.h_scale_stride = HStride() / kMxBlock;
    g.y = call.y;
    g.y_stride = dims_.hidden;
    g.topk_weights = call.topk_weights;

    cuda::sm120::GemmParams g1 = g;
    g1.a_codes = call.xq;
    g1.a_scales = call.xq + call.chunk_tokens * XStride();
    g1.a_stride = XStride();
    g1.a_scale_stride = XStride() / kMxBlock;
    g1.k_valid = dims_.hidden;
    g1.b_codes = w13_codes_.As<uint8_t>();
    g1.b_scales = w13_scales_.As<uint8_t>();
    g1.b_shape = w13_;
    g1.n_blocks = static_cast<int32_t>((w13_.groups + groups_per_cta - 1) / groups_per_cta);
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::sm120::LaunchGemm(id, true, g1, g1.n_blocks * call.max_tiles, stream),
                                    std::string("FC1 grouped GEMM (sm120 ") + choice.name + ")"));
    cuda::sm120::GemmParams g2 = g;
    if (call.fc2_pairs != nullptr) g2.sorted_pairs = call.fc2_pairs;
    if (call.fc2_weights != nullptr) g2.topk_weights = call.fc2_weights;
    g2.a_codes = g.h_codes;
    g2.a_scales = g.h_scales;
    g2.a_stride = g.h_stride;
    g2.a_scale_stride = g.h_scale_stride;
    g2.k_valid = dims_.inter;
    g2.b_codes = w2_codes_.As<uint8_t>();
    g2.b_scales = w2_scales_.As<uint8_t>();
    g2.b_shape = w2_;
    g2.n_blocks = static_cast<int32_t>((w2_.groups + groups_per_cta - 1) / groups_per_cta);
    return CudaCheck(cuda::sm120::LaunchGemm(id, false, g2, g2.n_blocks * call.max_tiles, stream),
                     std::string("FC2 grouped GEMM (sm120 ") + choice.name + ")");
  }
  void SetReferenceWeights(cuda::ReferenceParams* p) const override {
    p->sm120_layout = true;
    p->w13_tiles = w13_codes_.As<uint8_t>();
    p->w13_scales = w13_scales_.As<uint8_t>();
    p->w13_sm120 = w13_;
    p->w2_tiles = w2_codes_.As<uint8_t>();
    p->w2_scales = w2_scales_.As<uint8_t>();
    p->w2_sm120 = w2_;
  }

 private:
  int64_t XStride() const { return cuda::sm120::OperandStride(dims_.hidden); }  // bytes
  int64_t HStride() const { return cuda::sm120::OperandStride(dims_.inter); }
  bool emulated_;
  cuda::sm120::PackedShape w13_, w2_;
  DeviceBuffer w13_codes_, w13_scales_, w2_codes_, w2_scales_;
};

// ~2 GiB of workspace at most; larger calls run in token chunks, or in pair chunks (SPEC target:
// <= 2.5 GB at T = 16384, k = 16 for Kimi-K3).
constexpr size_t kWorkspaceTarget = size_t{2} << 30;
// The target of the CudaMoe objects created from now on (SetWorkspaceTarget; 0: kWorkspaceTarget).
std::atomic<size_t> g_workspace_target{0};

cuda::EnvSwitch& PairChunks() {
  static cuda::EnvSwitch on{"MXMOE_PAIR_CHUNKS", true};  // (perf-log v18: 4.6-4.8% faster on the H200)
  return on;
}
// MXMOE_STAGE_TIMES=1 (a diagnostic, off by default): an eager call records CUDA events between
// its stages and, after each chunk (it waits for the stream), adds up the time from its first
// launch to the end of the routing, of the GEMMs and of the combine, and prints them on stderr
// once the call is done: where a decode call's time goes without a profiler (perf-log v21). The
// stream is idle when a chunk starts, so each stage's time includes its launches' latency (and
// the routing's the host's time to launch it), and the events keep PDL from overlapping kernels:
// times of the call as launched one stage after another, not of the GPU alone. Skipped while the
// stream is being captured, and for calls in pair chunks.
cuda::EnvSwitch& StageTimesOn() {
  static cuda::EnvSwitch on{"MXMOE_STAGE_TIMES", false};
  return on;
}
// Whether `stream` is being captured into a CUDA graph (where nothing may wait for the stream).
Status StreamCapturing(cudaStream_t stream, bool* capturing) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"));
  *capturing = capture != cudaStreamCaptureStatusNone;
  return Status::Ok();
}
// MXMOE_EXACT_GRID=1 (a diagnostic, off by default): the GEMMs' grids are sized by the routing's
// real tile count, read back to the host after the stream has caught up, instead of by the
// worst-case bound (pairs / tile + one partial tile per touched expert), whose CTAs past the real
// count only read the count and exit. It measures what those empty CTAs cost (perf-log v26); the
// wait for the stream makes it useless as a default. Skipped while the stream is being captured,
// and for the fused decode kernel, whose words are laid out for the bound.
cuda::EnvSwitch& ExactGridOn() {
  static cuda::EnvSwitch on{"MXMOE_EXACT_GRID", false};
  return on;
}
// Lowers *max_tiles to the routing's count in *num_tiles when ExactGridOn and the stream is not
// being captured; leaves it as it is otherwise.
Status ExactGridTiles(const int32_t* num_tiles, cudaStream_t stream, int64_t* max_tiles) {
  if (!ExactGridOn().Get()) return Status::Ok();
  bool capturing = false;
  MXMOE_RETURN_IF_ERROR(StreamCapturing(stream, &capturing));
  if (capturing) return Status::Ok();
  int32_t tiles = 0;
  MXMOE_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpyAsync(&tiles, num_tiles, sizeof(tiles), cudaMemcpyDeviceToHost, stream), "tile count copy"));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "tile count wait"));
  if (tiles < 0 || tiles > *max_tiles)
    return Status::Internal("routing produced " + Str(tiles) + " tiles, outside [0, " + Str(*max_tiles) + "]");
  *max_tiles = tiles;
  return Status::Ok();
}
class StageTimes {
 public:
  static constexpr int kMarks = 4;  // before the routing, after it, after the GEMMs, after the combine
  explicit StageTimes(cudaStream_t stream) : stream_(stream) {
    if (!StageTimesOn().Get()) return;
    bool capturing = true;
    if (!StreamCapturing(stream, &capturing).ok() || capturing) return;
    for (cudaEvent_t& e : events_)
      if (cudaEventCreate(&e) != cudaSuccess) return;
    on_ = true;
  }
  ~StageTimes() {
    for (cudaEvent_t e : events_)
      if (e != nullptr) cudaEventDestroy(e);
  }
  void Mark(int i) {
    if (on_) cudaEventRecord(events_[i], stream_);
  }
  bool on() const { return on_; }
  // After the chunk's last mark: wait for it and add the chunk's stages (a failure, a kernel's
  // included, leaves the call unprinted; the call's own error comes from its next CUDA call).
  void EndChunk() {
    if (!on_) return;
    if (cudaEventSynchronize(events_[kMarks - 1]) != cudaSuccess) failed_ = true;
    for (int i = 1; i < kMarks && !failed_; ++i) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, events_[i - 1], events_[i]) == cudaSuccess) us_[i - 1] += 1000.0 * ms;
      else failed_ = true;
    }
  }
  void Print(int64_t tokens, const std::string& plan) const {
    if (!on_ || failed_) return;
    std::fprintf(stderr, "mxmoe stages: T=%lld %s: routing %.1f us, GEMMs %.1f us, combine %.1f us, total %.1f us\n",
                 static_cast<long long>(tokens), plan.c_str(), us_[0], us_[1], us_[2], us_[0] + us_[1] + us_[2]);
  }

 private:
  cudaStream_t stream_;
  bool on_ = false, failed_ = false;
  cudaEvent_t events_[kMarks] = {};
  double us_[kMarks - 1] = {};
};

// Device staging for the upload at Create, per buffer (two alternate).
constexpr size_t kStagingTarget = size_t{256} << 20;

class CudaMoeImpl final : public CudaMoe {
 public:
  explicit CudaMoeImpl(std::unique_ptr<KernelPath> path) : path_(std::move(path)) {}
  ~CudaMoeImpl() override {
    DeviceGuard guard;
    if (!guard.Enter(device_).ok()) return;
    path_->Free();
    for (DeviceBuffer* b : {&params_, &gate_bias_, &up_bias_, &errors_}) b->Free();
  }

  Status Init(const ExpertSet& experts, int device);

  // The larger of what the call needs in token chunks and in pair chunks (whichever is on when it
  // runs), and of the unfused reference's. Non-decreasing in max_tokens, as each of the three is:
  // a workspace sized for T serves every call of fewer tokens (CheckCall asks for this size).
  size_t WorkspaceSize(int64_t max_tokens) const override {
    if (max_tokens <= 0) return 0;
    size_t need = std::max(PlanRun(std::min(max_tokens, max_chunk_run_)).total,
                           PlanRef(std::min(max_tokens, max_chunk_ref_)).total);
    if (max_tokens > max_chunk_run_) need = std::max(need, PairWorkspace(max_tokens));
    return need;
  }
  std::string Plan(int64_t num_tokens) const override {
    num_tokens = std::max<int64_t>(1, num_tokens);
    if (UsesPairChunks(num_tokens)) {
      const PairLayout l = PlanPairsFor(num_tokens);
      const cuda::LaunchChoice choice = cuda::ChooseLaunch(dims_, l.tokens, l.tokens);
      int64_t ranges = 0;
      for (int64_t t0 = 0; t0 < num_tokens; t0 += l.tokens) ranges += RangesOf(std::min(l.tokens, num_tokens - t0) * dims_.top_k, l);
      return path_->RunName(path_->Choose(choice), /*fused=*/false) + " x" + std::to_string(ranges) + " pair chunks";
    }
    const cuda::LaunchChoice choice = cuda::ChooseLaunch(dims_, num_tokens, max_chunk_run_);
    const GemmChoice gemm = path_->Choose(choice);
    std::string plan = path_->RunName(gemm, path_->FusesDecode(gemm, choice.chunk_tokens * dims_.top_k));
    if (choice.num_chunks > 1) plan += " x" + std::to_string(choice.num_chunks) + " chunks";
    return plan;
  }
  Status Run(const MoeInput& in, const MoeOutput& out, void* workspace, size_t workspace_bytes,
             void* stream) const override;
  Status RunReference(const MoeInput& in, const MoeOutput& out, void* workspace,
                      size_t workspace_bytes, void* stream) const override;
  const ExpertSet& Layout() const override { return layout_; }
  int Device() const override { return device_; }
  const char* Kernels() const override { return path_->Name(); }
  Status ReadErrors(int64_t* bad_expert_ids) const override;
  Status ResetErrors() const override;
  void SetDebugCheck(bool on) override { debug_check_ = on; }
  bool DebugCheck() const override { return debug_check_; }

 private:
  class DebugScope;
  struct RunLayout {
    size_t xq, h, y, decode;
    RoutingLayout route;
    size_t total;
  };
  struct RefLayout {
    size_t xd, hd, y;
    size_t total;
  };
  // Pair chunks: the routing of `tokens` tokens (all their pairs) and the buffers of one range of
  // at most `pairs` sorted positions, and the fp32 sums of the ranges before.
  struct PairLayout {
    int64_t tokens = 0, pairs = 0;
    size_t xq, pos_of_pair, sorted_weights;
    RoutingLayout route;
    size_t iota, h, y, acc;
    size_t total;
  };
  // with_decode: the fused decode kernel's buffers too (always, but where the chunk size is derived
  // from the per-token growth: they stop growing at kDecodeMaxPairs).
  RunLayout PlanRun(int64_t chunk, bool with_decode = true) const {
    const size_t pairs = static_cast<size_t>(chunk * dims_.top_k);
    const size_t experts = static_cast<size_t>(dims_.num_local + 1);
    Arena a;
    RunLayout l;
    l.xq = a.Take(path_->XqBytes(chunk));
    l.h = a.Take(path_->HBytes(static_cast<int64_t>(pairs)));
    l.y = a.Take(pairs * dims_.hidden * 4);
    l.decode = a.Take(with_decode ? path_->DecodeBytes(static_cast<int64_t>(pairs)) : 0);
    l.route.TakeSort(a, pairs);
    l.route.TakeTiles(a, experts, pairs, sort_temp_bytes_);
    l.total = a.Take(0);
    return l;
  }
  PairLayout PlanPairs(int64_t tokens, int64_t pairs) const {
    const size_t all = static_cast<size_t>(tokens * dims_.top_k);
    const size_t experts = static_cast<size_t>(dims_.num_local + 1);
    Arena a;
    PairLayout l;
    l.tokens = tokens;
    l.pairs = pairs;
    l.xq = a.Take(path_->XqBytes(tokens));
    l.route.TakeSort(a, all);
    l.pos_of_pair = a.Take(all * 4);
    l.sorted_weights = a.Take(all * 4);
    l.route.TakeTiles(a, experts, static_cast<size_t>(pairs), pair_sort_temp_bytes_);
    l.acc = a.Take(static_cast<size_t>(tokens * dims_.hidden) * 4);
    l.iota = a.Take(static_cast<size_t>(pairs) * 4);
    l.h = a.Take(path_->HBytes(pairs));
    l.y = a.Take(static_cast<size_t>(pairs * dims_.hidden) * 4);
    l.total = a.Take(0);
    return l;
  }
  // A call of num_tokens in pair chunks: outer chunks of at most max_outer_ tokens, each routed
  // once, and ranges of as many pairs as the rest of the target holds (at least kMinChunkPairs,
  // at most all of the outer chunk's). A pair takes pair_bytes_ exactly, and the four buffers sized
  // by pairs round their starts up by less than 256 bytes each, so the plan stays within the target
  // whenever the ranges are shorter than the outer chunk's pairs.
  static constexpr int64_t kMinChunkPairs = 256;
  PairLayout PlanPairsFor(int64_t num_tokens) const {
    const int64_t tokens = std::min(num_tokens, max_outer_);
    const size_t fixed = PlanPairs(tokens, 0).total + 4 * 256;
    const int64_t fit = fixed < workspace_target_ ? static_cast<int64_t>((workspace_target_ - fixed) / pair_bytes_) : 0;
    const int64_t all = tokens * dims_.top_k;
    return PlanPairs(tokens, std::clamp<int64_t>(fit, std::min(kMinChunkPairs, all), all));
  }
  // What WorkspaceSize counts for pair chunks: the plan's size, or the target when the ranges are
  // shorter than the outer chunk's pairs (the plan is then within the target, but its size falls
  // as num_tokens grows: more per-token buffers, shorter ranges).
  size_t PairWorkspace(int64_t num_tokens) const {
    const PairLayout l = PlanPairsFor(num_tokens);
    return l.pairs < l.tokens * dims_.top_k ? std::max(l.total, workspace_target_) : l.total;
  }
  // The ranges an outer chunk of `pairs` pairs runs in (RunPairChunks, Plan).
  static int64_t RangesOf(int64_t pairs, const PairLayout& l) { return (pairs + l.pairs - 1) / l.pairs; }
  bool UsesPairChunks(int64_t num_tokens) const { return PairChunks().Get() && num_tokens > max_chunk_run_; }
  Status RunPairChunks(const MoeInput& in, const MoeOutput& out, uint8_t* ws, cudaStream_t stream) const;
  // What both chunkings give the GEMMs and the input quantization alike: the layer's parameters,
  // and for tokens [t0, t0 + tc) the quantization into `call`'s xq and the routing keys into keys
  // (with the pair ids into pair_ids unless null).
  GemmCall LayerCall() const;
  cuda::PrepareParams PrepareOf(const MoeInput& in, const GemmCall& call, int64_t t0, int64_t tc, int32_t* keys,
                                int32_t* pair_ids) const;
  RefLayout PlanRef(int64_t chunk) const {
    const size_t pairs = static_cast<size_t>(chunk * dims_.top_k);
    Arena a;
    RefLayout l;
    l.xd = a.Take(chunk * dims_.hidden * 4);
    l.hd = a.Take(pairs * dims_.inter * 4);
    l.y = a.Take(pairs * dims_.hidden * 4);
    l.total = a.Take(0);
    return l;
  }
  Status CheckCall(const MoeInput& in, const MoeOutput& out, void* workspace, size_t bytes) const;
  Status CheckDevicePointer(const void* p, const char* name) const;
  Status Upload(const ExpertSet& experts);

  ExpertSet layout_;
  int device_ = 0;
  cuda::LayerDims dims_;
  int64_t first_expert_ = 0;
  std::unique_ptr<KernelPath> path_;
  DeviceBuffer params_, gate_bias_, up_bias_;
  bool has_bias_ = false;
  int key_bits_ = 1;
  size_t sort_temp_bytes_ = 0;
  int64_t max_chunk_run_ = 1, max_chunk_ref_ = 1;
  size_t workspace_target_ = kWorkspaceTarget;
  int64_t max_outer_ = 1;  // pair chunks: tokens routed at once
  size_t pair_sort_temp_bytes_ = 0, pair_bytes_ = 1;
  DeviceBuffer errors_;  // the error word: one unsigned long long, bad expert ids seen
  bool debug_check_ = false;
  bool pageable_access_ = false;  // the device reads pageable host memory (HMM / ATS)
};

Status CudaMoeImpl::Init(const ExpertSet& experts, int device) {
  device_ = device;
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device));
  layout_.shape = experts.shape;
  layout_.slice = experts.slice;
  layout_.activation = experts.activation;
  dims_.hidden = experts.shape.hidden;
  dims_.inter = experts.LocalIntermediate();
  dims_.top_k = experts.shape.top_k;
  dims_.num_experts = experts.shape.num_experts;
  dims_.num_local = experts.NumLocalExperts();
  first_expert_ = experts.FirstExpert();
  key_bits_ = 0;
  for (int64_t v = dims_.num_local; v > 0; v >>= 1) ++key_bits_;

  MXMOE_RETURN_IF_ERROR(Upload(experts));
  MXMOE_RETURN_IF_ERROR(CudaCheck(path_->PrepareKernels(), std::string("configuring the GEMM kernels (") + path_->Name() + ")"));
  MXMOE_RETURN_IF_ERROR(errors_.Allocate(sizeof(unsigned long long), "the error word"));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemset(errors_.ptr, 0, errors_.bytes), "clearing the error word"));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaDeviceSynchronize(), "clearing the error word"));
  debug_check_ = cuda::EnvFlagIs("MXMOE_DEBUG_CHECK", "1");
  int pageable = 0;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device),
                                  "cudaDeviceGetAttribute(PageableMemoryAccess)"));
  pageable_access_ = pageable != 0;

  // Chunk bounds from the per-token growth of each layout (the sort's scratch is sized for the
  // largest chunk, found with a first plan without it).
  if (const size_t t = g_workspace_target.load(); t > 0) workspace_target_ = t;
  auto per_token = [](size_t one, size_t two) { return std::max<size_t>(1, two - one); };
  const size_t run_token = per_token(PlanRun(1, false).total, PlanRun(2, false).total);
  max_chunk_run_ = std::max<int64_t>(1, static_cast<int64_t>(workspace_target_ / run_token));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::SortTempBytes(max_chunk_run_ * dims_.top_k, &sort_temp_bytes_),
                                  "sizing the routing sort"));
  const size_t ref_token = per_token(PlanRef(1).total, PlanRef(2).total);
  max_chunk_ref_ = std::max<int64_t>(1, static_cast<int64_t>(workspace_target_ / ref_token));
  // Pair chunks: the per-token buffers (routing, xq, the fp32 sums) take about half the target (the
  // plans' difference, as above, may miss a few bytes to their 256-byte rounding); a pair's buffers
  // are counted exactly, which PlanPairsFor's bound on the plan relies on.
  const size_t pair_token = per_token(PlanPairs(1, 0).total, PlanPairs(2, 0).total);
  pair_bytes_ = 8 + 4 + path_->HBytes(1) + static_cast<size_t>(dims_.hidden) * 4;  // tiles, FC2's ids, h, y
  max_outer_ = std::max<int64_t>(1, static_cast<int64_t>(workspace_target_ / 2 / pair_token));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::SortTempBytes(max_outer_ * dims_.top_k, &pair_sort_temp_bytes_),
                                  "sizing the routing sort"));
  return Status::Ok();
}

Status CudaMoeImpl::Upload(const ExpertSet& experts) {
  const int64_t n = dims_.num_local, k = dims_.hidden, i = dims_.inter;
  MXMOE_RETURN_IF_ERROR(path_->Allocate(dims_));

  // Per-expert parameters; the scale shift keeps every stored exponent finite (StoredScale).
  std::vector<ExpertParams> params(n);
  for (int64_t e = 0; e < n; ++e) {
    const ExpertWeights& w = experts.experts[e];
    ExpertParams& p = params[e];
    p.act = experts.activation.ForExpert(e);
    p.fc1_shift = cuda::ScaleShiftFor(MaxFiniteScale(w.w3.scales, MaxFiniteScale(w.w1.scales, 0)));
    p.fc2_shift = cuda::ScaleShiftFor(MaxFiniteScale(w.w2.scales, 0));
    p.fc1_scale = std::ldexp(1.0f, p.fc1_shift);
    p.fc2_scale = std::ldexp(1.0f, p.fc2_shift);
    p.has_gate_bias = !w.gate_bias.empty();
    p.has_up_bias = !w.up_bias.empty();
    has_bias_ = has_bias_ || p.has_gate_bias || p.has_up_bias;
  }
  MXMOE_RETURN_IF_ERROR(params_.Allocate(n * sizeof(ExpertParams), "expert parameters"));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemcpy(params_.ptr, params.data(), n * sizeof(ExpertParams),
                                             cudaMemcpyHostToDevice), "uploading expert parameters"));
  if (has_bias_) {
    std::vector<float> gate(n * i, 0.0f), up(n * i, 0.0f);
    for (int64_t e = 0; e < n; ++e) {
      const ExpertWeights& w = experts.experts[e];
      if (!w.gate_bias.empty()) std::copy(w.gate_bias.begin(), w.gate_bias.end(), gate.begin() + e * i);
      if (!w.up_bias.empty()) std::copy(w.up_bias.begin(), w.up_bias.end(), up.begin() + e * i);
    }
    MXMOE_RETURN_IF_ERROR(gate_bias_.Allocate(gate.size() * 4, "gate biases"));
    MXMOE_RETURN_IF_ERROR(up_bias_.Allocate(up.size() * 4, "up biases"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemcpy(gate_bias_.ptr, gate.data(), gate.size() * 4, cudaMemcpyHostToDevice), "uploading gate biases"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemcpy(up_bias_.ptr, up.data(), up.size() * 4, cudaMemcpyHostToDevice), "uploading up biases"));
  }

  // The checkpoint tensors go to a device staging buffer as they are, a batch of experts at a
  // time, and are repacked there; two buffers alternate so a batch's copies overlap the
  // previous batch's repack.
  const size_t sizes[6] = {static_cast<size_t>(i * k / 2), static_cast<size_t>(i * k / kMxBlock),
                           static_cast<size_t>(i * k / 2), static_cast<size_t>(i * k / kMxBlock),
                           static_cast<size_t>(k * i / 2), static_cast<size_t>(k * i / kMxBlock)};
  size_t per_expert = 0;
  for (size_t s : sizes) per_expert += (s + 255) / 256 * 256;
  const int64_t batch = std::clamp<int64_t>(static_cast<int64_t>(kStagingTarget / per_expert), 1, n);
  DeviceBuffer staging[2], sources[2];
  cudaStream_t stream = nullptr;
  cudaEvent_t done[2] = {nullptr, nullptr};
  auto cleanup = [&] {
    if (stream) cudaStreamSynchronize(stream);
    for (int b = 0; b < 2; ++b) {
      staging[b].Free();
      sources[b].Free();
      if (done[b]) cudaEventDestroy(done[b]);
    }
    if (stream) cudaStreamDestroy(stream);
  };
  Status st = CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating the upload stream");
  for (int b = 0; st.ok() && b < 2; ++b) {
    st = staging[b].Allocate(batch * per_expert, "weight staging");
    if (st.ok()) st = sources[b].Allocate(batch * sizeof(cuda::ExpertSource), "weight staging");
    if (st.ok()) st = CudaCheck(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming), "cudaEventCreate");
  }
  std::vector<cuda::ExpertSource> host_sources(batch);
  for (int64_t e0 = 0, round = 0; st.ok() && e0 < n; e0 += batch, ++round) {
    const int buf = static_cast<int>(round % 2);
    const int64_t count = std::min(batch, n - e0);
    if (round >= 2) st = CudaCheck(cudaEventSynchronize(done[buf]), "weight repack");
    uint8_t* base = staging[buf].As<uint8_t>();
    for (int64_t j = 0; st.ok() && j < count; ++j) {
      const ExpertWeights& w = experts.experts[e0 + j];
      const uint8_t* host[6] = {w.w1.packed.data(), w.w1.scales.data(), w.w3.packed.data(),
                                w.w3.scales.data(), w.w2.packed.data(), w.w2.scales.data()};
      uint8_t* dev[6];
      uint8_t* at = base + j * per_expert;
      for (int t = 0; st.ok() && t < 6; ++t) {
        dev[t] = at;
        st = CudaCheck(cudaMemcpyAsync(at, host[t], sizes[t], cudaMemcpyHostToDevice, stream),
                       "uploading expert " + Str(first_expert_ + e0 + j));
        at += (sizes[t] + 255) / 256 * 256;
      }
      host_sources[j] = {dev[0], dev[1], dev[2], dev[3], dev[4], dev[5]};
    }
    if (st.ok())
      st = CudaCheck(cudaMemcpyAsync(sources[buf].ptr, host_sources.data(), count * sizeof(cuda::ExpertSource),
                                     cudaMemcpyHostToDevice, stream), "uploading staging pointers");
    // The pageable source above is consumed before cudaMemcpyAsync returns, so host_sources
    // can be refilled by the next round.
    if (st.ok())
      st = CudaCheck(path_->Repack(sources[buf].As<cuda::ExpertSource>(), static_cast<int>(count), e0,
                                   params_.As<ExpertParams>(), stream),
                     std::string("weight repack kernel (") + path_->Name() + ")");
    if (st.ok()) st = CudaCheck(cudaEventRecord(done[buf], stream), "cudaEventRecord");
  }
  if (st.ok()) st = CudaCheck(cudaStreamSynchronize(stream), "weight upload");
  cleanup();
  return st;
}

Status CudaMoeImpl::CheckCall(const MoeInput& in, const MoeOutput& out, void* workspace,
                              size_t bytes) const {
  const size_t need = WorkspaceSize(in.num_tokens);
  if (workspace == nullptr || bytes < need)
    return Status::Invalid("workspace: " + Str(static_cast<int64_t>(bytes)) + " bytes" +
                           (workspace == nullptr ? " (null)" : "") + " given, WorkspaceSize(" +
                           Str(in.num_tokens) + ") = " + Str(static_cast<int64_t>(need)) + " needed");
  if (!Aligned(workspace, 256)) return Status::Invalid("workspace: must be 256-byte aligned");
  if (in.x_bf16 && !Aligned(in.x_bf16, 16)) return Status::Invalid("x_bf16: must be 16-byte aligned");
  if (in.x_e4m3 && !Aligned(in.x_e4m3, 16)) return Status::Invalid("x_e4m3: must be 16-byte aligned");
  if (!Aligned(in.topk_ids, 4) || !Aligned(in.topk_weights, 4))
    return Status::Invalid("topk_ids / topk_weights: must be 4-byte aligned");
  if (!Aligned(out.data, out.dtype == OutputDType::kF32 ? 16 : 8))
    return Status::Invalid("output: must be 16-byte (f32) or 8-byte (bf16) aligned");
  const std::pair<const void*, const char*> pointers[] = {
      {in.x_bf16, "x_bf16"},     {in.x_e4m3, "x_e4m3"},     {in.x_scale, "x_scale"}, {in.topk_ids, "topk_ids"},
      {in.topk_weights, "topk_weights"}, {out.data, "output"}, {workspace, "workspace"}};
  for (const auto& [p, name] : pointers)
    if (p != nullptr) MXMOE_RETURN_IF_ERROR(CheckDevicePointer(p, name));
  return Status::Ok();
}

// Whether the kernels on device_ can dereference p. cudaPointerGetAttributes enqueues nothing and
// does not synchronize, so the check is allowed while the caller's stream is being captured.
Status CudaMoeImpl::CheckDevicePointer(const void* p, const char* name) const {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e == cudaErrorInvalidValue) {
    cudaGetLastError();  // a pointer the runtime does not know: plain host memory
    a.type = cudaMemoryTypeUnregistered;
  } else if (e != cudaSuccess) {
    return CudaCheck(e, std::string("cudaPointerGetAttributes(") + name + ")");
  }
  const std::string where = " (this CudaMoe runs on device " + Str(device_) + ")";
  switch (a.type) {
    case cudaMemoryTypeDevice:
      if (a.device != device_)
        return Status::Invalid(std::string(name) + ": device memory of device " + Str(a.device) + where);
      return Status::Ok();
    case cudaMemoryTypeManaged:
      return Status::Ok();
    case cudaMemoryTypeHost:  // pinned: readable by the device when mapped into its address space
      if (a.devicePointer == nullptr)
        return Status::Invalid(std::string(name) + ": pinned host memory not mapped for the device" + where);
      return Status::Ok();
    default:  // unregistered host memory
      if (pageable_access_) return Status::Ok();
      return Status::Invalid(std::string(name) + ": host memory; the CUDA backend needs device memory "
                             "(or managed / mapped pinned memory)" + where);
  }
}

// Debug mode around one call: the error word before and after, the stream synchronized.
class CudaMoeImpl::DebugScope {
 public:
  DebugScope(const CudaMoeImpl& moe, cudaStream_t stream, const char* what)
      : moe_(moe), stream_(stream), what_(what) {}
  Status Begin() {
    if (!moe_.debug_check_) return Status::Ok();
    bool capturing = false;
    MXMOE_RETURN_IF_ERROR(StreamCapturing(stream_, &capturing));
    if (capturing) return Status::Ok();  // no synchronization in a capture
    active_ = true;
    return Read(&before_, " before the call");
  }
  Status End() {
    if (!active_) return Status::Ok();
    unsigned long long after = 0;
    MXMOE_RETURN_IF_ERROR(Read(&after, ""));
    if (after > before_)
      return Status::Invalid("topk_ids: " + Str(static_cast<int64_t>(after - before_)) +
                             " expert ids outside [-1, " + Str(moe_.dims_.num_experts) + ") in this " + what_ +
                             " call (skipped like -1; found by the debug check, MXMOE_DEBUG_CHECK)");
    return Status::Ok();
  }

 private:
  Status Read(unsigned long long* v, const char* when) {
    const std::string label = std::string(what_) + " (debug check" + when + ")";
    MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(v, moe_.errors_.ptr, sizeof(*v), cudaMemcpyDeviceToHost, stream_), label));
    return CudaCheck(cudaStreamSynchronize(stream_), label);
  }
  const CudaMoeImpl& moe_;
  cudaStream_t stream_;
  const char* what_;
  bool active_ = false;
  unsigned long long before_ = 0;
};

Status CudaMoeImpl::ReadErrors(int64_t* bad_expert_ids) const {
  if (bad_expert_ids == nullptr) return Status::Invalid("ReadErrors: bad_expert_ids is null");
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device_));
  unsigned long long v = 0;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemcpy(&v, errors_.ptr, sizeof(v), cudaMemcpyDeviceToHost), "reading the error word"));
  *bad_expert_ids = static_cast<int64_t>(v);
  return Status::Ok();
}

Status CudaMoeImpl::ResetErrors() const {
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device_));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemsetAsync(errors_.ptr, 0, errors_.bytes, nullptr), "clearing the error word"));
  return CudaCheck(cudaStreamSynchronize(nullptr), "clearing the error word");
}

Status CudaMoeImpl::Run(const MoeInput& in, const MoeOutput& out, void* workspace,
                        size_t workspace_bytes, void* stream_ptr) const {
  MXMOE_RETURN_IF_ERROR(ValidateMoeCall(layout_, in, out, /*check_ids=*/false));
  const int64_t t_count = in.num_tokens;
  if (t_count == 0) return Status::Ok();
  MXMOE_RETURN_IF_ERROR(CheckCall(in, out, workspace, workspace_bytes));
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device_));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  DebugScope debug(*this, stream, "Run");
  MXMOE_RETURN_IF_ERROR(debug.Begin());
  // Decode calls launch FC1 and the combine with PDL unless MXMOE_PDL says otherwise (perf-log v23).
  const cuda::ScopedPdlDefault pdl(t_count * dims_.top_k <= cuda::kDecodeMaxPairs ? cuda::kPdlDecodeSites : 0u);
  if (UsesPairChunks(t_count)) {
    MXMOE_RETURN_IF_ERROR(RunPairChunks(in, out, static_cast<uint8_t*>(workspace), stream));
    return debug.End();
  }
  const int64_t k_dim = dims_.hidden, top_k = dims_.top_k, n_local = dims_.num_local;
  const cuda::LaunchChoice choice = cuda::ChooseLaunch(dims_, t_count, max_chunk_run_);
  const GemmChoice gemm = path_->Choose(choice);
  const RunLayout l = PlanRun(choice.chunk_tokens);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  auto at = [ws](size_t off) { return ws + off; };
  const auto [keys_in, keys_out, vals_in, vals_out, offsets, tile_offsets, tiles, num_tiles] = RoutingIn(l.route, ws);
  float* y = reinterpret_cast<float*>(at(l.y));
  const size_t out_elt = OutputDTypeSize(out.dtype);
  GemmCall call = LayerCall();
  call.chunk_tokens = choice.chunk_tokens;
  call.pair_capacity = choice.chunk_tokens * top_k;
  call.xq = at(l.xq);
  call.h = at(l.h);
  call.y = y;
  call.sorted_pairs = vals_out;
  call.expert_offsets = offsets;
  call.tiles = tiles;
  call.num_tiles = num_tiles;
  call.decode_ws = at(l.decode);
  // (Every chunk then holds at most kDecodeMaxPairs <= kFusedRoutePairs pairs: its routing is the
  // fused launch, the only one that clears the kernel's words.)
  const bool fuse = path_->FusesDecode(gemm, choice.chunk_tokens * top_k);
  StageTimes stage_times(stream);

  for (int64_t t0 = 0; t0 < t_count; t0 += choice.chunk_tokens) {
    const int64_t tc = std::min(choice.chunk_tokens, t_count - t0);
    const int64_t pairs = tc * top_k;
    stage_times.Mark(0);
    // Small calls sort, offset and tile in one kernel that numbers the pairs itself; the smallest
    // do it in the quantization's launch, from the ids (perf-log v12).
    const bool small_routing = pairs <= cuda::kSmallRoutePairs;
    const bool fused_routing = pairs <= cuda::kFusedRoutePairs;
    cuda::PrepareParams pp = PrepareOf(in, call, t0, tc, keys_in, small_routing ? nullptr : vals_in);
    cuda::RouteSmallParams rp;
    rp.keys = keys_in;
    rp.n = static_cast<int32_t>(pairs);
    rp.num_local = static_cast<int32_t>(n_local);
    rp.key_bits = key_bits_;
    rp.sorted_pairs = vals_out;
    rp.offsets = offsets;
    rp.block_n = gemm.tile_tokens;
    rp.tile_offsets = tile_offsets;
    rp.tiles = tiles;
    rp.num_tiles = num_tiles;
    rp.warp_max = cuda::WarpRouteEnabled() ? cuda::kWarpRoutePairs : 0;
    // Tiles <= pairs / tile + one partial tile per touched expert.
    call.max_tiles = std::min(pairs, (pairs + gemm.tile_tokens - 1) / gemm.tile_tokens + std::min(n_local, pairs));
    call.fused_decode = call.fold_combine = false;
    call.topk_ids = in.topk_ids + t0 * top_k;
    call.tokens = tc;
    call.first_expert = first_expert_;
    call.out = static_cast<uint8_t*>(out.data) + t0 * k_dim * out_elt;
    call.out_dtype = out.dtype;
    if (fuse) {
      path_->PlanFusedDecode(pairs, &call, &pp);
    } else if (fused_routing) {
      path_->PlanFoldedCombine(gemm, &call, &pp);
    }
    if (fused_routing) {
      MXMOE_RETURN_IF_ERROR(
          CudaCheck(cuda::LaunchPrepareAndRoute(pp, rp, stream), "input quantization / routing kernel (small calls)"));
    } else if (small_routing) {
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchPrepare(pp, stream), "input quantization / routing keys kernel"));
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchRouteSmall(rp, stream), "routing kernel (small calls)"));
    } else {
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchPrepare(pp, stream), "input quantization / routing keys kernel"));
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::SortPairs(at(l.route.sort_temp), sort_temp_bytes_, keys_in, keys_out,
                                                      vals_in, vals_out, pairs, key_bits_, stream),
                                      "routing sort"));
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchOffsetsAndTiles(keys_out, pairs, static_cast<int32_t>(n_local),
                                                                  gemm.tile_tokens, offsets, tile_offsets, tiles,
                                                                  num_tiles, stream),
                                      "routing offsets kernel"));
    }
    call.topk_weights = in.topk_weights + t0 * top_k;
    if (!fuse) MXMOE_RETURN_IF_ERROR(ExactGridTiles(num_tiles, stream, &call.max_tiles));
    // (With MXMOE_EXACT_GRID a call of no tile launches no FC2 CTA to fold the combine: the kernel runs.)
    if (call.max_tiles == 0 && !call.fused_decode) call.fold_combine = false;
    stage_times.Mark(1);
    MXMOE_RETURN_IF_ERROR(path_->LaunchGemms(gemm, call, stream));
    stage_times.Mark(2);
    if (!call.fold_combine) {
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchCombine(y, call.topk_ids, tc, static_cast<int32_t>(top_k), k_dim,
                                                          first_expert_, static_cast<int32_t>(n_local), out.dtype,
                                                          call.out, stream),
                                      "combine kernel"));
    }
    stage_times.Mark(3);
    stage_times.EndChunk();
  }
  if (stage_times.on()) {
    stage_times.Print(t_count, Plan(t_count) + " (K=" + Str(dims_.hidden) + " I=" + Str(dims_.inter) +
                                   " E=" + Str(dims_.num_experts) + ")");
  }
  return debug.End();
}

GemmCall CudaMoeImpl::LayerCall() const {
  GemmCall call;
  call.top_k = static_cast<int32_t>(dims_.top_k);
  call.experts = params_.As<ExpertParams>();
  call.act = layout_.activation.type;
  call.gate_bias = gate_bias_.As<float>();
  call.up_bias = up_bias_.As<float>();
  return call;
}

cuda::PrepareParams CudaMoeImpl::PrepareOf(const MoeInput& in, const GemmCall& call, int64_t t0, int64_t tc,
                                           int32_t* keys, int32_t* pair_ids) const {
  const int64_t k_dim = dims_.hidden, top_k = dims_.top_k;
  cuda::PrepareParams pp;
  pp.num_tokens = tc;
  pp.hidden = k_dim;
  if (in.x_bf16) pp.x_bf16 = in.x_bf16 + t0 * k_dim;
  if (in.x_e4m3) pp.x_e4m3 = in.x_e4m3 + t0 * k_dim;
  if (in.x_scale) pp.x_scale = in.x_scale + t0 * (k_dim / kMxBlock);
  path_->SetQuantOutput(call, &pp);
  pp.topk_ids = in.topk_ids + t0 * top_k;
  pp.top_k = static_cast<int32_t>(top_k);
  pp.first_expert = first_expert_;
  pp.num_local = static_cast<int32_t>(dims_.num_local);
  pp.keys = keys;
  pp.pair_ids = pair_ids;
  pp.num_experts = dims_.num_experts;
  pp.bad_ids = errors_.As<unsigned long long>();
  return pp;
}

// A call in pair chunks (PlanPairsFor): per outer chunk of tokens, the input quantization and one
// sort of all its pairs, then per range of sorted positions the tile list of the range, the GEMMs
// on it (positions relative to the range: h and y hold its rows; FC2 takes the positions as its
// pair ids, LaunchPairPositions) and a combine that adds the range's slots to the fp32 sums
// (LaunchCombineRange). Every launch is asynchronous and sized on
// the host from the call's shape, so the call can be captured in a CUDA graph; ranges past the
// rank's pairs find no tiles.
Status CudaMoeImpl::RunPairChunks(const MoeInput& in, const MoeOutput& out, uint8_t* ws, cudaStream_t stream) const {
  const int64_t t_count = in.num_tokens, k_dim = dims_.hidden, top_k = dims_.top_k, n_local = dims_.num_local;
  const PairLayout l = PlanPairsFor(t_count);
  // The configs for the density of a whole outer chunk: a range holds whole runs of experts.
  const GemmChoice gemm = path_->Choose(cuda::ChooseLaunch(dims_, l.tokens, l.tokens));
  auto at = [ws](size_t off) { return ws + off; };
  const auto [keys_in, keys_out, vals_in, vals_out, offsets, tile_offsets, tiles, num_tiles] = RoutingIn(l.route, ws);
  int32_t* pos_of_pair = reinterpret_cast<int32_t*>(at(l.pos_of_pair));
  float* sorted_weights = reinterpret_cast<float*>(at(l.sorted_weights));
  const size_t out_elt = OutputDTypeSize(out.dtype);
  GemmCall call = LayerCall();
  call.chunk_tokens = l.tokens;
  call.pair_capacity = l.pairs;
  call.xq = at(l.xq);
  call.h = at(l.h);
  call.y = reinterpret_cast<float*>(at(l.y));
  call.fc2_pairs = reinterpret_cast<int32_t*>(at(l.iota));
  call.expert_offsets = offsets;
  call.tiles = tiles;
  call.num_tiles = num_tiles;

  for (int64_t t0 = 0; t0 < t_count; t0 += l.tokens) {
    const int64_t tc = std::min(l.tokens, t_count - t0), pairs = tc * top_k;
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchPrepare(PrepareOf(in, call, t0, tc, keys_in, vals_in), stream),
                                    "input quantization / routing keys kernel"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::SortPairs(at(l.route.sort_temp), pair_sort_temp_bytes_, keys_in,
                                                    keys_out, vals_in, vals_out, pairs, key_bits_, stream),
                                    "routing sort"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchPairPositions(vals_out, in.topk_weights + t0 * top_k, pairs,
                                                              pos_of_pair, sorted_weights,
                                                              reinterpret_cast<int32_t*>(at(l.iota)),
                                                              t0 == 0 ? l.pairs : 0, stream),
                                    "routing positions kernel"));
    // As few ranges as the capacity allows, of equal length (no short last range: each range costs
    // a pass of the combine over the sums of all the chunk's tokens). (FC1 reads no router weights,
    // and FC2 reads call.fc2_weights: call.topk_weights stays unset.)
    const int64_t ranges = RangesOf(pairs, l);
    const int64_t step = (pairs + ranges - 1) / ranges;
    for (int64_t p0 = 0; p0 < pairs; p0 += step) {
      const int64_t n = std::min(step, pairs - p0);
      // The range's own offsets and tiles, from its stretch of the sorted keys (skipped slots sort
      // last, so a range past the rank's pairs has none).
      MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchOffsetsAndTiles(keys_out + p0, n, static_cast<int32_t>(n_local),
                                                                  gemm.tile_tokens, offsets, tile_offsets, tiles,
                                                                  num_tiles, stream),
                                      "routing offsets kernel"));
      call.sorted_pairs = vals_out + p0;
      call.fc2_weights = sorted_weights + p0;
      call.max_tiles = std::min(n, (n + gemm.tile_tokens - 1) / gemm.tile_tokens + std::min(n_local, n));
      MXMOE_RETURN_IF_ERROR(ExactGridTiles(num_tiles, stream, &call.max_tiles));
      MXMOE_RETURN_IF_ERROR(path_->LaunchGemms(gemm, call, stream));
      cuda::CombineRange range;
      range.pos_begin = p0;
      range.pos_end = p0 + n;
      range.first = p0 == 0;
      range.last = p0 + n == pairs;
      range.acc = reinterpret_cast<float*>(at(l.acc));
      range.local_pairs = offsets + n_local;
      MXMOE_RETURN_IF_ERROR(CudaCheck(
          cuda::LaunchCombineRange(call.y, pos_of_pair, in.topk_ids + t0 * top_k, tc, static_cast<int32_t>(top_k),
                                   k_dim, first_expert_, static_cast<int32_t>(n_local), range, out.dtype,
                                   static_cast<uint8_t*>(out.data) + t0 * k_dim * out_elt, stream),
          "combine kernel"));
    }
  }
  return Status::Ok();
}

Status CudaMoeImpl::RunReference(const MoeInput& in, const MoeOutput& out, void* workspace,
                                 size_t workspace_bytes, void* stream_ptr) const {
  MXMOE_RETURN_IF_ERROR(ValidateMoeCall(layout_, in, out, /*check_ids=*/false));
  const int64_t t_count = in.num_tokens;
  if (t_count == 0) return Status::Ok();
  MXMOE_RETURN_IF_ERROR(CheckCall(in, out, workspace, workspace_bytes));
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device_));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  DebugScope debug(*this, stream, "RunReference");
  MXMOE_RETURN_IF_ERROR(debug.Begin());
  const int64_t k_dim = dims_.hidden, top_k = dims_.top_k;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchCountBadIds(in.topk_ids, t_count * top_k, dims_.num_experts,
                                                          errors_.As<unsigned long long>(), stream),
                                  "counting bad expert ids"));
  const int64_t chunk = std::min(t_count, max_chunk_ref_);
  const RefLayout l = PlanRef(chunk);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const size_t out_elt = OutputDTypeSize(out.dtype);
  for (int64_t t0 = 0; t0 < t_count; t0 += chunk) {
    const int64_t tc = std::min(chunk, t_count - t0);
    cuda::ReferenceParams p;
    p.num_tokens = tc;
    p.hidden = k_dim;
    p.inter = dims_.inter;
    p.top_k = static_cast<int32_t>(top_k);
    p.first_expert = first_expert_;
    p.num_local = static_cast<int32_t>(dims_.num_local);
    if (in.x_bf16) p.x_bf16 = in.x_bf16 + t0 * k_dim;
    if (in.x_e4m3) p.x_e4m3 = in.x_e4m3 + t0 * k_dim;
    if (in.x_scale) p.x_scale = in.x_scale + t0 * (k_dim / kMxBlock);
    p.topk_ids = in.topk_ids + t0 * top_k;
    p.topk_weights = in.topk_weights + t0 * top_k;
    path_->SetReferenceWeights(&p);
    p.experts = params_.As<ExpertParams>();
    p.act = layout_.activation.type;
    p.gate_bias = gate_bias_.As<float>();
    p.up_bias = up_bias_.As<float>();
    p.xd = reinterpret_cast<float*>(ws + l.xd);
    p.hd = reinterpret_cast<float*>(ws + l.hd);
    p.y = reinterpret_cast<float*>(ws + l.y);
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchReference(p, stream), "reference kernels"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchCombine(p.y, p.topk_ids, tc, p.top_k, k_dim, first_expert_,
                                                        p.num_local, out.dtype,
                                                        static_cast<uint8_t*>(out.data) + t0 * k_dim * out_elt,
                                                        stream),
                                    "combine kernel"));
  }
  return debug.End();
}

bool BuiltFor(const char* arch) {
  const std::string archs = " " + std::string(MXMOE_CUDA_ARCHS) + " ";
  return archs.find(std::string(" ") + arch + " ") != std::string::npos;
}

// Compute capability 12.x runs the SM120 kernels, 9.x the SM90 ones, or the SM120 kernels in
// emulation when MXMOE_CUDA_PATH=sm120 (the whole GPU suite through the SM120 path on an H200,
// docs/sm120.md). Anything else is refused, naming the capability.
Status ChooseKernelPath(const cudaDeviceProp& prop, const std::string& who, std::unique_ptr<KernelPath>* out) {
  const char* env = std::getenv("MXMOE_CUDA_PATH");
  const std::string forced = env != nullptr ? env : "";
  if (!forced.empty() && forced != "sm90" && forced != "sm120")
    return Status::Invalid("MXMOE_CUDA_PATH=" + forced + ": expected sm90 or sm120 (or unset: chosen by the device)");
  const std::string built = "built for '" + CudaArchsCompiled() + "'";
  if (prop.major == 12) {
    if (forced == "sm90")
      return Status::Unsupported(who + ": MXMOE_CUDA_PATH=sm90, but the SM90 kernels need compute capability 9.x");
    // NOTE: sm_120a code runs on compute capability 12.0 only; sm_120f (family) code on every 12.x
    // (nvcc 13.0: compute_120f defines __CUDA_ARCH_FAMILY_SPECIFIC__=1200, which the MMA header
    // accepts).
    if (!BuiltFor("120f") && !(prop.minor == 0 && BuiltFor("120a")))
      return Status::Unsupported(who + ": this build holds no code for it (" + built + "; configure with " +
                                 "MXMOE_CUDA_ARCHS including " + (prop.minor == 0 ? "120a or 120f)" : "120f)"));
    *out = std::make_unique<Sm120Path>(/*emulated=*/false);
    return Status::Ok();
  }
  if (prop.major == 9) {
    if (!BuiltFor("90a"))
      return Status::Unsupported(who + ": this build holds no sm_90a code (" + built +
                                 "; configure with MXMOE_CUDA_ARCHS including 90a)");
    if (forced == "sm120") {
      if (!cuda::sm120::EmulationBuilt())
        return Status::Unsupported(who + ": MXMOE_CUDA_PATH=sm120 on an SM90 device needs the SM120 kernels' "
                                   "emulation build (configure with -DMXMOE_SM120_EMULATION=ON)");
      *out = std::make_unique<Sm120Path>(/*emulated=*/true);
      return Status::Ok();
    }
    *out = std::make_unique<Sm90Path>();
    return Status::Ok();
  }
  return Status::Unsupported(who + ": no kernels for this compute capability; the CUDA backend runs on "
                             "SM90 (compute capability 9.x) and SM120 (12.x)");
}

}  // namespace

bool CudaBuilt() { return true; }

std::string CudaArchsCompiled() {
  std::string s, archs = MXMOE_CUDA_ARCHS;
  size_t pos = 0;
  while (pos < archs.size()) {
    const size_t end = std::min(archs.find(' ', pos), archs.size());
    if (end > pos) s += (s.empty() ? "sm_" : " sm_") + archs.substr(pos, end - pos);
    pos = end + 1;
  }
  return s;
}

std::vector<CudaDeviceInfo> CudaDevices() {
  std::vector<CudaDeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: an empty list, not an error
    return out;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    CudaDeviceInfo info;
    info.index = d;
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    info.total_memory = prop.totalGlobalMem;
    out.push_back(info);
  }
  return out;
}

Status CudaMoe::Create(const ExpertSet& experts, int device, std::unique_ptr<CudaMoe>* out) {
  if (out == nullptr) return Status::Invalid("CudaMoe::Create: out is null");
  MXMOE_RETURN_IF_ERROR(experts.Validate());
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unsupported(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  }
  if (device < 0 || device >= count)
    return Status::Invalid("device " + Str(device) + " is outside [0, " + Str(count) + ")");
  cudaDeviceProp prop;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  const std::string who = "device " + Str(device) + " (" + prop.name + ", compute capability " +
                          Str(prop.major) + "." + Str(prop.minor) + ")";
  std::unique_ptr<KernelPath> path;
  MXMOE_RETURN_IF_ERROR(ChooseKernelPath(prop, who, &path));
  auto impl = std::make_unique<CudaMoeImpl>(std::move(path));
  MXMOE_RETURN_IF_ERROR(impl->Init(experts, device));
  *out = std::move(impl);
  return Status::Ok();
}

namespace cuda {

void SetPairChunks(bool on) { PairChunks().Set(on); }
bool PairChunksEnabled() { return PairChunks().Get(); }
void SetStageTimes(bool on) { StageTimesOn().Set(on); }
void SetExactGrid(bool on) { ExactGridOn().Set(on); }
void SetWorkspaceTarget(size_t bytes) { g_workspace_target.store(bytes); }

}  // namespace cuda

}  // namespace mxmoe
