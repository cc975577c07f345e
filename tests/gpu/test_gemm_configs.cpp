// Every GEMM config of the SM90 path (mma.sync n8 / n8k2 / n8c2 / n8c4 / n32 / n64, the same fed by
// TMA n32t / n8t, n8's tiles in one persistent kernel n8f, wgmma wg32x2d / wg64 / wg128 / wg128d /
// wg128d8 / wg128d4x2 / wg128d3x3 / wg128h), against the CPU reference: the heuristics alone would
// leave some configs untested on small shapes (and the wgmma ones only on large shapes checked
// against the GPU reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/compare.h"
#include "common/moe_run.h"
#include "cuda/heuristics.h"
#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "gpu/gpu_harness.h"
#include "gpu/tolerance.h"
#include "mxmoe/cuda.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {
namespace {

// Restores the heuristics when a test ends, pass or fail.
struct ForcedConfig {
  explicit ForcedConfig(int id, int fc2_id = -1) { cuda::ForceGemmConfig(id, fc2_id); }
  ~ForcedConfig() { cuda::ForceGemmConfig(-1); }
};

// The mma.sync kernels' L2 look-ahead (MXMOE_L2_AHEAD): tests that compare plans by name pin it at
// 0, since a look-ahead is named in the plan.
using ScopedL2Ahead = ScopedSetting<&cuda::L2Ahead, &cuda::SetL2Ahead>;
// Out of range, such a setting is clamped: never past `max` or below `min`.
template <int (*kGet)(), void (*kSet)(int)>
void ExpectClampedTo(int max, int min = 0) {
  {
    const ScopedSetting<kGet, kSet> big(1000000);
    EXPECT_EQ(kGet(), max);
  }
  const ScopedSetting<kGet, kSet> negative(-5);
  EXPECT_EQ(kGet(), min);
}
using ScopedEarlySteps = ScopedSetting<&cuda::EarlySteps, &cuda::SetEarlySteps>;  // MXMOE_EARLY_STEPS
using ScopedFc2Cap = ScopedSetting<&cuda::Fc2CapSmem, &cuda::SetFc2CapSmem>;      // MXMOE_FC2_SMEM
using ScopedFc1PrefetchFc2 = ScopedSetting<&cuda::Fc1PrefetchFc2, &cuda::SetFc1PrefetchFc2>;  // MXMOE_FC1_PREFETCH_FC2
using ScopedFc2Combine = ScopedSetting<&cuda::Fc2CombineTokens, &cuda::SetFc2CombineTokens>;  // MXMOE_FC2_COMBINE

// The benchmark's shapes (bench/sweep.cpp) as the heuristics see them: hidden, intermediate,
// top-k, experts, local experts.
constexpr cuda::LayerDims kKimiDims{3584, 3072, 16, 896, 896};
constexpr cuda::LayerDims kGptOssDims{2880, 2880, 4, 128, 128};
constexpr cuda::LayerDims kDeepSeekDims{7168, 2048, 8, 256, 256};

// A synthetic layer of activation `kind` (biased for SwiGLU-bias), and for each token count and
// routing its CPU reference and a DeviceCase: variants(dc, ref, t, label) runs the GPU variants
// to compare. Seeds come from `seed`, in order.
template <class Variants>
void ForEachInput(const LayerShape& s, ActivationType kind, uint64_t& seed, std::initializer_list<int64_t> tokens,
                  std::initializer_list<RoutingPattern> patterns, const Variants& variants) {
  const bool bias = kind == ActivationType::SwigluBias;
  ExpertSet set = SyntheticSet(s, SpecFor(kind, s.num_experts), ++seed, {}, bias);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  for (int64_t t : tokens) {
    for (RoutingPattern pat : patterns) {
      SyntheticInput in;
      MakeSyntheticInput(s, t, pat, ++seed, &in);
      const auto ref = ReferenceF32(set, InputOf(in));
      DeviceCase dc(*moe, in);
      const std::string label =
          std::string(ActivationName(kind)) + " " + RoutingPatternName(pat) + " T=" + std::to_string(t);
      variants(dc, ref, t, label);
    }
  }
}

TEST(CudaGemmConfigs, EveryConfigMatchesReference) {
  MXMOE_REQUIRE_SM90();
  struct Case {
    LayerShape shape;
    ActivationType kind;
  };
  // K / I not multiples of 64 (partial 64-steps), 2 I not a multiple of 256 (a partial row block:
  // padding warps), one MX block of intermediate, and enough tokens for several 128-token tiles of
  // one expert (one-expert routing).
  const Case cases[] = {{{8, 256, 160, 4}, ActivationType::Situ},
                        {{6, 96, 96, 3}, ActivationType::SwigluBias},
                        {{4, 320, 32, 2}, ActivationType::GegluTanh},
                        {{16, 192, 384, 6}, ActivationType::Swiglu}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const LayerShape& s = c.shape;
    ASSERT_NO_FATAL_FAILURE(ForEachInput(
        s, c.kind, seed, {1, 37, 300},
        {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kWithInvalid},
        [&](DeviceCase& dc, const auto& ref, int64_t t, const std::string& label) {
          for (int id = 0; id < cuda::kNumGemmConfigs; ++id) {
            const ForcedConfig forced(id);
            SCOPED_TRACE(std::string(cuda::GemmInfo(static_cast<cuda::GemmConfigId>(id)).name) + " " + label +
                         " K=" + std::to_string(s.hidden) + " I=" + std::to_string(s.intermediate));
            EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, {t, s.hidden}, s.top_k * s.intermediate));
          }
        }));
  }
}

