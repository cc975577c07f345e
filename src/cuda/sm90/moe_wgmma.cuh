// The grouped GEMMs of the MoE on SM90 with warpgroup MMA (wgmma, HGMMA in SASS): the same
// tiles, routing and fused epilogues as the mma.sync kernels (moe_gemm.cuh), with the copies done
// by the copy engine (TMA) and the tensor work issued asynchronously, so that dequantizing the next
// weights overlaps the current products.
//
// Formulation ("swapped AB", as in moe_gemm.cuh): M = weight rows, N = tokens. A CTA computes 256
// weight rows (wg128h: 128, half a prepacked block) x BLOCK_N tokens of one expert over the whole
// reduction, in 64-wide steps; its MMAs are as wide as the tile's valid tokens rounded up to a
// multiple of 8 (TileWidth).
// Warp-specialized, three warpgroups (wg128h: the two consumers only, consumer thread 0 issuing the
// producer's copies between its MMAs; ConsumeTile):
//   producer (warpgroup 0, one warp busy, few registers): per stage (kStepsPerStage steps), into a
//     free one, the block's prepacked MXFP4 tiles and scales of those steps with two 1D bulk
//     copies (contiguous in weight_layout.h), and per step the token rows of 64 bf16 through a
//     tensor map with the 128-byte swizzle (one box of BLOCK_N rows, or for tiles up to 32 wide
//     one 8-row box per 8 tokens).
//     The rows are the tile's sorted positions: FC2's intermediate is written in that order, and
//     for FC1 the tokens are gathered into it first (LaunchGatherRows). All complete on the
//     stage's "full" mbarrier.
//   2 consumers (warpgroups 1, 2): each owns 128 of the 256 rows (kMFrags = 2 m64 MMAs per k16
//     step; wg128h: 64 of 128, one MMA). Per k16 step a consumer dequantizes its A fragments from
//     shared memory into registers (the "RS" form of wgmma: mma.m16n8k16's A fragment), fences,
//     issues its MMAs as one group and waits until at most kInFlight groups are in flight. At the
//     end of a stage's first step the stage before has no MMA left: it goes back to the producer
//     through the "empty" mbarrier.
// Warp w of consumer wg supplies row group 4 w + 2 wg + f (wg128h: 2 w + wg) as the rows of its MMA
// f (FragRowGroup, epilogue.cuh);
// FC1's epilogue re-arranges the tile through the stages' shared memory (StageFc1).
//
// Why bulk copies: cp.async writes shared memory through the generic proxy, which wgmma may read
// only after a fence.proxy.async in each writing thread, and that fence (MEMBAR in SASS) waits for
// all the thread's copies in flight (docs/perf-log.md, v2). Gathering FC1's tokens inside the
// kernel (a box per row, then cp.async from producer warps) left FC1 at a third of FC2's rate
// (v3, v4): the gather is a separate pass now.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/ptx.cuh"
#include "cuda/sm90/dequant.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/phase_timing.cuh"
#include "cuda/sm90/stage_ring.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tile_loader.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/weight_layout.h"

// MMAs up to this wide dequantize two k16 steps before issuing them (IssueStepPair); 0: none. 64:
// on an H100, layers 1-4% faster at T = 2048 on the three benchmark shapes and at T = 1024 on
// GPT-OSS-120B and DeepSeek-V3 (Kimi-K3 runs n32 there), a tie at 4096 (perf-log v28; 128 within 2%
// of 64, and 80 and 128 within -2.5% .. +1.9% of 64 in v31).
#ifndef MXMOE_DEQUANT_PAIRS_WIDTH
#define MXMOE_DEQUANT_PAIRS_WIDTH 64
#endif

