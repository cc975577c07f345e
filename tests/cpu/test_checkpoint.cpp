// Checkpoints, config.json and the CLI's input/output files (src/io/checkpoint.cpp, config.cpp,
// moe_files.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/formats.h"
#include "mxmoe/json.h"
#include "mxmoe/layouts.h"

namespace mxmoe {
namespace {

Mxfp4Matrix RandomMatrix(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  Mxfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(static_cast<size_t>(rows * cols / 2));
  m.scales.resize(static_cast<size_t>(rows * cols / kMxBlock));
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng());
  for (auto& b : m.scales) b = static_cast<uint8_t>(118 + rng() % 8);  // a realistic exponent range
  return m;
}

// An unsplit layer of random bytes, fresh per seed.
ExpertSet RandomLayer(const LayerShape& shape, const ActivationSpec& act, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ExpertSet s;
  s.shape = shape;
  s.activation = act;
  s.experts.resize(static_cast<size_t>(shape.num_experts));
  for (ExpertWeights& w : s.experts) {
    w.w1 = RandomMatrix(shape.intermediate, shape.hidden, rng);
    w.w3 = RandomMatrix(shape.intermediate, shape.hidden, rng);
    w.w2 = RandomMatrix(shape.hidden, shape.intermediate, rng);
  }
  return s;
}

void ExpectSameMatrix(const Mxfp4Matrix& got, const Mxfp4Matrix& want, const std::string& what) {
  EXPECT_EQ(got.rows, want.rows) << what;
  EXPECT_EQ(got.cols, want.cols) << what;
  EXPECT_TRUE(got.packed == want.packed) << what << ": packed bytes differ";
  EXPECT_TRUE(got.scales == want.scales) << what << ": scales differ";
}

void ExpectSameExperts(const ExpertSet& got, const ExpertSet& want) {
  ASSERT_EQ(got.experts.size(), want.experts.size());
  for (size_t i = 0; i < got.experts.size(); ++i) {
    const std::string who = "local expert " + std::to_string(i);
    ExpectSameMatrix(got.experts[i].w1, want.experts[i].w1, who + " w1");
    ExpectSameMatrix(got.experts[i].w3, want.experts[i].w3, who + " w3");
    ExpectSameMatrix(got.experts[i].w2, want.experts[i].w2, who + " w2");
  }
}

void ExpectMentions(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning: " << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << "message: " << st.message() << "\nexpected to mention: " << needle;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/mxmoe_ckpt_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void WriteText(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
    ASSERT_TRUE(f.good());
  }

  static ModelConfig SituConfig(const LayerShape& shape) {
    ModelConfig c;
    c.shape = shape;
    c.activation.type = ActivationType::Situ;
    c.activation.params.beta = 3.0f;
    c.activation.params.linear_beta = 20.0f;
    return c;
  }

  // Writes `num_layers` random layers; returns them.
  std::vector<ExpertSet> WriteLayers(const ModelConfig& c, int num_layers, int num_shards, bool text_config = false) {
    std::vector<ExpertSet> layers;
    for (int l = 0; l < num_layers; ++l) layers.push_back(RandomLayer(c.shape, c.activation, 1000 + l));
    const Status st = WriteCheckpoint(dir_, c, layers, num_shards, text_config);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return layers;
  }

  // config.json with the given fields as JSON object members.
  void WriteConfig(const std::string& members) { WriteText(Path("config.json"), "{" + members + "}"); }

  Status ReadConfig(ModelConfig* c) const { return ReadModelConfig(Path("config.json"), c); }

  std::string dir_;
};

constexpr LayerShape kSmall{/*num_experts=*/4, /*hidden=*/64, /*intermediate=*/64, /*top_k=*/2};
const std::string kSmallFields =
    R"("routed_expert_hidden_size": 64, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_token": 2)";

