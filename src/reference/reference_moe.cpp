// The CPU reference MoE: plain loops in the order SPEC section 1 states the math. The definition of
// correct for every backend. Dot products accumulate in double: every product of an E4M3 and an
// E2M1 value with power-of-two scales is exact, and the double sum of a row's products is exact for
// realistic scales, so the reference is independent of summation order; the sum is then rounded
// to fp32 once.
#include <cstring>

#include "core/activation_math.h"
#include "mxmoe/formats.h"
#include "mxmoe/moe.h"
#include "reference/quantized_input.h"

namespace mxmoe {

namespace detail {

std::vector<float> DequantizedInput(const MoeInput& in, int64_t hidden) {
  const int64_t t_count = in.num_tokens;
  std::vector<float> xd(t_count * hidden);
  uint8_t codes[kMxBlock];
  float v[kMxBlock];
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t b = 0; b < hidden / kMxBlock; ++b) {
      const int64_t base = t * hidden + b * kMxBlock;
      uint8_t scale;
      if (in.x_bf16 != nullptr) {
        for (int i = 0; i < kMxBlock; ++i) v[i] = bf16_to_float(in.x_bf16[base + i]);
        scale = mxfp8_quantize_block(v, codes);
      } else {
        std::memcpy(codes, in.x_e4m3 + base, kMxBlock);
        scale = in.x_scale[t * (hidden / kMxBlock) + b];
      }
      const float s = ue8m0_to_float(scale);
      for (int i = 0; i < kMxBlock; ++i) xd[base + i] = e4m3_to_float(codes[i]) * s;
    }
  }
  return xd;
}

void QuantizeDequantizeMxfp8(float* a, int64_t n) {
  uint8_t codes[kMxBlock];
  for (int64_t b = 0; b < n; b += kMxBlock) {
    const float s = ue8m0_to_float(mxfp8_quantize_block(a + b, codes));
    for (int i = 0; i < kMxBlock; ++i) a[b + i] = e4m3_to_float(codes[i]) * s;
  }
}

void StoreOutput(const std::vector<float>& acc, const MoeOutput& out) {
  if (out.dtype == OutputDType::kF32) {
    std::memcpy(out.data, acc.data(), acc.size() * sizeof(float));
  } else {
    uint16_t* o = static_cast<uint16_t*>(out.data);
    for (size_t i = 0; i < acc.size(); ++i) o[i] = float_to_bf16(acc[i]);
  }
}

}  // namespace detail

Status ReferenceMoe(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out) {
  MXMOE_RETURN_IF_ERROR(experts.Validate());
  MXMOE_RETURN_IF_ERROR(ValidateMoeCall(experts, in, out, /*check_ids=*/true));
  const int64_t t_count = in.num_tokens, k_dim = experts.shape.hidden;
  const int64_t i_dim = experts.LocalIntermediate(), top_k = experts.shape.top_k;
  const ActivationType act = experts.activation.type;
  if (t_count == 0) return Status::Ok();

  // 1. xq = mxfp8_quantize(x), kept dequantized.
  const std::vector<float> xd = detail::DequantizedInput(in, k_dim);
  std::vector<float> acc(t_count * k_dim, 0.0f);
  std::vector<float> a(i_dim);
  std::vector<float> y(k_dim);

  for (int64_t t = 0; t < t_count; ++t) {
    const float* x = xd.data() + t * k_dim;
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t e;
      if (!detail::LocalExpert(experts, in.topk_ids[t * top_k + j], &e)) continue;
      const ExpertWeights& w = experts.experts[e];
      const ActParams& p = experts.activation.ForExpert(e);
      // 2.-3. g = x . W1^T, u = x . W3^T, a = act(g, u).
      for (int64_t i = 0; i < i_dim; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t c = 0; c < k_dim; ++c) {
          g += static_cast<double>(x[c]) * static_cast<double>(w.w1.At(i, c));
          u += static_cast<double>(x[c]) * static_cast<double>(w.w3.At(i, c));
        }
        float gf = static_cast<float>(g), uf = static_cast<float>(u);
        if (!w.gate_bias.empty()) gf += w.gate_bias[i];
        if (!w.up_bias.empty()) uf += w.up_bias[i];
        a[i] = apply_activation(act, gf, uf, p);
      }
      // 4. aq = mxfp8_quantize(a), per 32 consecutive elements of I.
      detail::QuantizeDequantizeMxfp8(a.data(), i_dim);
      // 5. y = aq . W2^T.
      for (int64_t n = 0; n < k_dim; ++n) {
        double s = 0.0;
        for (int64_t i = 0; i < i_dim; ++i) s += static_cast<double>(a[i]) * static_cast<double>(w.w2.At(n, i));
        y[n] = static_cast<float>(s);
      }
      // 6. out[t] += topk_weight * y, in fp32, slots in order.
      const float tw = in.topk_weights[t * top_k + j];
      for (int64_t n = 0; n < k_dim; ++n) acc[t * k_dim + n] += tw * y[n];
    }
  }
  detail::StoreOutput(acc, out);
  return Status::Ok();
}

}  // namespace mxmoe
