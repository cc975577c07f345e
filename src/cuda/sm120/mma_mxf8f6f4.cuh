// The SM120 block-scaled warp MMA, the one instruction the SM120 FC1/FC2 kernels are built on:
//
//   mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e2m1.f32.ue8m0
//     d, a, b, c, scale-a-data, {byte-id-a, thread-id-a}, scale-b-data, {byte-id-b, thread-id-b}
//
//   D[16x8] = (A[16x32] * SF_A[16x1]) * (B[32x8] * SF_B[1x8]) + C[16x8]     (e4m3 A, e2m1 B, fp32 C/D)
//
// Three pieces (docs/sm120.md says more):
//   (a) mma_mxf8f6f4_m16n8k32_native: the PTX, compiled only for sm_120a / sm_120f
//       (SASS: QMMA.SF.16832.F32.E4M3.E2M1.E8).
//   (b) mma_mxf8f6f4_m16n8k32_model: a software model of that instruction on the same registers,
//       computed with warp shuffles, so SM120 kernels can run unchanged on SM90 ("emulation build").
//   (c) mma_mxf8f6f4_m16n8k32: what kernels call; (a) on sm_120a/f, (b) under MXMOE_SM120_EMULATION,
//       a compile-time error anywhere else.
// Facts are from the PTX ISA 9.0/9.1 (sections cited with NOTE); the ISA's own words on precision
// leave the accumulation order open, and the model's choice is stated at the model.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe::cuda::sm120 {

// ---- fragments -------------------------------------------------------------------------------
// groupID g = lane / 4, threadID_in_group t = lane % 4 throughout.
template <typename T, int kN>
struct Vec {
  T elems[kN];
  __host__ __device__ T& operator[](int i) { return elems[i]; }
  __host__ __device__ const T& operator[](int i) const { return elems[i]; }
};

// NOTE: PTX ISA §9.7.14.5.10 (Matrix Fragments for mma.m16n8k32, .e4m3 row of Figure 88): four
// .b32 registers of four e4m3 bytes, a_i = byte i % 4 of register i / 4, low byte first;
// row = g + 8 * (reg & 1), k = 4 t + byte + 16 * (reg >> 1).
using FragA = Vec<uint32_t, 4>;
// NOTE: PTX ISA §9.7.14.5.10 (Figures 90/91): two .b32 registers of four 8-bit containers,
// k = 4 t + byte + 16 * reg, n = g. Under .kind::mxf8f6f4 each e2m1 sits in the central 4 bits
// (bits 5..2) of its byte, upper and lower 2 bits padding (PTX ISA §9.7.14.5.14, mma description).
using FragB = Vec<uint32_t, 2>;
// NOTE: PTX ISA §9.7.14.5.10 (Figure 92): c_i at row = g + 8 * (i >> 1), col = 2 t + (i & 1).
using FragC = Vec<float, 4>;
// One .b32 "scale-a-data" / "scale-b-data" register per lane holding four UE8M0 bytes; which lane
// and byte the hardware reads is chosen by {byte-id, thread-id} (see the selectors below).
using FragS = Vec<uint32_t, 1>;

// Logical coordinates of fragment elements, for the kernels' loaders and the tests.
__host__ __device__ constexpr int FragARow(int lane, int reg) { return lane / 4 + 8 * (reg & 1); }
__host__ __device__ constexpr int FragACol(int lane, int reg, int byte) {
  return 4 * (lane % 4) + byte + 16 * (reg >> 1);
}
__host__ __device__ constexpr int FragBRow(int lane, int reg, int byte) {
  return 4 * (lane % 4) + byte + 16 * reg;
}
__host__ __device__ constexpr int FragBCol(int lane) { return lane / 4; }
__host__ __device__ constexpr int FragCRow(int lane, int i) { return lane / 4 + 8 * (i >> 1); }
__host__ __device__ constexpr int FragCCol(int lane, int i) { return 2 * (lane % 4) + (i & 1); }

