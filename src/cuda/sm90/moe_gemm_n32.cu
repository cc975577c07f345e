// Instantiation of the fused grouped GEMMs for BLOCK_N = 32 (one config per translation unit).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N32, ConfigN32, "n32", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
