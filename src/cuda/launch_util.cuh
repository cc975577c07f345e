// Launch-side helpers shared by the grouped-GEMM launchers of both architectures.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace mxmoe::cuda {

// Lets a config's FC1 and FC2 kernels use `bytes` of dynamic shared memory (above 48 KB a kernel
// needs the opt-in).
template <class KernelFc1, class KernelFc2>
cudaError_t AllowDynamicSmem(KernelFc1 fc1, KernelFc2 fc2, int bytes) {
  cudaError_t e = cudaFuncSetAttribute(fc1, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(fc2, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// A 1D grid of `ctas` blocks; false (nothing to launch) for none, an error past gridDim.x's range.
inline cudaError_t GridOf(int64_t ctas, dim3* grid, bool* launch) {
  *launch = ctas > 0;
  if (ctas > INT_MAX) return cudaErrorInvalidConfiguration;
  *grid = dim3(static_cast<unsigned>(ctas > 0 ? ctas : 1));
  return cudaSuccess;
}

}  // namespace mxmoe::cuda
