// Step 1 of the fused pipeline and the pieces around the GEMMs: MXFP8 quantization of x, the
// expert-sorted order of the valid (token, slot) pairs, per-expert offsets and the tile list, and
// the deterministic combine. Everything stays on the device: no host synchronization.
#include <cub/cub.cuh>

#include <cstdint>

#include "cuda/kernel_timeline.cuh"
#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/mx_device.cuh"
#include "cuda/ptx.cuh"
#include "mxmoe/formats.h"

namespace mxmoe::cuda {

namespace {

constexpr int kThreads = 256;

// The error word: the block's count of ids outside [-1, num_experts), added with one atomic. Every
// thread of the block must call it (it synchronizes the block).
__device__ void CountBadIdsOfBlock(bool bad, unsigned long long* bad_ids) {
  __shared__ int smem_warp_counts[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warp_count = __popc(__ballot_sync(0xFFFFFFFFu, bad));
  if (lane == 0) smem_warp_counts[warp] = warp_count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int count = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) count += smem_warp_counts[w];
    if (count > 0) atomicAdd(bad_ids, static_cast<unsigned long long>(count));
  }
}

__device__ bool IsBadId(int32_t id, int64_t num_experts) { return id < -1 || id >= num_experts; }

// Thread idx of the quantization: one 32-block of x (row idx / (K / 32)); threads past the last
// block do nothing.
__device__ void QuantizeBlockOfX(const PrepareParams& p, int64_t idx) {
  const int64_t blocks_per_row = p.hidden / kMxBlock;
  if (idx >= p.num_tokens * blocks_per_row) return;  // padding of the last quantization block
  const int64_t t = idx / blocks_per_row, b = idx % blocks_per_row;
  uint8_t codes[kMxBlock];
  uint8_t scale;
  if (p.x_bf16 != nullptr) {
    const uint4* src = reinterpret_cast<const uint4*>(p.x_bf16 + t * p.hidden + b * kMxBlock);
    float v[kMxBlock];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 q = src[i];
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[8 * i + 2 * j] = bf16_to_float(static_cast<uint16_t>(w[j] & 0xFFFFu));
        v[8 * i + 2 * j + 1] = bf16_to_float(static_cast<uint16_t>(w[j] >> 16));
      }
    }
    scale = QuantizeMxfp8Block(v, codes);
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(p.x_e4m3 + t * p.hidden + b * kMxBlock);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 q = src[i];
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 16; ++j) codes[16 * i + j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
    }
    scale = p.x_scale[t * blocks_per_row + b];
  }
  if (p.xq_codes != nullptr) {
    // The SM120 path: codes and scale as the block-scaled MMA takes them. A block whose scale is
    // NaN also gets NaN codes, so it reads as NaN whether or not the hardware honours the scale.
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[i] |= static_cast<uint32_t>(scale == kUe8m0Nan ? 0x7Fu : codes[4 * i + j]) << (8 * j);
    }
    uint4* dst = reinterpret_cast<uint4*>(p.xq_codes + t * p.x_stride + b * kMxBlock);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    p.xq_scales[t * (p.x_stride / kMxBlock) + b] = scale;
    return;
  }
  // deq(xq) = e4m3 * 2^s in fp32, exactly as the reference; exact in bf16 for realistic scales.
  const float s = ue8m0_to_float(scale);
  uint4* dst = reinterpret_cast<uint4*>(p.xq + t * p.x_stride + b * kMxBlock);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = float_to_bf16(E4m3ToFloat(codes[8 * i + 2 * j]) * s);
      const uint32_t hi = float_to_bf16(E4m3ToFloat(codes[8 * i + 2 * j + 1]) * s);
      w[j] = lo | (hi << 16);
    }
    dst[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The routing key of a slot whose expert id is `id`: its local expert, or num_local for a slot that
// is skipped (-1, ids out of range, other ranks' experts).
__device__ int32_t KeyOfId(const PrepareParams& p, int32_t id) {
  const int64_t local = static_cast<int64_t>(id) - p.first_expert;
  const bool valid = id >= 0 && local >= 0 && local < p.num_local;
  return valid ? static_cast<int32_t>(local) : p.num_local;
}

// Blocks [0, quant_threads) quantize one 32-block of x each; the rest write one routing key each.
__global__ void __launch_bounds__(kThreads) PrepareKernel(const PrepareParams p, int64_t quant_threads) {
  ptx::EnterPipelineKernel();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx < quant_threads) {
    QuantizeBlockOfX(p, idx);
    return;
  }
  // Key blocks (quant_threads is a whole number of blocks, so the branch above is block-uniform and
  // no thread of a key block has returned before the block-wide count below).
  const int64_t pair = idx - quant_threads;
  const bool in_range = pair < p.num_tokens * p.top_k;
  const int32_t id = in_range ? p.topk_ids[pair] : -1;
  if (in_range) {
    p.keys[pair] = KeyOfId(p, id);
    if (p.pair_ids != nullptr) p.pair_ids[pair] = static_cast<int32_t>(pair);
  }
  if (p.bad_ids != nullptr) CountBadIdsOfBlock(IsBadId(id, p.num_experts), p.bad_ids);
}

