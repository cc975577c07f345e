// n8f: both grouped GEMMs of a decode call (at most kDecodeMaxPairs pairs) in one persistent kernel
// on n8's tiles (perf-log v21). decode_plan.h has the order of the units and the arithmetic of the
// buffers; GemmConfigId::kN8f runs n8's two kernels for larger calls.
//
// Why: at T = 1 the layer spends ~90 µs in its two GEMM kernels against ~69 µs to read the weights
// (perf-log v18). Each kernel is one short wave: FC1's CTAs wait for later stages 23% of their
// cycles, and FC2's 448 CTAs (n8c2) fill half of the SMs' slots. Here every CTA slot streams
// weights from the first unit to the last: FC2's units start while FC1's last ones finish, and a
// tile's reduction is split into parts small enough that the units outnumber the slots.
//
// A CTA is n8's (4 warps, 256 rows x 8 tokens, 3 stages of one 64-wide step; the same cp.async
// copies, MMAs and epilogues: moe_gemm.cuh). Per unit it:
//   1. takes the next unit from the counter;
//   2. (FC2) waits until FC1 has raised the "written" flags of the intermediates its steps read;
//   3. runs its part of the reduction;
//   4. with parts (s > 1), writes its sums at its part's place, counts itself in, and only the
//      last part to arrive goes on: it adds the parts' sums in part order;
//   5. runs the epilogue (FC1: activation and re-quantization into h, then raises the flag of its
//      row block; FC2: y, then, with the combine folded in, counts its row block done).
// With the combine folded in (MXMOE_DECODE_COMBINE), combine units follow (decode_plan.h): each
// waits until every tile's FC2 unit of its row block has counted itself done, then adds y's rows.
// Memory order: the sums and h are written, the CTA meets at a barrier, and thread 0 counts in
// (an acq_rel atomic) or raises the flag (a release store); the reader's thread 0 sees the count
// (the same atomic's acquire) or the flag (an acquire load), and the CTA meets at a barrier before
// it reads them through L2 (__ldcg, cp.async.cg). CUTLASS's barrier arrive / wait has this shape.
// The folded combine's done counts are added with release after the barrier, and read as the flags
// are. No deadlock: an FC2 unit waits only for FC1 units, which wait for nothing and were all taken
// before any FC2 unit, by CTAs that are running (whatever else shares the SMs); a combine unit waits
// only for FC2 units, all taken before it. A wait that does not end within 2 s traps instead of
// hanging.
#include <algorithm>
#include <atomic>
#include <cstdio>

#include "cuda/decode_plan.h"
#include "cuda/sm90/moe_gemm.cuh"

