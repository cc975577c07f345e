// The CUDA backend against the CPU reference (small and medium shapes) and against its own unfused
// GPU reference (large shapes), plus slices, determinism, graph replay and error handling.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/moe_run.h"
#include "common/random.h"
#include "cuda/decode_plan.h"
#include "cuda/heuristics.h"
#include "cuda/launch_util.cuh"
#include "cuda/moe_kernels.h"
#include "gpu/gpu_harness.h"
#include "gpu/tolerance.h"
#include "mxmoe/cuda.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {
namespace {

constexpr RoutingPattern kPatterns[] = {RoutingPattern::kUniform, RoutingPattern::kOneExpert,
                                        RoutingPattern::kFewExperts, RoutingPattern::kWithInvalid,
                                        RoutingPattern::kHeavyHitters};
constexpr ActivationType kKinds[] = {ActivationType::Situ, ActivationType::Swiglu,
                                     ActivationType::SwigluBias, ActivationType::Geglu,
                                     ActivationType::GegluTanh};

SyntheticInput Input(const LayerShape& s, int64_t t, RoutingPattern p, uint64_t seed) {
  SyntheticInput in;
  MakeSyntheticInput(s, t, p, seed, &in);
  return in;
}

std::vector<float> CpuF32(const ExpertSet& set, const SyntheticInput& in, bool threaded) {
  return threaded ? CpuBackendF32(set, InputOf(in)) : ReferenceF32(set, InputOf(in));
}
std::vector<uint16_t> CpuBf16(const ExpertSet& set, const SyntheticInput& in, bool threaded) {
  return threaded ? CpuBackendBf16(set, InputOf(in)) : ReferenceBf16(set, InputOf(in));
}

// ---- API and refusals ---------------------------------------------------------------------------
TEST(CudaApi, BuildAndDevices) {
  EXPECT_TRUE(CudaBuilt());
  EXPECT_NE(CudaArchsCompiled().find("sm_90a"), std::string::npos) << CudaArchsCompiled();
  for (const CudaDeviceInfo& d : CudaDevices())
    std::printf("device %d: %s, cc %d.%d, %d SMs, %zu MB\n", d.index, d.name.c_str(), d.major, d.minor,
                d.sm_count, d.total_memory >> 20);
}

TEST(CudaApi, RefusesBadArguments) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 2};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 3);
  std::unique_ptr<CudaMoe> moe;
  EXPECT_EQ(CudaMoe::Create(set, 99, &moe).code(), StatusCode::kInvalidArgument);
  ExpertSet bad = set;
  bad.activation.type = ActivationType::Relu2;  // not gated / not implemented: refused by name
  const Status refused = CudaMoe::Create(bad, 0, &moe);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("Relu2"), std::string::npos) << refused.message();

  moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  EXPECT_TRUE(moe->Layout().experts.empty());
  const SyntheticInput in = Input(s, 5, RoutingPattern::kUniform, 1);
  DeviceCase dc(*moe, in);
  const Status small = moe->Run(dc.Input(), dc.Output(OutputDType::kBF16), dc.workspace(), dc.workspace_bytes() - 1, nullptr);
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("workspace"), std::string::npos) << small.message();
  MoeInput none = dc.Input();
  none.topk_ids = nullptr;
  EXPECT_EQ(moe->Run(none, dc.Output(OutputDType::kBF16), dc.workspace(), dc.workspace_bytes(), nullptr).code(),
            StatusCode::kInvalidArgument);
  // T = 0: nothing to do, no workspace needed.
  MoeInput empty = dc.Input();
  empty.num_tokens = 0;
  EXPECT_TRUE(moe->Run(empty, dc.Output(OutputDType::kBF16), nullptr, 0, nullptr).ok());
  EXPECT_EQ(moe->WorkspaceSize(0), 0u);
}

// ---- small shapes: every kind x routing x token count against ReferenceMoe ---------------------
struct SmallCase {
  LayerShape shape;
  ActivationType kind;
};

TEST(CudaMoeSmall, AllKindsPatternsAndTokenCountsMatchReference) {
  MXMOE_REQUIRE_SM90();
  // K and I not multiples of 64 (96) exercise the padded tiles; I = 32 one MX block.
  const LayerShape shapes[] = {{8, 128, 64, 2}, {6, 96, 96, 3}, {16, 256, 160, 4}, {5, 64, 32, 5}};
  uint64_t seed = 100;
  for (const LayerShape& s : shapes) {
    for (ActivationType kind : kKinds) {
      const bool bias = kind == ActivationType::SwigluBias;
      ExpertSet set = SyntheticSet(s, SpecFor(kind, s.num_experts), ++seed, {}, bias);
      auto moe = MakeCudaMoe(set);
      ASSERT_TRUE(moe);
      for (RoutingPattern pat : kPatterns) {
        for (int64_t t : {0, 1, 2, 8, 33}) {
          SCOPED_TRACE(std::string(ActivationName(kind)) + " " + RoutingPatternName(pat) + " T=" +
                       std::to_string(t) + " K=" + std::to_string(s.hidden) + " I=" + std::to_string(s.intermediate));
          const SyntheticInput in = Input(s, t, pat, ++seed);
          DeviceCase dc(*moe, in);
          const std::vector<int64_t> dims{t, s.hidden};
          const auto ref32 = CpuF32(set, in, false);
          const auto ref16 = CpuBf16(set, in, false);
          EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref32, dims, s.top_k * s.intermediate));
          EXPECT_TRUE(MoeCloseBf16(dc.RunBf16(), ref16, dims, s.top_k * s.intermediate));
          EXPECT_TRUE(MoeCloseF32(dc.RunF32(/*reference=*/true), ref32, dims, s.top_k * s.intermediate));
        }
      }
    }
  }
}