__global__ void __launch_bounds__(kThreads)
    CountBadIdsKernel(const int32_t* ids, int64_t n, int64_t num_experts, unsigned long long* bad_ids) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  CountBadIdsOfBlock(idx < n && IsBadId(ids[idx], num_experts), bad_ids);
}

__device__ int LowerBound(const int32_t* v, int64_t n, int32_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (v[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return static_cast<int>(lo);
}

constexpr int kTileThreads = 1024;
template <int kCtaThreads>
using TileScan = cub::BlockScan<int32_t, kCtaThreads>;

// For a CTA of kCtaThreads whose offsets[0..num_local] are written and visible to the whole CTA:
// the tile count per expert, its scan (tile_offsets), and the tile list filled by every thread.
template <int kCtaThreads>
__device__ void TilesOfCta(const int32_t* offsets, int32_t num_local, int32_t block_n, int32_t* tile_offsets,
                           int2* tiles, int32_t* num_tiles, typename TileScan<kCtaThreads>::TempStorage& scan_storage,
                           int32_t& carry) {
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < num_local; base += kCtaThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    const int count = e < num_local ? offsets[e + 1] - offsets[e] : 0;
    int start, total;
    TileScan<kCtaThreads>(scan_storage).ExclusiveSum((count + block_n - 1) / block_n, start, total);
    if (e < num_local) tile_offsets[e] = carry + start;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  const int total_tiles = carry;
  if (threadIdx.x == 0) tile_offsets[num_local] = total_tiles;
  __syncthreads();
  for (int t = threadIdx.x; t < total_tiles; t += kCtaThreads) {
    // The expert of tile t: the last e with tile_offsets[e] <= t.
    int lo = 0, hi = num_local;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (tile_offsets[mid] <= t) lo = mid;
      else hi = mid;
    }
    tiles[t] = make_int2(lo, (t - tile_offsets[lo]) * block_n);
  }
  if (threadIdx.x == 0) {
    num_tiles[0] = total_tiles;
    num_tiles[1] = 0;  // the persistent FC1 kernel's work counter (GemmParams::work_counter)
  }
}

// The offsets by binary search in the sorted keys (visible to the whole CTA), then the tile list.
template <int kCtaThreads>
__device__ void OffsetsAndTilesOfCta(const int32_t* sorted_keys, int64_t n, int32_t num_local, int32_t block_n,
                                     int32_t* offsets, int32_t* tile_offsets, int2* tiles, int32_t* num_tiles,
                                     typename TileScan<kCtaThreads>::TempStorage& scan_storage, int32_t& carry) {
  for (int e = threadIdx.x; e <= num_local; e += kCtaThreads) offsets[e] = LowerBound(sorted_keys, n, e);
  __syncthreads();
  TilesOfCta<kCtaThreads>(offsets, num_local, block_n, tile_offsets, tiles, num_tiles, scan_storage, carry);
}

// One CTA: OffsetsAndTilesOfCta over the device-wide sort's keys.
__global__ void __launch_bounds__(kTileThreads)
    OffsetsTilesKernel(const int32_t* sorted_keys, int64_t n, int32_t num_local, int32_t block_n,
                       int32_t* offsets, int32_t* tile_offsets, int2* tiles, int32_t* num_tiles) {
  ptx::EnterPipelineKernel();
  __shared__ TileScan<kTileThreads>::TempStorage scan_storage;
  __shared__ int32_t carry;
  OffsetsAndTilesOfCta<kTileThreads>(sorted_keys, n, num_local, block_n, offsets, tile_offsets, tiles, num_tiles,
                                     scan_storage, carry);
}

// Small calls (decode): the sort, the offsets and the tile list in one CTA of kCtaThreads x
// kItems pairs (sized to the call: the sort's passes cost by the slots, not the pairs). A block
// radix sort of (key, pair) with the pairs in blocked order is stable, like the device-wide sort:
// pairs of one expert stay in token order.
// key_at(pair) gives the routing key of pair < p.n.
template <int kCtaThreads, int kItems, class KeyAt>
__device__ void RouteSmallOfCta(const RouteSmallParams& p, KeyAt key_at) {
  constexpr int kSlots = kCtaThreads * kItems;
  using RouteSort = cub::BlockRadixSort<uint32_t, kCtaThreads, kItems, int32_t>;
  // The sort's storage, then the sorted keys, then the scan's: one after the other.
  __shared__ union {
    typename RouteSort::TempStorage sort;
    int32_t sorted_keys[kSlots];
    typename TileScan<kCtaThreads>::TempStorage scan;
  } storage;
  __shared__ int32_t carry;
  uint32_t keys[kItems];
  int32_t pairs[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int pair = threadIdx.x * kItems + i;
    // Past n: the largest key, after every real pair (stability keeps them last among equals).
    keys[i] = pair < p.n ? static_cast<uint32_t>(key_at(pair)) : static_cast<uint32_t>(p.num_local);
    pairs[i] = pair;
  }
  RouteSort(storage.sort).Sort(keys, pairs, 0, p.key_bits);
  __syncthreads();  // every thread is done with the sort's storage
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int pos = threadIdx.x * kItems + i;
    storage.sorted_keys[pos] = static_cast<int32_t>(keys[i]);  // <= num_local
    if (pos < p.n) p.sorted_pairs[pos] = pairs[i];
  }
  __syncthreads();
  // (The offsets' searches end at a barrier before the scan reuses the keys' storage.)
  OffsetsAndTilesOfCta<kCtaThreads>(storage.sorted_keys, p.n, p.num_local, p.block_n, p.offsets, p.tile_offsets,
                                    p.tiles, p.num_tiles, storage.scan, carry);
}