TEST_F(CheckpointTest, RoundTripUnsplit) {
  const ModelConfig c = SituConfig(kSmall);
  const auto layers = WriteLayers(c, 2, 1);
  EXPECT_TRUE(std::filesystem::exists(Path("model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(Path(kIndexFileName)));
  for (int l = 0; l < 2; ++l) {
    ExpertSet got;
    const Status st = LoadLayer(dir_, l, ParallelSlice{}, &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got.shape.num_experts, 4);
    EXPECT_EQ(got.shape.hidden, 64);
    EXPECT_EQ(got.shape.intermediate, 64);
    EXPECT_EQ(got.shape.top_k, 2);
    EXPECT_TRUE(got.slice.IsFull());
    EXPECT_EQ(got.activation.type, ActivationType::Situ);
    EXPECT_EQ(got.activation.params.beta, 3.0f);
    EXPECT_EQ(got.activation.params.linear_beta, 20.0f);
    EXPECT_TRUE(got.activation.per_expert.empty());
    ExpectSameExperts(got, layers[l]);
  }
}

TEST_F(CheckpointTest, TensorParallelSlices) {
  const LayerShape shape{4, 64, 128, 2};
  const ModelConfig c = SituConfig(shape);
  const auto layers = WriteLayers(c, 1, 1);
  const ExpertSet& full = layers[0];
  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      ParallelSlice slice;
      slice.tp_size = tp;
      slice.tp_rank = r;
      ExpertSet got;
      const Status st = LoadLayer(dir_, 0, slice, &got);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(got.LocalIntermediate(), 128 / tp);
      const int64_t il = 128 / tp, i0 = r * il;
      ExpertSet want;
      want.experts.resize(4);
      for (int e = 0; e < 4; ++e) {
        want.experts[e].w1 = SliceRows(full.experts[e].w1, i0, il);
        want.experts[e].w3 = SliceRows(full.experts[e].w3, i0, il);
        want.experts[e].w2 = SliceCols(full.experts[e].w2, i0, il);
      }
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(r));
      ExpectSameExperts(got, want);
    }
  }
}

TEST_F(CheckpointTest, ExpertParallelAndBoth) {
  const LayerShape shape{8, 64, 64, 2};
  const ModelConfig c = SituConfig(shape);
  const auto layers = WriteLayers(c, 1, 1);
  for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
    for (int tp : {1, 2}) {
      for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
        ParallelSlice slice{tp, tp_rank, 2, ep_rank};
        ExpertSet got, want;
        Status st = LoadLayer(dir_, 0, slice, &got);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(got.NumLocalExperts(), 4);
        EXPECT_EQ(got.FirstExpert(), 4 * ep_rank);
        st = SliceExperts(layers[0], slice, &want);
        ASSERT_TRUE(st.ok()) << st.ToString();
        SCOPED_TRACE("ep rank " + std::to_string(ep_rank) + " tp " + std::to_string(tp) + "/" +
                     std::to_string(tp_rank));
        ExpectSameExperts(got, want);
        if (tp == 1) ExpectSameMatrix(got.experts[0].w2, layers[0].experts[4 * ep_rank].w2, "first local w2");
      }
    }
  }
}

TEST_F(CheckpointTest, RefusesInvalidSlice) {
  WriteLayers(SituConfig(kSmall), 1, 1);
  ExpertSet got;
  ExpectMentions(LoadLayer(dir_, 0, ParallelSlice{4, 0, 1, 0}, &got), "multiple of 32");
  ExpectMentions(LoadLayer(dir_, 0, ParallelSlice{1, 0, 3, 0}, &got), "ep_size");
  ExpectMentions(LoadLayer(dir_, -1, ParallelSlice{}, &got), "negative");
}

