// What the CUDA probes (bench/stream_probe.cu, bench/wgmma_probe.cu) share: a CUDA call's check,
// which names the probe and the step and exits, and the median of a sample.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace mxmoe::bench {

inline void CheckCuda(const char* probe, cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", probe, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The upper median of a non-empty sample.
template <class T>
T Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace mxmoe::bench
