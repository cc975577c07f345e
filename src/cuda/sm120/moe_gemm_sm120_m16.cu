// Instantiation of the SM120 grouped GEMMs for BLOCK_M = 16 tokens (one config per translation unit).
#include "cuda/sm120/moe_gemm_sm120.cuh"

namespace mxmoe::cuda::sm120 {

cudaError_t LaunchGemmM16(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchGemmConfig<ConfigM16>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmM16() { return PrepareGemmConfig<ConfigM16>(); }
GemmConfigInfo InfoM16() { return InfoOf<ConfigM16>("m16"); }

}  // namespace mxmoe::cuda::sm120
