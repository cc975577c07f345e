// Fused FC1 layouts other engines use (SPEC section 4), converted to and from the project's
// canonical separate w1 (gate) and w3 (up).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe {

enum class Fc1Layout : int32_t {
  kGateUp = 0,       // SGLang w13: [gate; up] concatenated along rows
  kUpGate = 1,       // FlashInfer CUTLASS MoE: [up; gate] (w3 first)
  kInterleaved = 2,  // GPT-OSS: row 2i is gate row i, row 2i+1 is up row i
};
const char* Fc1LayoutName(Fc1Layout layout);
// "gate_up" / "sglang", "up_gate" / "flashinfer", "interleaved" / "gpt_oss".
std::optional<Fc1Layout> Fc1LayoutFromName(std::string_view name);

// w13 [2I, K] in `layout` -> w1 [I, K], w3 [I, K]. `name` labels errors.
Status SplitW13(const Mxfp4Matrix& w13, Fc1Layout layout, Mxfp4Matrix* w1, Mxfp4Matrix* w3,
                const std::string& name = "w13");
// The inverse, for tests and for writing other engines' layouts.
Status FuseW13(const Mxfp4Matrix& w1, const Mxfp4Matrix& w3, Fc1Layout layout, Mxfp4Matrix* w13);
// A fused bias [2I] in `layout` -> gate [I], up [I].
Status SplitBias13(const std::vector<float>& b13, Fc1Layout layout, std::vector<float>* gate,
                   std::vector<float>* up, const std::string& name = "w13_bias");

// Rows [row0, row0+n) of a matrix, and columns [col0, col0+n) (col0, n multiples of 32).
Mxfp4Matrix SliceRows(const Mxfp4Matrix& m, int64_t row0, int64_t n);
Mxfp4Matrix SliceCols(const Mxfp4Matrix& m, int64_t col0, int64_t n);

}  // namespace mxmoe
