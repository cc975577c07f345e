// GemmConfigId -> the SM120 instantiation that serves it (their configs live in moe_gemm_sm120.cuh),
// and the choice between them.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/launch_util.cuh"
#include "cuda/sm120/sm120_kernels.h"

namespace mxmoe::cuda::sm120 {

#define MXMOE_DECLARE_CONFIG(M)                                                                \
  cudaError_t LaunchGemmM##M(bool fc1, const GemmParams& p, int64_t grid, cudaStream_t stream); \
  cudaError_t PrepareGemmM##M();                                                               \
  GemmConfigInfo InfoM##M();
MXMOE_DECLARE_CONFIG(16)
MXMOE_DECLARE_CONFIG(64)
#undef MXMOE_DECLARE_CONFIG

GemmConfigInfo GemmInfo(GemmConfigId id) {
  switch (id) {
    case GemmConfigId::kM16: return InfoM16();
    case GemmConfigId::kM64: return InfoM64();
  }
  return InfoM16();
}

cudaError_t PrepareGemmKernels() {
  cudaError_t e = PrepareGemmM16();
  if (e == cudaSuccess) e = PrepareGemmM64();
  return e;
}

cudaError_t LaunchGemm(GemmConfigId id, bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  switch (id) {
    case GemmConfigId::kM16: return LaunchGemmM16(fc1, p, grid_ctas, stream);
    case GemmConfigId::kM64: return LaunchGemmM64(fc1, p, grid_ctas, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {

// -1: ChooseGemmConfig decides; else the forced config. Starts from MXMOE_SM120_CONFIG.
std::atomic<int>& ForcedConfig() {
  static std::atomic<int> forced([] {
    const char* v = std::getenv("MXMOE_SM120_CONFIG");
    if (v == nullptr) return -1;
    for (int i = 0; i < kNumGemmConfigs; ++i)
      if (std::strcmp(v, GemmInfo(static_cast<GemmConfigId>(i)).name) == 0) return i;
    std::fprintf(stderr, "mxmoe: MXMOE_SM120_CONFIG=%s names no SM120 config (m16, m64); ignored\n", v);
    return -1;
  }());
  return forced;
}

}  // namespace

void ForceGemmConfig(int config) { ForcedConfig().store(config >= 0 && config < kNumGemmConfigs ? config : -1); }

GemmConfigId ChooseGemmConfig(double pairs_per_expert) {
  // Up to 16 pairs per expert one m16 tile holds a whole segment and the weights stream once; past
  // that, m64 keeps streaming each weight tile once for up to 64 pairs and, at prefill sizes,
  // reuses each B tile from shared memory for 64 tokens (docs/sm120.md, performance model).
  GemmConfigId id = pairs_per_expert <= 16.0 ? GemmConfigId::kM16 : GemmConfigId::kM64;
  const int forced = ForcedConfig().load();
  if (forced >= 0) id = static_cast<GemmConfigId>(forced);
  static const bool debug = EnvFlagIs("MXMOE_DEBUG_HEURISTICS", "1");
  if (debug) {
    const GemmConfigInfo info = GemmInfo(id);
    std::fprintf(stderr,
                 "mxmoe heuristics (sm120): ~%.1f pairs per touched expert -> gemm %s (BLOCK_M %d tokens, "
                 "BLOCK_N %d weight rows, %d threads, %d stages, %d B smem, %d CTA/SM)%s\n",
                 pairs_per_expert, info.name, info.block_m, info.block_n, info.threads, info.stages,
                 info.smem_bytes, info.min_blocks, forced >= 0 ? " [forced]" : "");
  }
  return id;
}

bool EmulationBuilt() {
#if defined(MXMOE_SM120_EMULATION)
  return true;
#else
  return false;
#endif
}

}  // namespace mxmoe::cuda::sm120
