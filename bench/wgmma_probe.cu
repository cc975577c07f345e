// mxmoe_wgmma_probe: how fast the wgmma consumers' main loop can run on this GPU with its copies
// taken out. Each CTA is wg128d3x3's two consumer warpgroups (moe_wgmma.cuh), or four of one MMA
// each (wg128q's split; column "wgs"), on one fixed stage already in shared memory: per 64-wide
// reduction step they read their A pieces and scales, then dequantize and issue the step's four
// k16 MMA groups with the kernel's own functions (IssueStep, or IssueStepPair), and nothing waits
// for a copy or a barrier. "mma" issues the same MMA groups on A registers dequantized once, before
// the loop: the tensor pipe's rate for this MMA shape. Comparing a width's "step" row with its
// "mma" row says what the dequantization costs; comparing the layer's main loop (perf-log, phases)
// with "step" says what the copies and barriers cost.
//   mxmoe_wgmma_probe [--reps N] [--tiles N]
// Prints the command, then one row per (width, mode, wgs): µs, TFLOP/s (real FLOP: 256 rows x
// width x 64 x steps), cycles per k16 step of the CTA (median over CTAs), and the tensor pipe's
// share: the cycles the step's four m64 MMAs take at the SM's dense bf16 rate (4096 FLOP per
// cycle: 989.4 TFLOP/s over 132 SMs at 1830 MHz, the H100 / H200 data sheets' peak) over the
// cycles measured.
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
enum Mode : int { kMma = 0, kStep = 1, kPair = 2 };
const char* const kModeNames[] = {"mma", "step", "pair"};

struct ProbeArgs {
  int tiles;          // tiles per CTA, kSteps steps each
  long long* cycles;  // per CTA: clock64 cycles of consumer thread 0 over all tiles
  float* sink;        // written only if the accumulators' sum is a NaN (keeps them live)
};

// kWGs consumer warpgroups share the block's 256 rows: kMFrags = 4 / kWGs m64 MMAs each per k16
// step (2: wg128d3x3's split; 4: one MMA each, twice the warps dequantizing).
template <int kN, int kMode, int kWGs>
__global__ void __launch_bounds__(128 * kWGs, 1) ProbeKernel(const ProbeArgs args) {
#if MXMOE_WGMMA_AVAILABLE
  constexpr int kThreads = 128 * kWGs;
  constexpr int kMFrags = 4 / kWGs, kNTiles = kN / 8, kASets = Cfg::kASets;
  static_assert(kASets == 4, "a register set per k16 step of a 64-wide step");
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
  uint4 frag_a[kMFrags];
  uint32_t frag_s[kMFrags];
  auto load_frags = [&] {
    sm90::LoadStepFragments<kMFrags, kWGs>(a_base, s_base, warp, wgi, lane, true, frag_a, frag_s);
  };
  if constexpr (kMode == kMma) {
    load_frags();
    sm90::DequantStep<kMFrags, 0>(frag_a, frag_s, areg[0]);
    sm90::DequantStep<kMFrags, 1>(frag_a, frag_s, areg[1]);
    sm90::DequantStep<kMFrags, 2>(frag_a, frag_s, areg[2]);
    sm90::DequantStep<kMFrags, 3>(frag_a, frag_s, areg[3]);
  }

  float sum = 0.0f;
  const long long t0 = clock64();
  for (int tile = 0; tile < args.tiles; ++tile) {
    float acc[kMFrags][kNTiles][4];
    sm90::ZeroAccumulators(acc);
#pragma unroll 1
    for (int step = 0; step < kSteps; ++step) {
      if constexpr (kMode != kMma) load_frags();
#pragma unroll
      for (int f = 0; f < kMFrags; ++f) wg::FenceOperand(acc[f]);
      if constexpr (kMode == kMma) {
        wg::Fence();
        sm90::IssueMmaGroup<kMFrags, kNTiles, 0>(areg[0], desc_b, acc);
        wg::Wait<kASets - 1>();
        sm90::IssueMmaGroup<kMFrags, kNTiles, 1>(areg[1], desc_b, acc);
        wg::Wait<kASets - 1>();
        sm90::IssueMmaGroup<kMFrags, kNTiles, 2>(areg[2], desc_b, acc);
        wg::Wait<kASets - 1>();
        sm90::IssueMmaGroup<kMFrags, kNTiles, 3>(areg[3], desc_b, acc);
        wg::Wait<kASets - 1>();
      } else if constexpr (kMode == kStep) {
        sm90::IssueStep<kMFrags, kNTiles, 0, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
        sm90::IssueStep<kMFrags, kNTiles, 1, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
        sm90::IssueStep<kMFrags, kNTiles, 2, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
        sm90::IssueStep<kMFrags, kNTiles, 3, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
      } else {
        sm90::IssueStepPair<kMFrags, kNTiles, 0, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
        sm90::IssueStepPair<kMFrags, kNTiles, 2, kASets>(frag_a, frag_s, areg, desc_b, acc, clock);
      }
    }
    wg::Wait<0>();
#pragma unroll
    for (int f = 0; f < kMFrags; ++f) wg::FenceOperand(acc[f]);
#pragma unroll
    for (int f = 0; f < kMFrags; ++f)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) sum += acc[f][nt][0] + acc[f][nt][3];
  }
  const long long t1 = clock64();
  if (tid == 0) args.cycles[blockIdx.x] = t1 - t0;
  if (sum != sum) args.sink[0] = sum;