// The fewest pairs (p.n <= 32: Kimi-K3's one or two tokens) without the block's sort or a barrier:
// the same outputs as RouteSmallOfCta. Every warp of the block sorts (key, pair) over its lanes by
// a bitonic sort (pair = the lane: the composite keys are distinct, so the order is the stable
// one); warp 0 writes the sorted pairs and the tile list (a tile starts every p.block_n positions
// of an expert's run; __match_any_sync gives the run), and each lane of every warp finds
// offsets[e] and tile_offsets[e] by a binary search over its warp's lanes for the experts
// e = 32 * (warp + warps * i) + lane. (One warp alone made 29 rounds of dependent searches for
// Kimi-K3's 897 offsets; 8 warps make 3 or 4 each, unrolled so that their shuffles interleave.)
// Every thread of the block calls it, with its warp and the block's warp count.
template <class KeyAt>
__device__ void RouteWarps(const RouteSmallParams& p, KeyAt key_at, int warp, int warps) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = static_cast<int>(threadIdx.x % 32);
  // Past n: the largest key, after every real pair (the lane breaks the tie).
  const uint32_t key_in = lane < p.n ? static_cast<uint32_t>(key_at(lane)) : static_cast<uint32_t>(p.num_local);
  uint64_t v = (static_cast<uint64_t>(key_in) << 32) | static_cast<uint32_t>(lane);
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const uint64_t o = __shfl_xor_sync(kAll, v, j);
      const bool ascending = (lane & k) == 0, lower = (lane & j) == 0;
      v = (lower == ascending) == (v < o) ? v : o;  // the lower lane of an ascending pair keeps the min
    }
  const int key = static_cast<int>(v >> 32);
  const unsigned run = __match_any_sync(kAll, key);  // the positions holding this key: one run
  const int in_run = lane - (__ffs(run) - 1);
  const bool head = lane < p.n && key < p.num_local && in_run % p.block_n == 0;
  const unsigned heads = __ballot_sync(kAll, head);
  if (warp == 0) {
    if (lane < p.n) p.sorted_pairs[lane] = static_cast<int32_t>(v & 0xFFFFFFFFu);
    if (head) p.tiles[__popc(heads & ((1u << lane) - 1u))] = make_int2(key, in_run);
    if (lane == 0) {
      p.num_tiles[0] = __popc(heads);
      p.num_tiles[1] = 0;  // the persistent FC1 kernel's work counter (GemmParams::work_counter)
    }
  }
  const int stride = 32 * warps;
