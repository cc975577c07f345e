// Comparison helpers of the CPU and GPU suites (STYLE habit 7): tolerances are defined once, here,
// per format, as abs + rel * |ref|; every failure names the first mismatching coordinates and the
// two values, and how many elements failed. Header-only, needs nothing beyond <gtest/gtest.h>.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace mxmoe::test {

// |got - ref| <= abs + rel * |ref|.
struct Tolerance {
  double abs;
  double rel;
  const char* name;
  double Allowed(double ref) const { return abs + rel * std::fabs(ref); }
};

// fp32 elementary functions (expf, tanhf, erff) against the same formula in double: a few ulp of
// each factor, plus an absolute floor for results that are a cancellation (1 + erf(g) for g << 0).
inline constexpr Tolerance kTolF32Math{1e-6, 1e-5, "f32 math vs double"};
// The device forms of the activations (MUFU.EX2 / MUFU.RCP and a short series, activation_math.h)
// against double: relative only, the bound the series and the closed form of tanh are derived to
// (~2^-19 each) with room for the sigmoid and the products; the absolute floor only for results the
// device flushes to 0 (sigmoid of x < -87).
inline constexpr Tolerance kTolDeviceActivation{1e-30, 1e-5, "device activation vs double"};
// fp32 results made of the same exact products summed in another order (fp32 accumulation on a
// device vs the reference's exact double sums): error ~ n * 2^-24 * sum |terms|, not * |ref|, hence
// the absolute part (outputs of the synthetic layers are of order 1).
inline constexpr Tolerance kTolF32{1e-4, 1e-4, "f32"};
// One bf16 rounding on each side (half an ulp, 2^-9 relative, each) on top of kTolF32.
inline constexpr Tolerance kTolBF16{1e-4, 1.0 / 256, "bf16"};
// One E4M3 step: 2^-3 relative for normal values; 2^-9 absolute (the subnormal step, at scale 1).
inline constexpr Tolerance kTolE4M3{1.0 / 512, 1.0 / 8, "e4m3"};
// One E2M1 step: 0.5 absolute at scale 1 (grid 0.5 below 2), 1/3 relative above (the 4 -> 6 gap).
inline constexpr Tolerance kTolE2M1{0.5, 1.0 / 3, "e2m1"};

enum class NanMatch {
  kBits,    // NaNs must have the same bits too (same code, same machine)
  kAnyNan,  // a NaN matches any NaN (device and host NaN payloads differ)
};