namespace mxmoe::cuda::sm90 {

namespace {

using DecodeConfig = ConfigN8;
// 72 registers and 29 KB of stages a CTA: 7 share an SM (ptxas, perf-log v21).
constexpr int kDecodeCtasPerSm = 7;
// Thread 0: until *word >= target (an FC1 unit's flag, 1, or the count of tiles whose FC2 unit of
// a row block has written y), polled relaxed (an acquire load invalidates the SM's L1 each time)
// and then read once with acquire. A word not reached within 2 s means a broken invariant (what it
// waits for was taken before by a running CTA that waits only for earlier units): trap rather than
// hang the device, with kSay saying which FC2 unit waited for which FC1 block (only one call site
// prints: a second printf call site made ptxas spill in the main loop of the instance with the
// combine). (A template so that the sm_120a pass, which compiles no kernel body here, does not warn
// that it is unused.)
template <bool kSay>
__device__ __forceinline__ void WaitForWord(const int32_t* word, int32_t target, const DecodeUnit& w = {},
                                            int32_t block = 0) {
  constexpr int64_t kWaitLimitNs = 2000000000;
  if (ptx::LoadAcquireGpu(word) >= target) return;
  const uint64_t start = ptx::GlobalTimerNs();
  while (ptx::LoadRelaxedGpu(word) < target) {
    __nanosleep(128);
    if (static_cast<int64_t>(ptx::GlobalTimerNs() - start) > kWaitLimitNs) {
      if (kSay) {
        printf("mxmoe n8f: FC2 unit (tile %d, block %d, part %d) waited 2 s for FC1 block %d\n", w.tile, w.block,
               w.part, block);
      }
      __trap();
    }
  }
  (void)ptx::LoadAcquireGpu(word);
}

// Steps 2 to 5 of one unit, for every thread of the CTA (kCombine: the FC2 units count themselves
// done per row block for the folded combine).
template <class Cfg, bool kFc1, bool kCombine>
__device__ __forceinline__ void RunDecodeUnit(const DecodeParams& d, const GemmParams& p, const DecodeUnit& w,
                                              uint8_t* smem, int32_t* smem_rows, int32_t* smem_last) {
  static_assert(Cfg::kBlockM == kDecodeBlockRows && Cfg::kBlockN == kDecodeBlockTokens, "decode_plan.h's unit");
  static_assert(Cfg::kKSub == 1 && Cfg::kSplitK == 1 && Cfg::kClusterK == 1 && !Cfg::kAdaptiveWidth,
                "one step per stage, one set of warps, one CTA per unit");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  TileCoords tc;
  ReadTile<Cfg::kBlockN, kFc1>(p, static_cast<uint32_t>(w.tile) * p.m_tiles + w.block, tid, Cfg::kThreads, smem_rows,
                               &tc);  // (w.tile < the tile count: it returns true)
  const int32_t parts = kFc1 ? d.plan.s1 : d.plan.s2;
  int32_t k_first = 0, k_tiles = 0;
  DecodePartSteps(kFc1 ? d.plan.k1 : d.plan.k2, parts, w.part, &k_first, &k_tiles);
  if constexpr (!kFc1) {
    if (tid == 0) {
      int32_t lo = 0, hi = 0;
      DecodeFc1BlocksOf(k_first, k_tiles, &lo, &hi);
      for (int32_t m = lo; m < hi; ++m)
        WaitForWord<true>(d.sync + DecodeReadyWord(d.plan, d.max_tiles, w.tile, m), 1, w, m);
    }
    __syncthreads();  // (after thread 0's acquire: every thread's copies of h come after it)
  }

  StepLoader<Cfg::kBlockN, Cfg::kThreads> loader;
  loader.Init(p, tc, smem_rows, tid, k_first);
  const int groups = loader.groups;
  const bool warp_active = warp * Cfg::kMFrags < groups;
  float acc[Cfg::kMFrags][Cfg::kNTiles][4];
  ZeroAccumulators(acc);
  auto load_step = [&](int stage) {
    const uint32_t at = ptx::SmemAddr(smem + stage * Cfg::kSmemStage);
    loader.IssueNext(at, at + Cfg::kSmemA, at + Cfg::kSmemA + Cfg::kSmemScales, tid, p.b);
  };
  // The cp.async pipeline of MoeGemmKernel with one step per stage.
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < k_tiles) load_step(s);
    ptx::CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::CpAsyncWait<Cfg::kStages - 2>();
    __syncthreads();
    const int next = kt + Cfg::kStages - 1;
    if (next < k_tiles) load_step(next % Cfg::kStages);
    ptx::CpAsyncCommit();
    if (warp_active) {
      const uint8_t* stage = smem + (kt % Cfg::kStages) * Cfg::kSmemStage;
      // DecodeWord's 9-op form: the 8-op one spilled at this kernel's 72 registers (perf-log v30).
      ComputeStep<Cfg, Cfg::kNTiles, false>(stage, stage + Cfg::kSmemA, stage + Cfg::kSmemA + Cfg::kSmemScales, warp,
                                            lane, acc);
    }
  }
  ptx::CpAsyncWait<0>();

