// Instantiation of the fused grouped GEMMs for BLOCK_N = 32 with two steps per stage
// (ConfigN32TwoSteps; forced only, MXMOE_GEMM_CONFIG=n32s2).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N32s2, ConfigN32TwoSteps, "n32s2", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
