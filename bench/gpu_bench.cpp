// mxmoe bench on the GPU. Per row: the inputs (several routings of the same shape), the fused
// result checked against the unfused GPU reference (CudaMoe::RunReference) on the first and last
// tokens (a token's output depends on that token alone), then the timing: CUDA events around Run
// only, 256 MB written between runs so L2 is cold, the inputs rotated, warm-up runs, the median of
// the timed ones; the device's free memory must not fall over the timed runs (Run allocates
// nothing), and a CUDA graph of each call is captured in global mode (where cudaMalloc
// is refused) and timed the same way. A row whose check fails prints no speed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/sweep.h"
#include "core/parallel.h"
#include "mxmoe/cuda.h"

namespace mxmoe::bench {

namespace {

// NOTE: GH100 (H100 / H200) has 50 MB of L2; writing 256 MB between runs evicts the previous
// run's weights and activations.
constexpr size_t kFlushBytes = size_t{256} << 20;

Status CudaOk(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Cuda(what + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  // At least 256 bytes, so that empty tensors still get a valid, aligned pointer.
  Status Allocate(size_t bytes, const std::string& what) {
    bytes_ = bytes;
    return CudaOk(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)), "allocating " + what);
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Seconds {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// One input on the device.
struct DeviceInput {
  DeviceBuffer x, ids, weights;
  MoeInput view;

  Status Upload(const SyntheticInput& in) {
    MXMOE_RETURN_IF_ERROR(x.Allocate(in.x_bf16.size() * 2, "hidden_states"));
    MXMOE_RETURN_IF_ERROR(ids.Allocate(in.topk_ids.size() * 4, "topk_ids"));
    MXMOE_RETURN_IF_ERROR(weights.Allocate(in.topk_weights.size() * 4, "topk_weights"));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpy(x.get(), in.x_bf16.data(), x.bytes(), cudaMemcpyHostToDevice), "hidden_states"));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemcpy(ids.get(), in.topk_ids.data(), ids.bytes(), cudaMemcpyHostToDevice), "topk_ids"));
    MXMOE_RETURN_IF_ERROR(
        CudaOk(cudaMemcpy(weights.get(), in.topk_weights.data(), weights.bytes(), cudaMemcpyHostToDevice), "topk_weights"));
    view.num_tokens = in.num_tokens;
    view.x_bf16 = x.get<uint16_t>();
    view.topk_ids = ids.get<int32_t>();
    view.topk_weights = weights.get<float>();
    return Status::Ok();
  }
};

// The GPU suite's tolerance for fused against the unfused GPU reference (tests/gpu/tolerance.h
// derives it): |got - ref| <= RMS(ref) * clamp(8 / sqrt(k I), 1/64, 1/8) + 2^-12 |ref| per element
// (two worst-case MXFP8 re-quantization flips of the intermediate), and a normwise relative error
// of at most max(4e-3, that absolute part / RMS / sqrt(tokens)).
struct Comparison {
  bool ok = true;
  double worst = 0;     // max |got - ref| / allowed
  double normwise = 0;  // ||got - ref|| / ||ref||
  std::string failure;  // the first mismatch, or the normwise excess
};