// ---- scale-factor selectors ------------------------------------------------------------------
// NOTE: PTX ISA §9.7.14.3 (Block Scaling for mma.sync), Table 37, scale_vec::1X: byte-id-a,
// byte-id-b in [0, 3], thread-id-a in [0, 1], thread-id-b in [0, 3]; any other value is undefined
// (ptxas rejects thread-id-a = 2 as out of range). scale_A is 16 x 1 and scale_B 1 x 8 (Table 35):
// one scale per row of A and per column of B for the whole K = 32, i.e. one MX block.
//  - SF_A: "one thread-pair within the quad determined by thread-id-a contributes the SF_A values"
//    (0: lanes with lane % 4 in {0, 1}; 1: lane % 4 in {2, 3}). Which lane of the pair gives
//    which of the quad's rows g, g + 8 is drawn only in Figure 43 (an image, not in the text);
//    taken here, as a third-party probe on SM120 hardware reports it, as the even lane for row g
//    and the odd lane for row g + 8: row m is read from lane 4 (m % 8) + 2 thread-id-a + m / 8.
//    UNVERIFIED here (docs/sm120.md); SfaLane is the one place to change.
//  - SF_B: "each thread satisfying %laneid % 4 == thread-id-b provides the SF_B", for column g:
//    column n is read from lane 4 n + thread-id-b.
//  - byte-id selects the byte of that lane's register (1X: one byte).
__host__ __device__ constexpr int SfaLane(int row, int thread_id_a) {
  return 4 * (row % 8) + 2 * thread_id_a + row / 8;
}
__host__ __device__ constexpr int SfbLane(int col, int thread_id_b) { return 4 * col + thread_id_b; }
// The inverses, for the kernels' loaders: the row of A whose scale lane `lane` provides when
// thread-id-a selects its thread pair (-1 for a lane of the other pair), and the column of B whose
// scale it provides for thread-id-b = lane % 4. Written as searches over SfaLane / SfbLane so
// that those two stay the one place that encodes the reading.
__host__ __device__ constexpr int SfaRowOfLane(int lane, int thread_id_a) {
  for (int m = 0; m < 16; ++m)
    if (SfaLane(m, thread_id_a) == lane) return m;
  return -1;
}
__host__ __device__ constexpr int SfbColOfLane(int lane) {
  for (int n = 0; n < 8; ++n)
    if (SfbLane(n, lane % 4) == lane) return n;
  return -1;
}

template <int kByteIdA, int kThreadIdA, int kByteIdB, int kThreadIdB>
struct Mxf8f6f4Selectors {
  static_assert(kByteIdA >= 0 && kByteIdA <= 3, "byte-id-a must be 0..3 (PTX ISA Table 37)");
  static_assert(kThreadIdA >= 0 && kThreadIdA <= 1, "thread-id-a must be 0..1 (PTX ISA Table 37)");
  static_assert(kByteIdB >= 0 && kByteIdB <= 3, "byte-id-b must be 0..3 (PTX ISA Table 37)");
  static_assert(kThreadIdB >= 0 && kThreadIdB <= 3, "thread-id-b must be 0..3 (PTX ISA Table 37)");
};

// ---- e2m1 containers -------------------------------------------------------------------------
// One E2M1 code (sign in bit 3) in its 8-bit container, padding bits zero.
__host__ __device__ constexpr uint32_t E2m1Container(uint32_t code) { return (code & 0xFu) << 2; }

// Four E2M1 codes packed two per byte (SPEC section 2: element 2i in the low nibble), in the low
// 16 bits of packed, to one B register: four containers, element 0 in the low byte. One PRMT.
__device__ __forceinline__ uint32_t E2m1x4ToContainers(uint32_t packed) {
  const uint32_t even = packed & 0x0F0Fu;         // elements 0 and 2 in bytes 0 and 1
  const uint32_t odd = (packed >> 4) & 0x0F0Fu;   // elements 1 and 3
  return __byte_perm(even, odd, 0x5140u) << 2;    // bytes [e0, e1, e2, e3], then into bits 5..2
}