TEST_F(CheckpointTest, ShardedRoundTrip) {
  const ModelConfig c = SituConfig(kSmall);
  const auto layers = WriteLayers(c, 2, 3);
  for (int s = 1; s <= 3; ++s)
    EXPECT_TRUE(std::filesystem::exists(Path("model-0000" + std::to_string(s) + "-of-00003.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(Path("model.safetensors")));
  ASSERT_TRUE(std::filesystem::exists(Path(kIndexFileName)));
  JsonValue index;
  ASSERT_TRUE(ReadJsonFile(Path(kIndexFileName), &index).ok());
  ASSERT_NE(index.Find("weight_map"), nullptr);
  EXPECT_EQ(index.Find("weight_map")->AsObject().size(), 2u * 4u * 6u);

  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::Open(dir_, &ckpt).ok());
  EXPECT_TRUE(ckpt->OpenedFiles().empty());  // nothing is opened before it is needed
  // A layer spans several files.
  std::set<std::string> layer0_files;
  for (int e = 0; e < 4; ++e) {
    const TensorInfo* t = nullptr;
    std::string file;
    ASSERT_TRUE(ckpt->GetTensor(ExpertTensorName(0, e, 1, false), DType::kU8, {64, 32}, &t, &file).ok());
    layer0_files.insert(file);
  }
  EXPECT_GE(layer0_files.size(), 2u);

  for (int l = 0; l < 2; ++l) {
    for (int tp : {1, 2}) {
      ParallelSlice slice{tp, tp - 1, 1, 0};
      ExpertSet got, want;
      Status st = ckpt->LoadLayer(l, slice, &got);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE(SliceExperts(layers[l], slice, &want).ok());
      SCOPED_TRACE("layer " + std::to_string(l) + " tp " + std::to_string(tp));
      ExpectSameExperts(got, want);
    }
  }
}

TEST_F(CheckpointTest, OpensOnlyTheShardsItNeeds) {
  // 8 experts over 3 shards: layer 0 experts 0-2 in shard 1, 3 and layer 1 experts 0-1 in shard
  // 2, layer 1 experts 2-3 in shard 3.
  const auto layers = WriteLayers(SituConfig(kSmall), 2, 3);
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::Open(dir_, &ckpt).ok());
  ExpertSet got;
  ASSERT_TRUE(ckpt->LoadLayer(0, ParallelSlice{1, 0, 2, 0}, &got).ok());
  EXPECT_EQ(ckpt->OpenedFiles(), std::vector<std::string>{"model-00001-of-00003.safetensors"});

  // With the last shard gone, layer 0 still loads; layer 1's second half names the missing file.
  std::filesystem::remove(Path("model-00003-of-00003.safetensors"));
  ExpertSet layer0;
  Status st = LoadLayer(dir_, 0, ParallelSlice{}, &layer0);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectSameExperts(layer0, layers[0]);
  ASSERT_TRUE(LoadLayer(dir_, 1, ParallelSlice{1, 0, 2, 0}, &got).ok());
  st = LoadLayer(dir_, 1, ParallelSlice{1, 0, 2, 1}, &got);
  ExpectMentions(st, "model-00003-of-00003.safetensors");
  ExpectMentions(st, ExpertTensorName(1, 2, 1, false));
}

TEST_F(CheckpointTest, WithoutIndexReadsEverySafetensorsFile) {
  // A sharded checkpoint whose index was lost is still readable from the shards' own headers.
  const auto layers = WriteLayers(SituConfig(kSmall), 1, 3);
  std::filesystem::remove(Path(kIndexFileName));
  ExpertSet got;
  const Status st = LoadLayer(dir_, 0, ParallelSlice{}, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectSameExperts(got, layers[0]);
}

TEST_F(CheckpointTest, ConfigUnderTextConfig) {
  ModelConfig c = SituConfig(kSmall);
  const auto layers = WriteLayers(c, 1, 2, /*text_config=*/true);
  JsonValue root;
  ASSERT_TRUE(ReadJsonFile(Path("config.json"), &root).ok());
  ASSERT_NE(root.Find("text_config"), nullptr);
  EXPECT_EQ(root.Find("num_experts"), nullptr);
  EXPECT_EQ(root.Find("text_config")->Find("num_experts")->AsInt(), 4);
  ExpertSet got;
  const Status st = LoadLayer(dir_, 0, ParallelSlice{}, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got.activation.params.beta, 3.0f);
  ExpectSameExperts(got, layers[0]);
}

TEST_F(CheckpointTest, TextConfigTakesPrecedence) {
  WriteConfig(R"("num_experts": 999, "hidden_act": "gelu", "text_config": {)" + kSmallFields +
              R"(, "hidden_act": "situ"}, "hidden_size": 7168)");
  ModelConfig c;
  const Status st = ReadConfig(&c);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(c.shape.num_experts, 4);
  EXPECT_EQ(c.shape.hidden, 64);  // routed_expert_hidden_size, never hidden_size
  EXPECT_EQ(c.activation.type, ActivationType::Situ);
}

TEST_F(CheckpointTest, ConfigMissingFields) {
  WriteConfig(R"("routed_expert_hidden_size": 64, "num_experts": 4, "num_experts_per_token": 2, "hidden_act": "situ")");
  ModelConfig c;
  Status st = ReadConfig(&c);
  ExpectMentions(st, "config.json: missing field 'moe_intermediate_size' (top level or text_config)");
  ExpectMentions(st, dir_);

  // hidden_size is the model width and is not taken for K.
  WriteConfig(R"("hidden_size": 64, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_token": 2, "hidden_act": "situ")");
  ExpectMentions(ReadConfig(&c), "missing field 'routed_expert_hidden_size'");

  WriteConfig(kSmallFields);
  ExpectMentions(ReadConfig(&c), "missing field 'hidden_act'");

  WriteConfig(R"("routed_expert_hidden_size": 64, "moe_intermediate_size": 64, "num_experts": 4, "hidden_act": "situ")");
  ExpectMentions(ReadConfig(&c), "missing field 'num_experts_per_token'");

  // Missing config.json altogether: LoadLayer names the file.
  std::filesystem::remove(Path("config.json"));
  ExpertSet got;
  ExpectMentions(LoadLayer(dir_, 0, ParallelSlice{}, &got), "config.json");
}

TEST_F(CheckpointTest, ConfigBadValues) {
  ModelConfig c;
  WriteConfig(R"("routed_expert_hidden_size": "64", "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_token": 2, "hidden_act": "situ")");
  ExpectMentions(ReadConfig(&c), "field 'routed_expert_hidden_size' is \"64\", expected a positive integer");
  WriteConfig(R"("routed_expert_hidden_size": 64, "moe_intermediate_size": 48, "num_experts": 4, "num_experts_per_token": 2, "hidden_act": "situ")");
  ExpectMentions(ReadConfig(&c), "multiple of 32");
  WriteConfig(R"("routed_expert_hidden_size": 64, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_token": 5, "hidden_act": "situ")");
  ExpectMentions(ReadConfig(&c), "top_k");
  WriteConfig(kSmallFields + R"(, "hidden_act": "relu")");
  Status st = ReadConfig(&c);
  ExpectMentions(st, "hidden_act");
  ExpectMentions(st, "relu");
  WriteConfig(kSmallFields + R"(, "hidden_act": 3)");
  ExpectMentions(ReadConfig(&c), "hidden_act");
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "text_config": 3)");
  ExpectMentions(ReadConfig(&c), "text_config");
  WriteText(Path("config.json"), "{\"num_experts\": 4,}");
  ExpectMentions(ReadConfig(&c), "invalid JSON at byte");
}

TEST_F(CheckpointTest, HiddenActNames) {
  const std::vector<std::pair<std::string, ActivationType>> cases = {
      {"situ", ActivationType::Situ},           {"silu", ActivationType::Swiglu},
      {"swiglu", ActivationType::Swiglu},       {"gelu", ActivationType::Geglu},
      {"gelu_tanh", ActivationType::GegluTanh}, {"gelu_pytorch_tanh", ActivationType::GegluTanh},
  };
  for (const auto& [name, type] : cases) {
    WriteConfig(kSmallFields + R"(, "hidden_act": ")" + name + "\"");
    ModelConfig c;
    const Status st = ReadConfig(&c);
    ASSERT_TRUE(st.ok()) << name << ": " << st.ToString();
    EXPECT_EQ(c.activation.type, type) << name;
    EXPECT_TRUE(c.per_expert_global.empty());
  }
  // Every kind a config can name survives WriteModelConfig -> ReadModelConfig.
  for (ActivationType t : {ActivationType::Situ, ActivationType::Swiglu, ActivationType::Geglu, ActivationType::GegluTanh}) {
    ModelConfig c = SituConfig(kSmall), back;
    c.activation.type = t;
    ASSERT_TRUE(WriteModelConfig(Path("config.json"), c, false).ok());
    ASSERT_TRUE(ReadConfig(&back).ok());
    EXPECT_EQ(back.activation.type, t);
  }
  ModelConfig bias = SituConfig(kSmall);
  bias.activation.type = ActivationType::SwigluBias;
  ExpectMentions(WriteModelConfig(Path("config.json"), bias, false), "SwigluBias");
}

