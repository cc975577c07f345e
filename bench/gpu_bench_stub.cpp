// A build without the CUDA backend has no GPU sweep: `mxmoe bench` refuses, naming how to get one.
#include "bench/sweep.h"

namespace mxmoe::bench {

Status RunOnGpu(const SweepOptions&, int* failures) {
  *failures = 0;
  return Status::Unsupported(
      "this build has no CUDA backend: configure with -DMXMOE_CUDA=ON on a machine with nvcc and an SM90 GPU "
      "(`make bench` does); `mxmoe bench --dry-run` prints the sweep's rows and yardsticks without a GPU");
}

}  // namespace mxmoe::bench
