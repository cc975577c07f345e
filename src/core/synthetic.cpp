// Synthetic layers and inputs from a fixed seed (see synthetic.h).
#include "mxmoe/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "mxmoe/formats.h"
#include "core/parallel.h"
#include "mxmoe/layouts.h"

namespace mxmoe {

namespace {

// splitmix64: a small, fast generator whose streams are cheap to derive from (seed, ids).
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t s) : state(s) {}
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  int64_t Below(int64_t n) { return static_cast<int64_t>(Uniform() * static_cast<double>(n)); }
  double Normal() {
    const double u1 = std::max(Uniform(), 1e-300), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

uint64_t StreamSeed(uint64_t seed, uint64_t a, uint64_t b) {
  Rng r(seed ^ (a * 0xD1B54A32D192ED03ull) ^ (b * 0xABC98388FB8FAC03ull));
  r.Next();
  return r.Next();
}

// E2M1 codes uniform over all 16 values have RMS 2.93; 2^center * 2.93 * sqrt(n) ~ 1.
int ScaleCenter(int64_t reduction) {
  return static_cast<int>(std::lround(-std::log2(2.93 * std::sqrt(static_cast<double>(reduction)))));
}

Mxfp4Matrix RandomMatrix(int64_t rows, int64_t cols, int jitter, Rng& rng) {
  Mxfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(rows * cols / 2);
  m.scales.resize(rows * cols / kMxBlock);
  for (size_t i = 0; i < m.packed.size(); i += 8) {
    const uint64_t v = rng.Next();
    for (size_t b = 0; b < 8 && i + b < m.packed.size(); ++b) m.packed[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  const int center = ScaleCenter(cols);
  for (uint8_t& s : m.scales) s = static_cast<uint8_t>(127 + center - jitter + rng.Below(2 * jitter + 1));
  return m;
}

}  // namespace

Status MakeSyntheticExperts(const LayerShape& shape, const ActivationSpec& activation,
                            const ParallelSlice& slice, const SyntheticOptions& options,
                            ExpertSet* out) {
  MXMOE_RETURN_IF_ERROR(shape.Validate());
  MXMOE_RETURN_IF_ERROR(slice.Validate(shape));
  ExpertSet r;
  r.shape = shape;
  r.slice = slice;
  r.activation = activation;
  const int64_t n = slice.NumLocalExperts(shape);
  const int64_t e0 = slice.FirstExpert(shape);
  const int64_t il = slice.LocalIntermediate(shape);
  const int64_t i0 = slice.FirstIntermediateRow(shape);
  const int64_t k = shape.hidden, i_full = shape.intermediate;
  if (!activation.per_expert.empty() && static_cast<int64_t>(activation.per_expert.size()) == shape.num_experts) {
    // Per-expert parameters given for the whole layer: keep this rank's.
    r.activation.per_expert.assign(activation.per_expert.begin() + e0, activation.per_expert.begin() + e0 + n);
  }
  r.experts.resize(n);
  const int jitter = std::max(0, options.scale_exp_jitter);
  ParallelFor(n, options.num_threads, [&](int64_t i) {
    const uint64_t e = static_cast<uint64_t>(e0 + i);
    Rng r1(StreamSeed(options.seed, e, 1)), r3(StreamSeed(options.seed, e, 3)),
        r2(StreamSeed(options.seed, e, 2)), rb(StreamSeed(options.seed, e, 4));
    ExpertWeights& w = r.experts[i];
    w.w1 = RandomMatrix(i_full, k, jitter, r1);
    w.w3 = RandomMatrix(i_full, k, jitter, r3);
    w.w2 = RandomMatrix(k, i_full, jitter, r2);
    if (il != i_full) {
      w.w1 = SliceRows(w.w1, i0, il);
      w.w3 = SliceRows(w.w3, i0, il);
      w.w2 = SliceCols(w.w2, i0, il);
    }
    if (options.with_bias) {
      std::vector<float> gb(i_full), ub(i_full);
      for (auto& b : gb) b = static_cast<float>(0.5 * rb.Normal());
      for (auto& b : ub) b = static_cast<float>(0.5 * rb.Normal());
      w.gate_bias.assign(gb.begin() + i0, gb.begin() + i0 + il);
      w.up_bias.assign(ub.begin() + i0, ub.begin() + i0 + il);
    }
  });
  MXMOE_RETURN_IF_ERROR(r.Validate());
  *out = std::move(r);
  return Status::Ok();
}

const char* RoutingPatternName(RoutingPattern p) {
  switch (p) {
    case RoutingPattern::kUniform: return "uniform";
    case RoutingPattern::kOneExpert: return "one_expert";
    case RoutingPattern::kFewExperts: return "few_experts";
    case RoutingPattern::kWithInvalid: return "with_invalid";
    case RoutingPattern::kHeavyHitters: return "heavy_hitters";
  }
  return "invalid";
}

Status RoutingPatternFromName(const std::string& name, RoutingPattern* out) {
  for (RoutingPattern p : {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kFewExperts,
                           RoutingPattern::kWithInvalid, RoutingPattern::kHeavyHitters}) {
    if (name == RoutingPatternName(p)) {
      *out = p;
      return Status::Ok();
    }
  }
  return Status::Invalid("routing pattern '" + name +
                         "': expected uniform, one_expert, few_experts, with_invalid or heavy_hitters");
}

namespace {

// n distinct values from pool (n <= pool.size()), by a partial Fisher-Yates shuffle of a copy.
void PickDistinct(std::vector<int32_t> pool, int64_t n, Rng& rng, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = i + rng.Below(static_cast<int64_t>(pool.size()) - i);
    std::swap(pool[i], pool[j]);
    out[i] = pool[i];
  }
}

}  // namespace

void MakeSyntheticInput(const LayerShape& shape, int64_t num_tokens, RoutingPattern pattern,
                        uint64_t seed, SyntheticInput* out) {
  const int64_t t_count = num_tokens, k = shape.top_k, e = shape.num_experts;
  out->num_tokens = t_count;
  out->x_bf16.resize(t_count * shape.hidden);
  out->topk_ids.assign(t_count * k, -1);
  out->topk_weights.resize(t_count * k);
  Rng rx(StreamSeed(seed, 0xA11, 0)), rr(StreamSeed(seed, 0xA12, 0));
  for (auto& v : out->x_bf16) v = float_to_bf16(static_cast<float>(rx.Normal()));

  std::vector<int32_t> all(e);
  for (int64_t i = 0; i < e; ++i) all[i] = static_cast<int32_t>(i);
  const int64_t few = std::min<int64_t>(e, k + 2);
  std::vector<int32_t> few_pool;  // a handful of experts starting at a seed-chosen one
  const int64_t start = static_cast<int64_t>(seed % static_cast<uint64_t>(e));
  for (int64_t i = 0; i < few; ++i) few_pool.push_back(static_cast<int32_t>((start + i) % e));
  const int64_t hot_picks = std::max<int64_t>(1, k / 2);
  const int64_t hot = std::min<int64_t>(e, hot_picks + 2);
  std::vector<int32_t> hot_pool(few_pool.begin(), few_pool.begin() + std::min(hot, few));
  while (static_cast<int64_t>(hot_pool.size()) < hot) hot_pool.push_back(static_cast<int32_t>(hot_pool.size()));
  std::vector<int32_t> cold_pool;
  for (int32_t id : all)
    if (std::find(hot_pool.begin(), hot_pool.end(), id) == hot_pool.end()) cold_pool.push_back(id);

  for (int64_t t = 0; t < t_count; ++t) {
    int32_t* ids = out->topk_ids.data() + t * k;
    switch (pattern) {
      case RoutingPattern::kUniform:
      case RoutingPattern::kWithInvalid:
        PickDistinct(all, k, rr, ids);
        if (pattern == RoutingPattern::kWithInvalid)
          for (int64_t j = 0; j < k; ++j)
            if (rr.Below(4) == 0) ids[j] = -1;
        break;
      case RoutingPattern::kOneExpert:
        ids[0] = static_cast<int32_t>(start);
        break;
      case RoutingPattern::kFewExperts:
        PickDistinct(few_pool, k, rr, ids);
        break;
      case RoutingPattern::kHeavyHitters: {
        const int64_t h = std::min<int64_t>(hot_picks, static_cast<int64_t>(hot_pool.size()));
        PickDistinct(hot_pool, h, rr, ids);
        const int64_t rest = std::min<int64_t>(k - h, static_cast<int64_t>(cold_pool.size()));
        PickDistinct(cold_pool, rest, rr, ids + h);
        break;
      }
    }
    // Positive weights summing to 1 over the valid slots; -1 slots get garbage that must be ignored.
    float* w = out->topk_weights.data() + t * k;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = static_cast<float>(0.05 + rr.Uniform());
      if (ids[j] >= 0) sum += w[j];
    }
    for (int64_t j = 0; j < k; ++j) w[j] = ids[j] >= 0 ? static_cast<float>(w[j] / sum) : 7.0f;
  }
}

}  // namespace mxmoe