// ---- (a) the instruction ---------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 1200 && \
    (defined(__CUDA_ARCH_FEAT_SM120_ALL) || (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ == 1200))
// NOTE: PTX ISA §9.7.14.5.14 (Target ISA notes): .kind / .block_scale need sm_120a, or sm_120f from
// PTX ISA 8.8. nvcc 13.0 defines __CUDA_ARCH_FEAT_SM120_ALL for compute_120a and
// __CUDA_ARCH_FAMILY_SPECIFIC__=1200 for both compute_120a and compute_120f (probed with --dryrun).
#define MXMOE_SM120_NATIVE_MMA 1
#endif

#if defined(MXMOE_SM120_NATIVE_MMA)
// Selectors are immediates: ptxas packs them into one uniform register (UMOV URx, imm); given in
// registers they cost a uniformity loop around the MMA. Not volatile: the result depends on the
// operands only, so the compiler may schedule it freely.
template <int kByteIdA, int kThreadIdA, int kByteIdB, int kThreadIdB>
__device__ __forceinline__ void mma_mxf8f6f4_m16n8k32_native(FragC& d, const FragA& a, const FragB& b,
                                                             const FragC& c, const FragS& sfa,
                                                             const FragS& sfb) {
  (void)Mxf8f6f4Selectors<kByteIdA, kThreadIdA, kByteIdB, kThreadIdB>{};
  asm("mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e2m1.f32.ue8m0 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}, "
      "%14, {%15, %16}, %17, {%18, %19};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]), "r"(sfa[0]), "n"(kByteIdA), "n"(kThreadIdA), "r"(sfb[0]),
        "n"(kByteIdB), "n"(kThreadIdB));
}
#endif

// ---- (b) the software model ------------------------------------------------------------------
// What it computes, per element (m, n) of D, with SF_A, SF_B the selected scale bytes:
//   - every product e4m3 x e2m1 exactly, as an integer in units of 2^-10 (|product| <= 448 * 6);
//   - their sum over the 32 k exactly (|sum| < 2^27, an int32), so the order does not matter;
//   - that sum times 2^(SF_A - 127) * 2^(SF_B - 127), rounded once to fp32 (nearest even; overflow
//     to inf, gradual underflow), then added to C in fp32 (nearest even).
//   NaN: an e4m3 NaN (0x7F, 0xFF) anywhere in row m of A, or a selected scale of 0xFF, makes the
//   element NaN; a NaN in C propagates through the fp32 add. The sign of an all-zero sum is +0.
// Why: PTX ISA §9.7.14.5.14 (Precision and rounding, .e4m3/.e2m1): "Element-wise multiplication
// of matrix A and B is performed with specified precision. Accumulation of the intermediate values
// is performed with at least single precision. The accumulation order, rounding, and handling of
// subnormal inputs are unspecified." The model is the most precise reading (no rounding inside
// the block), and the only one independent of an order the ISA does not give. Hardware may round
// partial sums (or the scaled products) to fp32 in some order; it then differs from the model by
// at most a few fp32 roundings per MMA. That residue cannot be pinned without SM120 hardware.
//
// Selectors are runtime values here so one kernel can sweep them all in tests; values outside
// Table 37 are masked into range (the hardware's behaviour there is undefined). All 32 lanes must
// call it together, as the instruction's .sync.aligned demands.

// e4m3 magnitude in units of 2^-9 (subnormal step): 0 .. 229376 (= 448 * 2^9).
__device__ __forceinline__ int E4m3Units(uint32_t code) {
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  const int mag = e == 0 ? m : (8 + m) << (e - 1);
  return (code & 0x80u) ? -mag : mag;
}
__device__ __forceinline__ bool E4m3IsNan(uint32_t code) { return (code & 0x7Fu) == 0x7Fu; }
// e2m1 (in its container, bits 5..2) in units of 0.5: 0, 1, 2, 3, 4, 6, 8, 12.
__device__ __forceinline__ int E2m1Units(uint32_t container) {
  const uint32_t code = (container >> 2) & 0xFu;
  const int e = (code >> 1) & 0x3, m = code & 0x1;
  const int mag = e == 0 ? m : (2 + m) << (e - 1);
  return (code & 0x8u) ? -mag : mag;
}

