// Kimi-K3-style checkpoints (SPEC section 4) and the CLI's input and output files.
//
// A checkpoint directory holds config.json and either model.safetensors.index.json (whose
// weight_map names the shard of every tensor) or the *.safetensors files themselves. Per layer N
// and expert e the routed experts are
//   language_model.model.layers.{N}.block_sparse_moe.experts.{e}.w{1,2,3}.weight_packed  U8 [out, in/2]
//   language_model.model.layers.{N}.block_sparse_moe.experts.{e}.w{1,2,3}.weight_scale   U8 [out, in/32]
// with w1 = gate [I, K], w3 = up [I, K], w2 = down [K, I]. The checkpoint is only ever read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mxmoe/moe.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/status.h"

namespace mxmoe {

// ---------------------------------------------------------------------------------------------
// config.json

struct ModelConfig {
  LayerShape shape;
  // type and params (the scalar parameters, or the defaults); per_expert is left empty here.
  ActivationSpec activation;
  // [E] when the config gives per-expert parameters (an array for either beta), else empty.
  std::vector<ActParams> per_expert_global;
};

// Reads `path` (config.json). Each field is looked up under "text_config" first, then at the top
// level:
//   routed_expert_hidden_size -> K (hidden_size is the model width, not K, and is never used)
//   moe_intermediate_size -> I
//   num_experts (or n_routed_experts, num_local_experts) -> E
//   num_experts_per_token (or num_experts_per_tok, experts_per_token) -> k
//   hidden_act: "situ" -> Situ, "silu"/"swiglu" -> Swiglu, "gelu" -> Geglu,
//               "gelu_tanh"/"gelu_pytorch_tanh" -> GegluTanh
//   activation_situ_beta, activation_situ_linear_beta (Situ only): a number, or an array of E
//               numbers; 4.0 and 25.0 when absent.
// Errors name the file and the field: "config.json: missing field 'moe_intermediate_size' (top
// level or text_config)".
Status ReadModelConfig(const std::string& path, ModelConfig* out);
// Writes a config.json that ReadModelConfig reads back as `config`; with under_text_config the
// fields go under "text_config" (as in a multimodal model's config).
Status WriteModelConfig(const std::string& path, const ModelConfig& config, bool under_text_config);

// "hidden_act" spelling of an activation kind ("situ", "silu", "gelu", "gelu_pytorch_tanh"), or
// null for kinds a config cannot name.
const char* HiddenActName(ActivationType t);

// ---------------------------------------------------------------------------------------------
// Checkpoints

// "language_model.model.layers.{layer}.block_sparse_moe.experts.{expert}.w{w}.weight_packed"
// (or ".weight_scale" with scale).
std::string ExpertTensorName(int64_t layer, int64_t expert, int w, bool scale);

inline constexpr const char* kConfigFileName = "config.json";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

// An open checkpoint directory. Shard files are opened (mapped and their headers parsed) only
// when a tensor they hold is first asked for. Thread-safe.
class Checkpoint {
 public:
  // Reads config.json and the index (or, without one, the headers of every *.safetensors file).
  static Status Open(const std::string& dir, std::unique_ptr<Checkpoint>* out);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }

  // The tensor `name` with its dtype and shape checked, or an error naming the tensor and the
  // file (or the checkpoint, when no file holds it). `file`, when given, receives the shard path.
  Status GetTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                   const TensorInfo** out, std::string* file = nullptr);

  // The rank's slice of one layer's routed experts: the local experts [FirstExpert, +n) and, for
  // tensor parallelism, rows [r*I/tp, (r+1)*I/tp) of w1 and w3 and the same columns of w2, taken
  // while copying. Only those experts' tensors are read.
  Status LoadLayer(int64_t layer, const ParallelSlice& slice, ExpertSet* out);

  // The shard files opened so far (for tests of laziness).
  std::vector<std::string> OpenedFiles() const;

 private:
  Checkpoint() = default;
  Status OpenShard(const std::string& file_name, SafetensorsFile** out);

  std::string dir_;
  ModelConfig config_;
  bool has_index_ = false;
  std::map<std::string, std::string> weight_map_;  // tensor name -> shard file name
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;  // by file name
};

// Checkpoint::Open(dir) then LoadLayer.
Status LoadLayer(const std::string& checkpoint_dir, int64_t layer, const ParallelSlice& slice,
                 ExpertSet* out);

// Writes a checkpoint for tests and tools: config.json, the shards and, when num_shards > 1,
// model.safetensors.index.json. `layers[N]` is layer N, unsplit, of config.shape. One shard is
// model.safetensors; several are model-0000i-of-0000n.safetensors with the experts of all layers
// spread evenly over them in order (so a layer may span several files). num_shards is at most the
// total number of experts. Biases are not part of the format and are refused.
Status WriteCheckpoint(const std::string& dir, const ModelConfig& config,
                       const std::vector<ExpertSet>& layers, int num_shards,
                       bool config_under_text_config);

// ---------------------------------------------------------------------------------------------
// The CLI's input and output files (safetensors)
//
// Input: hidden_states BF16 [T, K], or hidden_states F8_E4M3 [T, K] with hidden_states_scale U8
// [T, K/32]; topk_ids I32 [T, k]; topk_weights F32 [T, k]. Output: output BF16 or F32 [T, K].

// A MoE call's activations, owned on the host.
struct HostMoeInput {
  int64_t num_tokens = 0;
  std::vector<uint16_t> x_bf16;   // [T, K] bf16 bits, or empty when x is MXFP8
  std::vector<uint8_t> x_e4m3;    // [T, K], or empty
  std::vector<uint8_t> x_scale;   // [T, K/32], or empty
  std::vector<int32_t> topk_ids;  // [T, k]
  std::vector<float> topk_weights;  // [T, k]

  bool is_mxfp8() const { return !x_e4m3.empty() || !x_scale.empty(); }
  // Pointers into the vectors: valid while this object lives unchanged.
  MoeInput View() const;
};

// T is taken from hidden_states; K and k from `shape`. Every inconsistency is named.
Status ReadMoeInputFile(const std::string& path, const LayerShape& shape, HostMoeInput* out);
// `in` holds host pointers, in either form of x.
Status WriteMoeInputFile(const std::string& path, const LayerShape& shape, const MoeInput& in);

Status WriteMoeOutputFile(const std::string& path, int64_t num_tokens, int64_t hidden,
                          OutputDType dtype, const void* data);

struct HostMoeOutput {
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  OutputDType dtype = OutputDType::kBF16;
  std::vector<float> values;  // [T, K], bf16 widened exactly
};
// Reads the tensor `output` (BF16 or F32, rank 2); with hidden > 0 its width must equal it.
Status ReadMoeOutputFile(const std::string& path, int64_t hidden, HostMoeOutput* out);

}  // namespace mxmoe
