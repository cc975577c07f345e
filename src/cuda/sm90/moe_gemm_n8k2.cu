// Instantiation of the fused grouped GEMMs for BLOCK_N = 8 with each stage's two steps split
// between two sets of 4 warps (ConfigN8SplitK: the smallest decode calls).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N8k2, ConfigN8SplitK, "n8k2", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
