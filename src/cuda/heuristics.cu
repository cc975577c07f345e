// See heuristics.h.
#include "cuda/heuristics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mxmoe::cuda {

namespace {

bool DebugHeuristics() {
  static const bool on = [] {
    const char* v = std::getenv("MXMOE_DEBUG_HEURISTICS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

}  // namespace

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
  // Measured on the H200 (docs/perf-log.md, v1/v1.1): n32 beats n64 at every prefill size
  // (3 CTAs per SM against 2: the mma.sync path is latency-bound), so n64 is only reachable
  // through MXMOE_GEMM_CONFIG for now.
  if (c.pairs_per_expert <= 12.0) c.gemm = GemmConfigId::kN8;
  else c.gemm = GemmConfigId::kN32;
  // MXMOE_GEMM_CONFIG=n8|n32|n64 forces a config (for measuring them against each other).
  static const char* forced = std::getenv("MXMOE_GEMM_CONFIG");
  if (forced != nullptr) {
    for (int id = 0; id < kNumGemmConfigs; ++id)
      if (std::strcmp(forced, GemmInfo(static_cast<GemmConfigId>(id)).name) == 0) c.gemm = static_cast<GemmConfigId>(id);
  }

  if (DebugHeuristics()) {
    const GemmConfigInfo info = GemmInfo(c.gemm);
    std::fprintf(stderr,
                 "mxmoe heuristics: T=%lld -> %lld chunk(s) of <= %lld tokens; ~%.1f pairs per "
                 "touched expert -> gemm %s (BLOCK_M %d, BLOCK_N %d, %d threads, %d stages, %d B smem)\n",
                 static_cast<long long>(num_tokens), static_cast<long long>(c.num_chunks),
                 static_cast<long long>(c.chunk_tokens), c.pairs_per_expert, info.name, info.block_m,
                 info.block_n, info.threads, info.stages, info.smem_bytes);
  }
  return c;
}

}  // namespace mxmoe::cuda
