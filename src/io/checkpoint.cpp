// Sharded checkpoints: locating, lazily opening and slicing the routed experts of one layer.
#include "mxmoe/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/parallel.h"
#include "io/file_util.h"
#include "mxmoe/formats.h"
#include "mxmoe/json.h"

namespace mxmoe {

namespace {

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Shard names come from a file we do not control; only plain names inside the directory are
// followed, so an index cannot point the loader elsewhere on the filesystem.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find("..") == std::string::npos &&
         name.find('\0') == std::string::npos;
}


}  // namespace

std::string ExpertTensorName(int64_t layer, int64_t expert, int w, bool scale) {
  return "language_model.model.layers." + std::to_string(layer) + ".block_sparse_moe.experts." +
         std::to_string(expert) + ".w" + std::to_string(w) + (scale ? ".weight_scale" : ".weight_packed");
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

Status Checkpoint::Open(const std::string& dir_in, std::unique_ptr<Checkpoint>* out) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  c->dir_ = dir;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    return Status::Io(dir + ": cannot open the checkpoint directory: " + io::ErrnoMessage(errno));
  if (!S_ISDIR(st.st_mode)) return Status::Io(dir + ": not a directory (expected a checkpoint directory)");
  MXMOE_RETURN_IF_ERROR(ReadModelConfig(Join(dir, kConfigFileName), &c->config_));

  const std::string index_path = Join(dir, kIndexFileName);
  if (Exists(index_path)) {
    c->has_index_ = true;
    JsonValue index;
    MXMOE_RETURN_IF_ERROR(ReadJsonFile(index_path, &index));
    const JsonValue* map = index.Find("weight_map");
    if (map == nullptr) return Status::Io(index_path + ": missing field 'weight_map'");
    if (!map->is_object())
      return Status::Io(index_path + ": weight_map is a " + JsonTypeName(map->type()) + ", expected an object");
    for (const auto& [name, file] : map->AsObject()) {
      if (!file.is_string())
        return Status::Io(index_path + ": weight_map['" + name + "'] is a " + JsonTypeName(file.type()) +
                          ", expected a file name");
      if (!IsPlainFileName(file.AsString()))
        return Status::Io(index_path + ": weight_map['" + name + "'] = '" + file.AsString() +
                          "' is refused: shard names must be plain file names in the checkpoint directory");
      c->weight_map_.emplace(name, file.AsString());
    }
    *out = std::move(c);
    return Status::Ok();
  }

  // No index: every *.safetensors file, whose headers must be read to know what each holds.
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::Io(dir + ": cannot list: " + io::ErrnoMessage(errno));
  std::vector<std::string> files;
  while (const dirent* ent = ::readdir(d)) {
    const std::string name = ent->d_name;
    if (EndsWith(name, ".safetensors")) files.push_back(name);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  if (files.empty())
    return Status::Io(dir + ": no " + kIndexFileName + " and no *.safetensors files");
  for (const std::string& file : files) {
    SafetensorsFile* shard = nullptr;
    MXMOE_RETURN_IF_ERROR(c->OpenShard(file, &shard));
    for (const std::string& name : shard->Names()) {
      const auto [it, inserted] = c->weight_map_.emplace(name, file);
      if (!inserted)
        return Status::Io(dir + ": tensor '" + name + "' is in both " + it->second + " and " + file);
    }
  }
  *out = std::move(c);
  return Status::Ok();
}

Status Checkpoint::OpenShard(const std::string& file_name, SafetensorsFile** out) {
  auto it = shards_.find(file_name);
  if (it == shards_.end()) {
    std::unique_ptr<SafetensorsFile> f;
    MXMOE_RETURN_IF_ERROR(SafetensorsFile::Open(Join(dir_, file_name), &f));
    it = shards_.emplace(file_name, std::move(f)).first;
  }
  *out = it->second.get();
  return Status::Ok();
}

std::vector<std::string> Checkpoint::OpenedFiles() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, file] : shards_) names.push_back(name);
  return names;
}

Status Checkpoint::GetTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                             const TensorInfo** out, std::string* file) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = weight_map_.find(name);
  if (it == weight_map_.end())
    return Status::Io("missing tensor '" + name + "' in checkpoint " + dir_ +
                      (has_index_ ? std::string(" (not in ") + kIndexFileName + ")" : std::string()));
  SafetensorsFile* shard = nullptr;
  Status st = OpenShard(it->second, &shard);
  if (!st.ok()) return Status(st.code(), st.message() + " (holds tensor '" + name + "')");
  const TensorInfo* t = shard->Find(name);
  if (t == nullptr)
    return Status::Io("missing tensor '" + name + "' in " + shard->path() + " (" + kIndexFileName +
                      " lists it there)");
  MXMOE_RETURN_IF_ERROR(ExpectTensor(t, name, dtype, shape, shard->path()));
  *out = t;
  if (file != nullptr) *file = shard->path();
  return Status::Ok();
}