// Every config built for a number of CTAs per SM gets them on this device: wg128h and wg32x2d
// overlap one CTA's epilogue with another's MMAs only if two are resident (their launch bounds,
// registers and shared memory are sized for it; ptxas's register count is the one thing not known
// before the build). The mma.sync configs report theirs for the log.
TEST(CudaGemmConfigs, DesignedCtasPerSmAreResident) {
  MXMOE_REQUIRE_SM90();
  ASSERT_EQ(cuda::PrepareGemmKernels(), cudaSuccess);
  for (int id = 0; id < cuda::kNumGemmConfigs; ++id) {
    const cuda::GemmConfigInfo info = cuda::GemmInfo(static_cast<cuda::GemmConfigId>(id));
    for (bool fc1 : {true, false}) {
      const int resident = info.resident_ctas(fc1);
      std::printf("%-10s %s: %d CTAs per SM (built for %d)\n", info.name, fc1 ? "FC1" : "FC2", resident,
                  info.ctas_per_sm);
      EXPECT_GT(resident, 0) << info.name << (fc1 ? " FC1" : " FC2");
      EXPECT_GE(resident, info.ctas_per_sm) << info.name << (fc1 ? " FC1" : " FC2");
    }
  }
}

// The same input through every config gives the same result up to fp32 summation order (the MMA
// instruction, the tile widths and, for n8k2, n8c2 and n8c4, how the reduction is split differ).
TEST(CudaGemmConfigs, ConfigsAgreeOnAKimiShapedLayer) {
  MXMOE_REQUIRE_SM90();
  LayerShape s = kKimiK3Shape;
  s.num_experts = 16;
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 950);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  SyntheticInput in;
  MakeSyntheticInput(s, 512, RoutingPattern::kHeavyHitters, 951, &in);
  DeviceCase dc(*moe, in);
  const auto ref = dc.RunF32(/*reference=*/true);
  const ScopedL2Ahead no_look_ahead(0);
  for (int id = 0; id < cuda::kNumGemmConfigs; ++id) {
    const ForcedConfig forced(id);
    const char* name = cuda::GemmInfo(static_cast<cuda::GemmConfigId>(id)).name;
    SCOPED_TRACE(name);
    // (What the bench's rows report; n8f past 256 pairs runs n8's kernels and says so.)
    EXPECT_EQ(moe->Plan(in.num_tokens), id == static_cast<int>(cuda::GemmConfigId::kN8f) ? std::string(name) + " as n8"
                                                                                          : std::string(name));
    EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, {in.num_tokens, s.hidden}, s.top_k * s.intermediate));
  }
  // The heuristics' own choice (heuristics.cu): at T = 1 the 16 pairs touch ~10 of the 16 experts,
  // ~243 FC1 and ~142 FC2 CTAs (24 and 14 row blocks each), within n8c2's 400 / 480; at T = 4096,
  // 4096 pairs per expert.
  EXPECT_EQ(moe->Plan(1), "n8c2");
  EXPECT_EQ(moe->Plan(4096), "wg128d3x3");
}

// MXMOE_EXACT_GRID (the diagnostic that launches the GEMMs with the routing's real tile count
// instead of the worst-case bound) drops only CTAs that would have exited: every config gives the
// same bits with it as without, on every routing pattern, in token and in pair chunks. A count
// above the bound would fail the call (ExactGridTiles checks it), so this also holds the bound.
TEST(CudaGemmConfigs, ExactGridLeavesResultsBitIdentical) {
  MXMOE_REQUIRE_SM90();
  struct Scoped {
    Scoped() { cuda::SetExactGrid(true); }
    ~Scoped() { cuda::SetExactGrid(false); }
  };
  const LayerShape s{8, 256, 160, 4};
  uint64_t seed = 1950;
  ExpertSet set = SyntheticSet(s, SpecFor(ActivationType::Situ, s.num_experts), ++seed, {}, false);
  for (size_t target : {size_t{0}, size_t{256} << 10}) {  // the default, then pair chunks
    cuda::SetWorkspaceTarget(target);
    auto moe = MakeCudaMoe(set);
    cuda::SetWorkspaceTarget(0);
    ASSERT_TRUE(moe);
    for (int64_t t : {1, 37, 300}) {
      for (RoutingPattern pat : {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kWithInvalid}) {
        SyntheticInput in;
        MakeSyntheticInput(s, t, pat, ++seed, &in);
        DeviceCase dc(*moe, in);
        for (int id = -1; id < cuda::kNumGemmConfigs; ++id) {  // (-1: the heuristics)
          const ForcedConfig forced(id);
          SCOPED_TRACE(std::string(id < 0 ? "heuristics" : cuda::GemmInfo(static_cast<cuda::GemmConfigId>(id)).name) +
                       " " + RoutingPatternName(pat) + " T=" + std::to_string(t) + " target=" + std::to_string(target));
          // (At 256 KB a chunk holds ~40 tokens of this layer, as in CudaMoeChunks' tests.)
          if (target != 0 && t == 300) EXPECT_NE(moe->Plan(t).find("pair chunks"), std::string::npos);
          const std::vector<float> bound = dc.RunF32();
          const Scoped exact;
          EXPECT_TRUE(BitwiseEqual(dc.RunF32(), bound));
        }
      }
    }
  }
}