// Sum over one register's four byte pairs: a in units of 2^-9, b in units of 0.5.
__device__ __forceinline__ int Dot4Units(uint32_t a_reg, uint32_t b_reg, bool& nan) {
  int acc = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a_code = (a_reg >> (8 * j)) & 0xFFu;
    nan |= E4m3IsNan(a_code);
    acc += E4m3Units(a_code) * E2m1Units((b_reg >> (8 * j)) & 0xFFu);
  }
  return acc;
}

// The exact block sum (units of 2^-10) times 2^(sfa + sfb - 254), rounded once to fp32.
__device__ __forceinline__ float ScaleBlockSum(int sum_units, uint32_t sfa, uint32_t sfb, bool nan) {
  if (nan || sfa == 0xFFu || sfb == 0xFFu) return __int_as_float(0x7FFFFFFF);
  const int exp2 = static_cast<int>(sfa) + static_cast<int>(sfb) - 254 - 10;  // -264 .. 244
  // 2^exp2 is a normal double and |sum| < 2^27, so the product is exact in double.
  const double pow2 = __longlong_as_double(static_cast<long long>(exp2 + 1023) << 52);
  return __double2float_rn(static_cast<double>(sum_units) * pow2);
}

__device__ __forceinline__ void mma_mxf8f6f4_m16n8k32_model(FragC& d, const FragA& a, const FragB& b,
                                                            const FragC& c, const FragS& sfa,
                                                            int byte_id_a, int thread_id_a,
                                                            const FragS& sfb, int byte_id_b,
                                                            int thread_id_b) {
  constexpr unsigned kFull = 0xFFFFFFFFu;
  uint32_t lane_id;
  asm("mov.u32 %0, %%laneid;\n" : "=r"(lane_id));  // any block shape, not only threadIdx.x
  const int lane = static_cast<int>(lane_id);
  const int g = lane / 4, t = lane % 4;
  byte_id_a &= 3;
  thread_id_a &= 1;
  byte_id_b &= 3;
  thread_id_b &= 3;

  // This lane's D elements are rows g, g + 8 by columns 2t, 2t + 1. Row g of A lives in quad g
  // (registers 0 and 2, row g + 8 in 1 and 3); column n of B lives in quad n (registers 0, 1);
  // lane 4x + j holds the same k (4j .. 4j + 3 and 16 + 4j ..) of A and of B.
  int sum[4] = {0, 0, 0, 0};  // (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
  bool nan_row[2] = {false, false};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a_reg[4], b_lo[2], b_hi[2];
#pragma unroll
    for (int r = 0; r < 4; ++r) a_reg[r] = __shfl_sync(kFull, a[r], 4 * g + j);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      b_lo[r] = __shfl_sync(kFull, b[r], 4 * (2 * t) + j);      // column 2t
      b_hi[r] = __shfl_sync(kFull, b[r], 4 * (2 * t + 1) + j);  // column 2t + 1
    }
    bool nan_dummy = false;
    // k in 4j .. 4j + 3 (register 0 / 1 of A, 0 of B) and 16 + 4j .. (register 2 / 3 of A, 1 of B).
    sum[0] += Dot4Units(a_reg[0], b_lo[0], nan_row[0]) + Dot4Units(a_reg[2], b_lo[1], nan_row[0]);
    sum[1] += Dot4Units(a_reg[0], b_hi[0], nan_dummy) + Dot4Units(a_reg[2], b_hi[1], nan_dummy);
    sum[2] += Dot4Units(a_reg[1], b_lo[0], nan_row[1]) + Dot4Units(a_reg[3], b_lo[1], nan_row[1]);
    sum[3] += Dot4Units(a_reg[1], b_hi[0], nan_dummy) + Dot4Units(a_reg[3], b_hi[1], nan_dummy);
  }

  const int shift_a = 8 * byte_id_a, shift_b = 8 * byte_id_b;
  const uint32_t sf_row[2] = {
      (__shfl_sync(kFull, sfa[0], SfaLane(g, thread_id_a)) >> shift_a) & 0xFFu,
      (__shfl_sync(kFull, sfa[0], SfaLane(g + 8, thread_id_a)) >> shift_a) & 0xFFu};
  const uint32_t sf_col[2] = {
      (__shfl_sync(kFull, sfb[0], SfbLane(2 * t, thread_id_b)) >> shift_b) & 0xFFu,
      (__shfl_sync(kFull, sfb[0], SfbLane(2 * t + 1, thread_id_b)) >> shift_b) & 0xFFu};

  // c is read element by element before d's element is written, so d may alias c.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float block = ScaleBlockSum(sum[i], sf_row[i >> 1], sf_col[i & 1], nan_row[i >> 1]);
    d[i] = __fadd_rn(c[i], block);
  }
}

