// Instantiation of the fused grouped GEMMs for BLOCK_N = 32 with MMAs only on the tile's valid tokens
// (ConfigN32Adaptive; forced only, MXMOE_GEMM_CONFIG=n32w).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N32w, ConfigN32Adaptive, "n32w", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm90
