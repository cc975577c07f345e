// Instantiation of the fused grouped GEMMs for BLOCK_N = 8 (one config per translation unit).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmN8(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchGemmConfig<ConfigN8>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmN8() { return PrepareGemmConfig<ConfigN8>(); }
GemmConfigInfo InfoN8() { return InfoOf<ConfigN8>("n8"); }

}  // namespace mxmoe::cuda::sm90