#pragma unroll 4
  for (int e = 32 * warp + lane; e - lane <= p.num_local; e += stride) {
    // Positions before the first key >= e (the keys are sorted over the lanes).
    int pos = 0;
#pragma unroll
    for (int step = 16; step > 0; step >>= 1)
      if (__shfl_sync(kAll, key, pos + step - 1) < e) pos += step;
    if (__shfl_sync(kAll, key, pos & 31) < e) pos = 32;  // (only when pos == 31: every key is < e)
    if (e <= p.num_local) {
      p.offsets[e] = pos;
      p.tile_offsets[e] = __popc(pos == 32 ? heads : heads & ((1u << pos) - 1u));
    }
  }
}

template <int kCtaThreads, int kItems>
__global__ void __launch_bounds__(kCtaThreads) RouteSmallKernel(const RouteSmallParams p) {
  ptx::EnterPipelineKernel();
  RouteSmallOfCta<kCtaThreads, kItems>(p, [&](int pair) { return p.keys[pair]; });
}

// The smallest calls (at most kThreads pairs) in one launch: blocks before the last quantize x as
// PrepareKernel's quantization blocks; the last block counts the bad ids and routes, with the keys
// taken from the ids themselves (none are written), as RouteSmallKernel<kThreads, 1>, or for at
// most kWarpRoutePairs pairs in its warps without a barrier (RouteWarps).
__global__ void __launch_bounds__(kThreads)
    PrepareAndRouteKernel(const PrepareParams p, int64_t quant_threads, const RouteSmallParams rp) {
  // (kernel_timeline.cuh; empty unless built with MXMOE_KERNEL_TIMELINE): the routing block's times.
  TimelineClock timeline(blockIdx.x + 1 == gridDim.x);
  timeline.Start();
  ptx::EnterPipelineKernel();
  timeline.Waited(TimelineKernel::kRoute);
  if (blockIdx.x + 1 < gridDim.x) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    // (The quantization blocks also clear p.zero: the routing block is the launch's long pole.)
    const int64_t stride = static_cast<int64_t>(gridDim.x - 1) * kThreads;
    for (int64_t i = idx; i < p.zero_words; i += stride) p.zero[i] = 0;
    if (idx < quant_threads) QuantizeBlockOfX(p, idx);
    return;
  }
  const int32_t id = static_cast<int>(threadIdx.x) < rp.n ? p.topk_ids[threadIdx.x] : -1;
  if (p.bad_ids != nullptr) CountBadIdsOfBlock(IsBadId(id, p.num_experts), p.bad_ids);
  const auto key_at = [&](int pair) { return KeyOfId(p, p.topk_ids[pair]); };
  if (rp.warp_max > 0 && rp.n <= rp.warp_max) {  // (uniform over the block)
    RouteWarps(rp, key_at, static_cast<int>(threadIdx.x / 32), kThreads / 32);
    timeline.End();
    return;
  }
  RouteSmallOfCta<kThreads, 1>(rp, key_at);
  timeline.End();
}

// Up to kCombineBatch of a token's rows are loaded before any is added, so that many loads are in
// flight per thread; the sum still runs in slot order.
constexpr int kCombineBatch = 8;

