// Benchmark of the fused CUDA MoE on a Kimi-K3 layer (SPEC sections 5 and 7): uniform top-16
// routing over 896 experts, T tokens. Each row is first checked against the unfused GPU reference
// (on up to 256 of its tokens: outputs of a token depend on that token alone), and prints no speed
// if the check fails. Timing: CUDA events around Run only, L2 flushed before every run, inputs
// rotated over 4 routings, 3 warm-up runs, median of --repeats (>= 20).
//   bench_moe [--experts 896] [--tokens 1,8,32,128,1024,4096,16384] [--repeats 20] [--csv FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/moe_run.h"
#include "gpu/gpu_harness.h"
#include "gpu/tolerance.h"
#include "mxmoe/cuda.h"
#include "mxmoe/formats.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {
namespace {

// SPEC section 6: measured ceilings of the lent H200; section 7: the plain PyTorch version.
constexpr double kReadBytesPerS = 4.06e12;
constexpr double kBf16FlopsPerS = 763e12;
double PytorchUs(int64_t t) {
  switch (t) {
    case 1: return 693;
    case 32: return 8240;
    case 1024: return 19900;
    case 16384: return 74900;
  }
  return 0;
}

struct Args {
  int64_t experts = 896;
  std::vector<int64_t> tokens = {1, 8, 32, 128, 1024, 4096, 16384};
  int repeats = 20;
  std::string csv;
};

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (k == "--experts") a->experts = std::stoll(v);
    else if (k == "--repeats") a->repeats = std::max(1, std::stoi(v));
    else if (k == "--csv") a->csv = v;
    else if (k == "--tokens") {
      a->tokens.clear();
      size_t pos = 0;
      while (pos < v.size()) {
        const size_t end = std::min(v.find(',', pos), v.size());
        a->tokens.push_back(std::stoll(v.substr(pos, end - pos)));
        pos = end + 1;
      }
    } else return false;
  }
  return true;
}

#define BENCH_CUDA(expr)                                                                \
  do {                                                                                  \
    const cudaError_t e_ = (expr);                                                      \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                  \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)