TEST_F(CheckpointTest, ConfigAliases) {
  WriteConfig(R"("routed_expert_hidden_size": 64, "moe_intermediate_size": 64, "n_routed_experts": 8, "num_experts_per_tok": 3, "hidden_act": "silu")");
  ModelConfig c;
  const Status st = ReadConfig(&c);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(c.shape.num_experts, 8);
  EXPECT_EQ(c.shape.top_k, 3);
}

TEST_F(CheckpointTest, SituBetaDefaultsAndScalars) {
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ")");
  ModelConfig c;
  ASSERT_TRUE(ReadConfig(&c).ok());
  EXPECT_EQ(c.activation.params.beta, kSituDefaultBeta);
  EXPECT_EQ(c.activation.params.linear_beta, kSituDefaultLinearBeta);
  EXPECT_TRUE(c.per_expert_global.empty());
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "activation_situ_beta": 2.5, "activation_situ_linear_beta": 30)");
  ASSERT_TRUE(ReadConfig(&c).ok());
  EXPECT_EQ(c.activation.params.beta, 2.5f);
  EXPECT_EQ(c.activation.params.linear_beta, 30.0f);
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "activation_situ_beta": -1)");
  ExpectMentions(ReadConfig(&c), "field 'activation_situ_beta' is -1");
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "activation_situ_beta": "4")");
  ExpectMentions(ReadConfig(&c), "activation_situ_beta");
}