namespace mxmoe::cuda::sm90 {

// ---- config -----------------------------------------------------------------------------------
// kInFlight: MMA groups (one k16 step of a consumer warpgroup) left in flight while the next step is
// dequantized, 1 or 3 (kInFlight + 1 register sets for A, indexed by the step within a 64-wide
// stage).
// kCtasPerSm: CTAs per SM the registers are split for (launch bounds and setmaxnreg); 2 only for
// narrow tiles, whose accumulators fit the consumers' smaller share.
// kStepsPerStage: 64-wide reduction steps per stage, loaded together (one bulk copy each for the
// weights and scales of all of them). The copies per step cost time of their own: one more per
// step, with the same bytes, made Kimi-K3's layer ~2.5% slower at T = 4096 (perf-log v14).
// kRowGroups: the CTA's row groups, a whole block (kBlockRowGroups, 256 rows) or half of one (wg128h:
// 128 rows, one m64 MMA per consumer, so that two CTAs share an SM and one's epilogue overlaps the
// other's main loop).
template <int kBlockN_, int kStages_, int kInFlight_ = 1, int kCtasPerSm_ = 1, int kStepsPerStage_ = 1,
          int kRowGroups_ = kBlockRowGroups>
struct WgmmaConfig {
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static constexpr int kStepsPerStage = kStepsPerStage_;
  static constexpr int kRowGroups = kRowGroups_;
  static constexpr int kSplit = kBlockRowGroups / kRowGroups;  // CTAs per row block
  static constexpr int kIdx = kRowGroups * 8;                    // FC1: the CTA's intermediates
  static constexpr int kConsumers = 2;                           // consumer warpgroups
  // The producer: a warpgroup of its own (one warp busy) whose registers setmaxnreg hands to the
  // consumers; or, for half blocks, none: consumer thread 0 issues the copies between its MMAs
  // (ConsumeTile), and no setmaxnreg. ptxas compiles a kernel within its launch bound: two CTAs of 384
  // threads per SM allow 80 registers, and ptxas refused the m64n128 MMA with its operands in them;
  // with a producer warp (288 threads) it got 96 and serialized every wgmma (C7512: each HGMMA
  // followed by a wait for none in flight); 256 threads get 128.
  static constexpr bool kInlineProducer = kRowGroups < kBlockRowGroups;
  static constexpr int kThreads = 128 * kConsumers + (kInlineProducer ? 0 : 128);
  static constexpr int kMFrags = kRowGroups / 4 / kConsumers;  // m64 MMAs per consumer and k16 step
  static constexpr int kBlockM = kRowGroups * kTileRows;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kStages = kStages_;
  static constexpr int kInFlight = kInFlight_;
  static constexpr int kASets = kInFlight + 1;
  // A stage: the B tiles of its steps first (the swizzle atoms need 1024-byte alignment), then the
  // A tiles of its steps, then their scales (each as laid out in global memory, step after step).
  static constexpr int kSubB = kBlockN * 128;
  static constexpr int kSubA = kRowGroups * kTileBytes;
  static constexpr int kSubScales = kRowGroups * kTileScaleBytes;
  static constexpr int kSmemStage = (kStepsPerStage * (kSubB + kSubA + kSubScales) + 1023) / 1024 * 1024;
  static constexpr int kSmemBars = 2 * kStages * 8;
  // Dynamic shared memory is only 16-byte aligned: 1 KB of slack to align the stages.
  static constexpr int kSmemBytes = 1024 + kStages * kSmemStage + kSmemBars;
  // NOTE: setmaxnreg moves registers between the warpgroups of the CTA, which got kLaunchRegs per
  // thread at launch: what ptxas allows under the launch bounds, each of the SM's 4 sub-partitions
  // (16 K registers) holding its share of the resident warps, rounded up, in steps of 8 (it gave 168
  // for one CTA of 384 threads, 80 for two, 96 for two of 288). One CTA per SM:
  // 128 x 40 + 256 x 232 = 384 x 168 = 64512; two, 128 x 40 + 256 x 96 <= 384 x 80. Without producer
  // threads every thread keeps the launch's share: two CTAs of 256 threads, 128 each.
  static constexpr int kLaunchRegs = 16384 / ((kCtasPerSm * kThreads / 32 + 3) / 4 * 32) / 8 * 8;
  static constexpr int kProducerRegs = kInlineProducer ? 0 : 40;  // (0: no producer threads)
  static constexpr int kConsumerRegs =
      kInlineProducer ? kLaunchRegs : (kLaunchRegs * kThreads - 128 * kProducerRegs) / (128 * kConsumers) / 8 * 8;

  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 128, "wgmma N: a multiple of 8 (<= 128 here)");
  static_assert(kStages >= 2 && kStages <= 8, "stages");
  static_assert(!kInlineProducer || kStages >= 3, "ConsumeTile's copies keep kStages - 2 slots ahead");
  static_assert(kStepsPerStage >= 1 && kStepsPerStage <= 3, "reduction steps per stage");
  static_assert(kASets == 2 || kASets == 4, "A register sets: a divisor of the 4 k16 steps of a stage");
  static_assert(kSmemBytes <= 227 * 1024, "SM90 shared memory per block");
  static_assert(kRowGroups == kBlockRowGroups || kRowGroups == kBlockRowGroups / 2, "whole or half blocks");
  static_assert(kFc1StagedBytes<kBlockN, kIdx> <= kStages * kSmemStage, "FC1's epilogue reuses the stages");
  static_assert(kInlineProducer || 128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= kLaunchRegs * kThreads,
                "setmaxnreg");
  // A consumer thread holds its accumulators (kBlockN / 2 per m64 MMA), the kASets A register sets
  // and one step's A pieces and scale words; ptxas needs the rest of its budget for addresses.
  static_assert(kConsumerRegs <= 256 &&
                    kConsumerRegs > kMFrags * (kBlockN / 2 + 4 * kASets + 4 + 1),
                "the consumers' registers hold their accumulators and A operands");
  // 228 KB of shared memory per SM, of which the driver keeps 1 KB per CTA.
  static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024, "kCtasPerSm CTAs' shared memory on one SM");
};

// ---- device pieces ----------------------------------------------------------------------------
// This warp's dequantized A fragments of k16 step ks for its kMFrags row groups (bf16x2 registers
// in mma.m16n8k16 A order, PTX ISA 9.7.14.5.8: rows g / g + 8, k 2c..2c+1 / 2c+8..2c+9).
template <int kMFrags, int kStep>
__device__ __forceinline__ void DequantStep(const uint4 (&frag_a)[kMFrags], const uint32_t (&frag_s)[kMFrags],
                                            uint32_t (&a)[kMFrags][4]) {
  constexpr int kHalf = kStep / 2;  // the 32-block of the 64-wide step
#pragma unroll
  for (int f = 0; f < kMFrags; ++f)
    DequantWord(WordOf(frag_a[f], kStep), ptx::ScalePairBf16x2<2 * kHalf>(frag_s[f]), a[f]);
}

// Where this thread's A pieces and scale words lie within a step's tiles, for its kMFrags row
// groups: computed once a tile. A padding warp (active false) reads a real row group's instead
// (row group f: rows are padded to 64, so a CTA that runs has at least 4): its MMAs' results are
// never staged or stored, and the step's loads need no predicate or zeroing (perf-log v29).
template <int kMFrags, int kWGs>
__device__ __forceinline__ void StepFragmentOffsets(int warp, int wg, int lane, bool active, uint32_t (&a_off)[kMFrags],
                                                    uint32_t (&s_off)[kMFrags]) {
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    const int group = active ? FragRowGroup<kMFrags, kWGs>(warp, wg, f) : f;
    a_off[f] = group * kTileBytes + lane * 16;
    s_off[f] = group * kTileScaleBytes + (lane >> 2) * 4;
  }
}