namespace detail {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float Bf16ToF32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// "[3, 17]" for flat index 3*cols+17 of dims {rows, cols}; "[flat]" without dims.
inline std::string Coords(size_t flat, const std::vector<int64_t>& dims) {
  if (dims.empty()) return "[" + std::to_string(flat) + "]";
  std::vector<int64_t> idx(dims.size());
  size_t rest = flat;
  for (size_t d = dims.size(); d-- > 0;) {
    const size_t extent = dims[d] > 0 ? static_cast<size_t>(dims[d]) : 1;
    idx[d] = static_cast<int64_t>(rest % extent);
    rest /= extent;
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

inline std::string Value(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", static_cast<double>(f), Bits(f));
  return buf;
}
inline std::string ValueBf16(uint16_t h) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g (0x%04x)", static_cast<double>(Bf16ToF32(h)), h);
  return buf;
}

inline ::testing::AssertionResult CheckSize(size_t got, size_t ref) {
  if (got == ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "sizes differ: got " << got << " elements, ref " << ref;
}

// Whether got matches ref within tol; NaN only matches NaN, an infinity only itself.
inline bool Close(double got, double ref, const Tolerance& tol) {
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got);
  if (std::isinf(ref) || std::isinf(got)) return got == ref;
  return std::fabs(got - ref) <= tol.Allowed(ref);
}

template <class T, class ToDouble, class Show>
::testing::AssertionResult AllCloseImpl(const T* got, const T* ref, size_t n, const Tolerance& tol,
                                        const std::vector<int64_t>& dims, ToDouble to_double,
                                        Show show) {
  size_t bad = 0, first = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = to_double(got[i]), r = to_double(ref[i]);
    if (Close(g, r, tol)) continue;
    if (bad++ == 0) first = i;
    const double excess = (std::isfinite(g) && std::isfinite(r)) ? std::fabs(g - r) / tol.Allowed(r)
                                                                   : HUGE_VAL;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  auto describe = [&](size_t i) {
    const double g = to_double(got[i]), r = to_double(ref[i]);
    return Coords(i, dims) + ": got " + show(got[i]) + ", ref " + show(ref[i]) + ", |diff| " +
           std::to_string(std::fabs(g - r)) + " > allowed " + std::to_string(tol.Allowed(r));
  };
  auto f = ::testing::AssertionFailure();
  f << bad << " of " << n << " elements outside tolerance '" << tol.name << "' (" << tol.abs
    << " + " << tol.rel << "*|ref|); first at " << describe(first);
  if (worst != first) f << "; largest at " << describe(worst);
  return f;
}

template <class T, class Same, class Show>
::testing::AssertionResult EqualImpl(const T* got, const T* ref, size_t n,
                                     const std::vector<int64_t>& dims, Same same, Show show) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (same(got[i], ref[i])) continue;
    if (bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements differ bitwise; first at "
                                       << Coords(first, dims) << ": got " << show(got[first])
                                       << ", ref " << show(ref[first]);
}

}  // namespace detail

// ---- tolerance comparisons ------------------------------------------------------------------

inline ::testing::AssertionResult AllClose(const float* got, const float* ref, size_t n,
                                           const Tolerance& tol,
                                           const std::vector<int64_t>& dims = {}) {
  return detail::AllCloseImpl(
      got, ref, n, tol, dims, [](float v) { return static_cast<double>(v); }, detail::Value);
}
inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<float>& ref, const Tolerance& tol,
                                           const std::vector<int64_t>& dims = {}) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  return AllClose(got.data(), ref.data(), got.size(), tol, dims);
}
// got against an fp64 reference (e.g. a formula evaluated in double).
inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<double>& ref, const Tolerance& tol,
                                           const std::vector<int64_t>& dims = {}) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  const std::vector<double> gd(got.begin(), got.end());
  return detail::AllCloseImpl(
      gd.data(), ref.data(), ref.size(), tol, dims, [](double v) { return v; },
      [](double v) {
        char buf[40];
        std::snprintf(buf, sizeof(buf), "%.17g", v);
        return std::string(buf);
      });
}
// bf16 bit patterns, compared as values.
inline ::testing::AssertionResult AllCloseBf16(const uint16_t* got, const uint16_t* ref, size_t n,
                                               const Tolerance& tol,
                                               const std::vector<int64_t>& dims = {}) {
  return detail::AllCloseImpl(
      got, ref, n, tol, dims, [](uint16_t h) { return static_cast<double>(detail::Bf16ToF32(h)); },
      detail::ValueBf16);
}
inline ::testing::AssertionResult AllCloseBf16(const std::vector<uint16_t>& got,
                                               const std::vector<uint16_t>& ref,
                                               const Tolerance& tol,
                                               const std::vector<int64_t>& dims = {}) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  return AllCloseBf16(got.data(), ref.data(), got.size(), tol, dims);
}

// ||got - ref||_2 / ||ref||_2 in double (0 when both are zero). For results that agree up to a
// different fp32 summation order where single elements may cancel (partial sums across ranks).
inline double NormwiseRelativeError(const float* got, const float* ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : HUGE_VAL;
  return std::sqrt(num / den);
}
inline ::testing::AssertionResult NormwiseClose(const std::vector<float>& got,
                                                const std::vector<float>& ref, double max_rel,
                                                const std::vector<int64_t>& dims = {}) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  const double err = NormwiseRelativeError(got.data(), ref.data(), got.size());
  if (err <= max_rel) return ::testing::AssertionSuccess() << "normwise relative error " << err;
  size_t worst = 0;
  double worst_diff = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (!(d <= worst_diff)) worst_diff = d, worst = i;  // NaN counts as worst
  }
  return ::testing::AssertionFailure()
         << "normwise relative error " << err << " > " << max_rel << "; largest |diff| at "
         << detail::Coords(worst, dims) << ": got " << detail::Value(got[worst]) << ", ref "
         << detail::Value(ref[worst]);
}

