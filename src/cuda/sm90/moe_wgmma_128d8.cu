// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 with 3 MMA groups in flight per
// consumer warpgroup and 8 stages (ConfigWg128Deep8; forced only, MXMOE_GEMM_CONFIG=wg128d8).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg128d8, ConfigWg128Deep8, "wg128d8", LaunchWgmmaConfig, PrepareWgmmaConfig, WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
