// The benchmark's sweep and yardsticks: which layers, routings and token counts `mxmoe bench`
// measures (SPEC section 5, issue 5), the bytes, FLOPs and time floor of each row (SPEC section 7),
// the table and CSV every row is written to, and the files a peer reads the same inputs from.
// Host-only: the timed GPU part is bench/gpu_bench.cpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "mxmoe/json.h"
#include "mxmoe/moe.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::bench {

// NOTE: SPEC section 6, measured on the lent H200 with PyTorch 2.11: streaming read 4.06 TB/s,
// dense bf16 matmul 763 TFLOP/s (SM90 has no MX datapath: bf16 is the tensor rate it reaches).
inline constexpr double kReadBytesPerS = 4.06e12;
inline constexpr double kBf16FlopsPerS = 763e12;
// The CSV's device for a dry run (nothing ran on a GPU).
inline constexpr const char* kDryRunDevice = "none (dry run)";
// Issue 5: the workspace of a T = 16384, k = 16 call is at most 2.5 GB.
inline constexpr int64_t kWorkspaceCheckTokens = 16384;
inline constexpr double kWorkspaceLimitBytes = 2.5e9;

// One layer of SPEC section 5 and the rows measured on it.
struct BenchLayer {
  std::string name;  // "kimi-k3", "gpt-oss-120b", "deepseek-v3"
  LayerShape shape;
  ActivationSpec activation;
  bool with_bias = false;  // SwigluBias gate/up biases (GPT-OSS has them)
  std::vector<RoutingPattern> routings;
  std::vector<int64_t> tokens;
};

// Kimi-K3 (uniform and heavy-hitter routing, T = 1 ... 16384), GPT-OSS-120B and DeepSeek-V3-style
// (uniform, T = 1, 32, 4096).
std::vector<BenchLayer> DefaultLayers();

// What to run and how: parsed by `mxmoe bench`.
struct SweepOptions {
  std::vector<BenchLayer> layers;
  int repeats = 20;           // timed runs per row; the median is reported
  int warmup = 3;             // untimed runs first
  int64_t check_tokens = 128;  // tokens checked against the GPU reference at each end of a row
  uint64_t seed = 2024;       // of the synthetic layers; each row's inputs derive from it
  int rotations = 4;          // distinct inputs cycled through while timing
  bool graph = true;          // also time a CUDA graph replay of each call
  int threads = 0;            // host threads for the synthetic data (0 = all)
  std::string csv;            // the rows as CSV (empty: none)
  std::string dump_dir;       // weights, inputs and outputs for the peers (empty: none)
  // The options the user changed from their defaults, as `--name value` (repeated in each row's
  // reproducing command).
  std::string extra_args;
};

// The seed of one row's inputs (rotation r): rows differ from each other and from the layer.
uint64_t InputSeed(const SweepOptions& opt, RoutingPattern routing, int64_t tokens, int rotation);

// The yardsticks of one call (SPEC section 7).
struct RowCost {
  double experts_touched = 0;  // distinct experts with a valid pair
  double pairs = 0;            // valid (token, slot) pairs
  double bytes = 0;  // MXFP4 weights + scales of the touched experts, x and out in bf16, ids + weights
  double flops = 0;  // 2 * pairs * 3 * I * K
  double FloorUs() const;     // max(bytes / read rate, flops / bf16 rate)
  bool MemoryBound() const;   // the bytes term is the larger
};
// Bytes of one expert's MXFP4 weights and scales (17.55 MB for Kimi-K3).
double ExpertBytes(const LayerShape& s);
RowCost CostOf(const LayerShape& s, const SyntheticInput& in);
// The mean over several inputs of the same row (the timed runs cycle through them).
RowCost MeanCost(const LayerShape& s, const std::vector<SyntheticInput>& inputs);

// One measured (or planned) row.
struct RowResult {
  const BenchLayer* layer = nullptr;
  RoutingPattern routing = RoutingPattern::kUniform;
  int64_t tokens = 0;
  RowCost cost;
  size_t workspace_bytes = 0;
  enum class Check { kNotRun, kOk, kFailed } check = Check::kNotRun;
  std::string note;      // the check's observed error, or why the row failed
  double us = -1;        // median µs of an eager Run; < 0: not measured
  double graph_us = -1;  // median µs of a graph replay; < 0: not measured
  std::string command;   // reproduces the row
  std::string config;    // CudaMoe::Plan: the GEMM config (and chunks) the row ran
};

// The command that measures this row alone.
std::string ReproduceCommand(const BenchLayer& layer, RoutingPattern routing, int64_t tokens,
                             const SweepOptions& opt);

// The printed table and the CSV file. Rows that failed their check print no speed.
class RowWriter {
 public:
  ~RowWriter();
  // csv_path empty: the table only. device (the GPU's name, or what a dry run ran on) goes into
  // every CSV row: the yardsticks are the H200's whatever the card, and bench/report.py says when a
  // run was on another one.
  Status Open(const std::string& csv_path, const std::string& device);
  void Header(FILE* out) const;
  Status Write(const RowResult& row, FILE* out);

 private:
  FILE* csv_ = nullptr;
  std::string csv_path_;
  std::string device_;
};

// The files a peer reads (bench/peers/*.py), under `dir`:
//   manifest.json                              the layers (shape, activation, weights file and the
//                                              tensors of one expert in it) and the rows
//   <layer>/weights.bin                        raw: expert after expert, w1 / w3 / w2 weight_packed
//                                              and weight_scale (U8, checkpoint layout), then
//                                              gate_bias and up_bias (F32) where the layer has them
//   <layer>/<routing>_T<T>.input.safetensors   hidden_states, topk_ids, topk_weights (rotation 0)
//   <layer>/<routing>_T<T>.output.safetensors  mxmoe's output (F32) for that input, when it passed
class Dump {
 public:
  explicit Dump(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  Status WriteLayer(const BenchLayer& layer, const ExpertSet& experts);
  Status WriteInput(const BenchLayer& layer, RoutingPattern routing, const SyntheticInput& in);
  Status WriteOutput(const BenchLayer& layer, RoutingPattern routing, int64_t tokens,
                     const std::vector<float>& out);
  // The manifest, listing every layer and row written so far (called after each row, so an
  // interrupted sweep still leaves a readable directory).
  Status WriteManifest() const;

 private:
  std::string RowBase(const BenchLayer& layer, RoutingPattern routing, int64_t tokens) const;
  std::string dir_;
  JsonValue layers_ = JsonValue::MakeArray(), rows_ = JsonValue::MakeArray();
};

// The sweep without a GPU: each row's routing statistics, yardsticks and command, and the dump's
// weights and inputs (no outputs). What `mxmoe bench --dry-run` prints.
Status RunDry(const SweepOptions& opt, int* failures);

// The sweep on device 0 (bench/gpu_bench.cpp); refuses in a build without the CUDA backend.
// *failures counts rows whose check failed, during whose timed calls the device's free memory
// fell, or that could not run, and a workspace over the limit.
Status RunOnGpu(const SweepOptions& opt, int* failures);

// Progress lines on stderr ("[kimi-k3] ..."), so that stdout holds only the table.
void Progress(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace mxmoe::bench