// The L2 look-ahead (GemmParams::l2_ahead) only asks the L2 for bytes the CTA copies later: every
// config that reads it gives the same bits with it as without, and the plan names it (and only for
// those configs). K = 992 has 16 steps (the last one partial) and I = 320 has 5, so a look-ahead of
// 1 starts inside the first stages' steps, 3 is the usual case and 16 reaches past the end of both
// reductions, and for n8c2 / n8c4 of each CTA's part of it; 2 I = 640 leaves the last row block
// partial. What this cannot see: a prefetch has no result, so neither whether the look-ahead
// instance ran (the plan comes from the setting) nor a prefetch of the wrong bytes (review and the
// speed A/B, perf-log v20); it does see that instance computing anything differently.
TEST(CudaGemmConfigs, L2LookAheadLeavesResultsBitIdentical) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 992, 320, 4};
  ExpertSet set = SyntheticSet(s, SpecFor(ActivationType::Situ, s.num_experts), 1900, {}, false);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  uint64_t seed = 1900;
  for (int64_t t : {1, 37}) {
    for (RoutingPattern pat : {RoutingPattern::kUniform, RoutingPattern::kWithInvalid}) {
      SyntheticInput in;
      MakeSyntheticInput(s, t, pat, ++seed, &in);
      DeviceCase dc(*moe, in);
      int checked = 0;
      for (int id = 0; id < cuda::kNumGemmConfigs; ++id) {
        const cuda::GemmConfigInfo info = cuda::GemmInfo(static_cast<cuda::GemmConfigId>(id));
        const ForcedConfig forced(id);
        if (!info.looks_ahead) {  // (the wgmma configs, n64, and n8f, which fuses both calls here)
          const ScopedL2Ahead on(4);
          EXPECT_EQ(moe->Plan(t), id == static_cast<int>(cuda::GemmConfigId::kN8f)
                                      ? std::string(info.name) + (cuda::DecodeCombineEnabled() ? "+combine" : "")
                                      : std::string(info.name));
          continue;
        }
        std::vector<float> without;
        {
          const ScopedL2Ahead off(0);
          ASSERT_EQ(moe->Plan(t), info.name);
          without = dc.RunF32();
        }
        for (int ahead : {1, 3, 16}) {
          const ScopedL2Ahead on(ahead);
          SCOPED_TRACE(std::string(info.name) + " l2+" + std::to_string(ahead) + " " + RoutingPatternName(pat) +
                       " T=" + std::to_string(t));
          EXPECT_EQ(moe->Plan(t), std::string(info.name) + " l2+" + std::to_string(ahead));
          EXPECT_TRUE(BitwiseEqual(dc.RunF32(), without));
        }
        ++checked;
      }
      EXPECT_EQ(checked, 8) << "n8, n32, n8k2, n8c2, n8c4, n32t, n8t, n8c2d";
    }
  }
  ExpectClampedTo<&cuda::L2Ahead, &cuda::SetL2Ahead>(cuda::kMaxL2Ahead);
}

