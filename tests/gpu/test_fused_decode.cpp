// n8f, both GEMMs of a decode call in one persistent kernel (sm90/moe_decode.cu, perf-log v21):
// against the references on layers whose reductions split into parts and on layers where they do
// not, for every routing pattern, on tensor- and expert-parallel slices, in CUDA graphs, and in a
// workspace full of garbage (the synchronization words must be cleared by the call itself).
// Calls of more than kDecodeMaxPairs pairs run n8's two kernels under the same name.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/moe_run.h"
#include "cuda/decode_plan.h"
#include "cuda/heuristics.h"
#include "cuda/moe_kernels.h"
#include "gpu/gpu_harness.h"
#include "gpu/tolerance.h"
#include "mxmoe/cuda.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {
namespace {

struct ForcedN8f {
  ForcedN8f() { cuda::ForceGemmConfig(static_cast<int>(cuda::GemmConfigId::kN8f)); }
  ~ForcedN8f() { cuda::ForceGemmConfig(-1); }
};

SyntheticInput Input(const LayerShape& s, int64_t t, RoutingPattern p, uint64_t seed) {
  SyntheticInput in;
  MakeSyntheticInput(s, t, p, seed, &in);
  return in;
}

constexpr RoutingPattern kPatterns[] = {RoutingPattern::kUniform, RoutingPattern::kOneExpert,
                                        RoutingPattern::kFewExperts, RoutingPattern::kWithInvalid,
                                        RoutingPattern::kHeavyHitters};

// Kimi-K3's expert shape with fewer experts (SiTU), on the GPU.
struct KimiLayer {
  LayerShape s = kKimiK3Shape;
  ExpertSet set;
  std::unique_ptr<CudaMoe> moe;
  KimiLayer(int64_t experts, uint64_t seed) {
    s.num_experts = experts;
    set = SyntheticSet(s, Act(ActivationType::Situ), seed);
    moe = MakeCudaMoe(set);
  }
};

// Turns the folded combine (MXMOE_DECODE_COMBINE) on or off for the scope, then back.
using ScopedCombine = ScopedSetting<&cuda::DecodeCombineEnabled, &cuda::SetDecodeCombine>;

// The fp32 output twice (bit for bit the same) and the bf16 output once, the fp32 one against ref;
// each call through the fused kernel when the call has at most kDecodeMaxPairs pairs (its launch
// count proves it ran), else through n8's kernels. The workspace is 0xFF bytes before each run: h
// holds NaN until FC1 writes it, so an FC2 unit that read it too early would poison the output, and
// every flag and count would be set. With the combine folded into the kernel (fused calls only) the
// bits are the combine kernel's.
void ExpectRunsMatch(const CudaMoe& moe, DeviceCase& dc, const std::vector<float>& ref, int64_t pair_width) {
  const int64_t t = dc.tokens(), hidden = moe.Layout().shape.hidden;
  const bool fused = t * moe.Layout().shape.top_k <= cuda::kDecodeMaxPairs;
  const int64_t launches = cuda::FusedDecodeLaunches();
  const auto garbage = [&] { ASSERT_EQ(dc.PoisonWorkspace(), cudaSuccess); };
  std::vector<float> a;
  std::vector<uint16_t> a16;
  {
    const ScopedCombine off(false);
    EXPECT_EQ(moe.Plan(t), fused ? "n8f" : "n8f as n8");
    garbage();
    a = dc.RunF32();
    EXPECT_TRUE(MoeCloseF32(a, ref, {t, hidden}, pair_width));
    garbage();
    EXPECT_TRUE(BitwiseEqual(dc.RunF32(), a, {t, hidden}));
    garbage();
    a16 = dc.RunBf16();
    EXPECT_TRUE(AllWritten(a16, {t, hidden}));
  }
  {
    const ScopedCombine on(true);
    EXPECT_EQ(moe.Plan(t), fused ? "n8f+combine" : "n8f as n8");
    garbage();
    EXPECT_TRUE(BitwiseEqual(dc.RunF32(), a, {t, hidden})) << "combine folded in";
    garbage();
    EXPECT_TRUE(BitwiseEqualBf16(dc.RunBf16(), a16, {t, hidden})) << "combine folded in";
  }
  EXPECT_EQ(cuda::FusedDecodeLaunches() - launches, fused ? 5 : 0);
}

// Small layers against the CPU reference. Parts per GEMM (decode_plan.h, DecodeSplitFor) at T = 1:
// K = 992 (16 steps) FC1 in 8 parts of 2, I = 320 (5 steps) FC2 in parts of 3 and 2; K = I = 2112
// (33 steps) 8 parts of 5 steps, the last one empty; both make FC2 parts that end inside an FC1 row
// block (its 128 intermediates are FC2 steps 2 m and 2 m + 1); K = 256 (4 steps) 2 parts and I =
// 160 (3 steps) whole; K = 320 in 2 parts and I = 32 whole; K = I = 96 whole. T = 64 at k = 6 is
// past kDecodeMaxPairs: n8's kernels.
TEST(CudaFusedDecode, SmallLayersMatchCpuReference) {
  MXMOE_REQUIRE_SM90();
  struct Case {
    LayerShape shape;
    ActivationType kind;
  };
  const Case cases[] = {{{8, 992, 320, 4}, ActivationType::Situ},
                        {{8, 2112, 2112, 4}, ActivationType::Situ},
                        {{16, 256, 160, 6}, ActivationType::SwigluBias},
                        {{6, 96, 96, 3}, ActivationType::GegluTanh},
                        {{4, 320, 32, 2}, ActivationType::Swiglu}};
  const ForcedN8f forced;
  uint64_t seed = 2100;
  for (const Case& c : cases) {
    const LayerShape& s = c.shape;
    ExpertSet set = SyntheticSet(s, SpecFor(c.kind, s.num_experts), ++seed, {}, c.kind == ActivationType::SwigluBias);
    auto moe = MakeCudaMoe(set);
    ASSERT_TRUE(moe);
    for (int64_t t : {1, 2, 5, 16, 64}) {
      for (RoutingPattern pat : kPatterns) {
        const SyntheticInput in = Input(s, t, pat, ++seed);
        SCOPED_TRACE(std::string(ActivationName(c.kind)) + " " + RoutingPatternName(pat) + " T=" + std::to_string(t) +
                     " K=" + std::to_string(s.hidden) + " I=" + std::to_string(s.intermediate));
        DeviceCase dc(*moe, in);
        ExpectRunsMatch(*moe, dc, CpuBackendF32(set, InputOf(in)), s.top_k * s.intermediate);
      }
    }
  }
}

// Kimi-K3's expert shape (32 of its experts): FC1 and FC2 in 4 parts at T = 1, 2 at T = 2, whole
// from T = 4; up to 256 pairs (T = 16). Against the unfused GPU reference, and against n8.
TEST(CudaFusedDecode, KimiShapedCallsMatchGpuReference) {
  MXMOE_REQUIRE_SM90();
  const KimiLayer layer(32, 2200);
  ASSERT_TRUE(layer.moe);
  const LayerShape& s = layer.s;
  CudaMoe* const moe = layer.moe.get();
  uint64_t seed = 2200;
  for (int64_t t : {1, 2, 3, 4, 8, 16}) {
    for (RoutingPattern pat : {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kWithInvalid,
                               RoutingPattern::kHeavyHitters}) {
      SCOPED_TRACE(std::string(RoutingPatternName(pat)) + " T=" + std::to_string(t));
      DeviceCase dc(*moe, Input(s, t, pat, ++seed));
      const auto ref = dc.RunF32(/*reference=*/true);
      std::vector<float> n8;
      {
        cuda::ForceGemmConfig(static_cast<int>(cuda::GemmConfigId::kN8));
        n8 = dc.RunF32();
        cuda::ForceGemmConfig(-1);
      }
      const ForcedN8f forced;
      ExpectRunsMatch(*moe, dc, ref, s.top_k * s.intermediate);
      EXPECT_TRUE(MoeCloseF32(dc.RunF32(), n8, {t, s.hidden}, s.top_k * s.intermediate)) << "against n8";
    }
  }
}

// The synchronization words live in the workspace and are cleared by each call's input
// quantization: a workspace of 0xFF bytes (every flag raised, every count -1) gives the same bits,
// and so do calls of other sizes in between (their words lie elsewhere: the layout follows the
// call's tile bound).
TEST(CudaFusedDecode, GarbageWorkspaceAndOtherCallsLeaveTheBitsAlone) {
  MXMOE_REQUIRE_SM90();
  const KimiLayer layer(24, 2300);
  ASSERT_TRUE(layer.moe);
  const LayerShape& s = layer.s;
  CudaMoe* const moe = layer.moe.get();
  const ForcedN8f forced;
  DeviceCase big(*moe, Input(s, 16, RoutingPattern::kHeavyHitters, 2301));  // WorkspaceSize(16)
  const auto big_clean = big.RunF32();
  for (int64_t t : {1, 2, 7}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    DeviceCase small(*moe, Input(s, t, RoutingPattern::kUniform, 2302 + t));
    const auto clean = small.RunF32();
    ASSERT_EQ(big.PoisonWorkspace(), cudaSuccess);
    small.Poison();
    const Status st = moe->Run(small.Input(), small.Output(OutputDType::kF32), big.workspace(), big.workspace_bytes(),
                               nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(BitwiseEqual(small.Fetch<float>(), clean, {t, s.hidden}));
    EXPECT_TRUE(BitwiseEqual(big.RunF32(), big_clean, {16, s.hidden}));
  }
}

// The parts' sums are added in part order whoever finishes last, so the result does not depend on
// how many CTAs share the units: capped at 1 CTA (every unit in order, FC2 after all of FC1) and
// 2 CTAs (FC2 units beside FC1 units of the same tile, waiting on their flags) it is the same bits.
TEST(CudaFusedDecode, AnyNumberOfCtasGivesTheSameBits) {
  MXMOE_REQUIRE_SM90();
  const KimiLayer layer(24, 2350);
  ASSERT_TRUE(layer.moe);
  const LayerShape& s = layer.s;
  CudaMoe* const moe = layer.moe.get();
  const ForcedN8f forced;
  for (int64_t t : {1, 4}) {
    DeviceCase dc(*moe, Input(s, t, RoutingPattern::kHeavyHitters, 2351 + t));
    const auto all = dc.RunF32();
    for (bool combine : {false, true}) {  // (with it folded in, its units come last, after FC2's)
      const ScopedCombine folded(combine);
      for (int ctas : {1, 2, 3}) {
        SCOPED_TRACE("T=" + std::to_string(t) + ", " + std::to_string(ctas) + " CTAs" + (combine ? ", combine" : ""));
        cuda::LimitPersistentCtas(ctas);
        const auto capped = dc.RunF32();
        cuda::LimitPersistentCtas(0);
        EXPECT_TRUE(BitwiseEqual(capped, all, {t, s.hidden}));
      }
    }
  }
}

// FC1 units that hold their flags back (SetDecodeFc1Delay) make FC2 units wait on them: the same
// bits, in a workspace of 0xFF bytes (a missing or wrong wait reads NaN intermediates). The small
// layer's units all start at once (48 FC1 and 16 FC2 units at T = 1), so its FC2 units wait for
// sure; the Kimi-shaped one's at T = 1, 2 and 4 (parts of 4, 2 and 1) in its order.
TEST(CudaFusedDecode, Fc2WaitsForDelayedFc1Flags) {
  MXMOE_REQUIRE_SM90();
  const LayerShape small{8, 992, 320, 4};
  ExpertSet small_set = SyntheticSet(small, Act(ActivationType::Situ), 2370);
  auto small_moe = MakeCudaMoe(small_set);
  ASSERT_TRUE(small_moe);
  const KimiLayer kimi(24, 2380);
  ASSERT_TRUE(kimi.moe);
  const ForcedN8f forced;
  struct Delay {
    explicit Delay(int32_t ns) { cuda::SetDecodeFc1Delay(ns); }
    ~Delay() { cuda::SetDecodeFc1Delay(0); }
  };
  using Layer = std::pair<const CudaMoe*, LayerShape>;
  for (const auto& [moe, s] : {Layer{small_moe.get(), small}, Layer{kimi.moe.get(), kimi.s}}) {
    for (int64_t t : {1, 2, 4}) {
      SCOPED_TRACE("K=" + std::to_string(s.hidden) + " T=" + std::to_string(t));
      DeviceCase dc(*moe, Input(s, t, RoutingPattern::kUniform, 2390 + t));
      ASSERT_EQ(dc.PoisonWorkspace(), cudaSuccess);
      const auto undelayed = dc.RunF32();
      const Delay delay(50000);  // 50 µs per FC1 row block
      ASSERT_EQ(dc.PoisonWorkspace(), cudaSuccess);
      EXPECT_TRUE(BitwiseEqual(dc.RunF32(), undelayed, {t, s.hidden}));
      const ScopedCombine folded(true);  // (its units wait on FC2's, which wait on FC1's)
      ASSERT_EQ(dc.PoisonWorkspace(), cudaSuccess);
      EXPECT_TRUE(BitwiseEqual(dc.RunF32(), undelayed, {t, s.hidden})) << "combine folded in";
    }
  }
}

// Captured once, replayed on new inputs: each replay clears its own words.
TEST(CudaFusedDecode, GraphReplaysEqualEager) {
  MXMOE_REQUIRE_SM90();
  const KimiLayer layer(24, 2400);
  ASSERT_TRUE(layer.moe);
  const LayerShape& s = layer.s;
  CudaMoe* const moe = layer.moe.get();
  const ForcedN8f forced;
  for (const auto& [t, combine] : {std::pair<int64_t, bool>{1, false}, {16, false}, {1, true}, {16, true}}) {
    SCOPED_TRACE("T=" + std::to_string(t) + (combine ? ", combine folded in" : ""));
    const ScopedCombine folded(combine);
    DeviceCase dc(*moe, Input(s, t, RoutingPattern::kUniform, 2401 + t));
    CapturedCall captured(dc, OutputDType::kBF16);
    ASSERT_TRUE(captured.status().ok()) << captured.status().ToString();
    for (RoutingPattern pat : {RoutingPattern::kHeavyHitters, RoutingPattern::kOneExpert, RoutingPattern::kUniform}) {
      dc.Upload(Input(s, t, pat, 2410 + t + static_cast<int>(pat)));
      dc.Poison(captured.stream());
      captured.Replay(3);
      const auto replayed = dc.Fetch<uint16_t>();
      EXPECT_TRUE(AllWritten(replayed, {t, s.hidden}));
      EXPECT_TRUE(BitwiseEqualBf16(replayed, dc.RunBf16(), {t, s.hidden})) << RoutingPatternName(pat);
      EXPECT_TRUE(MoeCloseBf16(replayed, dc.RunBf16(/*reference=*/true), {t, s.hidden}, s.top_k * s.intermediate));
    }
  }
}

// Expert- and tensor-parallel slices: each rank's output against the CPU reference of its slice
// (other ranks' pairs sort last and make no tiles; a TP slice has fewer FC1 row blocks and steps).
// With one-expert routing three of four EP ranks have no local pair: no tile, only zeros to write
// (by the folded combine's units too).
TEST(CudaFusedDecode, SlicesMatchTheirCpuReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{64, 512, 256, 6};
  const ActivationSpec act = SpecFor(ActivationType::Situ, s.num_experts);
  const ForcedN8f forced;
  for (const auto& [t, pat] : {std::pair<int64_t, RoutingPattern>{2, RoutingPattern::kHeavyHitters},
                               {16, RoutingPattern::kHeavyHitters}, {40, RoutingPattern::kHeavyHitters},
                               {3, RoutingPattern::kOneExpert}}) {
    const SyntheticInput in = Input(s, t, pat, 2500 + t);
    for (const auto& [ep, tp] : {std::pair{4, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
      for (int r = 0; r < ep * tp; ++r) {
        ParallelSlice slice;
        slice.ep_size = ep;
        slice.ep_rank = r / tp;
        slice.tp_size = tp;
        slice.tp_rank = r % tp;
        SCOPED_TRACE("T=" + std::to_string(t) + " EP " + std::to_string(ep) + " TP " + std::to_string(tp) + " rank " +
                     std::to_string(r));
        ExpertSet set = SyntheticSet(s, act, 2550, slice);
        auto moe = MakeCudaMoe(set);
        ASSERT_TRUE(moe);
        DeviceCase dc(*moe, in);
        ExpectRunsMatch(*moe, dc, CpuBackendF32(set, InputOf(in)), s.top_k * s.intermediate / tp);
      }
    }
  }
}

// Ids out of range (>= E, < -1) are skipped like -1 by the fused kernel and by its folded combine,
// as by the rest of the pipeline (CudaMoeSmall.OutOfRangeIdsAreSkipped).
TEST(CudaFusedDecode, OutOfRangeIdsAreSkipped) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 4};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Swiglu), 2650);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const ForcedN8f forced;
  SyntheticInput in = Input(s, 40, RoutingPattern::kUniform, 2651);
  SyntheticInput clean = in;
  PutOutOfRangeIds(&in, &clean);
  DeviceCase dc(*moe, in);
  ExpectRunsMatch(*moe, dc, CpuBackendF32(set, InputOf(clean)), s.top_k * s.intermediate);
}

