// The mxmoe command line: run, info, make-checkpoint, make-input, bench.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"

namespace {

const char kUsage[] = R"(mxmoe: fused MoE layers, MXFP8 activations x MXFP4 weights (SPEC: shared/SPEC.md)

usage: mxmoe <command> [options]

commands:
  run              compute one MoE layer
  info             the build (version, CUDA targets) and the devices seen
  make-checkpoint  write a synthetic checkpoint in the Kimi-K3 layout
  make-input       write an input file (hidden_states, topk_ids, topk_weights)
  bench            the benchmark sweep on the GPU (needs the CUDA backend)
  help, --help     this text; `mxmoe <command> --help` for a command's options
  --version        the version

mxmoe run [--checkpoint DIR --layer N] [--input IN.safetensors] [--output OUT.safetensors]
          [--output-dtype bf16|f32] [--device auto|cpu|cuda] [--tokens T]
          [--tp-size N --tp-rank R] [--ep-size N --ep-rank R]
          [--experts E] [--seed S] [--routing PATTERN] [--threads N] [--check] [--repeat N]
  --checkpoint DIR   a checkpoint directory: config.json and *.safetensors (sharded through
                     model.safetensors.index.json), tensors
                     language_model.model.layers.{N}.block_sparse_moe.experts.{e}.w{1,2,3}
                     .weight_packed / .weight_scale (MXFP4, group 32), read as they are
  --layer N          the layer to run (default 0)
  --input FILE       hidden_states BF16 [T, K] (or F8_E4M3 [T, K] with hidden_states_scale U8
                     [T, K/32]), topk_ids I32 [T, k] (global ids, -1 = none), topk_weights F32 [T, k]
  --output FILE      writes `output` [T, K] (this rank's partial sum with TP or EP)
  --output-dtype     bf16 (default) or f32
  --device           auto (default: the GPU when there is a supported one), cpu, cuda
  --tokens T         tokens of the synthetic input when no --input is given (default 4)
  --tp-size, --tp-rank, --ep-size, --ep-rank
                     this rank's tensor- / expert-parallel slice (default 1 / 0)
  --experts E        experts of the embedded synthetic layer (default 896 on a GPU; 64 on the
                     CPU, to keep memory and time small: the full layer is 15.7 GB)
  --seed S           seed of the synthetic layer and input (default 1)
  --routing P        synthetic routing: uniform (default), one_expert, few_experts, with_invalid,
                     heavy_hitters
  --threads N        CPU threads (default: all cores)
  --check            also compute the reference (CPU ReferenceMoe for cpu; the unfused GPU
                     reference for cuda) and print the error against it
  --repeat N         run N times and report the median time (default 1)
  With no --checkpoint, the embedded default: a synthetic layer of the Kimi-K3 shape (K 3584,
  I 3072, k 16, SiTU beta 4.0 / linear beta 25.0) from the seed, random routing for --tokens.
  It prints what it ran: shape, backend, activation, time and a checksum of the output.

mxmoe make-checkpoint --out DIR [--experts E] [--hidden K] [--intermediate I] [--top-k k]
          [--layers L] [--shards S] [--activation situ|silu|gelu|gelu_pytorch_tanh]
          [--situ-beta B] [--situ-linear-beta B] [--text-config] [--seed S]
  Synthetic layers (default E 8, K 256, I 256, k 2, 1 layer, 1 shard, situ 4/25) in the
  Kimi-K3 checkpoint layout; --text-config puts the fields under "text_config".

mxmoe make-input --out FILE (--checkpoint DIR | [--experts E] [--hidden K] [--top-k k])
          [--tokens T] [--routing P] [--seed S]
  A synthetic input file for `mxmoe run --input`.

mxmoe bench [--shapes all|kimi-k3,gpt-oss-120b,deepseek-v3] [--tokens T,...] [--routing P,...]
          [--experts E] [--repeats N] [--warmup N] [--check-tokens N] [--seed S] [--threads N]
          [--csv FILE] [--dump DIR] [--no-graph] [--dry-run]
  The benchmark of the fused operator on device 0 (SM90). The default sweep: Kimi-K3 (896 experts,
  top-16, Situ) with uniform and heavy_hitters routing (half the picks on a few experts) at T = 1,
  8, 32, 128, 1024, 4096, 16384; GPT-OSS-120B and DeepSeek-V3-style with uniform routing at T = 1,
  32, 4096 (synthetic layers from --seed, default 2024). Each row is first checked against the
  unfused GPU reference on its first and last --check-tokens tokens (default 128) and prints no
  speed if that fails; then the median of --repeats (default 20) calls after --warmup (3), CUDA
  events around the call, L2 flushed and 4 inputs rotated, eager and as a CUDA graph replay
  (--no-graph skips it); GB/s, TFLOP/s, % of the 4.06 TB/s read roofline and of the 763 TFLOP/s
  bf16 peak (SPEC section 7), the workspace and the command that reproduces the row. A row also
  fails if the device's free memory changes over its timed calls. The workspace of a T = 16384
  call is reported per shape (at most 2.5 GB for k = 16).
  --tokens, --routing, --experts  replace the token counts, routings, expert counts of the shapes
  --csv FILE    the rows as CSV
  --dump DIR    weights, inputs and mxmoe's outputs for the peers (bench/peers/, `make bench`)
  --dry-run     the rows' routing statistics, bytes, FLOPs and floors, without a GPU
  Without the CUDA backend it refuses (exit 1). Exit 2 when a row failed.

Exit status: 0 on success; 1 when the input or the arguments are refused (one line on stderr
naming the tensor, field or option and what was expected); 2 on internal or device errors.
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, stdout);
    return args.empty() ? 1 : 0;
  }
  if (args[0] == "--version") {
    std::printf("mxmoe %s\n", MXMOE_VERSION);
    return 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  mxmoe::Status st;
  if (cmd == "run") st = mxmoe::cli::CmdRun(args);
  else if (cmd == "info") st = mxmoe::cli::CmdInfo(args);
  else if (cmd == "make-checkpoint") st = mxmoe::cli::CmdMakeCheckpoint(args);
  else if (cmd == "make-input") st = mxmoe::cli::CmdMakeInput(args);
  else if (cmd == "bench") st = mxmoe::cli::CmdBench(args);
  else st = mxmoe::Status::Invalid("unknown command '" + cmd + "' (see mxmoe --help)");
  if (st.ok()) return 0;
  std::fprintf(stderr, "mxmoe %s: %s\n", cmd.c_str(), st.ToString().c_str());
  const bool user_error = st.code() == mxmoe::StatusCode::kInvalidArgument ||
                          st.code() == mxmoe::StatusCode::kIoError ||
                          st.code() == mxmoe::StatusCode::kUnsupported;
  return user_error ? 1 : 2;
}
