// Instantiation of the fused grouped GEMMs for BLOCK_N = 32 held to 128 registers, 4 CTAs per SM
// (ConfigN32Regs; forced only, MXMOE_GEMM_CONFIG=n32r).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N32r, ConfigN32Regs, "n32r", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
