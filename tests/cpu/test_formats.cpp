// OCP MX v1.0 element and scale encodings and the MX block quantizers (SPEC section 2), checked
// against tables and rules computed independently here (in double, from the definitions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/compare.h"
#include "common/random.h"
#include "mxmoe/formats.h"

namespace mxmoe {
namespace {

using test::TestRng;

// ---- independent definitions ------------------------------------------------------------------

// E4M3 (e4m3fn) from its fields: bias 7, subnormals man * 2^-9, S.1111.111 NaN.
double E4m3Value(uint8_t c) {
  const int sign = (c & 0x80) ? -1 : 1;
  const int exp = (c >> 3) & 0xF, man = c & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(man, -9) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign * mag;
}

double E2m1Value(uint8_t c) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -kMag[c & 7] : kMag[c & 7];
}

// The scale rule of SPEC section 2 by brute force: the smallest s in [-127, 127] with
// amax <= elem_max * 2^s in exact (double) arithmetic; 127 when none is.
int BruteScale(double amax, double elem_max) {
  for (int s = -127; s <= 127; ++s)
    if (amax <= std::ldexp(elem_max, s)) return s;
  return 127;
}

// The OCP MX v1.0 rule the project does NOT use: floor(log2(amax)) - emax_elem (8 for E4M3).
int OcpScale(double amax) { return static_cast<int>(std::floor(std::log2(amax))) - 8; }

float Bits(uint32_t u) { return bits_float(u); }

bool IsBf16Nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; }

// bf16 RNE from the definition: the two neighbours by truncation, the nearer in double, the even
// one on a tie. Finite, non-NaN inputs only.
uint16_t Bf16Rne(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // toward zero
  const uint16_t hi = static_cast<uint16_t>(lo + 1);   // away from zero (may become inf)
  // Magnitudes in double; past the largest bf16 the next value is 2^128 (IEEE rounds as if the
  // exponent were unbounded, then overflows to infinity).
  auto mag = [](uint16_t h) {
    return (h & 0x7F80) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(bf16_to_float(h)));
  };
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = x - mag(lo);
  const double dhi = mag(hi) - x;
  if ((u & 0xFFFF) == 0) return lo;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

// ---- E2M1 ---------------------------------------------------------------------------------------

TEST(FormatsE2M1, DecodeTableAndRoundTripOfAll16Codes) {
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), E2m1Value(static_cast<uint8_t>(c))) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 8) << "code " << c << " (0x8 is -0)";
    EXPECT_EQ(float_to_e2m1(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1(0.0f), 0x0);
}

