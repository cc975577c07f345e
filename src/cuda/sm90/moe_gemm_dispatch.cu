// GemmConfigId -> the instantiation that serves it (the list of configs lives in moe_gemm.cuh).
#include "cuda/moe_kernels.h"

namespace mxmoe::cuda {

namespace sm90 {
#define MXMOE_DECLARE_CONFIG(N)                                                              \
  cudaError_t LaunchGemmN##N(bool fc1, const GemmParams& p, int64_t grid, cudaStream_t stream); \
  cudaError_t PrepareGemmN##N();                                                             \
  GemmConfigInfo InfoN##N();
MXMOE_DECLARE_CONFIG(8)
MXMOE_DECLARE_CONFIG(32)
MXMOE_DECLARE_CONFIG(64)
#undef MXMOE_DECLARE_CONFIG
}  // namespace sm90

GemmConfigInfo GemmInfo(GemmConfigId id) {
  switch (id) {
    case GemmConfigId::kN8: return sm90::InfoN8();
    case GemmConfigId::kN32: return sm90::InfoN32();
    case GemmConfigId::kN64: return sm90::InfoN64();
  }
  return sm90::InfoN8();
}

cudaError_t PrepareGemmKernels() {
  cudaError_t e = sm90::PrepareGemmN8();
  if (e == cudaSuccess) e = sm90::PrepareGemmN32();
  if (e == cudaSuccess) e = sm90::PrepareGemmN64();
  return e;
}

cudaError_t LaunchGemm(GemmConfigId id, bool fc1, const GemmParams& p, int64_t grid_ctas,
                       cudaStream_t stream) {
  switch (id) {
    case GemmConfigId::kN8: return sm90::LaunchGemmN8(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN32: return sm90::LaunchGemmN32(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN64: return sm90::LaunchGemmN64(fc1, p, grid_ctas, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace mxmoe::cuda
