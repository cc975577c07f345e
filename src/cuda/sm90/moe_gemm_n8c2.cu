// Instantiation of the fused grouped GEMMs for BLOCK_N = 8 with each tile's reduction split
// between the two CTAs of a cluster (ConfigN8Cluster2: decode calls with few tiles).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N8c2, ConfigN8Cluster2, "n8c2", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
