// Instantiation of the fused grouped GEMMs for BLOCK_N = 64 (one config per translation unit).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmN64(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchGemmConfig<ConfigN64>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmN64() { return PrepareGemmConfig<ConfigN64>(); }
GemmConfigInfo InfoN64() { return InfoOf<ConfigN64>("n64"); }

}  // namespace mxmoe::cuda::sm90
