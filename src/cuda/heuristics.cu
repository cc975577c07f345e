// See heuristics.h.
#include "cuda/heuristics.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/decode_plan.h"
#include "cuda/launch_util.cuh"

namespace mxmoe::cuda {

namespace {

bool DebugHeuristics() {
  static const bool on = EnvFlagIs("MXMOE_DEBUG_HEURISTICS", "1");
  return on;
}

// The config named by the `len` characters at `name` (-1 for none).
int ConfigNamed(const char* name, size_t len) {
  for (int id = 0; id < kNumGemmConfigs; ++id) {
    const char* n = GemmInfo(static_cast<GemmConfigId>(id)).name;
    if (std::strlen(n) == len && std::strncmp(name, n, len) == 0) return id;
  }
  return -1;
}

// The forced configs (-1: none; FC2's -1 is FC1's). MXMOE_GEMM_CONFIG=<a config's GemmInfo name>
// forces one (for measuring configs against each other), <FC1's>/<FC2's> one for each GEMM.
struct ForcedConfigs {
  std::atomic<int> fc1{-1}, fc2{-1};
  ForcedConfigs() {
    const char* v = std::getenv("MXMOE_GEMM_CONFIG");
    if (v == nullptr) return;
    const char* slash = std::strchr(v, '/');
    const size_t fc1_len = slash != nullptr ? static_cast<size_t>(slash - v) : std::strlen(v);
    fc1 = ConfigNamed(v, fc1_len);
    if (slash != nullptr) fc2 = ConfigNamed(slash + 1, std::strlen(slash + 1));
    // (An empty FC1 name is the heuristics' FC1 on purpose; anything else unknown is said once.)
    if ((fc1_len > 0 && fc1 < 0) || (slash != nullptr && fc2 < 0))
      std::fprintf(stderr, "mxmoe: MXMOE_GEMM_CONFIG=%s names no config (FC1 or FC2 part ignored)\n", v);
  }
};
ForcedConfigs& Forced() {
  static ForcedConfigs forced;
  return forced;
}

}  // namespace

void ForceGemmConfig(int config, int fc2_config) {
  Forced().fc1.store(config, std::memory_order_relaxed);
  Forced().fc2.store(fc2_config, std::memory_order_relaxed);
}

LaunchChoice ChooseLaunch(const LayerDims& dims, int64_t num_tokens, int64_t max_chunk) {
  LaunchChoice c;
  max_chunk = std::max<int64_t>(1, max_chunk);
  c.num_chunks = std::max<int64_t>(1, (num_tokens + max_chunk - 1) / max_chunk);
  c.chunk_tokens = (num_tokens + c.num_chunks - 1) / c.num_chunks;

  // Expected pairs per touched local expert under uniform routing: the chunk's pairs that land
  // on this rank, over the experts they touch. Each expert's tile pads its pair count up to
  // BLOCK_N, so small counts want a narrow tile (weights streamed once, few idle MMA columns) and
  // large counts a wide one (weights reused from shared memory by more tokens).
  const double pairs = static_cast<double>(c.chunk_tokens * dims.top_k) *
                       static_cast<double>(dims.num_local) / static_cast<double>(dims.num_experts);
  const double local = static_cast<double>(dims.num_local);
  const double touched = std::max(1.0, local * (1.0 - std::exp(-pairs / local)));
  c.pairs_per_expert = pairs / touched;
  // One config for both GEMMs (docs/perf-log.md, v6 and v6.1). Decode (a few pairs per expert)
  // streams the weights once: the narrow mma.sync tile, whose CTAs (several per SM) keep more loads
  // in flight than the one-CTA-per-SM wgmma kernels at the same width (wg8 / wg32 ran at 40-65% of
  // the read roofline at T = 1..128, n8 at 52-80% at T = 1 and 8; both removed since; wg32x2d, two
  // CTAs per SM, did not beat n32 across the shapes either: v13.1, and 1-5% behind it again in v31,
  // H100). From 32 pairs per expert
  // the 128-token wgmma tile, whose MMAs shrink to the tile's tokens; between, n32. Measured: T =
  // 1024 (18 pairs per expert) n32 6.77 ms, wg128 8.73 ms; T = 2048 (37) wg128 9.25 ms, n32 11.89 ms.
  // Of the 128-token tiles, wg128d8 (three MMA groups in flight, 8 stages) was the fastest at T =
  // 2048, 4096 and 16384 (perf-log v10: 8.36 / 10.41 / 36.55 ms against wg128's 8.51 / 10.80 /
  // 38.26). wg128d3x3, the same ring as 3 stages of three steps (fewer bulk copies per step), beat
  // wg128d8 in turn (perf-log v14; layer µs, rows in the order wg128d8 / wg128d4x2 and
  // wg128d4x2 / wg128d3x3 in two device calls: T = 2048 8216-8322 / 7840-7857 and 8087-8105 /
  // 7923-7953, T = 4096 10162-10236 / 9960-10037 and 10193-10218 / 10130-10144, T = 16384
  // 35535-35596 / 35522-35542 and 36190-36194 / 35791-35902). n64, wg64, wg128, wg128d, wg128d8
  // and wg128d4x2 are reachable only through MXMOE_GEMM_CONFIG.
  // Calls whose tiles give the SMs only a few CTAs each: n8c2, whose clusters of two CTAs split
  // each tile's reduction, so the weights stream through twice the CTAs (perf-log v12). Measured
  // (layer µs, n8c2 / n8k2 / n8, uniform; FC1 / FC2 CTAs of n8 by the estimate below):
  // GPT-OSS-120B T = 1 (~91 / 47) 57.5 / 65.8 / 73.5, T = 2 (~178 / 93) 67.5 / 79.4 / 81.5, T = 4
  // (~346 / 180) 97.6 / 109.2 / 103.6; DeepSeek-V3 T = 1 (~126 / 221) 92.0 / 98.0 / 110.5, T = 2
  // (~248 / 434) 138.8 / 154.5 / 148.3; Kimi-K3 T = 1 (~381 / 222) 118.9 / 124.9 / 119.3. Against
  // the thresholds: n8 won DeepSeek-V3 T = 4 (~481 / 842; 253.0 against 238.4), GPT-OSS-120B T = 8
  // (~651 / 340; 158.3 against 153.6) and Kimi-K3 T = 8 and 16 (597.4 / 583.4, 1072.9 / 1056.9),
  // but n8c2 won rows the thresholds give to n8: DeepSeek-V3 T = 8 by 4% (415.2 / 432.5), Kimi-K3
  // T = 2 and 4 and DeepSeek-V3 and GPT-OSS-120B T = 16 by 1-2%. So the CTA counts do not separate
  // the two cleanly; the thresholds take in every row n8c2 won by 6% or more (and Kimi-K3 T = 1, a
  // tie). n8c2 beat n8k2 (v10.1) on every row, so n8k2 is forced-only now. Both GEMMs run the
  // config, so both counts are bounded: tensor-parallel slices shrink FC1's rows but not FC2's.
  // n8 and n32 meet at ~6 pairs per expert (perf-log v13.1): above that, more and more experts
  // get more than 8 pairs, and n8 streams their weights once per 8 of them. Layer µs, n8 / n32,
  // graph replay, uniform, mean of two rounds: Kimi-K3 T = 256 (4.6 pairs) 4227.6 / 4354.3, T = 384
  // (6.9) 5065.8 / 4648.6, T = 512 (9.1) 6177.1 / 4936.4; GPT-OSS-120B T = 128 (4.0) 459.5 / 493.6,
  // T = 192 (6.0) 516.7 / 517.3, T = 256 (8.0) 618.5 / 547.7; DeepSeek-V3 T = 128 (4.0) 1501.2 /
  // 1579.6, T = 192 (6.0) 1795.4 / 1737.5. (Up to v13 the bound was 12 pairs, which cost Kimi-K3
  // T = 512 25%.) Calls with few CTAs between 6 and 12 pairs per expert were not measured apart;
  // they go to n32 with the rest, for the same reason.
  // The fewest tiles of all: n8c4, clusters of four (perf-log v13.2). Layer µs, n8c4 / n8c2 / n8,
  // graph replay, two rounds: GPT-OSS-120B T = 1 (~91 / 47 n8 CTAs) 46.5-46.7 / 50.8-50.9 / 65.9;
  // it lost where n8c2's bounds hold with more tiles: GPT-OSS-120B T = 2 (~178 / 93) 66.4-66.7 /
  // 60.9-61.0, DeepSeek-V3 T = 1 (~126 / 221) 90.7-91.2 / 83.1-83.5, Kimi-K3 T = 1 125.5-126.3 /
  // 107.9-108.1.
  constexpr double kNarrowMaxPairs = 6.0;
  // (FC2's bound was 480 until perf-log v35: DeepSeek-V3 T = 2, ~248 / 434, then ran n8c2, and n8f
  // was 1.4-3.1% faster there in five rows of three calls, v24 and v35, H100. No other measured row
  // has between 400 and 480 FC2 CTAs.)
  constexpr double kClusterMaxFc1Ctas = 400.0, kClusterMaxFc2Ctas = 400.0;
  constexpr double kCluster4MaxCtas = 120.0;
  const double fc1_ctas = touched * std::ceil(static_cast<double>(2 * dims.inter) / 256.0);
  const double fc2_ctas = touched * std::ceil(static_cast<double>(dims.hidden) / 256.0);
  const bool few_ctas = fc1_ctas <= kClusterMaxFc1Ctas && fc2_ctas <= kClusterMaxFc2Ctas;
  const bool fewest_ctas = fc1_ctas <= kCluster4MaxCtas && fc2_ctas <= kCluster4MaxCtas;
  if (c.pairs_per_expert < kNarrowMaxPairs)
    c.gemm = fewest_ctas ? GemmConfigId::kN8c4 : few_ctas ? GemmConfigId::kN8c2 : GemmConfigId::kN8;
  else if (c.pairs_per_expert < 32.0) c.gemm = GemmConfigId::kN32;
  else c.gemm = GemmConfigId::kWg128d3x3;
  // Where n8 would run, a chunk of at most kDecodeMaxPairs pairs runs n8f instead: both GEMMs and
  // the combine in one persistent kernel (perf-log v21, v24; every rank's share of such a chunk
  // fuses). Layer µs, eager, n8's two kernels then n8f (128 / 2 parts, combine folded in), uniform,
  // H100, perf-log v24: Kimi-K3 T = 2 221.5 / 224.4, T = 4 421.6 / 404.4, T = 8 739.3 / 738.3, T = 16
  // 1383.9 / 1332.7; GPT-OSS-120B T = 8 165.5 / 163.0, T = 16 293.4 / 258.7, T = 32 433.2 / 410.9;
  // DeepSeek-V3 T = 4 274.0 / 272.4, T = 8 550.2 / 497.0, T = 16 854.1 / 823.3, T = 32 1336.3 /
  // 1327.9; GPT-OSS-120B T = 64 (a later call) 569.9 / 551.0. It lost where the clusters run: n8c2's
  // Kimi-K3 and DeepSeek-V3 T = 1 (by 0.4% and 7.5%) and GPT-OSS-120B T = 2 (5.7%), which keep their
  // configs. (v35, H100: n8f still lost Kimi-K3 T = 1 by 5%, DeepSeek-V3 T = 1 by 17-20% and
  // GPT-OSS-120B T = 1 and 2 by 5-6% and 13-14%.) DeepSeek-V3 T = 2 runs n8f since v35 (FC2's bound
  // above).
  if (c.gemm == GemmConfigId::kN8 && c.chunk_tokens * dims.top_k <= kDecodeMaxPairs) c.gemm = GemmConfigId::kN8f;
  const int forced = Forced().fc1.load(std::memory_order_relaxed);
  if (forced >= 0 && forced < kNumGemmConfigs) c.gemm = static_cast<GemmConfigId>(forced);
  c.gemm_fc2 = c.gemm;
  const int forced_fc2 = Forced().fc2.load(std::memory_order_relaxed);
  if (forced_fc2 >= 0 && forced_fc2 < kNumGemmConfigs &&
      GemmInfo(static_cast<GemmConfigId>(forced_fc2)).block_n == GemmInfo(c.gemm).block_n)
    c.gemm_fc2 = static_cast<GemmConfigId>(forced_fc2);

  if (DebugHeuristics()) {
    const GemmConfigInfo info = GemmInfo(c.gemm);
    std::fprintf(stderr,
                 "mxmoe heuristics: T=%lld -> %lld chunk(s) of <= %lld tokens; ~%.1f pairs per "
                 "touched expert -> %s (BLOCK_M %d, BLOCK_N %d, %d threads, %d stages, %d B smem)%s%s\n",
                 static_cast<long long>(num_tokens), static_cast<long long>(c.num_chunks),
                 static_cast<long long>(c.chunk_tokens), c.pairs_per_expert, info.name, info.block_m,
                 info.block_n, info.threads, info.stages, info.smem_bytes, c.gemm_fc2 != c.gemm ? ", FC2 " : "",
                 c.gemm_fc2 != c.gemm ? GemmInfo(c.gemm_fc2).name : "");
  }
  return c;
}

}  // namespace mxmoe::cuda
