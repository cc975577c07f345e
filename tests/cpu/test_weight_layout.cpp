// The CUDA kernels' private MXFP4 weight layout (src/cuda/weight_layout.h), which is
// host-compilable: the packed word's code positions and the kernels' fast decode, the tile order
// and the stored scale exponents. Runs in the CPU suite, so CI checks it without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/compare.h"
#include "common/random.h"
#include "cuda/weight_layout.h"
#include "mxmoe/formats.h"

namespace mxmoe::test {
namespace {

// Every code in every slot of a word (the sixteen words of one code repeated) and then random
// words: CodeAt inverts EncodeWord, and DecodeWord gives every code's E2M1 value times 2^-126 bit
// for bit (signed zeros too).
TEST(CudaLayout, WordEncodeDecodeRoundTrip) {
  TestRng rng(7);
  for (int it = 0; it < 20000; ++it) {
    uint8_t codes[8];
    for (uint8_t& c : codes) c = static_cast<uint8_t>(it < 16 ? it : rng.Next() & 15);
    const uint32_t w = cuda::EncodeWord(codes);
    uint32_t r[4];
    cuda::DecodeWord(w, r);
    for (int reg = 0; reg < 4; ++reg)
      for (int hi = 0; hi < 2; ++hi) {
        const uint8_t code = codes[2 * reg + hi];
        ASSERT_EQ(cuda::CodeAt(w, reg, hi), code);
        const float got = bf16_to_float(static_cast<uint16_t>(hi ? r[reg] >> 16 : r[reg] & 0xFFFFu));
        const float want = e2m1_to_float(code) * std::ldexp(1.0f, -126);
        ASSERT_EQ(detail::Bits(got), detail::Bits(want)) << "reg " << reg << " hi " << hi << " code " << int(code);
      }
  }
}

// The eight codes of a word use each of its 32 bits exactly once.
TEST(CudaLayout, CodeBitsCoverTheWordOnce) {
  uint64_t seen = 0;
  for (int reg = 0; reg < 4; ++reg)
    for (int hi = 0; hi < 2; ++hi) {
      int pos[4];
      cuda::CodeBitPositions(reg, hi, pos);
      for (int p : pos) {
        ASSERT_GE(p, 0);
        ASSERT_LT(p, 32);
        ASSERT_EQ((seen >> p) & 1u, 0u) << "bit " << p << " twice (reg " << reg << " hi " << hi << ")";
        seen |= uint64_t{1} << p;
      }
    }
  EXPECT_EQ(seen, 0xFFFFFFFFull);
}

TEST(CudaLayout, TileIndexIsABijection) {
  for (int64_t rows : {64, 192, 256, 320, 3584, 6144})
    for (int64_t cols : {32, 64, 96, 2880}) {
      const cuda::PackedShape s = cuda::PackedShape::Of(rows, cols);
      std::vector<int> seen(static_cast<size_t>(s.Tiles()), 0);
      for (int64_t rg = 0; rg < s.row_groups; ++rg)
        for (int64_t kt = 0; kt < s.col_tiles; ++kt) ++seen.at(static_cast<size_t>(s.TileIndex(rg, kt)));
      for (int v : seen) ASSERT_EQ(v, 1) << rows << " x " << cols;
    }
}

TEST(CudaLayout, StoredScaleIsExactForRealisticScales) {
  for (int b = 0; b <= 128; ++b)
    EXPECT_EQ(cuda::StoredScaleValue(cuda::StoredScale(static_cast<uint8_t>(b), 0), 0),
              ue8m0_to_float(static_cast<uint8_t>(b)));
  for (int b = 100; b < 255; ++b) {  // a layer with scales up to 2^127 shifts its exponents down
    const int shift = cuda::ScaleShiftFor(254);
    EXPECT_EQ(cuda::StoredScaleValue(cuda::StoredScale(static_cast<uint8_t>(b), shift), shift),
              ue8m0_to_float(static_cast<uint8_t>(b)));
  }
  EXPECT_TRUE(std::isnan(cuda::StoredScaleValue(cuda::StoredScale(kUe8m0Nan, 0), 0)));
}

}  // namespace
}  // namespace mxmoe::test
