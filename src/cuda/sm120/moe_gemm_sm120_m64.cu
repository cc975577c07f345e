// Instantiation of the SM120 grouped GEMMs for BLOCK_M = 64 tokens (one config per translation unit).
#include "cuda/sm120/moe_gemm_sm120.cuh"

namespace mxmoe::cuda::sm120 {

cudaError_t LaunchGemmM64(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchGemmConfig<ConfigM64>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmM64() { return PrepareGemmConfig<ConfigM64>(); }
GemmConfigInfo InfoM64() { return InfoOf<ConfigM64>("m64"); }

}  // namespace mxmoe::cuda::sm120
