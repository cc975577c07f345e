// The SM120 path's own pieces: its weight layout against the MMA's fragment layouts (host), the
// repack kernel against the checkpoint tensors (any GPU: the repack has no MMA), and the path
// itself through CudaMoe on small shapes, every config, against the CPU reference (an SM120 GPU,
// or an SM90 GPU in the emulation build: MXMOE_CUDA_PATH=sm120). The whole GPU suite runs through
// the path too when the environment sets MXMOE_CUDA_PATH=sm120 (scripts/device-gpu.sh sm120).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/moe_run.h"
#include "common/random.h"
#include "cuda/sm120/mma_mxf8f6f4.cuh"
#include "cuda/sm120/sm120_kernels.h"
#include "cuda/sm120/weight_layout_sm120.h"
#include "gpu/gpu_harness.h"
#include "gpu/tolerance.h"
#include "mxmoe/cuda.h"
#include "mxmoe/formats.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {
namespace {

namespace s120 = ::mxmoe::cuda::sm120;

// ---- layout, on the host ----------------------------------------------------------------------
TEST(Sm120Layout, Fc1RowOrderIsABijection) {
  for (int64_t inter : {32, 96, 3072}) {
    std::vector<int> seen(static_cast<size_t>(2 * inter), 0);
    for (int64_t i = 0; i < inter; ++i)
      for (bool up : {false, true}) {
        const int64_t r = s120::Fc1PackedRow(i, up);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, 2 * inter);
        ++seen[static_cast<size_t>(r)];
        bool up_back;
        ASSERT_EQ(s120::Fc1Intermediate(r, &up_back), i);
        ASSERT_EQ(up_back, up);
        // The epilogue's reading: tile j, column 2 t + up of the group holds intermediate 32 q + 8 t + j.
        const int64_t in_group = r % s120::kGroupRows;
        const int64_t j = in_group / 8, col = in_group % 8;
        EXPECT_EQ(col % 2, up ? 1 : 0);
        EXPECT_EQ(i, (r / s120::kGroupRows) * 32 + 8 * (col / 2) + j);
      }
    for (int v : seen) ASSERT_EQ(v, 1) << "I = " << inter;
  }
}

TEST(Sm120Layout, CodeAndScaleOffsetsAreBijections) {
  for (int64_t rows : {64, 320, 3584})
    for (int64_t cols : {32, 96, 128, 2880}) {
      const s120::PackedShape s = s120::PackedShape::Of(rows, cols);
      std::vector<uint8_t> nibbles(static_cast<size_t>(s.CodeBytes()), 0);
      std::vector<int> scales(static_cast<size_t>(s.ScaleBytes()), 0);
      for (int64_t r = 0; r < s.groups * s120::kGroupRows; ++r)
        for (int64_t k = 0; k < s.k_tiles * s120::kKTile; ++k) {
          bool high;
          const int64_t at = s120::CodeOffset(s, r, k, &high);
          ASSERT_LT(at, s.CodeBytes());
          const uint8_t bit = high ? 2 : 1;
          ASSERT_EQ(nibbles[static_cast<size_t>(at)] & bit, 0) << r << ", " << k;
          nibbles[static_cast<size_t>(at)] |= bit;
          if (k % kMxBlock == 0) ++scales.at(static_cast<size_t>(s120::ScaleOffset(s, r, k)));
        }
      for (uint8_t v : nibbles) ASSERT_EQ(v, 3) << rows << " x " << cols;
      for (int v : scales) ASSERT_EQ(v, 1) << rows << " x " << cols;
    }
}

