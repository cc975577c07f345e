// mxmoe_wgmma_probe: how fast the wgmma consumers' main loop can run on this GPU with its copies
// taken out, and what the instructions beside the MMAs cost. Each CTA is wg128d3x3's two consumer
// warpgroups (moe_wgmma.cuh) on one fixed stage already in shared memory: per 64-wide reduction step
// they read their A pieces and scales, then dequantize and issue the step's four k16 MMA groups with
// the kernel's own functions, and nothing waits for a copy or a barrier. The modes (Mode, below)
// take parts out or put other instructions in: comparing a width's "step" row with its "mma" row
// says what the dequantization costs; comparing the layer's main loop (perf-log, phases) with "step"
// says what the copies and barriers cost.
//   mxmoe_wgmma_probe [--reps N] [--tiles N]
// Prints the command, then one row per (width, mode, ops): µs, TFLOP/s (real FLOP: 256 rows x
// width x 64 x steps), cycles per k16 step of the CTA (its slower warpgroup's, median over CTAs),
// and the tensor pipe's share: the cycles the step's four m64 MMAs take at the SM's dense bf16 rate
// (4096 FLOP per cycle: 989.4 TFLOP/s over 132 SMs at 1830 MHz, the H100 / H200 data sheets' peak)
// over the cycles measured (split, solo and split0 issue two of the four). Rows without MMAs print
// width 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/probe_util.h"
#include "cuda/sm90/moe_wgmma.cuh"

namespace {

namespace sm90 = mxmoe::cuda::sm90;
namespace wg = mxmoe::cuda::wgmma;
namespace ptx = mxmoe::cuda::ptx;

using Cfg = sm90::ConfigWg128Deep3x3;  // the heuristics' config from 32 pairs per expert
constexpr int kRows = 256;             // a CTA's weight rows: one prepacked block
constexpr int kSteps = 56;             // Kimi-K3 FC1's reduction: 3584 / 64
constexpr int kFlopPerSmCycle = 4096;  // dense bf16, H100 / H200 SXM
// Modes, per k16 step of the loop:
//   mma: the step's MMA group on A registers dequantized once, before the loop (the tensor pipe's
//     rate for the shape); step / pair: the kernel's IssueStep / IssueStepPair;
//   ahead: each k16 step's dequantization one step ahead of its MMAs (step s + 1's before step s's
//     MMAs are issued, the next 64-wide step's first with the current one's last; two groups in
//     flight), so that no MMA waits for registers written just before it;
//   raw: IssueStep without the scale multiplications (DecodeWord's bits go to the MMAs);
//   both: mma's MMAs while the step's dequantization runs beside them into registers no MMA reads
//     (what the two cost together without the dependency between them; until perf-log v30 its
//     loads were outside the loop, so ptxas took the dequantization out of it too);
//   deq / decode: the dequantization alone, with / without the scale multiplications, no MMA;
//   alu / imad / ffma: mma's MMAs with kOps independent LOP3 / IMAD / FFMA per warp beside them;
//   rewrite: mma's MMAs, each step's A registers written again right before them from a copy of
//     the fixed ones (one LOP3 each with a run-time zero): the writes the MMAs read without the
//     arithmetic (perf-log v30: as fast as mma);
//   pre: each 64-wide step's four k16 words decoded (DecodeWord) right after its loads, so that a
//     k16 step's chain before its MMAs is only the scale multiplications (ScaleDecoded);
//   wait1 / wait0: step with at most 1 / 0 of the warpgroup's MMA groups left in flight after each
//     issue (instead of 3);
//   split: warpgroup 0 issues mma's MMAs alone while warpgroup 1 runs 32 independent LOP3 per k16
//     step and no MMA (does an MMA waiting to issue hold up the other warps of its scheduler?);
//     solo / fill: only warpgroup 0's MMAs / only warpgroup 1's LOP3, split's two halves alone;
//     split0 / solo0: split / solo with warpgroup 0 waiting for each MMA group before the next (no
//     MMA waits to be issued behind another);
//   sync / syncpair: step / pair with the two warpgroups meeting at a named barrier after each
//     dequantization, before its MMAs are issued (so that both dequantize at once and then issue
//     one after the other).
// The results of both, deq and decode are folded into one word (Fold: 2 LOP3 per m64 fragment).
enum Mode : int {
  kMma,
  kStep,
  kPair,
  kAhead,
  kRaw,
  kBoth,
  kDeq,
  kDecode,
  kAlu,
  kImad,
  kFfma,
  kRewrite,
  kPre,
  kWait1,
  kWait0,
  kSplit,
  kSolo,
  kFill,
  kSync,
  kSyncPair,
  kSplit0,
  kSolo0
};
const char* const kModeNames[] = {"mma",  "step", "pair", "ahead",    "raw",    "both",  "deq",   "decode",
                                  "alu",  "imad", "ffma", "rewrite",  "pre",    "wait1", "wait0", "split",
                                  "solo", "fill", "sync", "syncpair", "split0", "solo0"};

template <int kMFrags>
__device__ __forceinline__ void Fold(const uint32_t (&a)[kMFrags][4], uint32_t& fold) {
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) fold ^= a[f][0] ^ a[f][1] ^ a[f][2] ^ a[f][3];
}

