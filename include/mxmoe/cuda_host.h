// Convenience for tools and tests: run a CudaMoe on host data (copies in, runs, copies out).
// Engines call CudaMoe::Run with their own device buffers and stream instead.
#pragma once

#include <vector>

#include "mxmoe/cuda.h"

namespace mxmoe {

struct CudaHostRunOptions {
  bool reference = false;  // the unfused GPU reference instead of the fused pipeline
  int repeats = 1;         // timed runs after one warm-up run (when repeats > 1)
};

// `in` and `out` hold host pointers. *times_ms receives each timed run's device time.
Status CudaRunHost(const CudaMoe& moe, const MoeInput& in, const MoeOutput& out,
                   const CudaHostRunOptions& options, std::vector<float>* times_ms);

}  // namespace mxmoe
