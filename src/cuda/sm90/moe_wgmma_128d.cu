// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 with 3 MMA groups in flight per
// consumer warpgroup (ConfigWg128Deep; forced only, MXMOE_GEMM_CONFIG=wg128d).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg128d, ConfigWg128Deep, "wg128d", LaunchWgmmaConfig, PrepareWgmmaConfig, WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
