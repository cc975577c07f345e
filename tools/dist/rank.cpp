// A rank's run: load and prepare its slices, run them on the replicated tokens into fp32
// partial outputs, all-reduce (sum) them in place with NCCL, time both, and gather every rank's
// record on rank 0, which then runs the unsplit layer on its GPU and compares.
#include "rank.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "dist_data.h"
#include "mxmoe/cuda.h"
#include "mxmoe/formats.h"
#include "output_summary.h"
#include "report.h"

namespace mxmoe::dist {

namespace {

Status CudaOk(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  if (e == cudaErrorMemoryAllocation) return {StatusCode::kOutOfMemory, what + ": " + cudaGetErrorString(e)};
  return Status::Cuda(what + ": " + cudaGetErrorString(e));
}

Status NcclOk(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  if (r == ncclSuccess) return Status::Ok();
  std::string m = "NCCL " + what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') m += " (" + std::string(last) + ")";
  return Status::Cuda(m);
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Free(); }
  Status Alloc(size_t bytes, const std::string& what) {
    Free();
    bytes_ = bytes;
    return CudaOk(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)), "cudaMalloc " + what);
  }
  Status Upload(const void* src, size_t bytes, const std::string& what) {
    MXMOE_RETURN_IF_ERROR(Alloc(bytes, what));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "uploading " + what));
    // NOTE: a copy from pageable memory may return before its DMA lands (CUDA runtime API,
    // "API synchronization behavior"), and the rank's stream does not wait for the legacy stream.
    return CudaOk(cudaDeviceSynchronize(), "uploading " + what);
  }
  void Free() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The communicator: destroyed on the way out of a run that completed, aborted otherwise (a rank
// that failed half way must not wait in ncclCommDestroy for peers that will never come).
class Communicator {
 public:
  ~Communicator() {
    if (comm_) ncclCommAbort(comm_);
  }
  ncclComm_t* out() { return &comm_; }
  ncclComm_t get() const { return comm_; }
  Status Destroy() {
    ncclComm_t c = comm_;
    comm_ = nullptr;
    return NcclOk(ncclCommDestroy(c), "ncclCommDestroy", nullptr);
  }

 private:
  ncclComm_t comm_ = nullptr;
};

class Stream {
 public:
  ~Stream() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status Create() {
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    events_.resize(3);
    for (cudaEvent_t& e : events_) MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventCreate(&e), "cudaEventCreate"));
    return Status::Ok();
  }
  cudaStream_t get() const { return stream_; }
  Status Record(int idx) { return CudaOk(cudaEventRecord(events_[idx], stream_), "cudaEventRecord"); }
  Status Sync() { return CudaOk(cudaStreamSynchronize(stream_), "the rank's stream"); }
  // Milliseconds between two recorded (and completed) events.
  double Ms(int from, int to) const {
    float ms = 0;
    cudaEventElapsedTime(&ms, events_[from], events_[to]);
    return ms;
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

// The replicated input on this rank's GPU.
struct DeviceInput {
  DeviceBuffer x, x_scale, ids, weights;
  MoeInput view;

  Status Upload(const HostMoeInput& in, const LayerShape& shape) {
    const int64_t t = in.num_tokens;
    view.num_tokens = t;
    if (in.is_mxfp8()) {
      MXMOE_RETURN_IF_ERROR(x.Upload(in.x_e4m3.data(), in.x_e4m3.size(), "hidden_states"));
      MXMOE_RETURN_IF_ERROR(x_scale.Upload(in.x_scale.data(), in.x_scale.size(), "hidden_states_scale"));
      view.x_e4m3 = static_cast<const uint8_t*>(x.get());
      view.x_scale = static_cast<const uint8_t*>(x_scale.get());
    } else {
      MXMOE_RETURN_IF_ERROR(x.Upload(in.x_bf16.data(), in.x_bf16.size() * sizeof(uint16_t), "hidden_states"));
      view.x_bf16 = static_cast<const uint16_t*>(x.get());
    }
    const size_t pairs = static_cast<size_t>(t * shape.top_k);
    MXMOE_RETURN_IF_ERROR(ids.Upload(in.topk_ids.data(), pairs * sizeof(int32_t), "topk_ids"));
    MXMOE_RETURN_IF_ERROR(weights.Upload(in.topk_weights.data(), pairs * sizeof(float), "topk_weights"));
    view.topk_ids = static_cast<const int32_t*>(ids.get());
    view.topk_weights = static_cast<const float*>(weights.get());
    return Status::Ok();
  }
};

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Host threads for building a synthetic slice: the machine's cores shared by the ranks on it.
int HostThreads(const ProcessRole& role) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, role.world));
}

