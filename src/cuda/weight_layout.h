// The kernels' private MXFP4 weight layout ("prepacked"), produced once by CudaMoe::Create and read
// by the fused GEMMs (sm90/moe_gemm.cuh) and the unfused GPU reference. Host-compilable (MXMOE_HD)
// so the CPU side can build and check it too.
//
// A matrix [rows, cols] (rows = output features, cols = the reduction dimension) is cut into tiles
// of 16 rows x 64 columns: one mma.m16n8k16 A operand for four k16 steps. A tile is 512 bytes, one
// 16-byte piece per lane of a warp, holding exactly that lane's A fragments for the four steps
// (PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type"):
//   lane = 4 * g + c (g = groupID, c = threadID_in_group); 32-bit word ks (0..3) holds
//     reg 0: row g,     k = 16 ks + 2c, +1        reg 1: row g + 8, same k
//     reg 2: row g,     k = 16 ks + 2c + 8, +9    reg 3: row g + 8, same k
//   each reg two E2M1 codes (low half = even k), their bits placed so that a shift or rotation and
//   a mask (for reg 3 the rotation of reg 2, two masks and a multiplication) turn them into bf16
//   bits (see DecodeWord).
// Beside each tile, 32 bytes of scales: word g = the UE8M0-derived exponents of (row g, block 0),
// (row g + 8, block 0), (row g, block 1), (row g + 8, block 1) of the tile's two 32-blocks.
//
// Tiles are ordered so that the 16 row groups (256 rows) one CTA reads for one 64-column step are
// contiguous: row block rb, column tile kt, row group rgl within the block.
#pragma once

#include <cstdint>

#include "mxmoe/formats.h"

namespace mxmoe::cuda {

inline constexpr int kTileRows = 16;
inline constexpr int kTileCols = 64;
inline constexpr int kTileBytes = 512;
inline constexpr int kTileScaleBytes = 32;
inline constexpr int kBlockRowGroups = 16;  // row groups per 256-row CTA block
inline constexpr int kWarpRowGroups = 4;    // rows are padded to 64: one warp's 4 MMA row tiles

MXMOE_HD int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The shape of one expert's prepacked matrix.
struct PackedShape {
  int64_t rows = 0;        // valid rows
  int64_t cols = 0;        // valid reduction length (a multiple of 32)
  int64_t row_groups = 0;  // rows padded to 64, in 16-row groups
  int64_t col_tiles = 0;   // cols padded to 64, in 64-column tiles

  static PackedShape Of(int64_t rows, int64_t cols) {
    PackedShape s;
    s.rows = rows;
    s.cols = cols;
    s.row_groups = RoundUp(rows, kWarpRowGroups * kTileRows) / kTileRows;
    s.col_tiles = RoundUp(cols, kTileCols) / kTileCols;
    return s;
  }
  MXMOE_HD int64_t Tiles() const { return row_groups * col_tiles; }
  // The 256-row blocks of kBlockRowGroups row groups (the last may be partial): a GEMM's CTA rows
  // (GemmParams::m_tiles).
  MXMOE_HD int64_t RowBlocks() const { return (row_groups + kBlockRowGroups - 1) / kBlockRowGroups; }