// out[t] (or r.acc[t]) = the sum in slot order of token t's rows of y over its valid slots: y's row
// t * k + j (kRange false: the whole call at once), or, for a range of sorted positions of a call in
// pair chunks, the slots whose positions lie in it, at row position - r.pos_begin, added to
// r.acc[t] unless r.first. (kRange false compiles to the kernel without ranges: 40 registers, not
// 46, so more warps per SM for the call's only combine.)
template <bool kRange>
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const float* __restrict__ y, const int32_t* __restrict__ pos_of_pair,
                  const int32_t* __restrict__ topk_ids, int64_t num_tokens, int32_t top_k, int64_t hidden,
                  int64_t first_expert, int32_t num_local, const CombineRange r, OutputDType dtype,
                  void* __restrict__ out) {
  TimelineClock timeline;  // (kernel_timeline.cuh; empty unless built with MXMOE_KERNEL_TIMELINE)
  timeline.Start();
  ptx::EnterPipelineKernel();
  timeline.Waited(TimelineKernel::kCombine);
  const int64_t per_row = hidden / 4;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= num_tokens * per_row) return;
  if (kRange && !r.first && !r.last && r.local_pairs != nullptr && *r.local_pairs == 0) return;
  const int64_t t = idx / per_row, c4 = idx % per_row;
  const float4* rows = reinterpret_cast<const float4*>(y) + c4;
  // The reference's order: acc = 0, then acc += w_j * y_j for j = 0..k-1 (w_j * y_j is in y); with
  // ranges, the same over each range's slots, range after range.
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (kRange && !r.first) acc = reinterpret_cast<const float4*>(r.acc)[idx];
  for (int j0 = 0; j0 < top_k; j0 += kCombineBatch) {
    float4 v[kCombineBatch];
    bool use[kCombineBatch];
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const int j = j0 + b;
      const int64_t local = j < top_k ? static_cast<int64_t>(topk_ids[t * top_k + j]) - first_expert : -1;
      use[b] = local >= 0 && local < num_local;  // ids of -1 and other ranks' experts add nothing
      int64_t row = t * top_k + j;
      if (kRange && use[b]) {
        const int64_t pos = pos_of_pair[row];
        use[b] = pos >= r.pos_begin && pos < r.pos_end;
        row = pos - r.pos_begin;
      }
      v[b] = use[b] ? __ldcs(rows + row * per_row) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      if (!use[b]) continue;
      acc.x += v[b].x;
      acc.y += v[b].y;
      acc.z += v[b].z;
      acc.w += v[b].w;
    }
  }
  if (kRange && !r.last) {
    reinterpret_cast<float4*>(r.acc)[idx] = acc;
  } else if (dtype == OutputDType::kF32) {
    reinterpret_cast<float4*>(out)[idx] = acc;
  } else {
    const uint32_t lo = float_to_bf16(acc.x) | (static_cast<uint32_t>(float_to_bf16(acc.y)) << 16);
    const uint32_t hi = float_to_bf16(acc.z) | (static_cast<uint32_t>(float_to_bf16(acc.w)) << 16);
    reinterpret_cast<uint2*>(out)[idx] = make_uint2(lo, hi);
  }
  timeline.End();
}

__global__ void __launch_bounds__(kThreads)
    PairPositionsKernel(const int32_t* __restrict__ sorted_pairs, const float* __restrict__ topk_weights, int64_t n,
                        int32_t* __restrict__ pos_of_pair, float* __restrict__ sorted_weights,
                        int32_t* __restrict__ iota, int64_t iota_n) {
  ptx::EnterPipelineKernel();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) {
    const int32_t pair = sorted_pairs[i];
    pos_of_pair[pair] = static_cast<int32_t>(i);
    sorted_weights[i] = topk_weights[pair];
  }
  if (i < iota_n) iota[i] = static_cast<int32_t>(i);
}

int64_t Blocks(int64_t threads) { return (threads + kThreads - 1) / kThreads; }

EnvSwitch& WarpRoute() {
  static EnvSwitch on{"MXMOE_WARP_ROUTE", true};
  return on;
}

}  // namespace

void SetWarpRoute(bool on) { WarpRoute().Set(on); }
bool WarpRouteEnabled() { return WarpRoute().Get(); }

