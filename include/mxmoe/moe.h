// The fused MoE operator's host-side API: shapes, parallel slices, the project's own (canonical)
// representation of MXFP4 experts, and the CPU reference and CPU backend (SPEC section 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/activation.h"
#include "mxmoe/status.h"

namespace mxmoe {

enum class OutputDType : int32_t { kBF16 = 0, kF32 = 1 };
const char* OutputDTypeName(OutputDType t);
// Bytes of one output element.
constexpr size_t OutputDTypeSize(OutputDType t) { return t == OutputDType::kF32 ? 4 : 2; }

// The unsplit layer: the same on every rank.
struct LayerShape {
  int64_t num_experts = 0;   // E
  int64_t hidden = 0;        // K, the experts' input width
  int64_t intermediate = 0;  // I, before any tensor-parallel split
  int64_t top_k = 0;         // k
  // K and I multiples of 32, E >= 1, 1 <= k <= E.
  Status Validate() const;
};

// One rank's share (SPEC section 1, "Parallel slices").
struct ParallelSlice {
  int32_t tp_size = 1;
  int32_t tp_rank = 0;
  int32_t ep_size = 1;
  int32_t ep_rank = 0;

  // Ranks in range, E % ep == 0, (I / tp) % 32 == 0.
  Status Validate(const LayerShape& shape) const;
  int64_t LocalIntermediate(const LayerShape& s) const { return s.intermediate / tp_size; }
  int64_t NumLocalExperts(const LayerShape& s) const { return s.num_experts / ep_size; }
  int64_t FirstExpert(const LayerShape& s) const { return ep_rank * NumLocalExperts(s); }
  int64_t FirstIntermediateRow(const LayerShape& s) const { return tp_rank * LocalIntermediate(s); }
  bool IsFull() const { return tp_size == 1 && ep_size == 1; }
};

// An MXFP4 matrix [rows, cols], row-major, blocks of 32 along cols (the reduction dimension).
struct Mxfp4Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> packed;  // [rows, cols/2], element 2i in the low nibble of byte i
  std::vector<uint8_t> scales;  // [rows, cols/32] UE8M0

  Status Validate(const std::string& name, int64_t want_rows, int64_t want_cols) const;
  float At(int64_t r, int64_t c) const;  // dequantized element
};

// One expert in the project's canonical layout (the checkpoint's w1 / w3 / w2).
struct ExpertWeights {
  Mxfp4Matrix w1;                // gate [I_local, K]
  Mxfp4Matrix w3;                // up   [I_local, K]
  Mxfp4Matrix w2;                // down [K, I_local]
  std::vector<float> gate_bias;  // SwigluBias only: [I_local], or empty for none
  std::vector<float> up_bias;    // SwigluBias only: [I_local], or empty for none
};

struct ActivationSpec {
  ActivationType type = ActivationType::Situ;
  ActParams params;                  // for every expert, unless per_expert is given
  std::vector<ActParams> per_expert;  // [num local experts], or empty

  const ActParams& ForExpert(int64_t local_idx) const {
    return per_expert.empty() ? params : per_expert[static_cast<size_t>(local_idx)];
  }
};

// The experts of one rank: the unit every backend prepares from.
struct ExpertSet {
  LayerShape shape;  // unsplit
  ParallelSlice slice;
  ActivationSpec activation;
  std::vector<ExpertWeights> experts;  // slice.NumLocalExperts(shape) of them, sliced along I

  int64_t NumLocalExperts() const { return slice.NumLocalExperts(shape); }
  int64_t FirstExpert() const { return slice.FirstExpert(shape); }
  int64_t LocalIntermediate() const { return slice.LocalIntermediate(shape); }
  // Shape, slice, activation kind and parameters, and every tensor's size.
  Status Validate() const;
};

// A rank's slice of an unsplit set: rows [r*I/tp, (r+1)*I/tp) of w1, w3 (and biases), the same
// columns of w2; experts [r*E/ep, (r+1)*E/ep).
Status SliceExperts(const ExpertSet& full, const ParallelSlice& slice, ExpertSet* out);

// One call's activations. All pointers are host pointers for the CPU backends and device pointers
// for the CUDA backend.
struct MoeInput {
  int64_t num_tokens = 0;
  const uint16_t* x_bf16 = nullptr;     // [T, K] bf16 bits, or null when x is given as MXFP8:
  const uint8_t* x_e4m3 = nullptr;      // [T, K] E4M3 codes
  const uint8_t* x_scale = nullptr;     // [T, K/32] UE8M0
  const int32_t* topk_ids = nullptr;    // [T, k] global expert ids; -1 = no expert
  const float* topk_weights = nullptr;  // [T, k]
};

struct MoeOutput {
  OutputDType dtype = OutputDType::kBF16;
  void* data = nullptr;  // [T, K]: this rank's partial sum
};

// Pointers present for the token count, exactly one form of x. With check_ids (host-visible ids),
// every id in [-1, E).
Status ValidateMoeCall(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out,
                       bool check_ids);

// The definition of correct: plain loops repeating every quantization step of SPEC section 1.
Status ReferenceMoe(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out);

// The CPU backend: the same arithmetic as ReferenceMoe (bitwise the same output), grouped by
// expert and spread over threads (0 = hardware concurrency).
Status CpuMoe(const ExpertSet& experts, const MoeInput& in, const MoeOutput& out,
              int num_threads = 0);

}  // namespace mxmoe
