// Instantiation of the fused grouped GEMMs for BLOCK_N = 8 with each tile's reduction split
// between the two CTAs of a cluster and 5 stages (ConfigN8Cluster2Deep: FC2 of decode calls whose
// CTAs leave an SM's slots half empty).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N8c2d, ConfigN8Cluster2Deep, "n8c2d", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