// What the kernel loads (LaneCodeOffset + 4 * step, through BWordToFragB; LaneScaleOffset) is, byte
// for byte, the B fragment of the ISA layout (FragBRow / FragBCol, pinned to the ISA text by
// Sm120MmaModel.LayoutFunctionsMatchIsaText) of the logical matrix the offsets describe, and the
// scale bytes are those the selectors read (step s = byte s; column n from lane SfbLane).
TEST(Sm120Layout, KernelLoadsAreTheMmaFragments) {
  const s120::PackedShape s = s120::PackedShape::Of(64, 128);  // one piece
  TestRng rng(11);
  uint8_t logical[64][128];
  uint8_t logical_scale[64][4];
  std::vector<uint8_t> codes(static_cast<size_t>(s.CodeBytes()), 0), scales(static_cast<size_t>(s.ScaleBytes()), 0);
  for (int r = 0; r < 64; ++r) {
    for (int k = 0; k < 128; ++k) {
      logical[r][k] = static_cast<uint8_t>(rng.Next() & 15);
      bool high;
      uint8_t& byte = codes[static_cast<size_t>(s120::CodeOffset(s, r, k, &high))];
      byte |= high ? static_cast<uint8_t>(logical[r][k] << 4) : logical[r][k];
    }
    for (int b = 0; b < 4; ++b) {
      logical_scale[r][b] = static_cast<uint8_t>(rng.Next());
      scales[static_cast<size_t>(s120::ScaleOffset(s, r, 32 * b))] = logical_scale[r][b];
    }
  }
  for (int j = 0; j < s120::kGroupNTiles; ++j)
    for (int lane = 0; lane < 32; ++lane) {
      const int n = 8 * j + s120::FragBCol(lane);  // the packed row this lane's column is
      for (int step = 0; step < s120::kKSteps; ++step) {
        const uint8_t* w = codes.data() + s120::LaneCodeOffset(j, lane) + 4 * step;
        const uint32_t word = w[0] | (w[1] << 8) | (w[2] << 16) | (static_cast<uint32_t>(w[3]) << 24);
        uint32_t reg[2];
        s120::BWordToFragB(word, &reg[0], &reg[1]);
        for (int r = 0; r < 2; ++r)
          for (int byte = 0; byte < 4; ++byte) {
            const int k = 32 * step + s120::FragBRow(lane, r, byte);
            ASSERT_EQ((reg[r] >> (8 * byte)) & 0xFFu, s120::E2m1Container(logical[n][k]))
                << "tile " << j << " lane " << lane << " step " << step << " reg " << r << " byte " << byte;
          }
      }
      // Scale registers: lane loads 8 words at LaneScaleOffset; word j, byte step.
      const uint8_t* sw = scales.data() + s120::LaneScaleOffset(lane) + 4 * j;
      for (int step = 0; step < 4; ++step) {
        // Read by the MMA for column c = lane / 4 when thread-id-b = lane % 4 (SfbLane).
        ASSERT_EQ(s120::SfbLane(s120::SfbColOfLane(lane), lane % 4), lane);
        ASSERT_EQ(sw[step], logical_scale[8 * j + s120::SfbColOfLane(lane)][step]) << "lane " << lane;
      }
    }
  // SfaRowOfLane inverts SfaLane for both selectors; lanes outside the pair get -1.
  for (int tida = 0; tida < 2; ++tida) {
    for (int m = 0; m < 16; ++m) EXPECT_EQ(s120::SfaRowOfLane(s120::SfaLane(m, tida), tida), m);
    for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(s120::SfaRowOfLane(lane, tida) >= 0, (lane % 4) / 2 == tida);
  }
}

// ---- the repack kernel, on any GPU --------------------------------------------------------------
struct HostExpert {
  std::vector<uint8_t> w1, w1s, w3, w3s, w2, w2s;
};

std::vector<uint8_t> RandomBytes(TestRng& rng, size_t n, int lo, int hi) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(lo + static_cast<int>(rng.Next() % static_cast<uint64_t>(hi - lo + 1)));
  return v;
}