// 256 pairs are the most that quantize and route in one launch (kFusedRoutePairs); 260 take the
// two-launch path. With the warp routing on (SetWarpRoute), up to 32 pairs the warps route without
// a barrier (RouteWarps) and 36 take the block's sort. Both sides of each boundary, with -1 slots
// among them, with the warp routing off and on.
TEST(CudaMoeSmall, FusedRoutingBoundaryMatchesReference) {
  MXMOE_REQUIRE_SM90();
  using WarpRoute = ScopedSetting<&cuda::WarpRouteEnabled, &cuda::SetWarpRoute>;
  const LayerShape s{16, 256, 160, 4};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 61);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  uint64_t seed = 62;
  for (RoutingPattern pat : {RoutingPattern::kUniform, RoutingPattern::kWithInvalid}) {
    for (int64_t t : {1, 8, 9, 64, 65}) {
      const SyntheticInput in = Input(s, t, pat, ++seed);
      const auto want = CpuF32(set, in, false);
      DeviceCase dc(*moe, in);
      for (bool warp : {false, true}) {
        SCOPED_TRACE(std::string(RoutingPatternName(pat)) + " T=" + std::to_string(t) + (warp ? " warp" : " block"));
        const WarpRoute route(warp);
        EXPECT_TRUE(MoeCloseF32(dc.RunF32(), want, {t, s.hidden}, s.top_k * s.intermediate));
      }
    }
  }
}

// The warps' routing (RouteWarps) against the block's sort, array for array, where the layer test
// above cannot look: up to 896 local experts (the warps' offset searches wrap around the block), an
// expert-parallel slice (ids of other ranks' experts skipped), -1 and repeated ids, tiles of 8 and
// of 2 columns (several tiles per expert).
TEST(CudaMoeSmall, WarpRoutingWritesWhatTheBlockSortWrites) {
  MXMOE_REQUIRE_SM90();
  constexpr int64_t kHidden = 64;
  TestRng rng(71);
  for (const int32_t num_local : {16, 300, 896}) {
    for (const int64_t first_expert : {int64_t{0}, int64_t{40}}) {
      for (const int32_t n : {1, 2, 7, 16, 31, 32}) {
        for (const int32_t block_n : {8, 2}) {
          const int32_t top_k = n % 2 == 0 ? n / 2 : n;  // one token of n slots, or two of n / 2
          const int64_t tokens = n / top_k;
          const int64_t num_experts = first_expert + num_local + 8;
          std::vector<int32_t> ids(n);
          for (int32_t& id : ids) {
            // Mostly local experts, some repeated, some -1, some of another rank.
            const int64_t r = rng.Below(10);
            id = static_cast<int32_t>(r == 1 ? first_expert : rng.Below(num_experts));
            if (r == 0) id = -1;
          }
          SCOPED_TRACE("num_local " + std::to_string(num_local) + " first " + std::to_string(first_expert) + " n " +
                       std::to_string(n) + " block_n " + std::to_string(block_n));
          DeviceMem x(tokens * kHidden * 2), xq(tokens * kHidden * 2), dev_ids(n * 4);
          MXMOE_CUDA_OK(cudaMemset(x.ptr, 0, x.bytes));
          MXMOE_CUDA_OK(cudaMemcpy(dev_ids.ptr, ids.data(), n * 4, cudaMemcpyHostToDevice));
          struct Routed {
            std::vector<int32_t> sorted, offsets, tile_offsets, tiles, num_tiles;
          };
          auto route = [&](int32_t warp_max, Routed* out) {
            DeviceMem sorted(n * 4), offsets((num_local + 1) * 4), tile_offsets((num_local + 1) * 4),
                tiles((n + 1) * 8), num_tiles(8);
            for (const DeviceMem* m : {&sorted, &offsets, &tile_offsets, &tiles, &num_tiles})
              MXMOE_CUDA_OK(cudaMemset(m->ptr, 0xA5, m->bytes));  // poisoned: every word read back is written
            cuda::PrepareParams pp;
            pp.num_tokens = tokens;
            pp.hidden = pp.x_stride = kHidden;
            pp.x_bf16 = x.As<uint16_t>();
            pp.xq = xq.As<uint16_t>();
            pp.topk_ids = dev_ids.As<int32_t>();
            pp.top_k = top_k;
            pp.first_expert = first_expert;
            pp.num_local = num_local;
            pp.num_experts = num_experts;
            cuda::RouteSmallParams rp;
            rp.n = n;
            rp.num_local = num_local;
            rp.key_bits = 10;
            rp.sorted_pairs = sorted.As<int32_t>();
            rp.offsets = offsets.As<int32_t>();
            rp.block_n = block_n;
            rp.tile_offsets = tile_offsets.As<int32_t>();
            rp.tiles = tiles.As<int2>();
            rp.num_tiles = num_tiles.As<int32_t>();
            rp.warp_max = warp_max;
            MXMOE_CUDA_OK(cuda::LaunchPrepareAndRoute(pp, rp, nullptr));
            MXMOE_CUDA_OK(cudaDeviceSynchronize());
            auto read = [](const DeviceMem& m, size_t words) {
              std::vector<int32_t> v(words);
              EXPECT_EQ(cudaMemcpy(v.data(), m.ptr, words * 4, cudaMemcpyDeviceToHost), cudaSuccess);
              return v;
            };
            out->num_tiles = read(num_tiles, 2);
            out->sorted = read(sorted, n);
            out->offsets = read(offsets, num_local + 1);
            out->tile_offsets = read(tile_offsets, num_local + 1);
            out->tiles = read(tiles, 2 * std::clamp(out->num_tiles[0], 0, n));
          };
          Routed block, warps;
          route(0, &block);
          route(cuda::kWarpRoutePairs, &warps);
          EXPECT_EQ(warps.num_tiles, block.num_tiles);
          EXPECT_EQ(warps.sorted, block.sorted);
          EXPECT_EQ(warps.offsets, block.offsets);
          EXPECT_EQ(warps.tile_offsets, block.tile_offsets);
          EXPECT_EQ(warps.tiles, block.tiles);
          // The block's sort itself against the ids: positions before expert e hold keys below e.
          int32_t below_last = 0;
          for (const int32_t id : ids) below_last += id >= first_expert && id < first_expert + num_local;
          EXPECT_EQ(block.offsets[num_local], below_last);
        }
      }
    }
  }
}

TEST(CudaMoeSmall, PrequantizedInputMatchesReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 192, 96, 3};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 41);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const SyntheticInput in = Input(s, 17, RoutingPattern::kWithInvalid, 42);
  // Quantize x on the host with the formats' own rule, then feed codes + scales.
  std::vector<uint8_t> codes, scales;
  QuantizeMxfp8(in.x_bf16, &codes, &scales);
  MoeInput host = InputOf(in);
  host.x_bf16 = nullptr;
  host.x_e4m3 = codes.data();
  host.x_scale = scales.data();
  const auto ref = ReferenceF32(set, host);
  DeviceCase dc(*moe, in);
  dc.UseFp8(codes, scales);
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, {in.num_tokens, s.hidden}, s.top_k * s.intermediate));
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(true), ref, {in.num_tokens, s.hidden}, s.top_k * s.intermediate));
}