cudaError_t LaunchPrepare(const PrepareParams& p, cudaStream_t stream) {
  if (p.zero_words != 0) return cudaErrorInvalidValue;  // (only LaunchPrepareAndRoute clears words)
  const int64_t quant = p.num_tokens * (p.hidden / kMxBlock);
  const int64_t blocks = Blocks(quant) + Blocks(p.num_tokens * p.top_k);
  if (blocks == 0) return cudaSuccess;
  // Quantization threads are padded to whole blocks so the key blocks start at a block edge.
  return LaunchKernel(PrepareKernel, PdlSite::kRoute, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, p,
                      Blocks(quant) * kThreads);
}

cudaError_t LaunchPrepareAndRoute(const PrepareParams& p, const RouteSmallParams& rp, cudaStream_t stream) {
  if (rp.n < 0 || rp.n > kFusedRoutePairs || rp.n != p.num_tokens * p.top_k || rp.key_bits < 1 || rp.key_bits > 32 ||
      rp.warp_max < 0 || rp.warp_max > kWarpRoutePairs || p.zero_words < 0 || (p.zero_words > 0 && p.zero == nullptr))
    return cudaErrorInvalidValue;
  static_assert(kFusedRoutePairs == kThreads, "one slot per thread of the routing block");
  RegisterTimeline();
  const int64_t quant_blocks = Blocks(p.num_tokens * (p.hidden / kMxBlock));
  return LaunchKernel(PrepareAndRouteKernel, PdlSite::kRoute, dim3(static_cast<unsigned>(quant_blocks + 1)),
                      dim3(kThreads), 0, stream, p, quant_blocks * kThreads, rp);
}

cudaError_t LaunchCountBadIds(const int32_t* ids, int64_t n, int64_t num_experts,
                              unsigned long long* bad_ids, cudaStream_t stream) {
  const int64_t blocks = Blocks(n);
  if (blocks == 0 || bad_ids == nullptr) return cudaSuccess;
  CountBadIdsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ids, n, num_experts, bad_ids);
  return cudaGetLastError();
}

cudaError_t SortTempBytes(int64_t n, size_t* bytes) {
  *bytes = 0;
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, static_cast<const uint32_t*>(nullptr),
                                         static_cast<uint32_t*>(nullptr),
                                         static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), n, 0, 32);
}

cudaError_t SortPairs(void* temp, size_t temp_bytes, const int32_t* keys_in, int32_t* keys_out,
                      const int32_t* vals_in, int32_t* vals_out, int64_t n, int key_bits,
                      cudaStream_t stream) {
  // Keys are non-negative; sorting them as unsigned keeps CUB's radix passes to the low bits.
  // LSD radix sort is stable, so pairs of one expert stay in token order (deterministic).
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, reinterpret_cast<const uint32_t*>(keys_in),
                                         reinterpret_cast<uint32_t*>(keys_out), vals_in, vals_out, n,
                                         0, key_bits, stream);
}

cudaError_t LaunchRouteSmall(const RouteSmallParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.n > kSmallRoutePairs || p.key_bits < 1 || p.key_bits > 32) return cudaErrorInvalidValue;
  // T <= 16 at k = 16 (most decode steps) in 256 slots; up to kSmallRoutePairs in 1024 x 4.
  if (p.n <= 256) return LaunchKernel(RouteSmallKernel<256, 1>, PdlSite::kRoute, dim3(1), dim3(256), 0, stream, p);
  static_assert(kSmallRoutePairs == 1024 * 4, "the larger variant's slots");
  return LaunchKernel(RouteSmallKernel<1024, 4>, PdlSite::kRoute, dim3(1), dim3(1024), 0, stream, p);
}

cudaError_t LaunchOffsetsAndTiles(const int32_t* sorted_keys, int64_t n, int32_t num_local,
                                  int32_t block_n, int32_t* expert_offsets, int32_t* tile_offsets,
                                  int2* tiles, int32_t* num_tiles, cudaStream_t stream) {
  return LaunchKernel(OffsetsTilesKernel, PdlSite::kRoute, dim3(1), dim3(kTileThreads), 0, stream, sorted_keys, n,
                      num_local, block_n, expert_offsets, tile_offsets, tiles, num_tiles);
}

