// Shape, slice and argument validation, and slicing of expert sets (SPEC section 1).
#include <cmath>
#include <string>

#include "mxmoe/formats.h"
#include "mxmoe/layouts.h"
#include "mxmoe/moe.h"

namespace mxmoe {

namespace {
std::string Str(int64_t v) { return std::to_string(v); }
}  // namespace

const char* OutputDTypeName(OutputDType t) {
  switch (t) {
    case OutputDType::kBF16: return "bf16";
    case OutputDType::kF32: return "f32";
  }
  return "invalid";
}

Status LayerShape::Validate() const {
  if (num_experts < 1) return Status::Invalid("num_experts = " + Str(num_experts) + ", expected >= 1");
  if (hidden < kMxBlock || hidden % kMxBlock != 0)
    return Status::Invalid("hidden size K = " + Str(hidden) + " is not a positive multiple of 32");
  if (intermediate < kMxBlock || intermediate % kMxBlock != 0)
    return Status::Invalid("intermediate size I = " + Str(intermediate) +
                           " is not a positive multiple of 32");
  if (top_k < 1 || top_k > num_experts)
    return Status::Invalid("top_k = " + Str(top_k) + " is outside [1, num_experts = " +
                           Str(num_experts) + "]");
  return Status::Ok();
}

Status ParallelSlice::Validate(const LayerShape& s) const {
  if (tp_size < 1) return Status::Invalid("tp_size = " + Str(tp_size) + ", expected >= 1");
  if (tp_rank < 0 || tp_rank >= tp_size)
    return Status::Invalid("tp_rank = " + Str(tp_rank) + " is outside [0, tp_size = " + Str(tp_size) + ")");
  if (ep_size < 1) return Status::Invalid("ep_size = " + Str(ep_size) + ", expected >= 1");
  if (ep_rank < 0 || ep_rank >= ep_size)
    return Status::Invalid("ep_rank = " + Str(ep_rank) + " is outside [0, ep_size = " + Str(ep_size) + ")");
  if (s.intermediate % tp_size != 0 || (s.intermediate / tp_size) % kMxBlock != 0)
    return Status::Invalid("I / tp_size = " + Str(s.intermediate) + " / " + Str(tp_size) +
                           " is not a multiple of 32 (every MX block must live on one rank)");
  if (s.num_experts % ep_size != 0)
    return Status::Invalid("num_experts % ep_size = " + Str(s.num_experts) + " % " + Str(ep_size) +
                           " != 0");
  return Status::Ok();
}

Status Mxfp4Matrix::Validate(const std::string& name, int64_t want_rows, int64_t want_cols) const {
  if (rows != want_rows || cols != want_cols)
    return Status::Invalid(name + ": expected shape [" + Str(want_rows) + ", " + Str(want_cols) +
                           "], found [" + Str(rows) + ", " + Str(cols) + "]");
  if (cols % kMxBlock != 0) return Status::Invalid(name + ": columns " + Str(cols) + " not a multiple of 32");
  if (static_cast<int64_t>(packed.size()) != rows * cols / 2)
    return Status::Invalid(name + ": packed data has " + Str(static_cast<int64_t>(packed.size())) +
                           " bytes, expected " + Str(rows * cols / 2));
  if (static_cast<int64_t>(scales.size()) != rows * cols / kMxBlock)
    return Status::Invalid(name + ": scales have " + Str(static_cast<int64_t>(scales.size())) +
                           " bytes, expected " + Str(rows * cols / kMxBlock));
  return Status::Ok();
}

float Mxfp4Matrix::At(int64_t r, int64_t c) const {
  const uint8_t code = e2m1_unpack(packed.data() + r * (cols / 2), c);
  return e2m1_to_float(code) * ue8m0_to_float(scales[r * (cols / kMxBlock) + c / kMxBlock]);
}

Status ExpertSet::Validate() const {
  MXMOE_RETURN_IF_ERROR(shape.Validate());
  MXMOE_RETURN_IF_ERROR(slice.Validate(shape));
  MXMOE_RETURN_IF_ERROR(CheckActivationSupported(activation.type));
  const int64_t n = NumLocalExperts();
  const int64_t il = LocalIntermediate();
  const int64_t k = shape.hidden;
  if (static_cast<int64_t>(experts.size()) != n)
    return Status::Invalid("expert set holds " + Str(static_cast<int64_t>(experts.size())) +
                           " experts, expected " + Str(n) + " (num_experts / ep_size)");
  if (!activation.per_expert.empty() && static_cast<int64_t>(activation.per_expert.size()) != n)
    return Status::Invalid("per-expert activation parameters: " +
                           Str(static_cast<int64_t>(activation.per_expert.size())) +
                           " entries, expected " + Str(n));
  for (int64_t i = 0; i < n; ++i) {
    const ActParams& p = activation.ForExpert(i);
    const std::string who = "expert " + Str(FirstExpert() + i);
    // The kernels divide by beta with an approximate reciprocal that flushes subnormals and
    // gives 0 for divisors above 2^126 (activation_math.h, act_div): betas outside the normal
    // range up to 2^126 are refused rather than computed wrongly.
    constexpr float kMinSituBeta = 0x1p-126f, kMaxSituBeta = 0x1p126f;
    const auto beta_ok = [&](float b) { return b >= kMinSituBeta && b <= kMaxSituBeta; };
    if (activation.type == ActivationType::Situ && !(beta_ok(p.beta) && beta_ok(p.linear_beta)))
      return Status::Invalid(who + ": situ beta and linear_beta must be in [2^-126, 2^126]");
    if (activation.type == ActivationType::SwigluBias &&
        !(std::isfinite(p.alpha) && p.limit > 0 && std::isfinite(p.limit)))
      return Status::Invalid(who + ": swiglu alpha must be finite and limit finite and > 0");
    const ExpertWeights& w = experts[i];
    MXMOE_RETURN_IF_ERROR(w.w1.Validate(who + " w1", il, k));
    MXMOE_RETURN_IF_ERROR(w.w3.Validate(who + " w3", il, k));
    MXMOE_RETURN_IF_ERROR(w.w2.Validate(who + " w2", k, il));
    for (const auto* b : {&w.gate_bias, &w.up_bias}) {
      if (!b->empty() && static_cast<int64_t>(b->size()) != il)
        return Status::Invalid(who + ": bias has " + Str(static_cast<int64_t>(b->size())) +
                               " entries, expected " + Str(il));
    }
    if (!(w.gate_bias.empty() && w.up_bias.empty()) && activation.type != ActivationType::SwigluBias)
      return Status::Invalid(who + ": gate/up biases are only defined for SwigluBias, not " +
                             ActivationName(activation.type));
  }
  return Status::Ok();
}

Status SliceExperts(const ExpertSet& full, const ParallelSlice& slice, ExpertSet* out) {
  if (!full.slice.IsFull()) return Status::Invalid("SliceExperts: the input set is already a slice");
  MXMOE_RETURN_IF_ERROR(full.Validate());
  MXMOE_RETURN_IF_ERROR(slice.Validate(full.shape));
  ExpertSet r;
  r.shape = full.shape;
  r.slice = slice;
  r.activation.type = full.activation.type;
  r.activation.params = full.activation.params;
  const int64_t n = slice.NumLocalExperts(full.shape);
  const int64_t e0 = slice.FirstExpert(full.shape);
  const int64_t il = slice.LocalIntermediate(full.shape);
  const int64_t i0 = slice.FirstIntermediateRow(full.shape);
  r.experts.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const ExpertWeights& src = full.experts[e0 + i];
    ExpertWeights& dst = r.experts[i];
    dst.w1 = SliceRows(src.w1, i0, il);
    dst.w3 = SliceRows(src.w3, i0, il);
    dst.w2 = SliceCols(src.w2, i0, il);
    if (!src.gate_bias.empty())
      dst.gate_bias.assign(src.gate_bias.begin() + i0, src.gate_bias.begin() + i0 + il);
    if (!src.up_bias.empty()) dst.up_bias.assign(src.up_bias.begin() + i0, src.up_bias.begin() + i0 + il);
    if (!full.activation.per_expert.empty()) r.activation.per_expert.push_back(full.activation.per_expert[e0 + i]);
  }
  *out = std::move(r);
  return Status::Ok();
}

