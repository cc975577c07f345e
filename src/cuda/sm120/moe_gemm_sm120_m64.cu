// Instantiation of the SM120 grouped GEMMs for BLOCK_M = 64 tokens (one config per translation unit).
#include "cuda/sm120/moe_gemm_sm120.cuh"

namespace mxmoe::cuda::sm120 {

MXMOE_DEFINE_GEMM_CONFIG(M64, ConfigM64, "m64", LaunchGemmConfig, PrepareGemmConfig, InfoOf)

}  // namespace mxmoe::cuda::sm120