// DequantStep without its scale multiplications: DecodeWord's bf16 bits only.
template <int kMFrags, int kStep>
__device__ __forceinline__ void DecodeStep(const uint4 (&frag_a)[kMFrags], uint32_t (&a)[kMFrags][4]) {
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) mxmoe::cuda::DecodeWord(sm90::WordOf(frag_a[f], kStep), a[f]);
}

// kOps independent operations of one kind, spread over 8 dependency chains.
template <int kMode, int kOps>
__device__ __forceinline__ void Filler(uint32_t (&x)[8]) {
#pragma unroll
  for (int i = 0; i < kOps; ++i) {
    uint32_t& v = x[i % 8];
    if constexpr (kMode == kAlu) {
      asm("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(v) : "r"(x[(i + 3) % 8]), "n"(0x5A5A5A5A));
    } else if constexpr (kMode == kImad) {
      asm("mad.lo.u32 %0, %0, %1, %2;" : "+r"(v) : "n"(0x9E3779B1), "r"(x[(i + 3) % 8]));
    } else {
      asm("fma.rn.f32 %0, %0, %1, %2;" : "+r"(v) : "f"(0.999f), "r"(x[(i + 3) % 8]));
    }
  }
}

// The warpgroup's MMA group of k16 step kS on register set `a` (fenced, committed), then a wait
// until at most kLeft groups are in flight: IssueStep's tail, with the wait as the mode asks.
template <int kLeft, int kS, int kMFrags, int kNTiles>
__device__ __forceinline__ void MmaGroupThenWait(const uint32_t (&a)[kMFrags][4], uint64_t desc_b,
                                                 float (&acc)[kMFrags][kNTiles][4]) {
  wg::Fence();
  sm90::IssueMmaGroup<kMFrags, kNTiles, kS>(a, desc_b, acc);
  wg::Wait<kLeft>();
}

struct ProbeArgs {
  int tiles;          // tiles per CTA, kSteps steps each
  int zero;           // 0, unknown to the compiler: the A loads' addresses vary with the step
  unsigned long long* cycles;  // per CTA (zeroed before the launch): the clock64 cycles of the slower
                               // warpgroup's thread 0 over all tiles
  float* sink;        // written only if the accumulators' sum is a NaN (keeps them live)
};

// wg128d3x3's two consumer warpgroups over a block's 256 rows: kMFrags = 2 m64 MMAs each per k16
// step.
template <int kN, int kMode, int kOps>
__global__ void __launch_bounds__(256, 1) ProbeKernel(const ProbeArgs args) {
#if MXMOE_WGMMA_AVAILABLE
  constexpr int kWGs = 2, kThreads = 128 * kWGs;
  constexpr int kMFrags = 4 / kWGs, kNTiles = kN / 8, kASets = Cfg::kASets;
  static_assert(kASets == 4, "a register set per k16 step of a 64-wide step");
  // split, solo, fill, split0, solo0: warpgroup 0 issues MMAs, warpgroup 1 runs filler, or one alone.
  constexpr bool kHalves = kMode == kSplit || kMode == kSolo || kMode == kFill || kMode == kSplit0 || kMode == kSolo0;
  constexpr bool kFixedA = kMode == kMma || kMode == kBoth || kMode == kAlu || kMode == kImad || kMode == kFfma ||
                           kMode == kRewrite || kHalves;
  constexpr bool kMmas = kMode != kDeq && kMode != kDecode;
  // B: 128 token rows of 64 bf16 (the 128-byte swizzle's atoms need 1024-byte alignment); A: one
  // step of a 256-row block's prepacked tiles and their scales.
  __shared__ __align__(1024) uint8_t smem_b[128 * 128];
  __shared__ __align__(16) uint8_t smem_a[mxmoe::cuda::kBlockRowGroups * mxmoe::cuda::kTileBytes];
  __shared__ __align__(16) uint8_t smem_s[mxmoe::cuda::kBlockRowGroups * mxmoe::cuda::kTileScaleBytes];
  const int tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3, wgi = tid >> 7;
  // Finite operands: B = 1/64 in bf16, any E2M1 codes, scales 2^-7 (the values do not change the
  // MMAs' timing; they keep the sums finite).
  for (int i = tid; i < static_cast<int>(sizeof(smem_b)) / 2; i += kThreads)
    reinterpret_cast<uint16_t*>(smem_b)[i] = 0x3C80;
  for (int i = tid; i < static_cast<int>(sizeof(smem_a)); i += kThreads) smem_a[i] = static_cast<uint8_t>(i * 37);
  for (int i = tid; i < static_cast<int>(sizeof(smem_s)); i += kThreads) smem_s[i] = 120;
  __syncthreads();

  const uint32_t a_base = ptx::SmemAddr(smem_a), s_base = ptx::SmemAddr(smem_s);
  const uint64_t desc_b = wg::SmemDescK128(ptx::SmemAddr(smem_b), 1024);
  const sm90::PhaseClock clock{};
  uint32_t areg[kASets][kMFrags][4];
  uint32_t fixed[kASets][kMFrags][4];  // rewrite: the sets the MMAs' registers are written from
  uint4 frag_a[kMFrags];
  uint32_t frag_s[kMFrags];
  uint32_t a_off[kMFrags], s_off[kMFrags];
  sm90::StepFragmentOffsets<kMFrags, kWGs>(warp, wgi, lane, true, a_off, s_off);
  auto load_frags = [&](int step) {
    const uint32_t off = static_cast<uint32_t>((step & 1) * args.zero);
    sm90::LoadStepFragments(a_base + off, s_base + off, a_off, s_off, frag_a, frag_s);
  };
  if constexpr (kFixedA) {
    load_frags(0);
    sm90::DequantStep<kMFrags, 0>(frag_a, frag_s, areg[0]);
    sm90::DequantStep<kMFrags, 1>(frag_a, frag_s, areg[1]);
    sm90::DequantStep<kMFrags, 2>(frag_a, frag_s, areg[2]);
    sm90::DequantStep<kMFrags, 3>(frag_a, frag_s, areg[3]);
    if constexpr (kMode == kRewrite) {
#pragma unroll
      for (int k = 0; k < kASets; ++k)
#pragma unroll
        for (int f = 0; f < kMFrags; ++f)
#pragma unroll
          for (int i = 0; i < 4; ++i) fixed[k][f][i] = areg[k][f][i];
    }
  }
  uint32_t x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = static_cast<uint32_t>(tid * (i + 1));

  uint32_t raw[4][kMFrags][4];  // pre: the 64-wide step's decoded words
  float sum = 0.0f;
  uint32_t fold = 0;
  long long t0;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0)::"memory");
  for (int tile = 0; tile < args.tiles; ++tile) {
    float acc[kMFrags][kNTiles][4];
    sm90::ZeroAccumulators(acc);
    if constexpr (kMode == kAhead) {
      load_frags(0);
      sm90::DequantStep<kMFrags, 0>(frag_a, frag_s, areg[0]);
    }
    // k16 step kS of 64-wide step `step` in the mode.
    auto k16 = [&](auto step_constant, int step) {
      constexpr int kS = decltype(step_constant)::value;
      if constexpr (kMode == kStep) {
        sm90::IssueStep<kMFrags, kNTiles, kS, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
      } else if constexpr (kMode == kPair) {
        if constexpr (kS % 2 == 0)
          sm90::IssueStepPair<kMFrags, kNTiles, kS, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
      } else if constexpr (kMode == kAhead) {
        // Set kS + 1 (of 4) is free: at most kS - 1 and kS - 2 are in flight.
        if constexpr (kS < 3) {
          sm90::DequantStep<kMFrags, kS + 1>(frag_a, frag_s, areg[kS + 1]);
        } else {
          load_frags(step + 1);
          sm90::DequantStep<kMFrags, 0>(frag_a, frag_s, areg[0]);
        }
        MmaGroupThenWait<2, kS>(areg[kS], desc_b, acc);
      } else if constexpr (kMode == kSync) {
        sm90::DequantStep<kMFrags, kS>(frag_a, frag_s, areg[kS]);
        ptx::NamedBarrierSync(1, kThreads);
        MmaGroupThenWait<kASets - 1, kS>(areg[kS], desc_b, acc);
      } else if constexpr (kMode == kSyncPair) {
        if constexpr (kS % 2 == 0) {
          sm90::DequantStep<kMFrags, kS>(frag_a, frag_s, areg[kS]);
          sm90::DequantStep<kMFrags, kS + 1>(frag_a, frag_s, areg[kS + 1]);
          ptx::NamedBarrierSync(1, kThreads);
          wg::Fence();
          sm90::IssueMmaGroup<kMFrags, kNTiles, kS>(areg[kS], desc_b, acc);
          sm90::IssueMmaGroup<kMFrags, kNTiles, kS + 1>(areg[kS + 1], desc_b, acc);
          wg::Wait<2>();
        }
      } else if constexpr (kMode == kPre) {
#pragma unroll
        for (int f = 0; f < kMFrags; ++f)
          sm90::ScaleDecoded(raw[kS][f], ptx::ScalePairBf16x2<2 * (kS / 2)>(frag_s[f]), areg[kS][f]);
        MmaGroupThenWait<kASets - 1, kS>(areg[kS], desc_b, acc);
      } else if constexpr (kMode == kWait1 || kMode == kWait0) {
        sm90::DequantStep<kMFrags, kS>(frag_a, frag_s, areg[kS]);
        MmaGroupThenWait<kMode == kWait1 ? 1 : 0, kS>(areg[kS], desc_b, acc);
      } else if constexpr (kHalves) {
        if (wgi == 0 && kMode != kFill) {
          MmaGroupThenWait<(kMode == kSplit0 || kMode == kSolo0) ? 0 : kASets - 1, kS>(areg[kS], desc_b, acc);
        } else if (wgi == 1 && kMode != kSolo && kMode != kSolo0) {
          Filler<kAlu, 32>(x);
        }
      } else if constexpr (kMode == kDeq || kMode == kDecode) {
        uint32_t tmp[kMFrags][4];
        if constexpr (kMode == kDeq) {
          sm90::DequantStep<kMFrags, kS>(frag_a, frag_s, tmp);
        } else {
          DecodeStep<kMFrags, kS>(frag_a, tmp);
        }
        Fold(tmp, fold);
      } else {
        // MMAs on register set kS: dequantized before the loop (kFixedA), or now without scales.
        if constexpr (kMode == kRaw) DecodeStep<kMFrags, kS>(frag_a, areg[kS]);
        if constexpr (kMode == kBoth) {
          uint32_t tmp[kMFrags][4];
          sm90::DequantStep<kMFrags, kS>(frag_a, frag_s, tmp);
          Fold(tmp, fold);
        }
        if constexpr (kMode == kAlu || kMode == kImad || kMode == kFfma) Filler<kMode, kOps>(x);
        if constexpr (kMode == kRewrite) {
#pragma unroll
          for (int f = 0; f < kMFrags; ++f)
#pragma unroll
            for (int i = 0; i < 4; ++i) areg[kS][f][i] = fixed[kS][f][i] ^ static_cast<uint32_t>(args.zero);
        }
        MmaGroupThenWait<kASets - 1, kS>(areg[kS], desc_b, acc);
      }
    };
#pragma unroll 1
    for (int step = 0; step < kSteps; ++step) {
      if constexpr ((!kFixedA || kMode == kBoth) && kMode != kAhead) load_frags(step);
      if constexpr (kMode == kPre) {
        DecodeStep<kMFrags, 0>(frag_a, raw[0]);
        DecodeStep<kMFrags, 1>(frag_a, raw[1]);
        DecodeStep<kMFrags, 2>(frag_a, raw[2]);
        DecodeStep<kMFrags, 3>(frag_a, raw[3]);
      }
#pragma unroll
      for (int f = 0; f < kMFrags; ++f) wg::FenceOperand(acc[f]);
      k16(std::integral_constant<int, 0>{}, step);
      k16(std::integral_constant<int, 1>{}, step);
      k16(std::integral_constant<int, 2>{}, step);
      k16(std::integral_constant<int, 3>{}, step);
    }
    if constexpr (kMmas) {
      wg::Wait<0>();
#pragma unroll
      for (int f = 0; f < kMFrags; ++f) wg::FenceOperand(acc[f]);
#pragma unroll
      for (int f = 0; f < kMFrags; ++f)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) sum += acc[f][nt][0] + acc[f][nt][3];
    }
  }
  long long t1;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1)::"memory");
  // Each warpgroup's own time, the larger kept (split, solo, fill: the two do different work).
  if (tid % 128 == 0) atomicMax(&args.cycles[blockIdx.x], static_cast<unsigned long long>(t1 - t0));
