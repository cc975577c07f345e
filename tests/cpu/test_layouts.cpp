// Fused FC1 layouts of other engines (SPEC section 4): SGLang [gate; up], FlashInfer [up; gate],
// GPT-OSS interleaved. Every check that reaches the MoE uses an asymmetric activation (SiTU first),
// so converting with the wrong layout is caught: a swapped gate/up changes the output.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/compare.h"
#include "common/moe_run.h"
#include "common/random.h"
#include "mxmoe/formats.h"
#include "mxmoe/layouts.h"
#include "mxmoe/moe.h"
#include "mxmoe/synthetic.h"

namespace mxmoe {
namespace {

using test::TestRng;

const Fc1Layout kLayouts[] = {Fc1Layout::kGateUp, Fc1Layout::kUpGate, Fc1Layout::kInterleaved};

Mxfp4Matrix RandomMatrix(int64_t rows, int64_t cols, TestRng& rng) {
  Mxfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(rows * cols / 2);
  m.scales.resize(rows * cols / kMxBlock);
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng.Next());
  for (auto& s : m.scales) s = static_cast<uint8_t>(120 + rng.Below(6));
  return m;
}

void ExpectSameMatrix(const Mxfp4Matrix& got, const Mxfp4Matrix& want, const std::string& what) {
  EXPECT_EQ(got.rows, want.rows) << what;
  EXPECT_EQ(got.cols, want.cols) << what;
  EXPECT_TRUE(test::BytesEqual(got.packed, want.packed, {want.rows, want.cols / 2})) << what << " packed";
  EXPECT_TRUE(test::BytesEqual(got.scales, want.scales, {want.rows, want.cols / kMxBlock})) << what << " scales";
}

// Row r of m as its own matrix, for comparisons.
Mxfp4Matrix Row(const Mxfp4Matrix& m, int64_t r) { return SliceRows(m, r, 1); }

TEST(Layouts, Names) {
  EXPECT_STREQ(Fc1LayoutName(Fc1Layout::kGateUp), "gate_up");
  EXPECT_STREQ(Fc1LayoutName(Fc1Layout::kUpGate), "up_gate");
  EXPECT_STREQ(Fc1LayoutName(Fc1Layout::kInterleaved), "interleaved");
  EXPECT_EQ(Fc1LayoutFromName("sglang"), Fc1Layout::kGateUp);
  EXPECT_EQ(Fc1LayoutFromName("gate_up"), Fc1Layout::kGateUp);
  EXPECT_EQ(Fc1LayoutFromName("flashinfer"), Fc1Layout::kUpGate);
  EXPECT_EQ(Fc1LayoutFromName("UP_GATE"), Fc1Layout::kUpGate);
  EXPECT_EQ(Fc1LayoutFromName("gpt_oss"), Fc1Layout::kInterleaved);
  EXPECT_EQ(Fc1LayoutFromName("interleaved"), Fc1Layout::kInterleaved);
  EXPECT_FALSE(Fc1LayoutFromName("gateup").has_value());
  EXPECT_FALSE(Fc1LayoutFromName("").has_value());
}

// A fused [2I, K] matrix, I = 3, whose every row is recognizable (its own scale bytes and codes);
// which fused row lands in w1 (gate) and w3 (up) row i is written out per layout.
TEST(Layouts, HandBuiltFusedMatrixGoesToTheRightHalves) {
  TestRng rng(21);
  const int64_t half = 3, k = 64;
  Mxfp4Matrix w13 = RandomMatrix(2 * half, k, rng);
  for (int64_t r = 0; r < 2 * half; ++r) {
    w13.scales[r * 2] = static_cast<uint8_t>(100 + r);
    w13.packed[r * (k / 2)] = static_cast<uint8_t>(0x11 * (r + 1));
  }
  struct Want {
    Fc1Layout layout;
    int gate[3];
    int up[3];
  };
  const Want wants[] = {
      {Fc1Layout::kGateUp, {0, 1, 2}, {3, 4, 5}},       // SGLang: gate rows first
      {Fc1Layout::kUpGate, {3, 4, 5}, {0, 1, 2}},       // FlashInfer: up (w3) rows first
      {Fc1Layout::kInterleaved, {0, 2, 4}, {1, 3, 5}},  // GPT-OSS: gate 2i, up 2i+1
  };
  for (const Want& w : wants) {
    Mxfp4Matrix w1, w3;
    const Status st = SplitW13(w13, w.layout, &w1, &w3);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(w1.Validate("w1", half, k).ok());
    ASSERT_TRUE(w3.Validate("w3", half, k).ok());
    for (int i = 0; i < half; ++i) {
      const std::string where = std::string(Fc1LayoutName(w.layout)) + " row " + std::to_string(i);
      ExpectSameMatrix(Row(w1, i), Row(w13, w.gate[i]), where + " gate");
      ExpectSameMatrix(Row(w3, i), Row(w13, w.up[i]), where + " up");
      EXPECT_EQ(w1.scales[i * 2], 100 + w.gate[i]) << where;
      EXPECT_EQ(w3.scales[i * 2], 100 + w.up[i]) << where;
      for (int64_t c = 0; c < k; ++c) {
        ASSERT_EQ(w1.At(i, c), w13.At(w.gate[i], c));
        ASSERT_EQ(w3.At(i, c), w13.At(w.up[i], c));
      }
    }
    // And back.
    Mxfp4Matrix fused;
    ASSERT_TRUE(FuseW13(w1, w3, w.layout, &fused).ok());
    ExpectSameMatrix(fused, w13, Fc1LayoutName(w.layout));
  }
}

TEST(Layouts, BiasSplitByHand) {
  const std::vector<float> b13 = {100, 101, 102, 103, 104, 105};
  std::vector<float> gate, up;
  ASSERT_TRUE(SplitBias13(b13, Fc1Layout::kGateUp, &gate, &up).ok());
  EXPECT_EQ(gate, (std::vector<float>{100, 101, 102}));
  EXPECT_EQ(up, (std::vector<float>{103, 104, 105}));
  ASSERT_TRUE(SplitBias13(b13, Fc1Layout::kUpGate, &gate, &up).ok());
  EXPECT_EQ(gate, (std::vector<float>{103, 104, 105}));
  EXPECT_EQ(up, (std::vector<float>{100, 101, 102}));
  ASSERT_TRUE(SplitBias13(b13, Fc1Layout::kInterleaved, &gate, &up).ok());
  EXPECT_EQ(gate, (std::vector<float>{100, 102, 104}));
  EXPECT_EQ(up, (std::vector<float>{101, 103, 105}));
}

TEST(Layouts, FuseSplitRoundTrips) {
  TestRng rng(22);
  for (Fc1Layout layout : kLayouts) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {5, 64}, {64, 96}, {96, 256}}) {
      const Mxfp4Matrix w1 = RandomMatrix(rows, cols, rng), w3 = RandomMatrix(rows, cols, rng);
      Mxfp4Matrix w13, b1, b3;
      ASSERT_TRUE(FuseW13(w1, w3, layout, &w13).ok());
      ASSERT_TRUE(w13.Validate("w13", 2 * rows, cols).ok());
      ASSERT_TRUE(SplitW13(w13, layout, &b1, &b3).ok());
      ExpectSameMatrix(b1, w1, std::string(Fc1LayoutName(layout)) + " w1");
      ExpectSameMatrix(b3, w3, std::string(Fc1LayoutName(layout)) + " w3");
      // Split then fuse of an arbitrary fused matrix.
      const Mxfp4Matrix f = RandomMatrix(2 * rows, cols, rng);
      Mxfp4Matrix s1, s3, back;
      ASSERT_TRUE(SplitW13(f, layout, &s1, &s3).ok());
      ASSERT_TRUE(FuseW13(s1, s3, layout, &back).ok());
      ExpectSameMatrix(back, f, Fc1LayoutName(layout));
    }
  }
}

