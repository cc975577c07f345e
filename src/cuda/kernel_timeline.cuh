// When a decode call's kernels start, get past their dependency wait and end, for diagnosis: built
// with -DMXMOE_KERNEL_TIMELINE, thread 0 of one CTA of each pipeline kernel (the small-call
// routing's routing CTA, CTA 0 of the mma.sync GEMMs and of the combine; n8f's one kernel is not
// timed) reads %globaltimer before its griddepcontrol.wait, after it, and at its end, and appends
// the three times with the kernel's kind to a device table of its translation unit. At exit every
// unit that launched prints its records on stderr ("mxmoe timeline: <kind> <start> <waited> <end>",
// ns); scripts/timeline_report.py groups them into calls and prints the medians. Under programmatic
// dependent launch a kernel's "waited" time is when the kernel before it had completed and its
// writes were visible, so the chain of those times is the call's critical path. Writing to memory
// costs a few instructions per kernel, where printing from the kernels cost ~30 µs each (perf-log
// v31). Without the macro every piece compiles to nothing. -DMXMOE_KERNEL_TIMELINE=2 has every CTA
// of the GEMM kernels keep its times (kTimelineEveryCta), with its SM and index beside the kind:
// <kind> is then kind + 256 * SM + 2^20 * CTA, and CTAs that end without a tile have no end (0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/ptx.cuh"

namespace mxmoe::cuda {

enum class TimelineKernel : unsigned { kRoute = 0, kFc1 = 1, kFc2 = 2, kCombine = 3 };

#ifdef MXMOE_KERNEL_TIMELINE
inline constexpr bool kTimelineEveryCta = MXMOE_KERNEL_TIMELINE + 0 >= 2;
inline constexpr unsigned kTimelineRecords = 1u << 18;
// This translation unit's records: start, waited, end, kind.
static __device__ unsigned long long g_timeline[kTimelineRecords][4];
static __device__ unsigned int g_timeline_count;

class TimelineClock {
 public:
  // Thread 0 of the CTA for which timed_cta holds (one CTA of the grid) keeps the times.
  __device__ explicit TimelineClock(bool timed_cta = blockIdx.x == 0) : on_(timed_cta && threadIdx.x == 0) {}
  __device__ void Start() {
    if (on_) start_ = ptx::GlobalTimerNs();
  }
  // Takes the record (only its index stays live through the kernel: four registers for the times
  // made ptxas spill in n8c2's FC2 kernel).
  __device__ void Waited(TimelineKernel kind) {
    if (!on_) return;
    const uint64_t waited = ptx::GlobalTimerNs();
    slot_ = atomicAdd(&g_timeline_count, 1u);
    if (slot_ >= kTimelineRecords) return;
    g_timeline[slot_][0] = start_;
    g_timeline[slot_][1] = waited;
    g_timeline[slot_][3] = static_cast<unsigned>(kind) + 256ull * ptx::SmId() + (1ull << 20) * blockIdx.x;
  }
  __device__ void End() const {
    if (on_ && slot_ < kTimelineRecords) g_timeline[slot_][2] = ptx::GlobalTimerNs();
  }

 private:
  bool on_;
  unsigned slot_ = kTimelineRecords;
  uint64_t start_ = 0;
};

static bool g_timeline_registered = false;

static void PrintTimeline() {
  unsigned count = 0;
  if (cudaMemcpyFromSymbol(&count, g_timeline_count, sizeof(count)) != cudaSuccess) return;
  if (count > kTimelineRecords) {
    std::fprintf(stderr, "mxmoe timeline: %u records, the first %u kept\n", count, kTimelineRecords);
    count = kTimelineRecords;
  }
  std::vector<unsigned long long> rows(4 * size_t{count});
  if (count == 0 || cudaMemcpyFromSymbol(rows.data(), g_timeline, rows.size() * sizeof(rows[0])) != cudaSuccess) return;
  for (size_t i = 0; i < rows.size(); i += 4)
    std::fprintf(stderr, "mxmoe timeline: %llu %llu %llu %llu\n", rows[i + 3], rows[i], rows[i + 1], rows[i + 2]);
}

// Prints this unit's records at exit (an atexit handler: the CUDA runtime is still up); the first
// call counts. (Internal linkage: each unit registers its own table.)
[[maybe_unused]] static void RegisterTimeline() {
  if (g_timeline_registered) return;
  g_timeline_registered = true;
  std::atexit(&PrintTimeline);
}
#else
inline constexpr bool kTimelineEveryCta = false;
class TimelineClock {
 public:
  __device__ explicit TimelineClock(bool = true) {}
  __device__ void Start() {}
  __device__ void Waited(TimelineKernel) {}
  __device__ void End() const {}
};
inline void RegisterTimeline() {}
#endif

}  // namespace mxmoe::cuda