// MXMOE_STAGE_TIMES's lines (the device-gpu.sh timeline stage reads them): one per eager call, with
// the plan and three positive times that add up to the total; none for a captured call.
TEST(CudaStageTimes, EachEagerCallPrintsItsStages) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 256, 160, 4};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 2600);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const ForcedN8f forced;
  const ScopedCombine unfolded(false);  // (the combine kernel's time is the third one)
  DeviceCase dc(*moe, Input(s, 3, RoutingPattern::kUniform, 2601));
  struct On {
    On() { cuda::SetStageTimes(true); }
    ~On() { cuda::SetStageTimes(false); }
  } on;
  testing::internal::CaptureStderr();
  dc.RunF32();
  dc.RunF32();
  {
    CapturedCall captured(dc, OutputDType::kF32);
    ASSERT_TRUE(captured.status().ok()) << captured.status().ToString();
    captured.Replay();
  }
  const std::string err = testing::internal::GetCapturedStderr();
  int lines = 0;
  size_t at = 0;
  while ((at = err.find("mxmoe stages: T=3 n8f (K=256 I=160 E=8): routing ", at)) != std::string::npos) {
    double routing = 0, gemms = 0, combine = 0, total = 0;
    ASSERT_EQ(std::sscanf(err.c_str() + at,
                          "mxmoe stages: T=3 n8f (K=256 I=160 E=8): routing %lf us, GEMMs %lf us, combine %lf us, "
                          "total %lf us",
                          &routing, &gemms, &combine, &total),
              4)
        << err;
    EXPECT_GT(routing, 0.0);
    EXPECT_GT(gemms, 0.0);
    EXPECT_GT(combine, 0.0);
    EXPECT_NEAR(routing + gemms + combine, total, 0.3);  // (each printed to 0.1)
    ++lines;
    ++at;
  }
  EXPECT_EQ(lines, 2) << err;
}

}  // namespace
}  // namespace mxmoe::test