TEST(CudaMoeSmall, OutOfRangeIdsAreSkipped) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 4};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Swiglu), 51);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  SyntheticInput in = Input(s, 40, RoutingPattern::kUniform, 52);
  SyntheticInput clean = in;
  PutOutOfRangeIds(&in, &clean);
  const auto ref = CpuF32(set, clean, false);
  DeviceCase dc(*moe, in);
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, {in.num_tokens, s.hidden}, s.top_k * s.intermediate));
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(true), ref, {in.num_tokens, s.hidden}, s.top_k * s.intermediate));
}

// SPEC section 2: NaN or Inf in x makes the affected token NaN and leaves every other token exact:
// bitwise what the same call gives with that token's x made finite (same T and routing, hence the
// same launch), for the fused pipeline and the GPU reference.
TEST(CudaMoeSmall, NonFiniteInputPoisonsOnlyItsToken) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 2};
  uint64_t seed = 60;
  for (ActivationType kind : {ActivationType::Situ, ActivationType::SwigluBias}) {
    ExpertSet set = SyntheticSet(s, Act(kind), ++seed, {}, kind == ActivationType::SwigluBias);
    auto moe = MakeCudaMoe(set);
    ASSERT_TRUE(moe);
    // NaN, +Inf, -Inf, a negative NaN with payload.
    for (uint16_t bad : {uint16_t{0x7FC0}, uint16_t{0x7F80}, uint16_t{0xFF80}, uint16_t{0xFFC1}}) {
      char what[64];
      std::snprintf(what, sizeof(what), "%s, x = bf16 0x%04x", ActivationName(kind), bad);
      SCOPED_TRACE(what);
      const SyntheticInput clean = Input(s, 6, RoutingPattern::kUniform, ++seed);
      SyntheticInput in = clean;
      const int64_t bad_t = 2;
      in.x_bf16[bad_t * s.hidden + 77] = bad;
      const auto ref = CpuF32(set, in, false);
      for (bool reference : {false, true}) {
        DeviceCase dc(*moe, in), dc_clean(*moe, clean);
        const auto got = dc.RunF32(reference);
        const auto want = dc_clean.RunF32(reference);
        for (int64_t n = 0; n < s.hidden; ++n) ASSERT_TRUE(std::isnan(got[bad_t * s.hidden + n])) << n;
        for (int64_t t = 0; t < in.num_tokens; ++t) {
          if (t == bad_t) continue;
          const std::vector<float> g(got.begin() + t * s.hidden, got.begin() + (t + 1) * s.hidden);
          const std::vector<float> w(want.begin() + t * s.hidden, want.begin() + (t + 1) * s.hidden);
          EXPECT_TRUE(BitwiseEqual(g, w, {1, s.hidden})) << "token " << t << (reference ? " (GPU reference)" : "");
        }
        EXPECT_TRUE(AllClose(got, ref, MoeTolF32(ref, s.top_k * s.intermediate), {in.num_tokens, s.hidden}));  // NaN matches NaN
        const auto got16 = dc.RunBf16(reference);
        for (int64_t n = 0; n < s.hidden; ++n) ASSERT_TRUE(std::isnan(bf16_to_float(got16[bad_t * s.hidden + n]))) << n;
      }
    }
  }
}

// A NaN scale (UE8M0 0xFF) or a NaN code (E4M3 0x7F) in pre-quantized x: the token is NaN, the
// others are exact. (E4M3 has no infinity.)
TEST(CudaMoeSmall, NanInPrequantizedInputPoisonsOnlyItsToken) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 3};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 66);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const SyntheticInput in = Input(s, 5, RoutingPattern::kUniform, 67);
  std::vector<uint8_t> codes, scales;
  QuantizeMxfp8(in.x_bf16, &codes, &scales);
  const int64_t blocks_per_row = s.hidden / kMxBlock;
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<uint8_t> bad_codes = codes, bad_scales = scales;
    const int64_t bad_t = 1 + variant * 2;
    if (variant == 0) bad_scales[bad_t * blocks_per_row + 1] = kUe8m0Nan;
    else bad_codes[bad_t * s.hidden + 40] = 0x7F;
    DeviceCase dc(*moe, in), dc_clean(*moe, in);
    dc.UseFp8(bad_codes, bad_scales);
    dc_clean.UseFp8(codes, scales);
    for (bool reference : {false, true}) {
      const auto got = dc.RunF32(reference);
      const auto want = dc_clean.RunF32(reference);
      for (int64_t t = 0; t < in.num_tokens; ++t)
        for (int64_t n = 0; n < s.hidden; ++n) {
          const size_t i = static_cast<size_t>(t * s.hidden + n);
          if (t == bad_t) ASSERT_TRUE(std::isnan(got[i])) << "variant " << variant << " n " << n;
          else ASSERT_EQ(detail::Bits(got[i]), detail::Bits(want[i])) << "variant " << variant << " t " << t << " n " << n;
        }
    }
  }
}

