// The CUDA backend's API. No CUDA header is needed to include it: streams are passed as void*
// (a cudaStream_t), pointers in MoeInput / MoeOutput are device pointers. In a build without CUDA
// every entry point returns StatusCode::kUnsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mxmoe/moe.h"

namespace mxmoe {

// Whether this build has the CUDA backend, and which SASS targets it holds ("sm_90a sm_120a").
bool CudaBuilt();
std::string CudaArchsCompiled();

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;
};
// The devices the runtime sees (empty without a driver or GPU; never an error for "no GPU").
std::vector<CudaDeviceInfo> CudaDevices();

// Experts prepared for one device: the kernels' private layout, produced once at load.
class CudaMoe {
 public:
  virtual ~CudaMoe() = default;

  // Uploads and repacks `experts` on `device`; refuses a device whose compute capability has no
  // kernels here (naming it).
  static Status Create(const ExpertSet& experts, int device, std::unique_ptr<CudaMoe>* out);

  // Workspace bytes for calls of up to max_tokens tokens.
  virtual size_t WorkspaceSize(int64_t max_tokens) const = 0;

  // The fused pipeline on `stream`: no host synchronization, no allocation, graph-capturable.
  virtual Status Run(const MoeInput& in, const MoeOutput& out, void* workspace,
                     size_t workspace_bytes, void* stream) const = 0;

  // The unfused GPU reference (simple kernels, same math) for verifying large shapes.
  virtual Status RunReference(const MoeInput& in, const MoeOutput& out, void* workspace,
                              size_t workspace_bytes, void* stream) const = 0;

  virtual const ExpertSet& Layout() const = 0;  // shape, slice and activation (weights dropped)
  virtual int Device() const = 0;
};

}  // namespace mxmoe
