// The prefill grouped GEMMs of the MoE on SM90 with warpgroup MMA (wgmma, HGMMA in SASS): the same
// tiles, routing and fused epilogues as the mma.sync kernels (moe_gemm.cuh), with the tensor work
// issued asynchronously so that dequantizing the next weights overlaps the current products.
//
// Formulation ("swapped AB", as in moe_gemm.cuh): M = weight rows, N = tokens. A CTA computes 256
// weight rows x BLOCK_N tokens of one expert over the whole reduction, in 64-wide steps:
//   A: the prepacked MXFP4 tiles (weight_layout.h) are cp.async'ed to shared memory; each lane reads
//      its 16-byte piece per row group and step and dequantizes it in registers, exactly, to the
//      bf16 A fragment of wgmma's register ("RS") form, which is mma.m16n8k16's A fragment.
//   B: the BLOCK_N gathered bf16 token rows, cp.async'ed into the 128-byte-swizzled K-major layout
//      wgmma reads through a shared memory descriptor.
// kWGs warpgroups (1 or 2) split the 256 rows: each issues kMFrags = 4 / kWGs m64 MMAs per k16
// step. Warp w of warpgroup wg supplies row group 4 w + kMFrags wg + f as the rows of its MMA f
// (epilogue.cuh), so for FC1 each warp's rows are whole MX blocks of the intermediate.
//
// Per k16 step a warpgroup dequantizes its A fragments into one of two register sets, fences,
// issues its kMFrags MMAs as one group and waits until only that group is in flight: the next
// step's dequantization then runs while the tensor cores work. Shared-memory stages are refilled
// two steps behind the consumer, once no MMA can still read them.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/moe_kernels.h"
#include "cuda/ptx.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/tile_loader.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/weight_layout.h"

namespace mxmoe::cuda::sm90 {

// ---- config -----------------------------------------------------------------------------------
template <int kBlockN_, int kWGs_, int kStages_>
struct WgmmaConfig {
  static constexpr int kWGs = kWGs_;
  static constexpr int kThreads = 128 * kWGs;
  static constexpr int kMFrags = kWarpRowGroups / kWGs;  // m64 MMAs per warpgroup and k16 step
  static constexpr int kBlockM = kBlockRowGroups * kTileRows;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kStages = kStages_;
  // A stage: B first (the swizzle atoms need 1024-byte alignment), then A tiles, then scales.
  static constexpr int kSubB = kBlockN * 128;
  static constexpr int kSubA = kBlockRowGroups * kTileBytes;
  static constexpr int kSubScales = kBlockRowGroups * kTileScaleBytes;
  static constexpr int kSmemStage = (kSubB + kSubA + kSubScales + 1023) / 1024 * 1024;
  static constexpr int kSmemAmax = kWGs > 1 ? kWGs * kWarpRowGroups * kBlockN * 4 : 0;
  // Dynamic shared memory is only 16-byte aligned: 1 KB of slack to align the stages.
  static constexpr int kSmemBytes = 1024 + kStages * kSmemStage + kSmemAmax;

  static_assert(kWGs == 1 || kWGs == 2, "one or two consumer warpgroups");
  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 128, "wgmma N: a multiple of 8 (<= 128 here)");
  static_assert(kStages >= 3 && kStages <= 8, "stages: the refill runs two steps behind the consumer");
  static_assert(kSmemBytes <= 227 * 1024, "SM90 shared memory per block");
};