  if (parts > 1) {
    // The part's sums at [block][part][position][row] (decode_plan.h), the tile's real columns only.
    // DecodePartialFloat's layout: a part's sums `plane` floats apart, then position, then row
    // (spelled out here: DecodePartialFloat called per part made ptxas spill 20 bytes in one instance).
    const int64_t plane = static_cast<int64_t>(d.pairs) * kDecodeBlockRows;
    float* const base = d.partials + DecodePartialFloat(d.plan, d.pairs, kFc1, w.block, 0, 0, 0);
    const int g = lane >> 2, c = lane & 3;
    const int64_t mine =
        static_cast<int64_t>(tc.seg_begin + 2 * c) * kDecodeBlockRows + warp * Cfg::kMFrags * kTileRows + g;
    auto at = [&](int f, int half, int q) { return mine + q * kDecodeBlockRows + f * kTileRows + 8 * half; };
    if (warp_active) {
      float* const slab = base + w.part * plane;
#pragma unroll
      for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int q = 0; q < 2; ++q)
            if (2 * c + q < tc.n_valid) __stcg(slab + at(f, half, q), acc[f][0][2 * half + q]);
    }
    // The CTA's stores, then thread 0's count (release: the barrier orders the other threads' stores
    // before it); the last part's count also acquires the others' sums for the CTA (the barrier).
    __syncthreads();
    if (tid == 0) {
      const int64_t arrivals = DecodeArrivalWord(d.plan, d.max_tiles, kFc1, w.tile, w.block);
      *smem_last = ptx::AtomicAddAcqRelGpu(d.sync + arrivals, 1) == parts - 1 ? 1 : 0;
    }
    __syncthreads();
    if (*smem_last == 0) return;  // (uniform) another part finishes the tile
    if (warp_active) {
      // Part by part, each adding its 16 sums at once (16 loads in flight), in part order.
      ZeroAccumulators(acc);
#pragma unroll 1
      for (int part = 0; part < parts; ++part) {
        const float* const slab = base + part * plane;
        float v[Cfg::kMFrags][2][2];
#pragma unroll
        for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int q = 0; q < 2; ++q) v[f][half][q] = 2 * c + q < tc.n_valid ? __ldcg(slab + at(f, half, q)) : 0.0f;
#pragma unroll
        for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int q = 0; q < 2; ++q) acc[f][0][2 * half + q] += v[f][half][q];
      }
    }
  }
  // (The stages become the FC1 epilogue's planes: every copy has landed, and its first barrier
  // waits until every warp is past its last step.)
  MmaTileEpilogue<Cfg, kFc1>(p, tc, groups, acc, warp_active, warp, warp, lane, smem);
  if constexpr (kFc1) {
    __syncthreads();  // every thread's h stores are done: the release below covers them
    if (tid == 0) {
      if (d.debug_fc1_delay_ns > 0) {  // (the tests' SetDecodeFc1Delay: make FC2 units wait)
        const uint64_t start = ptx::GlobalTimerNs();
        while (ptx::GlobalTimerNs() - start < static_cast<uint64_t>(d.debug_fc1_delay_ns)) __nanosleep(1000);
      }
      ptx::StoreReleaseGpu(d.sync + DecodeReadyWord(d.plan, d.max_tiles, w.tile, w.block), 1);
    }
  } else if constexpr (kCombine) {
    __syncthreads();  // every thread's y stores are done: the release below covers them
    if (tid == 0) ptx::RedAddReleaseGpu(d.sync + DecodeDoneWord(d.plan, d.max_tiles, w.block), 1);
  }
}

// A combine unit (decode_plan.h): out[t, rows of W2's row block] for the unit's token t, once every
// tile's FC2 unit of the block has written its y rows (CombineRowBlock, moe_gemm.cuh: the combine
// kernel's sum, bit for bit).
template <class Cfg>
__device__ __forceinline__ void RunCombineUnit(const DecodeParams& d, int32_t block, int32_t t, int32_t tiles) {
  static_assert(kDecodeBlockRows == 2 * Cfg::kThreads, "two rows of the block a thread");
  if (threadIdx.x == 0) WaitForWord<false>(d.sync + DecodeDoneWord(d.plan, d.max_tiles, block), tiles);
  __syncthreads();  // (after thread 0's acquire: every thread's reads of y come after it)
  CombineRowBlock<Cfg::kThreads>(d.fc2, d.topk_ids, d.first_expert, d.num_local, block, t, d.out, d.out_dtype);
}

