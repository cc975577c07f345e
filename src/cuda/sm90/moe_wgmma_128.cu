// Instantiation of the wgmma grouped GEMMs for BLOCK_N = 128 (one config per translation unit).
#include "cuda/sm90/moe_wgmma.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmWg128(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchWgmmaConfig<ConfigWg128>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmWg128() { return PrepareWgmmaConfig<ConfigWg128>(); }
GemmConfigInfo InfoWg128() { return WgmmaInfoOf<ConfigWg128>("wg128"); }

}  // namespace mxmoe::cuda::sm90