// This thread's A pieces and scale words of one 64-wide step (the step's prepacked tiles at shared
// address a_addr, their scales at s_addr) at the offsets of StepFragmentOffsets.
template <int kMFrags>
__device__ __forceinline__ void LoadStepFragments(uint32_t a_addr, uint32_t s_addr, const uint32_t (&a_off)[kMFrags],
                                                  const uint32_t (&s_off)[kMFrags], uint4 (&frag_a)[kMFrags],
                                                  uint32_t (&frag_s)[kMFrags]) {
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    frag_a[f] = ptx::LdShared128(a_addr + a_off[f]);
    frag_s[f] = ptx::LdShared32(s_addr + s_off[f]);
  }
}

// The warpgroup's MMAs of k16 step kStep on dequantized register set `a`, committed as one group.
template <int kMFrags, int kNTiles, int kStep>
__device__ __forceinline__ void IssueMmaGroup(const uint32_t (&a)[kMFrags][4], uint64_t desc_b,
                                              float (&acc)[kMFrags][kNTiles][4]) {
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) wgmma::WgmmaBf16Rs(acc[f], a[f], wgmma::AdvanceDesc(desc_b, kStep * 32));
  wgmma::Commit();
}

// Dequantize k16 step kStep into register set kStep % kASets, then issue the warpgroup's MMAs on it.
template <int kMFrags, int kNTiles, int kStep, int kASets>
__device__ __forceinline__ void IssueStep(const uint4 (&frag_a)[kMFrags], const uint32_t (&frag_s)[kMFrags],
                                          uint32_t (&areg)[kASets][kMFrags][4], uint64_t desc_b,
                                          float (&acc)[kMFrags][kNTiles][4], const PhaseClock& clock) {
  DequantStep<kMFrags, kStep>(frag_a, frag_s, areg[kStep % kASets]);
  wgmma::Fence();
  IssueMmaGroup<kMFrags, kNTiles, kStep>(areg[kStep % kASets], desc_b, acc);
  // At most kASets - 1 groups stay in flight: the register set the next step writes (that of the
  // group kASets - 1 before it) is free again, and at the end of a step (4 groups, kASets <= 4)
  // every MMA of the step before has finished reading its stage.
  clock.TimeMmaWait([] { wgmma::Wait<kASets - 1>(); });
}

// Steps kStep and kStep + 1 (kStep even) dequantized together into register sets kStep and
// kStep + 1 of four, then both MMA groups issued: twice the independent instructions per
// dequantization, at most 2 groups in flight while it runs. After the wait only this pair's groups
// are in flight, so the next pair's register sets are free. Used for MMAs up to
// MXMOE_DEQUANT_PAIRS_WIDTH wide (perf-log v27).
template <int kMFrags, int kNTiles, int kStep, int kASets>
__device__ __forceinline__ void IssueStepPair(const uint4 (&frag_a)[kMFrags], const uint32_t (&frag_s)[kMFrags],
                                              uint32_t (&areg)[kASets][kMFrags][4], uint64_t desc_b,
                                              float (&acc)[kMFrags][kNTiles][4], const PhaseClock& clock) {
  static_assert(kStep % 2 == 0 && kASets == 4, "pairs of steps in four register sets");
  DequantStep<kMFrags, kStep>(frag_a, frag_s, areg[kStep]);
  DequantStep<kMFrags, kStep + 1>(frag_a, frag_s, areg[kStep + 1]);
  wgmma::Fence();
  IssueMmaGroup<kMFrags, kNTiles, kStep>(areg[kStep], desc_b, acc);
  IssueMmaGroup<kMFrags, kNTiles, kStep + 1>(areg[kStep + 1], desc_b, acc);
  clock.TimeMmaWait([] { wgmma::Wait<2>(); });
}

// What a consumer thread needs besides its tile width (ConsumerArgsOf).
struct ConsumerArgs {
  int k_tiles, warp, wg, lane;
  bool active;  // the warp's row groups are real, not padding
  int slot0;    // the pipeline slot of the tile's first reduction steps (stage slot0 % kStages)
  int groups;   // the CTA's real row groups (block or half): a stage's steps are groups * kTileBytes apart
};

// Rows are padded to 64, so a warp's row groups (4 consecutive with the other consumer's) are all
// real or all padding. Padding warps still take part in the warpgroup's MMAs (they are
// collective), on zeros.
template <class Cfg>
__device__ __forceinline__ ConsumerArgs ConsumerArgsOf(int k_tiles, int warp, int wg, int lane, int slot0,
                                                       int groups) {
  return {k_tiles, warp, wg, lane, FragRowGroup<Cfg::kMFrags, Cfg::kConsumers>(warp, wg, 0) < groups, slot0, groups};
}