TEST(Sm120Layout, RepackKernelMatchesTheCheckpoint) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "needs a GPU";
  // K = 96 and I = 160 leave partial k-tiles (padded to 128) in both matrices.
  const int64_t k_dim = 96, inter = 160, experts = 3;
  const s120::PackedShape w13 = s120::PackedShape::Of(2 * inter, k_dim), w2 = s120::PackedShape::Of(k_dim, inter);
  TestRng rng(21);
  std::vector<HostExpert> host(experts);
  for (HostExpert& e : host) {
    e.w1 = RandomBytes(rng, inter * k_dim / 2, 0, 255);
    e.w3 = RandomBytes(rng, inter * k_dim / 2, 0, 255);
    e.w2 = RandomBytes(rng, k_dim * inter / 2, 0, 255);
    e.w1s = RandomBytes(rng, inter * k_dim / kMxBlock, 100, 140);
    e.w3s = RandomBytes(rng, inter * k_dim / kMxBlock, 100, 140);
    e.w2s = RandomBytes(rng, k_dim * inter / kMxBlock, 100, 140);
  }
  host[1].w3s[5] = kUe8m0Nan;  // stays NaN: the MMA applies it
  host[2].w2s[7] = kUe8m0Nan;

  // Stage the tensors as CudaMoe does, repack experts 1.. into slots 1.. (slot 0 is left alone).
  std::vector<std::unique_ptr<DeviceMem>> keep;
  auto upload = [&](const std::vector<uint8_t>& v) {
    keep.push_back(std::make_unique<DeviceMem>(v.size()));
    cudaMemcpy(keep.back()->ptr, v.data(), v.size(), cudaMemcpyHostToDevice);
    return keep.back()->As<uint8_t>();
  };
  std::vector<cuda::ExpertSource> sources;
  for (int64_t e = 1; e < experts; ++e) {
    const HostExpert& h = host[e];
    sources.push_back({upload(h.w1), upload(h.w1s), upload(h.w3), upload(h.w3s), upload(h.w2), upload(h.w2s)});
  }
  DeviceMem dev_sources(sources.size() * sizeof(cuda::ExpertSource));
  MXMOE_CUDA_OK(cudaMemcpy(dev_sources.ptr, sources.data(), dev_sources.bytes, cudaMemcpyHostToDevice));
  DeviceMem c13(experts * w13.CodeBytes()), s13(experts * w13.ScaleBytes()), c2(experts * w2.CodeBytes()),
      s2(experts * w2.ScaleBytes());
  for (DeviceMem* m : {&c13, &s13, &c2, &s2}) MXMOE_CUDA_OK(cudaMemset(m->ptr, 0xEE, m->bytes));
  MXMOE_CUDA_OK(s120::LaunchRepackExperts(dev_sources.As<cuda::ExpertSource>(), static_cast<int>(sources.size()), 1,
                                          k_dim, inter, w13, w2, c13.As<uint8_t>(), s13.As<uint8_t>(),
                                          c2.As<uint8_t>(), s2.As<uint8_t>(), nullptr));
  MXMOE_CUDA_OK(cudaDeviceSynchronize());
  auto fetch = [](const DeviceMem& m) {
    std::vector<uint8_t> v(m.bytes);
    cudaMemcpy(v.data(), m.ptr, m.bytes, cudaMemcpyDeviceToHost);
    return v;
  };
  const auto hc13 = fetch(c13), hs13 = fetch(s13), hc2 = fetch(c2), hs2 = fetch(s2);

  auto want = [](const std::vector<uint8_t>& packed, const std::vector<uint8_t>& sc, int64_t row, int64_t cols,
                 int64_t k) {
    return e2m1_to_float(e2m1_unpack(packed.data() + row * (cols / 2), k)) *
           ue8m0_to_float(sc[static_cast<size_t>(row * (cols / kMxBlock) + k / kMxBlock)]);
  };
  auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : a == b; };
  for (int64_t e = 1; e < experts; ++e) {
    const uint8_t* codes13 = hc13.data() + e * w13.CodeBytes();
    const uint8_t* scales13 = hs13.data() + e * w13.ScaleBytes();
    for (int64_t i = 0; i < inter; ++i)
      for (int64_t k = 0; k < k_dim; ++k) {
        const float g = s120::PackedElement(codes13, scales13, w13, s120::Fc1PackedRow(i, false), k);
        const float u = s120::PackedElement(codes13, scales13, w13, s120::Fc1PackedRow(i, true), k);
        ASSERT_TRUE(same(g, want(host[e].w1, host[e].w1s, i, k_dim, k))) << "expert " << e << " gate " << i << ", " << k;
        ASSERT_TRUE(same(u, want(host[e].w3, host[e].w3s, i, k_dim, k))) << "expert " << e << " up " << i << ", " << k;
      }
    const uint8_t* codes2 = hc2.data() + e * w2.CodeBytes();
    const uint8_t* scales2 = hs2.data() + e * w2.ScaleBytes();
    for (int64_t n = 0; n < w2.groups * s120::kGroupRows; ++n)
      for (int64_t i = 0; i < w2.k_tiles * s120::kKTile; ++i) {
        const float got = s120::PackedElement(codes2, scales2, w2, n, i);
        if (n < k_dim && i < inter) {
          ASSERT_TRUE(same(got, want(host[e].w2, host[e].w2s, n, inter, i))) << "expert " << e << " W2 " << n << ", " << i;
        } else {  // padding: zero codes under a finite scale, so the MMA adds exact zeros
          bool high;
          const uint8_t byte = codes2[s120::CodeOffset(w2, n, i, &high)];
          ASSERT_EQ(high ? byte >> 4 : byte & 0xF, 0) << "padding " << n << ", " << i;
          ASSERT_EQ(scales2[s120::ScaleOffset(w2, n, i)], s120::kPadScale) << "padding " << n << ", " << i;
        }
      }
  }
  // Slot 0 was not written: the repack touches only its experts' pieces.
  for (int64_t b = 0; b < w13.CodeBytes(); ++b) ASSERT_EQ(hc13[static_cast<size_t>(b)], 0xEE);
}

// ---- the path through CudaMoe -------------------------------------------------------------------
// Sets MXMOE_CUDA_PATH for the scope, restoring what the environment had.
class ScopedCudaPath {
 public:
  explicit ScopedCudaPath(const char* value) {
    const char* old = std::getenv("MXMOE_CUDA_PATH");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) setenv("MXMOE_CUDA_PATH", value, 1);
    else unsetenv("MXMOE_CUDA_PATH");
  }
  ~ScopedCudaPath() {
    if (had_) setenv("MXMOE_CUDA_PATH", old_.c_str(), 1);
    else unsetenv("MXMOE_CUDA_PATH");
  }

 private:
  bool had_ = false;
  std::string old_;
};