#else
  __trap();  // SM90 only
#endif
}

void Check(cudaError_t e, const char* what) { mxmoe::bench::CheckCuda("mxmoe_wgmma_probe", e, what); }
using mxmoe::bench::Median;

struct Row {
  int width;
  int mode;
  int wgs;
  void (*kernel)(ProbeArgs);
};

template <int kN>
void AddWidth(std::vector<Row>& rows) {
  rows.push_back({kN, kMma, 2, ProbeKernel<kN, kMma, 2>});
  rows.push_back({kN, kStep, 2, ProbeKernel<kN, kStep, 2>});
  rows.push_back({kN, kPair, 2, ProbeKernel<kN, kPair, 2>});
  rows.push_back({kN, kStep, 4, ProbeKernel<kN, kStep, 4>});
  rows.push_back({kN, kPair, 4, ProbeKernel<kN, kPair, 4>});
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
  long long* cycles = nullptr;
  float* sink = nullptr;
  Check(cudaMalloc(&cycles, sms * sizeof(long long)), "allocating the cycle counts");
  Check(cudaMalloc(&sink, sizeof(float)), "allocating the sink");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");

  std::vector<Row> rows;
  AddWidth<16>(rows);
  AddWidth<32>(rows);
  AddWidth<48>(rows);
  AddWidth<64>(rows);
  AddWidth<80>(rows);
  AddWidth<96>(rows);
  AddWidth<112>(rows);
  AddWidth<128>(rows);

  std::printf("command: mxmoe_wgmma_probe --reps %d --tiles %d (%s, %d SMs; %d CTAs, %d steps a tile)\n", reps, tiles,
              prop.name, sms, sms, kSteps);
  std::printf("%6s %5s %4s %10s %9s %12s %12s %7s\n", "width", "mode", "wgs", "us", "TFLOP/s", "clk/k16", "ideal clk",
              "%pipe");
  for (const Row& row : rows) {
    std::vector<float> us;
    std::vector<long long> per_cta(sms);
    std::vector<double> clk;
    for (int r = -2; r < reps; ++r) {
      Check(cudaEventRecord(e0), "record");
      row.kernel<<<sms, 128 * row.wgs>>>(ProbeArgs{tiles, cycles, sink});
      Check(cudaEventRecord(e1), "record");
      Check(cudaEventSynchronize(e1), "probe kernel");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      if (r < 0) continue;
      us.push_back(ms * 1e3f);
      Check(cudaMemcpy(per_cta.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost), "cycle counts");
      clk.push_back(static_cast<double>(Median(per_cta)) / (static_cast<double>(tiles) * kSteps * 4));
    }
    const double t = Median(us);
    const double flop = 2.0 * kRows * row.width * 64 * kSteps * static_cast<double>(tiles) * sms;
    const double per_k16 = Median(clk);
    // Per k16 step: the block's 4 m64 MMAs of 64 x width x 16.
    const double ideal = 2.0 * kRows * row.width * 16 / kFlopPerSmCycle;
    std::printf("%6d %5s %4d %10.1f %9.1f %12.1f %12.1f %6.1f%%\n", row.width, kModeNames[row.mode], row.wgs, t,
                flop / t / 1e6, per_k16, ideal, 100.0 * ideal / per_k16);
  }
  return 0;
}
