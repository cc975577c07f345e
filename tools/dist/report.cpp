#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace mxmoe::dist {

uint64_t Fnv1a64(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

SumCheck CheckSum(const float* got, const float* ref, int64_t count, double tolerance) {
  SumCheck c;
  c.count = count;
  c.tolerance = tolerance;
  c.bitwise = count == 0 || std::memcmp(got, ref, static_cast<size_t>(count) * sizeof(float)) == 0;
  double sq = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < count; ++i)
    if (std::isfinite(ref[i])) sq += static_cast<double>(ref[i]) * ref[i], ++finite;
  c.rms_ref = finite ? std::sqrt(sq / static_cast<double>(finite)) : 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const bool gf = std::isfinite(got[i]), rf = std::isfinite(ref[i]);
    double rel;
    if (gf != rf) {
      ++c.finite_mismatch;
      rel = HUGE_VAL;
    } else if (!rf) {
      continue;  // NaN or Inf on both sides: the same token's input or weights
    } else {
      const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
      const double denom = std::max(std::fabs(static_cast<double>(ref[i])), c.rms_ref);
      rel = denom > 0 ? diff / denom : (diff > 0 ? HUGE_VAL : 0.0);
    }
    if (rel > tolerance) ++c.over;
    if (rel > c.max_rel) {  // the first of equal maxima
      c.max_rel = rel;
      c.worst = i;
      c.worst_got = got[i];
      c.worst_ref = ref[i];
    }
  }
  return c;
}

std::string DescribeSumCheck(const SumCheck& c, int64_t width) {
  if (c.bitwise) return "bitwise equal";
  char buf[400];
  const long long t = width > 0 && c.worst >= 0 ? c.worst / width : -1;
  const long long n = width > 0 && c.worst >= 0 ? c.worst % width : -1;
  std::snprintf(buf, sizeof(buf),
                "max rel err %.3g at [t %lld, n %lld] (sum %.9g, unsplit %.9g); RMS(unsplit) %.4g; "
                "%lld of %lld elements above %.3g%s",
                c.max_rel, t, n, static_cast<double>(c.worst_got), static_cast<double>(c.worst_ref), c.rms_ref,
                static_cast<long long>(c.over), static_cast<long long>(c.count), c.tolerance,
                c.finite_mismatch ? " (NaN/Inf where the other side is finite)" : "");
  return buf;
}

}  // namespace mxmoe::dist
