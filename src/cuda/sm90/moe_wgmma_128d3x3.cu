// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 with 3 MMA groups in flight and 3
// stages of three reduction steps each (ConfigWg128Deep3x3): the heuristics' config from 32 pairs
// per expert.
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(Wg128d3x3, ConfigWg128Deep3x3, "wg128d3x3", LaunchWgmmaConfig, PrepareWgmmaConfig,
                         WgmmaInfoOf)

}  // namespace mxmoe::cuda::sm90