TEST_F(CheckpointTest, PerExpertBetaArrays) {
  const auto layers = WriteLayers(SituConfig(kSmall), 1, 1);
  // Replace the config: per-expert beta, a scalar linear beta.
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "activation_situ_beta": [1.0, 2.0, 3.0, 4.5], "activation_situ_linear_beta": 10.0)");
  ModelConfig c;
  ASSERT_TRUE(ReadConfig(&c).ok());
  ASSERT_EQ(c.per_expert_global.size(), 4u);
  EXPECT_EQ(c.per_expert_global[3].beta, 4.5f);
  EXPECT_EQ(c.per_expert_global[3].linear_beta, 10.0f);

  ExpertSet got;
  Status st = LoadLayer(dir_, 0, ParallelSlice{1, 0, 2, 1}, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(got.activation.per_expert.size(), 2u);
  EXPECT_EQ(got.activation.per_expert[0].beta, 3.0f);
  EXPECT_EQ(got.activation.per_expert[1].beta, 4.5f);
  EXPECT_EQ(got.activation.per_expert[1].linear_beta, 10.0f);
  EXPECT_EQ(got.activation.ForExpert(0).beta, 3.0f);

  // Both arrays, written and read back through WriteCheckpoint.
  ModelConfig both = SituConfig(kSmall);
  both.per_expert_global.resize(4);
  for (int e = 0; e < 4; ++e) both.per_expert_global[e] = {1.0f + e, 20.0f + 0.5f * e};
  ASSERT_TRUE(WriteCheckpoint(dir_, both, layers, 1, true).ok());
  ModelConfig back;
  ASSERT_TRUE(ReadConfig(&back).ok());
  ASSERT_EQ(back.per_expert_global.size(), 4u);
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(back.per_expert_global[e].beta, 1.0f + e);
    EXPECT_EQ(back.per_expert_global[e].linear_beta, 20.0f + 0.5f * e);
  }

  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "activation_situ_linear_beta": [1, 2, 3])");
  ExpectMentions(ReadConfig(&c), "field 'activation_situ_linear_beta' has 3 entries, expected num_experts = 4");
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ", "activation_situ_beta": [1, 2, 0, 4])");
  ExpectMentions(ReadConfig(&c), "'activation_situ_beta'[2] is 0");
}

TEST_F(CheckpointTest, MissingLayerNamesFirstTensor) {
  WriteLayers(SituConfig(kSmall), 2, 1);
  ExpertSet got;
  ExpectMentions(LoadLayer(dir_, 5, ParallelSlice{}, &got),
                 "missing tensor '" + ExpertTensorName(5, 0, 1, false) + "'");
  ExpectMentions(LoadLayer(dir_, 2, ParallelSlice{1, 0, 2, 1}, &got),
                 "missing tensor 'language_model.model.layers.2.block_sparse_moe.experts.2.w1.weight_packed'");
}

