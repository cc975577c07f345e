// Launch-side helpers shared by the grouped-GEMM launchers of both architectures.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

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

// Whether environment variable `name` is set to exactly `value` (read on every call: callers on
// hot paths cache it).
inline bool EnvFlagIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// A process-wide on/off switch, read once from environment variable `name` (1: on, 0: off, else
// `fallback`), which the tests may flip.
class EnvSwitch {
 public:
  EnvSwitch(const char* name, bool fallback)
      : on_(EnvFlagIs(name, "1") ? true : EnvFlagIs(name, "0") ? false : fallback) {}
  void Set(bool on) { on_.store(on, std::memory_order_relaxed); }
  bool Get() const { return on_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> on_;
};

// A process-wide integer setting, read once from environment variable `name`: a decimal in
// [lo, hi], else `fallback` (unset, or another value, which is reported once on stderr so that a
// mistyped A/B does not pass unnoticed). The tests may change it (Set clamps to [lo, hi]).
class EnvInt {
 public:
  EnvInt(const char* name, int lo, int hi, int fallback) : lo_(lo), hi_(hi), value_(fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    char* end = nullptr;
    const long parsed = std::strtol(v, &end, 10);
    if (*v != '\0' && *end == '\0' && parsed >= lo && parsed <= hi) {
      value_.store(static_cast<int>(parsed), std::memory_order_relaxed);
    } else {
      std::fprintf(stderr, "mxmoe: %s=%s ignored: expected an integer from %d to %d (using %d)\n", name, v, lo, hi,
                   fallback);
    }
  }
  void Set(int v) { value_.store(v < lo_ ? lo_ : v > hi_ ? hi_ : v, std::memory_order_relaxed); }
  int Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  int lo_, hi_;
  std::atomic<int> value_;
};

// Whether the pipeline's kernels are launched with programmatic dependent launch (ptx.cuh,
// GridDependencyWait): MXMOE_PDL=1 turns it on (off by default until measured: perf-log v6).
inline bool PdlEnabled() {
  static const bool on = EnvFlagIs("MXMOE_PDL", "1");
  return on;
}

// LaunchKernel in thread block clusters of `cluster_x` consecutive CTAs along x (grid.x a multiple
// of it; 1: no clusters).
template <class... Params, class... Args>
cudaError_t LaunchKernelInClusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (PdlEnabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attr;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when PdlEnabled(): the
// kernel must call ptx::GridDependencyWait before it touches global memory. Works under stream
// capture (the graph gets a programmatic edge).
template <class... Params, class... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         Args&&... args) {
  return LaunchKernelInClusters(kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

// CTAs of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory that fit one SM
// (the CUDA occupancy API; the kernel's shared memory limit must have been raised first).
// Negative: the API's error code, negated.
template <class... Params>
int ResidentCtas(void (*kernel)(Params...), int threads, size_t smem) {
  int ctas = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem);
  return e == cudaSuccess ? ctas : -static_cast<int>(e);
}

// The three entry points of one GEMM config, defined in the config's own translation unit (one
// config per unit, so that they compile in parallel) and declared by the dispatch file: LAUNCH,
// PREPARE and INFO name the kernel family's function templates, LABEL the config's name.
#define MXMOE_DEFINE_GEMM_CONFIG(NAME, CONFIG, LABEL, LAUNCH, PREPARE, INFO)                            \
  cudaError_t LaunchGemm##NAME(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) { \
    return LAUNCH<CONFIG>(fc1, p, grid_ctas, stream);                                                  \
  }                                                                                                    \
  cudaError_t PrepareGemm##NAME() { return PREPARE<CONFIG>(); }                                        \
  GemmConfigInfo Info##NAME() { return INFO<CONFIG>(LABEL); }

}  // namespace mxmoe::cuda
