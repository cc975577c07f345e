// The sweep, its yardsticks, the table / CSV and the peers' files (see sweep.h).
#include "bench/sweep.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <filesystem>

#include "core/parallel.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/formats.h"

namespace mxmoe::bench {

std::vector<BenchLayer> DefaultLayers() {
  const std::vector<int64_t> decode_to_prefill = {1, 8, 32, 128, 1024, 4096, 16384};
  const std::vector<int64_t> three_points = {1, 32, 4096};
  std::vector<BenchLayer> layers(3);

  BenchLayer& kimi = layers[0];
  kimi.name = "kimi-k3";
  kimi.shape = kKimiK3Shape;
  kimi.activation.type = ActivationType::Situ;  // beta 4, linear beta 25: ActParams' defaults
  // Heavy hitters: half of every token's picks go to a few experts (issue 5's skewed routing).
  kimi.routings = {RoutingPattern::kUniform, RoutingPattern::kHeavyHitters};
  kimi.tokens = decode_to_prefill;

  BenchLayer& gpt = layers[1];
  gpt.name = "gpt-oss-120b";
  gpt.shape = {/*num_experts=*/128, /*hidden=*/2880, /*intermediate=*/2880, /*top_k=*/4};
  gpt.activation.type = ActivationType::SwigluBias;  // alpha 1.702, limit 7.0: the defaults
  gpt.with_bias = true;
  gpt.routings = {RoutingPattern::kUniform};
  gpt.tokens = three_points;

  BenchLayer& deepseek = layers[2];
  deepseek.name = "deepseek-v3";
  deepseek.shape = {/*num_experts=*/256, /*hidden=*/7168, /*intermediate=*/2048, /*top_k=*/8};
  deepseek.activation.type = ActivationType::Swiglu;
  deepseek.routings = {RoutingPattern::kUniform};
  deepseek.tokens = three_points;
  return layers;
}

uint64_t InputSeed(const SweepOptions& opt, RoutingPattern routing, int64_t tokens, int rotation) {
  return opt.seed * 1000003ull + static_cast<uint64_t>(routing) * 7919ull + static_cast<uint64_t>(tokens) * 31ull +
         static_cast<uint64_t>(rotation) + 1;
}

double ExpertBytes(const LayerShape& s) {
  const double values = 3.0 * static_cast<double>(s.intermediate) * static_cast<double>(s.hidden);
  return values / 2 + values / kMxBlock;  // E2M1 nibbles + one UE8M0 byte per 32
}

RowCost CostOf(const LayerShape& s, const SyntheticInput& in) {
  std::vector<char> touched(static_cast<size_t>(s.num_experts), 0);
  RowCost c;
  for (int32_t id : in.topk_ids) {
    if (id < 0 || id >= s.num_experts) continue;
    c.pairs += 1;
    if (!touched[id]) touched[id] = 1, c.experts_touched += 1;
  }
  const double t = static_cast<double>(in.num_tokens), k_dim = static_cast<double>(s.hidden);
  c.bytes = c.experts_touched * ExpertBytes(s) + t * k_dim * 2 * 2 + t * static_cast<double>(s.top_k) * 8;
  c.flops = 2.0 * c.pairs * 3.0 * static_cast<double>(s.intermediate) * k_dim;
  return c;
}

RowCost MeanCost(const LayerShape& s, const std::vector<SyntheticInput>& inputs) {
  RowCost mean;
  for (const SyntheticInput& in : inputs) {
    const RowCost c = CostOf(s, in);
    mean.experts_touched += c.experts_touched;
    mean.pairs += c.pairs;
    mean.bytes += c.bytes;
    mean.flops += c.flops;
  }
  const double n = static_cast<double>(std::max<size_t>(inputs.size(), 1));
  mean.experts_touched /= n;
  mean.pairs /= n;
  mean.bytes /= n;
  mean.flops /= n;
  return mean;
}

double RowCost::FloorUs() const { return 1e6 * std::max(bytes / kReadBytesPerS, flops / kBf16FlopsPerS); }
bool RowCost::MemoryBound() const { return bytes / kReadBytesPerS >= flops / kBf16FlopsPerS; }

std::string ReproduceCommand(const BenchLayer& layer, RoutingPattern routing, int64_t tokens,
                             const SweepOptions& opt) {
  return "mxmoe bench --shapes " + layer.name + " --routing " + RoutingPatternName(routing) + " --tokens " +
         std::to_string(tokens) + opt.extra_args;
}

// ---- table and CSV -----------------------------------------------------------------------------

namespace {

// RFC 4180 quoting for the free-text fields (notes hold commas).
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return q + "\"";
}

std::string Num(double v, const char* fmt) {
  if (v < 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

const char* CheckName(RowResult::Check c) {
  switch (c) {
    case RowResult::Check::kOk: return "ok";
    case RowResult::Check::kFailed: return "FAILED";
    case RowResult::Check::kNotRun: break;
  }
  return "not run";
}

}  // namespace

RowWriter::~RowWriter() {
  if (csv_) std::fclose(csv_);
}

Status RowWriter::Open(const std::string& csv_path, const std::string& device) {
  device_ = device;
  if (csv_path.empty()) return Status::Ok();
  csv_ = std::fopen(csv_path.c_str(), "w");
  if (csv_ == nullptr) return Status::Io("--csv " + csv_path + ": " + std::strerror(errno));
  csv_path_ = csv_path;
  std::fprintf(csv_,
               "layer,routing,tokens,num_experts,hidden,intermediate,top_k,experts_touched,pairs,bytes,flops,"
               "floor_us,bound,us,graph_us,gbps,tflops,pct_read_roofline,pct_bf16_peak,pct_roofline,"
               "workspace_bytes,check,note,command,config,device\n");
  std::fflush(csv_);
  return Status::Ok();
}

void RowWriter::Header(FILE* out) const {
  std::fprintf(out, "\n%-13s %-13s %6s %7s %7s %10s %10s %7s %8s %6s %6s %6s %10s %9s  %s\n", "layer", "routing", "T",
               "experts", "pairs", "us", "graph_us", "GB/s", "TFLOP/s", "%read", "%bf16", "%roof", "floor_us", "ws_MB",
               "check");
}

Status RowWriter::Write(const RowResult& r, FILE* out) {
  const LayerShape& s = r.layer->shape;
  const bool timed = r.check != RowResult::Check::kFailed && r.us > 0;
  const double sec = r.us * 1e-6;
  const double gbps = timed ? r.cost.bytes / sec / 1e9 : -1, tflops = timed ? r.cost.flops / sec / 1e12 : -1;
  const double pct_read = timed ? 100.0 * r.cost.bytes / sec / kReadBytesPerS : -1;
  const double pct_bf16 = timed ? 100.0 * r.cost.flops / sec / kBf16FlopsPerS : -1;
  const double pct_roof = timed ? 100.0 * r.cost.FloorUs() / r.us : -1;
  const double ws_mb = r.workspace_bytes ? static_cast<double>(r.workspace_bytes) / 1e6 : -1;
  const std::string routing = RoutingPatternName(r.routing);
  auto cell = [](double v, const char* fmt) {
    const std::string s = Num(v, fmt);
    return s.empty() ? std::string("-") : s;
  };
  if (r.check == RowResult::Check::kFailed) {
    std::fprintf(out, "%-13s %-13s %6lld %7.0f %7.0f  FAILED, no speed printed: %s\n", r.layer->name.c_str(),
                 routing.c_str(), static_cast<long long>(r.tokens), r.cost.experts_touched, r.cost.pairs,
                 r.note.c_str());
  } else {
    const std::string check = std::string(CheckName(r.check)) + (r.note.empty() ? "" : " (" + r.note + ")");
    std::fprintf(out, "%-13s %-13s %6lld %7.0f %7.0f %10s %10s %7s %8s %6s %6s %6s %10.1f %9s  %s\n",
                 r.layer->name.c_str(), routing.c_str(), static_cast<long long>(r.tokens), r.cost.experts_touched,
                 r.cost.pairs, cell(r.us, "%.1f").c_str(), cell(r.graph_us, "%.1f").c_str(), cell(gbps, "%.0f").c_str(),
                 cell(tflops, "%.1f").c_str(), cell(pct_read, "%.1f").c_str(), cell(pct_bf16, "%.1f").c_str(),
                 cell(pct_roof, "%.1f").c_str(), r.cost.FloorUs(), cell(ws_mb, "%.1f").c_str(), check.c_str());
  }
  std::fprintf(out, "    $ %s%s%s\n", r.command.c_str(), r.config.empty() ? "" : "   # ", r.config.c_str());
  std::fflush(out);
  if (csv_ == nullptr) return Status::Ok();
  std::fprintf(csv_, "%s,%s,%lld,%lld,%lld,%lld,%lld,%.2f,%.2f,%.0f,%.0f,%.3f,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n",
               r.layer->name.c_str(), routing.c_str(), static_cast<long long>(r.tokens),
               static_cast<long long>(s.num_experts), static_cast<long long>(s.hidden),
               static_cast<long long>(s.intermediate), static_cast<long long>(s.top_k), r.cost.experts_touched,
               r.cost.pairs, r.cost.bytes, r.cost.flops, r.cost.FloorUs(), r.cost.MemoryBound() ? "memory" : "tensor",
               Num(timed ? r.us : -1, "%.2f").c_str(), Num(timed ? r.graph_us : -1, "%.2f").c_str(),
               Num(gbps, "%.1f").c_str(), Num(tflops, "%.3f").c_str(), Num(pct_read, "%.2f").c_str(),
               Num(pct_bf16, "%.2f").c_str(), Num(pct_roof, "%.2f").c_str(),
               r.workspace_bytes ? std::to_string(r.workspace_bytes).c_str() : "", CheckName(r.check),
               CsvField(r.note).c_str(), CsvField(r.command).c_str(), CsvField(r.config).c_str(),
               CsvField(device_).c_str());
  if (std::fflush(csv_) != 0) return Status::Io("--csv " + csv_path_ + ": " + std::strerror(errno));
  return Status::Ok();
}

// ---- the peers' files --------------------------------------------------------------------------

namespace {

Status MakeDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Io("--dump " + dir + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

std::string Dump::RowBase(const BenchLayer& layer, RoutingPattern routing, int64_t tokens) const {
  return layer.name + "/" + RoutingPatternName(routing) + "_T" + std::to_string(tokens);
}

Status Dump::WriteLayer(const BenchLayer& layer, const ExpertSet& experts) {
  if (!enabled()) return Status::Ok();
  if (!experts.slice.IsFull()) return Status::Internal("Dump::WriteLayer: the dump holds whole layers only");
  MXMOE_RETURN_IF_ERROR(MakeDir(dir_ + "/" + layer.name));
  // The weights as raw bytes, expert after expert, each expert's tensors in the order the manifest
  // lists: no header to build, and no fsync (unlike WriteSafetensors): the file is scratch data
  // for the peers, and forcing Kimi-K3's 15.7 GB to disk would cost more than the whole sweep.
  const std::string rel = layer.name + "/weights.bin", path = dir_ + "/" + rel;
  const LayerShape& s = layer.shape;
  const int64_t i_dim = s.intermediate, k_dim = s.hidden;
  JsonValue tensors = JsonValue::MakeArray();
  const auto describe = [&](const char* name, const char* dtype, int64_t rows, int64_t cols) {
    JsonValue t = JsonValue::MakeObject();
    t.Set("name", JsonValue::String(name));
    t.Set("dtype", JsonValue::String(dtype));
    JsonValue shape = JsonValue::MakeArray();
    shape.Append(JsonValue::Integer(rows));
    if (cols > 0) shape.Append(JsonValue::Integer(cols));
    t.Set("shape", std::move(shape));
    tensors.Append(std::move(t));
  };
  describe("w1.weight_packed", "U8", i_dim, k_dim / 2);
  describe("w1.weight_scale", "U8", i_dim, k_dim / kMxBlock);
  describe("w3.weight_packed", "U8", i_dim, k_dim / 2);
  describe("w3.weight_scale", "U8", i_dim, k_dim / kMxBlock);
  describe("w2.weight_packed", "U8", k_dim, i_dim / 2);
  describe("w2.weight_scale", "U8", k_dim, i_dim / kMxBlock);
  if (layer.with_bias) {
    describe("gate_bias", "F32", i_dim, 0);
    describe("up_bias", "F32", i_dim, 0);
  }
  for (const ExpertWeights& w : experts.experts)
    if (layer.with_bias && (w.gate_bias.size() != static_cast<size_t>(i_dim) || w.up_bias.size() != static_cast<size_t>(i_dim)))
      return Status::Internal("Dump::WriteLayer: " + layer.name + " has experts without [I] gate and up biases");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::Io("--dump: " + path + ": " + std::strerror(errno));
  bool ok = true;
  const auto put = [&](const void* data, size_t bytes) {
    ok = ok && std::fwrite(data, 1, bytes, f) == bytes;
  };
  for (const ExpertWeights& w : experts.experts) {
    for (const Mxfp4Matrix* m : {&w.w1, &w.w3, &w.w2}) {
      put(m->packed.data(), m->packed.size());
      put(m->scales.data(), m->scales.size());
    }
    if (layer.with_bias) {
      put(w.gate_bias.data(), w.gate_bias.size() * 4);
      put(w.up_bias.data(), w.up_bias.size() * 4);
    }
  }
  const int write_errno = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(path.c_str());
    return Status::Io("--dump: writing " + path + " failed: " + std::strerror(write_errno));
  }

  const ActParams& p = experts.activation.params;
  JsonValue l = JsonValue::MakeObject();
  l.Set("name", JsonValue::String(layer.name));
  l.Set("num_experts", JsonValue::Integer(s.num_experts));
  l.Set("hidden", JsonValue::Integer(s.hidden));
  l.Set("intermediate", JsonValue::Integer(s.intermediate));
  l.Set("top_k", JsonValue::Integer(s.top_k));
  l.Set("activation", JsonValue::String(ActivationName(experts.activation.type)));
  l.Set("beta", JsonValue::Number(p.beta));
  l.Set("linear_beta", JsonValue::Number(p.linear_beta));
  l.Set("alpha", JsonValue::Number(p.alpha));
  l.Set("limit", JsonValue::Number(p.limit));
  l.Set("with_bias", JsonValue::Bool(layer.with_bias));
  l.Set("weights", JsonValue::String(rel));
  l.Set("expert_tensors", std::move(tensors));
  layers_.Append(std::move(l));
  return WriteManifest();
}

Status Dump::WriteInput(const BenchLayer& layer, RoutingPattern routing, const SyntheticInput& in) {
  if (!enabled()) return Status::Ok();
  MXMOE_RETURN_IF_ERROR(MakeDir(dir_ + "/" + layer.name));
  const std::string rel = RowBase(layer, routing, in.num_tokens) + ".input.safetensors";
  MoeInput view;
  view.num_tokens = in.num_tokens;
  view.x_bf16 = in.x_bf16.data();
  view.topk_ids = in.topk_ids.data();
  view.topk_weights = in.topk_weights.data();
  MXMOE_RETURN_IF_ERROR(WriteMoeInputFile(dir_ + "/" + rel, layer.shape, view));
  JsonValue row = JsonValue::MakeObject();
  row.Set("layer", JsonValue::String(layer.name));
  row.Set("routing", JsonValue::String(RoutingPatternName(routing)));
  row.Set("tokens", JsonValue::Integer(in.num_tokens));
  row.Set("input", JsonValue::String(rel));
  row.Set("output", JsonValue());
  rows_.Append(std::move(row));
  return WriteManifest();
}

Status Dump::WriteOutput(const BenchLayer& layer, RoutingPattern routing, int64_t tokens,
                         const std::vector<float>& out) {
  if (!enabled()) return Status::Ok();
  const std::string rel = RowBase(layer, routing, tokens) + ".output.safetensors";
  MXMOE_RETURN_IF_ERROR(WriteMoeOutputFile(dir_ + "/" + rel, tokens, layer.shape.hidden, OutputDType::kF32, out.data()));
  const std::string input_rel = RowBase(layer, routing, tokens) + ".input.safetensors";
  JsonValue rows = JsonValue::MakeArray();
  for (const JsonValue& row : rows_.AsArray()) {
    JsonValue r = row;
    if (r.Find("input")->AsString() == input_rel) r.Set("output", JsonValue::String(rel));
    rows.Append(std::move(r));
  }
  rows_ = std::move(rows);
  return WriteManifest();
}

Status Dump::WriteManifest() const {
  if (!enabled()) return Status::Ok();
  MXMOE_RETURN_IF_ERROR(MakeDir(dir_));
  JsonValue m = JsonValue::MakeObject();
  m.Set("layers", layers_);
  m.Set("rows", rows_);
  return WriteJsonFile(dir_ + "/manifest.json", m);
}

// ---- the sweep without a GPU -------------------------------------------------------------------

void Progress(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

Status RunDry(const SweepOptions& opt, int* failures) {
  *failures = 0;
  RowWriter writer;
  MXMOE_RETURN_IF_ERROR(writer.Open(opt.csv, kDryRunDevice));
  Dump dump(opt.dump_dir);
  std::printf("dry run: routing statistics, yardsticks and commands only (no GPU, nothing timed)\n");
  writer.Header(stdout);
  for (const BenchLayer& layer : opt.layers) {
    if (dump.enabled()) {
      ExpertSet experts;
      SyntheticOptions so;
      so.seed = opt.seed;
      so.with_bias = layer.with_bias;
      so.num_threads = opt.threads;
      MXMOE_RETURN_IF_ERROR(MakeSyntheticExperts(layer.shape, layer.activation, {}, so, &experts));
      MXMOE_RETURN_IF_ERROR(dump.WriteLayer(layer, experts));
    }
    for (RoutingPattern routing : layer.routings) {
      for (int64_t t : layer.tokens) {
        std::vector<SyntheticInput> inputs(static_cast<size_t>(opt.rotations));
        ParallelFor(opt.rotations, opt.threads, [&](int64_t r) {
          MakeSyntheticInput(layer.shape, t, routing, InputSeed(opt, routing, t, static_cast<int>(r)), &inputs[r]);
        });
        RowResult row;
        row.layer = &layer;
        row.routing = routing;
        row.tokens = t;
        row.cost = MeanCost(layer.shape, inputs);
        row.command = ReproduceCommand(layer, routing, t, opt);
        MXMOE_RETURN_IF_ERROR(writer.Write(row, stdout));
        MXMOE_RETURN_IF_ERROR(dump.WriteInput(layer, routing, inputs[0]));
      }
    }
  }
  return Status::Ok();
}

}  // namespace mxmoe::bench
