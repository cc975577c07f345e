// The CUDA API in a build without CUDA: every entry point says so.
#include "mxmoe/cuda.h"

namespace mxmoe {

bool CudaBuilt() { return false; }
std::string CudaArchsCompiled() { return ""; }
std::vector<CudaDeviceInfo> CudaDevices() { return {}; }

Status CudaMoe::Create(const ExpertSet&, int, std::unique_ptr<CudaMoe>*) {
  return Status::Unsupported("this build of mxmoe has no CUDA backend (configure with nvcc present)");
}

}  // namespace mxmoe
