// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 8 (one config per translation unit).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmWg8(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchWgmmaConfig<ConfigWg8>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmWg8() { return PrepareWgmmaConfig<ConfigWg8>(); }
GemmConfigInfo InfoWg8() { return WgmmaInfoOf<ConfigWg8>("wg8"); }

}  // namespace mxmoe::cuda::sm90
