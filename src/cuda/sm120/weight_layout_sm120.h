// The SM120 path's private MXFP4 weight layout, produced once at load by the repack kernel
// (weight_prepack_sm120.cu) and read by the SM120 grouped GEMMs (moe_gemm_sm120.cuh) and by the
// unfused GPU reference. Host-compilable (MXMOE_HD) so tests can check it on the CPU.
//
// The weights are the B operand of mma.m16n8k32 .kind::mxf8f6f4 (e2m1, "col": one MMA column is one
// weight row, K contiguous). A matrix [rows, cols] (rows = output features, cols = the reduction)
// is cut into groups of 64 rows (8 MMA n8 tiles, one warp's N) by k-tiles of 128 columns (four k32
// MMA steps, four MX blocks). One (group, k-tile) is 4096 bytes of codes plus 256 bytes of scales;
// an expert's pieces are ordered group-major, k-tile-minor, so a group's whole reduction is
// contiguous. Rows are padded to 64 and columns to 128 with zero codes and finite scales (127).
//
// Codes: n8 tile j (0..7) of the group, lane l = 4 g + t (g = groupID = the MMA column, t =
// threadID_in_group) owns 16 bytes at (32 j + l) * 16: word s (k32 step 0..3), byte b (0..3) holds
// two E2M1 codes of weight row 8 j + g: the low nibble at k = 32 s + 4 t + b, the high nibble at
// k = 32 s + 16 + 4 t + b. Those are exactly B fragment registers 0 and 1 of that step (PTX ISA
// §9.7.14.5.10, Figs. 90/91: k = 4 t + byte + 16 reg, n = g), and a shift and a mask move each
// nibble into the centre of its 8-bit container (BWordToFragB).
// Scales: byte 32 g + 4 j + s of the 256 is the UE8M0 scale of row 8 j + g for MX block s of the
// k-tile, so a lane reads its 8 tiles' scale registers (byte s = step s) as two 16-byte loads.
// Scale bytes are the checkpoint's as they are: the MMA applies them (NaN 0xFF stays 0xFF).
//
// FC1 (W13): row group q holds the 32 intermediates 32 q .. 32 q + 31 as gate and up columns,
// interleaved so that the MMA accumulator a lane holds for n8 tile j, columns 2 t and 2 t + 1, is
// (gate, up) of intermediate 32 q + 8 t + j: the activation needs no data exchange, and one
// lane's 8 tiles are 8 consecutive intermediates (one 8-byte store of e4m3 codes), a warp's
// 32 one MX block of the re-quantization (a reduction over the 4 lanes of a quad).
#pragma once

#include <cstdint>

#include "mxmoe/formats.h"

