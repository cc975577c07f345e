// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 32 with two CTAs per SM and 3 MMA groups
// in flight per consumer warpgroup (ConfigWg32x2Deep; forced only, MXMOE_GEMM_CONFIG=wg32x2d).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg32x2d, ConfigWg32x2Deep, "wg32x2d", LaunchWgmmaConfig, PrepareWgmmaConfig, WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
