// The ring of shared-memory stages that the copy engine (bulk copies and TMA) fills and the MMA
// warps drain, shared by the wgmma kernels (moe_wgmma.cuh) and the mma.sync kernels fed the same
// way (moe_gemm.cuh, MoeGemmTmaKernel): the stages' layout and mbarriers, the tile widths the MMAs
// and token boxes take, and the copies of one tile's pipeline slots.
//
// A Cfg names kStages, kStepsPerStage, kSmemStage, kSubA, kSubB and kBlockN.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe_kernels.h"
#include "cuda/ptx.cuh"
#include "cuda/sm90/phase_timing.cuh"
#include "cuda/sm90/tile_loader.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/weight_layout.h"

namespace mxmoe::cuda::sm90 {

// The tile widths the MMAs take: a tile's valid columns rounded up to a multiple of 8, at most
// BLOCK_N. An expert's last tile (or its only one: ~73 tokens at T = 4096 for Kimi-K3, ~98 in
// T = 16384's chunks) then spends no MMA on more than 7 padding columns (15 with v13's steps of 16
// above 32; perf-log v13.3). kCoarse keeps steps of 16 above 32, for the persistent FC1 kernel
// (PersistentFc1Layout::kCoarseWidths).
template <bool kCoarse = false>
__host__ __device__ constexpr int NextWidth(int n) {
  return kCoarse && n >= 32 ? n + 16 : n + 8;
}

template <int kBlockN, int kMinWidth = 8, bool kCoarse = false>
__device__ __forceinline__ int TileWidth(int n_valid) {
  int w = kMinWidth;
  while (w < n_valid && w < kBlockN) w = NextWidth<kCoarse>(w);
  return w < kBlockN ? w : kBlockN;
}

// Tiles up to this wide load their token rows as 8-row boxes (one swizzle atom each, only the
// rows the MMAs read); wider ones as one box of BLOCK_N rows.
inline constexpr int kNarrowLoadWidth = 32;

// Shared memory of a CTA: kStages stages (B tiles first: their swizzle atoms need 1024-byte
// alignment, then the A tiles and their scales), then the full and empty mbarriers.
// Shared-window addresses; B(s, j) is the B tile of the stage's step j.
template <class Cfg>
struct StageMap {
  uint32_t base;
  PhaseClock clock;  // this thread's (phase_timing.cuh; empty unless built with MXMOE_PHASE_TIMING)
  __device__ uint32_t B(int s, int j = 0) const { return base + s * Cfg::kSmemStage + j * Cfg::kSubB; }
  __device__ uint32_t A(int s) const { return B(s, Cfg::kStepsPerStage); }
  __device__ uint32_t Scales(int s) const { return A(s) + Cfg::kStepsPerStage * Cfg::kSubA; }
  __device__ uint32_t Full(int s) const { return base + Cfg::kStages * Cfg::kSmemStage + 8u * s; }
  __device__ uint32_t Empty(int s) const { return Full(Cfg::kStages + s); }
  // Pipeline slot `slot` (one stage's load: kStepsPerStage reduction steps, fewer at a tile's end)
  // uses stage slot % kStages, in round slot / kStages of it. The consumers wait until the slot's
  // stage is loaded; the producer until it is free again (the first kStages slots find theirs free).
  __device__ void WaitLoaded(int slot) const {
    clock.Time([&] { wgmma::MbarWait(Full(slot % Cfg::kStages), (slot / Cfg::kStages) & 1); });
  }
  __device__ void WaitFree(int slot) const {
    if (slot >= Cfg::kStages)
      clock.Time([&] { wgmma::MbarWait(Empty(slot % Cfg::kStages), (slot / Cfg::kStages - 1) & 1); });
  }
};

// The pipeline slots of a tile of k_tiles reduction steps.
template <class Cfg>
__host__ __device__ constexpr int SlotsOf(int k_tiles) {
  return (k_tiles + Cfg::kStepsPerStage - 1) / Cfg::kStepsPerStage;
}

// The copies of one tile's pipeline slots (slot0 + i, i < SlotsOf(k_tiles)), issued by one thread once
// the slot's stage is free: the block's A tiles and scales of the slot's reduction steps (two 1D bulk
// copies: a whole block's consecutive steps are contiguous; a half block's come one step per copy) and
// the tile's token rows of each step through the tensor maps, all completing on the stage's "full"
// mbarrier.
template <class Cfg>
struct TileCopies {
  const StageMap<Cfg>& sm;
  const CUtensorMap* map_wide;
  const CUtensorMap* map_narrow;
  const uint8_t* gmem_a;
  const uint8_t* gmem_s;
  uint32_t a_bytes, s_bytes;  // the CTA's row groups of one step (bytes copied)
  int64_t a_stride, s_stride;  // the block's (from one step to the next)
  uint32_t b_bytes;           // a box counts all its bytes, rows past the tensor (zero-filled) included
  bool narrow;
  int width, seg_begin, k_tiles;