// ---- the device-side error word ----------------------------------------------------------------
// Ids outside [-1, E) are counted, once per call that reads them, by Run (one atomic per block of
// the routing kernel; T*k spans many blocks here) and RunReference; ids of other EP ranks are not.
TEST(CudaMoeErrors, BadIdsAreCountedInTheErrorWord) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 4};
  ParallelSlice slice;
  slice.ep_size = 2;
  slice.ep_rank = 1;  // local experts 4..7; ids 0..3 belong to the other rank
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Swiglu), 201, slice);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  moe->SetDebugCheck(false);  // whatever MXMOE_DEBUG_CHECK says: switched on below
  EXPECT_FALSE(moe->DebugCheck());
  int64_t count = -1;
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  EXPECT_EQ(count, 0);
  EXPECT_EQ(moe->ReadErrors(nullptr).code(), StatusCode::kInvalidArgument);

  const SyntheticInput clean = Input(s, 1000, RoutingPattern::kWithInvalid, 202);
  SyntheticInput in = clean;
  SyntheticInput cleaned = clean;  // bad ids as -1, for the reference (which refuses them)
  const int32_t junk[] = {8, 9, 1000000, -2, -7, 2147483647, -2147483647 - 1};
  int64_t bad = 0;
  for (size_t i = 0; i < in.topk_ids.size(); i += 7) {
    in.topk_ids[i] = junk[bad % 7];
    in.topk_weights[i] = NAN;  // a skipped slot's weight is never read
    cleaned.topk_ids[i] = -1;
    ++bad;
  }
  const auto ref = CpuF32(set, cleaned, false);
  const std::vector<int64_t> dims{in.num_tokens, s.hidden};
  const int64_t pw = s.top_k * s.intermediate;
  {
    DeviceCase dc(*moe, clean);  // -1 and other ranks' ids only
    dc.RunF32();
    dc.RunF32(true);
    ASSERT_TRUE(moe->ReadErrors(&count).ok());
    EXPECT_EQ(count, 0);
  }
  DeviceCase dc(*moe, in);
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, dims, pw));
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  EXPECT_EQ(count, bad);
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(true), ref, dims, pw));
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  EXPECT_EQ(count, 2 * bad);
  ASSERT_TRUE(moe->ResetErrors().ok());
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  EXPECT_EQ(count, 0);

  // Debug mode: the call reports the bad ids of this call (not the earlier ones), output intact.
  dc.RunF32();
  moe->SetDebugCheck(true);
  EXPECT_TRUE(moe->DebugCheck());
  for (bool reference : {false, true}) {
    dc.Poison();
    const Status st = dc.Launch(OutputDType::kF32, reference);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("topk_ids: " + std::to_string(bad) + " expert ids"), std::string::npos) << st.message();
    EXPECT_TRUE(MoeCloseF32(dc.Fetch<float>(), ref, dims, pw));
  }
  {
    DeviceCase ok_case(*moe, clean);
    ok_case.Poison();
    const Status st = ok_case.Launch(OutputDType::kBF16, false);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  // Captured with debug mode on: no synchronization in the capture; each replay counts.
  ASSERT_TRUE(moe->ResetErrors().ok());
  {
    CapturedCall captured(dc, OutputDType::kF32);
    ASSERT_TRUE(captured.status().ok()) << captured.status().ToString();
    captured.Replay(3);
  }
  ASSERT_TRUE(moe->ReadErrors(&count).ok());
  EXPECT_EQ(count, 3 * bad);
  EXPECT_TRUE(MoeCloseF32(dc.Fetch<float>(), ref, dims, pw));
  moe->SetDebugCheck(false);
}

// Host memory where device memory is required is refused naming the tensor (unless the device
// reads pageable memory, HMM / ATS: then the call must work); mapped pinned memory works.
TEST(CudaApi, RefusesHostPointersNamingTheTensor) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{8, 128, 64, 2};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 211);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const SyntheticInput in = Input(s, 9, RoutingPattern::kUniform, 212);
  DeviceCase dc(*moe, in);
  const auto want = dc.RunF32();
  int pageable = 0;
  MXMOE_CUDA_OK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
  std::printf("device 0 pageable memory access: %d\n", pageable);
  std::vector<float> host_out(static_cast<size_t>(in.num_tokens * s.hidden));
  std::vector<uint8_t> host_ws(dc.workspace_bytes() + 256);
  void* host_ws_aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host_ws.data()) + 255) / 256 * 256);
  struct Case {
    const char* name;
    MoeInput in;
    MoeOutput out;
    void* ws;
  };
  auto with = [&](auto mutate) {
    Case c{"", dc.Input(), dc.Output(OutputDType::kF32), dc.workspace()};
    mutate(c);
    return c;
  };
  const Case cases[] = {
      with([&](Case& c) { c.name = "x_bf16", c.in.x_bf16 = in.x_bf16.data(); }),
      with([&](Case& c) { c.name = "topk_ids", c.in.topk_ids = in.topk_ids.data(); }),
      with([&](Case& c) { c.name = "topk_weights", c.in.topk_weights = in.topk_weights.data(); }),
      with([&](Case& c) { c.name = "output", c.out.data = host_out.data(); }),
      with([&](Case& c) { c.name = "workspace", c.ws = host_ws_aligned; }),
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (bool reference : {false, true}) {
      const Status st = reference ? moe->RunReference(c.in, c.out, c.ws, dc.workspace_bytes(), nullptr)
                                  : moe->Run(c.in, c.out, c.ws, dc.workspace_bytes(), nullptr);
      if (pageable) {
        EXPECT_TRUE(st.ok()) << st.ToString();
        MXMOE_CUDA_OK(cudaDeviceSynchronize());
      } else {
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
        EXPECT_EQ(st.message().rfind(std::string(c.name) + ": host memory", 0), 0u) << st.message();
      }
    }
  }
  // Pinned (mapped) host memory is readable by the device: accepted, same result.
  int32_t* pinned_ids = nullptr;
  MXMOE_CUDA_OK(cudaMallocHost(&pinned_ids, in.topk_ids.size() * sizeof(int32_t)));
  std::copy(in.topk_ids.begin(), in.topk_ids.end(), pinned_ids);
  MoeInput pinned = dc.Input();
  pinned.topk_ids = pinned_ids;
  dc.Poison();
  const Status st = moe->Run(pinned, dc.Output(OutputDType::kF32), dc.workspace(), dc.workspace_bytes(), nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(BitwiseEqual(dc.Fetch<float>(), want, {in.num_tokens, s.hidden}));
  cudaFreeHost(pinned_ids);
}

// ---- model shapes against the CPU backend -------------------------------------------------------
TEST(CudaMoeModels, KimiK3ShapeMatchesCpu) {
  MXMOE_REQUIRE_SM90();
  LayerShape s = kKimiK3Shape;
  s.num_experts = 32;  // fewer experts keep the CPU side quick; the shape of each is Kimi-K3's
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 71);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  for (int64_t t : {1, 8, 32}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    const SyntheticInput in = Input(s, t, RoutingPattern::kUniform, 72 + t);
    DeviceCase dc(*moe, in);
    const std::vector<int64_t> dims{t, s.hidden};
    EXPECT_TRUE(MoeCloseBf16(dc.RunBf16(), CpuBf16(set, in, true), dims, s.top_k * s.intermediate));
    const auto ref = CpuF32(set, in, true);
    EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, dims, s.top_k * s.intermediate));
    EXPECT_TRUE(MoeCloseF32(dc.RunF32(true), ref, dims, s.top_k * s.intermediate));
  }
}