// A consumer warpgroup's main loop over a tile at MMA width kN, then tail(acc) with the finished
// accumulators. Every stage it read is handed back to the producer, the last one too (a persistent
// CTA's next tile reuses it).
// Configs without producer threads (kInlineProducer) pass the tile's copies, which thread 0
// (consumer 0, warp 0, lane 0) issues with TileCopies::IssueFirst and Refill<2>: the stage of slot
// i - 2 is refilled at the start of slot i, a slot after its MMAs were done (a producer would have
// refilled it then: one slot more in flight).
template <class Cfg, int kN, class Tail>
__device__ __forceinline__ void ConsumeTile(const StageMap<Cfg>& sm, const ConsumerArgs& c,
                                            const TileCopies<Cfg>* copies, const Tail& tail) {
  constexpr int kMFrags = Cfg::kMFrags, kNTiles = kN / 8;
  // (Pairs need four register sets: with one group in flight, kASets == 2, step by step.)
  constexpr bool kPairs = kN <= MXMOE_DEQUANT_PAIRS_WIDTH && Cfg::kASets == 4;
  float acc[kMFrags][kNTiles][4];
  ZeroAccumulators(acc);
  uint32_t areg[Cfg::kASets][kMFrags][4];

  const int slots = SlotsOf<Cfg>(c.k_tiles);
  const uint32_t a_step = c.groups * kTileBytes, s_step = c.groups * kTileScaleBytes;
  const bool issues_copies = Cfg::kInlineProducer && c.wg == 0 && c.warp == 0 && c.lane == 0;
  uint32_t a_off[kMFrags], s_off[kMFrags];
  StepFragmentOffsets<kMFrags, Cfg::kConsumers>(c.warp, c.wg, c.lane, c.active, a_off, s_off);
  if constexpr (Cfg::kInlineProducer) {
    if (issues_copies) copies->IssueFirst(slots, 0);
  }
  for (int i = 0; i < slots; ++i) {
    const int slot = c.slot0 + i;
    const int s = slot % Cfg::kStages;
    const int steps = min(Cfg::kStepsPerStage, c.k_tiles - i * Cfg::kStepsPerStage);
    if constexpr (Cfg::kInlineProducer) {
      if (issues_copies) copies->template Refill<2>(i, slots, 0);
    }
    sm.WaitLoaded(slot);
#pragma unroll 1
    for (int j = 0; j < steps; ++j) {
      uint4 frag_a[kMFrags];
      uint32_t frag_s[kMFrags];
      LoadStepFragments(sm.A(s) + j * a_step, sm.Scales(s) + j * s_step, a_off, s_off, frag_a, frag_s);
      // NOTE: B rows are 128 bytes and 8-row atoms 1024 bytes apart (the stride-dimension offset).
      const uint64_t desc_b = wgmma::SmemDescK128(sm.B(s, j), 1024);
#pragma unroll
      for (int f = 0; f < kMFrags; ++f) wgmma::FenceOperand(acc[f]);
      if constexpr (kPairs) {
        IssueStepPair<kMFrags, kNTiles, 0, Cfg::kASets>(frag_a, frag_s, areg, desc_b, acc, sm.clock);
        IssueStepPair<kMFrags, kNTiles, 2, Cfg::kASets>(frag_a, frag_s, areg, desc_b, acc, sm.clock);
      } else {
        IssueStep<kMFrags, kNTiles, 0, Cfg::kASets>(frag_a, frag_s, areg, desc_b, acc, sm.clock);
        IssueStep<kMFrags, kNTiles, 1, Cfg::kASets>(frag_a, frag_s, areg, desc_b, acc, sm.clock);
        IssueStep<kMFrags, kNTiles, 2, Cfg::kASets>(frag_a, frag_s, areg, desc_b, acc, sm.clock);
        IssueStep<kMFrags, kNTiles, 3, Cfg::kASets>(frag_a, frag_s, areg, desc_b, acc, sm.clock);
      }
      // Every MMA of the slot before has completed: its stage is free.
      if (j == 0 && i > 0 && c.lane == 0) wgmma::MbarArrive(sm.Empty((slot - 1) % Cfg::kStages));
    }
  }
  wgmma::Wait<0>();
  sm.clock.MainEnd();
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) wgmma::FenceOperand(acc[f]);
  if (slots > 0 && c.lane == 0) wgmma::MbarArrive(sm.Empty((c.slot0 + slots - 1) % Cfg::kStages));
  tail(acc);
}

// ConsumeTile at the tile's width (uniform over the CTA), one instantiation per width (those of
// TileWidth<..., kCoarse>).
template <class Cfg, int kN = 8, bool kCoarse = false, class Tail>
__device__ __forceinline__ void ConsumeTileOfWidth(int width, const StageMap<Cfg>& sm, const ConsumerArgs& c,
                                                   const TileCopies<Cfg>* copies, const Tail& tail) {
  if constexpr (kN >= Cfg::kBlockN) {
    ConsumeTile<Cfg, Cfg::kBlockN>(sm, c, copies, tail);
  } else {
    if (width <= kN) ConsumeTile<Cfg, kN>(sm, c, copies, tail);
    else ConsumeTileOfWidth<Cfg, NextWidth<kCoarse>(kN), kCoarse>(width, sm, c, copies, tail);
  }
}

// The MMA width of an accumulator array float[kMFrags][kNTiles][4], as a constant (for the tails).
template <class Acc>
inline constexpr int kAccTiles = std::extent_v<std::remove_reference_t<Acc>, 1>;

// The producer's copies of one tile (one thread of warp 0 issues them; the whole warp waits for each
// stage to be free). Slots are numbered from slot0 as in ConsumerArgs.
template <class Cfg>
__device__ __forceinline__ void ProduceTile(const GemmParams& p, const TileCoords& tc, const StageMap<Cfg>& sm,
                                            const CUtensorMap* map_wide, const CUtensorMap* map_narrow, int groups,
                                            int width, int k_tiles, int slot0, int lane) {
  const TileCopies<Cfg> copies(p, tc, sm, map_wide, map_narrow, groups, width, k_tiles);
  const int slots = SlotsOf<Cfg>(k_tiles);
  for (int i = 0; i < slots; ++i) {
    const int slot = slot0 + i;
    sm.WaitFree(slot);
    if (lane == 0) copies.Issue(i, slot % Cfg::kStages);
  }
}