Comparison CompareRows(const float* got, const float* ref, int64_t rows, int64_t cols, int64_t pair_width,
                       int64_t first_token) {
  const size_t n = static_cast<size_t>(rows * cols);
  double sq = 0;
  size_t finite = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(ref[i])) sq += static_cast<double>(ref[i]) * ref[i], ++finite;
  const double rms = finite ? std::sqrt(sq / static_cast<double>(finite)) : 0.0;
  const double abs_of_rms = std::clamp(8.0 / std::sqrt(static_cast<double>(std::max<int64_t>(pair_width, 1))),
                                       1.0 / 64, 1.0 / 8);
  const double atol = abs_of_rms * rms, rtol = 1.0 / 4096;
  Comparison c;
  size_t bad = 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i];
    if (std::isnan(r) || std::isnan(g)) {
      if (std::isnan(r) && std::isnan(g)) continue;
    } else {
      const double d = std::fabs(g - r), allowed = atol + rtol * std::fabs(r);
      num += d * d;
      den += r * r;
      c.worst = std::max(c.worst, d / allowed);
      if (d <= allowed) continue;
    }
    if (bad++ == 0) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "token %lld col %lld: got %.6g, ref %.6g, allowed |diff| %.3g",
                    static_cast<long long>(first_token + static_cast<int64_t>(i) / cols),
                    static_cast<long long>(static_cast<int64_t>(i) % cols), g, r, atol + rtol * std::fabs(r));
      c.failure = buf;
    }
  }
  c.normwise = den > 0 ? std::sqrt(num / den) : (num > 0 ? HUGE_VAL : 0.0);
  const double bound = std::max(4e-3, abs_of_rms / std::sqrt(static_cast<double>(std::max<int64_t>(rows, 1))));
  if (bad) {
    c.ok = false;
    c.failure = std::to_string(bad) + " of " + std::to_string(n) + " elements outside tolerance; first at " + c.failure;
  } else if (c.normwise > bound) {
    c.ok = false;
    c.failure = "normwise relative error " + std::to_string(c.normwise) + " > " + std::to_string(bound);
  }
  return c;
}

// Device state shared by the rows of a sweep.
struct Gpu {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  DeviceBuffer flush;

  ~Gpu() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
  Status Init() {
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventCreate(&start), "cudaEventCreate"));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventCreate(&stop), "cudaEventCreate"));
    return flush.Allocate(kFlushBytes, "the L2 flush buffer");
  }
};

