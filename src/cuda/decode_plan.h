// The work of the fused decode kernel (config n8f, sm90/moe_decode.cu): both grouped GEMMs of a
// small call in one persistent launch. Host-compilable (MXMOE_HD), so that the CPU tests check the
// order and the host sizes the workspace with the same arithmetic the kernel runs.
//
// A unit is (GEMM, tile, row block, part): n8's tile of 256 weight rows x 8 tokens over part
// `part` of the reduction, whose steps are split into s1 (FC1) or s2 (FC2) contiguous parts. The
// CTAs take units in the order below from a counter, so a unit is only ever waited for by units
// taken after it. When s > 1 each part leaves its fp32 sums in the workspace and the last of a
// tile's parts to finish adds them in part order (a fixed order: runs repeat bit for bit) and runs
// the epilogue. FC2's unit waits until FC1 has written the intermediate columns its steps read.
//
// Order: every FC1 unit before every FC2 unit. FC2's units go part by part (part 0 of every tile
// and row block, then part 1, ...), and FC1's units are grouped by the FC2 part that first reads
// their intermediates: FC1 row block m holds the 128 intermediates of FC2 steps 2 m and 2 m + 1.
// So the FC1 row blocks FC2's first part reads are computed first, and by the time the CTAs reach
// FC2's part g its inputs are long written; the weights stream on across the GEMMs' boundary.
//
// With the combine folded in (combine_tokens > 0, MXMOE_DECODE_COMBINE), units of a third kind
// follow FC2's (DecodeCombineUnitOf): (FC2 row block m, token t), each adding t's rows of y in
// block m in slot order (the combine kernel's sums) once every tile's FC2 unit of block m has
// written them. One token a unit, so that calls of 8-16 tokens still spread the combine over many
// CTAs (8 tokens a unit, one after another, made as many dependent L2 round trips).
#pragma once

#include <cstdint>

#include "mxmoe/formats.h"