TEST(CudaMoeModels, GptOssShapeMatchesCpuAndReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{128, 2880, 2880, 4};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::SwigluBias), 81, {}, /*with_bias=*/true);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  {
    const SyntheticInput in = Input(s, 33, RoutingPattern::kUniform, 82);
    DeviceCase dc(*moe, in);
    EXPECT_TRUE(MoeCloseF32(dc.RunF32(), CpuF32(set, in, true), {33, s.hidden}, s.top_k * s.intermediate));
  }
  for (int64_t t : {128, 1024}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    const SyntheticInput in = Input(s, t, RoutingPattern::kHeavyHitters, 83 + t);
    DeviceCase dc(*moe, in);
    EXPECT_TRUE(MoeCloseF32(dc.RunF32(), dc.RunF32(true), {t, s.hidden}, s.top_k * s.intermediate));
  }
}

TEST(CudaMoeModels, DeepSeekShapeMatchesCpuAndReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{256, 7168, 2048, 8};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Swiglu), 91);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  {
    const SyntheticInput in = Input(s, 32, RoutingPattern::kUniform, 92);
    DeviceCase dc(*moe, in);
    EXPECT_TRUE(MoeCloseBf16(dc.RunBf16(), CpuBf16(set, in, true), {32, s.hidden}, s.top_k * s.intermediate));
  }
  const SyntheticInput in = Input(s, 1024, RoutingPattern::kUniform, 93);
  DeviceCase dc(*moe, in);
  EXPECT_TRUE(MoeCloseF32(dc.RunF32(), dc.RunF32(true), {1024, s.hidden}, s.top_k * s.intermediate));
}

// ---- large token counts and routing patterns against the GPU reference -------------------------
TEST(CudaMoeLarge, KimiK3ShapeMatchesGpuReference) {
  MXMOE_REQUIRE_SM90();
  LayerShape s = kKimiK3Shape;
  s.num_experts = 64;
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 101);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  for (int64_t t : {128, 1024}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    const SyntheticInput in = Input(s, t, RoutingPattern::kUniform, 102 + t);
    DeviceCase dc(*moe, in);
    EXPECT_TRUE(MoeCloseF32(dc.RunF32(), dc.RunF32(true), {t, s.hidden}, s.top_k * s.intermediate));
  }
}

TEST(CudaMoeLarge, RoutingPatternsAndTokenCountsMatchGpuReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{64, 1024, 512, 8};
  uint64_t seed = 110;
  for (ActivationType kind : {ActivationType::Situ, ActivationType::GegluTanh}) {
    ExpertSet set = SyntheticSet(s, SpecFor(kind, s.num_experts), ++seed);
    auto moe = MakeCudaMoe(set);
    ASSERT_TRUE(moe);
    for (RoutingPattern pat : kPatterns)
      for (int64_t t : {128, 1024, 4096}) {
        SCOPED_TRACE(std::string(ActivationName(kind)) + " " + RoutingPatternName(pat) + " T=" + std::to_string(t));
        const SyntheticInput in = Input(s, t, pat, ++seed);
        DeviceCase dc(*moe, in);
        EXPECT_TRUE(MoeCloseF32(dc.RunF32(), dc.RunF32(true), {t, s.hidden}, s.top_k * s.intermediate));
        const auto ref16 = dc.RunBf16(true);
        EXPECT_TRUE(MoeCloseBf16(dc.RunBf16(), ref16, {t, s.hidden}, s.top_k * s.intermediate));
      }
  }
}

// ---- parallel slices ----------------------------------------------------------------------------
std::vector<float> RunSlice(const LayerShape& s, const ActivationSpec& act, uint64_t seed,
                            const ParallelSlice& slice, const SyntheticInput& in) {
  ExpertSet set = SyntheticSet(s, act, seed, slice);
  auto moe = MakeCudaMoe(set);
  if (!moe) return {};
  DeviceCase dc(*moe, in);
  return dc.RunF32();
}

