#include "mxmoe/cuda_host.h"

namespace mxmoe {

Status CudaRunHost(const CudaMoe&, const MoeInput&, const MoeOutput&, const CudaHostRunOptions&,
                   std::vector<float>*) {
  return Status::Unsupported("this build of mxmoe has no CUDA backend");
}

}  // namespace mxmoe
