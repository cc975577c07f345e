// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 with four consumer warpgroups of one
// m64 MMA each per k16 step (ConfigWg128Quad).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg128q, ConfigWg128Quad, "wg128q", LaunchWgmmaConfig, PrepareWgmmaConfig, WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
