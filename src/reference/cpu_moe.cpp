// The CPU backend: ReferenceMoe's arithmetic, step for step and in the same summation order, so
// the output is bitwise the reference's; it dequantizes each touched expert once, groups the
// (token, slot) pairs by expert, and spreads (expert, row block) work items over threads.
#include <algorithm>
#include <atomic>
#include <thread>

#include "core/activation_math.h"
#include "core/parallel.h"
#include "mxmoe/formats.h"
#include "mxmoe/moe.h"
#include "reference/quantized_input.h"

namespace mxmoe {

namespace {

constexpr int64_t kRowBlock = 128;  // rows per work item; a multiple of 32 keeps MX blocks whole
constexpr int kRowTile = 4;         // independent accumulation chains per inner loop


// Rows [r0, r1) of m, dequantized to fp32: the same products as Mxfp4Matrix::At, through a
// 16-entry table per block.
void DequantRows(const Mxfp4Matrix& m, int64_t r0, int64_t r1, float* dst) {
  const int64_t packed_per_row = m.cols / 2, blocks = m.cols / kMxBlock;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* packed = m.packed.data() + r * packed_per_row;
    const uint8_t* scales = m.scales.data() + r * blocks;
    float* d = dst + (r - r0) * m.cols;
    for (int64_t b = 0; b < blocks; ++b) {
      const float scale = ue8m0_to_float(scales[b]);
      float table[16];
      for (int c = 0; c < 16; ++c) table[c] = e2m1_to_float(static_cast<uint8_t>(c)) * scale;
      for (int i = 0; i < kMxBlock / 2; ++i) {
        const uint8_t byte = packed[b * (kMxBlock / 2) + i];
        d[b * kMxBlock + 2 * i] = table[byte & 0xF];
        d[b * kMxBlock + 2 * i + 1] = table[byte >> 4];
      }
    }
  }
}

// out[r] = double sum over c in order of x[c] * w[r][c], for rows [0, rows), kRowTile at a time.
void DotRows(const float* w, int64_t rows, int64_t cols, const float* x, double* out) {
  int64_t r = 0;
  for (; r + kRowTile <= rows; r += kRowTile) {
    double s[kRowTile] = {};
    for (int64_t c = 0; c < cols; ++c)
      for (int q = 0; q < kRowTile; ++q)
        s[q] += static_cast<double>(x[c]) * static_cast<double>(w[(r + q) * cols + c]);
    for (int q = 0; q < kRowTile; ++q) out[r + q] = s[q];
  }
  for (; r < rows; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(x[c]) * static_cast<double>(w[r * cols + c]);
    out[r] = s;
  }
}

}  // namespace

