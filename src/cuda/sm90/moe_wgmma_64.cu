// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 64 (one config per translation unit).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmWg64(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchWgmmaConfig<ConfigWg64>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmWg64() { return PrepareWgmmaConfig<ConfigWg64>(); }
GemmConfigInfo InfoWg64() { return WgmmaInfoOf<ConfigWg64>("wg64"); }

}  // namespace mxmoe::cuda::sm90