// ---- (c) what the kernels call ---------------------------------------------------------------
// Kernels that use it must only be compiled where one of the two paths exists: guard their bodies
// with MXMOE_SM120_MMA_AVAILABLE (set below) so an sm_90a build without emulation still compiles.
#if defined(MXMOE_SM120_NATIVE_MMA) || (defined(__CUDA_ARCH__) && defined(MXMOE_SM120_EMULATION))
#define MXMOE_SM120_MMA_AVAILABLE 1
#endif

#if defined(__CUDA_ARCH__) && !defined(MXMOE_SM120_NATIVE_MMA) && defined(MXMOE_SM120_EMULATION)
// The model out of line, operands by value, for the kernels: inlined at each of a kernel's 32 to 64
// MMA sites it made ptxas run for more than ten minutes per kernel; called, it is compiled once.
// The registers in and out, and so the kernels' data flow, are the same.
static __device__ __noinline__ FragC mma_mxf8f6f4_m16n8k32_model_call(FragA a, FragB b, FragC c, FragS sfa, FragS sfb,
                                                              int selectors) {
  FragC d;
  mma_mxf8f6f4_m16n8k32_model(d, a, b, c, sfa, selectors & 3, (selectors >> 2) & 1, sfb, (selectors >> 3) & 3,
                              (selectors >> 5) & 3);
  return d;
}
#endif

template <int kByteIdA, int kThreadIdA, int kByteIdB, int kThreadIdB>
__device__ __forceinline__ void mma_mxf8f6f4_m16n8k32(FragC& d, const FragA& a, const FragB& b,
                                                      const FragC& c, const FragS& sfa,
                                                      const FragS& sfb) {
  (void)Mxf8f6f4Selectors<kByteIdA, kThreadIdA, kByteIdB, kThreadIdB>{};
#if defined(__CUDA_ARCH__)
#if defined(MXMOE_SM120_NATIVE_MMA)
  mma_mxf8f6f4_m16n8k32_native<kByteIdA, kThreadIdA, kByteIdB, kThreadIdB>(d, a, b, c, sfa, sfb);
#elif defined(MXMOE_SM120_EMULATION)
  // Selectors packed as the SASS packs them (docs/sm120.md): bida | tida << 2 | bidb << 3 | tidb << 5.
  d = mma_mxf8f6f4_m16n8k32_model_call(a, b, c, sfa, sfb,
                                       kByteIdA | kThreadIdA << 2 | kByteIdB << 3 | kThreadIdB << 5);
#else
  static_assert(kByteIdA < 0 && kByteIdA >= 0,
                "mma_mxf8f6f4_m16n8k32 needs sm_120a/sm_120f, or MXMOE_SM120_EMULATION for other "
                "targets (the software model)");
#endif
#endif
}

}  // namespace mxmoe::cuda::sm120