TEST(Layouts, RefusesMalformedInput) {
  TestRng rng(23);
  Mxfp4Matrix w1, w3;
  const Mxfp4Matrix odd = RandomMatrix(5, 32, rng);
  Status st = SplitW13(odd, Fc1Layout::kGateUp, &w1, &w3, "experts.0.w13");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("experts.0.w13"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("5"), std::string::npos) << st.message();
  Mxfp4Matrix empty;
  empty.cols = 32;
  EXPECT_FALSE(SplitW13(empty, Fc1Layout::kGateUp, &w1, &w3).ok());
  Mxfp4Matrix truncated = RandomMatrix(4, 64, rng);
  truncated.packed.pop_back();
  st = SplitW13(truncated, Fc1Layout::kInterleaved, &w1, &w3, "w13");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("packed"), std::string::npos) << st.message();
  Mxfp4Matrix bad_scales = RandomMatrix(4, 64, rng);
  bad_scales.scales.push_back(0);
  EXPECT_FALSE(SplitW13(bad_scales, Fc1Layout::kGateUp, &w1, &w3).ok());
  // w1 and w3 of different shapes do not fuse.
  Mxfp4Matrix out;
  st = FuseW13(RandomMatrix(4, 64, rng), RandomMatrix(3, 64, rng), Fc1Layout::kGateUp, &out);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("w3"), std::string::npos) << st.message();
  // Bias of odd length or empty.
  std::vector<float> g, u;
  st = SplitBias13({1, 2, 3}, Fc1Layout::kGateUp, &g, &u, "w13_bias");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("w13_bias"), std::string::npos) << st.message();
  EXPECT_FALSE(SplitBias13({}, Fc1Layout::kGateUp, &g, &u).ok());
}

