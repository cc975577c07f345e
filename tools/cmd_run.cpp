// mxmoe run: one MoE layer, from a checkpoint or the embedded synthetic default, on the CPU or GPU.
// Everything that can be refused is checked before any work starts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cli_args.h"
#include "commands.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/cuda_host.h"
#include "mxmoe/formats.h"
#include "mxmoe/synthetic.h"
#include "output_summary.h"

namespace mxmoe::cli {

namespace {

constexpr int64_t kCpuDefaultExperts = 64;

// The device to run on: "cuda" needs a supported GPU; "auto" takes one if there is one.
Status ChooseDevice(const std::string& want, bool* use_cuda, std::string* why) {
  const auto devices = CudaDevices();
  if (want == "cpu") {
    *use_cuda = false;
    return Status::Ok();
  }
  if (want != "auto" && want != "cuda")
    return Status::Invalid("--device = '" + want + "': expected auto, cpu or cuda");
  if (!CudaBuilt()) {
    if (want == "cuda") return Status::Unsupported("--device cuda: this build has no CUDA backend");
    *use_cuda = false;
    *why = "no CUDA backend in this build";
    return Status::Ok();
  }
  if (devices.empty()) {
    if (want == "cuda") return Status::Unsupported("--device cuda: no CUDA device is visible");
    *use_cuda = false;
    *why = "no CUDA device seen";
    return Status::Ok();
  }
  *use_cuda = true;
  return Status::Ok();
}

std::string DescribeActivation(const ActivationSpec& a) {
  char buf[160];
  const ActParams& p = a.params;
  switch (a.type) {
    case ActivationType::Situ:
      if (!a.per_expert.empty()) return "Situ (per-expert beta, linear_beta)";
      std::snprintf(buf, sizeof(buf), "Situ (beta %g, linear_beta %g)", p.beta, p.linear_beta);
      return buf;
    case ActivationType::SwigluBias:
      std::snprintf(buf, sizeof(buf), "SwigluBias (alpha %g, limit %g)", p.alpha, p.limit);
      return buf;
    default:
      return ActivationName(a.type);
  }
}

double Median(std::vector<float> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Status CmdRun(const std::vector<std::string>& argv) {
  Args args;
  MXMOE_RETURN_IF_ERROR(Args::Parse(
      argv,
      {"checkpoint", "layer", "input", "output", "output-dtype", "device", "tokens", "tp-size", "tp-rank",
       "ep-size", "ep-rank", "experts", "seed", "routing", "threads", "repeat"},
      {"check"}, &args));

  // ---- options ----
  int64_t layer, tokens, tp_size, tp_rank, ep_size, ep_rank, experts_opt, threads, repeat;
  uint64_t seed;
  MXMOE_RETURN_IF_ERROR(args.Int("layer", 0, 0, 1 << 20, &layer));
  MXMOE_RETURN_IF_ERROR(args.Int("tokens", 4, 0, int64_t{1} << 24, &tokens));
  MXMOE_RETURN_IF_ERROR(args.Int("tp-size", 1, 1, 1 << 16, &tp_size));
  MXMOE_RETURN_IF_ERROR(args.Int("tp-rank", 0, 0, 1 << 16, &tp_rank));
  MXMOE_RETURN_IF_ERROR(args.Int("ep-size", 1, 1, 1 << 16, &ep_size));
  MXMOE_RETURN_IF_ERROR(args.Int("ep-rank", 0, 0, 1 << 16, &ep_rank));
  MXMOE_RETURN_IF_ERROR(args.Int("experts", 0, 1, 1 << 20, &experts_opt));
  MXMOE_RETURN_IF_ERROR(args.Int("threads", 0, 0, 4096, &threads));
  MXMOE_RETURN_IF_ERROR(args.Int("repeat", 1, 1, 100000, &repeat));
  MXMOE_RETURN_IF_ERROR(args.U64("seed", 1, &seed));
  const std::string out_dtype_name = args.Str("output-dtype", "bf16");
  OutputDType out_dtype;
  if (out_dtype_name == "bf16") out_dtype = OutputDType::kBF16;
  else if (out_dtype_name == "f32") out_dtype = OutputDType::kF32;
  else return Status::Invalid("--output-dtype = '" + out_dtype_name + "': expected bf16 or f32");
  RoutingPattern routing;
  MXMOE_RETURN_IF_ERROR(RoutingPatternFromName(args.Str("routing", "uniform"), &routing));
  const bool from_checkpoint = args.Has("checkpoint");
  if (args.Has("layer") && !from_checkpoint) return Status::Invalid("--layer needs --checkpoint");
  if (args.Has("experts") && from_checkpoint)
    return Status::Invalid("--experts applies to the synthetic layer only (the checkpoint's config gives E)");
  if (args.Has("tokens") && args.Has("input"))
    return Status::Invalid("--tokens applies to the synthetic input only (--input gives T)");
  bool use_cuda = false;
  std::string device_note;
  MXMOE_RETURN_IF_ERROR(ChooseDevice(args.Str("device", "auto"), &use_cuda, &device_note));

  ParallelSlice slice;
  slice.tp_size = static_cast<int32_t>(tp_size);
  slice.tp_rank = static_cast<int32_t>(tp_rank);
  slice.ep_size = static_cast<int32_t>(ep_size);
  slice.ep_rank = static_cast<int32_t>(ep_rank);

  // ---- the layer's shape and activation (cheap: config only) ----
  LayerShape shape;
  ActivationSpec activation;
  std::string layer_desc;
  const std::string ckpt = args.Str("checkpoint");
  std::unique_ptr<Checkpoint> checkpoint;
  if (from_checkpoint) {
    MXMOE_RETURN_IF_ERROR(Checkpoint::Open(ckpt, &checkpoint));
    shape = checkpoint->config().shape;
    activation = checkpoint->config().activation;
    layer_desc = "checkpoint " + ckpt + " layer " + std::to_string(layer);
  } else {
    shape = kKimiK3Shape;
    const bool small = !use_cuda && !args.Has("experts");
    shape.num_experts = args.Has("experts") ? experts_opt : (use_cuda ? shape.num_experts : kCpuDefaultExperts);
    if (shape.top_k > shape.num_experts) shape.top_k = shape.num_experts;
    activation.type = ActivationType::Situ;
    layer_desc = "embedded synthetic layer, Kimi-K3 shape (seed " + std::to_string(seed) + ")";
    if (small)
      layer_desc += "; CPU: " + std::to_string(kCpuDefaultExperts) +
                    " experts instead of 896 (--experts 896 for the full 15.7 GB layer)";
  }
  MXMOE_RETURN_IF_ERROR(shape.Validate());
  MXMOE_RETURN_IF_ERROR(slice.Validate(shape));

  // ---- the input (validated against the shape before the layer is loaded) ----
  HostMoeInput file_input;
  SyntheticInput synth_input;
  MoeInput in;
  if (args.Has("input")) {
    MXMOE_RETURN_IF_ERROR(ReadMoeInputFile(args.Str("input"), shape, &file_input));
    in = file_input.View();
  } else {
    MakeSyntheticInput(shape, tokens, routing, seed + 1000003, &synth_input);
    in.num_tokens = synth_input.num_tokens;
    in.x_bf16 = synth_input.x_bf16.data();
    in.topk_ids = synth_input.topk_ids.data();
    in.topk_weights = synth_input.topk_weights.data();
  }
  const int64_t t_count = in.num_tokens, k_dim = shape.hidden;
  std::vector<uint8_t> out_buf(t_count * k_dim * OutputDTypeSize(out_dtype));
  MoeOutput out{out_dtype, out_buf.data()};
  {
    ExpertSet probe;  // shape-only set for the call's validation
    probe.shape = shape;
    probe.slice = slice;
    MXMOE_RETURN_IF_ERROR(ValidateMoeCall(probe, in, out, /*check_ids=*/true));
  }

  // ---- the layer ----
  ExpertSet experts;
  const auto t_load0 = std::chrono::steady_clock::now();
  if (from_checkpoint) {
    MXMOE_RETURN_IF_ERROR(checkpoint->LoadLayer(layer, slice, &experts));
  } else {
    SyntheticOptions opt;
    opt.seed = seed;
    MXMOE_RETURN_IF_ERROR(MakeSyntheticExperts(shape, activation, slice, opt, &experts));
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load0).count();

  // ---- run ----
  std::vector<float> times;
  std::string backend;
  std::unique_ptr<CudaMoe> cuda_moe;
  const int cpu_threads = threads > 0 ? static_cast<int>(threads)
                                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (use_cuda) {
    MXMOE_RETURN_IF_ERROR(CudaMoe::Create(experts, /*device=*/0, &cuda_moe));
    const auto dev = CudaDevices()[0];
    backend = "cuda (" + dev.name + ", sm_" + std::to_string(dev.major) + std::to_string(dev.minor) + ")";
    CudaHostRunOptions opt;
    opt.repeats = static_cast<int>(repeat);
    MXMOE_RETURN_IF_ERROR(CudaRunHost(*cuda_moe, in, out, opt, &times));
  } else {
    backend = "cpu (" + std::to_string(cpu_threads) + " threads)";
    if (!device_note.empty()) backend += "; " + device_note;
    for (int64_t r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      MXMOE_RETURN_IF_ERROR(CpuMoe(experts, in, out, cpu_threads));
      times.push_back(static_cast<float>(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()));
    }
  }

  // ---- report ----
  std::printf("layer:      %s\n", layer_desc.c_str());
  std::printf("shape:      E=%lld K=%lld I=%lld k=%lld; this rank: tp rank %d of %d, ep rank %d of %d -> %lld experts [%lld, %lld), I_local=%lld\n",
              (long long)shape.num_experts, (long long)shape.hidden, (long long)shape.intermediate,
              (long long)shape.top_k, slice.tp_rank, slice.tp_size, slice.ep_rank, slice.ep_size,
              (long long)experts.NumLocalExperts(), (long long)experts.FirstExpert(),
              (long long)(experts.FirstExpert() + experts.NumLocalExperts()), (long long)experts.LocalIntermediate());
  std::printf("activation: %s\n", DescribeActivation(experts.activation).c_str());
  std::printf("input:      T=%lld tokens (%s)%s\n", (long long)t_count,
              args.Has("input") ? args.Str("input").c_str() : RoutingPatternName(routing),
              in.x_bf16 ? ", bf16" : ", mxfp8");
  std::printf("backend:    %s\n", backend.c_str());
  std::printf("time:       %.3f ms (median of %zu), layer load %.2f s\n", Median(times), times.size(), load_s);
  std::printf("output:     %s [%lld, %lld], %s\n", OutputDTypeName(out_dtype), (long long)t_count,
              (long long)k_dim, SummarizeOutput(out, t_count * k_dim).c_str());

  // The error against a reference in the output's dtype: the CPU backend must match bitwise.
  const bool embedded_gpu_default = use_cuda && !from_checkpoint && !args.Has("input");
  if (args.Has("check") || embedded_gpu_default) {
    std::vector<uint8_t> ref_buf(out_buf.size());
    const MoeOutput ref{out_dtype, ref_buf.data()};
    std::string ref_name;
    if (use_cuda && args.Has("check")) {
      CudaHostRunOptions opt;
      opt.reference = true;
      MXMOE_RETURN_IF_ERROR(CudaRunHost(*cuda_moe, in, ref, opt, nullptr));
      ref_name = "unfused GPU reference";
    } else if (use_cuda) {
      // The CPU backend is bitwise the reference and uses every core.
      MXMOE_RETURN_IF_ERROR(CpuMoe(experts, in, ref, cpu_threads));
      ref_name = "CPU reference";
    } else {
      MXMOE_RETURN_IF_ERROR(ReferenceMoe(experts, in, ref));
      ref_name = "CPU reference (ReferenceMoe)";
    }
    std::printf("check:      vs %s: %s\n", ref_name.c_str(), CompareToReference(out, ref, t_count * k_dim).c_str());
  }

  if (args.Has("output")) {
    MXMOE_RETURN_IF_ERROR(WriteMoeOutputFile(args.Str("output"), t_count, k_dim, out_dtype, out.data));
    std::printf("wrote:      %s\n", args.Str("output").c_str());
  }
  return Status::Ok();
}

}  // namespace mxmoe::cli
