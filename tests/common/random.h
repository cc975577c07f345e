// Seeded test data (STYLE habit 8): a small generator with the same stream on every platform
// (std::normal_distribution is not), and helpers for random inputs of realistic scale.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "mxmoe/formats.h"

namespace mxmoe::test {

// splitmix64 with Box-Muller normals.
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : state_(seed * 0x2545F4914F6CDD1Dull + 0x9E3779B97F4A7C15ull) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t Bits32() { return static_cast<uint32_t>(Next() >> 32); }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  int64_t Below(int64_t n) { return static_cast<int64_t>(Uniform() * static_cast<double>(n)); }
  double Normal() {
    const double u1 = Uniform() + 1e-300, u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// n values N(0, sigma^2) as fp32.
inline std::vector<float> RandomNormal(TestRng& rng, size_t n, double sigma = 1.0) {
  std::vector<float> v(n);
  for (float& f : v) f = static_cast<float>(sigma * rng.Normal());
  return v;
}

// n values N(0, sigma^2) rounded to bf16 bits.
inline std::vector<uint16_t> RandomBf16(TestRng& rng, size_t n, double sigma = 1.0) {
  std::vector<uint16_t> v(n);
  for (uint16_t& h : v) h = float_to_bf16(static_cast<float>(sigma * rng.Normal()));
  return v;
}

}  // namespace mxmoe::test