std::string DescribeSlice(const DistOptions& o, int idx) {
  const ParallelSlice s = o.Slice(idx);
  const int64_t e0 = s.FirstExpert(o.shape), ne = s.NumLocalExperts(o.shape);
  const int64_t i0 = s.FirstIntermediateRow(o.shape), ni = s.LocalIntermediate(o.shape);
  char buf[160];
  std::snprintf(buf, sizeof(buf), "ep %d/%d tp %d/%d: experts [%lld, %lld), I [%lld, %lld)", s.ep_rank, s.ep_size,
                s.tp_rank, s.tp_size, (long long)e0, (long long)(e0 + ne), (long long)i0, (long long)(i0 + ni));
  return buf;
}

std::string DescribeActivation(const ActivationSpec& a) {
  if (a.type != ActivationType::Situ) return ActivationName(a.type);
  if (!a.per_expert.empty()) return "Situ (per-expert beta, linear_beta)";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "Situ (beta %g, linear_beta %g)", a.params.beta, a.params.linear_beta);
  return buf;
}

std::string NcclVersionString() {
  int v = 0;
  ncclGetVersion(&v);
  char buf[96];
  // NOTE: since NCCL 2.9 the code is major * 10000 + minor * 100 + patch (nccl.h NCCL_VERSION).
  std::snprintf(buf, sizeof(buf), "NCCL %d.%d.%d (built with %d.%d.%d)", v / 10000, (v / 100) % 100, v % 100,
                NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  return buf;
}

// The unsplit layer on this GPU: its fp32 output for `in`, and its median time.
Status RunUnsplit(const DistOptions& opts, const ProcessRole& role, const DeviceInput& in, Stream& stream,
                  std::vector<float>* out, double* median_ms, double* load_s) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<CudaMoe> moe;
  {
    ExpertSet full;
    // The other ranks are done: every core builds it.
    MXMOE_RETURN_IF_ERROR(LoadSlice(opts, ParallelSlice{}, 0, &full));
    MXMOE_RETURN_IF_ERROR(CudaMoe::Create(full, role.local_rank, &moe));
  }
  *load_s = SecondsSince(t0);
  const int64_t count = in.view.num_tokens * opts.shape.hidden;
  DeviceBuffer dout, ws;
  MXMOE_RETURN_IF_ERROR(dout.Alloc(count * sizeof(float), "the unsplit output"));
  const size_t ws_bytes = moe->WorkspaceSize(in.view.num_tokens);
  MXMOE_RETURN_IF_ERROR(ws.Alloc(ws_bytes, "the unsplit layer's workspace"));
  MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemsetAsync(dout.get(), 0xFF, count * sizeof(float), stream.get()), "poisoning"));
  const MoeOutput o{OutputDType::kF32, dout.get()};
  std::vector<double> times;
  for (int it = 0; it < 1 + opts.repeat; ++it) {
    MXMOE_RETURN_IF_ERROR(stream.Record(0));
    MXMOE_RETURN_IF_ERROR(moe->Run(in.view, o, ws.get(), ws_bytes, stream.get()));
    MXMOE_RETURN_IF_ERROR(stream.Record(1));
    MXMOE_RETURN_IF_ERROR(stream.Sync());
    if (it > 0) times.push_back(stream.Ms(0, 1));
  }
  *median_ms = Median(times);
  out->resize(count);
  return CudaOk(cudaMemcpy(out->data(), dout.get(), count * sizeof(float), cudaMemcpyDeviceToHost),
                "downloading the unsplit output");
}

}  // namespace

