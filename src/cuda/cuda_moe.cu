// CudaMoe for SM90: upload and repack at Create, the fused pipeline (Run) and the unfused GPU
// reference (RunReference) on the caller's stream and workspace. Launch code only: the kernels
// are in routing.cu, weight_prepack.cu, reference_kernels.cu and sm90/; the choices in
// heuristics.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/heuristics.h"
#include "cuda/moe_kernels.h"
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

// Largest finite UE8M0 byte of a scale tensor.
int MaxFiniteScale(const std::vector<uint8_t>& scales, int start) {
  int m = start;
  for (uint8_t b : scales)
    if (b != kUe8m0Nan && b > m) m = b;
  return m;
}

// ~2 GiB of workspace at most; larger calls run in token chunks (SPEC target: <= 2.5 GB at
// T = 16384, k = 16 for Kimi-K3).
constexpr size_t kWorkspaceTarget = size_t{2} << 30;
// Device staging for the upload at Create, per buffer (two alternate).
constexpr size_t kStagingTarget = size_t{256} << 20;

class CudaMoeSm90 final : public CudaMoe {
 public:
  ~CudaMoeSm90() override {
    DeviceGuard guard;
    if (!guard.Enter(device_).ok()) return;
    for (DeviceBuffer* b : {&w13_tiles_, &w13_scales_, &w2_tiles_, &w2_scales_, &params_, &gate_bias_, &up_bias_, &errors_})
      b->Free();
  }

  Status Init(const ExpertSet& experts, int device);

  size_t WorkspaceSize(int64_t max_tokens) const override {
    if (max_tokens <= 0) return 0;
    return std::max(PlanRun(std::min(max_tokens, max_chunk_run_)).total,
                    PlanRef(std::min(max_tokens, max_chunk_ref_)).total);
  }
  Status Run(const MoeInput& in, const MoeOutput& out, void* workspace, size_t workspace_bytes,
             void* stream) const override;
  Status RunReference(const MoeInput& in, const MoeOutput& out, void* workspace,
                      size_t workspace_bytes, void* stream) const override;
  const ExpertSet& Layout() const override { return layout_; }
  int Device() const override { return device_; }
  Status ReadErrors(int64_t* bad_expert_ids) const override;
  Status ResetErrors() const override;
  void SetDebugCheck(bool on) override { debug_check_ = on; }
  bool DebugCheck() const override { return debug_check_; }

 private:
  class DebugScope;
  struct RunLayout {
    size_t xq, h, y, keys_in, keys_out, vals_in, vals_out, offsets, tile_offsets, tiles, num_tiles, sort_temp;
    size_t total;
  };
  struct RefLayout {
    size_t xd, hd, y;
    size_t total;
  };
  RunLayout PlanRun(int64_t chunk) const {
    const size_t pairs = static_cast<size_t>(chunk * dims_.top_k);
    const size_t experts = static_cast<size_t>(dims_.num_local + 1);
    Arena a;
    RunLayout l;
    l.xq = a.Take(chunk * w13_.col_tiles * cuda::kTileCols * 2);
    l.h = a.Take(pairs * w2_.col_tiles * cuda::kTileCols * 2);
    l.y = a.Take(pairs * dims_.hidden * 4);
    l.keys_in = a.Take(pairs * 4);
    l.keys_out = a.Take(pairs * 4);
    l.vals_in = a.Take(pairs * 4);
    l.vals_out = a.Take(pairs * 4);
    l.offsets = a.Take(experts * 4);
    l.tile_offsets = a.Take(experts * 4);
    l.tiles = a.Take(pairs * 8);  // every tile holds >= 1 pair
    l.num_tiles = a.Take(4);
    l.sort_temp = a.Take(sort_temp_bytes_);
    l.total = a.Take(0);
    return l;
  }
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
  PackedShape w13_, w2_;
  DeviceBuffer w13_tiles_, w13_scales_, w2_tiles_, w2_scales_, params_, gate_bias_, up_bias_;
  bool has_bias_ = false;
  int key_bits_ = 1;
  size_t sort_temp_bytes_ = 0;
  int64_t max_chunk_run_ = 1, max_chunk_ref_ = 1;
  DeviceBuffer errors_;  // the error word: one unsigned long long, bad expert ids seen
  bool debug_check_ = false;
  bool pageable_access_ = false;  // the device reads pageable host memory (HMM / ATS)
};