// The decode configs' early prefetch (GemmParams::early_steps: before the dependency wait, the L2 is
// asked for each CTA's first steps; FC1 guesses its tile's expert from the ids) leaves every
// result bit-identical: at T = 1 and 2 FC1 guesses (uniform ids; one expert in every slot, where
// the routing merges the slots into one tile and the guesses past it find none; invalid and
// out-of-range ids), at T = 37 only FC2 prefetches; 1 step, 3 and 16 (past every CTA's part of the
// reduction), each also with FC1's CTAs asking for as many of FC2's first steps past their main
// loop (GemmParams::next_steps). As for the look-ahead, a prefetch of the wrong bytes has no result
// to see; this sees the early instance computing anything differently or faulting on an address.
TEST(CudaGemmConfigs, EarlyPrefetchLeavesResultsBitIdentical) {
  MXMOE_REQUIRE_SM90();
  uint64_t seed = 2100;
  int checked = 0;
  ASSERT_NO_FATAL_FAILURE(ForEachInput(
      {12, 992, 320, 6}, ActivationType::Situ, seed, {1, 2, 37},
      {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kWithInvalid},
      [&](DeviceCase& dc, const auto&, int64_t, const std::string& label) {
        for (cuda::GemmConfigId id : {cuda::GemmConfigId::kN8, cuda::GemmConfigId::kN8k2, cuda::GemmConfigId::kN8c2,
                                      cuda::GemmConfigId::kN8c4, cuda::GemmConfigId::kN8c2d}) {
          const ForcedConfig forced(static_cast<int>(id));
          std::vector<float> without;
          {
            const ScopedEarlySteps off(0);
            const ScopedFc1PrefetchFc2 none(0);
            without = dc.RunF32();
          }
          {
            // The defaults: 4 early steps, and FC1's prefetch of FC2 by its rule (n8c4 takes it).
            const ScopedFc1PrefetchFc2 by_rule(cuda::kFc1PrefetchFc2ByRule);
            SCOPED_TRACE(std::string(cuda::GemmInfo(id).name) + " defaults " + label);
            EXPECT_TRUE(BitwiseEqual(dc.RunF32(), without));
          }
          for (int steps : {1, 3, 16}) {
            const ScopedEarlySteps on(steps);
            SCOPED_TRACE(std::string(cuda::GemmInfo(id).name) + " early " + std::to_string(steps) + " " + label);
            EXPECT_TRUE(BitwiseEqual(dc.RunF32(), without));
            // And FC1's CTAs asking for FC2's first steps past their main loop.
            const ScopedFc1PrefetchFc2 next(steps);
            EXPECT_TRUE(BitwiseEqual(dc.RunF32(), without));
          }
          ++checked;
        }
      }));
  EXPECT_EQ(checked, 3 * 3 * 5);
  ExpectClampedTo<&cuda::EarlySteps, &cuda::SetEarlySteps>(cuda::kMaxEarlySteps);
}

// The FC2 cap (kFc2CapMinFc1CtasPerSm): a decode call whose FC1 grid holds at least 4 CTAs per SM
// launches FC2 under PDL with its shared memory raised (Kimi-K3's rows at T = 1: n8c2, 24 row blocks
// x 16 tiles x 2 = 768 FC1 CTAs, 4 per SM up to 192 SMs). The results are the same bits with the
// rule on (CappedFc2Launches counts its launches) and off, and match the reference; T = 40 (640
// pairs, no decode call) never takes it.
TEST(CudaGemmConfigs, CappedFc2LeavesResultsBitIdentical) {
  MXMOE_REQUIRE_SM90();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  LayerShape s = kKimiK3Shape;
  s.num_experts = 16;
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 2200);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  for (int64_t t : {1, 40}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    SyntheticInput in;
    MakeSyntheticInput(s, t, RoutingPattern::kUniform, 2201 + t, &in);
    DeviceCase dc(*moe, in);
    std::vector<float> off;
    {
      const ScopedFc2Cap cap(0);
      const int64_t before = cuda::CappedFc2Launches();
      off = dc.RunF32();
      EXPECT_EQ(cuda::CappedFc2Launches(), before);
    }
    const ScopedFc2Cap cap(cuda::kDefaultFc2Smem);
    const int64_t before = cuda::CappedFc2Launches();
    const auto on = dc.RunF32();
    const bool fires = t == 1 && 768 >= cuda::kFc2CapMinFc1CtasPerSm * sms;
    EXPECT_EQ(cuda::CappedFc2Launches() - before, fires ? 1 : 0);
    EXPECT_TRUE(BitwiseEqual(on, off));
    EXPECT_TRUE(MoeCloseF32(on, dc.RunF32(/*reference=*/true), {in.num_tokens, s.hidden}, s.top_k * s.intermediate));
  }
  ExpectClampedTo<&cuda::Fc2CapSmem, &cuda::SetFc2CapSmem>(cuda::kMaxFc2Smem);
}

