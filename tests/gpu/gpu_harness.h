// Device buffers for one input and runs of CudaMoe into poisoned outputs (STYLE habit 8).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/compare.h"
#include "mxmoe/cuda.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {

#define MXMOE_CUDA_OK(expr)                                                            \
  do {                                                                                 \
    const cudaError_t mxmoe_e_ = (expr);                                               \
    ASSERT_EQ(mxmoe_e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(mxmoe_e_); \
  } while (0)

struct DeviceMem {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceMem() = default;
  explicit DeviceMem(size_t n) : bytes(n) {
    if (n && cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem() {
    if (ptr) cudaFree(ptr);
  }
  template <class T>
  T* As() const {
    return static_cast<T*>(ptr);
  }
};

// A setting of the library, an on / off switch (SetWarpRoute's kind) or an integer (SetEarlySteps'
// kind), set for a scope, then back to what it was (its environment variable's value or default).
template <auto kGet, auto kSet>
struct ScopedSetting {
  using Value = decltype(kGet());
  const Value before = kGet();
  explicit ScopedSetting(Value value) { kSet(value); }
  ~ScopedSetting() { kSet(before); }
};

inline bool HaveSm90() {
  for (const CudaDeviceInfo& d : CudaDevices())
    if (d.index == 0 && d.major == 9) return true;
  return false;
}

#define MXMOE_REQUIRE_SM90()                                        \
  do {                                                              \
    if (!::mxmoe::test::HaveSm90()) GTEST_SKIP() << "needs an SM90 GPU as device 0"; \
  } while (0)

// One call's inputs on the device (bf16 x or pre-quantized x), an output buffer, a workspace.
class DeviceCase {
 public:
  DeviceCase(const CudaMoe& moe, const SyntheticInput& in) : moe_(moe) {
    const LayerShape& s = moe.Layout().shape;
    t_ = in.num_tokens;
    hidden_ = s.hidden;
    top_k_ = s.top_k;
    x_ = std::make_unique<DeviceMem>(std::max<size_t>(1, in.x_bf16.size() * 2));
    ids_ = std::make_unique<DeviceMem>(std::max<size_t>(1, in.topk_ids.size() * 4));
    w_ = std::make_unique<DeviceMem>(std::max<size_t>(1, in.topk_weights.size() * 4));
    out_ = std::make_unique<DeviceMem>(std::max<size_t>(16, t_ * hidden_ * 4));
    ws_bytes_ = moe.WorkspaceSize(t_);
    ws_ = std::make_unique<DeviceMem>(std::max<size_t>(256, ws_bytes_));
    Upload(in);
  }
  // New inputs of the same size into the same buffers (graph replays read them there).
  void Upload(const SyntheticInput& in) {
    cudaMemcpy(x_->ptr, in.x_bf16.data(), in.x_bf16.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(ids_->ptr, in.topk_ids.data(), in.topk_ids.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(w_->ptr, in.topk_weights.data(), in.topk_weights.size() * 4, cudaMemcpyHostToDevice);
  }
  // Pre-quantized x instead of bf16 x.
  void UseFp8(const std::vector<uint8_t>& e4m3, const std::vector<uint8_t>& scales) {
    x8_ = std::make_unique<DeviceMem>(std::max<size_t>(16, e4m3.size()));
    xs_ = std::make_unique<DeviceMem>(std::max<size_t>(16, scales.size()));
    cudaMemcpy(x8_->ptr, e4m3.data(), e4m3.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(xs_->ptr, scales.data(), scales.size(), cudaMemcpyHostToDevice);
  }
  MoeInput Input() const {
    MoeInput in;
    in.num_tokens = t_;
    if (x8_) {
      in.x_e4m3 = x8_->As<uint8_t>();
      in.x_scale = xs_->As<uint8_t>();
    } else {
      in.x_bf16 = x_->As<uint16_t>();
    }
    in.topk_ids = ids_->As<int32_t>();
    in.topk_weights = w_->As<float>();
    return in;
  }
  MoeOutput Output(OutputDType dtype) const { return {dtype, out_->ptr}; }
  void Poison(cudaStream_t stream = nullptr) { cudaMemsetAsync(out_->ptr, 0xFF, out_->bytes, stream); }
  // The workspace's bytes all 0xFF (flags raised, counts -1, sums and intermediates NaN), as a call
  // that cleared nothing would find them.
  cudaError_t PoisonWorkspace() { return cudaMemset(ws_->ptr, 0xFF, ws_bytes_); }
  Status Launch(OutputDType dtype, bool reference, cudaStream_t stream = nullptr) {
    return reference ? moe_.RunReference(Input(), Output(dtype), ws_->ptr, ws_bytes_, stream)
                     : moe_.Run(Input(), Output(dtype), ws_->ptr, ws_bytes_, stream);
  }
  template <class T>
  std::vector<T> Fetch() const {
    std::vector<T> v(static_cast<size_t>(t_ * hidden_));
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), out_->ptr, v.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  // Poison, run, synchronize, check every element was written.
  std::vector<float> RunF32(bool reference = false) {
    Poison();
    const Status st = Launch(OutputDType::kF32, reference);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    auto v = Fetch<float>();
    EXPECT_TRUE(AllWritten(v, {t_, hidden_}));
    return v;
  }
  std::vector<uint16_t> RunBf16(bool reference = false) {
    Poison();
    const Status st = Launch(OutputDType::kBF16, reference);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    auto v = Fetch<uint16_t>();
    EXPECT_TRUE(AllWritten(v, {t_, hidden_}));
    return v;
  }
  int64_t tokens() const { return t_; }
  int64_t hidden() const { return hidden_; }
  size_t workspace_bytes() const { return ws_bytes_; }
  void* workspace() const { return ws_->ptr; }

 private:
  const CudaMoe& moe_;
  int64_t t_ = 0, hidden_ = 0, top_k_ = 0;
  std::unique_ptr<DeviceMem> x_, x8_, xs_, ids_, w_, out_, ws_;
  size_t ws_bytes_ = 0;
};

// One call of a DeviceCase captured in a CUDA graph on a stream of its own (all torn down when it
// goes); the capture's Status is status(), and Replay(n) launches the graph n times and waits.
class CapturedCall {
 public:
  CapturedCall(DeviceCase& dc, OutputDType dtype) { Capture(dc, dtype); }
  ~CapturedCall() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;
  const Status& status() const { return status_; }
  cudaStream_t stream() const { return stream_; }
  cudaGraph_t graph() const { return graph_; }
  void Replay(int times = 1) {
    ASSERT_NE(exec_, nullptr) << "nothing was captured: " << status_.ToString();
    for (int i = 0; i < times; ++i) MXMOE_CUDA_OK(cudaGraphLaunch(exec_, stream_));
    MXMOE_CUDA_OK(cudaStreamSynchronize(stream_));
  }

 private:
  void Capture(DeviceCase& dc, OutputDType dtype) {
    MXMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MXMOE_CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    status_ = dc.Launch(dtype, false, stream_);
    MXMOE_CUDA_OK(cudaStreamEndCapture(stream_, &graph_));
    if (status_.ok()) MXMOE_CUDA_OK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  Status status_ = Status::Ok();
};

// Every third slot of `in` given an expert id out of range for 8 experts (>= E, < -1, the int32
// extremes), and the same slots -1 in *clean (the reference refuses such ids; they mean "no
// expert"). Expects in->topk_ids == clean->topk_ids on entry.
inline void PutOutOfRangeIds(SyntheticInput* in, SyntheticInput* clean) {
  const int32_t junk[] = {8, 1000000, -2, -7, 2147483647, -2147483647 - 1};
  for (size_t i = 0; i < in->topk_ids.size(); i += 3) {
    in->topk_ids[i] = junk[(i / 3) % 6];
    clean->topk_ids[i] = -1;
  }
}

inline std::unique_ptr<CudaMoe> MakeCudaMoe(const ExpertSet& set) {
  std::unique_ptr<CudaMoe> moe;
  const Status st = CudaMoe::Create(set, 0, &moe);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return moe;
}

}  // namespace mxmoe::test