TEST_F(CheckpointTest, MissingOrMisshapenTensor) {
  const auto layers = WriteLayers(SituConfig(kSmall), 1, 1);
  const std::string path = Path("model.safetensors");
  const ExpertWeights& w = layers[0].experts[2];
  const std::vector<uint8_t> short_scale(w.w2.scales.begin(), w.w2.scales.begin() + 64);
  const auto write_without = [&](const std::string& drop, bool misshape) {
    std::vector<TensorToWrite> tensors;
    for (int e = 0; e < 4; ++e) {
      const ExpertWeights& x = layers[0].experts[e];
      for (int wi : {1, 2, 3}) {
        const Mxfp4Matrix& m = wi == 1 ? x.w1 : wi == 3 ? x.w3 : x.w2;
        for (bool scale : {false, true}) {
          const std::string name = ExpertTensorName(0, e, wi, scale);
          if (name == drop && !misshape) continue;
          const auto& bytes = scale ? m.scales : m.packed;
          TensorToWrite t{name, DType::kU8, {m.rows, scale ? m.cols / 32 : m.cols / 2}, bytes.data(), bytes.size()};
          if (name == drop) t = {name, DType::kU8, {64, 1}, short_scale.data(), short_scale.size()};
          tensors.push_back(t);
        }
      }
    }
    ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  };
  const std::string victim = ExpertTensorName(0, 2, 2, true);
  write_without(victim, false);
  ExpertSet got;
  Status st = LoadLayer(dir_, 0, ParallelSlice{}, &got);
  ExpectMentions(st, "missing tensor '" + victim + "' in checkpoint");
  // Experts of the other EP rank do not need it.
  st = LoadLayer(dir_, 0, ParallelSlice{1, 0, 2, 0}, &got);
  EXPECT_TRUE(st.ok()) << st.ToString();

  write_without(victim, true);
  st = LoadLayer(dir_, 0, ParallelSlice{}, &got);
  ExpectMentions(st, "tensor '" + victim + "' in " + path + ": expected U8 [64, 2], found U8 [64, 1]");
}

TEST_F(CheckpointTest, IndexRefusesPathsOutsideTheDirectory) {
  WriteLayers(SituConfig(kSmall), 1, 2);
  for (const std::string bad : {"../model.safetensors", "sub/model.safetensors", "/etc/passwd", ""}) {
    JsonValue index, map;
    map.Set(ExpertTensorName(0, 0, 1, false), JsonValue::String(bad));
    index.Set("weight_map", map);
    ASSERT_TRUE(WriteJsonFile(Path(kIndexFileName), index).ok());
    std::unique_ptr<Checkpoint> ckpt;
    const Status st = Checkpoint::Open(dir_, &ckpt);
    ExpectMentions(st, "'" + bad + "' is refused");
  }
  JsonValue index;
  index.Set("metadata", JsonValue::MakeObject());
  ASSERT_TRUE(WriteJsonFile(Path(kIndexFileName), index).ok());
  std::unique_ptr<Checkpoint> ckpt;
  ExpectMentions(Checkpoint::Open(dir_, &ckpt), "missing field 'weight_map'");
}

TEST_F(CheckpointTest, WriterRefusesBadInput) {
  const ModelConfig c = SituConfig(kSmall);
  std::vector<ExpertSet> layers = {RandomLayer(kSmall, c.activation, 5)};
  ExpectMentions(WriteCheckpoint(dir_, c, layers, 0, false), "num_shards = 0");
  ExpectMentions(WriteCheckpoint(dir_, c, layers, 5, false), "num_shards = 5");
  ExpectMentions(WriteCheckpoint(dir_, c, {}, 1, false), "no layers");
  ExpertSet sliced;
  ASSERT_TRUE(SliceExperts(layers[0], ParallelSlice{2, 0, 1, 0}, &sliced).ok());
  ExpectMentions(WriteCheckpoint(dir_, c, {sliced}, 1, false), "slice");
  ModelConfig other = c;
  other.shape.top_k = 1;
  ExpectMentions(WriteCheckpoint(dir_, other, layers, 1, false), "shape differs");
  layers[0].experts[1].gate_bias.assign(64, 0.5f);
  layers[0].activation.type = ActivationType::SwigluBias;
  ExpectMentions(WriteCheckpoint(dir_, c, layers, 1, false), "biases");
}

