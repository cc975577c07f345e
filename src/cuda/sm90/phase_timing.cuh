// Where a GEMM CTA's time goes, for diagnosis: built with -DMXMOE_PHASE_TIMING, the SM90 kernels
// (moe_wgmma.cuh, moe_gemm.cuh) time their phases with the SM's cycle counter and add them, per GEMM, into a
// device table of their translation unit; at exit every config that ran prints one line per GEMM:
//   consumers (lane 0 of each consumer warpgroup's first warp; in the mma.sync kernels, moe_gemm.cuh,
//     thread 0 of each CTA that runs an epilogue): cycles from its start (after setmaxnreg; after
//     the tile lookup) to the end of its epilogue, and the shares spent waiting for the
//     tile's first stage, waiting for its later stages (mma.sync: the cp.async wait and the CTA
//     barrier after it), waiting for MMA groups to complete (wgmma: the wait after each k16 step's
//     group; mma.sync has none apart), in the rest of the main loop (dequantizing and issuing, and
//     the wait for the last MMA groups) and in the epilogue (from the main loop's end on);
//   producer (wgmma, lane 0 of warp 0): cycles from its start to its last copy issued, and the
//     share spent waiting for free stages.
// Run one token count per process (`mxmoe bench --tokens T`): the sums cover every call, warm-up and
// check included. The clock reads add instructions to the main loop (two reads, two moves to
// uniform registers and the sums per timed wait; in wg128d3x3's SASS a width's span from its first
// to its last MMA grows from 106-110 instructions to 115 in FC1 and 124 in FC2): compare the timed
// build's layer time with the default build's. Without the macro every piece compiles to
// nothing (PhaseClock is empty; the kernels' SASS is unchanged).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace mxmoe::cuda::sm90 {

#ifdef MXMOE_PHASE_TIMING
enum PhaseSlot : int {
  kPhaseConsumers,      // consumer threads timed (one per consumer warpgroup; mma.sync: per CTA)
  kPhaseConsumerTotal,  // their cycles from start to the end of the epilogue
  kPhaseFirstStage,     // waiting for the tile's first stage
  kPhaseStageWaits,     // waiting for later stages
  kPhaseMmaWaits,       // waiting for MMA groups (wgmma.wait_group after each k16 step)
  kPhaseEpilogue,       // from the last MMA's completion to the end
  kPhaseProducers,      // producer warps timed
  kPhaseProducerTotal,  // their cycles from start to the last copy issued
  kPhaseProducerWaits,  // waiting for free stages
  kPhaseEpiMarked,      // consumers whose epilogue set the three marks below (the wgmma FC1)
  kPhaseEpiBarrier1,    // from the main loop's end to the first barrier's release
  kPhaseEpiStaging,     // writing the accumulators to the staging planes
  kPhaseEpiBarrier2,    // the second barrier (every consumer's planes written)
  kNumPhaseSlots
};

// [FC2, FC1][slot], this translation unit's (one GEMM config's) sums.
static __device__ unsigned long long g_phase_cycles[2][kNumPhaseSlots];

// One thread's clock: its start, the end of its main loop and its waits (the first apart).
struct PhaseClock {
  mutable long long start = 0, main_end = 0, first_wait = 0, waits = 0, mma_waits = 0;
  mutable long long marks[3] = {0, 0, 0};  // the epilogue's steps (Mark), where a kernel sets them
  mutable int n_waits = 0;
  __device__ void Start() const { start = clock64(); }
  __device__ void MainEnd() const { main_end = clock64(); }
  __device__ void Mark(int i) const { marks[i] = clock64(); }
  template <class Wait>
  __device__ void Time(const Wait& wait) const {
    const long long t = clock64();
    wait();
    const long long d = clock64() - t;
    (n_waits++ == 0 ? first_wait : waits) += d;
  }
  template <class Wait>
  __device__ void TimeMmaWait(const Wait& wait) const {
    const long long t = clock64();
    wait();
    mma_waits += clock64() - t;
  }
};

template <bool kFc1>
__device__ __forceinline__ void RecordConsumerPhases(const PhaseClock& c, bool leader) {
  if (!leader) return;
  const long long end = clock64();
  unsigned long long* t = g_phase_cycles[kFc1 ? 1 : 0];
  atomicAdd(&t[kPhaseConsumers], 1ull);
  atomicAdd(&t[kPhaseConsumerTotal], static_cast<unsigned long long>(end - c.start));
  atomicAdd(&t[kPhaseFirstStage], static_cast<unsigned long long>(c.first_wait));
  atomicAdd(&t[kPhaseStageWaits], static_cast<unsigned long long>(c.waits));
  atomicAdd(&t[kPhaseMmaWaits], static_cast<unsigned long long>(c.mma_waits));
  atomicAdd(&t[kPhaseEpilogue], static_cast<unsigned long long>(end - c.main_end));
  if (c.marks[2] != 0) {
    atomicAdd(&t[kPhaseEpiMarked], 1ull);
    atomicAdd(&t[kPhaseEpiBarrier1], static_cast<unsigned long long>(c.marks[0] - c.main_end));
    atomicAdd(&t[kPhaseEpiStaging], static_cast<unsigned long long>(c.marks[1] - c.marks[0]));
    atomicAdd(&t[kPhaseEpiBarrier2], static_cast<unsigned long long>(c.marks[2] - c.marks[1]));
  }
}