TEST(CudaMoeSlices, ExpertAndTensorParallelSumToTheFullLayer) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{64, 512, 256, 6};
  const ActivationSpec act = SpecFor(ActivationType::Situ, s.num_experts);
  const uint64_t seed = 121;
  const SyntheticInput in = Input(s, 200, RoutingPattern::kHeavyHitters, 122);
  const auto full = RunSlice(s, act, seed, {}, in);
  ASSERT_FALSE(full.empty());
  for (int ep : {2, 4, 8}) {
    std::vector<float> sum(full.size(), 0.0f);
    for (int r = 0; r < ep; ++r) {
      ParallelSlice slice;
      slice.ep_size = ep;
      slice.ep_rank = r;
      const auto part = RunSlice(s, act, seed, slice, in);
      ASSERT_EQ(part.size(), full.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_TRUE(AllClose(sum, full, SliceTol(full), {in.num_tokens, s.hidden})) << "EP " << ep;
  }
  for (int tp : {2, 4}) {
    std::vector<float> sum(full.size(), 0.0f);
    for (int r = 0; r < tp; ++r) {
      ParallelSlice slice;
      slice.tp_size = tp;
      slice.tp_rank = r;
      const auto part = RunSlice(s, act, seed, slice, in);
      ASSERT_EQ(part.size(), full.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_TRUE(AllClose(sum, full, SliceTol(full), {in.num_tokens, s.hidden})) << "TP " << tp;
  }
  // One slice against the CPU reference of the same slice.
  ParallelSlice both;
  both.tp_size = 2;
  both.tp_rank = 1;
  both.ep_size = 4;
  both.ep_rank = 2;
  ExpertSet set = SyntheticSet(s, act, seed, both);
  EXPECT_TRUE(MoeCloseF32(RunSlice(s, act, seed, both, in), CpuF32(set, in, true), {in.num_tokens, s.hidden}, s.top_k * s.intermediate / 2));
}

// ---- chunked calls: token chunks and pair chunks ------------------------------------------------
// A small workspace target makes calls of a few hundred tokens chunk on small layers; pair chunks
// (MXMOE_PAIR_CHUNKS) then route each outer chunk once and run ranges of its sorted pairs that
// cut through experts' runs. Restores the defaults when it goes.
struct ChunkSettings {
  // (combine: n8f's folded combine, on by default as in the library)
  ChunkSettings(size_t workspace_target, bool pair_chunks, int config = -1, bool combine = true)
      : pairs_before(cuda::PairChunksEnabled()), combine_before(cuda::DecodeCombineEnabled()) {
    cuda::SetWorkspaceTarget(workspace_target);
    cuda::SetPairChunks(pair_chunks);
    cuda::ForceGemmConfig(config);
    cuda::SetDecodeCombine(combine);  // (n8f's folded combine, MXMOE_DECODE_COMBINE)
  }
  ~ChunkSettings() {
    cuda::SetWorkspaceTarget(0);
    cuda::SetPairChunks(pairs_before);
    cuda::ForceGemmConfig(-1);
    cuda::SetDecodeCombine(combine_before);
  }
  const bool pairs_before, combine_before;
};

TEST(CudaMoeChunks, TokenAndPairChunksMatchReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{16, 256, 160, 4};
  const ActivationSpec act = SpecFor(ActivationType::Situ, s.num_experts);
  // The heuristics' config, an mma.sync one that gathers its tokens itself, a wgmma one and an
  // mma.sync one fed by TMA that read them gathered in sorted order (LaunchGatherRows on each range),
  // and n8f, whose token chunks here (at most ~40 tokens, 160 pairs) each run the fused decode
  // kernel in the same workspace words (also with the combine folded in, each chunk writing its
  // own rows of the output), and whose pair chunks run n8's kernels.
  const auto id = [](cuda::GemmConfigId c) { return static_cast<int>(c); };
  const std::pair<int, bool> configs[] = {{-1, true},
                                          {id(cuda::GemmConfigId::kN32), false},
                                          {id(cuda::GemmConfigId::kWg128d3x3), false},
                                          {id(cuda::GemmConfigId::kN32t), false},
                                          {id(cuda::GemmConfigId::kN8f), false},
                                          {id(cuda::GemmConfigId::kN8f), true}};
  // One layer and one set of calls, their CPU references computed once.
  const ExpertSet set = SyntheticSet(s, act, 700);
  struct Call {
    SyntheticInput in;
    RoutingPattern pattern;
    std::vector<float> ref32;
    std::vector<uint16_t> ref16;
  };
  std::vector<Call> calls;
  uint64_t seed = 701;
  for (RoutingPattern pat : {RoutingPattern::kUniform, RoutingPattern::kHeavyHitters, RoutingPattern::kWithInvalid})
    for (int64_t t : {1, 150, 600}) {
      Call c{Input(s, t, pat, ++seed), pat, {}, {}};
      c.ref32 = CpuF32(set, c.in, true);
      c.ref16 = CpuBf16(set, c.in, true);
      calls.push_back(std::move(c));
    }
  for (size_t target : {size_t{256} << 10, size_t{1} << 20}) {
    for (const auto& [config, combine] : configs) {
      for (bool pairs : {false, true}) {
        ChunkSettings chunked(target, pairs, config, combine);
        auto moe = MakeCudaMoe(set);
        ASSERT_TRUE(moe);
        for (const Call& c : calls) {
          const int64_t t = c.in.num_tokens;
          const std::string plan = moe->Plan(t);
          SCOPED_TRACE("target " + std::to_string(target) + " config " + std::to_string(config) +
                       (combine ? " combine folded in " : " ") + RoutingPatternName(c.pattern) +
                       " T=" + std::to_string(t) + ": " + plan);
          // T = 600 chunks at both targets (the point of the test), in the mode asked for; T = 1 never.
          if (t == 600) {
            EXPECT_NE(plan.find(" chunks"), std::string::npos);
            EXPECT_EQ(plan.find("pair chunks") != std::string::npos, pairs);
          }
          if (t == 1) {
            EXPECT_EQ(plan.find("chunks"), std::string::npos);
          }
          // At 1 MB, T = 600 makes 2 outer chunks of several ranges each, so ranges in the middle
          // of an outer chunk (neither first nor last) run too.
          if (pairs && t == 600 && target == (size_t{1} << 20)) {
            const size_t x = plan.rfind(" x");
            ASSERT_NE(x, std::string::npos);
            EXPECT_GE(std::stoi(plan.substr(x + 2)), 5);
          }
          DeviceCase dc(*moe, c.in);
          const std::vector<int64_t> dims{t, s.hidden};
          const auto f32 = dc.RunF32();
          EXPECT_TRUE(MoeCloseF32(f32, c.ref32, dims, s.top_k * s.intermediate));
          EXPECT_TRUE(MoeCloseBf16(dc.RunBf16(), c.ref16, dims, s.top_k * s.intermediate));
          EXPECT_TRUE(BitwiseEqual(dc.RunF32(), f32, dims));  // fixed order: runs repeat bit for bit
        }
      }
    }
  }
}

// Pair chunks on an expert-parallel slice: the other ranks' pairs sort last, so the last ranges
// have no tiles (and the combine skips those in the middle: here ~5 ranges per outer chunk, a
// quarter of the pairs local). Against the CPU reference of the slice, and the slices' sum against
// the full layer.
TEST(CudaMoeChunks, PairChunksOnExpertSlicesMatchReference) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{16, 256, 160, 4};
  const ActivationSpec act = SpecFor(ActivationType::Swiglu, s.num_experts);
  const uint64_t seed = 731;
  const SyntheticInput in = Input(s, 600, RoutingPattern::kUniform, 732);
  ChunkSettings chunked(size_t{1} << 20, true);
  const auto full = RunSlice(s, act, seed, {}, in);
  ASSERT_FALSE(full.empty());
  std::vector<float> sum(full.size(), 0.0f);
  for (int r = 0; r < 4; ++r) {
    ParallelSlice slice;
    slice.ep_size = 4;
    slice.ep_rank = r;
    ExpertSet set = SyntheticSet(s, act, seed, slice);
    auto moe = MakeCudaMoe(set);
    ASSERT_TRUE(moe);
    EXPECT_NE(moe->Plan(in.num_tokens).find("pair chunks"), std::string::npos) << moe->Plan(in.num_tokens);
    DeviceCase dc(*moe, in);
    const auto part = dc.RunF32();
    EXPECT_TRUE(MoeCloseF32(part, CpuF32(set, in, true), {in.num_tokens, s.hidden}, s.top_k * s.intermediate))
        << "EP rank " << r;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  EXPECT_TRUE(AllClose(sum, full, SliceTol(full), {in.num_tokens, s.hidden}));
}

// A call in pair chunks captured in a CUDA graph and replayed on new inputs equals the eager run.
TEST(CudaMoeChunks, PairChunksReplayFromAGraph) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{16, 256, 160, 4};
  ChunkSettings chunked(size_t{1} << 20, true);
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 741);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  const int64_t t = 600;
  ASSERT_NE(moe->Plan(t).find("pair chunks"), std::string::npos) << moe->Plan(t);
  DeviceCase dc(*moe, Input(s, t, RoutingPattern::kUniform, 742));
  CapturedCall captured(dc, OutputDType::kBF16);
  ASSERT_TRUE(captured.status().ok()) << captured.status().ToString();
  dc.Upload(Input(s, t, RoutingPattern::kHeavyHitters, 743));
  dc.Poison(captured.stream());
  captured.Replay();
  const auto replayed = dc.Fetch<uint16_t>();
  EXPECT_TRUE(AllWritten(replayed, {t, s.hidden}));
  EXPECT_TRUE(BitwiseEqualBf16(replayed, dc.RunBf16(), {t, s.hidden}));
  EXPECT_TRUE(MoeCloseBf16(replayed, dc.RunBf16(/*reference=*/true), {t, s.hidden}, s.top_k * s.intermediate));
}

// A workspace of WorkspaceSize(T) serves every call of fewer tokens, in token and in pair chunks:
// the size never falls as T grows (the pair chunks' plan does: more per-token buffers, shorter
// ranges), and calls of 1..T tokens run in it.
TEST(CudaMoeChunks, WorkspaceForTServesFewerTokens) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{16, 256, 160, 4};
  const ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 751);
  std::vector<std::pair<SyntheticInput, std::vector<float>>> calls;  // the inputs and their CPU references
  for (int64_t t : {1, 37, 171, 172, 340, 341, 599}) {
    SyntheticInput in = Input(s, t, RoutingPattern::kHeavyHitters, 753 + t);
    std::vector<float> ref = CpuF32(set, in, true);
    calls.emplace_back(std::move(in), std::move(ref));
  }
  const SyntheticInput big = Input(s, 600, RoutingPattern::kUniform, 752);
  for (size_t target : {size_t{256} << 10, size_t{1} << 20}) {
    for (bool pairs : {false, true}) {
      ChunkSettings chunked(target, pairs);
      auto moe = MakeCudaMoe(set);
      ASSERT_TRUE(moe);
      for (int64_t t = 1; t < 2000; ++t) ASSERT_LE(moe->WorkspaceSize(t), moe->WorkspaceSize(t + 1)) << "T = " << t;
      DeviceCase dc(*moe, big);  // its workspace: WorkspaceSize(600)
      for (const auto& [in, ref] : calls) {
        const int64_t t = in.num_tokens;
        SCOPED_TRACE("target " + std::to_string(target) + (pairs ? " pair" : " token") + " chunks, T = " + std::to_string(t));
        DeviceCase small(*moe, in);
        small.Poison();  // (NaN: an element the call does not write fails the comparison)
        const Status st =
            moe->Run(small.Input(), small.Output(OutputDType::kF32), dc.workspace(), dc.workspace_bytes(), nullptr);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(MoeCloseF32(small.Fetch<float>(), ref, {t, s.hidden}, s.top_k * s.intermediate));
      }
    }
  }
}