// ---- kernel -----------------------------------------------------------------------------------
// p.b (rows in sorted order) through two tensor maps, boxes of 64 columns x BLOCK_N rows (wide) and
// x 8 rows (narrow).
template <class Cfg, bool kFc1>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    MoeWgmmaKernel(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_wide,
                   const __grid_constant__ CUtensorMap map_narrow) {
#if MXMOE_WGMMA_AVAILABLE
  extern __shared__ uint8_t smem_raw[];
  const StageMap<Cfg> sm{(ptx::SmemAddr(smem_raw) + 1023u) & ~1023u};
  float* staged = reinterpret_cast<float*>(smem_raw + (sm.base - ptx::SmemAddr(smem_raw)));

  // role 0: the producer's warpgroup (none with kInlineProducer); 1 + wg: consumer wg.
  const int tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3;
  const int role = Cfg::kInlineProducer ? 1 + (tid >> 7) : tid >> 7;
  if (tid == 0) {
    InitStageBarriers(sm, Cfg::kConsumers * 4);  // one arrival per consumer warp
    wgmma::FenceMbarInit();
  }
  ptx::EnterPipelineKernel();
  TileCoords tc;
  // B rows are the tile's sorted positions for both GEMMs: no per-column row table.
  // (ReadTile ends with a barrier.)
  if (!ReadTile<Cfg::kBlockN, kFc1, Cfg::kSplit>(p, blockIdx.x, tid, Cfg::kThreads, nullptr, &tc)) return;
  const int k_tiles = static_cast<int>(p.a_shape.col_tiles);
  const int groups = GroupsOf<Cfg::kSplit>(p, tc);
  if (groups == 0) return;  // the second half of a last block that has none (uniform over the CTA)
  const int width = TileWidth<Cfg::kBlockN>(tc.n_valid);

  if constexpr (!Cfg::kInlineProducer) {
    if (role == 0) {
      // ---- producer ----
      wgmma::RegDealloc<Cfg::kProducerRegs>();
      if (warp == 0) {
        sm.clock.Start();
        ProduceTile(p, tc, sm, &map_wide, &map_narrow, groups, width, k_tiles, 0, lane);
        RecordProducerPhases<kFc1>(sm.clock, lane == 0);
      }
      return;
    }
  }

  // ---- consumers ----
  if constexpr (!Cfg::kInlineProducer) wgmma::RegAlloc<Cfg::kConsumerRegs>();
  sm.clock.Start();
  const int wg = role - 1;
  const ConsumerArgs c = ConsumerArgsOf<Cfg>(k_tiles, warp, wg, lane, 0, groups);
  const auto tail = [&](const auto& acc) {
    constexpr int kNTiles = kAccTiles<decltype(acc)>;
    if constexpr (kFc1) {
      // The stages become the staging planes once both consumers' MMAs are done with them (every
      // load has landed: the consumers waited for all of them).
      ptx::NamedBarrierSync(kEpilogueBarrier, Cfg::kConsumers * 128);
      sm.clock.Mark(0);
      if (c.active)
        StageFc1<Cfg::kMFrags, kNTiles, Cfg::kConsumers, Cfg::kBlockN, Cfg::kIdx>(acc, warp, wg, lane, staged);
      sm.clock.Mark(1);
    } else {
      if (c.active) Fc2Epilogue<Cfg::kMFrags, kNTiles, Cfg::kConsumers>(p, acc, tc, warp, wg, lane);
    }
  };
  if constexpr (Cfg::kInlineProducer) {
    // (Constructed by every consumer thread, used by thread 0 alone.)
    const TileCopies<Cfg> copies(p, tc, sm, &map_wide, &map_narrow, groups, width, k_tiles);
    ConsumeTileOfWidth<Cfg>(width, sm, c, &copies, tail);
  } else {
    ConsumeTileOfWidth<Cfg>(width, sm, c, nullptr, tail);
  }
  if constexpr (kFc1) {
    ptx::NamedBarrierSync(kEpilogueBarrier, Cfg::kConsumers * 128);
    sm.clock.Mark(2);
    Fc1Epilogue<Cfg::kBlockN, Cfg::kIdx>(p, tc, groups, staged, wg * 4 + warp, Cfg::kConsumers * 4, lane);
  }
  RecordConsumerPhases<kFc1>(sm.clock, warp == 0 && lane == 0);
#else
  __trap();  // built for sm_90a only; cuda_moe.cu refuses other devices before launching
#endif
}

