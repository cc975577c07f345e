// Instantiation of the fused grouped GEMMs for BLOCK_N = 32 fed by the copy engine (one config per
// translation unit).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

MXMOE_DEFINE_GEMM_CONFIG(N32t, ConfigN32Tma, "n32t", LaunchTmaGemmConfig, PrepareTmaGemmConfig, TmaInfoOf)

}  // namespace mxmoe::cuda::sm90