Status Checkpoint::LoadLayer(int64_t layer, const ParallelSlice& slice, ExpertSet* out) {
  const LayerShape& shape = config_.shape;
  if (layer < 0) return Status::Invalid("layer " + std::to_string(layer) + " is negative");
  MXMOE_RETURN_IF_ERROR(slice.Validate(shape));
  const int64_t n = slice.NumLocalExperts(shape);
  const int64_t e0 = slice.FirstExpert(shape);
  const int64_t il = slice.LocalIntermediate(shape);
  const int64_t i0 = slice.FirstIntermediateRow(shape);
  const int64_t k = shape.hidden, i_full = shape.intermediate;

  // Resolve and check every tensor first, so that a bad checkpoint is refused before any copying
  // and the error names the first missing or mismatched tensor.
  struct Sources {
    const TensorInfo* packed[3];  // w1, w3, w2
    const TensorInfo* scale[3];
  };
  constexpr int kW[3] = {1, 3, 2};
  std::vector<Sources> src(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 3; ++j) {
      const int64_t rows = kW[j] == 2 ? k : i_full, cols = kW[j] == 2 ? i_full : k;
      MXMOE_RETURN_IF_ERROR(GetTensor(ExpertTensorName(layer, e0 + i, kW[j], false), DType::kU8,
                                      {rows, cols / 2}, &src[i].packed[j]));
      MXMOE_RETURN_IF_ERROR(GetTensor(ExpertTensorName(layer, e0 + i, kW[j], true), DType::kU8,
                                      {rows, cols / kMxBlock}, &src[i].scale[j]));
    }
  }

  ExpertSet r;
  r.shape = shape;
  r.slice = slice;
  r.activation.type = config_.activation.type;
  r.activation.params = config_.activation.params;
  if (!config_.per_expert_global.empty())
    r.activation.per_expert.assign(config_.per_expert_global.begin() + e0,
                                   config_.per_expert_global.begin() + e0 + n);
  r.experts.resize(static_cast<size_t>(n));

  // Copying is page-fault bound on a cold mapping; several threads keep more reads in flight.
  const int threads = static_cast<int>(std::min<unsigned>(16, std::max(1u, std::thread::hardware_concurrency())));
  ParallelFor(n, threads, [&](int64_t i) {
    const Sources& s = src[i];
    ExpertWeights& w = r.experts[i];
    // w1 and w3: rows [i0, i0 + il), one contiguous range.
    for (int j = 0; j < 2; ++j) {
      Mxfp4Matrix& m = j == 0 ? w.w1 : w.w3;
      m.rows = il;
      m.cols = k;
      const uint8_t* p = s.packed[j]->data + i0 * (k / 2);
      const uint8_t* sc = s.scale[j]->data + i0 * (k / kMxBlock);
      m.packed.assign(p, p + il * (k / 2));
      m.scales.assign(sc, sc + il * (k / kMxBlock));
    }
    // w2: columns [i0, i0 + il) of every row; i0 and il are multiples of 32, so whole bytes and
    // whole scale blocks.
    Mxfp4Matrix& m = w.w2;
    m.rows = k;
    m.cols = il;
    m.packed.resize(static_cast<size_t>(k * (il / 2)));
    m.scales.resize(static_cast<size_t>(k * (il / kMxBlock)));
    const uint8_t* p = s.packed[2]->data;
    const uint8_t* sc = s.scale[2]->data;
    for (int64_t row = 0; row < k; ++row) {
      std::memcpy(m.packed.data() + row * (il / 2), p + row * (i_full / 2) + i0 / 2, il / 2);
      std::memcpy(m.scales.data() + row * (il / kMxBlock), sc + row * (i_full / kMxBlock) + i0 / kMxBlock,
                  il / kMxBlock);
    }
  });
  Status st = r.Validate();
  if (!st.ok()) return Status(st.code(), dir_ + ": layer " + std::to_string(layer) + ": " + st.message());
  *out = std::move(r);
  return Status::Ok();
}