// ---- determinism and graphs ---------------------------------------------------------------------
TEST(CudaMoeDeterminism, RunsAreBitwiseEqual) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{64, 1024, 512, 8};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 131);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  for (int64_t t : {3, 1024}) {
    const SyntheticInput in = Input(s, t, RoutingPattern::kHeavyHitters, 132 + t);
    DeviceCase dc(*moe, in);
    const auto a = dc.RunF32(), b = dc.RunF32();
    EXPECT_TRUE(BitwiseEqual(a, b, {t, s.hidden}));
    const auto c = dc.RunBf16(), d = dc.RunBf16();
    EXPECT_TRUE(BitwiseEqualBf16(c, d, {t, s.hidden}));
  }
}

TEST(CudaMoeGraph, CapturedReplayWithNewInputsEqualsEager) {
  MXMOE_REQUIRE_SM90();
  const LayerShape s{64, 1024, 512, 8};
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 141);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  for (int64_t t : {8, 512}) {
    const SyntheticInput first = Input(s, t, RoutingPattern::kUniform, 142 + t);
    const SyntheticInput second = Input(s, t, RoutingPattern::kHeavyHitters, 143 + t);
    DeviceCase dc(*moe, first);
    if (t > 8) dc.RunBf16();  // one eager warm-up; T = 8 is captured cold
    CapturedCall captured(dc, OutputDType::kBF16);
    ASSERT_TRUE(captured.status().ok()) << captured.status().ToString();
    // Replay on the second input, copied into the captured buffers.
    dc.Upload(second);
    dc.Poison(captured.stream());
    captured.Replay();
    const auto replayed = dc.Fetch<uint16_t>();
    EXPECT_TRUE(AllWritten(replayed, {t, s.hidden}));
    const auto eager = dc.RunBf16();
    EXPECT_TRUE(BitwiseEqualBf16(replayed, eager, {t, s.hidden}));
    EXPECT_TRUE(MoeCloseBf16(eager, dc.RunBf16(true), {t, s.hidden}, s.top_k * s.intermediate));
  }
}