// ---- the persistent FC1 kernel ----------------------------------------------------------------
// FC1 with its epilogue off the consumers' path (perf-log v7). In the kernel above the tensor
// cores idle while the CTA's warps re-quantize its tile; here a CTA per SM walks work items (TileOf)
// and
//   warp 0 (producer) takes each item and streams its steps through one ring of stages;
//   the consumers run each item's main loop, apply the activation in registers, write one fp32
//     plane of activations (ActivateToStaged) once the plane is free, and go on with the next item;
//   warps 1-3 (the rest of the producer's warpgroup, otherwise idle) re-quantize the plane into h
//     (QuantizeStagedActs) meanwhile.
// The plane has its own shared memory beside the stages, handed over with two mbarriers: "staged"
// (all 256 consumer threads arrive) and "free" (all 96 epilogue threads arrive).
//
// Items are handed out in order: blockIdx.x first, then gridDim.x + the next value of
// p.work_counter. The items in flight then stay a window of about gridDim.x consecutive ones, as
// with one CTA per item, and the row blocks of a tile and the tiles of an expert meet in L2. (With
// fixed strides the CTAs drifted apart: L2 hit rate 58%, against 77% with the counter and 82% for
// the kernel above; perf-log v7.) The
// producer publishes item n in a ring of item ids before it fills the item's first stage, and
// kNoItem after the last one, completing that stage's barrier with no data; the others read the
// ring once that barrier (consumers) or "staged" (epilogue warps) says so.
template <class Cfg>
struct PersistentFc1Layout {
  static constexpr int kEpilogueWarps = 3;
  // After the stages: their 2 kStages mbarriers, "staged", "free", then the item ring.
  static constexpr int kRingSlots = 16;  // > kStages + 2, the most items the producer can be ahead
  static constexpr int kRingOffset = Cfg::kStages * Cfg::kSmemStage + (2 * Cfg::kStages + 2) * 8;
  static constexpr int kPlaneOffset = Cfg::kStages * Cfg::kSmemStage + 1024;
  static constexpr int kSmemBytes = 1024 + kPlaneOffset + kActStagedBytes<Cfg::kBlockN>;
  static constexpr uint32_t kNoItem = 0xFFFFFFFFu;
  // Registers: the producer's warpgroup (which also re-quantizes) gives the consumers what it can
  // spare of the launch's 168 per thread: 128 x 56 + 256 x 224 = 384 x 168, as the kernel above.
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + 128 * Cfg::kConsumers * kConsumerRegs <= Cfg::kLaunchRegs * Cfg::kThreads,
                "setmaxnreg: the consumers ask for no more than the producer's warpgroup releases");
  static_assert(kRingSlots > Cfg::kStages + 2, "a ring slot is rewritten only after its item is done");
  // The narrowest MMA: with the 8-, 16- and 24-wide instantiations in the item loop as well, ptxas
  // serializes the consumers' wgmma (C7512), whatever their register budget. Only an expert's last
  // tile can be that narrow.
  static constexpr int kMinWidth = 32;
  // Its widths step by 16 above 32 (NextWidth's kCoarse): the finer steps' instantiations made ptxas
  // serialize its wgmma too (C7512, perf-log v13.3).
  static constexpr bool kCoarseWidths = true;
  static_assert(kRingOffset + 4 * kRingSlots <= kPlaneOffset, "barriers and ring before the plane");
  static_assert(kSmemBytes <= 227 * 1024, "SM90 shared memory per block");
};

template <class Cfg, ActivationType kAct>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    MoeWgmmaFc1PersistentKernel(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_wide,
                                const __grid_constant__ CUtensorMap map_narrow) {
#if MXMOE_WGMMA_AVAILABLE
  // Its producer warp streams every item; ConsumeTile's own copies assume a CTA's one tile from slot 0.
  static_assert(!Cfg::kInlineProducer, "the persistent kernel runs configs with producer threads");
  using Layout = PersistentFc1Layout<Cfg>;
  extern __shared__ uint8_t smem_raw[];
  const StageMap<Cfg> sm{(ptx::SmemAddr(smem_raw) + 1023u) & ~1023u};
  const uint32_t bar_staged = sm.Full(2 * Cfg::kStages), bar_free = bar_staged + 8;
  uint8_t* const smem_base = smem_raw + (sm.base - ptx::SmemAddr(smem_raw));
  uint32_t* const ring = reinterpret_cast<uint32_t*>(smem_base + Layout::kRingOffset);
  float* const plane = reinterpret_cast<float*>(smem_base + Layout::kPlaneOffset);

  const int tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3, role = tid >> 7;
  if (tid == 0) {
    InitStageBarriers(sm, Cfg::kConsumers * 4);  // one arrival per consumer warp
    wgmma::MbarInit(bar_staged, Cfg::kConsumers * 128);
    wgmma::MbarInit(bar_free, Layout::kEpilogueWarps * 32);
    wgmma::FenceMbarInit();
  }
  __syncthreads();
  ptx::EnterPipelineKernel();
  const int k_tiles = static_cast<int>(p.a_shape.col_tiles);

  if (role == 0) {
    wgmma::RegDealloc<Layout::kProducerRegs>();
    if (warp == 0) {
      // (The grid's upper bound, m_tiles x max tiles, fits in 32 bits: so does the real count.)
      const uint32_t items = static_cast<uint32_t>(*p.num_tiles) * static_cast<uint32_t>(p.m_tiles);
      uint32_t item = blockIdx.x;
      int slot = 0;
      for (int n = 0;; ++n) {
        if (lane == 0) ring[n % Layout::kRingSlots] = item < items ? item : Layout::kNoItem;
        if (item >= items) {
          sm.WaitFree(slot);
          if (lane == 0) wgmma::MbarArrive(sm.Full(slot % Cfg::kStages));
          break;
        }
        const TileCoords tc = TileOf<Cfg::kBlockN>(p, item);
        ProduceTile(p, tc, sm, &map_wide, &map_narrow, GroupsOf(p, tc),
                    TileWidth<Cfg::kBlockN, Layout::kMinWidth, Layout::kCoarseWidths>(tc.n_valid), k_tiles, slot, lane);
        slot += SlotsOf<Cfg>(k_tiles);
        uint32_t next = 0;
        if (lane == 0) next = gridDim.x + atomicAdd(reinterpret_cast<unsigned int*>(p.work_counter), 1u);
        item = __shfl_sync(0xFFFFFFFFu, next, 0);
      }
    } else {
      for (int n = 0;; ++n) {
        wgmma::MbarWait(bar_staged, n & 1);
        const uint32_t item = ring[n % Layout::kRingSlots];
        if (item == Layout::kNoItem) break;
        const TileCoords tc = TileOf<Cfg::kBlockN>(p, item);
        QuantizeStagedActs(p, tc, GroupsOf(p, tc), plane, warp - 1, Layout::kEpilogueWarps, lane);
        wgmma::MbarArrive(bar_free);
      }
    }
    return;
  }

  wgmma::RegAlloc<Layout::kConsumerRegs>();
  const int wg = role - 1;
  int slot = 0;
  for (int n = 0;; ++n) {
    // The item's first stage (or the end) is published: its id is in the ring.
    sm.WaitLoaded(slot);
    const uint32_t item = ring[n % Layout::kRingSlots];
    // "staged" advances one phase at a time: the epilogue warps are done with the previous item
    // (and so waiting for this one) before the consumers arrive again.
    if (item == Layout::kNoItem) {
      if (n > 0) wgmma::MbarWait(bar_free, (n - 1) & 1);
      wgmma::MbarArrive(bar_staged);
      break;
    }
    int width, groups;
    {
      const TileCoords tc = TileOf<Cfg::kBlockN>(p, item);
      width = TileWidth<Cfg::kBlockN, Layout::kMinWidth, Layout::kCoarseWidths>(tc.n_valid);
      groups = GroupsOf(p, tc);
    }
    const ConsumerArgs c = ConsumerArgsOf<Cfg>(k_tiles, warp, wg, lane, slot, groups);
    ConsumeTileOfWidth<Cfg, Layout::kMinWidth, Layout::kCoarseWidths>(width, sm, c, nullptr, [&](const auto& acc) {
      constexpr int kNTiles = kAccTiles<decltype(acc)>;
      // (The tile is looked up again here: kept across the main loop, it cost registers the
      // MMAs need.)
      const TileCoords tc = TileOf<Cfg::kBlockN>(p, item);
      if (n > 0) wgmma::MbarWait(bar_free, (n - 1) & 1);  // the previous item's plane is re-quantized
      if (c.active) ActivateToStaged<kAct, Cfg::kMFrags, kNTiles, Cfg::kConsumers>(p, tc, acc, warp, wg, lane, plane);
      wgmma::MbarArrive(bar_staged);
    });
    slot += SlotsOf<Cfg>(k_tiles);
  }
#else
  __trap();  // built for sm_90a only; cuda_moe.cu refuses other devices before launching
#endif
}