// The combine folded into FC2 (MXMOE_FC2_COMBINE, GemmParams::fold_done): for every config whose FC2
// runs the mma.sync kernel on 8-token tiles, fp32 and bf16 outputs bit-identical to the combine
// kernel's, with the fold allowed up to kMaxFc2CombineTokens tokens, at T = 1, 2 and 8 (folded:
// FoldedCombines counts one launch a call) and T = 9 (past it: not folded); K = 992 leaves W2's
// last row block partial, invalid ids leave slots out, and one expert in every slot gives one
// tile; and a call of no tile at all.
TEST(CudaGemmConfigs, FoldedCombineLeavesResultsBitIdentical) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{12, 992, 320, 6};
  uint64_t seed = 2300;
  int checked = 0;
  ASSERT_NO_FATAL_FAILURE(ForEachInput(
      s, ActivationType::Situ, seed, {1, 2, 8, 9},
      {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kWithInvalid},
      [&](DeviceCase& dc, const auto& ref, int64_t t, const std::string& label) {
        for (cuda::GemmConfigId id : {cuda::GemmConfigId::kN8, cuda::GemmConfigId::kN8k2, cuda::GemmConfigId::kN8c2,
                                      cuda::GemmConfigId::kN8c4, cuda::GemmConfigId::kN8c2d}) {
          const ForcedConfig forced(static_cast<int>(id));
          SCOPED_TRACE(std::string(cuda::GemmInfo(id).name) + " " + label);
          std::vector<float> kernel_f32;
          std::vector<uint16_t> kernel_bf16;
          {
            const ScopedFc2Combine off(0);
            kernel_f32 = dc.RunF32();
            kernel_bf16 = dc.RunBf16();
          }
          const ScopedFc2Combine on(cuda::kMaxFc2CombineTokens);
          const int64_t before = cuda::FoldedCombines();
          const auto folded_f32 = dc.RunF32();
          const auto folded_bf16 = dc.RunBf16();
          EXPECT_EQ(cuda::FoldedCombines() - before, t <= cuda::kMaxFc2CombineTokens ? 2 : 0);
          EXPECT_TRUE(BitwiseEqual(folded_f32, kernel_f32));
          EXPECT_EQ(folded_bf16, kernel_bf16);
          EXPECT_TRUE(MoeCloseF32(folded_f32, ref, {t, s.hidden}, s.top_k * s.intermediate));
          ++checked;
        }
      }));
  EXPECT_EQ(checked, 4 * 3 * 5);
  // A call with no tile (every slot -1): no FC2 CTA counts in, and tile 0's CTAs write the zeros
  // the combine kernel writes (into outputs the harness poisons first).
  ExpertSet set = SyntheticSet(s, SpecFor(ActivationType::Situ, s.num_experts), ++seed);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  SyntheticInput in;
  MakeSyntheticInput(s, 2, RoutingPattern::kUniform, ++seed, &in);
  std::fill(in.topk_ids.begin(), in.topk_ids.end(), -1);
  DeviceCase dc(*moe, in);
  for (cuda::GemmConfigId id : {cuda::GemmConfigId::kN8, cuda::GemmConfigId::kN8c2, cuda::GemmConfigId::kN8c4}) {
    const ForcedConfig forced(static_cast<int>(id));
    SCOPED_TRACE(std::string(cuda::GemmInfo(id).name) + " no tile");
    std::vector<float> kernel_f32;
    {
      const ScopedFc2Combine off(0);
      kernel_f32 = dc.RunF32();
    }
    EXPECT_TRUE(std::all_of(kernel_f32.begin(), kernel_f32.end(), [](float v) { return v == 0.0f; }));
    const ScopedFc2Combine on(cuda::kMaxFc2CombineTokens);
    const int64_t before = cuda::FoldedCombines();
    EXPECT_TRUE(BitwiseEqual(dc.RunF32(), kernel_f32));
    EXPECT_EQ(cuda::FoldedCombines() - before, 1);
  }
  ExpectClampedTo<&cuda::Fc2CombineTokens, &cuda::SetFc2CombineTokens>(cuda::kMaxFc2CombineTokens);
}

// The integer settings read from the environment (MXMOE_L2_AHEAD's kind): a whole decimal in range
// or the fallback. Host code only.
TEST(LaunchUtil, EnvIntTakesWholeNumbersInRange) {
  const char* kName = "MXMOE_TEST_ENV_INT";
  const auto read = [&](const char* value) {
    if (value == nullptr) {
      unsetenv(kName);
    } else {
      setenv(kName, value, 1);
    }
    const int v = cuda::EnvInt(kName, 0, 16, 5).Get();
    unsetenv(kName);
    return v;
  };
  EXPECT_EQ(read(nullptr), 5);
  EXPECT_EQ(read("0"), 0);
  EXPECT_EQ(read("16"), 16);
  EXPECT_EQ(read("7"), 7);
  for (const char* bad : {"", "17", "-1", "4x", "x4", "2.5", " "}) EXPECT_EQ(read(bad), 5) << "'" << bad << "'";
  cuda::EnvInt setting(kName, 0, 16, 5);
  setting.Set(99);
  EXPECT_EQ(setting.Get(), 16);
  setting.Set(-3);
  EXPECT_EQ(setting.Get(), 0);
}

