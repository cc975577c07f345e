// Instantiation of the fused grouped GEMMs for BLOCK_N = 8 with each tile's reduction split
// between the four CTAs of a cluster (ConfigN8Cluster4: decode calls with very few tiles).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N8c4, ConfigN8Cluster4, "n8c4", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