namespace {

constexpr int kGatherWarps = 8;

// One warp per sorted position, 16 bytes per lane and iteration.
__global__ void __launch_bounds__(32 * kGatherWarps)
    GatherRowsKernel(const uint16_t* xq, int64_t stride, int64_t hidden, const int32_t* sorted_pairs,
                     const int32_t* valid_rows, int32_t top_k, uint16_t* xs) {
  ptx::EnterPipelineKernel();
  const int64_t pos = static_cast<int64_t>(blockIdx.x) * kGatherWarps + (threadIdx.x >> 5);
  if (pos >= *valid_rows) return;
  const uint4* src = reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(sorted_pairs[pos] / top_k) * stride);
  uint4* dst = reinterpret_cast<uint4*>(xs + pos * stride);
  // Four loads in flight per lane before their stores (src and dst never overlap).
  const int64_t units = hidden / 8;
  int64_t u = threadIdx.x & 31;
  for (; u + 96 < units; u += 128) {
    const uint4 a = src[u], b = src[u + 32], c = src[u + 64], d = src[u + 96];
    dst[u] = a;
    dst[u + 32] = b;
    dst[u + 64] = c;
    dst[u + 96] = d;
  }
  for (; u < units; u += 32) dst[u] = src[u];
}

}  // namespace

cudaError_t LaunchGatherRows(const uint16_t* xq, int64_t stride, int64_t hidden, const int32_t* sorted_pairs,
                             const int32_t* valid_rows, int32_t top_k, int64_t max_rows, uint16_t* xs,
                             cudaStream_t stream) {
  const int64_t blocks = (max_rows + kGatherWarps - 1) / kGatherWarps;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT32_MAX || hidden % 8 != 0 || stride % 8 != 0) return cudaErrorInvalidValue;
  return LaunchKernel(GatherRowsKernel, PdlSite::kRoute, dim3(static_cast<unsigned>(blocks)), dim3(32 * kGatherWarps),
                      0, stream, xq, stride, hidden, sorted_pairs, valid_rows, top_k, xs);
}

cudaError_t LaunchCombine(const float* y, const int32_t* topk_ids, int64_t num_tokens,
                          int32_t top_k, int64_t hidden, int64_t first_expert, int32_t num_local,
                          OutputDType dtype, void* out, cudaStream_t stream) {
  const int64_t blocks = Blocks(num_tokens * hidden / 4);
  if (blocks == 0) return cudaSuccess;
  return LaunchKernel(CombineKernel<false>, PdlSite::kCombine, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                      stream, y, static_cast<const int32_t*>(nullptr), topk_ids, num_tokens, top_k, hidden,
                      first_expert, num_local, CombineRange{}, dtype, out);
}

cudaError_t LaunchPairPositions(const int32_t* sorted_pairs, const float* topk_weights, int64_t n,
                                int32_t* pos_of_pair, float* sorted_weights, int32_t* iota, int64_t iota_n,
                                cudaStream_t stream) {
  const int64_t blocks = Blocks(n > iota_n ? n : iota_n);
  if (blocks == 0) return cudaSuccess;
  if (n > INT32_MAX || iota_n > INT32_MAX) return cudaErrorInvalidValue;
  return LaunchKernel(PairPositionsKernel, PdlSite::kRoute, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                      stream, sorted_pairs, topk_weights, n, pos_of_pair, sorted_weights, iota, iota_n);
}

cudaError_t LaunchCombineRange(const float* y, const int32_t* pos_of_pair, const int32_t* topk_ids,
                               int64_t num_tokens, int32_t top_k, int64_t hidden, int64_t first_expert,
                               int32_t num_local, const CombineRange& range, OutputDType dtype, void* out,
                               cudaStream_t stream) {
  const int64_t blocks = Blocks(num_tokens * hidden / 4);
  if (blocks == 0) return cudaSuccess;
  if (range.pos_begin < 0 || range.pos_end < range.pos_begin || ((!range.first || !range.last) && range.acc == nullptr))
    return cudaErrorInvalidValue;
  if (pos_of_pair == nullptr) return cudaErrorInvalidValue;
  return LaunchKernel(CombineKernel<true>, PdlSite::kCombine, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                      stream, y, pos_of_pair, topk_ids, num_tokens, top_k, hidden, first_expert, num_local, range,
                      dtype, out);
}

}  // namespace mxmoe::cuda