// MXMOE_PDL's values (launch_util.cuh, ParsePdlSites): 1 every site, 0 or empty none, site names
// joined by '+' those sites, anything else rejected (-1: reported and ignored). Host code only.
TEST(LaunchUtil, PdlSitesParseNamesAndRejectOthers) {
  using cuda::PdlSite;
  const auto mask = [](std::initializer_list<PdlSite> sites) {
    int m = 0;
    for (const PdlSite s : sites) m |= static_cast<int>(s);
    return m;
  };
  EXPECT_EQ(cuda::ParsePdlSites(nullptr), 0);
  EXPECT_EQ(cuda::ParsePdlSites(""), 0);
  EXPECT_EQ(cuda::ParsePdlSites("0"), 0);
  EXPECT_EQ(cuda::ParsePdlSites("1"), mask({PdlSite::kRoute, PdlSite::kFc1, PdlSite::kFc2, PdlSite::kCombine}));
  EXPECT_EQ(cuda::ParsePdlSites("fc1"), mask({PdlSite::kFc1}));
  EXPECT_EQ(cuda::ParsePdlSites("combine+fc1"), mask({PdlSite::kFc1, PdlSite::kCombine}));
  EXPECT_EQ(cuda::ParsePdlSites("route+fc1+fc2+combine"), cuda::ParsePdlSites("1"));
  EXPECT_EQ(cuda::ParsePdlSites("fc2+fc2"), mask({PdlSite::kFc2}));
  for (const char* bad : {"2", "fc", "fc1+", "+fc1", "fc1++fc2", "fc1,fc2", "FC1", "fc1 ", "combine+x", "true"})
    EXPECT_EQ(cuda::ParsePdlSites(bad), -1) << "'" << bad << "'";
}

// Without MXMOE_PDL, a thread's launches take the sites of its innermost ScopedPdlDefault, and none
// outside one; another thread keeps its own. Host code only.
TEST(LaunchUtil, PdlDefaultSitesFollowTheThreadsScope) {
  if (std::getenv("MXMOE_PDL") != nullptr) GTEST_SKIP() << "MXMOE_PDL is set: it replaces the default sites";
  using cuda::PdlSite;
  const PdlSite all[] = {PdlSite::kRoute, PdlSite::kFc1, PdlSite::kFc2, PdlSite::kCombine};
  const auto sites_on = [&] {
    unsigned m = 0;
    for (const PdlSite s : all) m |= cuda::PdlAt(s) ? static_cast<unsigned>(s) : 0u;
    return m;
  };
  EXPECT_EQ(sites_on(), 0u);
  {
    const cuda::ScopedPdlDefault decode(cuda::kPdlDecodeSites);
    EXPECT_EQ(sites_on(), static_cast<unsigned>(PdlSite::kFc1) | static_cast<unsigned>(PdlSite::kCombine));
    {
      const cuda::ScopedPdlDefault none(0u);
      EXPECT_EQ(sites_on(), 0u);
    }
    EXPECT_EQ(sites_on(), cuda::kPdlDecodeSites);
    unsigned other = ~0u;
    std::thread([&] { other = sites_on(); }).join();
    EXPECT_EQ(other, 0u);
  }
  EXPECT_EQ(sites_on(), 0u);
}

// The heuristics' narrow-tile boundary (heuristics.cu, perf-log v13.1): n8 below ~6 pairs per
// expert, n32 from there (n8 streams an expert's weights once per 8 of its pairs), on the three
// benchmark shapes at the token counts either side of where the two configs met on the H200; the
// clusters for the fewest tiles (n8c4 for GPT-OSS-120B's single token, n8c2 for its two tokens and
// for Kimi-K3's and DeepSeek-V3's single token; perf-log v13.2, v35); n8f instead of n8 up to
// kDecodeMaxPairs pairs (perf-log v24: Kimi-K3 to T = 16, GPT-OSS-120B to 64, DeepSeek-V3 to 32);
// wg128d3x3 from 32 pairs per expert. Host code only.
TEST(CudaHeuristics, NarrowTileBelowSixPairsPerExpert) {
  const ForcedConfig none(-1);  // the heuristics' own choice, whatever MXMOE_GEMM_CONFIG says
  struct Case {
    const char* shape;
    cuda::LayerDims dims;
    int64_t tokens;
    cuda::GemmConfigId want;
  };
  const cuda::LayerDims &kimi = kKimiDims, &gpt = kGptOssDims, &deepseek = kDeepSeekDims;
  const Case cases[] = {
      {"kimi-k3", kimi, 1, cuda::GemmConfigId::kN8c2},          {"kimi-k3", kimi, 2, cuda::GemmConfigId::kN8f},
      {"kimi-k3", kimi, 16, cuda::GemmConfigId::kN8f},          {"kimi-k3", kimi, 17, cuda::GemmConfigId::kN8},
      {"kimi-k3", kimi, 256, cuda::GemmConfigId::kN8},          {"kimi-k3", kimi, 384, cuda::GemmConfigId::kN32},
      {"kimi-k3", kimi, 512, cuda::GemmConfigId::kN32},         {"kimi-k3", kimi, 1024, cuda::GemmConfigId::kN32},
      {"kimi-k3", kimi, 4096, cuda::GemmConfigId::kWg128d3x3},  {"gpt-oss-120b", gpt, 1, cuda::GemmConfigId::kN8c4},
      {"gpt-oss-120b", gpt, 2, cuda::GemmConfigId::kN8c2},      {"gpt-oss-120b", gpt, 8, cuda::GemmConfigId::kN8f},
      {"gpt-oss-120b", gpt, 64, cuda::GemmConfigId::kN8f},      {"gpt-oss-120b", gpt, 65, cuda::GemmConfigId::kN8},
      {"gpt-oss-120b", gpt, 128, cuda::GemmConfigId::kN8},      {"gpt-oss-120b", gpt, 256, cuda::GemmConfigId::kN32},
      {"deepseek-v3", deepseek, 1, cuda::GemmConfigId::kN8c2},  {"deepseek-v3", deepseek, 2, cuda::GemmConfigId::kN8f},
      {"deepseek-v3", deepseek, 4, cuda::GemmConfigId::kN8f},   {"deepseek-v3", deepseek, 32, cuda::GemmConfigId::kN8f},
      {"deepseek-v3", deepseek, 33, cuda::GemmConfigId::kN8},   {"deepseek-v3", deepseek, 128, cuda::GemmConfigId::kN8},
      {"deepseek-v3", deepseek, 192, cuda::GemmConfigId::kN32},
  };
  for (const Case& c : cases) {
    const cuda::LaunchChoice got = cuda::ChooseLaunch(c.dims, c.tokens, int64_t{1} << 20);
    EXPECT_EQ(cuda::GemmInfo(got.gemm).name, std::string(cuda::GemmInfo(c.want).name))
        << c.shape << " T = " << c.tokens << " (~" << got.pairs_per_expert << " pairs per expert)";
  }
}

