// The CLI's input and output files: one MoE call's activations and its result, as safetensors.
#include <cstring>

#include "mxmoe/checkpoint.h"
#include "mxmoe/formats.h"
#include "mxmoe/safetensors.h"

namespace mxmoe {

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

template <typename T>
void CopyOut(const TensorInfo* t, std::vector<T>* out) {
  out->resize(t->nbytes / sizeof(T));
  if (t->nbytes > 0) std::memcpy(out->data(), t->data, t->nbytes);  // t->data may be unaligned
}

// ExpectTensor, with the origin of the expected shape added to a mismatch.
Status Expect(const SafetensorsFile& f, const char* name, DType dtype, const std::vector<int64_t>& shape,
              const std::string& why, const TensorInfo** out) {
  Status st = f.Get(name, dtype, shape, out);
  if (!st.ok() && f.Find(name) != nullptr) return Status(st.code(), st.message() + " (" + why + ")");
  return st;
}

}  // namespace

MoeInput HostMoeInput::View() const {
  MoeInput in;
  in.num_tokens = num_tokens;
  in.x_bf16 = x_bf16.empty() ? nullptr : x_bf16.data();
  in.x_e4m3 = x_e4m3.empty() ? nullptr : x_e4m3.data();
  in.x_scale = x_scale.empty() ? nullptr : x_scale.data();
  in.topk_ids = topk_ids.empty() ? nullptr : topk_ids.data();
  in.topk_weights = topk_weights.empty() ? nullptr : topk_weights.data();
  return in;
}

Status ReadMoeInputFile(const std::string& path, const LayerShape& shape, HostMoeInput* out) {
  std::unique_ptr<SafetensorsFile> f;
  MXMOE_RETURN_IF_ERROR(SafetensorsFile::Open(path, &f));
  const int64_t k_hidden = shape.hidden, top_k = shape.top_k;
  const TensorInfo* hs = f->Find("hidden_states");
  if (hs == nullptr) return Status::Io("missing tensor 'hidden_states' in " + path);
  if (hs->shape.size() != 2 || hs->shape[1] != k_hidden || (hs->dtype != DType::kBF16 && hs->dtype != DType::kF8E4M3))
    return Status::Invalid("tensor 'hidden_states' in " + path + ": expected BF16 or F8_E4M3 [T, " +
                           Str(k_hidden) + "] (K of the layer), found " + DTypeName(hs->dtype) + " " +
                           ShapeToString(hs->shape));
  const int64_t t = hs->shape[0];
  HostMoeInput r;
  r.num_tokens = t;
  const std::string from_t = "T = " + Str(t) + " from hidden_states";
  if (hs->dtype == DType::kBF16) {
    if (f->Find("hidden_states_scale") != nullptr)
      return Status::Invalid("tensor 'hidden_states_scale' in " + path +
                             ": given, but hidden_states is BF16 (scales go with F8_E4M3 only)");
    CopyOut(hs, &r.x_bf16);
  } else {
    const TensorInfo* sc = nullptr;
    MXMOE_RETURN_IF_ERROR(Expect(*f, "hidden_states_scale", DType::kU8, {t, k_hidden / kMxBlock},
                                 from_t + ", K / 32 from the layer", &sc));
    CopyOut(hs, &r.x_e4m3);
    CopyOut(sc, &r.x_scale);
  }
  const TensorInfo* ids = nullptr;
  const TensorInfo* weights = nullptr;
  MXMOE_RETURN_IF_ERROR(Expect(*f, "topk_ids", DType::kI32, {t, top_k}, from_t + ", k from the layer", &ids));
  MXMOE_RETURN_IF_ERROR(
      Expect(*f, "topk_weights", DType::kF32, {t, top_k}, from_t + ", k from the layer", &weights));
  CopyOut(ids, &r.topk_ids);
  CopyOut(weights, &r.topk_weights);
  *out = std::move(r);
  return Status::Ok();
}