namespace mxmoe::cuda {

inline constexpr int kDecodeMaxSplit = 8;     // parts of one tile's reduction, at most
// s * pairs at most: bounds the parts' fp32 sums. With kDecodeMinPartSteps = 2, 128 gives Kimi-K3's
// T = 1 8 parts (7 FC1, 6 FC2 steps each) and T = 4 2 parts, where 64 and 4 (the defaults before v24)
// gave 4 and 1. n8f with the combine folded in, 128 / 2 against 64 / 4 (perf-log v24, H100): Kimi-K3
// T = 2 and DeepSeek-V3 T = 2 and 8 2-5% faster, Kimi-K3 T = 1 and 8 and DeepSeek-V3 T = 1 within
// 1.5%. An A/B knob (32 or 16 give fewer, longer parts; v22, v23).
#ifndef MXMOE_DECODE_SPLIT_PAIRS
#define MXMOE_DECODE_SPLIT_PAIRS 128
#endif
inline constexpr int kDecodeSplitPairs = MXMOE_DECODE_SPLIT_PAIRS;
// 64-wide steps per part, at least (where s > 1).
#ifndef MXMOE_DECODE_MIN_PART_STEPS
#define MXMOE_DECODE_MIN_PART_STEPS 2
#endif
inline constexpr int kDecodeMinPartSteps = MXMOE_DECODE_MIN_PART_STEPS;
static_assert(kDecodeMinPartSteps >= 1, "a part has steps");
inline constexpr int kDecodeMaxPairs = 256;   // calls of more pairs run n8's two kernels
inline constexpr int kDecodeBlockRows = 256;  // rows of a unit (n8's CTA)
inline constexpr int kDecodeBlockTokens = 8;  // tokens of a tile (n8's BLOCK_N)
// 64-wide FC2 steps per FC1 row block: a block of 256 W13 rows holds 128 gate and 128 up rows of
// the same intermediates, which are 128 columns of h.
inline constexpr int kFc2StepsPerFc1Block = 2;

struct DecodePlan {
  int32_t m1 = 0, m2 = 0;  // row blocks of W13 (2 I rows) and W2 (K rows)
  int32_t k1 = 0, k2 = 0;  // 64-wide reduction steps of FC1 (K) and FC2 (I)
  int32_t s1 = 1, s2 = 1;  // parts of each tile's reduction
  int32_t combine_tokens = 0;  // tokens of the folded combine (0: the combine kernel runs)
};

struct DecodeUnit {
  bool fc1 = true;
  int32_t tile = 0, block = 0, part = 0;
};

// Parts for a GEMM of k_steps steps in a call of `pairs` pairs: the largest power of two within
// kDecodeMaxSplit with s * pairs <= kDecodeSplitPairs and at least kDecodeMinPartSteps steps per
// part. Few pairs touch few experts, so their tiles alone would leave most of the SMs' CTA slots
// empty (Kimi-K3 at T = 1: 384 FC1 and 224 FC2 tiles for 7 x 132 slots).
MXMOE_HD int32_t DecodeSplitFor(int64_t pairs, int32_t k_steps) {
  int32_t s = 1;
  while (2 * s <= kDecodeMaxSplit && 2 * s * pairs <= kDecodeSplitPairs && k_steps >= 2 * s * kDecodeMinPartSteps)
    s *= 2;
  return s;
}

// Steps [*first, *first + *count) of part `part` of k steps in s parts (a part may be empty).
MXMOE_HD void DecodePartSteps(int32_t k, int32_t s, int32_t part, int32_t* first, int32_t* count) {
  const int32_t per = (k + s - 1) / s;
  const int32_t begin = part * per < k ? part * per : k;
  const int32_t end = begin + per < k ? begin + per : k;
  *first = begin;
  *count = end - begin;
}

// The FC1 row blocks [*lo, *hi) whose intermediates FC2 steps [first, first + count) read (none
// for count 0).
MXMOE_HD void DecodeFc1BlocksOf(int32_t first, int32_t count, int32_t* lo, int32_t* hi) {
  *lo = first / kFc2StepsPerFc1Block;
  *hi = count > 0 ? (first + count - 1) / kFc2StepsPerFc1Block + 1 : *lo;
}

// The first FC1 row block of group g: the blocks FC2's part g is the first to read are
// [GroupStart(g), GroupStart(g + 1)); GroupStart(s2) = m1.
MXMOE_HD int32_t DecodeGroupStart(const DecodePlan& p, int32_t g) {
  const int32_t per = (p.k2 + p.s2 - 1) / p.s2;
  const int32_t b = (g * per + kFc2StepsPerFc1Block - 1) / kFc2StepsPerFc1Block;
  return g >= p.s2 || b > p.m1 ? p.m1 : b;
}

MXMOE_HD int32_t DecodeFc1Units(const DecodePlan& p, int32_t tiles) { return tiles * p.m1 * p.s1; }
MXMOE_HD int32_t DecodeUnits(const DecodePlan& p, int32_t tiles) {
  return tiles * (p.m1 * p.s1 + p.m2 * p.s2);
}
// The folded combine's units, after DecodeUnits' (they run with no tile too: a rank with no local
// pair still writes its zeros).
MXMOE_HD int32_t DecodeCombineUnits(const DecodePlan& p) { return p.m2 * p.combine_tokens; }
// Combine unit c (< DecodeCombineUnits): W2's row block *block, token *token.
MXMOE_HD void DecodeCombineUnitOf(const DecodePlan& p, int32_t c, int32_t* block, int32_t* token) {
  *block = c / p.combine_tokens;
  *token = c % p.combine_tokens;
}

// Unit u (< DecodeUnits) of a call with `tiles` tiles, in the order described above.
MXMOE_HD DecodeUnit DecodeUnitOf(const DecodePlan& p, int32_t tiles, int32_t u) {
  DecodeUnit w;
  const int32_t fc1_units = DecodeFc1Units(p, tiles);
  if (u < fc1_units) {
    // FC1: group g, then tile, then row block, then part.
    int32_t g = 0;
    while (g + 1 < p.s2 && tiles * DecodeGroupStart(p, g + 1) * p.s1 <= u) ++g;
    const int32_t lo = DecodeGroupStart(p, g);
    const int32_t width = (DecodeGroupStart(p, g + 1) - lo) * p.s1;  // units of one tile in the group
    const int32_t v = u - tiles * lo * p.s1;
    w.fc1 = true;
    w.tile = v / width;
    w.block = lo + (v % width) / p.s1;
    w.part = v % p.s1;
    return w;
  }
  // FC2: part, then tile, then row block.
  const int32_t v = u - fc1_units;
  const int32_t per_part = tiles * p.m2;
  w.fc1 = false;
  w.part = v / per_part;
  w.tile = (v % per_part) / p.m2;
  w.block = v % p.m2;
  return w;
}

// The synchronization words of a call with at most max_tiles tiles (zeroed before the launch):
// FC1's part arrivals per (tile, row block) from word 0, FC2's from DecodeFc2ArrivalsAt, then
// FC1's "written" flag per (tile, row block) from DecodeReadyAt, then, per FC2 row block m, the
// count of tiles whose FC2 unit of m has written y (the folded combine waits for it) from
// DecodeDoneAt.
MXMOE_HD int64_t DecodeFc2ArrivalsAt(const DecodePlan& p, int64_t max_tiles) { return max_tiles * p.m1; }
MXMOE_HD int64_t DecodeReadyAt(const DecodePlan& p, int64_t max_tiles) { return max_tiles * (p.m1 + p.m2); }
MXMOE_HD int64_t DecodeDoneAt(const DecodePlan& p, int64_t max_tiles) { return max_tiles * (2 * p.m1 + p.m2); }
MXMOE_HD int64_t DecodeSyncWords(const DecodePlan& p, int64_t max_tiles) { return DecodeDoneAt(p, max_tiles) + p.m2; }
// The arrivals word of (tile, row block) of FC1 (fc1) or FC2, and FC1's flag word of it.
MXMOE_HD int64_t DecodeArrivalWord(const DecodePlan& p, int64_t max_tiles, bool fc1, int32_t tile, int32_t block) {
  return fc1 ? int64_t{tile} * p.m1 + block : DecodeFc2ArrivalsAt(p, max_tiles) + int64_t{tile} * p.m2 + block;
}
MXMOE_HD int64_t DecodeReadyWord(const DecodePlan& p, int64_t max_tiles, int32_t tile, int32_t block) {
  return DecodeReadyAt(p, max_tiles) + int64_t{tile} * p.m1 + block;
}
MXMOE_HD int64_t DecodeDoneWord(const DecodePlan& p, int64_t max_tiles, int32_t block) {
  return DecodeDoneAt(p, max_tiles) + block;
}

// The parts' fp32 sums, [block][part][position][kDecodeBlockRows] per GEMM with s > 1, FC1's
// first; positions are sorted positions below `pairs`. FC2's start at DecodeFc2Partials.
MXMOE_HD int64_t DecodeFc1PartialFloats(const DecodePlan& p, int64_t pairs) {
  return p.s1 > 1 ? int64_t{p.m1} * p.s1 * pairs * kDecodeBlockRows : 0;
}
MXMOE_HD int64_t DecodePartialFloats(const DecodePlan& p, int64_t pairs) {
  return DecodeFc1PartialFloats(p, pairs) + (p.s2 > 1 ? int64_t{p.m2} * p.s2 * pairs * kDecodeBlockRows : 0);
}
// The sum of row `row` (< kDecodeBlockRows) of sorted position `pos` (< pairs) left by part `part`
// of a unit of row block `block` of FC1 (fc1) or FC2; a part's sums are pairs * kDecodeBlockRows
// floats apart.
MXMOE_HD int64_t DecodePartialFloat(const DecodePlan& p, int64_t pairs, bool fc1, int32_t block, int32_t part,
                                    int64_t pos, int32_t row) {
  const int64_t parts = fc1 ? p.s1 : p.s2;
  return (fc1 ? 0 : DecodeFc1PartialFloats(p, pairs)) + ((block * parts + part) * pairs + pos) * kDecodeBlockRows + row;
}
// An upper bound of DecodePartialFloats over every call of at most `pairs` pairs (s * pairs <=
// kDecodeSplitPairs, s <= kDecodeMaxSplit), non-decreasing in pairs: what the workspace holds.
MXMOE_HD int64_t DecodePartialBound(int32_t m1, int32_t m2, int64_t pairs) {
  const int64_t sp = pairs * kDecodeMaxSplit < kDecodeSplitPairs ? pairs * kDecodeMaxSplit : kDecodeSplitPairs;
  return (int64_t{m1} + m2) * sp * kDecodeBlockRows;
}

}  // namespace mxmoe::cuda