// FC1's CTAs asking the L2 for FC2's first steps (Fc1PrefetchFc2Steps): by the rule, 4 steps where
// FC1 runs n8c4 (the heuristics' choice for GPT-OSS-120B's single token) and none on the other
// decode configs (Kimi-K3's and DeepSeek-V3's single token run n8c2); a setting
// (MXMOE_FC1_PREFETCH_FC2) applies to every config, 0 included. Host code only.
TEST(CudaHeuristics, Fc1PrefetchesFc2OnlyInClustersOfFour) {
  using cuda::GemmConfigId;
  const ForcedConfig none(-1);
  const ScopedFc1PrefetchFc2 by_rule(cuda::kFc1PrefetchFc2ByRule);
  const auto steps = [](GemmConfigId id) { return cuda::Fc1PrefetchFc2Steps(cuda::GemmInfo(id)); };
  for (GemmConfigId id : {GemmConfigId::kN8, GemmConfigId::kN8k2, GemmConfigId::kN8c2, GemmConfigId::kN8c2d,
                          GemmConfigId::kN8f, GemmConfigId::kN32, GemmConfigId::kWg128d3x3})
    EXPECT_EQ(steps(id), 0) << cuda::GemmInfo(id).name;
  EXPECT_EQ(steps(GemmConfigId::kN8c4), cuda::kDefaultFc1PrefetchFc2);
  const auto at_one_token = [](const cuda::LayerDims& dims) {
    return cuda::Fc1PrefetchFc2Steps(cuda::GemmInfo(cuda::ChooseLaunch(dims, 1, int64_t{1} << 20).gemm));
  };
  EXPECT_EQ(at_one_token(kGptOssDims), cuda::kDefaultFc1PrefetchFc2);
  EXPECT_EQ(at_one_token(kKimiDims), 0);
  EXPECT_EQ(at_one_token(kDeepSeekDims), 0);
  {
    const ScopedFc1PrefetchFc2 off(0);
    EXPECT_EQ(steps(GemmConfigId::kN8c4), 0);
  }
  {
    const ScopedFc1PrefetchFc2 eight(8);
    EXPECT_EQ(steps(GemmConfigId::kN8), 8);
    EXPECT_EQ(steps(GemmConfigId::kN8c2), 8);
    EXPECT_EQ(steps(GemmConfigId::kN8c4), 8);
  }
  ExpectClampedTo<&cuda::Fc1PrefetchFc2, &cuda::SetFc1PrefetchFc2>(cuda::kMaxEarlySteps, cuda::kFc1PrefetchFc2ByRule);
}