TEST_F(CheckpointTest, OpenRefusesMissingDirectory) {
  std::unique_ptr<Checkpoint> ckpt;
  ExpectMentions(Checkpoint::Open(Path("nope"), &ckpt), "nope");
  WriteConfig(kSmallFields + R"(, "hidden_act": "situ")");
  ExpectMentions(Checkpoint::Open(dir_, &ckpt), "no model.safetensors.index.json and no *.safetensors files");
}

// ---------------------------------------------------------------------------------------------
// The CLI's input and output files

class CheckpointMoeFiles : public CheckpointTest {};

HostMoeInput RandomInput(const LayerShape& shape, int64_t t, bool mxfp8, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostMoeInput in;
  in.num_tokens = t;
  if (mxfp8) {
    in.x_e4m3.resize(t * shape.hidden);
    in.x_scale.resize(t * shape.hidden / 32);
    for (auto& b : in.x_e4m3) b = static_cast<uint8_t>(rng());
    for (auto& b : in.x_scale) b = static_cast<uint8_t>(120 + rng() % 8);
  } else {
    in.x_bf16.resize(t * shape.hidden);
    std::normal_distribution<float> normal;
    for (auto& h : in.x_bf16) h = float_to_bf16(normal(rng));
  }
  in.topk_ids.resize(t * shape.top_k);
  in.topk_weights.resize(t * shape.top_k);
  for (auto& id : in.topk_ids) id = static_cast<int32_t>(rng() % (shape.num_experts + 1)) - 1;
  for (auto& w : in.topk_weights) w = std::uniform_real_distribution<float>(0, 1)(rng);
  return in;
}

TEST_F(CheckpointMoeFiles, InputRoundTrip) {
  for (bool mxfp8 : {false, true}) {
    for (int64_t t : {0, 1, 7}) {
      const HostMoeInput in = RandomInput(kSmall, t, mxfp8, 77 + t);
      const std::string path = Path("in.safetensors");
      Status st = WriteMoeInputFile(path, kSmall, in.View());
      ASSERT_TRUE(st.ok()) << st.ToString();
      HostMoeInput back;
      st = ReadMoeInputFile(path, kSmall, &back);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(back.num_tokens, t);
      EXPECT_EQ(back.is_mxfp8(), mxfp8 && t > 0);
      EXPECT_EQ(back.x_bf16, in.x_bf16);
      EXPECT_EQ(back.x_e4m3, in.x_e4m3);
      EXPECT_EQ(back.x_scale, in.x_scale);
      EXPECT_EQ(back.topk_ids, in.topk_ids);
      EXPECT_EQ(back.topk_weights, in.topk_weights);
      const MoeInput view = back.View();
      EXPECT_EQ(view.num_tokens, t);
      if (t > 0) {
        EXPECT_EQ(view.x_bf16 != nullptr, !mxfp8);
      }
    }
  }
}