// ---- device pieces ----------------------------------------------------------------------------
// This warp's dequantized A fragments of k16 step ks for its kMFrags row groups (bf16x2 registers
// in mma.m16n8k16 A order, PTX ISA 9.7.14.5.8: rows g / g + 8, k 2c..2c+1 / 2c+8..2c+9).
template <int kMFrags, int kStep>
__device__ __forceinline__ void DequantStep(const uint4 (&frag_a)[kMFrags], const uint32_t (&frag_s)[kMFrags],
                                            uint32_t (&a)[kMFrags][4]) {
  constexpr int kHalf = kStep / 2;  // the 32-block of the 64-wide step
#pragma unroll
  for (int f = 0; f < kMFrags; ++f) {
    const uint32_t word = kStep == 0 ? frag_a[f].x : kStep == 1 ? frag_a[f].y : kStep == 2 ? frag_a[f].z : frag_a[f].w;
    const uint32_t scale_lo = ptx::ScaleBf16x2<2 * kHalf>(frag_s[f]);      // row g
    const uint32_t scale_hi = ptx::ScaleBf16x2<2 * kHalf + 1>(frag_s[f]);  // row g + 8
    uint32_t raw[4];
    DecodeWord(word, raw);
    a[f][0] = ptx::MulBf16x2(raw[0], scale_lo);
    a[f][1] = ptx::MulBf16x2(raw[1], scale_hi);
    a[f][2] = ptx::MulBf16x2(raw[2], scale_lo);
    a[f][3] = ptx::MulBf16x2(raw[3], scale_hi);
  }
}

// Dequantize k16 step kStep into register set kStep % 2, then issue the warpgroup's MMAs on it.
template <class Cfg, int kStep>
__device__ __forceinline__ void IssueStep(const uint4 (&frag_a)[Cfg::kMFrags], const uint32_t (&frag_s)[Cfg::kMFrags],
                                          uint32_t (&areg)[2][Cfg::kMFrags][4], uint64_t desc_b,
                                          float (&acc)[Cfg::kMFrags][Cfg::kNTiles][4]) {
  DequantStep<Cfg::kMFrags, kStep>(frag_a, frag_s, areg[kStep % 2]);
  wgmma::Fence();
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f)
    wgmma::WgmmaBf16Rs(acc[f], areg[kStep % 2][f], wgmma::AdvanceDesc(desc_b, kStep * 32));
  wgmma::Commit();
  // Only this group may stay in flight: the other register set (the group before) is free again,
  // and at the end of a step every MMA of the step before has finished reading its stage.
  wgmma::Wait<1>();
}

// ---- kernel -----------------------------------------------------------------------------------
template <class Cfg, bool kFc1>
__global__ void __launch_bounds__(Cfg::kThreads, 1) MoeWgmmaKernel(const __grid_constant__ GemmParams p) {
#if MXMOE_WGMMA_AVAILABLE
  extern __shared__ uint8_t smem_raw[];
  __shared__ int32_t smem_rows[Cfg::kBlockN];  // B source row of each tile column, -1 past the segment
  // Stages as shared-window addresses (cp.async, ld.shared and the descriptors take those).
  const uint32_t smem = (ptx::SmemAddr(smem_raw) + 1023u) & ~1023u;
  float* smem_amax = reinterpret_cast<float*>(smem_raw + (smem - ptx::SmemAddr(smem_raw)) + Cfg::kStages * Cfg::kSmemStage);

  const int tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3, wg = tid >> 7;
  TileCoords tc;
  if (!ReadTile<Cfg::kBlockN, kFc1>(p, tid, Cfg::kThreads, smem_rows, &tc)) return;
  StepLoader<Cfg::kBlockN, Cfg::kThreads> loader;
  loader.Init(p, tc, smem_rows, tid);
  const int k_tiles = static_cast<int>(p.a_shape.col_tiles);
  // Rows are padded to 64, so a warp's kMFrags row groups (4 consecutive with the other
  // warpgroup's) are all real or all padding. Padding warps still take part in the warpgroup's
  // MMAs (they are collective), on zeros.
  const bool active = FragRowGroup<Cfg::kMFrags, Cfg::kWGs>(warp, wg, 0) < loader.groups;

  auto stage_b = [&](int s) { return smem + s * Cfg::kSmemStage; };
  auto stage_a = [&](int s) { return smem + s * Cfg::kSmemStage + Cfg::kSubB; };
  auto stage_s = [&](int s) { return smem + s * Cfg::kSmemStage + Cfg::kSubB + Cfg::kSubA; };
  constexpr int kAhead = Cfg::kStages - 2;  // steps in flight ahead of the consumer
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) loader.IssueNext(stage_a(s), stage_s(s), stage_b(s), tid, p.b);
    ptx::CpAsyncCommit();
  }

  float acc[Cfg::kMFrags][Cfg::kNTiles][4];
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f)
#pragma unroll
    for (int nt = 0; nt < Cfg::kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][nt][i] = 0.0f;
  uint32_t areg[2][Cfg::kMFrags][4];

  const int g = lane >> 2;
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::CpAsyncWait<kAhead - 1>();  // step kt has landed for this thread (one commit per step)
    wgmma::FenceProxyAsyncShared();  // ... and is visible to the tensor cores' reads
    __syncthreads();                 // ... for every thread; stage (kt - 2) is no longer read
    const int next = kt + kAhead;
    if (next < k_tiles) {
      const int s = next % Cfg::kStages;
      loader.IssueNext(stage_a(s), stage_s(s), stage_b(s), tid, p.b);
    }
    ptx::CpAsyncCommit();

    const int s = kt % Cfg::kStages;
    uint4 frag_a[Cfg::kMFrags];
    uint32_t frag_s[Cfg::kMFrags];
