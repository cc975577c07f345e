// Converters between other engines' fused FC1 layouts and the canonical w1 / w3 (SPEC section 4).
#include <cctype>
#include <cstring>
#include <string>

#include "mxmoe/formats.h"
#include "mxmoe/layouts.h"

namespace mxmoe {

const char* Fc1LayoutName(Fc1Layout layout) {
  switch (layout) {
    case Fc1Layout::kGateUp: return "gate_up";
    case Fc1Layout::kUpGate: return "up_gate";
    case Fc1Layout::kInterleaved: return "interleaved";
  }
  return "invalid";
}

std::optional<Fc1Layout> Fc1LayoutFromName(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "gate_up" || n == "sglang") return Fc1Layout::kGateUp;
  if (n == "up_gate" || n == "flashinfer") return Fc1Layout::kUpGate;
  if (n == "interleaved" || n == "gpt_oss" || n == "gpt-oss") return Fc1Layout::kInterleaved;
  return std::nullopt;
}

namespace {

// Row r of the fused matrix that holds gate row i (is_up false) or up row i.
int64_t FusedRow(Fc1Layout layout, int64_t i, int64_t rows_per_half, bool is_up) {
  switch (layout) {
    case Fc1Layout::kGateUp: return is_up ? rows_per_half + i : i;
    case Fc1Layout::kUpGate: return is_up ? i : rows_per_half + i;
    case Fc1Layout::kInterleaved: return 2 * i + (is_up ? 1 : 0);
  }
  return 0;
}

void CopyRow(const Mxfp4Matrix& src, int64_t src_row, Mxfp4Matrix* dst, int64_t dst_row) {
  const int64_t pb = src.cols / 2, sb = src.cols / kMxBlock;
  std::memcpy(dst->packed.data() + dst_row * pb, src.packed.data() + src_row * pb, pb);
  std::memcpy(dst->scales.data() + dst_row * sb, src.scales.data() + src_row * sb, sb);
}

Mxfp4Matrix Empty(int64_t rows, int64_t cols) {
  Mxfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(rows * cols / 2);
  m.scales.resize(rows * cols / kMxBlock);
  return m;
}

}  // namespace

Status SplitW13(const Mxfp4Matrix& w13, Fc1Layout layout, Mxfp4Matrix* w1, Mxfp4Matrix* w3,
                const std::string& name) {
  if (w13.rows % 2 != 0 || w13.rows == 0)
    return Status::Invalid(name + ": fused gate/up matrix has " + std::to_string(w13.rows) +
                           " rows, expected an even number 2*I");
  MXMOE_RETURN_IF_ERROR(w13.Validate(name, w13.rows, w13.cols));
  const int64_t half = w13.rows / 2;
  *w1 = Empty(half, w13.cols);
  *w3 = Empty(half, w13.cols);
  for (int64_t i = 0; i < half; ++i) {
    CopyRow(w13, FusedRow(layout, i, half, false), w1, i);
    CopyRow(w13, FusedRow(layout, i, half, true), w3, i);
  }
  return Status::Ok();
}

Status FuseW13(const Mxfp4Matrix& w1, const Mxfp4Matrix& w3, Fc1Layout layout, Mxfp4Matrix* w13) {
  MXMOE_RETURN_IF_ERROR(w1.Validate("w1", w1.rows, w1.cols));
  MXMOE_RETURN_IF_ERROR(w3.Validate("w3", w1.rows, w1.cols));
  const int64_t half = w1.rows;
  Mxfp4Matrix m = Empty(2 * half, w1.cols);
  for (int64_t i = 0; i < half; ++i) {
    CopyRow(w1, i, &m, FusedRow(layout, i, half, false));
    CopyRow(w3, i, &m, FusedRow(layout, i, half, true));
  }
  *w13 = std::move(m);
  return Status::Ok();
}

Status SplitBias13(const std::vector<float>& b13, Fc1Layout layout, std::vector<float>* gate,
                   std::vector<float>* up, const std::string& name) {
  if (b13.empty() || b13.size() % 2 != 0)
    return Status::Invalid(name + ": " + std::to_string(b13.size()) +
                           " entries, expected an even number 2*I");
  const int64_t half = static_cast<int64_t>(b13.size() / 2);
  gate->resize(half);
  up->resize(half);
  for (int64_t i = 0; i < half; ++i) {
    (*gate)[i] = b13[FusedRow(layout, i, half, false)];
    (*up)[i] = b13[FusedRow(layout, i, half, true)];
  }
  return Status::Ok();
}

Mxfp4Matrix SliceRows(const Mxfp4Matrix& m, int64_t row0, int64_t n) {
  Mxfp4Matrix r = Empty(n, m.cols);
  for (int64_t i = 0; i < n; ++i) CopyRow(m, row0 + i, &r, i);
  return r;
}

Mxfp4Matrix SliceCols(const Mxfp4Matrix& m, int64_t col0, int64_t n) {
  Mxfp4Matrix r = Empty(m.rows, n);
  const int64_t pb = m.cols / 2, sb = m.cols / kMxBlock;
  for (int64_t i = 0; i < m.rows; ++i) {
    std::memcpy(r.packed.data() + i * (n / 2), m.packed.data() + i * pb + col0 / 2, n / 2);
    std::memcpy(r.scales.data() + i * (n / kMxBlock), m.scales.data() + i * sb + col0 / kMxBlock,
                n / kMxBlock);
  }
  return r;
}

}  // namespace mxmoe
