// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 with 3 MMA groups in flight and 4
// stages of two reduction steps each (ConfigWg128Deep4x2, MXMOE_GEMM_CONFIG=wg128d4x2).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg128d4x2, ConfigWg128Deep4x2, "wg128d4x2", LaunchWgmmaConfig, PrepareWgmmaConfig,
                         WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