// kCombine: the instance with the combine folded in (plan.combine_tokens > 0); the other has none
// of its code (at 72 registers, a first version with it in one instance spilled in the main loop).
template <class Cfg, bool kCombine>
__global__ void __launch_bounds__(Cfg::kThreads, kDecodeCtasPerSm)
    MoeDecodeKernel(const __grid_constant__ DecodeParams d) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t smem_rows[Cfg::kBlockN];
  __shared__ int32_t smem_unit, smem_last;
  ptx::EnterPipelineKernel();
  const int32_t tiles = *d.fc1.num_tiles;
  if (tiles > d.max_tiles) __trap();  // (the words' layout holds max_tiles tiles; the routing keeps to it)
  const int32_t gemm_units = DecodeUnits(d.plan, tiles);
  const int32_t units = kCombine ? gemm_units + DecodeCombineUnits(d.plan) : gemm_units;
  if (threadIdx.x == 0) smem_unit = atomicAdd(d.fc1.work_counter, 1);
  __syncthreads();
  int32_t u = smem_unit;
  while (u < units) {  // (uniform)
    // The next unit is taken now, its atomic's latency hidden behind this unit. (No deadlock from
    // holding it: a CTA on an FC1 unit waits for nothing; one on an FC2 unit holds an FC2 or a
    // combine unit, and combine units wait only for FC2 units, all taken before them; one on a
    // combine unit holds a combine unit, which nothing waits for.)
    int32_t next = 0;
    if (threadIdx.x == 0) next = atomicAdd(d.fc1.work_counter, 1);
    if (!kCombine || u < gemm_units) {
      const DecodeUnit w = DecodeUnitOf(d.plan, tiles, u);
      if (w.fc1) RunDecodeUnit<Cfg, true, kCombine>(d, d.fc1, w, smem, smem_rows, &smem_last);
      else RunDecodeUnit<Cfg, false, kCombine>(d, d.fc2, w, smem, smem_rows, &smem_last);
    } else if constexpr (kCombine) {
      int32_t block = 0, token = 0;
      DecodeCombineUnitOf(d.plan, u - gemm_units, &block, &token);
      RunCombineUnit<Cfg>(d, block, token, tiles);
    }
    // Every thread is done with the unit (smem_unit, smem_last, the stages and the planes) before
    // thread 0 hands out the next one and the copies refill the stages.
    __syncthreads();
    if (threadIdx.x == 0) smem_unit = next;
    __syncthreads();
    u = smem_unit;
  }
#else
  __trap();  // built for SM90 only; cuda_moe.cu refuses other devices before launching
#endif
}

// CTAs per SM of the instance with (combine) or without the folded combine.
int DecodeResidentCtasOf(bool combine) {
  return ResidentCtas(combine ? MoeDecodeKernel<DecodeConfig, true> : MoeDecodeKernel<DecodeConfig, false>,
                      DecodeConfig::kThreads, DecodeConfig::kSmemBytes);
}

template <class Cfg>
cudaError_t PrepareN8f() {
  const cudaError_t e = PrepareGemmConfig<Cfg>();
  if (e != cudaSuccess) return e;
  return AllowDynamicSmem(MoeDecodeKernel<Cfg, false>, MoeDecodeKernel<Cfg, true>, Cfg::kSmemBytes);
}

template <class Cfg>
GemmConfigInfo InfoN8fOf(const char* name) {
  // (GemmConfigInfo's resident_ctas takes FC1 or FC2; n8f's one kernel serves both: the instance
  // without the combine.)
  return {name, Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads, Cfg::kStages, Cfg::kSmemBytes, false, kDecodeCtasPerSm,
          false, [](bool) { return DecodeResidentCtasOf(false); }};
}

}  // namespace

// (Larger calls run n8's kernels: LaunchGemmConfig. n8f does not read the L2 look-ahead, so the
// caller passes none.)
MXMOE_DEFINE_GEMM_CONFIG(N8f, DecodeConfig, "n8f", LaunchGemmConfig, PrepareN8f, InfoN8fOf)

}  // namespace mxmoe::cuda::sm90

