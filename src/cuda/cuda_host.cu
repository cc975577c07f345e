// CudaRunHost: host data in, host data out, around CudaMoe::Run (see cuda_host.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "mxmoe/cuda_host.h"
#include "mxmoe/formats.h"

namespace mxmoe {

namespace {

struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Cuda(std::string(what) + ": " + cudaGetErrorString(e));
}

// Allocates `bytes` and copies `src` there (when given).
Status Upload(DeviceBuffer* buf, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return Status::Ok();
  MXMOE_RETURN_IF_ERROR(Check(cudaMalloc(&buf->ptr, bytes), what));
  if (src) MXMOE_RETURN_IF_ERROR(Check(cudaMemcpy(buf->ptr, src, bytes, cudaMemcpyHostToDevice), what));
  return Status::Ok();
}

}  // namespace

Status CudaRunHost(const CudaMoe& moe, const MoeInput& in, const MoeOutput& out,
                   const CudaHostRunOptions& options, std::vector<float>* times_ms) {
  const ExpertSet& layout = moe.Layout();
  const int64_t t = in.num_tokens, k = layout.shape.hidden, top = layout.shape.top_k;
  MXMOE_RETURN_IF_ERROR(Check(cudaSetDevice(moe.Device()), "cudaSetDevice"));
  DeviceBuffer x, xs, ids, w, o, ws;
  MoeInput din;
  din.num_tokens = t;
  if (in.x_bf16) {
    MXMOE_RETURN_IF_ERROR(Upload(&x, in.x_bf16, t * k * sizeof(uint16_t), "hidden_states"));
    din.x_bf16 = static_cast<const uint16_t*>(x.ptr);
  } else {
    MXMOE_RETURN_IF_ERROR(Upload(&x, in.x_e4m3, t * k, "hidden_states"));
    MXMOE_RETURN_IF_ERROR(Upload(&xs, in.x_scale, t * k / kMxBlock, "hidden_states_scale"));
    din.x_e4m3 = static_cast<const uint8_t*>(x.ptr);
    din.x_scale = static_cast<const uint8_t*>(xs.ptr);
  }
  MXMOE_RETURN_IF_ERROR(Upload(&ids, in.topk_ids, t * top * sizeof(int32_t), "topk_ids"));
  MXMOE_RETURN_IF_ERROR(Upload(&w, in.topk_weights, t * top * sizeof(float), "topk_weights"));
  const size_t out_bytes = t * k * OutputDTypeSize(out.dtype);
  MXMOE_RETURN_IF_ERROR(Upload(&o, nullptr, out_bytes, "output"));
  din.topk_ids = static_cast<const int32_t*>(ids.ptr);
  din.topk_weights = static_cast<const float*>(w.ptr);
  MoeOutput dout{out.dtype, o.ptr};
  const size_t ws_bytes = moe.WorkspaceSize(t);
  MXMOE_RETURN_IF_ERROR(Upload(&ws, nullptr, ws_bytes, "workspace"));

  cudaStream_t stream;
  MXMOE_RETURN_IF_ERROR(Check(cudaStreamCreate(&stream), "cudaStreamCreate"));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  auto run = [&] {
    return options.reference ? moe.RunReference(din, dout, ws.ptr, ws_bytes, stream)
                             : moe.Run(din, dout, ws.ptr, ws_bytes, stream);
  };
  Status st;
  if (options.repeats > 1) st = run();  // warm-up
  if (times_ms) times_ms->clear();
  for (int r = 0; st.ok() && r < std::max(1, options.repeats); ++r) {
    cudaEventRecord(start, stream);
    st = run();
    cudaEventRecord(stop, stream);
    if (st.ok()) st = Check(cudaEventSynchronize(stop), "moe run");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (times_ms) times_ms->push_back(ms);
  }
  if (st.ok()) st = Check(cudaMemcpy(out.data, o.ptr, out_bytes, cudaMemcpyDeviceToHost), "output copy");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return st;
}

}  // namespace mxmoe