bool Device0Is(int major) {
  for (const CudaDeviceInfo& d : CudaDevices())
    if (d.index == 0 && d.major == major) return true;
  return false;
}

// The SM120 path on this machine: natively on 12.x, in emulation on 9.x (or skipped).
std::unique_ptr<CudaMoe> MakeSm120Moe(const ExpertSet& set, std::string* skip) {
  if (!Device0Is(12) && !(Device0Is(9) && s120::EmulationBuilt())) {
    *skip = "needs an SM120 GPU, or an SM90 GPU and the MXMOE_SM120_EMULATION build";
    return nullptr;
  }
  ScopedCudaPath path("sm120");
  std::unique_ptr<CudaMoe> moe;
  const Status st = CudaMoe::Create(set, 0, &moe);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (moe) EXPECT_EQ(std::string(moe->Kernels()), Device0Is(12) ? "sm120" : "sm120-emulated");
  return moe;
}

TEST(Sm120Path, EnvironmentChoosesTheKernels) {
  if (!Device0Is(9)) GTEST_SKIP() << "needs an SM90 GPU as device 0";
  const LayerShape s{4, 64, 32, 2};
  const ExpertSet set = SyntheticSet(s, Act(ActivationType::Situ), 5);
  std::unique_ptr<CudaMoe> moe;
  {
    ScopedCudaPath path("sm90");
    ASSERT_TRUE(CudaMoe::Create(set, 0, &moe).ok());
    EXPECT_STREQ(moe->Kernels(), "sm90");
  }
  {
    ScopedCudaPath path("sm121");
    const Status st = CudaMoe::Create(set, 0, &moe);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("MXMOE_CUDA_PATH=sm121"), std::string::npos) << st.message();
  }
  {
    ScopedCudaPath path("sm120");
    const Status st = CudaMoe::Create(set, 0, &moe);
    if (s120::EmulationBuilt()) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_STREQ(moe->Kernels(), "sm120-emulated");
    } else {
      EXPECT_EQ(st.code(), StatusCode::kUnsupported);
      EXPECT_NE(st.message().find("MXMOE_SM120_EMULATION"), std::string::npos) << st.message();
    }
  }
}

// Every config on small shapes (ragged K and I, one-block I, every kind, every routing pattern)
// against the CPU reference, and the GPU reference of the same (SM120-layout) weights.
TEST(Sm120Path, EveryConfigMatchesReference) {
  const LayerShape shapes[] = {{8, 128, 64, 2}, {6, 96, 160, 3}, {5, 64, 32, 5}};
  const ActivationType kinds[] = {ActivationType::Situ, ActivationType::SwigluBias, ActivationType::GegluTanh};
  const RoutingPattern patterns[] = {RoutingPattern::kUniform, RoutingPattern::kOneExpert, RoutingPattern::kWithInvalid};
  uint64_t seed = 300;
  for (int config = 0; config < s120::kNumGemmConfigs; ++config) {
    s120::ForceGemmConfig(config);
    for (const LayerShape& s : shapes)
      for (ActivationType kind : kinds) {
        ExpertSet set = SyntheticSet(s, Act(kind), ++seed, {}, kind == ActivationType::SwigluBias);
        std::string skip;
        auto moe = MakeSm120Moe(set, &skip);
        if (!skip.empty()) {
          s120::ForceGemmConfig(-1);
          GTEST_SKIP() << skip;
        }
        ASSERT_TRUE(moe);
        for (RoutingPattern pat : patterns)
          for (int64_t t : {1, 7, 40}) {
            SCOPED_TRACE(std::string("config ") + s120::GemmInfo(static_cast<s120::GemmConfigId>(config)).name + " " +
                         ActivationName(kind) + " " + RoutingPatternName(pat) + " T=" + std::to_string(t) +
                         " K=" + std::to_string(s.hidden) + " I=" + std::to_string(s.intermediate));
            SyntheticInput in;
            MakeSyntheticInput(s, t, pat, ++seed, &in);
            DeviceCase dc(*moe, in);
            const std::vector<int64_t> dims{t, s.hidden};
            const auto ref = ReferenceF32(set, InputOf(in));
            EXPECT_TRUE(MoeCloseF32(dc.RunF32(), ref, dims, s.top_k * s.intermediate));
            EXPECT_TRUE(MoeCloseF32(dc.RunF32(/*reference=*/true), ref, dims, s.top_k * s.intermediate));
            EXPECT_TRUE(MoeCloseBf16(dc.RunBf16(), ReferenceBf16(set, InputOf(in)), dims, s.top_k * s.intermediate));
          }
      }
  }
  s120::ForceGemmConfig(-1);
}

}  // namespace
}  // namespace mxmoe::test
