// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 with half a row block per CTA and two
// CTAs per SM (ConfigWg128Half).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg128h, ConfigWg128Half, "wg128h", LaunchWgmmaConfig, PrepareWgmmaConfig, WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