  // Row groups in the 256-row block that holds row group rg (16, or fewer in the last block).
  MXMOE_HD int64_t GroupsInBlock(int64_t rb) const {
    const int64_t left = row_groups - rb * kBlockRowGroups;
    return left < kBlockRowGroups ? left : kBlockRowGroups;
  }
  // Position of tile (rg, kt) in the expert's tile array.
  MXMOE_HD int64_t TileIndex(int64_t rg, int64_t kt) const {
    const int64_t rb = rg / kBlockRowGroups, rgl = rg % kBlockRowGroups;
    return rb * kBlockRowGroups * col_tiles + kt * GroupsInBlock(rb) + rgl;
  }
};

// Scale exponent byte stored for a UE8M0 scale b, for a matrix whose kernels multiply their
// accumulators by 2^c_shift: the kernels form 2^(stored - 127) as a bf16 multiplier of the
// E2M1 bit pattern (which is the value times 2^-126), so stored = b + 126 - c_shift. NaN (0xFF)
// stays 0xFF; the repack also zeroes that block's codes, so 0 * inf makes every element NaN.
MXMOE_HD uint8_t StoredScale(uint8_t b, int c_shift) {
  if (b == kUe8m0Nan) return kUe8m0Nan;
  int e = static_cast<int>(b) + 126 - c_shift;
  if (e < 1) e = 1;
  if (e > 254) e = 254;
  return static_cast<uint8_t>(e);
}
// The inverse, for the reference: the scale 2^s the stored byte stands for (NaN for 0xFF).
MXMOE_HD float StoredScaleValue(uint8_t stored, int c_shift) {
  if (stored == kUe8m0Nan) return bits_float(0x7FC00000u);
  return ldexpf(1.0f, static_cast<int>(stored) - 253 + c_shift);
}
// The c_shift for a matrix whose largest finite scale byte is b_max: 0 unless some scale is
// above 2^1, so that every stored exponent stays finite.
MXMOE_HD int ScaleShiftFor(int b_max) { return b_max > 128 ? b_max - 128 : 0; }

// Bit positions of (sign, e1, e0, m) of the code in register `reg`, half `hi` of a packed word.
// reg 0 is bf16 bits as they stand (sign 15, exponent bits 8..7, mantissa bit 6); regs 1 and 2
// sit 3 and 6 bits lower; reg 3 fills the four bits left over in each half (10, 11, 13, 14), its
// low half's code in the word's upper half and the other way round, in the order that lets
// DecodeWord move all four from reg 2's rotated word with one multiplication (see there).
MXMOE_HD void CodeBitPositions(int reg, int hi, int pos[4]) {
  int s, e1, e0, m;
  switch (reg) {
    case 0: s = 15, e1 = 8, e0 = 7, m = 6; break;
    case 1: s = 12, e1 = 5, e0 = 4, m = 3; break;
    case 2: s = 9, e1 = 2, e0 = 1, m = 0; break;
    default:
      s = 11, e1 = 10, e0 = 14, m = 13;
      break;
  }
  const bool upper = reg == 3 ? hi == 0 : hi != 0;  // reg 3's codes sit in the other half
  const int off = upper ? 16 : 0;
  pos[0] = s + off;
  pos[1] = e1 + off;
  pos[2] = e0 + off;
  pos[3] = m + off;
}

// Packs 8 E2M1 codes, codes[2 * reg + hi], into one word.
MXMOE_HD uint32_t EncodeWord(const uint8_t codes[8]) {
  uint32_t w = 0;
  for (int reg = 0; reg < 4; ++reg) {
    for (int hi = 0; hi < 2; ++hi) {
      int pos[4];
      CodeBitPositions(reg, hi, pos);
      const uint32_t c = codes[2 * reg + hi];
      w |= ((c >> 3) & 1u) << pos[0];
      w |= ((c >> 2) & 1u) << pos[1];
      w |= ((c >> 1) & 1u) << pos[2];
      w |= (c & 1u) << pos[3];
    }
  }
  return w;
}

// The code of (reg, hi) in a packed word: the plain inverse of EncodeWord.
MXMOE_HD uint8_t CodeAt(uint32_t w, int reg, int hi) {
  int pos[4];
  CodeBitPositions(reg, hi, pos);
  return static_cast<uint8_t>((((w >> pos[0]) & 1u) << 3) | (((w >> pos[1]) & 1u) << 2) |
                              (((w >> pos[2]) & 1u) << 1) | ((w >> pos[3]) & 1u));
}

// The fast decode the kernels use: four bf16x2 registers whose bits are the E2M1 bit patterns
// moved into place, i.e. the E2M1 values times 2^-126 (E2M1's subnormal 0.5 lands on bf16's
// subnormal 2^-127, which is why the factor is 2^-126 and not a normal power). 8 integer ops.
// Register 2 is the word rotated left by 6 (a funnel shift; the bits it wraps land on 0..5, which
// the mask drops). Register 3's bits need four different moves: in the rotated word they sit at
// 0, 1, 3, 4 (e1, sign, m, e0 of the low half's code) and 16, 17, 19, 20 (the high half's), and one
// multiplication by 2^3 + 2^8 + 2^14 adds three shifted copies of them. The copies' 24 positions
// below 32 are all distinct, so the sum has no carries and is their OR; the mask keeps m and e0
// from the 2^3 copy (6, 7), e1 from the 2^8 copy (8) and the sign from the 2^14 copy (15), and the
// same 16 bits higher in the upper half. (Before perf-log v30 register 3 took a right shift of its
// own, and register 2 a left shift: 9 ops.)
template <bool kFunnel = true>
MXMOE_HD void DecodeWord(uint32_t w, uint32_t r[4]) {
  constexpr uint32_t kMask = 0x81C081C0u;  // sign, exponent bits 1..0 and mantissa bit 6 per half
  uint32_t rot6 = (w << 6) | (w >> 26);
#if defined(__CUDA_ARCH__)
  // kFunnel: the rotation as one PTX funnel shift that both registers read (8 ops). Left to the C
  // above, ptxas derives register 2 with a shift of its own (9 ops), which keeps one register fewer
  // live: n8f's kernel, capped at 72, spilled with the 8-op form (perf-log v30).
  if constexpr (kFunnel) asm("shf.l.wrap.b32 %0, %1, %1, 6;" : "=r"(rot6) : "r"(w));
#endif
  r[0] = w & kMask;
  r[1] = (w << 3) & kMask;
  r[2] = rot6 & kMask;
  r[3] = ((rot6 & 0x001B001Bu) * 0x4108u) & kMask;
}

// Element (r, k) of one expert's prepacked matrix, dequantized (the reference's scalar path).
MXMOE_HD float PackedElement(const uint8_t* tiles, const uint8_t* scales, const PackedShape& s,
                             int c_shift, int64_t r, int64_t k) {
  const int64_t rg = r / kTileRows, kt = k / kTileCols;
  const int rr = static_cast<int>(r % kTileRows), kk = static_cast<int>(k % kTileCols);
  const int g = rr % 8, row_hi = rr / 8;
  const int ks = kk / 16, kq = kk % 16;
  const int c = (kq % 8) / 2, k_hi = kq / 8, odd = kq % 2;
  const int reg = 2 * k_hi + row_hi;
  const int64_t tile = s.TileIndex(rg, kt);
  const uint8_t* wp = tiles + tile * kTileBytes + (4 * g + c) * 16 + ks * 4;
  const uint32_t word = static_cast<uint32_t>(wp[0]) | (static_cast<uint32_t>(wp[1]) << 8) |
                        (static_cast<uint32_t>(wp[2]) << 16) | (static_cast<uint32_t>(wp[3]) << 24);
  const uint8_t stored = scales[tile * kTileScaleBytes + g * 4 + (kk / 32) * 2 + row_hi];
  return e2m1_to_float(CodeAt(word, reg, odd)) * StoredScaleValue(stored, c_shift);
}

}  // namespace mxmoe::cuda
