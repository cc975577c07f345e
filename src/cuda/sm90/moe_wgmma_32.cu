// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 32 (one config per translation unit).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmWg32(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchWgmmaConfig<ConfigWg32>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmWg32() { return PrepareWgmmaConfig<ConfigWg32>(); }
GemmConfigInfo InfoWg32() { return WgmmaInfoOf<ConfigWg32>("wg32"); }

}  // namespace mxmoe::cuda::sm90