// ---- launch -----------------------------------------------------------------------------------
// The persistent FC1 kernel for activation kind `act` (null for the kinds the kernels refuse).
template <class Cfg>
auto PersistentFc1KernelOf(ActivationType act) -> decltype(&MoeWgmmaFc1PersistentKernel<Cfg, ActivationType::Situ>) {
  switch (act) {
    case ActivationType::Situ: return MoeWgmmaFc1PersistentKernel<Cfg, ActivationType::Situ>;
    case ActivationType::Swiglu: return MoeWgmmaFc1PersistentKernel<Cfg, ActivationType::Swiglu>;
    case ActivationType::SwigluBias: return MoeWgmmaFc1PersistentKernel<Cfg, ActivationType::SwigluBias>;
    case ActivationType::Geglu: return MoeWgmmaFc1PersistentKernel<Cfg, ActivationType::Geglu>;
    case ActivationType::GegluTanh: return MoeWgmmaFc1PersistentKernel<Cfg, ActivationType::GegluTanh>;
    default: return nullptr;
  }
}

// The configs with a persistent FC1 kernel: wg128. (With 3 MMA groups in flight, ptxas serializes
// the persistent kernel's wgmma, C7512; its register split is written for one CTA per SM.)
template <class Cfg>
inline constexpr bool HasPersistentFc1 = Cfg::kBlockN == 128 && Cfg::kInFlight == 1 && Cfg::kCtasPerSm == 1;

template <class Cfg>
cudaError_t PrepareWgmmaConfig() {
  RegisterPhaseCycles("wgmma BLOCK_N %d, %d stages of %d steps, %d MMA groups in flight", Cfg::kBlockN, Cfg::kStages,
                      Cfg::kStepsPerStage, Cfg::kInFlight);
  cudaError_t e = AllowDynamicSmem(MoeWgmmaKernel<Cfg, true>, MoeWgmmaKernel<Cfg, false>, Cfg::kSmemBytes);
  if constexpr (HasPersistentFc1<Cfg>) {  // (prepared whether on or not: it may be turned on later)
    for (int a = 0; e == cudaSuccess && a < static_cast<int>(ActivationType::InvalidType); ++a)
      if (const auto kernel = PersistentFc1KernelOf<Cfg>(static_cast<ActivationType>(a)))
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 PersistentFc1Layout<Cfg>::kSmemBytes);
  }
  return e;
}