// The nodes of a captured call in launch order, each with its kernel's name and whether its incoming
// edge is programmatic (a launch with PDL's attribute under capture: the kernel may start before the
// one before it ends); empty, with a failure added, if the graph is not one chain.
struct ChainKernel {
  std::string name;  // the entry function's (mangled) name
  bool programmatic_in;
};
std::vector<ChainKernel> KernelChain(cudaGraph_t graph) {
  size_t n_nodes = 0, n_edges = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &n_nodes), cudaSuccess);
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n_edges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n_edges), to(n_edges);
  std::vector<cudaGraphEdgeData> data(n_edges);
  if (n_edges > 0) EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n_edges), cudaSuccess);
  if (n_nodes == 0 || n_edges + 1 != n_nodes) {
    ADD_FAILURE() << n_nodes << " nodes and " << n_edges << " edges: not a chain";
    return {};
  }
  size_t roots = 1;
  cudaGraphNode_t node = nullptr;
  EXPECT_EQ(cudaGraphGetRootNodes(graph, &node, &roots), cudaSuccess);
  std::vector<ChainKernel> chain;
  bool programmatic = false;
  while (node != nullptr && chain.size() < n_nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    EXPECT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    std::string name = "(not a kernel)";  // (a memset, say: the sort's)
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams params = {};
      const char* fn = nullptr;
      if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess ||
          cudaFuncGetName(&fn, params.func) != cudaSuccess || fn == nullptr) {
        ADD_FAILURE() << "kernel node " << chain.size() << " has no name";
        return {};
      }
      name = fn;
    }
    chain.push_back({name, programmatic});
    cudaGraphNode_t next = nullptr;
    for (size_t e = 0; e < n_edges; ++e) {
      if (from[e] != node) continue;
      if (next != nullptr) {
        ADD_FAILURE() << "node " << chain.size() - 1 << " has two successors";
        return {};
      }
      next = to[e];
      programmatic = data[e].type == cudaGraphDependencyTypeProgrammatic;
    }
    node = next;
  }
  EXPECT_EQ(chain.size(), n_nodes) << "the chain from the root misses nodes";
  return chain;
}

bool IsGemmKernel(const std::string& name) {
  for (const char* k : {"MoeGemmKernel", "MoeGemmTmaKernel", "MoeWgmmaKernel", "MoeWgmmaFc1PersistentKernel",
                        "MoeDecodeKernel", "MoeGemmSm120Kernel"})
    if (name.find(k) != std::string::npos) return true;
  return false;
}

// Without MXMOE_PDL, a decode call (at most kDecodeMaxPairs pairs) launches its first GEMM kernel
// (FC1, or n8f's one kernel) and the combine with PDL's attribute (perf-log v23), and FC2 too where
// its CTAs are capped (kFc2CapMinFc1CtasPerSm, v32: here T = 8, whose n8c2 FC1 grid is 8 row blocks x
// 64 tiles x 2 = 1024 CTAs), and no other kernel; a larger call launches none with it. Calls of at
// most MXMOE_FC2_COMBINE tokens (1 by default) that n8f does not run have no combine kernel: FC2
// folds it in. The captured graphs show it as programmatic edges; each replay equals its eager call.
TEST(CudaMoeGraph, DecodeCallsOverlapOnlyTheirDefaultEdges) {
  MXMOE_REQUIRE_SM90();
  if (std::getenv("MXMOE_PDL") != nullptr) GTEST_SKIP() << "MXMOE_PDL is set: it replaces the default sites";
  const LayerShape s{64, 512, 1024, 8};  // (FC1 8 row blocks: ~502 n8 CTAs at T = 32, past n8c2's 400)
  ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 151);
  auto moe = MakeCudaMoe(set);
  ASSERT_TRUE(moe);
  // The heuristics' configs as by default (n8f with the combine folded in at T = 32: no combine
  // kernel, one programmatic edge; the clusters at T = 1 and 8, n8 at 33), then n8f forced with the
  // combine kernel; the workspace target and chunk mode as by default.
  for (const int config : {-1, static_cast<int>(cuda::GemmConfigId::kN8f)}) {
    const bool folded = config < 0;
    const ChunkSettings plan(0, cuda::PairChunksEnabled(), config, folded);
    for (int64_t t : {1, 8, 32, 33, 512}) {
      const bool decode = t * s.top_k <= cuda::kDecodeMaxPairs;
      SCOPED_TRACE("T=" + std::to_string(t) + " plan " + moe->Plan(t));
      DeviceCase dc(*moe, Input(s, t, RoutingPattern::kUniform, 152 + t));
      const auto eager = dc.RunBf16();
      const int64_t capped_before = cuda::CappedFc2Launches(), folded_before = cuda::FoldedCombines();
      CapturedCall captured(dc, OutputDType::kBF16);
      ASSERT_TRUE(captured.status().ok()) << captured.status().ToString();
      const bool capped = cuda::CappedFc2Launches() > capped_before;
      // (FC2 folds the combine in only in decode calls of at most MXMOE_FC2_COMBINE tokens (1 by
      // default) that n8f does not run.)
      const bool fc2_folded = cuda::FoldedCombines() > folded_before;
      EXPECT_EQ(fc2_folded, t <= cuda::Fc2CombineTokens() && moe->Plan(t).rfind("n8f", 0) != 0);
      EXPECT_EQ(capped, folded && t == 8) << "where FC1's grid holds 4 CTAs per SM";
      const std::vector<ChainKernel> chain = KernelChain(captured.graph());
      ASSERT_GE(chain.size(), 2u);
      int gemms = 0;
      for (size_t i = 0; i < chain.size(); ++i) {
        const bool gemm = IsGemmKernel(chain[i].name);
        const bool combine = chain[i].name.find("CombineKernel") != std::string::npos;
        const bool want = decode && ((gemm && (gemms == 0 || capped)) || combine);
        EXPECT_EQ(chain[i].programmatic_in, want) << "kernel " << i << ": " << chain[i].name;
        if (gemm) ++gemms;
      }
      if (config < 0) EXPECT_EQ(moe->Plan(t) == "n8f+combine", t == 32) << "where the heuristics choose n8f";
      if (decode && folded && moe->Plan(t) == "n8f+combine") {
        EXPECT_EQ(chain.size(), 2u) << "routing and n8f, no combine kernel";
      } else if (fc2_folded) {
        EXPECT_EQ(chain.size(), 3u) << "routing, FC1 and FC2, no combine kernel";
      } else {
        EXPECT_NE(chain.back().name.find("CombineKernel"), std::string::npos) << chain.back().name;
      }
      dc.Poison(captured.stream());
      captured.Replay();
      EXPECT_TRUE(BitwiseEqualBf16(dc.Fetch<uint16_t>(), eager, {t, s.hidden}));
    }
  }
  // Each call restored its thread's default sites (none) when it returned.
  EXPECT_EQ(cuda::PdlDefaultSites(), 0u);
}

}  // namespace
}  // namespace mxmoe::test