Status WriteMoeInputFile(const std::string& path, const LayerShape& shape, const MoeInput& in) {
  const int64_t t = in.num_tokens, k_hidden = shape.hidden, top_k = shape.top_k;
  if (t < 0) return Status::Invalid(path + ": num_tokens = " + Str(t) + ", expected >= 0");
  const bool fp8 = in.x_e4m3 != nullptr || in.x_scale != nullptr;
  if (fp8 && in.x_bf16 != nullptr) return Status::Invalid(path + ": give either x_bf16 or x_e4m3 + x_scale, not both");
  if (fp8 && (in.x_e4m3 == nullptr || in.x_scale == nullptr))
    return Status::Invalid(path + ": x_e4m3 and x_scale go together");
  std::vector<TensorToWrite> tensors;
  const auto add = [&](const char* name, DType dtype, std::vector<int64_t> dims, const void* data) {
    const size_t nbytes = static_cast<size_t>(dims[0] * dims[1]) * DTypeSize(dtype);
    tensors.push_back({name, dtype, std::move(dims), data, nbytes});
  };
  if (fp8) {
    add("hidden_states", DType::kF8E4M3, {t, k_hidden}, in.x_e4m3);
    add("hidden_states_scale", DType::kU8, {t, k_hidden / kMxBlock}, in.x_scale);
  } else {
    add("hidden_states", DType::kBF16, {t, k_hidden}, in.x_bf16);
  }
  add("topk_ids", DType::kI32, {t, top_k}, in.topk_ids);
  add("topk_weights", DType::kF32, {t, top_k}, in.topk_weights);
  return WriteSafetensors(path, tensors);
}

Status WriteMoeOutputFile(const std::string& path, int64_t num_tokens, int64_t hidden, OutputDType dtype,
                          const void* data) {
  if (num_tokens < 0 || hidden < 0)
    return Status::Invalid(path + ": output shape [" + Str(num_tokens) + ", " + Str(hidden) + "] is negative");
  if (dtype != OutputDType::kBF16 && dtype != OutputDType::kF32)
    return Status::Invalid(path + ": output dtype " + Str(static_cast<int>(dtype)) + " is not bf16 or f32");
  const DType dt = dtype == OutputDType::kBF16 ? DType::kBF16 : DType::kF32;
  const size_t nbytes = static_cast<size_t>(num_tokens * hidden) * DTypeSize(dt);
  return WriteSafetensors(path, {{"output", dt, {num_tokens, hidden}, data, nbytes}});
}

Status ReadMoeOutputFile(const std::string& path, int64_t hidden, HostMoeOutput* out) {
  std::unique_ptr<SafetensorsFile> f;
  MXMOE_RETURN_IF_ERROR(SafetensorsFile::Open(path, &f));
  const TensorInfo* t = f->Find("output");
  if (t == nullptr) return Status::Io("missing tensor 'output' in " + path);
  if (t->shape.size() != 2 || (hidden > 0 && t->shape[1] != hidden) ||
      (t->dtype != DType::kBF16 && t->dtype != DType::kF32))
    return Status::Invalid("tensor 'output' in " + path + ": expected BF16 or F32 [T, " +
                           (hidden > 0 ? Str(hidden) : std::string("K")) + "], found " + DTypeName(t->dtype) +
                           " " + ShapeToString(t->shape));
  HostMoeOutput r;
  r.num_tokens = t->shape[0];
  r.hidden = t->shape[1];
  const size_t n = static_cast<size_t>(r.num_tokens * r.hidden);
  r.values.resize(n);
  if (t->dtype == DType::kF32) {
    r.dtype = OutputDType::kF32;
    if (n > 0) std::memcpy(r.values.data(), t->data, n * sizeof(float));
  } else {
    r.dtype = OutputDType::kBF16;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      r.values[i] = bf16_to_float(h);
    }
  }
  *out = std::move(r);
  return Status::Ok();
}

}  // namespace mxmoe