template <bool kFc1>
__device__ __forceinline__ void RecordProducerPhases(const PhaseClock& c, bool leader) {
  if (!leader) return;
  unsigned long long* t = g_phase_cycles[kFc1 ? 1 : 0];
  atomicAdd(&t[kPhaseProducers], 1ull);
  atomicAdd(&t[kPhaseProducerTotal], static_cast<unsigned long long>(clock64() - c.start));
  atomicAdd(&t[kPhaseProducerWaits], static_cast<unsigned long long>(c.first_wait + c.waits));
}

// This translation unit's GEMM config, as the table's lines name it, and whether its handler is
// registered (unit-local: a function-local static in the template below would be one variable for
// every unit that instantiates it with the same argument types).
static char g_phase_label[128];
static bool g_phase_registered = false;

// Prints this translation unit's table (an atexit handler: the CUDA runtime is still up).
static void PrintPhaseCycles() {
  unsigned long long t[2][kNumPhaseSlots] = {};
  if (cudaMemcpyFromSymbol(t, g_phase_cycles, sizeof(t)) != cudaSuccess) return;
  for (int fc1 = 1; fc1 >= 0; --fc1) {
    const unsigned long long* r = t[fc1];
    if (r[kPhaseConsumers] == 0) continue;
    const double total = static_cast<double>(r[kPhaseConsumerTotal]);
    const double pct = 100.0 / total;
    const double main = total - static_cast<double>(r[kPhaseFirstStage] + r[kPhaseStageWaits] + r[kPhaseMmaWaits] +
                                                    r[kPhaseEpilogue]);
    std::fprintf(stderr,
                 "mxmoe phase timing: %s, %s: %.0f cycles per timed thread (%llu): first stage %.1f%%, later stages "
                 "%.1f%%, MMA waits %.1f%%, rest of the main loop %.1f%%, epilogue %.1f%%",
                 g_phase_label, fc1 ? "FC1" : "FC2", total / static_cast<double>(r[kPhaseConsumers]),
                 r[kPhaseConsumers], pct * static_cast<double>(r[kPhaseFirstStage]),
                 pct * static_cast<double>(r[kPhaseStageWaits]), pct * static_cast<double>(r[kPhaseMmaWaits]),
                 pct * main, pct * static_cast<double>(r[kPhaseEpilogue]));
    if (r[kPhaseEpiMarked] == r[kPhaseConsumers]) {
      const double steps = static_cast<double>(r[kPhaseEpiBarrier1] + r[kPhaseEpiStaging] + r[kPhaseEpiBarrier2]);
      std::fprintf(stderr,
                   " (of it: first barrier %.1f%%, staging %.1f%%, second barrier %.1f%%, activation and "
                   "re-quantization %.1f%%)",
                   pct * static_cast<double>(r[kPhaseEpiBarrier1]), pct * static_cast<double>(r[kPhaseEpiStaging]),
                   pct * static_cast<double>(r[kPhaseEpiBarrier2]),
                   pct * (static_cast<double>(r[kPhaseEpilogue]) - steps));
    }
    if (r[kPhaseProducers] > 0 && r[kPhaseProducerTotal] > 0)
      std::fprintf(stderr, "; producer %.0f cycles, %.1f%% of them waiting for free stages",
                   static_cast<double>(r[kPhaseProducerTotal]) / static_cast<double>(r[kPhaseProducers]),
                   100.0 * static_cast<double>(r[kPhaseProducerWaits]) / static_cast<double>(r[kPhaseProducerTotal]));
    std::fprintf(stderr, "\n");
  }
}

// Names this unit's config (printf-style) and prints its table at exit; the first call counts.
// (Internal linkage: each unit registers its own table.)
template <class... Args>
static void RegisterPhaseCycles(const char* format, Args... args) {
  if (g_phase_registered) return;
  g_phase_registered = true;
  std::snprintf(g_phase_label, sizeof(g_phase_label), format, args...);
  std::atexit(&PrintPhaseCycles);
}
#else
struct PhaseClock {
  __device__ void Start() const {}
  __device__ void MainEnd() const {}
  __device__ void Mark(int) const {}
  template <class Wait>
  __device__ void Time(const Wait& wait) const {
    wait();
  }
  template <class Wait>
  __device__ void TimeMmaWait(const Wait& wait) const {
    wait();
  }
};
template <bool kFc1>
__device__ __forceinline__ void RecordConsumerPhases(const PhaseClock&, bool) {}
template <bool kFc1>
__device__ __forceinline__ void RecordProducerPhases(const PhaseClock&, bool) {}
template <class... Args>
void RegisterPhaseCycles(const char*, Args...) {}
#endif

}  // namespace mxmoe::cuda::sm90
