#include "output_summary.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "mxmoe/formats.h"

namespace mxmoe::cli {

namespace {
float Element(const MoeOutput& out, int64_t i) {
  return out.dtype == OutputDType::kF32 ? static_cast<const float*>(out.data)[i]
                                        : bf16_to_float(static_cast<const uint16_t*>(out.data)[i]);
}
}  // namespace

std::string SummarizeOutput(const MoeOutput& out, int64_t count) {
  const size_t bytes = count * OutputDTypeSize(out.dtype);
  uint64_t h = 0xcbf29ce484222325ull;
  const uint8_t* p = static_cast<const uint8_t*>(out.data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  double sum = 0, sq = 0;
  int64_t nan = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = Element(out, i);
    if (std::isnan(v)) {
      ++nan;
      continue;
    }
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  char buf[200];
  std::snprintf(buf, sizeof(buf), "checksum fnv1a64=0x%016llx sum=%.6g rms=%.6g nan=%lld",
                static_cast<unsigned long long>(h), sum, count ? std::sqrt(sq / count) : 0.0,
                static_cast<long long>(nan));
  return buf;
}

std::string CompareToReference(const MoeOutput& out, const MoeOutput& ref_out, int64_t count) {
  const size_t bytes = count * OutputDTypeSize(out.dtype);
  if (bytes == 0 || std::memcmp(out.data, ref_out.data, bytes) == 0) return "bitwise equal";
  double max_err = 0, err2 = 0, ref2 = 0;
  int64_t worst = -1, nan_mismatch = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = Element(out, i), r = Element(ref_out, i);
    if (std::isnan(v) || std::isnan(r)) {
      if (std::isnan(v) != std::isnan(r)) ++nan_mismatch;
      continue;
    }
    const double e = std::fabs(static_cast<double>(v) - r);
    err2 += e * e;
    ref2 += static_cast<double>(r) * r;
    if (e > max_err || worst < 0) {
      max_err = e;
      worst = i;
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "max |err| = %.3g (flat index %lld: got %.6g, want %.6g), rel L2 err = %.3g, NaN mismatches = %lld",
                max_err, static_cast<long long>(worst), worst >= 0 ? Element(out, worst) : 0.0f,
                worst >= 0 ? Element(ref_out, worst) : 0.0f, ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2),
                static_cast<long long>(nan_mismatch));
  return buf;
}

}  // namespace mxmoe::cli