TEST(FormatsE2M1, TiesToEvenAtEveryMidpoint) {
  // Midpoints between adjacent magnitudes of the decoded table; the even code (mantissa bit 0)
  // wins a tie, and one fp32 ulp either side decides for the nearer neighbour.
  for (int c = 0; c < 7; ++c) {
    const double lo = E2m1Value(static_cast<uint8_t>(c)), hi = E2m1Value(static_cast<uint8_t>(c + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: one more bit
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    for (int sign : {0, 8}) {
      const float m = sign ? -mid : mid;
      EXPECT_EQ(float_to_e2m1(m), even | sign) << "midpoint " << m;
      EXPECT_EQ(float_to_e2m1(std::nextafter(m, 0.0f)), c | sign) << "below midpoint " << m;
      EXPECT_EQ(float_to_e2m1(std::nextafter(m, sign ? -100.0f : 100.0f)), (c + 1) | sign)
          << "above midpoint " << m;
    }
  }
  // The arithmetic spelled out: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
  // 5 -> 4.
  EXPECT_EQ(float_to_e2m1(0.25f), 0x0);
  EXPECT_EQ(float_to_e2m1(0.75f), 0x2);
  EXPECT_EQ(float_to_e2m1(1.25f), 0x2);
  EXPECT_EQ(float_to_e2m1(1.75f), 0x4);
  EXPECT_EQ(float_to_e2m1(2.5f), 0x4);
  EXPECT_EQ(float_to_e2m1(3.5f), 0x6);
  EXPECT_EQ(float_to_e2m1(5.0f), 0x6);
  EXPECT_EQ(float_to_e2m1(-5.0f), 0xE);
}

TEST(FormatsE2M1, NearestForRandomValues) {
  TestRng rng(11);
  for (int n = 0; n < 20000; ++n) {
    const float v = static_cast<float>(rng.Uniform(-7.0, 7.0));
    const uint8_t c = float_to_e2m1(v);
    const double err = std::fabs(E2m1Value(c) - v);
    for (int o = 0; o < 16; ++o)
      ASSERT_LE(err, std::fabs(E2m1Value(static_cast<uint8_t>(o)) - v)) << "value " << v << " code " << int(c);
  }
}

TEST(FormatsE2M1, SaturatesToSix) {
  for (float v : {6.0f, 6.5f, 7.0f, 100.0f, 1e30f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(float_to_e2m1(v), 0x7) << v;
    EXPECT_EQ(float_to_e2m1(-v), 0xF) << -v;
  }
  EXPECT_EQ(float_to_e2m1(std::nextafter(5.0f, 0.0f)), 0x6);
  EXPECT_EQ(float_to_e2m1(std::nextafter(5.0f, 6.0f)), 0x7);
}

TEST(FormatsE2M1, NanHasNoCodeAndMapsToPlusZero) {
  // E2M1 has no NaN (formats.h: NaN -> +0; a block with NaN is marked by its NaN scale).
  EXPECT_EQ(float_to_e2m1(NAN), 0x0);
  EXPECT_EQ(float_to_e2m1(-NAN), 0x0);
}

TEST(FormatsE2M1, UnpackLowNibbleFirst) {
  const uint8_t packed[3] = {0x21, 0x43, 0xF8};
  const uint8_t want[6] = {0x1, 0x2, 0x3, 0x4, 0x8, 0xF};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(e2m1_unpack(packed, i), want[i]) << "element " << i;
}

// ---- E4M3 ---------------------------------------------------------------------------------------

TEST(FormatsE4M3, DecodeAll256CodesAgainstTheFieldDefinition) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    const double want = E4m3Value(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      EXPECT_TRUE(c == 0x7F || c == 0xFF) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(v), want) << "code " << c;
      EXPECT_EQ(std::signbit(v), c >= 0x80) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
}

TEST(FormatsE4M3, EveryCodeRoundTripsAndNanCodesMapToNan) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(v)) {
      ++nans;
      // NaN encodes as 0x7F with the NaN's sign.
      EXPECT_EQ(float_to_e4m3(v), c) << "code " << c;
      continue;
    }
    EXPECT_EQ(float_to_e4m3(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_EQ(float_to_e4m3(-NAN), 0xFF);
  EXPECT_EQ(float_to_e4m3(Bits(0x7F800001u)), 0x7F);  // signalling NaN, not saturated to 448
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
}

// Sorted non-negative representable E4M3 values with their codes, from the decoded table.
std::vector<std::pair<double, int>> E4m3PositiveGrid() {
  std::vector<std::pair<double, int>> g;
  for (int c = 0; c < 0x7F; ++c) g.emplace_back(E4m3Value(static_cast<uint8_t>(c)), c);
  std::sort(g.begin(), g.end());
  return g;
}

TEST(FormatsE4M3, TiesToEvenAtEveryMidpoint) {
  const auto grid = E4m3PositiveGrid();
  ASSERT_EQ(grid.size(), 127u);
  for (size_t i = 0; i + 1 < grid.size(); ++i) {
    const auto [lo, clo] = grid[i];
    const auto [hi, chi] = grid[i + 1];
    ASSERT_EQ(chi, clo + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (clo % 2 == 0) ? clo : chi;
    for (int sign : {0, 0x80}) {
      const float m = sign ? -mid : mid;
      EXPECT_EQ(float_to_e4m3(m), even | sign) << "midpoint " << m << " of " << lo << ", " << hi;
      EXPECT_EQ(float_to_e4m3(std::nextafter(m, 0.0f)), clo | sign) << "just below " << m;
      EXPECT_EQ(float_to_e4m3(std::nextafter(m, sign ? -1e9f : 1e9f)), chi | sign)
          << "just above " << m;
    }
  }
}

TEST(FormatsE4M3, NearestForRandomValues) {
  const auto grid = E4m3PositiveGrid();
  TestRng rng(12);
  for (int n = 0; n < 50000; ++n) {
    // Log-uniform magnitudes over the whole range, subnormals included.
    const float a = static_cast<float>(std::ldexp(1.0, -12) * std::pow(2.0, rng.Uniform(0, 20.8)));
    const uint8_t c = float_to_e4m3(a);
    const double err = std::fabs(E4m3Value(c) - a);
    for (const auto& [v, code] : grid) ASSERT_LE(err, std::fabs(v - a)) << "value " << a << " code " << int(c);
    ASSERT_EQ(float_to_e4m3(-a), c | 0x80) << a;
  }
}

TEST(FormatsE4M3, SaturatesTo448) {
  for (float v : {448.0f, std::nextafter(448.0f, 1e9f), 449.0f, 460.0f, 464.0f, 480.0f, 512.0f,
                  1e30f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(float_to_e4m3(v), 0x7E) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0xFE) << -v;
  }
  // 432 is the midpoint of 416 (0x7D) and 448 (0x7E): 0x7E is even.
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7D);
}

TEST(FormatsE4M3, SubnormalGrid) {
  const double step = std::ldexp(1.0, -9);
  for (int n = 0; n <= 8; ++n) {
    EXPECT_EQ(float_to_e4m3(static_cast<float>(n * step)), n) << n << " * 2^-9";
    EXPECT_EQ(float_to_e4m3(static_cast<float>(-(n * step))), 0x80 | n) << -n << " * 2^-9";
  }
  // Below half a step: 0. Exactly half a step (2^-10): the tie goes to the even code 0.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 0.0f)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  // 3 * 2^-10 lies between 1 and 2 steps: tie -> 2 (even); 5 * 2^-10 -> 2; 7 * 2^-10 -> 4.
  EXPECT_EQ(float_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);
  EXPECT_EQ(float_to_e4m3(5 * std::ldexp(1.0f, -10)), 0x02);
  EXPECT_EQ(float_to_e4m3(7 * std::ldexp(1.0f, -10)), 0x04);
  // 15 * 2^-10 is the midpoint of 7 * 2^-9 (0x07) and 2^-6 (0x08, the smallest normal).
  EXPECT_EQ(float_to_e4m3(15 * std::ldexp(1.0f, -10)), 0x08);
  // Tiny and fp32-subnormal values flush to a signed zero.
  for (float tiny : {1e-30f, std::ldexp(1.0f, -126), std::ldexp(1.0f, -149)}) {
    EXPECT_EQ(float_to_e4m3(tiny), 0x00) << tiny;
    EXPECT_EQ(float_to_e4m3(-tiny), 0x80) << -tiny;
  }
}

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(FormatsBf16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(f), h << 16);
    const uint16_t back = float_to_bf16(f);
    if (IsBf16Nan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(IsBf16Nan(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << h << " keeps its sign";
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(FormatsBf16, RoundsToNearestEven) {
  // Ties: the low half is exactly 0x8000.
  EXPECT_EQ(float_to_bf16(Bits(0x3F808000u)), 0x3F80);  // 1 + 2^-8: tie, 0x3F80 is even
  EXPECT_EQ(float_to_bf16(Bits(0x3F818000u)), 0x3F82);  // tie, 0x3F81 odd -> up
  EXPECT_EQ(float_to_bf16(Bits(0xBF808000u)), 0xBF80);
  EXPECT_EQ(float_to_bf16(Bits(0xBF818000u)), 0xBF82);
  EXPECT_EQ(float_to_bf16(Bits(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(float_to_bf16(Bits(0x3F807FFFu)), 0x3F80);  // below the tie
  EXPECT_EQ(float_to_bf16(Bits(0x3F80FFFFu)), 0x3F81);
  EXPECT_EQ(float_to_bf16(Bits(0x3FFF8000u)), 0x4000);  // carry into the exponent
  EXPECT_EQ(float_to_bf16(Bits(0x00008000u)), 0x0000);  // subnormal tie to even (zero)
  EXPECT_EQ(float_to_bf16(Bits(0x00018000u)), 0x0002);
  // Overflow: RNE of the largest floats is infinity; infinities stay.
  EXPECT_EQ(float_to_bf16(FLT_MAX), 0x7F80);
  EXPECT_EQ(float_to_bf16(Bits(0x7F7F8000u)), 0x7F80);  // tie, odd -> up to inf
  EXPECT_EQ(float_to_bf16(Bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(FormatsBf16, NanStaysNan) {
  // Payloads only in the low 16 bits must not truncate to infinity.
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u}) {
    const uint16_t h = float_to_bf16(Bits(u));
    EXPECT_TRUE(IsBf16Nan(h)) << std::hex << u << " -> " << h;
    EXPECT_EQ(h & 0x8000, (u >> 16) & 0x8000) << std::hex << u;
  }
}

TEST(FormatsBf16, MatchesTheDefinitionOnRandomBitPatterns) {
  TestRng rng(13);
  for (int n = 0; n < 200000; ++n) {
    uint32_t u = rng.Bits32();
    if (n % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u;  // a quarter of them exact ties
    const float f = Bits(u);
    if (std::isnan(f)) continue;
    if (std::isinf(f)) continue;
    ASSERT_EQ(float_to_bf16(f), Bf16Rne(f)) << std::hex << u;
  }
}

// ---- UE8M0 --------------------------------------------------------------------------------------

TEST(FormatsUe8m0, Decode) {
  EXPECT_EQ(ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_GT(ue8m0_to_float(0), 0.0f);
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(128), 2.0f);
  EXPECT_EQ(ue8m0_to_float(126), 0.5f);
  EXPECT_EQ(ue8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(ue8m0_to_float(255)));
  for (int b = 0; b < 255; ++b)
    EXPECT_EQ(static_cast<double>(ue8m0_to_float(static_cast<uint8_t>(b))), std::ldexp(1.0, b - 127)) << b;
}

// ---- the scale rule -----------------------------------------------------------------------------

// amax values that probe the rule: powers of two, elem_max * 2^s exactly and one or two ulp either
// side, 0, fp32 subnormals, the largest floats, and random values across the exponent range.
std::vector<float> ScaleProbes(double elem_max) {
  std::vector<float> v = {0.0f, std::ldexp(1.0f, -149), std::ldexp(3.0f, -149), std::ldexp(1.0f, -140),
                          std::ldexp(1.0f, -127), std::ldexp(1.0f, -126), FLT_MIN,
                          std::nextafter(FLT_MIN, 0.0f), FLT_MAX, std::nextafter(FLT_MAX, 0.0f),
                          1e38f, 1.0f, 500.0f, 448.0f, 6.0f, 7.0f, 511.0f, 512.0f};
  for (int e = -149; e <= 127; ++e) v.push_back(std::ldexp(1.0f, e));
  for (int s = -150; s <= 130; ++s) {
    const double t = std::ldexp(elem_max, s);
    if (t > FLT_MAX || t < std::ldexp(1.0, -149)) continue;
    const float f = static_cast<float>(t);
    if (static_cast<double>(f) != t) continue;  // deep subnormal: not exact in fp32
    v.push_back(f);
    v.push_back(std::nextafter(f, 0.0f));
    v.push_back(std::nextafter(f, INFINITY));
    v.push_back(static_cast<float>(t * (1.0 + std::ldexp(1.0, -23))));  // 448*2^s*(1+2^-23)
  }
  TestRng rng(14);
  for (int n = 0; n < 5000; ++n) {
    uint32_t u = rng.Bits32() & 0x7FFFFFFFu;
    if ((u >> 23) == 0xFF) u &= 0x7F7FFFFFu;  // finite
    v.push_back(Bits(u));
  }
  std::vector<float> finite;
  for (float f : v)
    if (std::isfinite(f)) finite.push_back(f);
  return finite;
}

TEST(FormatsScale, Mxfp8MatchesBruteForce) {
  for (float amax : ScaleProbes(448.0)) {
    ASSERT_EQ(mxfp8_scale_exponent(amax), BruteScale(amax, 448.0))
        << "amax " << amax << " (0x" << std::hex << float_bits(amax) << ")";
  }
}

TEST(FormatsScale, Mxfp4MatchesBruteForce) {
  for (float amax : ScaleProbes(6.0)) {
    ASSERT_EQ(mxfp4_scale_exponent(amax), BruteScale(amax, 6.0))
        << "amax " << amax << " (0x" << std::hex << float_bits(amax) << ")";
  }
}

TEST(FormatsScale, EdgeValues) {
  EXPECT_EQ(mxfp8_scale_exponent(0.0f), -127);
  EXPECT_EQ(mxfp4_scale_exponent(0.0f), -127);
  EXPECT_EQ(mxfp8_scale_exponent(448.0f), 0);
  EXPECT_EQ(mxfp8_scale_exponent(std::nextafter(448.0f, 1e9f)), 1);
  EXPECT_EQ(mxfp8_scale_exponent(224.0f), -1);
  EXPECT_EQ(mxfp8_scale_exponent(256.0f), 0);
  EXPECT_EQ(mxfp8_scale_exponent(1.0f), -8);    // 448 * 2^-9 = 0.875 < 1 <= 1.75
  EXPECT_EQ(mxfp4_scale_exponent(6.0f), 0);
  EXPECT_EQ(mxfp4_scale_exponent(std::nextafter(6.0f, 1e9f)), 1);
  EXPECT_EQ(mxfp4_scale_exponent(1.0f), -2);    // 6 * 2^-3 = 0.75 < 1 <= 1.5
  // fp32 subnormal amax: the scale clamps at 2^-127.
  EXPECT_EQ(mxfp8_scale_exponent(std::ldexp(1.0f, -149)), -127);
  EXPECT_EQ(mxfp4_scale_exponent(std::ldexp(1.0f, -149)), -127);
  // The largest float needs 2^120 (E4M3) / 2^126 (E2M1): below the clamp.
  EXPECT_EQ(mxfp8_scale_exponent(FLT_MAX), 120);
  EXPECT_EQ(mxfp4_scale_exponent(FLT_MAX), 126);
}

TEST(FormatsScale, ClampsAt127) {
  // amax >= 2^127 * elem_max is out of fp32's range for 448 and 6; the clamp is reached through
  // the general rule with a small element maximum: 0.5 * 2^s >= FLT_MAX needs s = 129.
  EXPECT_EQ(mx_scale_exponent(FLT_MAX, 0.5f, 0), 127);
  EXPECT_EQ(BruteScale(FLT_MAX, 0.5), 127);
  EXPECT_EQ(mx_scale_exponent(std::ldexp(1.0f, 127), 0.5f, 0), 127);  // needs s = 128
  EXPECT_EQ(mx_scale_exponent(std::ldexp(1.0f, 126), 0.5f, 0), 127);  // exactly 0.5 * 2^127
}

TEST(FormatsScale, RoundUpRuleIsNotOcpFloorLog2) {
  // 500: OCP gives floor(log2 500) - 8 = 0 and would saturate 500 to 448; here s = 1 (500 <= 896).
  EXPECT_EQ(OcpScale(500.0), 0);
  EXPECT_EQ(mxfp8_scale_exponent(500.0f), 1);
  // Everything in (448, 512) differs the same way; at 512 both give 1.
  for (float a : {std::nextafter(448.0f, 1e9f), 460.0f, 480.0f, 511.0f, std::nextafter(512.0f, 0.0f)}) {
    EXPECT_EQ(OcpScale(a), 0) << a;
    EXPECT_EQ(mxfp8_scale_exponent(a), 1) << a;
  }
  EXPECT_EQ(mxfp8_scale_exponent(512.0f), OcpScale(512.0));
  // Scaled the same way at other exponents: 500 * 2^-20.
  EXPECT_EQ(mxfp8_scale_exponent(std::ldexp(500.0f, -20)), -19);
  EXPECT_EQ(OcpScale(std::ldexp(500.0, -20)), -20);
}

// ---- block quantizers ---------------------------------------------------------------------------

std::vector<float> Fill32(float v) { return std::vector<float>(32, v); }

TEST(FormatsQuantize, Mxfp8HandComputedBlock) {
  // amax = 3 -> smallest s with 3 <= 448 * 2^s is -7 (448/128 = 3.5; 448/256 = 1.75 < 3), byte 120.
  // Each element is v * 128 rounded to E4M3.
  std::vector<float> v = Fill32(0.25f);  // 32 = 2^5: exp 5+7=12, man 0 -> 0x60
  std::vector<uint8_t> want(32, 0x60);
  v[0] = 3.0f, want[0] = 0x7C;                     // 384 = 1.5 * 2^8: exp 15, man 4
  v[1] = 1.0f, want[1] = 0x70;                     // 128 = 2^7: exp 14, man 0
  v[2] = 0.1f, want[2] = 0x55;                     // 12.8 -> 13 = 1.625 * 2^3: exp 10, man 5
  v[3] = -0.5f, want[3] = 0xE8;                    // -64 = -2^6: sign, exp 13, man 0
  v[4] = std::ldexp(1.0f, -16), want[4] = 0x01;    // 2^-9: subnormal 1
  v[5] = 3 * std::ldexp(1.0f, -17), want[5] = 0x02;  // 3 * 2^-10: tie of 1 and 2 steps -> 2
  v[6] = 1.0625f, want[6] = 0x70;                  // 136: 8.5 * 16 -> tie -> 8 * 16 = 128
  v[7] = 1.09375f, want[7] = 0x71;                 // 140: 8.75 * 16 -> 9 * 16 = 144: man 1
  v[8] = -2.9f, want[8] = 0xFC;                    // -371.2: 11.6 * 32 -> 12 * 32 = 384
  v[9] = 2.0f, want[9] = 0x78;                     // 256 = 2^8: exp 15, man 0
  v[10] = 0.0f, want[10] = 0x00;
  v[11] = -0.0f, want[11] = 0x80;
  v[12] = std::ldexp(1.0f, -18), want[12] = 0x00;  // 2^-11 < half a step -> 0
  std::vector<uint8_t> codes(32, 0xAA);
  EXPECT_EQ(mxfp8_quantize_block(v.data(), codes.data()), 120);
  EXPECT_TRUE(test::BytesEqual(codes, want));
}

TEST(FormatsQuantize, Mxfp8ScaleBoundaries) {
  std::vector<uint8_t> codes(32);
  // amax = 448 exactly: s = 0, byte 127, elements as they are.
  std::vector<float> v = Fill32(1.0f);
  v[5] = 448.0f;
  EXPECT_EQ(mxfp8_quantize_block(v.data(), codes.data()), 127);
  EXPECT_EQ(codes[5], 0x7E);
  EXPECT_EQ(codes[0], 0x38);  // 1.0: exp 7, man 0
  // amax = -449: s = 1, byte 128; 449 / 2 = 224.5 -> 14.03 * 16 -> 224: exp 14, man 6, sign.
  v[5] = -449.0f;
  EXPECT_EQ(mxfp8_quantize_block(v.data(), codes.data()), 128);
  EXPECT_EQ(codes[5], 0xF6);
  EXPECT_EQ(codes[0], 0x30);  // 0.5: exp 6
  // amax = 500: s = 1 (not OCP's 0), 250 -> 15.6 * 16 -> 16 * 16 = 256: exp 15, man 0. No block
  // saturates.
  v[5] = 500.0f;
  EXPECT_EQ(mxfp8_quantize_block(v.data(), codes.data()), 128);
  EXPECT_EQ(codes[5], 0x78);
  // An all-zero block: s = -127, byte 0, codes 0.
  v = Fill32(0.0f);
  EXPECT_EQ(mxfp8_quantize_block(v.data(), codes.data()), 0);
  EXPECT_TRUE(test::BytesEqual(codes, std::vector<uint8_t>(32, 0)));
  // An fp32-subnormal block: s clamps to -127 and 2^-140 / 2^-127 = 2^-13 rounds to 0; 2^-130 is
  // 2^-3 = 0x20 (exp 4).
  v = Fill32(std::ldexp(1.0f, -140));
  v[3] = std::ldexp(1.0f, -130);
  EXPECT_EQ(mxfp8_quantize_block(v.data(), codes.data()), 0);
  EXPECT_EQ(codes[0], 0x00);
  EXPECT_EQ(codes[3], 0x20);
}

TEST(FormatsQuantize, Mxfp8NeverSaturatesAndRoundTripsWithinHalfAStep) {
  TestRng rng(15);
  for (int n = 0; n < 2000; ++n) {
    const double scale = std::ldexp(1.0, static_cast<int>(rng.Below(60)) - 30);
    std::vector<float> v = test::RandomNormal(rng, 32, scale);
    std::vector<uint8_t> codes(32);
    const uint8_t sb = mxfp8_quantize_block(v.data(), codes.data());
    ASSERT_NE(sb, 0xFF);
    float amax = 0;
    for (float f : v) amax = std::max(amax, std::fabs(f));
    ASSERT_EQ(sb, BruteScale(amax, 448.0) + 127);
    const double s = std::ldexp(1.0, sb - 127);
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(codes[i], float_to_e4m3(static_cast<float>(v[i] / s))) << i;
      const double d = E4m3Value(codes[i]) * s;
      // Half an E4M3 step: 2^-4 relative for normal values, 2^-10 * s absolute for subnormals.
      ASSERT_LE(std::fabs(d - v[i]), std::max(std::fabs(static_cast<double>(v[i])) / 16, std::ldexp(s, -10))) << i;
    }
  }
}

TEST(FormatsQuantize, Mxfp4HandComputedBlock) {
  // amax = 3 -> smallest s with 3 <= 6 * 2^s is -1, byte 126; elements are v * 2 rounded to E2M1.
  std::vector<float> v = Fill32(0.5f);  // 1.0 -> code 2
  std::vector<uint8_t> want_codes(32, 0x2);
  v[0] = 3.0f, want_codes[0] = 0x7;     // 6 -> code 7
  v[1] = 1.0f, want_codes[1] = 0x4;     // 2 -> code 4
  v[2] = -0.25f, want_codes[2] = 0x9;   // -0.5 -> sign | 1
  v[3] = 0.375f, want_codes[3] = 0x2;   // 0.75: tie of 0.5 (1) and 1 (2) -> 2
  v[4] = 1.25f, want_codes[4] = 0x4;    // 2.5: tie of 2 (4) and 3 (5) -> 4
  v[5] = 2.5f, want_codes[5] = 0x6;     // 5: tie of 4 (6) and 6 (7) -> 6
  v[6] = -1.75f, want_codes[6] = 0xE;   // -3.5: tie of 3 (5) and 4 (6) -> 6, sign
  v[7] = 0.1f, want_codes[7] = 0x0;     // 0.2 -> 0
  v[8] = -3.0f, want_codes[8] = 0xF;    // -6
  v[9] = 1.4f, want_codes[9] = 0x5;     // 2.8 -> 3 (code 5)
  std::vector<uint8_t> want(16);
  for (int i = 0; i < 16; ++i) want[i] = static_cast<uint8_t>(want_codes[2 * i] | (want_codes[2 * i + 1] << 4));
  EXPECT_EQ(want[0], 0x47);  // element 0 (code 7) in the low nibble, element 1 (code 4) high
  EXPECT_EQ(want[1], 0x29);
  std::vector<uint8_t> packed(16, 0xAA);
  EXPECT_EQ(mxfp4_quantize_block(v.data(), packed.data()), 126);
  EXPECT_TRUE(test::BytesEqual(packed, want));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(e2m1_unpack(packed.data(), i), want_codes[i]) << i;
}

TEST(FormatsQuantize, Mxfp4ScaleBoundaries) {
  std::vector<uint8_t> packed(16);
  // amax = 7: s = 1 (12 >= 7 > 6), byte 128; 7 / 2 = 3.5: tie of 3 and 4 -> 4 (code 6).
  std::vector<float> v = Fill32(1.0f);  // 0.5 -> code 1
  v[0] = 7.0f;
  EXPECT_EQ(mxfp4_quantize_block(v.data(), packed.data()), 128);
  EXPECT_EQ(packed[0], 0x16);
  // amax = 6 exactly: s = 0, byte 127.
  v[0] = -6.0f;
  EXPECT_EQ(mxfp4_quantize_block(v.data(), packed.data()), 127);
  EXPECT_EQ(packed[0], 0x2F);  // -6 -> 0xF low, 1.0 -> 0x2 high
}

TEST(FormatsQuantize, Mxfp4RandomBlocksAgainstBruteForceScale) {
  TestRng rng(16);
  for (int n = 0; n < 2000; ++n) {
    const double scale = std::ldexp(1.0, static_cast<int>(rng.Below(40)) - 20);
    std::vector<float> v = test::RandomNormal(rng, 32, scale);
    std::vector<uint8_t> packed(16);
    const uint8_t sb = mxfp4_quantize_block(v.data(), packed.data());
    float amax = 0;
    for (float f : v) amax = std::max(amax, std::fabs(f));
    ASSERT_EQ(sb, BruteScale(amax, 6.0) + 127);
    const double s = std::ldexp(1.0, sb - 127);
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ(e2m1_unpack(packed.data(), i), float_to_e2m1(static_cast<float>(v[i] / s))) << i;
  }
}

// Non-finite values make their block's scale NaN (0xFF); the other blocks of a row are quantized
// exactly as they would be alone.
TEST(FormatsQuantize, NonFiniteBlockGetsNanScaleOthersUnaffected) {
  TestRng rng(17);
  for (float bad : {NAN, -NAN, INFINITY, -INFINITY}) {
    for (int where : {0, 13, 31}) {
      std::vector<float> row = test::RandomNormal(rng, 96);
      std::vector<float> clean(row);
      row[32 + where] = bad;  // block 1 of 3
      // MXFP8.
      std::vector<uint8_t> codes(96), codes_clean(96);
      uint8_t s[3], s_clean[3];
      for (int b = 0; b < 3; ++b) {
        s[b] = mxfp8_quantize_block(row.data() + 32 * b, codes.data() + 32 * b);
        s_clean[b] = mxfp8_quantize_block(clean.data() + 32 * b, codes_clean.data() + 32 * b);
      }
      EXPECT_EQ(s[1], 0xFF) << bad << " at " << where;
      EXPECT_NE(s_clean[1], 0xFF);
      EXPECT_EQ(s[0], s_clean[0]);
      EXPECT_EQ(s[2], s_clean[2]);
      for (int i : {0, 2})
        for (int j = 0; j < 32; ++j) ASSERT_EQ(codes[32 * i + j], codes_clean[32 * i + j]);
      // Every element of the bad block dequantizes to NaN.
      for (int j = 0; j < 32; ++j)
        EXPECT_TRUE(std::isnan(e4m3_to_float(codes[32 + j]) * ue8m0_to_float(s[1]))) << j;
      // MXFP4.
      std::vector<uint8_t> p(48), p_clean(48);
      for (int b = 0; b < 3; ++b) {
        s[b] = mxfp4_quantize_block(row.data() + 32 * b, p.data() + 16 * b);
        s_clean[b] = mxfp4_quantize_block(clean.data() + 32 * b, p_clean.data() + 16 * b);
      }
      EXPECT_EQ(s[1], 0xFF) << bad << " at " << where;
      EXPECT_EQ(s[0], s_clean[0]);
      EXPECT_EQ(s[2], s_clean[2]);
      for (int j = 0; j < 16; ++j) {
        ASSERT_EQ(p[j], p_clean[j]);
        ASSERT_EQ(p[32 + j], p_clean[32 + j]);
      }
    }
  }
}

TEST(FormatsQuantize, BlockAmaxFlagsNonFinite) {
  std::vector<float> v = Fill32(-2.0f);
  bool finite = false;
  EXPECT_EQ(block_amax(v.data(), 32, &finite), 2.0f);
  EXPECT_TRUE(finite);
  v[7] = FLT_MAX;
  EXPECT_EQ(block_amax(v.data(), 32, &finite), FLT_MAX);
  EXPECT_TRUE(finite);
  v[9] = -INFINITY;
  block_amax(v.data(), 32, &finite);
  EXPECT_FALSE(finite);
}

}  // namespace
}  // namespace mxmoe