Status CpuMoe(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out, int num_threads) {
  MXMOE_RETURN_IF_ERROR(experts.Validate());
  MXMOE_RETURN_IF_ERROR(ValidateMoeCall(experts, in, out, /*check_ids=*/true));
  const int64_t t_count = in.num_tokens, k_dim = experts.shape.hidden;
  const int64_t i_dim = experts.LocalIntermediate(), top_k = experts.shape.top_k;
  const int64_t n_local = experts.NumLocalExperts();
  const ActivationType act = experts.activation.type;
  if (t_count == 0) return Status::Ok();
  const int threads = num_threads > 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());

  const std::vector<float> xd = detail::DequantizedInput(in, k_dim);

  // Pairs grouped by local expert, in (token, slot) order within each expert.
  std::vector<std::vector<int64_t>> pairs(n_local);
  for (int64_t p = 0; p < t_count * top_k; ++p) {
    int64_t e;
    if (detail::LocalExpert(experts, in.topk_ids[p], &e)) pairs[e].push_back(p);
  }
  std::vector<int64_t> offset(n_local + 1, 0);
  for (int64_t e = 0; e < n_local; ++e) offset[e + 1] = offset[e] + static_cast<int64_t>(pairs[e].size());
  const int64_t n_pairs = offset[n_local];

  struct Item {
    int64_t expert, row0, row1;
  };
  auto items_for = [&](int64_t rows) {
    std::vector<Item> items;
    for (int64_t e = 0; e < n_local; ++e)
      if (!pairs[e].empty())
        for (int64_t r = 0; r < rows; r += kRowBlock) items.push_back({e, r, std::min(rows, r + kRowBlock)});
    return items;
  };

  // FC1, activation and MXFP8 round trip: a[pair, I] (dequantized aq).
  std::vector<float> a(n_pairs * i_dim);
  const std::vector<Item> fc1 = items_for(i_dim);
  ParallelFor(static_cast<int64_t>(fc1.size()), threads, [&](int64_t idx) {
    const Item& it = fc1[idx];
    const ExpertWeights& w = experts.experts[it.expert];
    const ActParams& prm = experts.activation.ForExpert(it.expert);
    const int64_t rows = it.row1 - it.row0;
    std::vector<float> w1(rows * k_dim), w3(rows * k_dim);
    DequantRows(w.w1, it.row0, it.row1, w1.data());
    DequantRows(w.w3, it.row0, it.row1, w3.data());
    std::vector<double> g(rows), u(rows);
    for (int64_t q = 0; q < static_cast<int64_t>(pairs[it.expert].size()); ++q) {
      const int64_t p = pairs[it.expert][q];
      const float* x = xd.data() + (p / top_k) * k_dim;
      DotRows(w1.data(), rows, k_dim, x, g.data());
      DotRows(w3.data(), rows, k_dim, x, u.data());
      float* dst = a.data() + (offset[it.expert] + q) * i_dim + it.row0;
      for (int64_t r = 0; r < rows; ++r) {
        float gf = static_cast<float>(g[r]), uf = static_cast<float>(u[r]);
        if (!w.gate_bias.empty()) gf += w.gate_bias[it.row0 + r];
        if (!w.up_bias.empty()) uf += w.up_bias[it.row0 + r];
        dst[r] = apply_activation(act, gf, uf, prm);
      }
      detail::QuantizeDequantizeMxfp8(dst, rows);
    }
  });

  // FC2: y[pair, K].
  std::vector<float> y(n_pairs * k_dim);
  const std::vector<Item> fc2 = items_for(k_dim);
  ParallelFor(static_cast<int64_t>(fc2.size()), threads, [&](int64_t idx) {
    const Item& it = fc2[idx];
    const int64_t rows = it.row1 - it.row0;
    std::vector<float> w2(rows * i_dim);
    DequantRows(experts.experts[it.expert].w2, it.row0, it.row1, w2.data());
    std::vector<double> s(rows);
    for (int64_t q = 0; q < static_cast<int64_t>(pairs[it.expert].size()); ++q) {
      const int64_t row = offset[it.expert] + q;
      DotRows(w2.data(), rows, i_dim, a.data() + row * i_dim, s.data());
      for (int64_t r = 0; r < rows; ++r) y[row * k_dim + it.row0 + r] = static_cast<float>(s[r]);
    }
  });

  // Combine in token order, slots in order, as the reference does.
  std::vector<int64_t> row_of(t_count * top_k, -1);
  for (int64_t e = 0; e < n_local; ++e)
    for (size_t q = 0; q < pairs[e].size(); ++q) row_of[pairs[e][q]] = offset[e] + static_cast<int64_t>(q);
  std::vector<float> acc(t_count * k_dim, 0.0f);
  ParallelFor(t_count, threads, [&](int64_t t) {
    float* o = acc.data() + t * k_dim;
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t row = row_of[t * top_k + j];
      if (row < 0) continue;
      const float tw = in.topk_weights[t * top_k + j];
      for (int64_t n = 0; n < k_dim; ++n) o[n] += tw * y[row * k_dim + n];
    }
  });
  detail::StoreOutput(acc, out);
  return Status::Ok();
}

}  // namespace mxmoe
