// Device-side data and the launchers of every kernel of the CUDA backend (host-callable; the
// kernels themselves live in the .cu/.cuh files beside this one and in sm90/). Launchers take raw
// pointers and a stream and return a cudaError_t; cuda_moe.cu turns those into Status messages.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/decode_plan.h"
#include "cuda/sm120/weight_layout_sm120.h"
#include "cuda/weight_layout.h"
#include "mxmoe/activation.h"
#include "mxmoe/moe.h"

namespace mxmoe::cuda {

// Per local expert, on the device.
struct ExpertParams {
  ActParams act;
  float fc1_scale = 1.0f;  // 2^c_shift of the expert's W13 (see StoredScale)
  float fc2_scale = 1.0f;  // 2^c_shift of its W2
  int32_t fc1_shift = 0;
  int32_t fc2_shift = 0;
  int32_t has_gate_bias = 0;
  int32_t has_up_bias = 0;
};

// ---- weight repacking (weight_prepack.cu) ---------------------------------------------------
// One expert's checkpoint tensors, already on the device (a staging copy).
struct ExpertSource {
  const uint8_t* w1_packed;  // [I, K/2]
  const uint8_t* w1_scales;  // [I, K/32]
  const uint8_t* w3_packed;
  const uint8_t* w3_scales;
  const uint8_t* w2_packed;  // [K, I/2]
  const uint8_t* w2_scales;  // [K, I/32]
};
// W13 rows interleave gate and up in groups of 8: row group rg holds gate rows 8rg..8rg+7 then up
// rows 8rg..8rg+7, so an MMA accumulator tile holds g and u of the same rows in the same thread.
cudaError_t LaunchRepackExperts(const ExpertSource* sources_dev, int num, int64_t first_local,
                                int64_t hidden, int64_t inter, const PackedShape& w13,
                                const PackedShape& w2, const ExpertParams* params_dev,
                                uint8_t* w13_tiles, uint8_t* w13_scales, uint8_t* w2_tiles,
                                uint8_t* w2_scales, cudaStream_t stream);

// ---- routing and input quantization (routing.cu) --------------------------------------------
struct PrepareParams {
  int64_t num_tokens = 0;  // this chunk's tokens
  int64_t hidden = 0;      // K
  int64_t x_stride = 0;    // row stride of xq, elements (K padded to 64)
  const uint16_t* x_bf16 = nullptr;  // chunk rows, or null with x_e4m3/x_scale
  const uint8_t* x_e4m3 = nullptr;
  const uint8_t* x_scale = nullptr;
  uint16_t* xq = nullptr;  // [T, x_stride] bf16: deq(mxfp8_quantize(x)), exact
  // Or, when xq_codes is set (the SM120 path), mxfp8_quantize(x) as it is: [T, x_stride] e4m3
  // codes (x_stride a multiple of 128 bytes) and [T, x_stride / 32] UE8M0 scales; a block whose
  // scale is NaN gets NaN codes too. Columns past K are not written.
  uint8_t* xq_codes = nullptr;
  uint8_t* xq_scales = nullptr;
  const int32_t* topk_ids = nullptr;  // chunk rows [T, k]
  int32_t top_k = 0;
  int64_t first_expert = 0;
  int32_t num_local = 0;
  int32_t* keys = nullptr;  // [T*k] local expert, or num_local for a skipped slot
  int32_t* pair_ids = nullptr;  // [T*k] 0..T*k-1 (the values SortPairs sorts), or null
  // The error word: ids outside [-1, num_experts) are added here (one atomic per block), or null.
  int64_t num_experts = 0;  // E, global
  unsigned long long* bad_ids = nullptr;
  // Words set to 0 by LaunchPrepareAndRoute (the fused decode kernel's synchronization words), or
  // null. LaunchPrepare refuses them.
  int32_t* zero = nullptr;
  int64_t zero_words = 0;
};
cudaError_t LaunchPrepare(const PrepareParams& p, cudaStream_t stream);
// Adds the ids of ids[0, n) outside [-1, num_experts) to *bad_ids (the unfused reference's share
// of the error word; the fused pipeline counts in LaunchPrepare).
cudaError_t LaunchCountBadIds(const int32_t* ids, int64_t n, int64_t num_experts,
                              unsigned long long* bad_ids, cudaStream_t stream);

// Bytes of CUB temporary storage the sort needs for n pairs.
cudaError_t SortTempBytes(int64_t n, size_t* bytes);
// Stable sort of (keys, pair_ids) by key over the low `key_bits` bits.
cudaError_t SortPairs(void* temp, size_t temp_bytes, const int32_t* keys_in, int32_t* keys_out,
                      const int32_t* vals_in, int32_t* vals_out, int64_t n, int key_bits,
                      cudaStream_t stream);
// expert_offsets[e] = first sorted position with key >= e (e = 0..num_local); the tile list of
// block_n columns per expert (tile_offsets[e] = its first tile, [num_local + 1]), and its length
// num_tiles[0]; num_tiles[1] (GemmParams::work_counter) is set to 0.
cudaError_t LaunchOffsetsAndTiles(const int32_t* sorted_keys, int64_t n, int32_t num_local,
                                  int32_t block_n, int32_t* expert_offsets, int32_t* tile_offsets,
                                  int2* tiles, int32_t* num_tiles, cudaStream_t stream);

// Up to kSmallRoutePairs pairs: SortPairs (values: the pair ids), then LaunchOffsetsAndTiles, in
// one launch of one CTA.
inline constexpr int kSmallRoutePairs = 4096;
struct RouteSmallParams {
  const int32_t* keys = nullptr;  // [n], as LaunchPrepare writes them
  int32_t n = 0;
  int32_t num_local = 0;
  int key_bits = 1;
  int32_t* sorted_pairs = nullptr;  // [n]
  int32_t* offsets = nullptr;       // [num_local + 1]
  int32_t block_n = 8;
  int32_t* tile_offsets = nullptr;  // [num_local + 1]
  int2* tiles = nullptr;
  int32_t* num_tiles = nullptr;  // [2], as LaunchOffsetsAndTiles
  // LaunchPrepareAndRoute: up to this many pairs (at most kWarpRoutePairs) the block's warps route
  // without its sort and barriers (RouteWarps; 0: never).
  int32_t warp_max = 0;
};
inline constexpr int32_t kWarpRoutePairs = 32;
// Whether small calls route in the block's warps (rp.warp_max = kWarpRoutePairs): MXMOE_WARP_ROUTE=0
// (or 1) at start, on by default. On an H100 (perf-log v34) it took 1.3-1.8 us off Kimi-K3 at T = 1
// and 3.6-3.8 at T = 2, 0.6-0.9 off DeepSeek-V3 at T = 1 and 2, and tied on GPT-OSS-120B (v16's
// one-warp version had measured within 0.8% of the block's sort). SetWarpRoute for the tests.
void SetWarpRoute(bool on);
bool WarpRouteEnabled();
cudaError_t LaunchRouteSmall(const RouteSmallParams& p, cudaStream_t stream);
// Up to kFusedRoutePairs pairs (decode): LaunchPrepare's quantization (not its keys: p.keys and
// p.pair_ids are not written) and LaunchRouteSmall in one launch, the keys computed from
// p.topk_ids. rp.keys is not read; rp.n must be p.num_tokens * p.top_k.
inline constexpr int kFusedRoutePairs = 256;
static_assert(kDecodeMaxPairs <= kFusedRoutePairs, "only LaunchPrepareAndRoute clears the fused decode kernel's words");
cudaError_t LaunchPrepareAndRoute(const PrepareParams& p, const RouteSmallParams& rp, cudaStream_t stream);

// xs[pos, :K] = xq[sorted_pairs[pos] / top_k, :K] for the first *valid_rows sorted positions (of
// at most max_rows): each expert's tokens as consecutive rows, for the kernels that load a tile's
// tokens as one box (the wgmma GEMMs). Strides in elements; columns past K are not touched.
cudaError_t LaunchGatherRows(const uint16_t* xq, int64_t stride, int64_t hidden, const int32_t* sorted_pairs,
                             const int32_t* valid_rows, int32_t top_k, int64_t max_rows, uint16_t* xs,
                             cudaStream_t stream);

// out[t] = sum over valid slots j, in order, of y[t*k + j] (fp32), then the output dtype.
cudaError_t LaunchCombine(const float* y, const int32_t* topk_ids, int64_t num_tokens,
                          int32_t top_k, int64_t hidden, int64_t first_expert, int32_t num_local,
                          OutputDType dtype, void* out, cudaStream_t stream);

// ---- pair chunks (cuda_moe.cu; on by default) -------------------------------------------------
// A call too large for the workspace in one piece runs either in pair chunks (the default: it
// routes all its tokens once and runs the GEMMs on consecutive ranges of the sorted pairs, so an
// expert's weights are streamed about once per call, and on an expert-parallel rank the ranges
// past its own pairs find no tiles) or, with MXMOE_PAIR_CHUNKS=0 at start, in token chunks (each
// chunk routes its own tokens, so every chunk streams the weights of every expert it touches).
// Pair chunks took 4.6-4.8% off Kimi-K3 at T = 8192 and 16384 on the H200 (docs/perf-log.md, v18).
// SetPairChunks for the tests.
void SetPairChunks(bool on);
bool PairChunksEnabled();
// MXMOE_STAGE_TIMES=1 at start (off by default; a diagnostic): each eager call prints on stderr the
// time of its routing, GEMMs and combine, from CUDA events (it waits for its stream after each
// chunk). SetStageTimes for the tests.
void SetStageTimes(bool on);
// MXMOE_EXACT_GRID=1 at start (off by default; a diagnostic): eager calls size the GEMMs' grids by
// the routing's tile count, read back after waiting for the stream, instead of by the worst-case
// bound (perf-log v26). SetExactGrid for the tests.
void SetExactGrid(bool on);
// The workspace target of the CudaMoe objects created from now on (0: the default ~2 GiB), which
// sets both chunkings' sizes; the tests make it small to chunk small calls.
void SetWorkspaceTarget(size_t bytes);
// For i < n: pos_of_pair[sorted_pairs[i]] = i and sorted_weights[i] = topk_weights[sorted_pairs[i]];
// for i < iota_n: iota[i] = i. (FC2 of a range reads iota as its pair ids and the range's stretch of
// sorted_weights as their router weights, and so writes y at the range's positions: the GEMM
// kernels are the same as for token chunks.)
cudaError_t LaunchPairPositions(const int32_t* sorted_pairs, const float* topk_weights, int64_t n,
                                int32_t* pos_of_pair, float* sorted_weights, int32_t* iota, int64_t iota_n,
                                cudaStream_t stream);
// One range [pos_begin, pos_end) of sorted positions: acc[t] (+)= the sum over token t's valid
// slots j whose position pos_of_pair[t*k + j] lies in the range, in slot order, of
// y[pos - pos_begin] (fp32 rows written by FC2 at their positions). The first range starts from 0
// instead of reading acc; the last writes out (the output dtype) instead of acc. One range that
// is both gives LaunchCombine's sums bit for bit.
struct CombineRange {
  int64_t pos_begin = 0, pos_end = 0;
  bool first = true, last = true;
  float* acc = nullptr;  // [T, K] fp32, read unless first, written unless last
  // The range's pairs of this rank (LaunchOffsetsAndTiles' expert_offsets[num_local]), or null: a
  // range with none that is neither first nor last leaves acc as it is and launches for nothing
  // (the ranges past an expert-parallel rank's pairs).
  const int32_t* local_pairs = nullptr;
};
cudaError_t LaunchCombineRange(const float* y, const int32_t* pos_of_pair, const int32_t* topk_ids,
                               int64_t num_tokens, int32_t top_k, int64_t hidden, int64_t first_expert,
                               int32_t num_local, const CombineRange& range, OutputDType dtype, void* out,
                               cudaStream_t stream);

// ---- the fused grouped GEMMs (sm90/) ----------------------------------------------------------
struct GemmParams {
  // A: the prepacked weights of all local experts (expert e at e * a_shape.Tiles() tiles).
  const uint8_t* a_tiles = nullptr;
  const uint8_t* a_scales = nullptr;
  PackedShape a_shape;
  // B: bf16 rows with zero-padded columns up to a multiple of 64 read as zeros. FC1: xq per
  // token; FC2: the intermediate per sorted pair.
  const uint16_t* b = nullptr;
  int64_t b_stride = 0;
  int64_t b_rows = 0;  // rows of b (its capacity): the wgmma kernels' tensor map spans them
  // Routing.
  const int32_t* sorted_pairs = nullptr;    // chunk-local pair ids t*k+j, grouped by expert
  const int32_t* expert_offsets = nullptr;  // [num_local + 1]
  const int2* tiles = nullptr;              // (local expert, first position in its segment)
  const int32_t* num_tiles = nullptr;
  // Zeroed by the routing kernel with the tile count: the persistent FC1 kernel hands out its
  // work items past the first gridDim.x with atomicAdd on it.
  int32_t* work_counter = nullptr;
  int32_t m_tiles = 0;
  int32_t top_k = 0;
  const ExpertParams* experts = nullptr;
  // FC1 epilogue: activation and MXFP8 re-quantization into h[sorted position, i].
  ActivationType act = ActivationType::Situ;
  const float* gate_bias = nullptr;  // [num_local, I_local] or null
  const float* up_bias = nullptr;
  uint16_t* h = nullptr;
  int64_t h_stride = 0;
  // FC2 epilogue: y[pair, n] = topk_weight * (aq . W2^T).
  float* y = nullptr;
  int64_t y_stride = 0;
  const float* topk_weights = nullptr;  // chunk rows [T, k]
  // The mma.sync kernels' L2 look-ahead: the thread that copies a step asks the L2 for the weights
  // and scales of the step this many steps later (0: none; see SetL2Ahead). Read by the configs
  // whose GemmConfigInfo::looks_ahead is set.
  int32_t l2_ahead = 0;
  // The decode configs' early prefetch (BLOCK_N 8; see SetEarlySteps): before its dependency wait,
  // thread 0 of each CTA asks the L2 for the first early_steps steps of the CTA's weights and
  // scales (0: none), so that the stream starts while the kernel before it ends. FC2 takes its
  // tile's expert from the routing (written before FC1 got past its own wait, so before FC2 could
  // be launched); FC1, whose routing is not done yet, guesses it from early_ids, the call's
  // early_pairs ids (at most kEarlyGuessMaxPairs; null: no guess): tile t is the t-th smallest distinct local
  // expert, as the routing numbers the tiles of calls of at most 8 pairs per expert. The prefetch
  // only warms the L2: a wrong or stale guess costs bandwidth, never a result.
  int32_t early_steps = 0;
  const int32_t* early_ids = nullptr;
  int32_t early_pairs = 0;
  int32_t early_num_local = 0;
  int64_t early_first_expert = 0;
  // The launch's dynamic shared memory, at least (the launcher's; the kernel uses its config's).
  int32_t launch_smem = 0;
  // FC1's CTAs of the decode configs (their instance that hands on), past their main loop, ask the L2 for the
  // first next_steps steps of FC2's weights and scales that FC2's CTA of the same expert and index
  // within the tile will read (FC2's shape, weights, row blocks and CTAs per tile), so that FC2's
  // stream starts in FC1's tail (0: none; see SetFc1PrefetchFc2).
  int32_t next_steps = 0;
  const uint8_t* next_a_tiles = nullptr;
  const uint8_t* next_a_scales = nullptr;
  PackedShape next_a_shape;
  int32_t next_m_tiles = 0;
  int32_t next_k_parts = 1;
  // FC2 with the combine folded in (see SetFc2CombineTokens; null fold_done: the combine kernel runs):
  // after its y rows, each CTA that holds a tile's sums counts itself in at fold_done[its row
  // block] (words the routing launch zeroed), and the last of the *num_tiles to arrive writes
  // out[t, the block's rows] for t < fold_tokens as CombineKernel does, bit for bit (with no tile,
  // tile 0's CTAs write the zeros; the launch must hold at least one tile's CTAs).
  int32_t* fold_done = nullptr;
  const int32_t* fold_ids = nullptr;  // the call's ids [fold_tokens, top_k]
  int32_t fold_tokens = 0;
  int32_t fold_num_local = 0;
  int64_t fold_first_expert = 0;
  void* fold_out = nullptr;
  OutputDType fold_dtype = OutputDType::kF32;
};

// The mma.sync kernels' L2 look-ahead in steps (GemmParams::l2_ahead): read once from
// MXMOE_L2_AHEAD=<0..kMaxL2Ahead> (another value is reported on stderr and ignored), 0 by default
// until measured (perf-log v20). At T = 1 the decode GEMMs' CTAs waited for their stages on 23% of
// their cycles with ~17 KB in flight each (perf-log v18); an L2 prefetch puts more of the stream in
// flight without shared memory. SetL2Ahead for the tests (clamped to 0..kMaxL2Ahead).
inline constexpr int kMaxL2Ahead = 16;
void SetL2Ahead(int steps);
int L2Ahead();
// GemmParams::early_steps, read once from MXMOE_EARLY_STEPS=<0..kMaxEarlySteps> (default
// kDefaultEarlySteps). On an H100 (perf-log v32) 2, 3 and 4 steps each took 1.6-3.5% off the T = 1
// layers of Kimi-K3, DeepSeek-V3 and GPT-OSS-120B and 0.4-2.8% off DeepSeek-V3 and GPT-OSS-120B at
// T = 2, and tied; 8 tied on Kimi-K3 and 16 was slower. FC1's CTAs wait ~5.6 µs for the routing, in
// which, by arithmetic, 4 steps of 768 CTAs (26 MB) about fill the H200's 4 TB/s. SetEarlySteps
// for the tests (clamped).
inline constexpr int kMaxEarlySteps = 16;
inline constexpr int kEarlyGuessMaxPairs = 32;  // FC1 guesses from one id a lane of a warp
inline constexpr int kDefaultEarlySteps = 4;
void SetEarlySteps(int steps);
int EarlySteps();
// FC2 under programmatic dependent launch, its CTAs capped (perf-log v32): in a decode call whose FC1
// grid holds at least kFc2CapMinFc1CtasPerSm CTAs per SM (Kimi-K3 at T = 1: 768 on 132 SMs), the
// decode configs' FC2 also launches with PDL, asking for Fc2CapSmem() bytes of shared memory
// (GemmParams::launch_smem), so that no FC2 CTA fits beside FC1's six and at most four share an SM
// later. FC2's CTAs then start on the SMs FC1 leaves first and prefetch their first steps
// (early_steps) in FC1's tail. Without the cap, PDL on FC2 put up to 7 of its CTAs on those SMs
// and one on others, and Kimi-K3 T = 1 took 5-6% longer (an H100). MXMOE_FC2_SMEM=<bytes> (read
// once) sets the bytes; 0, or no more than FC2's config takes anyway, turns the rule off.
inline constexpr int kMaxFc2Smem = 200 * 1024;
inline constexpr int kDefaultFc2Smem = 56000;
inline constexpr int kFc2CapMinFc1CtasPerSm = 4;
int Fc2CapSmem();
// For the tests: sets the bytes (clamped to 0..kMaxFc2Smem; 0 turns the rule off), and counts the
// FC2 launches that took a cap (CountCappedFc2Launch, by the launcher) in this process.
void SetFc2CapSmem(int bytes);
void CountCappedFc2Launch();
int64_t CappedFc2Launches();
// The combine folded into FC2 (GemmParams::fold_done) for decode calls of at most
// Fc2CombineTokens() tokens whose FC2 runs the mma.sync kernel on 8-token tiles (n8, n8k2, n8c2,
// n8c4, n8c2d; n8f folds its own): MXMOE_FC2_COMBINE=<0..kMaxFc2CombineTokens> read once (0: never),
// 1 by default. On an H100 (perf-log v34) it took 0.35-1.2 us off the T = 1 layers of Kimi-K3,
// DeepSeek-V3 and GPT-OSS-120B run eagerly (0.05-0.8 from a graph), and at T = 2 GPT-OSS-120B took
// 1.7 us longer: the last CTA of a row block sums every token's slots alone. SetFc2CombineTokens
// for the tests (clamped).
inline constexpr int kMaxFc2CombineTokens = 8;
inline constexpr int kDefaultFc2CombineTokens = 1;
void SetFc2CombineTokens(int tokens);
int Fc2CombineTokens();
// GemmParams::next_steps of a decode call on the mma.sync kernels (Fc1PrefetchFc2Steps, below the
// configs): MXMOE_FC1_PREFETCH_FC2=<0..kMaxEarlySteps>, read once, sets it for every such call.
// Unset (or -1, kFc1PrefetchFc2ByRule), it is kDefaultFc1PrefetchFc2 steps where FC1 runs in
// clusters of at least kFc1PrefetchFc2MinClusterCtas CTAs (n8c4: GPT-OSS-120B at T = 1), else none:
// 4 steps took 0.8-2.4% off GPT-OSS-120B T = 1 in three A/Bs on an H100 and an H200, lost up to
// 1.2% on Kimi-K3 T = 1 (n8c2) and changed sign between the cards on DeepSeek-V3 T = 1 (perf-log
// v36, v37). SetFc1PrefetchFc2 for the tests (clamped to kFc1PrefetchFc2ByRule..kMaxEarlySteps).
inline constexpr int kFc1PrefetchFc2ByRule = -1;
inline constexpr int kDefaultFc1PrefetchFc2 = 4;
inline constexpr int kFc1PrefetchFc2MinClusterCtas = 4;
void SetFc1PrefetchFc2(int steps);
int Fc1PrefetchFc2();
// For the tests: FC2 launches with the combine folded in (CountFoldedCombine, by the launcher) in
// this process.
void CountFoldedCombine();
int64_t FoldedCombines();

// mma.sync kernels (sm90/moe_gemm.cuh) and wgmma kernels (sm90/moe_wgmma.cuh), by BLOCK_N; wg128d
// is wg128 with more MMAs in flight (forced only; 1.5-4% faster per kernel: perf-log v8), wg128d8
// wg128d with 8 stages (perf-log v9.1, v10), n8k2 n8 with each stage's steps split between two sets
// of 4 warps (perf-log v10.1), n8c2 n8 with each tile's reduction split between the two CTAs of a
// cluster (perf-log v12), wg32x2d wgmma tiles of up to 32 tokens, 3 MMA groups in flight, two
// CTAs per SM (perf-log v13.1), n8c4 n8c2 with clusters of four (perf-log v13.2), wg128d4x2 and
// wg128d3x3 wg128d8's ring as 4 stages of two reduction steps and 3 stages of three (perf-log v14),
// wg128h BLOCK_N 128 with half a row block per CTA and two CTAs per SM (perf-log v19, v20), n32t and
// n8t n32's and n8's warps fed by the copy engine instead of cp.async (perf-log v20), n8f n8's tiles
// with both GEMMs of a call of at most kDecodeMaxPairs pairs in one persistent kernel (perf-log v21;
// LaunchFusedDecode), n8c2d n8c2 with 5 stages, 4 CTAs per SM (perf-log v23).
// clang-format off
enum class GemmConfigId : int {
  kN8 = 0, kN32 = 1, kN64 = 2, kWg64 = 3, kWg128 = 4, kWg128d = 5, kWg128d8 = 6, kN8k2 = 7, kN8c2 = 8,
  kWg32x2d = 9, kN8c4 = 10, kWg128d4x2 = 11, kWg128d3x3 = 12, kWg128h = 13, kN32t = 14, kN8t = 15, kN8f = 16,
  kN8c2d = 17
};
// clang-format on
inline constexpr int kNumGemmConfigs = 18;

struct GemmConfigInfo {
  const char* name;
  int block_m;
  int block_n;
  int threads;
  int stages;
  int smem_bytes;
  // FC1 reads its tokens as rows in sorted order (LaunchGatherRows first: the configs fed by TMA,
  // wgmma and n32t / n8t) rather than gathering them from xq itself (the cp.async mma.sync ones).
  bool loads_sorted_rows;
  // The CTAs per SM the config is built for (its launch bounds, register split and shared memory;
  // the wgmma configs), 0 where that is left to the occupancy the kernel gets (the mma.sync ones).
  int ctas_per_sm;
  // The config reads GemmParams::l2_ahead (the narrow mma.sync configs, cp.async or TMA fed; n64
  // would spill with it).
  bool looks_ahead;
  // The CTAs of the FC1 (fc1) or FC2 kernel that fit an SM of the current device, from the CUDA
  // occupancy API; call after PrepareGemmKernels. Negative: the API's error.
  int (*resident_ctas)(bool fc1);
  // CTAs per thread block cluster (n8c2 2, n8c4 4): a launch of n items runs n * cluster_ctas CTAs.
  int cluster_ctas = 1;
};
GemmConfigInfo GemmInfo(GemmConfigId id);
// The FC2 steps FC1's CTAs ask the L2 for (GemmParams::next_steps) in a decode call whose FC1 runs
// `fc1` (Fc1PrefetchFc2: the setting, or the rule where none is set).
int Fc1PrefetchFc2Steps(const GemmConfigInfo& fc1);
// Raises the dynamic shared memory limit of every GEMM kernel (once per device, at Create).
cudaError_t PrepareGemmKernels();
// grid_ctas = m_tiles * (upper bound of the tile count); CTAs past the real count exit at once.
cudaError_t LaunchGemm(GemmConfigId id, bool fc1, const GemmParams& p, int64_t grid_ctas,
                       cudaStream_t stream);

// Both GEMMs of a decode call in one persistent kernel (n8f; decode_plan.h has the order of its
// work and the arithmetic of its buffers). fc1 and fc2 are what LaunchGemm would take for n8;
// fc1.work_counter (zeroed by the routing) hands out the units.
struct DecodeParams {
  GemmParams fc1, fc2;
  DecodePlan plan;
  int32_t max_tiles = 0;    // an upper bound of the tile count (the words' layout)
  int32_t* sync = nullptr;  // DecodeSyncWords(plan, max_tiles) words, all 0 at the launch
  float* partials = nullptr;  // DecodePartialFloats(plan, pairs) floats (null when s1 = s2 = 1)
  int32_t pairs = 0;        // the call's pairs: positions of the partial sums
  int32_t debug_fc1_delay_ns = 0;  // set by LaunchFusedDecode from SetDecodeFc1Delay
  // The folded combine (plan.combine_tokens > 0): the call's [tokens, top_k] ids (slots whose
  // expert is not in [first_expert, first_expert + num_local) add nothing) and its output rows.
  const int32_t* topk_ids = nullptr;
  int64_t first_expert = 0;
  int32_t num_local = 0;
  void* out = nullptr;
  OutputDType out_dtype = OutputDType::kF32;
};
cudaError_t LaunchFusedDecode(const DecodeParams& d, cudaStream_t stream);
// Fused decode launches so far in this process (the tests' proof that the fused path ran).
int64_t FusedDecodeLaunches();
// For the tests: each FC1 unit of the fused decode kernels launched from now on waits this many
// ns before it raises its flag, so that FC2 units wait on the flags (0: none, the default).
void SetDecodeFc1Delay(int32_t ns);
// The combine folded into the fused decode kernel (decode_plan.h), so that no combine kernel
// follows it: on by default since n8f became a default config (perf-log v24); MXMOE_DECODE_COMBINE=0
// at start turns it off.
void SetDecodeCombine(bool on);
bool DecodeCombineEnabled();
// The persistent FC1 kernel of wg128 (perf-log v7), one CTA per SM: used when on (set at start from
// MXMOE_FC1_PERSISTENT=1|0, default kPersistentFc1Default); LimitPersistentCtas(n) caps it and the
// fused decode kernel (n8f) at n CTAs (so that the tests walk many items through each CTA on small
// layers), 0 lifts the cap.
inline constexpr bool kPersistentFc1Default = false;
void SetPersistentFc1(bool on);
bool PersistentFc1Enabled();
void LimitPersistentCtas(int ctas);
int PersistentCtaLimit();

// ---- the unfused reference (reference_kernels.cu) ---------------------------------------------
struct ReferenceParams {
  int64_t num_tokens = 0;
  int64_t hidden = 0;  // K
  int64_t inter = 0;   // I_local
  int32_t top_k = 0;
  int64_t first_expert = 0;
  int32_t num_local = 0;
  const uint16_t* x_bf16 = nullptr;
  const uint8_t* x_e4m3 = nullptr;
  const uint8_t* x_scale = nullptr;
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  const uint8_t* w13_tiles = nullptr;
  const uint8_t* w13_scales = nullptr;
  PackedShape w13;
  const uint8_t* w2_tiles = nullptr;
  const uint8_t* w2_scales = nullptr;
  PackedShape w2;
  // The SM120 path's weights are in its own layout (sm120/weight_layout_sm120.h): then the
  // pointers above point to it and these shapes describe it.
  bool sm120_layout = false;
  sm120::PackedShape w13_sm120, w2_sm120;
  const ExpertParams* experts = nullptr;
  ActivationType act = ActivationType::Situ;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  float* xd = nullptr;  // [T, K] fp32
  float* hd = nullptr;  // [T*k, I_local] fp32
  float* y = nullptr;   // [T*k, K] fp32
};
cudaError_t LaunchReference(const ReferenceParams& p, cudaStream_t stream);

}  // namespace mxmoe::cuda
