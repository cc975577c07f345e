// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 64 (one config per translation unit).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg64, ConfigWg64, "wg64", LaunchWgmmaConfig, PrepareWgmmaConfig, WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