Status RunRank(const DistOptions& opts, const ProcessRole& role, const ncclUniqueId& id, bool* sum_matches) {
  *sum_matches = true;
  const int device = role.local_rank;
  MXMOE_RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  cudaDeviceProp prop{};
  MXMOE_RETURN_IF_ERROR(CudaOk(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));

  Communicator comm;
  MXMOE_RETURN_IF_ERROR(NcclOk(ncclCommInitRank(comm.out(), role.world, id, role.rank),
                               "ncclCommInitRank(rank " + std::to_string(role.rank) + " of " +
                                   std::to_string(role.world) + ")",
                               nullptr));

  // ---- this rank's slices, prepared on its GPU (one at a time on the host) ----
  const int first = opts.FirstSlice(role.rank), num = opts.SlicesPerRank();
  const auto t_load = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<CudaMoe>> moes(num);
  for (int i = 0; i < num; ++i) {
    ExpertSet set;
    MXMOE_RETURN_IF_ERROR(LoadSlice(opts, opts.Slice(first + i), HostThreads(role), &set));
    MXMOE_RETURN_IF_ERROR(CudaMoe::Create(set, device, &moes[i]));
  }
  const double load_s = SecondsSince(t_load);

  // ---- the replicated input, the partial outputs, the buffer the ranks sum ----
  HostMoeInput host_in;
  MXMOE_RETURN_IF_ERROR(LoadInput(opts, &host_in));
  DeviceInput in;
  MXMOE_RETURN_IF_ERROR(in.Upload(host_in, opts.shape));
  const int64_t t_count = host_in.num_tokens, width = opts.shape.hidden;
  const size_t count = static_cast<size_t>(t_count * width), bytes = count * sizeof(float);
  std::vector<DeviceBuffer> partial(num);
  for (int i = 0; i < num; ++i)
    MXMOE_RETURN_IF_ERROR(partial[i].Alloc(bytes, "the output of slice " + std::to_string(first + i)));
  // One slice: its output is all-reduced in place, as an engine would. Several: their host sum.
  DeviceBuffer own_sum;
  if (num > 1) MXMOE_RETURN_IF_ERROR(own_sum.Alloc(bytes, "the rank's sum"));
  float* gmem_sum = static_cast<float*>(num > 1 ? own_sum.get() : partial[0].get());
  size_t ws_bytes = 0;
  for (const auto& m : moes) ws_bytes = std::max(ws_bytes, m->WorkspaceSize(t_count));
  DeviceBuffer ws, barrier;
  MXMOE_RETURN_IF_ERROR(ws.Alloc(ws_bytes, "the workspace"));
  MXMOE_RETURN_IF_ERROR(barrier.Alloc(sizeof(float), "the barrier word"));
  Stream stream;
  MXMOE_RETURN_IF_ERROR(stream.Create());
  MXMOE_RETURN_IF_ERROR(
      CudaOk(cudaMemsetAsync(barrier.get(), 0, sizeof(float), stream.get()), "clearing the barrier word"));

  const auto run_slices = [&]() -> Status {
    for (int i = 0; i < num; ++i)
      MXMOE_RETURN_IF_ERROR(moes[i]->Run(in.view, MoeOutput{OutputDType::kF32, partial[i].get()}, ws.get(), ws_bytes,
                                         stream.get()));
    return Status::Ok();
  };
  const auto all_reduce = [&]() -> Status {
    return NcclOk(ncclAllReduce(gmem_sum, gmem_sum, count, ncclFloat, ncclSum, comm.get(), stream.get()),
                  "ncclAllReduce", comm.get());
  };
  const auto barrier_sync = [&]() -> Status {
    MXMOE_RETURN_IF_ERROR(NcclOk(ncclAllReduce(barrier.get(), barrier.get(), 1, ncclFloat, ncclSum, comm.get(),
                                               stream.get()),
                                 "ncclAllReduce (barrier)", comm.get()));
    return stream.Sync();
  };

  // ---- the checked step: poisoned outputs (unwritten elements show as NaN), the slices, the
  // rank's host sum of several slices in slice order, the all-reduce ----
  for (auto& p : partial)
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemsetAsync(p.get(), 0xFF, bytes, stream.get()), "poisoning the outputs"));
  MXMOE_RETURN_IF_ERROR(run_slices());
  if (num > 1) {
    std::vector<float> host_sum(count, 0.0f), part(count);
    MXMOE_RETURN_IF_ERROR(stream.Sync());
    for (int i = 0; i < num; ++i) {
      MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpy(part.data(), partial[i].get(), bytes, cudaMemcpyDeviceToHost),
                                   "downloading slice " + std::to_string(first + i)));
      for (size_t j = 0; j < count; ++j) host_sum[j] += part[j];
    }
    // On the rank's stream, so that the all-reduce below reads it only after it has landed.
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpyAsync(gmem_sum, host_sum.data(), bytes, cudaMemcpyHostToDevice,
                                                 stream.get()),
                                 "uploading the rank's sum"));
    MXMOE_RETURN_IF_ERROR(stream.Sync());  // host_sum is freed at the end of this block
  }
  MXMOE_RETURN_IF_ERROR(all_reduce());
  MXMOE_RETURN_IF_ERROR(stream.Sync());
  std::vector<float> result(count);
  MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpy(result.data(), gmem_sum, bytes, cudaMemcpyDeviceToHost),
                               "downloading the all-reduced output"));

  // ---- timed steps: the slices back to back, then the all-reduce (which waits for the slowest
  // rank); then the all-reduce alone, each right after a barrier. The sum was taken above: what
  // these steps leave in the buffers no longer matters ----
  std::vector<double> moe_ms, ar_ms, alone_ms;
  MXMOE_RETURN_IF_ERROR(barrier_sync());
  for (int it = 0; it < opts.warmup + opts.repeat; ++it) {
    MXMOE_RETURN_IF_ERROR(stream.Record(0));
    MXMOE_RETURN_IF_ERROR(run_slices());
    MXMOE_RETURN_IF_ERROR(stream.Record(1));
    MXMOE_RETURN_IF_ERROR(all_reduce());
    MXMOE_RETURN_IF_ERROR(stream.Record(2));
    MXMOE_RETURN_IF_ERROR(stream.Sync());
    if (it >= opts.warmup) {
      moe_ms.push_back(stream.Ms(0, 1));
      ar_ms.push_back(stream.Ms(1, 2));
    }
  }
  for (int it = 0; it < opts.repeat; ++it) {
    MXMOE_RETURN_IF_ERROR(barrier_sync());
    MXMOE_RETURN_IF_ERROR(stream.Record(0));
    MXMOE_RETURN_IF_ERROR(all_reduce());
    MXMOE_RETURN_IF_ERROR(stream.Record(1));
    MXMOE_RETURN_IF_ERROR(stream.Sync());
    alone_ms.push_back(stream.Ms(0, 1));
  }

  // ---- every rank's record, on every rank (rank 0 reports) ----
  RankStats mine;
  mine.rank = role.rank;
  mine.device = device;
  mine.first_slice = first;
  mine.num_slices = num;
  mine.moe_ms = Median(moe_ms);
  mine.allreduce_ms = Median(ar_ms);
  mine.allreduce_alone_ms = Median(alone_ms);
  mine.load_s = load_s;
  mine.sum_hash = Fnv1a64(result.data(), bytes);
  std::snprintf(mine.device_name, sizeof(mine.device_name), "%.63s", prop.name);  // a longer name is cut
  std::vector<RankStats> all(role.world);
  {
    DeviceBuffer send, recv;
    MXMOE_RETURN_IF_ERROR(send.Upload(&mine, sizeof(mine), "the rank's record"));
    MXMOE_RETURN_IF_ERROR(recv.Alloc(sizeof(RankStats) * role.world, "the ranks' records"));
    MXMOE_RETURN_IF_ERROR(NcclOk(ncclAllGather(send.get(), recv.get(), sizeof(RankStats), ncclUint8, comm.get(),
                                               stream.get()),
                                 "ncclAllGather (the ranks' records)", comm.get()));
    MXMOE_RETURN_IF_ERROR(stream.Sync());
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpy(all.data(), recv.get(), sizeof(RankStats) * role.world,
                                            cudaMemcpyDeviceToHost),
                                 "downloading the ranks' records"));
  }
  // Nothing collective follows: the other ranks are done.
  MXMOE_RETURN_IF_ERROR(comm.Destroy());
  if (role.rank != 0) return Status::Ok();

  // ---- rank 0: the unsplit layer on this GPU (the slices' memory given back first) ----
  moes.clear();
  for (auto& p : partial) p.Free();
  own_sum.Free();
  ws.Free();
  std::vector<float> unsplit;
  double unsplit_ms = 0, unsplit_load_s = 0;
  MXMOE_RETURN_IF_ERROR(RunUnsplit(opts, role, in, stream, &unsplit, &unsplit_ms, &unsplit_load_s));
  const SumCheck check = CheckSum(result.data(), unsplit.data(), static_cast<int64_t>(count), opts.tolerance);
  bool same_on_all = true;
  for (const RankStats& r : all) same_on_all = same_on_all && r.sum_hash == mine.sum_hash;
  *sum_matches = check.Passed() && same_on_all;

  // ---- the report ----
  const char* launched = role.kind == ProcessRole::kOwnRank ? "ranks started by mxmoe-dist" : nullptr;
  std::printf("mxmoe-dist: %s; %s, NCCL_NVLS_ENABLE=0, %s\n", opts.DescribeSplit().c_str(), NcclVersionString().c_str(),
              launched ? launched : ("ranks from " + role.source).c_str());
  std::printf("layer:      %s: E=%lld K=%lld I=%lld k=%lld, %s\n", opts.layer_desc.c_str(),
              (long long)opts.shape.num_experts, (long long)opts.shape.hidden, (long long)opts.shape.intermediate,
              (long long)opts.shape.top_k, DescribeActivation(opts.activation).c_str());
  std::printf("input:      T=%lld tokens (%s), %s, replicated on every rank\n", (long long)t_count,
              opts.input.empty() ? RoutingPatternName(opts.routing) : opts.input.c_str(),
              host_in.is_mxfp8() ? "mxfp8" : "bf16");
  std::printf("partials:   f32 [%lld, %lld] per rank, all-reduced (sum) in place: %zu bytes\n", (long long)t_count,
              (long long)width, bytes);
  std::printf("times:      medians of %d steps after %d warm-up steps; a step = the rank's slices, then the "
              "all-reduce\n",
              opts.repeat, opts.warmup);
  std::printf("%4s %4s  %-22s %-44s %9s %14s %7s %14s %7s\n", "rank", "gpu", "device", "slices", "moe ms",
              "all-reduce ms", "share", "alone ms", "load s");
  for (const RankStats& r : all) {
    const std::string slices =
        r.num_slices == 1 ? DescribeSlice(opts, r.first_slice)
                          : "slices [" + std::to_string(r.first_slice) + ", " +
                                std::to_string(r.first_slice + r.num_slices) + ") in turn";
    const double step = r.moe_ms + r.allreduce_ms;
    std::printf("%4d %4d  %-22.22s %-44s %9.3f %14.3f %6.1f%% %14.3f %7.2f\n", r.rank, r.device, r.device_name,
                slices.c_str(), r.moe_ms, r.allreduce_ms, step > 0 ? 100.0 * r.allreduce_ms / step : 0.0,
                r.allreduce_alone_ms, r.load_s);
  }
  if (role.world > 1) {
    // NOTE: nccl-tests' convention: algorithm bandwidth = bytes / time; bus bandwidth = that times
    // 2 (n - 1) / n for an all-reduce (what each link carries).
    const double alone_s = all[0].allreduce_alone_ms * 1e-3;
    const double algbw = alone_s > 0 ? static_cast<double>(bytes) / alone_s / 1e9 : 0.0;
    std::printf("all-reduce: alone %.3f ms on rank 0: %.2f GB/s algorithm, %.2f GB/s bus bandwidth\n",
                all[0].allreduce_alone_ms, algbw, algbw * 2.0 * (role.world - 1) / role.world);
  }
  std::printf("one gpu:    the whole layer on rank 0's GPU: %.3f ms (median of %d), prepared in %.2f s\n", unsplit_ms,
              opts.repeat, unsplit_load_s);
  const MoeOutput sum_view{OutputDType::kF32, result.data()}, ref_view{OutputDType::kF32, unsplit.data()};
  std::printf("sum:        %s\n", cli::SummarizeOutput(sum_view, static_cast<int64_t>(count)).c_str());
  std::printf("unsplit:    %s\n", cli::SummarizeOutput(ref_view, static_cast<int64_t>(count)).c_str());
  std::printf("check:      all-reduced sum vs the unsplit layer: %s (bound %.3g on max |sum - unsplit| / "
              "max(|unsplit|, RMS))\n",
              DescribeSumCheck(check, width).c_str(), opts.tolerance);
  if (same_on_all) {
    std::printf("ranks:      all %d hold the same sum\n", role.world);
  } else {
    for (const RankStats& r : all)
      std::printf("ranks:      rank %d's sum has fnv1a64 0x%016llx\n", r.rank, (unsigned long long)r.sum_hash);
  }
  std::printf("result:     %s\n", *sum_matches ? "PASS" : "FAIL");
  if (!opts.output.empty()) {
    MXMOE_RETURN_IF_ERROR(WriteMoeOutputFile(opts.output, t_count, width, OutputDType::kF32, result.data()));
    std::printf("wrote:      %s\n", opts.output.c_str());
  }
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace mxmoe::dist