namespace mxmoe::cuda {

namespace {
std::atomic<int64_t> g_fused_decode_launches{0};
std::atomic<int32_t> g_fc1_delay_ns{0};
}  // namespace

cudaError_t LaunchFusedDecode(const DecodeParams& d, cudaStream_t stream) {
  using Cfg = sm90::DecodeConfig;
  const DecodePlan& pl = d.plan;
  if (d.fc1.work_counter == nullptr || d.fc1.num_tiles == nullptr || d.sync == nullptr || d.max_tiles < 0 ||
      d.pairs < 0 || d.pairs > kDecodeMaxPairs || pl.s1 < 1 || pl.s1 > kDecodeMaxSplit || pl.s2 < 1 ||
      pl.s2 > kDecodeMaxSplit || pl.m1 != d.fc1.m_tiles || pl.m2 != d.fc2.m_tiles ||
      pl.k1 != d.fc1.a_shape.col_tiles || pl.k2 != d.fc2.a_shape.col_tiles ||
      ((pl.s1 > 1 || pl.s2 > 1) && d.partials == nullptr) || pl.combine_tokens < 0 ||
      (pl.combine_tokens > 0 && (d.topk_ids == nullptr || d.out == nullptr || d.fc2.a_shape.rows % 2 != 0)))
    return cudaErrorInvalidValue;
  // FC2 step 2 m + j reads the intermediates FC1's row block m writes (decode_plan.h).
  static_assert(kTileCols * kFc2StepsPerFc1Block == kBlockRowGroups * 8, "an FC1 row block's intermediates");
  if (d.fc2.a_shape.cols != d.fc1.a_shape.rows / 2) return cudaErrorInvalidValue;
  const int64_t units =
      static_cast<int64_t>(d.max_tiles) * (pl.m1 * pl.s1 + pl.m2 * pl.s2) + int64_t{pl.m2} * pl.combine_tokens;
  if (units == 0) return cudaSuccess;
  if (units > INT32_MAX) return cudaErrorInvalidValue;
  // The CTA slots of the device (the occupancy API once per device: the launch is on the decode path).
  static std::atomic<int> slots_of[64][2];  // [device][with the combine]
  const bool combine = pl.combine_tokens > 0;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  int slots = device >= 0 && device < 64 ? slots_of[device][combine].load(std::memory_order_relaxed) : 0;
  if (slots == 0) {
    int sms = 0;
    if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
      return e;
    const int per_sm = sm90::DecodeResidentCtasOf(combine);
    if (per_sm <= 0) return per_sm < 0 ? static_cast<cudaError_t>(-per_sm) : cudaErrorInvalidConfiguration;
    slots = sms * per_sm;
    if (device >= 0 && device < 64) slots_of[device][combine].store(slots, std::memory_order_relaxed);
  }
  int64_t ctas = std::min<int64_t>(units, slots);
  if (const int limit = PersistentCtaLimit(); limit > 0 && limit < ctas) ctas = limit;
  DecodeParams launched = d;
  launched.debug_fc1_delay_ns = g_fc1_delay_ns.load(std::memory_order_relaxed);
  const auto kernel = combine ? sm90::MoeDecodeKernel<Cfg, true> : sm90::MoeDecodeKernel<Cfg, false>;
  const cudaError_t e = LaunchKernel(kernel, PdlSite::kFc1, dim3(static_cast<unsigned>(ctas)), dim3(Cfg::kThreads),
                                     Cfg::kSmemBytes, stream, launched);
  if (e == cudaSuccess) g_fused_decode_launches.fetch_add(1, std::memory_order_relaxed);
  return e;
}

int64_t FusedDecodeLaunches() { return g_fused_decode_launches.load(std::memory_order_relaxed); }

void SetDecodeFc1Delay(int32_t ns) { g_fc1_delay_ns.store(ns > 0 ? ns : 0, std::memory_order_relaxed); }

namespace {
EnvSwitch& DecodeCombine() {
  static EnvSwitch on{"MXMOE_DECODE_COMBINE", true};
  return on;
}
}  // namespace

void SetDecodeCombine(bool on) { DecodeCombine().Set(on); }
bool DecodeCombineEnabled() { return DecodeCombine().Get(); }

}  // namespace mxmoe::cuda