#pragma unroll
  for (int i = 0; i < 8; ++i) fold ^= x[i];
  if (sum != sum || fold == 0x7F7F7F7Fu) args.sink[0] = sum + static_cast<float>(fold);
#else
  __trap();  // SM90 only
#endif
}

void Check(cudaError_t e, const char* what) { mxmoe::bench::CheckCuda("mxmoe_wgmma_probe", e, what); }
using mxmoe::bench::Median;

struct Row {
  int width;
  int mode;
  int ops;
  void (*kernel)(ProbeArgs);
};

// One row per mode (no filler operations), and one per filler count of a filler mode.
template <int kN, int... kModes>
void AddModes(std::vector<Row>& rows) {
  (rows.push_back({kN, kModes, 0, ProbeKernel<kN, kModes, 0>}), ...);
}
template <int kN, int kMode, int... kOps>
void AddFillers(std::vector<Row>& rows) {
  (rows.push_back({kN, kMode, kOps, ProbeKernel<kN, kMode, kOps>}), ...);
}

template <int kN>
void AddWidth(std::vector<Row>& rows) {
  AddModes<kN, kMma, kStep, kPair, kAhead, kRaw, kBoth, kRewrite, kPre, kWait1, kWait0, kSplit, kSolo, kFill, kSync,
           kSyncPair, kSplit0, kSolo0>(rows);
  AddFillers<kN, kAlu, 8, 16, 32>(rows);
  AddFillers<kN, kImad, 16>(rows);
  AddFillers<kN, kFfma, 16>(rows);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10, tiles = 40;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) {
      tiles = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: mxmoe_wgmma_probe [--reps N] [--tiles N]\n");
      return 2;
    }
  }
  int device = 0, sms = 0;
  Check(cudaGetDevice(&device), "device");
  Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device), "device properties");
  unsigned long long* cycles = nullptr;
  float* sink = nullptr;
  Check(cudaMalloc(&cycles, sms * sizeof(unsigned long long)), "allocating the cycle counts");
  Check(cudaMalloc(&sink, sizeof(float)), "allocating the sink");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");

  std::vector<Row> rows;
  // Without MMAs the width does not matter: printed as 0.
  rows.push_back({0, kDeq, 0, ProbeKernel<16, kDeq, 0>});
  rows.push_back({0, kDecode, 0, ProbeKernel<16, kDecode, 0>});
  AddWidth<32>(rows);
  AddWidth<64>(rows);
  AddWidth<80>(rows);
  AddWidth<128>(rows);

  std::printf("command: mxmoe_wgmma_probe --reps %d --tiles %d (%s, %d SMs; %d CTAs, %d steps a tile)\n", reps, tiles,
              prop.name, sms, sms, kSteps);
  std::printf("%6s %6s %4s %10s %9s %12s %12s %7s\n", "width", "mode", "ops", "us", "TFLOP/s", "clk/k16", "ideal clk",
              "%pipe");
  for (const Row& row : rows) {
    std::vector<float> us;
    std::vector<unsigned long long> per_cta(sms);
    std::vector<double> clk;
    for (int r = -2; r < reps; ++r) {
      Check(cudaMemset(cycles, 0, sms * sizeof(unsigned long long)), "zeroing the cycle counts");
      Check(cudaEventRecord(e0), "record");
      row.kernel<<<sms, 256>>>(ProbeArgs{tiles, 0, cycles, sink});
      Check(cudaEventRecord(e1), "record");
      Check(cudaEventSynchronize(e1), "probe kernel");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      if (r < 0) continue;
      us.push_back(ms * 1e3f);
      Check(cudaMemcpy(per_cta.data(), cycles, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
            "cycle counts");
      clk.push_back(static_cast<double>(Median(per_cta)) / (static_cast<double>(tiles) * kSteps * 4));
    }
    const double t = Median(us);
    const double flop = 2.0 * kRows * row.width * 64 * kSteps * static_cast<double>(tiles) * sms;
    const double per_k16 = Median(clk);
    // Per k16 step: the block's 4 m64 MMAs of 64 x width x 16.
    const double ideal = 2.0 * kRows * row.width * 16 / kFlopPerSmCycle;
    std::printf("%6d %6s %4d %10.1f %9.1f %12.1f %12.1f %6.1f%%\n", row.width, kModeNames[row.mode], row.ops, t,
                flop / t / 1e6, per_k16, ideal, 100.0 * ideal / per_k16);
  }
  return 0;
}
