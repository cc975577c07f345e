// Instantiation of the fused grouped GEMMs for BLOCK_N = 32 (one config per translation unit).
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

cudaError_t LaunchGemmN32(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  return LaunchGemmConfig<ConfigN32>(fc1, p, grid_ctas, stream);
}
cudaError_t PrepareGemmN32() { return PrepareGemmConfig<ConfigN32>(); }
GemmConfigInfo InfoN32() { return InfoOf<ConfigN32>("n32"); }

}  // namespace mxmoe::cuda::sm90