Status CudaMoeSm90::Init(const ExpertSet& experts, int device) {
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
  w13_ = PackedShape::Of(2 * dims_.inter, dims_.hidden);
  w2_ = PackedShape::Of(dims_.hidden, dims_.inter);
  key_bits_ = 0;
  for (int64_t v = dims_.num_local; v > 0; v >>= 1) ++key_bits_;

  MXMOE_RETURN_IF_ERROR(Upload(experts));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::PrepareGemmKernels(), "configuring the GEMM kernels"));
  MXMOE_RETURN_IF_ERROR(errors_.Allocate(sizeof(unsigned long long), "the error word"));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemset(errors_.ptr, 0, errors_.bytes), "clearing the error word"));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaDeviceSynchronize(), "clearing the error word"));
  const char* debug_env = std::getenv("MXMOE_DEBUG_CHECK");
  debug_check_ = debug_env != nullptr && std::string(debug_env) == "1";
  int pageable = 0;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device),
                                  "cudaDeviceGetAttribute(PageableMemoryAccess)"));
  pageable_access_ = pageable != 0;

  // Chunk bounds from the per-token growth of each layout (the sort's scratch is sized for the
  // largest chunk, found with a first plan without it).
  auto per_token = [](size_t one, size_t two) { return std::max<size_t>(1, two - one); };
  const size_t run_token = per_token(PlanRun(1).total, PlanRun(2).total);
  max_chunk_run_ = std::max<int64_t>(1, static_cast<int64_t>(kWorkspaceTarget / run_token));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::SortTempBytes(max_chunk_run_ * dims_.top_k, &sort_temp_bytes_),
                                  "sizing the routing sort"));
  const size_t ref_token = per_token(PlanRef(1).total, PlanRef(2).total);
  max_chunk_ref_ = std::max<int64_t>(1, static_cast<int64_t>(kWorkspaceTarget / ref_token));
  return Status::Ok();
}

Status CudaMoeSm90::Upload(const ExpertSet& experts) {
  const int64_t n = dims_.num_local, k = dims_.hidden, i = dims_.inter;
  MXMOE_RETURN_IF_ERROR(w13_tiles_.Allocate(n * w13_.Tiles() * cuda::kTileBytes, "W13"));
  MXMOE_RETURN_IF_ERROR(w13_scales_.Allocate(n * w13_.Tiles() * cuda::kTileScaleBytes, "W13 scales"));
  MXMOE_RETURN_IF_ERROR(w2_tiles_.Allocate(n * w2_.Tiles() * cuda::kTileBytes, "W2"));
  MXMOE_RETURN_IF_ERROR(w2_scales_.Allocate(n * w2_.Tiles() * cuda::kTileScaleBytes, "W2 scales"));

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
      st = CudaCheck(cuda::LaunchRepackExperts(sources[buf].As<cuda::ExpertSource>(), static_cast<int>(count), e0,
                                               k, i, w13_, w2_, params_.As<ExpertParams>(),
                                               w13_tiles_.As<uint8_t>(), w13_scales_.As<uint8_t>(),
                                               w2_tiles_.As<uint8_t>(), w2_scales_.As<uint8_t>(), stream),
                     "weight repack kernel");
    if (st.ok()) st = CudaCheck(cudaEventRecord(done[buf], stream), "cudaEventRecord");
  }
  if (st.ok()) st = CudaCheck(cudaStreamSynchronize(stream), "weight upload");
  cleanup();
  return st;
}