// The median µs of opt.repeats timed calls of launch(rotation) after opt.warmup untimed ones, L2
// flushed before each. With free_change, the device's free memory after the timed calls minus
// before them (bytes).
template <class Launch>
Status TimeCalls(Gpu& gpu, const SweepOptions& opt, const Launch& launch, double* median_us,
                 int64_t* free_change) {
  std::vector<float> ms;
  size_t free_before = 0, free_after = 0, total = 0;
  for (int it = 0; it < opt.warmup + opt.repeats; ++it) {
    if (it == opt.warmup && free_change) {
      MXMOE_RETURN_IF_ERROR(CudaOk(cudaStreamSynchronize(gpu.stream), "warm-up runs"));
      MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo"));
    }
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemsetAsync(gpu.flush.get(), it & 0xFF, kFlushBytes, gpu.stream), "L2 flush"));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventRecord(gpu.start, gpu.stream), "cudaEventRecord"));
    MXMOE_RETURN_IF_ERROR(launch(it % opt.rotations));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventRecord(gpu.stop, gpu.stream), "cudaEventRecord"));
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventSynchronize(gpu.stop), "timed run"));
    float v = 0;
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaEventElapsedTime(&v, gpu.start, gpu.stop), "cudaEventElapsedTime"));
    if (it >= opt.warmup) ms.push_back(v);
  }
  if (free_change) {
    MXMOE_RETURN_IF_ERROR(CudaOk(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo"));
    *free_change = static_cast<int64_t>(free_after) - static_cast<int64_t>(free_before);
  }
  std::sort(ms.begin(), ms.end());
  *median_us = 1e3 * ms[ms.size() / 2];
  return Status::Ok();
}

// Graph replays of each rotation's call, captured in global mode: a cudaMalloc (or any other call
// that is unsafe during capture) inside Run makes the capture fail.
class Graphs {
 public:
  ~Graphs() {
    for (cudaGraphExec_t e : execs_)
      if (e) cudaGraphExecDestroy(e);
  }
  template <class Launch>
  Status Capture(cudaStream_t stream, int count, const Launch& launch) {
    for (int r = 0; r < count; ++r) {
      MXMOE_RETURN_IF_ERROR(CudaOk(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture"));
      const Status st = launch(r);
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(stream, &graph);
      MXMOE_RETURN_IF_ERROR(st);
      MXMOE_RETURN_IF_ERROR(CudaOk(end, "graph capture of Run"));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      MXMOE_RETURN_IF_ERROR(CudaOk(inst, "cudaGraphInstantiate"));
      execs_.push_back(exec);
    }
    return Status::Ok();
  }
  cudaGraphExec_t operator[](int r) const { return execs_[static_cast<size_t>(r)]; }

 private:
  std::vector<cudaGraphExec_t> execs_;
};

// One row: inputs, check, timings. Problems of the row (a failed check, an error of Run) are
// recorded in *row; the Status is for the sweep (files that cannot be written).
Status MeasureRow(const CudaMoe& moe, const BenchLayer& layer, RoutingPattern routing, int64_t t,
                  const SweepOptions& opt, Gpu& gpu, Dump& dump, RowResult* row) {
  const LayerShape& s = layer.shape;
  const int64_t k_dim = s.hidden;
  Seconds clock;
  std::vector<SyntheticInput> inputs(static_cast<size_t>(opt.rotations));
  ParallelFor(opt.rotations, opt.threads, [&](int64_t r) {
    MakeSyntheticInput(s, t, routing, InputSeed(opt, routing, t, static_cast<int>(r)), &inputs[r]);
  });
  row->cost = MeanCost(s, inputs);
  MXMOE_RETURN_IF_ERROR(dump.WriteInput(layer, routing, inputs[0]));
  const double inputs_s = clock.Lap();

  // Any CUDA or API error below fails the row with its message.
  auto fail = [&](const Status& st) {
    row->check = RowResult::Check::kFailed;
    row->note = st.message();
    Progress("[%s %s T=%lld] FAILED: %s", layer.name.c_str(), RoutingPatternName(routing), static_cast<long long>(t),
             st.ToString().c_str());
    return Status::Ok();
  };
  std::vector<std::unique_ptr<DeviceInput>> dev(inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r) {
    dev[r] = std::make_unique<DeviceInput>();
    if (Status st = dev[r]->Upload(inputs[r]); !st.ok()) return fail(st);
  }
  const size_t out_elems = static_cast<size_t>(t * k_dim);
  const int64_t head = std::min(t, opt.check_tokens);
  const int64_t tail = t > 2 * opt.check_tokens ? opt.check_tokens : 0;  // the last tokens, when apart
  DeviceBuffer out_bf16, out_f32, ref_f32, workspace;
  row->workspace_bytes = moe.WorkspaceSize(t);
  for (const Status& st : {out_bf16.Allocate(out_elems * 2, "output"), out_f32.Allocate(out_elems * 4, "output"),
                           ref_f32.Allocate(static_cast<size_t>(head * k_dim) * 4, "reference output"),
                           workspace.Allocate(row->workspace_bytes, "workspace")})
    if (!st.ok()) return fail(st);

  // ---- correctness: the fused f32 output against RunReference on the first and last tokens ----
  std::vector<float> fused(out_elems);
  {
    Status st = CudaOk(cudaMemsetAsync(out_f32.get(), 0xFF, out_f32.bytes(), gpu.stream), "poisoning the output");
    if (st.ok()) st = moe.Run(dev[0]->view, {OutputDType::kF32, out_f32.get()}, workspace.get(), workspace.bytes(), gpu.stream);
    if (st.ok()) st = CudaOk(cudaStreamSynchronize(gpu.stream), "fused run");
    if (st.ok()) st = CudaOk(cudaMemcpy(fused.data(), out_f32.get(), out_elems * 4, cudaMemcpyDeviceToHost), "fused output");
    if (!st.ok()) return fail(st);
  }
  size_t unwritten = 0;
  for (float v : fused) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    unwritten += bits == 0xFFFFFFFFu;  // the poison pattern: no arithmetic here produces it
  }
  if (unwritten) return fail(Status::Internal(std::to_string(unwritten) + " output elements never written"));
  double worst = 0, normwise = 0;
  for (const auto& [t0, n] : {std::pair<int64_t, int64_t>{0, head}, std::pair<int64_t, int64_t>{t - tail, tail}}) {
    if (n == 0) continue;
    MoeInput sub = dev[0]->view;
    sub.num_tokens = n;
    sub.x_bf16 += t0 * k_dim;
    sub.topk_ids += t0 * s.top_k;
    sub.topk_weights += t0 * s.top_k;
    std::vector<float> ref(static_cast<size_t>(n * k_dim));
    Status st = CudaOk(cudaMemsetAsync(ref_f32.get(), 0xFF, ref_f32.bytes(), gpu.stream), "poisoning the reference");
    if (st.ok()) st = moe.RunReference(sub, {OutputDType::kF32, ref_f32.get()}, workspace.get(), workspace.bytes(), gpu.stream);
    if (st.ok()) st = CudaOk(cudaStreamSynchronize(gpu.stream), "reference run");
    if (st.ok()) st = CudaOk(cudaMemcpy(ref.data(), ref_f32.get(), ref.size() * 4, cudaMemcpyDeviceToHost), "reference output");
    if (!st.ok()) return fail(st);
    const Comparison c = CompareRows(fused.data() + t0 * k_dim, ref.data(), n, k_dim,
                                     s.top_k * s.intermediate, t0);
    if (!c.ok) return fail(Status::Invalid("fused vs GPU reference: " + c.failure));
    worst = std::max(worst, c.worst);
    normwise = std::max(normwise, c.normwise);
  }
  char note[160];
  std::snprintf(note, sizeof(note), "%lld tokens checked: max |diff|/allowed %.3f, normwise %.1e",
                static_cast<long long>(head + tail), worst, normwise);
  row->check = RowResult::Check::kOk;
  row->note = note;
  MXMOE_RETURN_IF_ERROR(dump.WriteOutput(layer, routing, t, fused));
  const double check_s = clock.Lap();

  // ---- timing: eager calls, then graph replays ----
  const MoeOutput out{OutputDType::kBF16, out_bf16.get()};
  const auto eager = [&](int r) { return moe.Run(dev[r]->view, out, workspace.get(), workspace.bytes(), gpu.stream); };
  int64_t free_change = 0;
  if (Status st = TimeCalls(gpu, opt, eager, &row->us, &free_change); !st.ok()) return fail(st);
  // Only a fall counts: memory freed late by an earlier row (graphs, buffers) would read as a rise.
  if (free_change < 0) {
    row->us = -1;
    return fail(Status::Internal("device free memory fell by " + std::to_string(-free_change) + " bytes over " +
                                 std::to_string(opt.repeats) + " timed calls: Run must not allocate"));
  }
  if (opt.graph) {
    Graphs graphs;
    Status st = graphs.Capture(gpu.stream, opt.rotations, eager);
    const auto replay = [&](int r) { return CudaOk(cudaGraphLaunch(graphs[r], gpu.stream), "cudaGraphLaunch"); };
    if (st.ok()) st = TimeCalls(gpu, opt, replay, &row->graph_us, nullptr);
    if (!st.ok()) {
      row->us = -1;
      return fail(st);
    }
  }
  Progress("[%s %s T=%lld] inputs %.1f s, check %.1f s, timing %.1f s", layer.name.c_str(), RoutingPatternName(routing),
           static_cast<long long>(t), inputs_s, check_s, clock.Lap());
  return Status::Ok();
}

}  // namespace

Status RunOnGpu(const SweepOptions& opt, int* failures) {
  *failures = 0;
  const std::vector<CudaDeviceInfo> devices = CudaDevices();
  if (devices.empty()) return Status::Unsupported("no CUDA device is visible (`mxmoe bench --dry-run` needs none)");
  const CudaDeviceInfo& d = devices[0];
  MXMOE_RETURN_IF_ERROR(CudaOk(cudaSetDevice(0), "cudaSetDevice"));
  RowWriter writer;
  MXMOE_RETURN_IF_ERROR(writer.Open(opt.csv, d.name));
  Dump dump(opt.dump_dir);
  Gpu gpu;
  MXMOE_RETURN_IF_ERROR(gpu.Init());
  std::printf("device: %s (cc %d.%d, %d SMs, %.1f GiB)\n", d.name.c_str(), d.major, d.minor, d.sm_count,
              static_cast<double>(d.total_memory) / (1 << 30));
  std::printf("timing: median of %d runs after %d warm-ups, CUDA events around Run, %zu MB written between runs "
              "(cold L2), %d inputs rotated; graph_us: the same call replayed from a CUDA graph\n",
              opt.repeats, opt.warmup, kFlushBytes >> 20, opt.rotations);
  std::printf("yardsticks: bytes = MXFP4 weights + scales of the distinct experts touched + x, out (bf16), ids, "
              "weights; FLOPs = 2 * pairs * 3 * I * K; %%read of %.2f TB/s, %%bf16 of %.0f TFLOP/s, "
              "%%roof = floor / time\n",
              kReadBytesPerS / 1e12, kBf16FlopsPerS / 1e12);
  std::vector<std::string> summary;
  int rows = 0, failed_rows = 0;
  for (const BenchLayer& layer : opt.layers) {
    Seconds clock;
    ExpertSet experts;
    SyntheticOptions so;
    so.seed = opt.seed;
    so.with_bias = layer.with_bias;
    so.num_threads = opt.threads;
    Progress("[%s] synthetic layer: %lld experts, %.2f GB of MXFP4 weights ...", layer.name.c_str(),
             static_cast<long long>(layer.shape.num_experts),
             ExpertBytes(layer.shape) * static_cast<double>(layer.shape.num_experts) / 1e9);
    MXMOE_RETURN_IF_ERROR(MakeSyntheticExperts(layer.shape, layer.activation, {}, so, &experts));
    Progress("[%s] synthetic layer made in %.1f s", layer.name.c_str(), clock.Lap());
    std::unique_ptr<CudaMoe> moe;
    const Status created = CudaMoe::Create(experts, 0, &moe);
    Progress("[%s] CudaMoe::Create (upload + repack) %.1f s%s", layer.name.c_str(), clock.Lap(),
             created.ok() ? "" : (": " + created.ToString()).c_str());
    writer.Header(stdout);
    if (created.ok() && dump.enabled()) {
      MXMOE_RETURN_IF_ERROR(dump.WriteLayer(layer, experts));
      Progress("[%s] weights written to %s/%s/ in %.1f s", layer.name.c_str(), opt.dump_dir.c_str(),
               layer.name.c_str(), clock.Lap());
    }
    experts = ExpertSet();  // the device holds the layer now; 15.7 GB of host memory for Kimi-K3

    // Without a CudaMoe every row of the layer fails with the reason; the other layers still run.
    for (RoutingPattern routing : layer.routings) {
      for (int64_t t : layer.tokens) {
        RowResult row;
        row.layer = &layer;
        row.routing = routing;
        row.tokens = t;
        row.command = ReproduceCommand(layer, routing, t, opt);
        if (created.ok()) {
          row.config = moe->Plan(t);
          MXMOE_RETURN_IF_ERROR(MeasureRow(*moe, layer, routing, t, opt, gpu, dump, &row));
        } else {
          row.check = RowResult::Check::kFailed;
          row.note = "CudaMoe::Create: " + created.message();
        }
        ++rows;
        if (row.check != RowResult::Check::kOk) ++*failures, ++failed_rows;
        MXMOE_RETURN_IF_ERROR(writer.Write(row, stdout));
      }
    }
    if (!created.ok()) continue;
    // Issue 5's memory target, asked of the layer whatever T the sweep ran.
    const size_t ws = moe->WorkspaceSize(kWorkspaceCheckTokens);
    char line[240];
    const bool limited = layer.shape.top_k == 16;
    const bool over = limited && static_cast<double>(ws) > kWorkspaceLimitBytes;
    std::snprintf(line, sizeof(line), "workspace %s: WorkspaceSize(%lld) = %.3f GB (k = %lld)%s", layer.name.c_str(),
                  static_cast<long long>(kWorkspaceCheckTokens), static_cast<double>(ws) / 1e9,
                  static_cast<long long>(layer.shape.top_k),
                  !limited ? "" : (over ? ": OVER the 2.5 GB limit" : ": within the 2.5 GB limit"));
    std::printf("%s\n", line);
    summary.push_back(line);
    if (over) ++*failures;
  }
  std::printf("\nsummary:\n");
  for (const std::string& s : summary) std::printf("  %s\n", s.c_str());
  std::printf("  rows: %d measured, %d failed (a failed row prints why: check, device error, or device memory "
              "allocated while timed)\n",
              rows - failed_rows, failed_rows);
  return Status::Ok();
}

}  // namespace mxmoe::bench
