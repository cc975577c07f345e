// The fused decode kernel's work (cuda/decode_plan.h, config n8f), checked on the host with the
// arithmetic the kernel runs: every piece of both GEMMs is one unit, FC2's units come after every
// FC1 unit they wait for and after as few others as the order promises, the parts cover each
// reduction once, and the parts' sums stay within what the workspace holds.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

#include "cuda/decode_plan.h"

namespace mxmoe::cuda {
namespace {

// W13 / W2 row blocks and steps of a layer of hidden size k and intermediate size i (the
// prepacked shapes: rows padded to 64, the reduction to 64; blocks of 256 rows).
DecodePlan PlanOf(int64_t k, int64_t i, int32_t s1, int32_t s2) {
  const auto blocks = [](int64_t rows) { return static_cast<int32_t>(((rows + 63) / 64 * 64 + 255) / 256); };
  DecodePlan p;
  p.m1 = blocks(2 * i);
  p.m2 = blocks(k);
  p.k1 = static_cast<int32_t>((k + 63) / 64);
  p.k2 = static_cast<int32_t>((i + 63) / 64);
  p.s1 = s1;
  p.s2 = s2;
  return p;
}

// Kimi-K3, GPT-OSS-120B and DeepSeek-V3 (SPEC section 5), a tensor-parallel slice of Kimi-K3 (I / 8
// = 384) and small shapes whose sizes are not multiples of the blocks.
const std::pair<int64_t, int64_t> kShapes[] = {{3584, 3072}, {2880, 2880}, {7168, 2048}, {3584, 384},
                                               {256, 160},   {96, 96},     {320, 32},   {992, 320}};

TEST(DecodePlan, EveryPieceOfBothGemmsIsOneUnitAndFc1ComesFirst) {
  for (const auto& [k, i] : kShapes) {
    for (int32_t s1 : {1, 2, 4, 8}) {
      for (int32_t s2 : {1, 2, 4, 8}) {
        const DecodePlan p = PlanOf(k, i, s1, s2);
        for (int32_t tiles : {0, 1, 2, 3, 7, 16}) {
          SCOPED_TRACE(testing::Message() << "K=" << k << " I=" << i << " s1=" << s1 << " s2=" << s2
                                          << " tiles=" << tiles);
          std::set<std::tuple<bool, int32_t, int32_t, int32_t>> seen;
          const int32_t units = DecodeUnits(p, tiles);
          ASSERT_EQ(units, tiles * (p.m1 * s1 + p.m2 * s2));
          for (int32_t u = 0; u < units; ++u) {
            const DecodeUnit w = DecodeUnitOf(p, tiles, u);
            ASSERT_EQ(w.fc1, u < DecodeFc1Units(p, tiles)) << "unit " << u;
            ASSERT_GE(w.tile, 0);
            ASSERT_LT(w.tile, tiles);
            ASSERT_GE(w.block, 0);
            ASSERT_LT(w.block, w.fc1 ? p.m1 : p.m2);
            ASSERT_GE(w.part, 0);
            ASSERT_LT(w.part, w.fc1 ? s1 : s2);
            ASSERT_TRUE(seen.insert({w.fc1, w.tile, w.block, w.part}).second) << "unit " << u << " repeats";
          }
          EXPECT_EQ(static_cast<int32_t>(seen.size()), units);
        }
      }
    }
  }
}

// Each FC2 part's steps read h columns FC1 row blocks wrote: the blocks DecodeFc1BlocksOf names are
// exactly those of its steps, and every FC1 unit of them (any part) comes before the FC2 units of
// part g and within the first GroupStart(g + 1) blocks' units: by the time the CTAs reach FC2's
// part g, nothing FC1 computes later is waited for.
TEST(DecodePlan, Fc2PartsWaitOnlyForFc1UnitsOrderedBeforeThem) {
  for (const auto& [k, i] : kShapes) {
    for (int32_t s1 : {1, 2, 8}) {
      for (int32_t s2 : {1, 2, 4, 8}) {
        const DecodePlan p = PlanOf(k, i, s1, s2);
        const int32_t tiles = 5;
        SCOPED_TRACE(testing::Message() << "K=" << k << " I=" << i << " s1=" << s1 << " s2=" << s2);
        EXPECT_EQ(DecodeGroupStart(p, 0), 0);
        EXPECT_EQ(DecodeGroupStart(p, s2), p.m1);
        for (int32_t g = 0; g < s2; ++g) EXPECT_LE(DecodeGroupStart(p, g), DecodeGroupStart(p, g + 1));
        // Where each FC1 unit sits in the order.
        std::vector<int32_t> fc1_at(static_cast<size_t>(tiles) * p.m1 * s1, -1);
        for (int32_t u = 0; u < DecodeFc1Units(p, tiles); ++u) {
          const DecodeUnit w = DecodeUnitOf(p, tiles, u);
          fc1_at[(static_cast<size_t>(w.tile) * p.m1 + w.block) * s1 + w.part] = u;
        }
        for (int32_t u = DecodeFc1Units(p, tiles); u < DecodeUnits(p, tiles); ++u) {
          const DecodeUnit w = DecodeUnitOf(p, tiles, u);
          int32_t first = 0, count = 0, lo = 0, hi = 0;
          DecodePartSteps(p.k2, s2, w.part, &first, &count);
          DecodeFc1BlocksOf(first, count, &lo, &hi);
          std::set<int32_t> wanted;
          for (int32_t kt = first; kt < first + count; ++kt) wanted.insert(kt * 64 / 128);  // h column / block width
          ASSERT_EQ(static_cast<int32_t>(wanted.size()), hi - lo) << "unit " << u;
          for (int32_t m = lo; m < hi; ++m) {
            ASSERT_TRUE(wanted.count(m)) << "unit " << u << " block " << m;
            ASSERT_LT(m, p.m1);
            for (int32_t part = 0; part < s1; ++part) {
              const int32_t at = fc1_at[(static_cast<size_t>(w.tile) * p.m1 + m) * s1 + part];
              ASSERT_GE(at, 0);
              ASSERT_LT(at, u);
              ASSERT_LT(at, tiles * DecodeGroupStart(p, w.part + 1) * s1) << "FC2 unit " << u << " waits late";
            }
          }
          // FC2 goes part by part.
          if (u > DecodeFc1Units(p, tiles)) EXPECT_GE(w.part, DecodeUnitOf(p, tiles, u - 1).part);
        }
      }
    }
  }
}

TEST(DecodePlan, PartsCoverEachReductionOnce) {
  for (int32_t k = 1; k <= 120; ++k) {
    for (int32_t s = 1; s <= kDecodeMaxSplit; ++s) {
      int32_t next = 0;
      for (int32_t part = 0; part < s; ++part) {
        int32_t first = 0, count = 0;
        DecodePartSteps(k, s, part, &first, &count);
        ASSERT_EQ(first, next) << "k=" << k << " s=" << s << " part " << part;
        ASSERT_GE(count, 0);
        ASSERT_LE(count, (k + s - 1) / s);
        next = first + count;
      }
      ASSERT_EQ(next, k) << "k=" << k << " s=" << s;
    }
  }
}

// The parts chosen for a call: a power of two, s * pairs <= kDecodeSplitPairs, at least
// kDecodeMinPartSteps steps each; so the sums of any call of at most P pairs fit
// DecodePartialBound(P), which never falls as P grows (the workspace of T serves fewer tokens).
TEST(DecodePlan, PartsKeepTheirSumsWithinTheWorkspaceBound) {
  for (const auto& [k, i] : kShapes) {
    const DecodePlan base = PlanOf(k, i, 1, 1);
    int64_t last_bound = 0;
    for (int64_t pairs = 1; pairs <= kDecodeMaxPairs; ++pairs) {
      const int32_t s1 = DecodeSplitFor(pairs, base.k1), s2 = DecodeSplitFor(pairs, base.k2);
      for (int32_t s : {s1, s2}) {
        EXPECT_EQ(s & (s - 1), 0);
        EXPECT_LE(s, kDecodeMaxSplit);
        if (s > 1) EXPECT_LE(s * pairs, kDecodeSplitPairs);
      }
      if (s1 > 1) EXPECT_GE(base.k1, s1 * kDecodeMinPartSteps);
      if (s2 > 1) EXPECT_GE(base.k2, s2 * kDecodeMinPartSteps);
      const DecodePlan p = PlanOf(k, i, s1, s2);
      const int64_t bound = DecodePartialBound(p.m1, p.m2, pairs);
      EXPECT_LE(DecodePartialFloats(p, pairs), bound) << "K=" << k << " I=" << i << " pairs=" << pairs;
      EXPECT_GE(bound, last_bound);
      last_bound = bound;
      EXPECT_EQ(DecodeFc1PartialFloats(p, pairs), s1 > 1 ? int64_t{p.m1} * s1 * pairs * kDecodeBlockRows : 0);
    }
  }
  // Kimi-K3 at T = 1 (16 pairs): eight parts of 7 FC1 / 6 FC2 steps, 3072 + 1792 units for 16
  // tiles; T = 4 (64 pairs) two parts; T = 16 (256 pairs) whole tiles; GPT-OSS-120B at T = 1 (4
  // pairs) eight parts.
  EXPECT_EQ(DecodeSplitFor(16, 56), 8);
  EXPECT_EQ(DecodeSplitFor(16, 48), 8);
  EXPECT_EQ(DecodeUnits(PlanOf(3584, 3072, 8, 8), 16), 3072 + 1792);
  EXPECT_EQ(DecodeSplitFor(64, 56), 2);
  EXPECT_EQ(DecodeSplitFor(256, 56), 1);
  EXPECT_EQ(DecodeSplitFor(4, 45), 8);
  EXPECT_EQ(DecodeSplitFor(4, 15), 4);  // at least 2 steps a part
  EXPECT_EQ(DecodeSplitFor(4, 3), 1);
}

// The words the kernel counts in and raises flags at (DecodeArrivalWord, DecodeReadyWord,
// DecodeDoneWord): one per (GEMM, tile, row block), one per FC1 (tile, row block) and one per FC2
// row block, all distinct and all within DecodeSyncWords, the words the input quantization clears.
TEST(DecodePlan, SyncWordsAreDistinctAndCleared) {
  for (const auto& [k, i] : kShapes) {
    const DecodePlan p = PlanOf(k, i, 4, 2);
    for (int64_t max_tiles : {1, 5, 16}) {
      std::set<int64_t> words;
      for (int32_t tile = 0; tile < max_tiles; ++tile) {
        for (int32_t m = 0; m < p.m1; ++m) {
          ASSERT_TRUE(words.insert(DecodeArrivalWord(p, max_tiles, true, tile, m)).second);
          ASSERT_TRUE(words.insert(DecodeReadyWord(p, max_tiles, tile, m)).second);
        }
        for (int32_t m = 0; m < p.m2; ++m)
          ASSERT_TRUE(words.insert(DecodeArrivalWord(p, max_tiles, false, tile, m)).second);
      }
      for (int32_t m = 0; m < p.m2; ++m) ASSERT_TRUE(words.insert(DecodeDoneWord(p, max_tiles, m)).second);
      ASSERT_EQ(static_cast<int64_t>(words.size()), DecodeSyncWords(p, max_tiles));
      EXPECT_EQ(*words.begin(), 0);
      EXPECT_EQ(*words.rbegin(), DecodeSyncWords(p, max_tiles) - 1);
    }
  }
}

// The parts' sums: one float per (GEMM, row block, part, position, row), all distinct, within
// DecodePartialFloats, and laid out as the kernel strides them (a part's sums pairs * 256 floats
// apart, a position's 256).
TEST(DecodePlan, PartialSumsAreDistinctAndWithinTheirFloats) {
  for (const auto& [k, i] : kShapes) {
    for (int64_t pairs : {1, 4, 16, 64}) {
      const DecodePlan p = PlanOf(k, i, DecodeSplitFor(pairs, PlanOf(k, i, 1, 1).k1),
                                  DecodeSplitFor(pairs, PlanOf(k, i, 1, 1).k2));
      SCOPED_TRACE(testing::Message() << "K=" << k << " I=" << i << " pairs=" << pairs << " s1=" << p.s1
                                      << " s2=" << p.s2);
      std::vector<bool> seen(static_cast<size_t>(DecodePartialFloats(p, pairs)), false);
      for (bool fc1 : {true, false}) {
        const int32_t parts = fc1 ? p.s1 : p.s2, blocks = fc1 ? p.m1 : p.m2;
        if (parts == 1) continue;  // (whole tiles leave no sums)
        for (int32_t m = 0; m < blocks; ++m) {
          const int64_t base = DecodePartialFloat(p, pairs, fc1, m, 0, 0, 0);
          for (int32_t part = 0; part < parts; ++part)
            for (int64_t pos = 0; pos < pairs; ++pos)
              for (int32_t row = 0; row < kDecodeBlockRows; ++row) {
                const int64_t at = DecodePartialFloat(p, pairs, fc1, m, part, pos, row);
                ASSERT_EQ(at, base + (part * pairs + pos) * kDecodeBlockRows + row);
                ASSERT_GE(at, 0);
                ASSERT_LT(at, static_cast<int64_t>(seen.size()));
                ASSERT_FALSE(seen[static_cast<size_t>(at)]);
                seen[static_cast<size_t>(at)] = true;
              }
        }
      }
      for (bool b : seen) ASSERT_TRUE(b);  // (and nothing unused in between)
    }
  }
}

// The folded combine's units: one per (FC2 row block, token), after the GEMMs' units, also with no
// tile (a rank with no local pair still writes its zeros).
TEST(DecodePlan, CombineUnitsCoverEveryBlockAndTokenOnce) {
  for (int64_t tokens : {1, 7, 8, 9, 16, 64, 256}) {
    DecodePlan p = PlanOf(3584, 3072, 4, 4);
    p.combine_tokens = static_cast<int32_t>(tokens);
    EXPECT_EQ(DecodeCombineUnits(p), p.m2 * tokens);
    std::set<std::pair<int32_t, int32_t>> seen;
    for (int32_t c = 0; c < DecodeCombineUnits(p); ++c) {
      int32_t block = -1, token = -1;
      DecodeCombineUnitOf(p, c, &block, &token);
      ASSERT_GE(block, 0);
      ASSERT_LT(block, p.m2);
      ASSERT_GE(token, 0);
      ASSERT_LT(token, tokens);
      ASSERT_TRUE(seen.insert({block, token}).second);
    }
    EXPECT_EQ(static_cast<int32_t>(seen.size()), DecodeCombineUnits(p));
    EXPECT_EQ(DecodeUnits(p, 16), 16 * (p.m1 * 4 + p.m2 * 4));  // (the GEMMs' units alone)
  }
}

}  // namespace
}  // namespace mxmoe::cuda