Status CudaMoeSm90::CheckCall(const MoeInput& in, const MoeOutput& out, void* workspace,
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
Status CudaMoeSm90::CheckDevicePointer(const void* p, const char* name) const {
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
class CudaMoeSm90::DebugScope {
 public:
  DebugScope(const CudaMoeSm90& moe, cudaStream_t stream, const char* what)
      : moe_(moe), stream_(stream), what_(what) {}
  Status Begin() {
    if (!moe_.debug_check_) return Status::Ok();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MXMOE_RETURN_IF_ERROR(CudaCheck(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing"));
    if (capture != cudaStreamCaptureStatusNone) return Status::Ok();  // no synchronization in a capture
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
  const CudaMoeSm90& moe_;
  cudaStream_t stream_;
  const char* what_;
  bool active_ = false;
  unsigned long long before_ = 0;
};

Status CudaMoeSm90::ReadErrors(int64_t* bad_expert_ids) const {
  if (bad_expert_ids == nullptr) return Status::Invalid("ReadErrors: bad_expert_ids is null");
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device_));
  unsigned long long v = 0;
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemcpy(&v, errors_.ptr, sizeof(v), cudaMemcpyDeviceToHost), "reading the error word"));
  *bad_expert_ids = static_cast<int64_t>(v);
  return Status::Ok();
}

Status CudaMoeSm90::ResetErrors() const {
  DeviceGuard guard;
  MXMOE_RETURN_IF_ERROR(guard.Enter(device_));
  MXMOE_RETURN_IF_ERROR(CudaCheck(cudaMemsetAsync(errors_.ptr, 0, errors_.bytes, nullptr), "clearing the error word"));
  return CudaCheck(cudaStreamSynchronize(nullptr), "clearing the error word");
}

Status CudaMoeSm90::Run(const MoeInput& in, const MoeOutput& out, void* workspace,
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
  const int64_t k_dim = dims_.hidden, top_k = dims_.top_k, n_local = dims_.num_local;
  const cuda::LaunchChoice choice = cuda::ChooseLaunch(dims_, t_count, max_chunk_run_);
  const cuda::GemmConfigInfo info = cuda::GemmInfo(choice.gemm);
  const RunLayout l = PlanRun(choice.chunk_tokens);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  auto at = [ws](size_t off) { return ws + off; };
  int32_t* keys_in = reinterpret_cast<int32_t*>(at(l.keys_in));
  int32_t* keys_out = reinterpret_cast<int32_t*>(at(l.keys_out));
  int32_t* vals_in = reinterpret_cast<int32_t*>(at(l.vals_in));
  int32_t* vals_out = reinterpret_cast<int32_t*>(at(l.vals_out));
  int32_t* offsets = reinterpret_cast<int32_t*>(at(l.offsets));
  int32_t* tile_offsets = reinterpret_cast<int32_t*>(at(l.tile_offsets));
  int2* tiles = reinterpret_cast<int2*>(at(l.tiles));
  int32_t* num_tiles = reinterpret_cast<int32_t*>(at(l.num_tiles));
  uint16_t* xq = reinterpret_cast<uint16_t*>(at(l.xq));
  uint16_t* h = reinterpret_cast<uint16_t*>(at(l.h));
  float* y = reinterpret_cast<float*>(at(l.y));
  const size_t out_elt = OutputDTypeSize(out.dtype);
  const int32_t m_tiles13 = static_cast<int32_t>((w13_.row_groups + cuda::kBlockRowGroups - 1) / cuda::kBlockRowGroups);
  const int32_t m_tiles2 = static_cast<int32_t>((w2_.row_groups + cuda::kBlockRowGroups - 1) / cuda::kBlockRowGroups);

  for (int64_t t0 = 0; t0 < t_count; t0 += choice.chunk_tokens) {
    const int64_t tc = std::min(choice.chunk_tokens, t_count - t0);
    const int64_t pairs = tc * top_k;
    cuda::PrepareParams pp;
    pp.num_tokens = tc;
    pp.hidden = k_dim;
    pp.x_stride = w13_.col_tiles * cuda::kTileCols;
    if (in.x_bf16) pp.x_bf16 = in.x_bf16 + t0 * k_dim;
    if (in.x_e4m3) pp.x_e4m3 = in.x_e4m3 + t0 * k_dim;
    if (in.x_scale) pp.x_scale = in.x_scale + t0 * (k_dim / kMxBlock);
    pp.xq = xq;
    pp.topk_ids = in.topk_ids + t0 * top_k;
    pp.top_k = static_cast<int32_t>(top_k);
    pp.first_expert = first_expert_;
    pp.num_local = static_cast<int32_t>(n_local);
    pp.keys = keys_in;
    pp.pair_ids = vals_in;
    pp.num_experts = dims_.num_experts;
    pp.bad_ids = errors_.As<unsigned long long>();
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchPrepare(pp, stream), "input quantization / routing keys kernel"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::SortPairs(at(l.sort_temp), sort_temp_bytes_, keys_in, keys_out, vals_in,
                                                    vals_out, pairs, key_bits_, stream),
                                    "routing sort"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchOffsetsAndTiles(keys_out, pairs, static_cast<int32_t>(n_local),
                                                                info.block_n, offsets, tile_offsets, tiles,
                                                                num_tiles, stream),
                                    "routing offsets kernel"));
    // Tiles <= pairs / BLOCK_N + one partial tile per touched expert.
    const int64_t max_tiles = std::min(pairs, (pairs + info.block_n - 1) / info.block_n + std::min(n_local, pairs));

    cuda::GemmParams g;
    g.sorted_pairs = vals_out;
    g.expert_offsets = offsets;
    g.tiles = tiles;
    g.num_tiles = num_tiles;
    g.top_k = static_cast<int32_t>(top_k);
    g.experts = params_.As<ExpertParams>();
    g.act = layout_.activation.type;
    g.gate_bias = gate_bias_.As<float>();
    g.up_bias = up_bias_.As<float>();
    g.h = h;
    g.h_stride = w2_.col_tiles * cuda::kTileCols;
    g.y = y;
    g.y_stride = k_dim;
    g.topk_weights = in.topk_weights + t0 * top_k;

    cuda::GemmParams g1 = g;
    g1.a_tiles = w13_tiles_.As<uint8_t>();
    g1.a_scales = w13_scales_.As<uint8_t>();
    g1.a_shape = w13_;
    g1.b = xq;
    g1.b_stride = pp.x_stride;
    g1.m_tiles = m_tiles13;
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchGemm(choice.gemm, true, g1, m_tiles13 * max_tiles, stream),
                                    std::string("FC1 grouped GEMM (") + info.name + ")"));
    cuda::GemmParams g2 = g;
    g2.a_tiles = w2_tiles_.As<uint8_t>();
    g2.a_scales = w2_scales_.As<uint8_t>();
    g2.a_shape = w2_;
    g2.b = h;
    g2.b_stride = g.h_stride;
    g2.m_tiles = m_tiles2;
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchGemm(choice.gemm, false, g2, m_tiles2 * max_tiles, stream),
                                    std::string("FC2 grouped GEMM (") + info.name + ")"));
    MXMOE_RETURN_IF_ERROR(CudaCheck(cuda::LaunchCombine(y, in.topk_ids + t0 * top_k, tc, static_cast<int32_t>(top_k),
                                                        k_dim, first_expert_, static_cast<int32_t>(n_local),
                                                        out.dtype, static_cast<uint8_t*>(out.data) + t0 * k_dim * out_elt,
                                                        stream),
                                    "combine kernel"));
  }
  return debug.End();
}