namespace mxmoe::cuda::sm120 {

inline constexpr int kGroupRows = 64;     // weight rows per group: one warp's 8 n8 MMA tiles
inline constexpr int kGroupNTiles = 8;
inline constexpr int kKTile = 128;        // reduction columns per k-tile: 4 k32 steps, 4 MX blocks
inline constexpr int kKSteps = kKTile / 32;
inline constexpr int kPieceBytes = kGroupRows * kKTile / 2;              // 4096
inline constexpr int kPieceScaleBytes = kGroupRows * kKTile / kMxBlock;  // 256
inline constexpr uint8_t kPadScale = 127;  // 2^0: padding codes are zero, their scale finite

MXMOE_HD int64_t RoundUpTo(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One expert's packed matrix.
struct PackedShape {
  int64_t rows = 0;     // valid rows
  int64_t cols = 0;     // valid reduction length (a multiple of 32)
  int64_t groups = 0;   // rows padded to 64, in 64-row groups
  int64_t k_tiles = 0;  // cols padded to 128, in 128-column k-tiles

  static PackedShape Of(int64_t rows, int64_t cols) {
    PackedShape s;
    s.rows = rows;
    s.cols = cols;
    s.groups = RoundUpTo(rows, kGroupRows) / kGroupRows;
    s.k_tiles = RoundUpTo(cols, kKTile) / kKTile;
    return s;
  }
  MXMOE_HD int64_t Pieces() const { return groups * k_tiles; }
  MXMOE_HD int64_t CodeBytes() const { return Pieces() * kPieceBytes; }
  MXMOE_HD int64_t ScaleBytes() const { return Pieces() * kPieceScaleBytes; }
  MXMOE_HD int64_t Piece(int64_t group, int64_t kt) const { return group * k_tiles + kt; }
};

// ---- FC1 row order ----------------------------------------------------------------------------
// Packed row of intermediate i's gate (up = false) or up row.
MXMOE_HD int64_t Fc1PackedRow(int64_t i, bool up) {
  const int64_t q = i / 32, ii = i % 32;
  return q * kGroupRows + (ii % 8) * 8 + 2 * (ii / 8) + (up ? 1 : 0);
}
// The inverse: which intermediate, gate or up, packed row r holds.
MXMOE_HD int64_t Fc1Intermediate(int64_t r, bool* up) {
  const int64_t q = r / kGroupRows, j = (r % kGroupRows) / 8, c = r % 8;
  *up = (c & 1) != 0;
  return q * 32 + 8 * (c / 2) + j;
}

// ---- element positions ------------------------------------------------------------------------
// Byte of (packed row r, column k) within the expert's codes; *high = the element is the high nibble.
MXMOE_HD int64_t CodeOffset(const PackedShape& s, int64_t r, int64_t k, bool* high) {
  const int64_t group = r / kGroupRows, kt = k / kKTile;
  const int j = static_cast<int>((r % kGroupRows) / 8), g = static_cast<int>(r % 8);
  const int kk = static_cast<int>(k % kKTile);
  const int step = kk / 32, kq = kk % 32;
  const int t = (kq % 16) / 4, byte = kq % 4;
  *high = kq >= 16;
  return s.Piece(group, kt) * kPieceBytes + (32 * j + 4 * g + t) * 16 + 4 * step + byte;
}
MXMOE_HD int64_t ScaleOffset(const PackedShape& s, int64_t r, int64_t k) {
  const int64_t group = r / kGroupRows, kt = k / kKTile;
  const int j = static_cast<int>((r % kGroupRows) / 8), g = static_cast<int>(r % 8);
  const int step = static_cast<int>((k % kKTile) / 32);
  return s.Piece(group, kt) * kPieceScaleBytes + 32 * g + 4 * j + step;
}

// Element (packed row r, column k) of one expert, dequantized: e2m1 * 2^(scale - 127), NaN for a
// NaN scale (the reference's scalar path).
MXMOE_HD float PackedElement(const uint8_t* codes, const uint8_t* scales, const PackedShape& s, int64_t r,
                             int64_t k) {
  bool high;
  const uint8_t byte = codes[CodeOffset(s, r, k, &high)];
  const uint8_t code = high ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
  return e2m1_to_float(code) * ue8m0_to_float(scales[ScaleOffset(s, r, k)]);
}

// ---- what the kernel does with a word -----------------------------------------------------------
// Byte offset, within a piece, of the 16 bytes lane `lane` loads for n8 tile j.
MXMOE_HD int LaneCodeOffset(int j, int lane) { return (32 * j + lane) * 16; }
// Byte offset, within a piece's scales, of the 8 scale registers (n8 tiles 0..7) of lane's column.
MXMOE_HD int LaneScaleOffset(int lane) { return 32 * (lane / 4); }

// One step's word to the two B registers: eight E2M1 codes into the centre (bits 5..2) of their
// 8-bit containers, padding bits zero (PTX ISA §9.7.14.5.14: under .kind::mxf8f6f4 an .e2m1
// element "resides in central 4 bits of the 8-bit container"). Two instructions per register.
MXMOE_HD void BWordToFragB(uint32_t word, uint32_t* reg0, uint32_t* reg1) {
  *reg0 = (word << 2) & 0x3C3C3C3Cu;  // low nibbles: k = 4 t + byte
  *reg1 = (word >> 2) & 0x3C3C3C3Cu;  // high nibbles: k = 16 + 4 t + byte
}

}  // namespace mxmoe::cuda::sm120
