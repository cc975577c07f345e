// What the ranks tell rank 0 (one fixed-size record each, all-gathered through NCCL) and how the
// all-reduced sum is judged against the unsplit layer.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace mxmoe::dist {

// One rank's record: trivially copyable, so the ranks (the same binary) exchange it as bytes.
struct RankStats {
  int32_t rank = 0;
  int32_t device = 0;
  int32_t first_slice = 0;
  int32_t num_slices = 0;
  double moe_ms = 0;              // median over the timed steps: the rank's slices, back to back
  double allreduce_ms = 0;        // median: the all-reduce of the step, waiting for peers included
  double allreduce_alone_ms = 0;  // median: the all-reduce alone, each right after a barrier
  double load_s = 0;              // reading or making the slices and preparing them on the GPU
  uint64_t sum_hash = 0;          // FNV-1a 64 of the all-reduced output's bytes
  char device_name[64] = {};
};
static_assert(std::is_trivially_copyable_v<RankStats>);

// FNV-1a 64 of the bytes (the checksum `mxmoe run` prints).
uint64_t Fnv1a64(const void* data, size_t bytes);

// The median; 0 for none.
double Median(std::vector<double> v);

// The all-reduced sum against the unsplit layer's output. The two hold the same exact products
// summed in another fp32 order, so the error is measured against the larger of |ref_i| and
// RMS(ref): an element that cancels to near zero may carry the rounding of its larger terms.
struct SumCheck {
  int64_t count = 0;
  bool bitwise = false;
  double rms_ref = 0;
  double max_rel = 0;         // max_i |got_i - ref_i| / max(|ref_i|, RMS(ref)), finite ref_i
  int64_t worst = -1;         // its index, -1 when every element is equal
  float worst_got = 0, worst_ref = 0;
  int64_t over = 0;           // elements above the tolerance
  int64_t finite_mismatch = 0;  // one side finite, the other not (NaN or Inf)
  double tolerance = 0;
  bool Passed() const { return finite_mismatch == 0 && max_rel <= tolerance; }
};
SumCheck CheckSum(const float* got, const float* ref, int64_t count, double tolerance);

// "max rel err 2.1e-07 at [t 3, n 1027] (got 0.51234, ref 0.51234); RMS(ref) 0.73; 0 of 14336
// above 1e-05", or "bitwise equal"; `width` turns the worst index into [t, n].
std::string DescribeSumCheck(const SumCheck& c, int64_t width);

}  // namespace mxmoe::dist