Status CudaMoeSm90::RunReference(const MoeInput& in, const MoeOutput& out, void* workspace,
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
    p.w13_tiles = w13_tiles_.As<uint8_t>();
    p.w13_scales = w13_scales_.As<uint8_t>();
    p.w13 = w13_;
    p.w2_tiles = w2_tiles_.As<uint8_t>();
    p.w2_scales = w2_scales_.As<uint8_t>();
    p.w2 = w2_;
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
  if (prop.major == 12)
    return Status::Unsupported(who + ": SM120 kernels (block-scaled mma.sync) are not implemented "
                               "yet; the CUDA backend runs on SM90 (compute capability 9.x)");
  if (prop.major != 9)
    return Status::Unsupported(who + ": no kernels for this compute capability; the CUDA backend "
                               "runs on SM90 (compute capability 9.x)");
  if (!BuiltFor("90a"))
    return Status::Unsupported(who + ": this build holds no sm_90a code (built for '" +
                               CudaArchsCompiled() + "'; configure with MXMOE_CUDA_ARCHS including 90a)");
  auto impl = std::make_unique<CudaMoeSm90>();
  MXMOE_RETURN_IF_ERROR(impl->Init(experts, device));
  *out = std::move(impl);
  return Status::Ok();
}

}  // namespace mxmoe
