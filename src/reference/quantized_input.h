// Step 1 of SPEC section 1, shared by the reference and the CPU backend: the dequantized MXFP8
// input, deq(mxfp8_quantize(x)), or deq of a pre-quantized x.
#pragma once

#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe::detail {

// Row t of the result is deq(xq[t]) as fp32 (exact).
std::vector<float> DequantizedInput(const MoeInput& in, int64_t hidden);

// Round the fp32 intermediate of one pair to MXFP8 and back (step 4), in place, per 32.
void QuantizeDequantizeMxfp8(float* a, int64_t n);

// Write the fp32 sums in the requested dtype (step 6's cast).
void StoreOutput(const std::vector<float>& acc, const MoeOutput& out);

// Whether global id `id` is a valid expert of this rank; its local index in *local.
inline bool LocalExpert(const ExpertSet& s, int32_t id, int64_t* local) {
  const int64_t l = static_cast<int64_t>(id) - s.FirstExpert();
  if (id < 0 || l < 0 || l >= s.NumLocalExperts()) return false;
  *local = l;
  return true;
}

}  // namespace mxmoe::detail