Status ValidateMoeCall(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out,
                       bool check_ids) {
  const int64_t t = in.num_tokens;
  const int64_t k = experts.shape.top_k;
  const int64_t e = experts.shape.num_experts;
  if (t < 0) return Status::Invalid("num_tokens = " + Str(t) + ", expected >= 0");
  if (out.dtype != OutputDType::kBF16 && out.dtype != OutputDType::kF32)
    return Status::Invalid("output dtype " + Str(static_cast<int>(out.dtype)) + " is not bf16 or f32");
  if (t == 0) return Status::Ok();
  const bool bf16 = in.x_bf16 != nullptr;
  const bool fp8 = in.x_e4m3 != nullptr || in.x_scale != nullptr;
  if (bf16 && fp8) return Status::Invalid("x: give either x_bf16 or x_e4m3 + x_scale, not both");
  if (!bf16 && !fp8) return Status::Invalid("x: missing (x_bf16, or x_e4m3 + x_scale)");
  if (fp8 && (in.x_e4m3 == nullptr || in.x_scale == nullptr))
    return Status::Invalid(in.x_e4m3 == nullptr ? "x_e4m3: missing (x_scale given)"
                                                : "x_scale: missing (x_e4m3 given)");
  if (in.topk_ids == nullptr) return Status::Invalid("topk_ids: missing");
  if (in.topk_weights == nullptr) return Status::Invalid("topk_weights: missing");
  if (out.data == nullptr) return Status::Invalid("output: missing");
  if (check_ids) {
    for (int64_t i = 0; i < t * k; ++i) {
      const int32_t id = in.topk_ids[i];
      if (id < -1 || id >= e)
        return Status::Invalid("topk_ids[" + Str(i / k) + ", " + Str(i % k) + "] = " + Str(id) +
                               " is outside [-1, " + Str(e) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace mxmoe