  __device__ __forceinline__ TileCopies(const GemmParams& p, const TileCoords& tc, const StageMap<Cfg>& stages,
                                        const CUtensorMap* wide, const CUtensorMap* narrow_map, int groups,
                                        int tile_width, int steps)
      : sm(stages), map_wide(wide), map_narrow(narrow_map) {
    const PackedShape& shape = p.a_shape;
    const int64_t first_tile = static_cast<int64_t>(tc.expert) * shape.Tiles() + shape.TileIndex(tc.group0, 0);
    gmem_a = p.a_tiles + first_tile * kTileBytes;
    gmem_s = p.a_scales + first_tile * kTileScaleBytes;
    a_bytes = groups * kTileBytes;
    s_bytes = groups * kTileScaleBytes;
    const int64_t block_groups = BlockGroupsOf(p, tc);
    a_stride = block_groups * kTileBytes;
    s_stride = block_groups * kTileScaleBytes;
    narrow = tile_width <= kNarrowLoadWidth;
    b_bytes = (narrow ? tile_width : Cfg::kBlockN) * 128u;
    width = tile_width;
    seg_begin = tc.seg_begin;
    k_tiles = steps;
  }

  // Asks the L2 for the weights and scales of step kt (the L2 look-ahead, GemmParams::l2_ahead).
  __device__ __forceinline__ void PrefetchL2(int kt) const {
    ptx::PrefetchBulkL2(gmem_a + kt * a_stride, a_bytes);
    ptx::PrefetchBulkL2(gmem_s + kt * s_stride, s_bytes);
  }

  // Slot i's copies into stage s (= (slot0 + i) % kStages; the caller has waited until it is free).
  __device__ __forceinline__ void Issue(int i, int s) const {
    const int kt = i * Cfg::kStepsPerStage;
    const int steps = min(Cfg::kStepsPerStage, k_tiles - kt);
    wgmma::MbarArriveExpectTx(sm.Full(s), steps * (a_bytes + s_bytes + b_bytes));
    if (a_stride == a_bytes) {
      wgmma::BulkLoad(sm.A(s), gmem_a + kt * a_stride, steps * a_bytes, sm.Full(s));
      wgmma::BulkLoad(sm.Scales(s), gmem_s + kt * s_stride, steps * s_bytes, sm.Full(s));
    } else {
      for (int j = 0; j < steps; ++j) {
        wgmma::BulkLoad(sm.A(s) + j * a_bytes, gmem_a + (kt + j) * a_stride, a_bytes, sm.Full(s));
        wgmma::BulkLoad(sm.Scales(s) + j * s_bytes, gmem_s + (kt + j) * s_stride, s_bytes, sm.Full(s));
      }
    }
    for (int j = 0; j < steps; ++j) {
      const int col = (kt + j) * kTileCols;
      if (narrow) {
        for (int r = 0; r < width; r += 8)
          wgmma::TensorLoad2d(sm.B(s, j) + r * 128, map_narrow, col, seg_begin + r, sm.Full(s));
      } else {
        wgmma::TensorLoad2d(sm.B(s, j), map_wide, col, seg_begin, sm.Full(s));
      }
    }
  }

  // The copies of a kernel without producer threads, issued from the consumers' own loop by one
  // thread at a time; the CTA's one tile starts at slot 0, so its stages start free. IssueFirst runs
  // before the loop: the first kStages - 1 slots. Refill<kLag> runs at the start of slot i: slot
  // i + kStages - kLag, into the stage slot i - kLag freed, once every warp has handed it back. With
  // kLag = 2 the other warps are most of a slot past that by then, so the issuer seldom waits;
  // kLag = 1 keeps one slot more in flight and waits for the slowest warp to finish the slot
  // before. (Every wait is on an earlier slot than the waiter's own, whose copies were issued at an
  // earlier slot still: the lowest warp can always go on.) With l2_ahead > 0 (one step per slot
  // only) the issuer also asks the L2 for the step that many past each slot it copies, and
  // IssueFirst for those up to the first refill's.
  __device__ __forceinline__ void IssueFirst(int slots, int l2_ahead) const {
    for (int i = 0; i < min(Cfg::kStages - 1, slots); ++i) Issue(i, i);
    if constexpr (Cfg::kStepsPerStage == 1) {
      for (int kt = Cfg::kStages - 1; l2_ahead > 0 && kt < min(Cfg::kStages - 1 + l2_ahead, slots); ++kt)
        PrefetchL2(kt);
    }
  }
  template <int kLag>
  __device__ __forceinline__ void Refill(int i, int slots, int l2_ahead) const {
    static_assert(kLag == 1 || kLag == 2, "refill the stage of the slot before or the one before that");
    const int refill = i + Cfg::kStages - kLag;
    if (i < kLag - 1 || refill >= slots) return;
    sm.WaitFree(refill);
    Issue(refill, refill % Cfg::kStages);
    if constexpr (Cfg::kStepsPerStage == 1) {
      if (l2_ahead > 0 && refill + l2_ahead < slots) PrefetchL2(refill + l2_ahead);
    }
  }
};

// Initializes the stages' mbarriers (thread 0; the caller's next barrier publishes them): "full"
// completes with the producer's arrival and the bytes of its copies, "empty" with one arrival from
// each of the `warps` warps that read the stage.
template <class Cfg>
__device__ __forceinline__ void InitStageBarriers(const StageMap<Cfg>& sm, int warps) {
  for (int s = 0; s < Cfg::kStages; ++s) {
    wgmma::MbarInit(sm.Full(s), 1);
    wgmma::MbarInit(sm.Empty(s), warps);
  }
}

}  // namespace mxmoe::cuda::sm90