template <class Cfg>
cudaError_t LaunchWgmmaConfig(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  if (p.fold_done != nullptr) return cudaErrorInvalidValue;  // (only MoeGemmKernel folds the combine)
  dim3 grid;
  bool launch = false;
  // (grid_ctas counts whole row blocks: kSplit CTAs each.)
  if (const cudaError_t e = GridOf(grid_ctas * Cfg::kSplit, &grid, &launch); e != cudaSuccess || !launch) return e;
  // The maps span b's capacity (at least one row, for an empty call the grid exits at once).
  CUtensorMap wide, narrow;
  cudaError_t e = MakeTokenMap(p, Cfg::kBlockN, &wide);
  if (e == cudaSuccess) e = MakeTokenMap(p, 8, &narrow);
  if (e != cudaSuccess) return e;
  // FC1 runs the persistent kernel when it is on (SetPersistentFc1, MXMOE_FC1_PERSISTENT).
  if constexpr (HasPersistentFc1<Cfg>) {
    if (fc1 && PersistentFc1Enabled()) {
      const auto kernel = PersistentFc1KernelOf<Cfg>(p.act);
      if (kernel == nullptr) return cudaErrorInvalidValue;  // refused by CheckActivationSupported before
      if (p.work_counter == nullptr) return cudaErrorInvalidValue;
      // One CTA per SM (fewer when there are fewer items, or under LimitPersistentCtas).
      int device = 0, sms = 0;
      if (e = cudaGetDevice(&device); e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      if (e != cudaSuccess) return e;
      const int limit = PersistentCtaLimit();
      if (limit > 0 && limit < sms) sms = limit;
      grid.x = static_cast<unsigned>(grid_ctas < sms ? grid_ctas : sms);
      return LaunchKernel(kernel, PdlSite::kFc1, grid, dim3(Cfg::kThreads), PersistentFc1Layout<Cfg>::kSmemBytes,
                          stream, p, wide, narrow);
    }
  }
  return LaunchKernel(fc1 ? MoeWgmmaKernel<Cfg, true> : MoeWgmmaKernel<Cfg, false>, GemmPdlSite(fc1), grid,
                      dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p, wide, narrow);
}

template <class Cfg>
int WgmmaResidentCtasOf(bool fc1) {
  return ResidentCtas(fc1 ? MoeWgmmaKernel<Cfg, true> : MoeWgmmaKernel<Cfg, false>, Cfg::kThreads, Cfg::kSmemBytes);
}

template <class Cfg>
GemmConfigInfo WgmmaInfoOf(const char* name) {
  return {name,  Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads, Cfg::kStages, Cfg::kSmemBytes, true, Cfg::kCtasPerSm,
          false, &WgmmaResidentCtasOf<Cfg>};
}

// The instantiations, one per translation unit (moe_wgmma_*.cu).
using ConfigWg64 = WgmmaConfig<64, 8>;    // fewer idle columns when experts get 50-100 tokens
using ConfigWg128 = WgmmaConfig<128, 6>;  // the widest tile: the least dequantization per FLOP
// wg128 with 3 MMA groups in flight per consumer warpgroup: 1.5-4% faster per kernel on the H200
// (perf-log v8), behind wg128d8 as a layer (v10); forced only (MXMOE_GEMM_CONFIG=wg128d).
using ConfigWg128Deep = WgmmaConfig<128, 6, 3>;
// wg128d with 8 stages (205 KB of shared memory): a third more weight bytes in flight per SM (perf-log
// v10: the fastest of wg128 / wg128d / wg128d8 at T = 2048-16384). Forced only since v14
// (MXMOE_GEMM_CONFIG=wg128d8): wg128d3x3 holds the same steps with fewer bulk copies.
using ConfigWg128Deep8 = WgmmaConfig<128, 8, 3>;
// Tiles of up to 32 tokens, 3 MMA groups in flight, two CTAs per SM (105 KB of shared memory and
// 80 registers per thread each; consumers at 96): the wgmma rate and 16 consumer warps per SM for
// n32's range, 6-32 pairs per expert. Forced only: against n32 (perf-log v13.1) it was 0.3-6% ahead
// on DeepSeek-V3 T = 192-1024 but for T = 384, 1-2.5% ahead on Kimi-K3 T = 768-1024 and behind
// below, and 1.4-5.5% behind on GPT-OSS-120B. With one MMA group in flight it was no faster. Measured
// again with v30's decode (perf-log v31, H100): 1-5% behind n32 at Kimi-K3 T = 512-1024 and
// DeepSeek-V3 T = 512.
using ConfigWg32x2Deep = WgmmaConfig<32, 8, 3, 2>;
// wg128d8's ring as 4 stages of two reduction steps each (200 KB): every second step without its
// own bulk copies of weights and scales. Forced only (MXMOE_GEMM_CONFIG=wg128d4x2): against wg128d8,
// 5% faster at Kimi-K3 T = 2048 and 1.9-3.2% at T = 4096 on the three benchmark shapes; 0.7-2%
// behind wg128d3x3 on Kimi-K3 at T = 2048-16384 (perf-log v14).
using ConfigWg128Deep4x2 = WgmmaConfig<128, 4, 3, 1, 2>;
// The same ring as 3 stages of three steps (222 KB): the heuristics' config from 32 pairs per
// expert. (Two stages of four steps were 6% slower than it at Kimi-K3 T = 2048: perf-log v14.)
using ConfigWg128Deep3x3 = WgmmaConfig<128, 3, 3, 1, 3>;
// Half a row block per CTA (128 rows: one m64 MMA per consumer warpgroup and k16 step), 5 stages of
// one step (106 KB) and 256 threads of 128 registers (no producer threads), so that two CTAs share an
// SM: while one runs its epilogue (FC1's took 19% of wg128d3x3's consumer cycles at Kimi-K3 T = 4096,
// FC2's 15%; perf-log v18) or fills its pipeline, the other's MMAs keep the tensor cores busy. Each
// CTA loads the tile's token rows itself (twice the B traffic of a whole-block CTA) and its weights
// one step per copy (a half block's steps are not contiguous). perf-log v19, v20.
// Its stages and MMA groups in flight are build options for the first device A/Bs. Stages of one
// step: two CTAs need 2 * (stages * 21 KB + 2 KB) <= 228 KB, FC1's epilogue planes 70 KB of them
// and thread 0's copies at least 3 stages, which leaves 4 or 5 (two steps per stage fit none).
#ifndef MXMOE_WG128H_STAGES
#define MXMOE_WG128H_STAGES 5
#endif
#ifndef MXMOE_WG128H_IN_FLIGHT
#define MXMOE_WG128H_IN_FLIGHT 3
#endif
using ConfigWg128Half = WgmmaConfig<128, MXMOE_WG128H_STAGES, MXMOE_WG128H_IN_FLIGHT, 2, 1, kBlockRowGroups / 2>;

}  // namespace mxmoe::cuda::sm90