TEST_F(CheckpointMoeFiles, InputMismatchesAreNamed) {
  const int64_t t = 3;
  const HostMoeInput in = RandomInput(kSmall, t, false, 5);
  const std::string path = Path("bad.safetensors");
  const auto write = [&](std::vector<TensorToWrite> tensors) { ASSERT_TRUE(WriteSafetensors(path, tensors).ok()); };
  const TensorToWrite hs{"hidden_states", DType::kBF16, {t, 64}, in.x_bf16.data(), in.x_bf16.size() * 2};
  const TensorToWrite ids{"topk_ids", DType::kI32, {t, 2}, in.topk_ids.data(), in.topk_ids.size() * 4};
  const TensorToWrite wts{"topk_weights", DType::kF32, {t, 2}, in.topk_weights.data(), in.topk_weights.size() * 4};
  HostMoeInput back;

  write({ids, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "missing tensor 'hidden_states' in " + path);
  write({hs, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "missing tensor 'topk_ids'");
  write({hs, ids});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "missing tensor 'topk_weights'");

  // K differs from the layer's.
  write({{"hidden_states", DType::kBF16, {t * 2, 32}, in.x_bf16.data(), in.x_bf16.size() * 2}, ids, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "tensor 'hidden_states' in " + path + ": expected BF16 or F8_E4M3 [T, 64]");
  // Wrong dtype of x.
  write({{"hidden_states", DType::kF16, {t, 64}, in.x_bf16.data(), in.x_bf16.size() * 2}, ids, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "found F16 [3, 64]");
  // T differs between tensors.
  write({hs, {"topk_ids", DType::kI32, {2, 3}, in.topk_ids.data(), 24}, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "tensor 'topk_ids' in " + path + ": expected I32 [3, 2], found I32 [2, 3] (T = 3 from hidden_states");
  // Wrong dtype of ids and weights.
  write({hs, {"topk_ids", DType::kI64, {t, 1}, in.topk_ids.data(), 24}, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "found I64 [3, 1]");
  const std::vector<float> nine(9, 0.5f);
  write({hs, ids, {"topk_weights", DType::kF32, {t, 3}, nine.data(), 36}});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "tensor 'topk_weights'");
  // Scales with bf16, and fp8 without scales.
  const std::vector<uint8_t> scales(t * 2, 127);
  write({hs, {"hidden_states_scale", DType::kU8, {t, 2}, scales.data(), scales.size()}, ids, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "hidden_states_scale");
  const std::vector<uint8_t> codes(t * 64, 0x38);
  write({{"hidden_states", DType::kF8E4M3, {t, 64}, codes.data(), codes.size()}, ids, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "missing tensor 'hidden_states_scale'");
  write({{"hidden_states", DType::kF8E4M3, {t, 64}, codes.data(), codes.size()},
         {"hidden_states_scale", DType::kU8, {t, 1}, scales.data(), 3}, ids, wts});
  ExpectMentions(ReadMoeInputFile(path, kSmall, &back), "expected U8 [3, 2], found U8 [3, 1]");
}

TEST_F(CheckpointMoeFiles, OutputRoundTrip) {
  const int64_t t = 5, k = 64;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> f32(t * k);
  for (auto& v : f32) v = normal(rng);
  std::vector<uint16_t> bf16(t * k);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = float_to_bf16(f32[i]);

  const std::string path = Path("out.safetensors");
  ASSERT_TRUE(WriteMoeOutputFile(path, t, k, OutputDType::kF32, f32.data()).ok());
  HostMoeOutput back;
  Status st = ReadMoeOutputFile(path, k, &back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(back.dtype, OutputDType::kF32);
  EXPECT_EQ(back.num_tokens, t);
  EXPECT_EQ(back.values, f32);

  ASSERT_TRUE(WriteMoeOutputFile(path, t, k, OutputDType::kBF16, bf16.data()).ok());
  std::unique_ptr<SafetensorsFile> f;
  ASSERT_TRUE(SafetensorsFile::Open(path, &f).ok());
  ASSERT_NE(f->Find("output"), nullptr);
  EXPECT_EQ(f->Find("output")->dtype, DType::kBF16);
  EXPECT_EQ(f->Find("output")->shape, (std::vector<int64_t>{t, k}));
  st = ReadMoeOutputFile(path, k, &back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(back.dtype, OutputDType::kBF16);
  for (size_t i = 0; i < bf16.size(); ++i) ASSERT_EQ(back.values[i], bf16_to_float(bf16[i])) << i;

  ExpectMentions(ReadMoeOutputFile(path, 32, &back), "expected BF16 or F32 [T, 32], found BF16 [5, 64]");
  ASSERT_TRUE(WriteMoeOutputFile(path, 0, k, OutputDType::kBF16, nullptr).ok());
  ASSERT_TRUE(ReadMoeOutputFile(path, k, &back).ok());
  EXPECT_EQ(back.num_tokens, 0);
  EXPECT_TRUE(back.values.empty());
}

}  // namespace
}  // namespace mxmoe
