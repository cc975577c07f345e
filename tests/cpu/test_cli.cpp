// The mxmoe command line end to end, on small generated checkpoints: results equal the reference
// computed in-process from the same files; bad input exits 1 with one line naming the problem and
// leaves no output file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/formats.h"
#include "mxmoe/json.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/synthetic.h"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

struct CliResult {
  int rc = -1;
  std::string out, err;
};

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("mxmoe_cli_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliResult Cli(const std::string& args) {
    const fs::path o = dir_ / "stdout.txt", e = dir_ / "stderr.txt";
    const std::string cmd = std::string(MXMOE_CLI_PATH) + " " + args + " >" + o.string() + " 2>" + e.string();
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadAll(o);
    r.err = ReadAll(e);
    return r;
  }

  // A checkpoint and an input, both made by the CLI.
  void MakeCase(const std::string& ckpt_args, int tokens) {
    CliResult r = Cli("make-checkpoint --out " + Path("ckpt") + " " + ckpt_args);
    ASSERT_EQ(r.rc, 0) << r.err;
    r = Cli("make-input --checkpoint " + Path("ckpt") + " --tokens " + std::to_string(tokens) +
            " --routing with_invalid --seed 5 --out " + Path("in.safetensors"));
    ASSERT_EQ(r.rc, 0) << r.err;
  }

  // ReferenceMoe on the same files, f32.
  std::vector<float> Reference(int layer, const ParallelSlice& slice) {
    ExpertSet experts;
    Status st = LoadLayer(Path("ckpt"), layer, slice, &experts);
    EXPECT_TRUE(st.ok()) << st.ToString();
    HostMoeInput in;
    st = ReadMoeInputFile(Path("in.safetensors"), experts.shape, &in);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::vector<float> y(in.num_tokens * experts.shape.hidden);
    st = ReferenceMoe(experts, in.View(), MoeOutput{OutputDType::kF32, y.data()});
    EXPECT_TRUE(st.ok()) << st.ToString();
    return y;
  }

  HostMoeOutput ReadOutput(const std::string& name) {
    HostMoeOutput out;
    const Status st = ReadMoeOutputFile(Path(name), 0, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // The command fails with exit code 1, one line on stderr containing `needle`, and no output file.
  void ExpectRefused(const std::string& args, const std::string& needle) {
    const CliResult r = Cli(args + " --output " + Path("refused.safetensors"));
    EXPECT_EQ(r.rc, 1) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr lacks '" << needle << "': " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(Path("refused.safetensors")));
  }

  fs::path dir_;
};

TEST_F(CliTest, HelpAndInfo) {
  CliResult r = Cli("--help");
  EXPECT_EQ(r.rc, 0);
  for (const char* s : {"mxmoe run", "--checkpoint", "--tp-size", "--ep-rank", "--output-dtype", "make-checkpoint"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  r = Cli("info");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("mxmoe "), std::string::npos);
  EXPECT_NE(r.out.find("Situ(10)"), std::string::npos);
}

TEST_F(CliTest, RunFromCheckpointEqualsReference) {
  MakeCase("--experts 8 --hidden 64 --intermediate 96 --top-k 3 --layers 2 --seed 11", 7);
  CliResult r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --layer 1 --input " +
                    Path("in.safetensors") + " --output " + Path("out.safetensors") + " --output-dtype f32");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("checksum"), std::string::npos);
  EXPECT_NE(r.out.find("Situ"), std::string::npos);
  const HostMoeOutput out = ReadOutput("out.safetensors");
  ASSERT_EQ(out.num_tokens, 7);
  ASSERT_EQ(out.hidden, 64);
  const std::vector<float> ref = Reference(1, ParallelSlice{});
  EXPECT_TRUE(test::BitwiseEqual(out.values, ref, {7, 64}));

  // bf16 output is the reference rounded once.
  r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --layer 1 --input " + Path("in.safetensors") +
          " --output " + Path("out16.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const HostMoeOutput out16 = ReadOutput("out16.safetensors");
  ASSERT_EQ(out16.dtype, OutputDType::kBF16);
  std::vector<float> ref16(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ref16[i] = bf16_to_float(float_to_bf16(ref[i]));
  EXPECT_TRUE(test::BitwiseEqual(out16.values, ref16, {7, 64}));

  // Layer 0 differs from layer 1.
  r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --layer 0 --input " + Path("in.safetensors") +
          " --output-dtype f32 --output " + Path("out0.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(ReadOutput("out0.safetensors").values, out.values);
}

TEST_F(CliTest, ShardedCheckpointWithTextConfig) {
  MakeCase("--experts 6 --hidden 64 --intermediate 64 --top-k 2 --shards 3 --text-config --seed 3", 5);
  ASSERT_TRUE(fs::exists(Path("ckpt/model.safetensors.index.json")));
  ASSERT_TRUE(fs::exists(Path("ckpt/model-00003-of-00003.safetensors")));
  const CliResult r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --input " + Path("in.safetensors") +
                          " --output-dtype f32 --output " + Path("out.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(test::BitwiseEqual(ReadOutput("out.safetensors").values, Reference(0, ParallelSlice{}), {5, 64}));
}

TEST_F(CliTest, ZeroTokens) {
  MakeCase("--experts 4 --hidden 64 --intermediate 64 --top-k 2", 0);
  const CliResult r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --input " + Path("in.safetensors") +
                          " --output " + Path("out.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const HostMoeOutput out = ReadOutput("out.safetensors");
  EXPECT_EQ(out.num_tokens, 0);
  EXPECT_EQ(out.hidden, 64);
  EXPECT_TRUE(out.values.empty());
}

TEST_F(CliTest, TensorAndExpertParallelSlicesSumToUnsplit) {
  MakeCase("--experts 8 --hidden 64 --intermediate 128 --top-k 3 --seed 21", 6);
  const std::vector<float> full = Reference(0, ParallelSlice{});
  for (const char* kind : {"tp", "ep"}) {
    for (int size : {2, 4}) {
      std::vector<double> sum(full.size(), 0.0);
      for (int rank = 0; rank < size; ++rank) {
        const std::string out = std::string(kind) + std::to_string(size) + "_" + std::to_string(rank) + ".safetensors";
        const CliResult r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --input " + Path("in.safetensors") +
                                " --output-dtype f32 --" + kind + "-size " + std::to_string(size) + " --" + kind +
                                "-rank " + std::to_string(rank) + " --output " + Path(out));
        ASSERT_EQ(r.rc, 0) << r.err;
        const HostMoeOutput part = ReadOutput(out);
        ASSERT_EQ(part.values.size(), full.size());
        for (size_t i = 0; i < full.size(); ++i) sum[i] += part.values[i];
      }
      std::vector<float> sum_f(sum.begin(), sum.end());
      // The partial sums regroup the same fp32 additions: equal up to fp32 summation order.
      EXPECT_TRUE(test::AllClose(sum_f, full, test::kTolF32, {6, 64})) << kind << " " << size;
    }
  }
}

TEST_F(CliTest, EmbeddedDefaultRuns) {
  // The built-in default, made small through its flags so the suite stays fast.
  const CliResult r = Cli("run --device cpu --experts 16 --tokens 2 --output " + Path("out.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("K=3584 I=3072 k=16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Situ (beta 4, linear_beta 25)"), std::string::npos) << r.out;
  const HostMoeOutput out = ReadOutput("out.safetensors");
  EXPECT_EQ(out.num_tokens, 2);
  EXPECT_EQ(out.hidden, 3584);
}

TEST_F(CliTest, BadInputIsRefusedByName) {
  MakeCase("--experts 8 --hidden 64 --intermediate 64 --top-k 2", 3);
  const std::string ck = " --device cpu --checkpoint " + Path("ckpt");
  const std::string in = " --input " + Path("in.safetensors");

  ExpectRefused("run" + ck + in + " --ep-size 3", "ep_size");
  ExpectRefused("run" + ck + in + " --tp-size 4", "I / tp_size");
  ExpectRefused("run" + ck + in + " --layer 3", "layers.3.");
  ExpectRefused("run" + ck + in + " --bogus 1", "--bogus");
  ExpectRefused("run" + ck + in + " --output-dtype f16", "--output-dtype");
  ExpectRefused("run" + ck + " --input " + Path("missing.safetensors"), "missing.safetensors");

  // An input file whose pieces are wrong, one at a time.
  HostMoeInput good;
  {
    ModelConfig cfg;
    ASSERT_TRUE(ReadModelConfig(Path("ckpt/config.json"), &cfg).ok());
    ASSERT_TRUE(ReadMoeInputFile(Path("in.safetensors"), cfg.shape, &good).ok());
  }
  auto write_input = [&](const std::string& name, std::vector<TensorToWrite> tensors) {
    ASSERT_TRUE(WriteSafetensors(Path(name), tensors).ok());
  };
  const TensorToWrite x{"hidden_states", DType::kBF16, {3, 64}, good.x_bf16.data(), good.x_bf16.size() * 2};
  const TensorToWrite ids{"topk_ids", DType::kI32, {3, 2}, good.topk_ids.data(), good.topk_ids.size() * 4};
  const TensorToWrite w{"topk_weights", DType::kF32, {3, 2}, good.topk_weights.data(), good.topk_weights.size() * 4};
  write_input("no_weights.safetensors", {x, ids});
  ExpectRefused("run" + ck + " --input " + Path("no_weights.safetensors"), "topk_weights");
  TensorToWrite ids_f32 = ids;
  ids_f32.dtype = DType::kF32;
  write_input("ids_f32.safetensors", {x, ids_f32, w});
  ExpectRefused("run" + ck + " --input " + Path("ids_f32.safetensors"), "topk_ids");
  TensorToWrite x_narrow = x;
  x_narrow.shape = {6, 32};
  write_input("x_narrow.safetensors", {x_narrow, ids, w});
  ExpectRefused("run" + ck + " --input " + Path("x_narrow.safetensors"), "hidden_states");
  std::vector<int32_t> bad_ids = good.topk_ids;
  bad_ids[3] = 8;
  TensorToWrite ids_bad = ids;
  ids_bad.data = bad_ids.data();
  write_input("ids_bad.safetensors", {x, ids_bad, w});
  ExpectRefused("run" + ck + " --input " + Path("ids_bad.safetensors"), "topk_ids[1, 1] = 8");

  // A truncated input file.
  {
    const std::string bytes = ReadAll(Path("in.safetensors"));
    std::ofstream(Path("trunc.safetensors"), std::ios::binary).write(bytes.data(), bytes.size() - 10);
  }
  ExpectRefused("run" + ck + " --input " + Path("trunc.safetensors"), "trunc.safetensors");

  // A config without one of its required fields.
  {
    std::string cfg = ReadAll(Path("ckpt/config.json"));
    const size_t at = cfg.find("\"moe_intermediate_size\"");
    ASSERT_NE(at, std::string::npos);
    cfg.replace(at, std::string("\"moe_intermediate_size\"").size(), "\"renamed_field\"");
    std::ofstream(Path("ckpt/config.json"), std::ios::binary | std::ios::trunc) << cfg;
  }
  ExpectRefused("run" + ck + in, "moe_intermediate_size");
}

TEST_F(CliTest, ExistingOutputIsKeptOnFailure) {
  MakeCase("--experts 4 --hidden 64 --intermediate 64 --top-k 2", 2);
  { std::ofstream(Path("keep.safetensors")) << "previous"; }
  const CliResult r = Cli("run --device cpu --checkpoint " + Path("ckpt") + " --input " + Path("in.safetensors") +
                          " --ep-size 3 --output " + Path("keep.safetensors"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(ReadAll(Path("keep.safetensors")), "previous");
}

// ---- mxmoe bench (the sweep itself needs a GPU: here its refusal, options, plan and dump) ----

// CSV rows as maps from the header's column names.
std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& text) {
  std::vector<std::vector<std::string>> lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    lines.push_back(cells);
  }
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::map<std::string, std::string> row;
    for (size_t c = 0; c < lines[0].size() && c < lines[i].size(); ++c) row[lines[0][c]] = lines[i][c];
    rows.push_back(row);
  }
  return rows;
}

TEST_F(CliTest, BenchHelpAndRefusalWithoutGpu) {
  CliResult r = Cli("bench --help");
  EXPECT_EQ(r.rc, 0);
  for (const char* s : {"mxmoe bench", "--shapes", "--tokens", "--routing", "--dry-run", "--dump", "--csv"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  if (!CudaDevices().empty()) GTEST_SKIP() << "a CUDA device is visible: the sweep would run";
  // Without the CUDA backend, or with it and no device: exit 1 before any work, one line saying
  // why, no CSV.
  r = Cli("bench --shapes kimi-k3 --tokens 1 --csv " + Path("rows.csv"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(CudaBuilt() ? "no CUDA device" : "no CUDA backend"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--dry-run"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(fs::exists(Path("rows.csv")));
}

TEST_F(CliTest, BenchRefusesBadOptionsByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"--shapes kimi-k2", "--shapes"},          {"--shapes kimi-k3,kimi-k3", "given twice"},
      {"--tokens 0", "--tokens"},                {"--tokens 1,,8", "--tokens"},
      {"--tokens 1,x", "--tokens"},              {"--routing sorted", "--routing"},
      {"--repeats 0", "--repeats"},              {"--shapes kimi-k3 --experts 8", "--experts"},
      {"--check-tokens -1", "--check-tokens"},   {"--no-graph=1", "--no-graph"},
      {"--dry-run --csv /nonexistent/dir/rows.csv", "--csv"},
  };
  for (const auto& [args, needle] : cases) {
    const CliResult r = Cli(std::string("bench ") + args);
    EXPECT_EQ(r.rc, 1) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": stderr lacks '" << needle << "': " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

// The plan's yardsticks are SPEC section 7's: Kimi-K3 at T = 1 touches 16 experts, 281 MB, 69 µs at
// 4.06 TB/s; at T = 32 about 390 experts, 6.8 GB, 1.7 ms.
TEST_F(CliTest, BenchDryRunYardsticksAreSpecSection7s) {
  const CliResult r = Cli("bench --dry-run --shapes kimi-k3 --routing uniform,heavy_hitters --tokens 1,32 --csv " +
                          Path("plan.csv"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = ReadCsv(ReadAll(Path("plan.csv")));
  ASSERT_EQ(rows.size(), 4u);
  const auto& t1 = rows[0];
  EXPECT_EQ(t1.at("layer"), "kimi-k3");
  EXPECT_EQ(t1.at("routing"), "uniform");
  EXPECT_EQ(t1.at("tokens"), "1");
  EXPECT_EQ(std::stod(t1.at("experts_touched")), 16);
  EXPECT_EQ(std::stod(t1.at("pairs")), 16);
  EXPECT_NEAR(std::stod(t1.at("bytes")) / 1e6, 281, 0.5);  // 16 x 17.55 MB + 14 KB of activations
  EXPECT_NEAR(std::stod(t1.at("floor_us")), 69, 0.5);
  EXPECT_NEAR(std::stod(t1.at("flops")), 2.0 * 16 * 3 * 3072 * 3584, 1);
  EXPECT_EQ(t1.at("bound"), "memory");
  EXPECT_EQ(t1.at("us"), "");  // nothing timed
  EXPECT_EQ(t1.at("check"), "not run");
  EXPECT_EQ(t1.at("command"), "mxmoe bench --shapes kimi-k3 --routing uniform --tokens 1");
  EXPECT_EQ(t1.at("config"), "");  // CudaMoe::Plan names it; a dry run creates no CudaMoe
  EXPECT_EQ(t1.at("device"), "none (dry run)");  // a GPU run names its card (bench/report.py reads it)
  const auto& t32 = rows[1];
  EXPECT_NEAR(std::stod(t32.at("experts_touched")), 390, 25);
  EXPECT_EQ(std::stod(t32.at("pairs")), 32 * 16);
  EXPECT_NEAR(std::stod(t32.at("bytes")) / 1e9, 6.8, 0.4);
  EXPECT_NEAR(std::stod(t32.at("floor_us")) / 1e3, 1.7, 0.1);
  // Skewed routing: half of each token's picks go to a few experts, so fewer experts are touched.
  const auto& skew32 = rows[3];
  EXPECT_EQ(skew32.at("routing"), "heavy_hitters");
  EXPECT_LT(std::stod(skew32.at("experts_touched")), std::stod(t32.at("experts_touched")) * 0.75);
  EXPECT_EQ(std::stod(skew32.at("pairs")), 32 * 16);
  // The table holds the same rows, each followed by its command.
  EXPECT_NE(r.out.find("$ mxmoe bench --shapes kimi-k3 --routing heavy_hitters --tokens 32"), std::string::npos)
      << r.out;
}

// The dump the peers read: the layer's weights byte for byte as MakeSyntheticExperts makes them,
// in the order the manifest lists, and each row's input.
TEST_F(CliTest, BenchDumpHoldsTheLayerAndInputsThePeersRead) {
  const CliResult r = Cli("bench --dry-run --shapes gpt-oss-120b --experts 4 --tokens 3,5 --seed 9 --dump " +
                          Path("dump"));
  ASSERT_EQ(r.rc, 0) << r.err;
  JsonValue manifest;
  ASSERT_TRUE(ReadJsonFile(Path("dump/manifest.json"), &manifest).ok());
  ASSERT_EQ(manifest.Find("layers")->AsArray().size(), 1u);
  const JsonValue& layer = manifest.Find("layers")->AsArray()[0];
  EXPECT_EQ(layer.Find("activation")->AsString(), "SwigluBias");
  EXPECT_TRUE(layer.Find("with_bias")->AsBool());
  const LayerShape shape{4, 2880, 2880, 4};
  EXPECT_EQ(layer.Find("num_experts")->AsInt(), shape.num_experts);
  EXPECT_EQ(layer.Find("top_k")->AsInt(), shape.top_k);

  ExpertSet want;
  ActivationSpec act;
  act.type = ActivationType::SwigluBias;
  SyntheticOptions opt;
  opt.seed = 9;
  opt.with_bias = true;
  ASSERT_TRUE(MakeSyntheticExperts(shape, act, {}, opt, &want).ok());
  std::string expected;
  for (const ExpertWeights& w : want.experts) {
    for (const Mxfp4Matrix* m : {&w.w1, &w.w3, &w.w2}) {
      expected.append(reinterpret_cast<const char*>(m->packed.data()), m->packed.size());
      expected.append(reinterpret_cast<const char*>(m->scales.data()), m->scales.size());
    }
    expected.append(reinterpret_cast<const char*>(w.gate_bias.data()), w.gate_bias.size() * 4);
    expected.append(reinterpret_cast<const char*>(w.up_bias.data()), w.up_bias.size() * 4);
  }
  const std::string got = ReadAll(Path("dump/" + layer.Find("weights")->AsString()));
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected) << "weights.bin differs from the synthetic layer";
  // The manifest's tensor list adds up to one expert's bytes, in the file's order.
  const auto& tensors = layer.Find("expert_tensors")->AsArray();
  ASSERT_EQ(tensors.size(), 8u);
  EXPECT_EQ(tensors[0].Find("name")->AsString(), "w1.weight_packed");
  EXPECT_EQ(tensors[7].Find("name")->AsString(), "up_bias");
  size_t per_expert = 0;
  for (const JsonValue& t : tensors) {
    size_t n = t.Find("dtype")->AsString() == "F32" ? 4 : 1;
    for (const JsonValue& d : t.Find("shape")->AsArray()) n *= static_cast<size_t>(d.AsInt());
    per_expert += n;
  }
  EXPECT_EQ(per_expert * 4, expected.size());

  const auto& rows = manifest.Find("rows")->AsArray();
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t t = i == 0 ? 3 : 5;
    EXPECT_EQ(rows[i].Find("tokens")->AsInt(), t);
    EXPECT_TRUE(rows[i].Find("output")->is_null());  // a dry run computes nothing
    HostMoeInput in;
    const Status st = ReadMoeInputFile(Path("dump/" + rows[i].Find("input")->AsString()), shape, &in);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(in.num_tokens, t);
    for (int32_t id : in.topk_ids) EXPECT_TRUE(id >= 0 && id < shape.num_experts) << id;
  }
}

}  // namespace
}  // namespace mxmoe
