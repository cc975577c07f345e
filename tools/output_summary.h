// One-line summaries of an output: a checksum, and the error against a reference.
#pragma once

#include <string>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe::cli {

// "checksum fnv1a64=0x... sum=... rms=... nan=N"; the hash covers the raw bytes of the dtype.
std::string SummarizeOutput(const MoeOutput& out, int64_t count);

// "bitwise equal", or "max |err| = ..., rel L2 err = ..., NaN mismatches = ..."; `ref` has
// out's dtype.
std::string CompareToReference(const MoeOutput& out, const MoeOutput& ref, int64_t count);

}  // namespace mxmoe::cli