#define BENCH_OK(expr)                                                                  \
  do {                                                                                  \
    const Status s_ = (expr);                                                           \
    if (!s_.ok()) {                                                                     \
      std::fprintf(stderr, "%s: %s\n", #expr, s_.ToString().c_str());                   \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

// Fused output rows [t0, t0 + n) against RunReference on those tokens alone.
bool CheckRows(const CudaMoe& moe, const MoeInput& in, const std::vector<float>& fused, int64_t t0,
               int64_t n, void* ws, size_t ws_bytes, std::string* note) {
  const int64_t k_dim = moe.Layout().shape.hidden, top_k = moe.Layout().shape.top_k;
  MoeInput sub = in;
  sub.num_tokens = n;
  sub.x_bf16 = in.x_bf16 + t0 * k_dim;
  sub.topk_ids = in.topk_ids + t0 * top_k;
  sub.topk_weights = in.topk_weights + t0 * top_k;
  DeviceMem out(n * k_dim * 4);
  cudaMemset(out.ptr, 0xFF, out.bytes);
  const Status st = moe.RunReference(sub, {OutputDType::kF32, out.ptr}, ws, ws_bytes, nullptr);
  if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) {
    *note = "reference failed: " + st.ToString();
    return false;
  }
  std::vector<float> ref(n * k_dim);
  cudaMemcpy(ref.data(), out.ptr, ref.size() * 4, cudaMemcpyDeviceToHost);
  const std::vector<float> got(fused.begin() + t0 * k_dim, fused.begin() + (t0 + n) * k_dim);
  const auto r = MoeCloseF32(got, ref, {n, k_dim}, top_k * moe.Layout().LocalIntermediate());
  *note = r.message();
  return static_cast<bool>(r);
}

int Main(int argc, char** argv) {
  Args args;
  if (!Parse(argc, argv, &args)) {
    std::fprintf(stderr, "usage: bench_moe [--experts E] [--tokens 1,8,...] [--repeats N] [--csv FILE]\n");
    return 2;
  }
  LayerShape shape = kKimiK3Shape;
  shape.num_experts = args.experts;
  const auto devices = CudaDevices();
  if (devices.empty()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::printf("device: %s (cc %d.%d, %d SMs)\n", devices[0].name.c_str(), devices[0].major, devices[0].minor,
              devices[0].sm_count);
  auto t_make = std::chrono::steady_clock::now();
  ExpertSet set;
  SyntheticOptions opt;
  opt.seed = 2024;
  BENCH_OK(MakeSyntheticExperts(shape, Act(ActivationType::Situ), {}, opt, &set));
  auto t_create = std::chrono::steady_clock::now();
  std::unique_ptr<CudaMoe> moe;
  BENCH_OK(CudaMoe::Create(set, 0, &moe));
  auto t_done = std::chrono::steady_clock::now();
  std::printf("layer: E=%lld K=%lld I=%lld k=%lld Situ; synthetic %.1f s, CudaMoe::Create (upload + repack) %.2f s\n",
              static_cast<long long>(shape.num_experts), static_cast<long long>(shape.hidden),
              static_cast<long long>(shape.intermediate), static_cast<long long>(shape.top_k),
              std::chrono::duration<double>(t_create - t_make).count(),
              std::chrono::duration<double>(t_done - t_create).count());
  set.experts.clear();
  set.experts.shrink_to_fit();

  const int64_t k_dim = shape.hidden, i_dim = shape.intermediate, top_k = shape.top_k;
  const double expert_bytes = 3.0 * i_dim * k_dim / 2 + 3.0 * i_dim * k_dim / kMxBlock;  // MXFP4 + scales
  DeviceMem flush(size_t{256} << 20);  // > 60 MB L2
  FILE* csv = args.csv.empty() ? nullptr : std::fopen(args.csv.c_str(), "w");
  if (csv) std::fprintf(csv, "tokens,experts_touched,pairs,us,graph_us,gbps,tflops,pct_bw,pct_flops,pct_roofline,check\n");
  std::printf("\n%7s %8s %7s %10s %10s %8s %8s %7s %7s %8s %9s  %s\n", "T", "experts", "pairs", "us", "graph_us",
              "GB/s", "TFLOP/s", "%BW", "%FLOP", "%roof", "vs_torch", "check");
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  int failures = 0;

  for (int64_t t : args.tokens) {
    constexpr int kRotations = 4;
    std::vector<SyntheticInput> inputs(kRotations);
    std::vector<std::unique_ptr<DeviceCase>> cases;
    double touched = 0, pairs = 0;
    for (int r = 0; r < kRotations; ++r) {
      MakeSyntheticInput(shape, t, RoutingPattern::kUniform, 7000 + 31 * t + r, &inputs[r]);
      std::set<int32_t> distinct;
      for (int32_t id : inputs[r].topk_ids)
        if (id >= 0) distinct.insert(id), pairs += 1;
      touched += static_cast<double>(distinct.size());
      cases.push_back(std::make_unique<DeviceCase>(*moe, inputs[r]));
    }
    touched /= kRotations;
    pairs /= kRotations;

    // Correctness first: the first and last 128 tokens of rotation 0 against the reference.
    std::string note;
    const std::vector<float> fused = cases[0]->RunF32();
    bool ok = cudaGetLastError() == cudaSuccess;
    const int64_t head = std::min<int64_t>(t, 128);
    ok = ok && CheckRows(*moe, cases[0]->Input(), fused, 0, head, cases[0]->workspace(),
                         cases[0]->workspace_bytes(), &note);
    if (ok && t > 256)
      ok = CheckRows(*moe, cases[0]->Input(), fused, t - 128, 128, cases[0]->workspace(),
                     cases[0]->workspace_bytes(), &note);
    if (!ok) {
      ++failures;
      std::printf("%7lld  CHECK FAILED (no speed printed): %s\n", static_cast<long long>(t), note.c_str());
      if (csv) std::fprintf(csv, "%lld,,,,,,,,,,FAILED\n", static_cast<long long>(t));
      continue;
    }

    auto timed = [&](bool graph) -> double {
      std::vector<cudaGraphExec_t> execs(kRotations, nullptr);
      if (graph) {
        for (int r = 0; r < kRotations; ++r) {
          cudaGraph_t g;
          cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
          const Status st = cases[r]->Launch(OutputDType::kBF16, false, stream);
          cudaStreamEndCapture(stream, &g);
          if (!st.ok() || cudaGraphInstantiate(&execs[r], g, 0) != cudaSuccess) return -1;
          cudaGraphDestroy(g);
        }
      }
      std::vector<float> ms;
      for (int it = 0; it < 3 + args.repeats; ++it) {
        const int r = it % kRotations;
        cudaMemsetAsync(flush.ptr, it & 0xFF, flush.bytes, stream);
        cudaEventRecord(start, stream);
        if (graph) cudaGraphLaunch(execs[r], stream);
        else if (!cases[r]->Launch(OutputDType::kBF16, false, stream).ok()) return -1;
        cudaEventRecord(stop, stream);
        if (cudaEventSynchronize(stop) != cudaSuccess) return -1;
        float v = 0;
        cudaEventElapsedTime(&v, start, stop);
        if (it >= 3) ms.push_back(v);
      }
      for (auto e : execs)
        if (e) cudaGraphExecDestroy(e);
      std::sort(ms.begin(), ms.end());
      return 1e3 * ms[ms.size() / 2];
    };
    const double us = timed(false);
    const double graph_us = timed(true);
    if (us < 0) {
      ++failures;
      std::printf("%7lld  RUN FAILED: %s\n", static_cast<long long>(t), cudaGetErrorString(cudaGetLastError()));
      continue;
    }
    const double bytes = touched * expert_bytes + t * k_dim * 2.0 * 2 + t * top_k * 8.0;
    const double flops = 2.0 * pairs * 3.0 * i_dim * k_dim;
    const double gbps = bytes / (us * 1e-6) / 1e9, tflops = flops / (us * 1e-6) / 1e12;
    const double floor_us = 1e6 * std::max(bytes / kReadBytesPerS, flops / kBf16FlopsPerS);
    const double torch = PytorchUs(t);
    char vs[32] = "-";
    if (torch > 0) std::snprintf(vs, sizeof(vs), "%.1fx", torch / us);
    std::printf("%7lld %8.0f %7.0f %10.1f %10.1f %8.0f %8.1f %6.1f%% %6.1f%% %7.1f%% %9s  ok (%s)\n",
                static_cast<long long>(t), touched, pairs, us, graph_us, gbps, tflops,
                100.0 * gbps * 1e9 / kReadBytesPerS, 100.0 * tflops * 1e12 / kBf16FlopsPerS,
                100.0 * floor_us / us, vs, note.c_str());
    if (csv)
      std::fprintf(csv, "%lld,%.0f,%.0f,%.1f,%.1f,%.0f,%.2f,%.1f,%.1f,%.1f,ok\n", static_cast<long long>(t), touched,
                   pairs, us, graph_us, gbps, tflops, 100.0 * gbps * 1e9 / kReadBytesPerS,
                   100.0 * tflops * 1e12 / kBf16FlopsPerS, 100.0 * floor_us / us);
    std::fflush(stdout);
  }
  if (csv) std::fclose(csv);
  std::printf("\nbytes = distinct experts touched x %.2f MB + activations; FLOPs = 2 * pairs * 3 * I * K\n",
              expert_bytes / 1e6);
  std::printf("reproduce: bench_moe --experts %lld --repeats %d --tokens", static_cast<long long>(args.experts),
              args.repeats);
  for (size_t i = 0; i < args.tokens.size(); ++i)
    std::printf("%s%lld", i ? "," : " ", static_cast<long long>(args.tokens[i]));
  std::printf("\n");
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace mxmoe::test

int main(int argc, char** argv) { return mxmoe::test::Main(argc, argv); }
