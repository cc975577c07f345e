// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 16 (one config per translation unit).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmWg16(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchWgmmaConfig<ConfigWg16>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmWg16() { return PrepareWgmmaConfig<ConfigWg16>(); }
GemmConfigInfo InfoWg16() { return WgmmaInfoOf<ConfigWg16>("wg16"); }

}  // namespace mxmoe::cuda::sm90