// FC2 on a config of its own (MXMOE_GEMM_CONFIG=<FC1>/<FC2>, for measuring the GEMMs' configs
// apart): taken only with FC1's BLOCK_N, since both GEMMs run the routing's tiles. Host code only.
TEST(CudaHeuristics, Fc2ConfigForcedApartKeepsTheTileWidth) {
  using cuda::GemmConfigId;
  const auto choose = [](int fc1, int fc2, int64_t tokens) {
    const ForcedConfig forced(fc1, fc2);
    return cuda::ChooseLaunch(kKimiDims, tokens, int64_t{1} << 20);
  };
  const auto id = [](GemmConfigId c) { return static_cast<int>(c); };
  cuda::LaunchChoice c = choose(id(GemmConfigId::kN8c2), id(GemmConfigId::kN8c4), 1);
  EXPECT_EQ(c.gemm, GemmConfigId::kN8c2);
  EXPECT_EQ(c.gemm_fc2, GemmConfigId::kN8c4);
  c = choose(-1, id(GemmConfigId::kN8c4), 1);  // the heuristics' FC1 (n8c2), FC2 forced
  EXPECT_EQ(c.gemm, GemmConfigId::kN8c2);
  EXPECT_EQ(c.gemm_fc2, GemmConfigId::kN8c4);
  c = choose(id(GemmConfigId::kN8), id(GemmConfigId::kN32), 1);  // BLOCK_N 8 against 32: refused
  EXPECT_EQ(c.gemm, GemmConfigId::kN8);
  EXPECT_EQ(c.gemm_fc2, GemmConfigId::kN8);
  c = choose(-1, -1, 4096);
  EXPECT_EQ(c.gemm_fc2, c.gemm);
}

// The same pairs of configs run: FC2 on another config than FC1 (same BLOCK_N) against the CPU
// reference, the plan naming both.
TEST(CudaGemmConfigs, Fc2OnAConfigOfItsOwnMatchesReference) {
  MXMOE_REQUIRE_SM90();
  using cuda::GemmConfigId;
  const std::pair<GemmConfigId, GemmConfigId> pairs[] = {
      {GemmConfigId::kN8c2, GemmConfigId::kN8c4}, {GemmConfigId::kN8, GemmConfigId::kN8c2},
      {GemmConfigId::kN8c4, GemmConfigId::kN8k2}, {GemmConfigId::kN64, GemmConfigId::kWg64},
      {GemmConfigId::kWg128d3x3, GemmConfigId::kWg128d8}};
  uint64_t seed = 1800;
  const LayerShape s{8, 192, 160, 4};
  ExpertSet set = SyntheticSet(s, SpecFor(ActivationType::Situ, s.num_experts), ++seed, {}, false);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const ScopedL2Ahead no_look_ahead(0);
  for (int64_t t : {1, 37, 300}) {
    for (RoutingPattern pat : {RoutingPattern::kUniform, RoutingPattern::kWithInvalid}) {
      SyntheticInput in;
      MakeSyntheticInput(s, t, pat, ++seed, &in);
      const auto ref = ReferenceF32(set, InputOf(in));
      DeviceCase dc(*moe, in);
      for (const auto& [fc1, fc2] : pairs) {
        const ForcedConfig forced(static_cast<int>(fc1), static_cast<int>(fc2));
        const std::string name = std::string(cuda::GemmInfo(fc1).name) + "/" + cuda::GemmInfo(fc2).name;
        SCOPED_TRACE(name + " " + RoutingPatternName(pat) + " T=" + std::to_string(t));
        EXPECT_EQ(moe->Plan(t), name);
        EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, {t, s.hidden}, s.top_k * s.intermediate));
      }
    }
  }
}

// The persistent FC1 kernel (wg128) with its CTAs capped, so that each CTA takes many work items
// of different widths from the work counter through its ring of stages and its activation plane (a
// layer this small has fewer items than SMs otherwise). Every activation kind, several routings,
// against the CPU reference. (The kernel is off by default: perf-log v7.)
TEST(CudaGemmConfigs, PersistentFc1WalksManyItemsPerCta) {
  MXMOE_REQUIRE_SM90();
  struct CtaLimit {
    explicit CtaLimit(int n) { cuda::LimitPersistentCtas(n); }
    ~CtaLimit() { cuda::LimitPersistentCtas(0); }
  };
  const ScopedSetting<&cuda::PersistentFc1Enabled, &cuda::SetPersistentFc1> persistent(true);
  const ForcedConfig forced(static_cast<int>(cuda::GemmConfigId::kWg128));
  uint64_t seed = 1700;
  // 2 I = 640: three row blocks, the last one partial (padding warps).
  const LayerShape s{8, 192, 320, 4};
  for (const ActivationType kind : {ActivationType::Situ, ActivationType::Swiglu, ActivationType::SwigluBias,
                                    ActivationType::Geglu, ActivationType::GegluTanh}) {
    // (The CPU reference dominates the run time: T stays a few hundred.)
    ASSERT_NO_FATAL_FAILURE(ForEachInput(
        s, kind, seed, {3, 77, 300},
        {RoutingPattern::kUniform, RoutingPattern::kHeavyHitters, RoutingPattern::kWithInvalid},
        [&](DeviceCase& dc, const auto& ref, int64_t t, const std::string& label) {
          for (int ctas : {1, 2, 5}) {
            const CtaLimit limit(ctas);
            SCOPED_TRACE(label + " CTAs=" + std::to_string(ctas));
            EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, {t, s.hidden}, s.top_k * s.intermediate));
          }
        }));
  }
}

}  // namespace
}  // namespace mxmoe::test