#pragma unroll
    for (int f = 0; f < Cfg::kMFrags; ++f) {
      const int group = FragRowGroup<Cfg::kMFrags, Cfg::kWGs>(warp, wg, f);
      frag_a[f] = active ? ptx::LdShared128(stage_a(s) + group * kTileBytes + lane * 16) : make_uint4(0, 0, 0, 0);
      frag_s[f] = active ? ptx::LdShared32(stage_s(s) + group * kTileScaleBytes + g * 4) : 0u;
    }
    // NOTE: B rows are 128 bytes and 8-row atoms 1024 bytes apart (the stride-dimension offset).
    const uint64_t desc_b = wgmma::SmemDescK128(stage_b(s), 1024);
#pragma unroll
    for (int f = 0; f < Cfg::kMFrags; ++f) wgmma::FenceOperand(acc[f]);
    IssueStep<Cfg, 0>(frag_a, frag_s, areg, desc_b, acc);
    IssueStep<Cfg, 1>(frag_a, frag_s, areg, desc_b, acc);
    IssueStep<Cfg, 2>(frag_a, frag_s, areg, desc_b, acc);
    IssueStep<Cfg, 3>(frag_a, frag_s, areg, desc_b, acc);
  }
  wgmma::Wait<0>();
#pragma unroll
  for (int f = 0; f < Cfg::kMFrags; ++f) wgmma::FenceOperand(acc[f]);
  ptx::CpAsyncWait<0>();

  if constexpr (kFc1) {
    Fc1Epilogue<Cfg::kMFrags, Cfg::kNTiles, Cfg::kWGs>(p, acc, tc, warp, wg, lane, active, smem_amax);
  } else {
    if (active) Fc2Epilogue<Cfg::kMFrags, Cfg::kNTiles, Cfg::kWGs>(p, acc, tc, warp, wg, lane);
  }
#else
  __trap();  // built for sm_90a only; cuda_moe.cu refuses other devices before launching
#endif
}

// ---- launch -----------------------------------------------------------------------------------
template <class Cfg>
cudaError_t PrepareWgmmaConfig() {
  cudaError_t e = cudaFuncSetAttribute(MoeWgmmaKernel<Cfg, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::kSmemBytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(MoeWgmmaKernel<Cfg, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Cfg::kSmemBytes);
}

template <class Cfg>
cudaError_t LaunchWgmmaConfig(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) {
  if (grid_ctas <= 0) return cudaSuccess;
  if (grid_ctas > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(grid_ctas));
  if (fc1) MoeWgmmaKernel<Cfg, true><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  else MoeWgmmaKernel<Cfg, false><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <class Cfg>
GemmConfigInfo WgmmaInfoOf(const char* name) {
  return {name, Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads, Cfg::kStages, Cfg::kSmemBytes};
}

// The instantiations, one per translation unit (moe_wgmma_*.cu).
using ConfigWg64 = WgmmaConfig<64, 1, 4>;    // 1 warpgroup, 128 accumulators per thread: 2 CTAs per SM
using ConfigWg128 = WgmmaConfig<128, 2, 5>;  // 2 warpgroups share the token tile: half the dequantization per FLOP

}  // namespace mxmoe::cuda::sm90
