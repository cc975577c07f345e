// The one place that chooses how a call runs: token chunking (bounds the workspace) and the GEMM
// config per chunk. MXMOE_DEBUG_HEURISTICS=1 prints every choice to stderr.
#pragma once

#include <cstdint>

#include "cuda/moe_kernels.h"

namespace mxmoe::cuda {

struct LayerDims {
  int64_t hidden = 0;       // K
  int64_t inter = 0;        // I_local
  int64_t top_k = 0;
  int64_t num_experts = 0;  // E (global)
  int64_t num_local = 0;
};

struct LaunchChoice {
  int64_t chunk_tokens = 0;  // tokens per chunk (the last may be shorter)
  int64_t num_chunks = 0;
  GemmConfigId gemm = GemmConfigId::kN8;  // FC1's config, and FC2's unless gemm_fc2 says otherwise
  GemmConfigId gemm_fc2 = GemmConfigId::kN8;  // FC2's: gemm, or a forced one with gemm's BLOCK_N
  double pairs_per_expert = 0;  // the estimate behind the configs
};

// Balanced chunks of at most max_chunk tokens, and the GEMM config for their size.
LaunchChoice ChooseLaunch(const LayerDims& dims, int64_t num_tokens, int64_t max_chunk);

// Makes every later ChooseLaunch pick `config` (-1: back to the heuristics), for the tests and the
// benchmark that compare configs, and for FC2 `fc2_config` instead (-1: the same as FC1), which is
// taken only where its BLOCK_N is FC1's (the two GEMMs share the routing's tiles). Process-wide;
// MXMOE_GEMM_CONFIG=<name> or <FC1 name>/<FC2 name> sets them at start (an empty FC1 name: the
// heuristics' FC1, with the FC2 given).
void ForceGemmConfig(int config, int fc2_config = -1);

}  // namespace mxmoe::cuda