Status LoadLayer(const std::string& checkpoint_dir, int64_t layer, const ParallelSlice& slice, ExpertSet* out) {
  std::unique_ptr<Checkpoint> c;
  MXMOE_RETURN_IF_ERROR(Checkpoint::Open(checkpoint_dir, &c));
  return c->LoadLayer(layer, slice, out);
}

// ---------------------------------------------------------------------------------------------
// Writer

Status WriteCheckpoint(const std::string& dir, const ModelConfig& config, const std::vector<ExpertSet>& layers,
                       int num_shards, bool config_under_text_config) {
  const LayerShape& shape = config.shape;
  MXMOE_RETURN_IF_ERROR(shape.Validate());
  if (layers.empty()) return Status::Invalid("WriteCheckpoint " + dir + ": no layers given");
  for (size_t l = 0; l < layers.size(); ++l) {
    const ExpertSet& s = layers[l];
    const std::string who = "WriteCheckpoint " + dir + ": layer " + std::to_string(l);
    if (!s.slice.IsFull()) return Status::Invalid(who + " is a TP/EP slice, expected the unsplit layer");
    if (s.shape.num_experts != shape.num_experts || s.shape.hidden != shape.hidden ||
        s.shape.intermediate != shape.intermediate || s.shape.top_k != shape.top_k)
      return Status::Invalid(who + ": its shape differs from the config's");
    Status st = s.Validate();
    if (!st.ok()) return Status(st.code(), who + ": " + st.message());
    for (const ExpertWeights& w : s.experts)
      if (!w.gate_bias.empty() || !w.up_bias.empty())
        return Status::Unsupported(who + ": gate/up biases are not part of this checkpoint format");
  }
  const int64_t e = shape.num_experts;
  const int64_t total = static_cast<int64_t>(layers.size()) * e;
  if (num_shards < 1 || num_shards > total)
    return Status::Invalid("WriteCheckpoint " + dir + ": num_shards = " + std::to_string(num_shards) +
                           ", expected 1 to " + std::to_string(total) + " (the number of experts)");

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Io(dir + ": cannot create directory: " + ec.message());

  const auto shard_name = [&](int s) {
    if (num_shards == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", s + 1, num_shards);
    return std::string(buf);
  };
  // Expert ordinal j (layer-major) goes to shard j * num_shards / total: contiguous, even runs.
  std::vector<std::vector<TensorToWrite>> shards(static_cast<size_t>(num_shards));
  JsonValue weight_map = JsonValue::MakeObject();
  int64_t total_bytes = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    for (int64_t x = 0; x < e; ++x) {
      const int64_t j = static_cast<int64_t>(l) * e + x;
      const int s = static_cast<int>(j * num_shards / total);
      const ExpertWeights& w = layers[l].experts[x];
      for (int wi : {1, 2, 3}) {
        const Mxfp4Matrix& m = wi == 1 ? w.w1 : wi == 3 ? w.w3 : w.w2;
        for (bool scale : {false, true}) {
          TensorToWrite t;
          t.name = ExpertTensorName(static_cast<int64_t>(l), x, wi, scale);
          t.dtype = DType::kU8;
          t.shape = {m.rows, scale ? m.cols / kMxBlock : m.cols / 2};
          const std::vector<uint8_t>& bytes = scale ? m.scales : m.packed;
          t.data = bytes.data();
          t.nbytes = bytes.size();
          total_bytes += static_cast<int64_t>(t.nbytes);
          weight_map.Set(t.name, JsonValue::String(shard_name(s)));
          shards[s].push_back(std::move(t));
        }
      }
    }
  }
  for (int s = 0; s < num_shards; ++s)
    MXMOE_RETURN_IF_ERROR(WriteSafetensors(Join(dir, shard_name(s)), shards[s], {{"format", "pt"}}));
  const std::string index_path = Join(dir, kIndexFileName);
  if (num_shards > 1) {
    JsonValue index = JsonValue::MakeObject();
    JsonValue meta = JsonValue::MakeObject();
    meta.Set("total_size", JsonValue::Integer(total_bytes));
    index.Set("metadata", std::move(meta));
    index.Set("weight_map", std::move(weight_map));
    MXMOE_RETURN_IF_ERROR(WriteJsonFile(index_path, index));
  } else if (::unlink(index_path.c_str()) != 0 && errno != ENOENT) {
    // A stale index from an earlier sharded write would hide the new model.safetensors.
    return Status::Io(index_path + ": cannot remove the stale index: " + io::ErrnoMessage(errno));
  }
  return WriteModelConfig(Join(dir, kConfigFileName), config, config_under_text_config);
}

}  // namespace mxmoe
