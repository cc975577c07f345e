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

  // What Run does for a call of num_tokens tokens: the GEMM config both GEMMs run (named as
  // MXMOE_GEMM_CONFIG names it, so forcing one shows here too) and, when the workspace splits the
  // call, the number of chunks: "n8", "wg128d8 x3 chunks"; on SM90 an mma.sync config run with the
  // L2 look-ahead (MXMOE_L2_AHEAD) names it: "n8c2 l2+4". No device work.
  virtual std::string Plan(int64_t num_tokens) const = 0;

  // The fused pipeline on `stream`: no host synchronization, no allocation, graph-capturable.
  virtual Status Run(const MoeInput& in, const MoeOutput& out, void* workspace,
                     size_t workspace_bytes, void* stream) const = 0;

  // The unfused GPU reference (simple kernels, same math) for verifying large shapes.
  virtual Status RunReference(const MoeInput& in, const MoeOutput& out, void* workspace,
                              size_t workspace_bytes, void* stream) const = 0;

  virtual const ExpertSet& Layout() const = 0;  // shape, slice and activation (weights dropped)
  virtual int Device() const = 0;
  // Which kernels Create chose: "sm90" (compute capability 9.x), "sm120" (12.x) or
  // "sm120-emulated" (the SM120 kernels on an SM90 device with the software model of the MMA,
  // chosen by the environment variable MXMOE_CUDA_PATH=sm120 in a build with MXMOE_SM120_EMULATION).
  virtual const char* Kernels() const = 0;

  // The device-side error word. The host cannot check topk_ids without a synchronization, so Run
  // and RunReference skip an id outside [-1, E) like -1 and add it to a counter on the device (ids
  // of other EP ranks, in [0, E), are not errors). ReadErrors returns the ids counted since Create
  // or the last ResetErrors; both copy synchronously, so call them after synchronizing the streams
  // the calls ran on, with no call in flight. Graph replays count too.
  virtual Status ReadErrors(int64_t* bad_expert_ids) const = 0;
  virtual Status ResetErrors() const = 0;
  // Debug mode (also switched on at Create by the environment variable MXMOE_DEBUG_CHECK=1): Run and
  // RunReference synchronize their stream after launching and return kInvalidArgument naming
  // topk_ids and the count when the call met bad ids, or the CUDA error the call raised. Not for
  // production: it blocks the host. A call made while its stream is being captured skips the check.
  virtual void SetDebugCheck(bool on) = 0;
  virtual bool DebugCheck() const = 0;
};

}  // namespace mxmoe