// ---- exact comparisons ----------------------------------------------------------------------

inline ::testing::AssertionResult BitwiseEqual(const float* got, const float* ref, size_t n,
                                               const std::vector<int64_t>& dims = {},
                                               NanMatch nan = NanMatch::kBits) {
  return detail::EqualImpl(
      got, ref, n, dims,
      [nan](float g, float r) {
        if (nan == NanMatch::kAnyNan && std::isnan(g) && std::isnan(r)) return true;
        return detail::Bits(g) == detail::Bits(r);
      },
      detail::Value);
}
inline ::testing::AssertionResult BitwiseEqual(const std::vector<float>& got,
                                               const std::vector<float>& ref,
                                               const std::vector<int64_t>& dims = {},
                                               NanMatch nan = NanMatch::kBits) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  return BitwiseEqual(got.data(), ref.data(), got.size(), dims, nan);
}
// bf16 bit patterns.
inline ::testing::AssertionResult BitwiseEqualBf16(const std::vector<uint16_t>& got,
                                                   const std::vector<uint16_t>& ref,
                                                   const std::vector<int64_t>& dims = {},
                                                   NanMatch nan = NanMatch::kBits) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  auto is_nan = [](uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; };
  return detail::EqualImpl(
      got.data(), ref.data(), got.size(), dims,
      [&](uint16_t g, uint16_t r) {
        return g == r || (nan == NanMatch::kAnyNan && is_nan(g) && is_nan(r));
      },
      detail::ValueBf16);
}
// Raw bytes (E4M3 codes, packed E2M1, UE8M0 scales).
inline ::testing::AssertionResult BytesEqual(const std::vector<uint8_t>& got,
                                             const std::vector<uint8_t>& ref,
                                             const std::vector<int64_t>& dims = {}) {
  if (auto s = detail::CheckSize(got.size(), ref.size()); !s) return s;
  return detail::EqualImpl(
      got.data(), ref.data(), got.size(), dims, [](uint8_t g, uint8_t r) { return g == r; },
      [](uint8_t b) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "0x%02x", b);
        return std::string(buf);
      });
}

// ---- poisoning (STYLE habit 8) ----------------------------------------------------------------
// Outputs are filled with 0xFF bytes before a run: as fp32 that is the NaN 0xFFFFFFFF and as bf16
// the NaN 0xFFFF, patterns no arithmetic here produces (x86 makes 0xFFC00000, CUDA 0x7FFFFFFF, and
// the NaNs the formats decode to are 0x7FC00000 with a sign), so a surviving pattern is an element
// nobody wrote, and a legitimately NaN output still counts as written.
inline constexpr uint32_t kPoisonF32Bits = 0xFFFFFFFFu;
inline constexpr uint16_t kPoisonBF16Bits = 0xFFFFu;

template <class T>
void Poison(std::vector<T>* v) {
  std::memset(v->data(), 0xFF, v->size() * sizeof(T));
}

inline ::testing::AssertionResult AllWritten(const std::vector<float>& v,
                                             const std::vector<int64_t>& dims = {}) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (detail::Bits(v[i]) == kPoisonF32Bits && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << v.size()
                                       << " fp32 elements never written; first at "
                                       << detail::Coords(first, dims);
}
inline ::testing::AssertionResult AllWritten(const std::vector<uint16_t>& v,
                                             const std::vector<int64_t>& dims = {}) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == kPoisonBF16Bits && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << v.size()
                                       << " bf16 elements never written; first at "
                                       << detail::Coords(first, dims);
}
// Every byte still 0xFF: nothing was written.
inline ::testing::AssertionResult Untouched(const void* p, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i)
    if (b[i] != 0xFF)
      return ::testing::AssertionFailure() << "byte " << i << " of " << bytes
                                           << " was written (0x" << std::hex
                                           << static_cast<int>(b[i]) << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace mxmoe::test