TEST(Layouts, SliceRowsAndCols) {
  TestRng rng(24);
  const Mxfp4Matrix m = RandomMatrix(8, 128, rng);
  const Mxfp4Matrix r = SliceRows(m, 2, 3);
  ASSERT_TRUE(r.Validate("rows", 3, 128).ok());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t c = 0; c < 128; ++c) ASSERT_EQ(float_bits(r.At(i, c)), float_bits(m.At(2 + i, c))) << i << "," << c;
  for (int64_t col0 : {0, 32, 64}) {
    const Mxfp4Matrix s = SliceCols(m, col0, 64);
    ASSERT_TRUE(s.Validate("cols", 8, 64).ok());
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t c = 0; c < 64; ++c)
        ASSERT_EQ(float_bits(s.At(i, c)), float_bits(m.At(i, col0 + c))) << i << "," << c;
      EXPECT_EQ(s.scales[i * 2], m.scales[i * 4 + col0 / 32]);
      EXPECT_EQ(s.scales[i * 2 + 1], m.scales[i * 4 + col0 / 32 + 1]);
    }
  }
  // The whole matrix.
  ExpectSameMatrix(SliceRows(m, 0, 8), m, "all rows");
  ExpectSameMatrix(SliceCols(m, 0, 128), m, "all cols");
}

// ---- through the MoE --------------------------------------------------------------------------

// Fused biases written per layout by hand (the inverse of SplitBias13).
std::vector<float> FuseBias(const std::vector<float>& gate, const std::vector<float>& up, Fc1Layout layout) {
  std::vector<float> b;
  switch (layout) {
    case Fc1Layout::kGateUp:
      b = gate;
      b.insert(b.end(), up.begin(), up.end());
      break;
    case Fc1Layout::kUpGate:
      b = up;
      b.insert(b.end(), gate.begin(), gate.end());
      break;
    case Fc1Layout::kInterleaved:
      for (size_t i = 0; i < gate.size(); ++i) b.push_back(gate[i]), b.push_back(up[i]);
      break;
  }
  return b;
}

// The set rebuilt from each expert's fused FC1 (and fused bias) written in `written`, read back
// as `read`.
ExpertSet Reconvert(const ExpertSet& s, Fc1Layout written, Fc1Layout read) {
  ExpertSet r = s;
  for (ExpertWeights& w : r.experts) {
    Mxfp4Matrix w13;
    EXPECT_TRUE(FuseW13(w.w1, w.w3, written, &w13).ok());
    EXPECT_TRUE(SplitW13(w13, read, &w.w1, &w.w3).ok());
    if (!w.gate_bias.empty()) {
      const std::vector<float> b13 = FuseBias(w.gate_bias, w.up_bias, written);
      EXPECT_TRUE(SplitBias13(b13, read, &w.gate_bias, &w.up_bias).ok());
    }
  }
  return r;
}

size_t CountDifferent(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += float_bits(a[i]) != float_bits(b[i]);
  return n;
}

void CheckLayoutsThroughMoe(ActivationType act, bool with_bias) {
  const LayerShape shape{/*num_experts=*/4, /*hidden=*/64, /*intermediate=*/96, /*top_k=*/2};
  const ExpertSet base = test::SyntheticSet(shape, test::Act(act), 31, {}, with_bias);
  SyntheticInput input;
  MakeSyntheticInput(shape, 7, RoutingPattern::kUniform, 32, &input);
  const MoeInput in = test::InputOf(input);
  const std::vector<float> want = test::ReferenceF32(base, in);
  for (Fc1Layout written : kLayouts) {
    for (Fc1Layout read : kLayouts) {
      const ExpertSet s = Reconvert(base, written, read);
      const std::vector<float> got = test::ReferenceF32(s, in);
      const std::string what = std::string(ActivationName(act)) + ": written " + Fc1LayoutName(written) +
                               ", read " + Fc1LayoutName(read);
      if (written == read) {
        EXPECT_TRUE(test::BitwiseEqual(got, want, {7, 64})) << what;
      } else {
        // A wrong layout must show: most outputs change, not a stray element.
        EXPECT_GT(CountDifferent(got, want), want.size() / 2) << what;
      }
    }
  }
}

TEST(Layouts, ThroughReferenceMoeSitu) { CheckLayoutsThroughMoe(ActivationType::Situ, false); }
TEST(Layouts, ThroughReferenceMoeSwiglu) { CheckLayoutsThroughMoe(ActivationType::Swiglu, false); }
TEST(Layouts, ThroughReferenceMoeSwigluBiasWithBiases) {
  CheckLayoutsThroughMoe(ActivationType::SwigluBias, true);
}

// Only the biases in the wrong layout (weights right): still visible.
TEST(Layouts, WrongBiasLayoutIsVisible) {
  const LayerShape shape{2, 64, 64, 1};
  const ExpertSet base = test::SyntheticSet(shape, test::Act(ActivationType::SwigluBias), 33, {}, true);
  SyntheticInput input;
  MakeSyntheticInput(shape, 4, RoutingPattern::kUniform, 34, &input);
  const MoeInput in = test::InputOf(input);
  const std::vector<float> want = test::ReferenceF32(base, in);
  ExpertSet s = base;
  for (ExpertWeights& w : s.experts) {
    const std::vector<float> b13 = FuseBias(w.gate_bias, w.up_bias, Fc1Layout::kGateUp);
    ASSERT_TRUE(SplitBias13(b13, Fc1Layout::kUpGate, &w.gate_bias, &w.up_bias).ok());
  }
  EXPECT_GT(CountDifferent(test::ReferenceF32(s, in), want), want.size() / 2);
}

}  // namespace
}  // namespace mxmoe
