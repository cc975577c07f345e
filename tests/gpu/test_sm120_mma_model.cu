// The software model of the SM120 block-scaled MMA (src/cuda/sm120/mma_mxf8f6f4.cuh) against plain
// math on the logical matrices: D[m][n] = sum_k deq(A[m][k]) deq(B[k][n]) 2^(SF_A[m]-127)
// 2^(SF_B[n]-127) + C[m][n], the sum exact (in double: every term is a multiple of the same power
// of two and the sum needs at most 27 bits), rounded once to fp32, then added to C in fp32. That is
// the model's documented rounding, so the model must match it bit for bit (NaN for NaN, +0 for -0).
//
// Each case is one warp: the kernel builds the lanes' fragments from the logical matrices with the
// header's layout functions (pinned to the ISA text by the first test), runs the model, and scatters
// D back; the model itself reaches the other lanes through shuffles only, so a wrong layout reading
// on either side shows up as a wrong element. On the H200 the dispatch test runs the emulation path;
// built for and run on an SM120 GPU, the same test would check the hardware instruction (with a
// tolerance for its unspecified summation order).
#ifndef MXMOE_SM120_EMULATION
#define MXMOE_SM120_EMULATION  // the dispatch test needs the model on sm_90a
#endif

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sm120/mma_mxf8f6f4.cuh"
#include "mxmoe/formats.h"

namespace mxmoe::cuda::sm120 {
namespace {

#define SM120_CUDA_OK(call)                                                        \
  do {                                                                             \
    const cudaError_t err_ = (call);                                               \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_);     \
  } while (0)

constexpr uint32_t kPoison = 0xFFFFFFFFu;  // a NaN the model never writes (its NaN is 0x7FFFFFFF)

// One warp's worth of operands, as logical matrices plus the raw scale registers of every lane.
struct MmaCase {
  uint8_t a[16][32];  // e4m3 codes
  uint8_t b[32][8];   // e2m1 in its 8-bit container (bits 5..2)
  float c[16][8];
  uint32_t sfa[32];  // scale-a-data of each lane
  uint32_t sfb[32];  // scale-b-data of each lane
  int sel[4];        // byte-id-a, thread-id-a, byte-id-b, thread-id-b
};

// splitmix64: the same stream everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t Bits() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
  }
  int Below(int n) { return static_cast<int>(Bits() % static_cast<uint32_t>(n)); }
  int Range(int lo, int hi) { return lo + Below(hi - lo + 1); }  // inclusive
  float Normal() {
    const double u1 = (Bits() + 1.0) / 4294967297.0, u2 = Bits() / 4294967296.0;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

uint8_t RandomE4m3(Rng& rng) {  // any finite code, subnormals and zeros included
  uint8_t code = static_cast<uint8_t>(rng.Bits());
  if ((code & 0x7F) == 0x7F) code ^= 1;
  return code;
}
uint8_t RandomE4m3NonZero(Rng& rng) {
  uint8_t code;
  do code = RandomE4m3(rng);
  while ((code & 0x7F) == 0);
  return code;
}
uint8_t RandomE2m1(Rng& rng) { return static_cast<uint8_t>(E2m1Container(rng.Bits() & 0xF)); }
uint8_t RandomE2m1NonZero(Rng& rng) {
  uint32_t code;
  do code = rng.Bits() & 0xF;
  while ((code & 0x7) == 0);
  return static_cast<uint8_t>(E2m1Container(code));
}

// Where the selectors say the scale of row m / column n is read. Written here from the ISA text
// (PTX ISA 9.1 §9.7.14.3) independently of SfaLane / SfbLane: the thread pair 2 thread-id-a,
// 2 thread-id-a + 1 of quad m % 8, its even lane for rows 0..7; thread thread-id-b of quad n.
int SfaLaneFromIsa(int m, int thread_id_a) { return 4 * (m % 8) + 2 * thread_id_a + (m >= 8 ? 1 : 0); }
int SfbLaneFromIsa(int n, int thread_id_b) { return 4 * n + thread_id_b; }

// Junk in every lane's scale registers, the NaN scale 0xFF among it, so that reading a byte or a
// lane the selectors did not choose shows up.
void FillJunkScales(uint32_t sfa[32], uint32_t sfb[32], Rng& rng) {
  for (int l = 0; l < 32; ++l) {
    sfa[l] = rng.Bits();
    sfb[l] = rng.Bits();
    if (rng.Below(4) == 0) sfa[l] |= 0xFFu << (8 * rng.Below(4));
    if (rng.Below(4) == 0) sfb[l] |= 0xFFu << (8 * rng.Below(4));
  }
}

// The per-row / per-column scales into the bytes and lanes that selectors sel choose.
void PutScales(uint32_t sfa[32], uint32_t sfb[32], const int sel[4], const uint8_t sf_row[16],
               const uint8_t sf_col[8]) {
  const int shift_a = 8 * sel[0], shift_b = 8 * sel[2];
  for (int m = 0; m < 16; ++m) {
    uint32_t& reg = sfa[SfaLaneFromIsa(m, sel[1])];
    reg = (reg & ~(0xFFu << shift_a)) | (static_cast<uint32_t>(sf_row[m]) << shift_a);
  }
  for (int n = 0; n < 8; ++n) {
    uint32_t& reg = sfb[SfbLaneFromIsa(n, sel[3])];
    reg = (reg & ~(0xFFu << shift_b)) | (static_cast<uint32_t>(sf_col[n]) << shift_b);
  }
}

void RandomScaleValues(Rng& rng, uint8_t sf_row[16], uint8_t sf_col[8], int lo, int hi) {
  for (int m = 0; m < 16; ++m) sf_row[m] = static_cast<uint8_t>(rng.Range(lo, hi));
  for (int n = 0; n < 8; ++n) sf_col[n] = static_cast<uint8_t>(rng.Range(lo, hi));
}

void RandomSelectors(MmaCase& cs, Rng& rng) {
  cs.sel[0] = rng.Below(4);
  cs.sel[1] = rng.Below(2);
  cs.sel[2] = rng.Below(4);
  cs.sel[3] = rng.Below(4);
}

// Junk registers, then scales in [lo, hi] (default 2^-16 .. 2^16) where cs.sel reads them.
void RandomScales(MmaCase& cs, Rng& rng, int lo = 111, int hi = 143) {
  uint8_t sf_row[16], sf_col[8];
  RandomScaleValues(rng, sf_row, sf_col, lo, hi);
  FillJunkScales(cs.sfa, cs.sfb, rng);
  PutScales(cs.sfa, cs.sfb, cs.sel, sf_row, sf_col);
}

MmaCase RandomCase(Rng& rng, bool zero_c = false) {
  MmaCase cs;
  for (auto& row : cs.a)
    for (auto& v : row) v = RandomE4m3(rng);
  for (auto& row : cs.b)
    for (auto& v : row) v = RandomE2m1(rng);
  for (auto& row : cs.c)
    for (auto& v : row) v = zero_c ? 0.0f : 64.0f * rng.Normal();
  RandomSelectors(cs, rng);
  RandomScales(cs, rng);
  return cs;
}

// ---- plain math ------------------------------------------------------------------------------
uint8_t SelectedSfa(const MmaCase& cs, int m) {
  return static_cast<uint8_t>(cs.sfa[SfaLaneFromIsa(m, cs.sel[1])] >> (8 * cs.sel[0]));
}
uint8_t SelectedSfb(const MmaCase& cs, int n) {
  return static_cast<uint8_t>(cs.sfb[SfbLaneFromIsa(n, cs.sel[3])] >> (8 * cs.sel[2]));
}

// Exact sum_k A B SF_A SF_B in double, and sum_k |A B SF_A SF_B| (for the hardware tolerance).
double BlockSum(const MmaCase& cs, int m, int n, double* abs_sum = nullptr) {
  const double scale = static_cast<double>(ue8m0_to_float(SelectedSfa(cs, m))) *
                       static_cast<double>(ue8m0_to_float(SelectedSfb(cs, n)));
  double sum = 0.0, sum_abs = 0.0;
  for (int k = 0; k < 32; ++k) {
    const double p = static_cast<double>(e4m3_to_float(cs.a[m][k])) *
                     static_cast<double>(e2m1_to_float(static_cast<uint8_t>(cs.b[k][n] >> 2)));
    sum += p;
    sum_abs += std::fabs(p);
  }
  if (abs_sum) *abs_sum = sum_abs * scale;
  return sum * scale;
}

float Reference(const MmaCase& cs, int m, int n, float c) {
  const float block = static_cast<float>(BlockSum(cs, m, n));  // the one rounding to fp32
  return block + c;                                            // fp32 add, nearest even
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
std::string Show(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", static_cast<double>(f), Bits(f));
  return buf;
}
bool SameResult(float got, float ref) {
  if (Bits(got) == kPoison) return false;  // never written
  if (std::isnan(ref)) return std::isnan(got);
  return got == ref;  // +0 == -0: the sign of a zero sum is not modelled
}

// Every element of every case against the reference; the first mismatch is named.
::testing::AssertionResult MatchesReference(const std::vector<MmaCase>& cases,
                                            const std::vector<float>& got) {
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < cases.size(); ++i)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        const float ref = Reference(cases[i], m, n, cases[i].c[m][n]);
        const float out = got[i * 128 + m * 8 + n];
        if (SameResult(out, ref)) continue;
        if (bad++ == 0) {
          const MmaCase& cs = cases[i];
          first = "case " + std::to_string(i) + " D[" + std::to_string(m) + "][" +
                  std::to_string(n) + "]: got " + Show(out) + ", ref " + Show(ref) + " (C " +
                  Show(cs.c[m][n]) + ", SF_A " + std::to_string(SelectedSfa(cs, m)) + ", SF_B " +
                  std::to_string(SelectedSfb(cs, n)) + ", selectors {" + std::to_string(cs.sel[0]) +
                  ", " + std::to_string(cs.sel[1]) + "} {" + std::to_string(cs.sel[2]) + ", " +
                  std::to_string(cs.sel[3]) + "})";
        }
      }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << cases.size() * 128
                                       << " elements differ; first: " << first;
}

// ---- kernels ---------------------------------------------------------------------------------
__device__ void LoadFragments(const MmaCase& cs, int lane, FragA& a, FragB& b, FragC& c, FragS& sfa,
                              FragS& sfb) {
  for (int r = 0; r < 4; ++r) {
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j)
      v |= static_cast<uint32_t>(cs.a[FragARow(lane, r)][FragACol(lane, r, j)]) << (8 * j);
    a[r] = v;
  }
  for (int r = 0; r < 2; ++r) {
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j)
      v |= static_cast<uint32_t>(cs.b[FragBRow(lane, r, j)][FragBCol(lane)]) << (8 * j);
    b[r] = v;
  }
  for (int i = 0; i < 4; ++i) c[i] = cs.c[FragCRow(lane, i)][FragCCol(lane, i)];
  sfa[0] = cs.sfa[lane];
  sfb[0] = cs.sfb[lane];
}

__device__ void StoreFragment(const FragC& d, int lane, float* out) {
  for (int i = 0; i < 4; ++i) out[FragCRow(lane, i) * 8 + FragCCol(lane, i)] = d[i];
}

// One warp per case; out is [case][16][8].
__global__ void ModelKernel(const MmaCase* cases, float* out) {
  const MmaCase& cs = cases[blockIdx.x];
  const int lane = threadIdx.x;
  FragA a;
  FragB b;
  FragC c, d;
  FragS sfa, sfb;
  LoadFragments(cs, lane, a, b, c, sfa, sfb);
  mma_mxf8f6f4_m16n8k32_model(d, a, b, c, sfa, cs.sel[0], cs.sel[1], sfb, cs.sel[2], cs.sel[3]);
  StoreFragment(d, lane, out + blockIdx.x * 128);
}

// kSteps MMAs into one accumulator (a K loop): C of the first case, then D <- A_s B_s + D.
template <int kSteps>
__global__ void ChainKernel(const MmaCase* cases, float* out) {
  const int lane = threadIdx.x;
  FragA a;
  FragB b;
  FragC c, acc;
  FragS sfa, sfb;
  for (int s = 0; s < kSteps; ++s) {
    const MmaCase& cs = cases[blockIdx.x * kSteps + s];
    LoadFragments(cs, lane, a, b, c, sfa, sfb);
    if (s == 0) acc = c;
    mma_mxf8f6f4_m16n8k32_model(acc, a, b, acc, sfa, cs.sel[0], cs.sel[1], sfb, cs.sel[2],
                                cs.sel[3]);  // d aliases c, as in a kernel's K loop
  }
  StoreFragment(acc, lane, out + blockIdx.x * 128);
}

// The function the kernels call, with compile-time selectors (the cases must carry the same).
template <int kByteIdA, int kThreadIdA, int kByteIdB, int kThreadIdB>
__global__ void DispatchKernel(const MmaCase* cases, float* out) {
  const MmaCase& cs = cases[blockIdx.x];
  const int lane = threadIdx.x;
  FragA a;
  FragB b;
  FragC c, d;
  FragS sfa, sfb;
  LoadFragments(cs, lane, a, b, c, sfa, sfb);
  mma_mxf8f6f4_m16n8k32<kByteIdA, kThreadIdA, kByteIdB, kThreadIdB>(d, a, b, c, sfa, sfb);
  StoreFragment(d, lane, out + blockIdx.x * 128);
}

__global__ void ContainersKernel(uint32_t* out) {
  const uint32_t x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x < 65536u) out[x] = E2m1x4ToContainers(x);
}

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Runs a kernel of one warp per block over the cases; out gets blocks * 128 floats.
template <class Launch>
void RunCases(const std::vector<MmaCase>& cases, int blocks, std::vector<float>& out, Launch launch) {
  MmaCase* dev_cases = nullptr;
  float* dev_out = nullptr;
  SM120_CUDA_OK(cudaMalloc(&dev_cases, cases.size() * sizeof(MmaCase)));
  SM120_CUDA_OK(cudaMalloc(&dev_out, static_cast<size_t>(blocks) * 128 * sizeof(float)));
  SM120_CUDA_OK(cudaMemcpy(dev_cases, cases.data(), cases.size() * sizeof(MmaCase),
                           cudaMemcpyHostToDevice));
  SM120_CUDA_OK(cudaMemset(dev_out, 0xFF, static_cast<size_t>(blocks) * 128 * sizeof(float)));
  launch(dev_cases, dev_out);
  SM120_CUDA_OK(cudaGetLastError());
  SM120_CUDA_OK(cudaDeviceSynchronize());
  out.resize(static_cast<size_t>(blocks) * 128);
  SM120_CUDA_OK(cudaMemcpy(out.data(), dev_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  SM120_CUDA_OK(cudaFree(dev_cases));
  SM120_CUDA_OK(cudaFree(dev_out));
}

void RunModel(const std::vector<MmaCase>& cases, std::vector<float>& out) {
  RunCases(cases, static_cast<int>(cases.size()), out, [&](const MmaCase* c, float* o) {
    ModelKernel<<<static_cast<unsigned>(cases.size()), 32>>>(c, o);
  });
}

#define SM120_REQUIRE_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

// ---- tests -----------------------------------------------------------------------------------

// The layout functions against the ISA's formulas, written out as the ISA states them (PTX ISA
// §9.7.14.5.10: a_i, b_i, c_i with i the element index, low to high), and each logical element
// covered exactly once.
TEST(Sm120MmaModel, LayoutFunctionsMatchIsaText) {
  int a_hits[16][32] = {}, b_hits[32][8] = {}, c_hits[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int group_id = lane >> 2, thread_in_group = lane % 4;
    for (int i = 0; i < 16; ++i) {
      const int row = (i < 4 || (i >= 8 && i < 12)) ? group_id : group_id + 8;
      const int col = thread_in_group * 4 + (i & 0x3) + (i >= 8 ? 16 : 0);
      EXPECT_EQ(FragARow(lane, i / 4), row) << "lane " << lane << " a" << i;
      EXPECT_EQ(FragACol(lane, i / 4, i % 4), col) << "lane " << lane << " a" << i;
      ++a_hits[FragARow(lane, i / 4)][FragACol(lane, i / 4, i % 4)];
    }
    for (int i = 0; i < 8; ++i) {
      const int row = thread_in_group * 4 + (i & 0x3) + (i >= 4 ? 16 : 0);
      EXPECT_EQ(FragBRow(lane, i / 4, i % 4), row) << "lane " << lane << " b" << i;
      EXPECT_EQ(FragBCol(lane), group_id) << "lane " << lane;
      ++b_hits[FragBRow(lane, i / 4, i % 4)][FragBCol(lane)];
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(FragCRow(lane, i), i < 2 ? group_id : group_id + 8) << "lane " << lane << " c" << i;
      EXPECT_EQ(FragCCol(lane, i), thread_in_group * 2 + (i & 0x1)) << "lane " << lane << " c" << i;
      ++c_hits[FragCRow(lane, i)][FragCCol(lane, i)];
    }
  }
  for (auto& row : a_hits)
    for (int h : row) EXPECT_EQ(h, 1);
  for (auto& row : b_hits)
    for (int h : row) EXPECT_EQ(h, 1);
  for (auto& row : c_hits)
    for (int h : row) EXPECT_EQ(h, 1);
  // Spot checks: lane 5 is group 1, thread 1.
  EXPECT_EQ(FragARow(5, 2), 1);
  EXPECT_EQ(FragACol(5, 2, 1), 21);
  EXPECT_EQ(FragARow(5, 3), 9);
  EXPECT_EQ(FragBRow(5, 1, 2), 22);
  // Scale lanes (PTX ISA §9.7.14.3): SF_A from the thread pair chosen by thread-id-a, SF_B from the
  // thread chosen by thread-id-b, 16 and 8 distinct lanes.
  for (int tid = 0; tid < 2; ++tid) {
    bool used[32] = {};
    for (int m = 0; m < 16; ++m) {
      const int lane = SfaLane(m, tid);
      EXPECT_EQ(lane, SfaLaneFromIsa(m, tid));
      EXPECT_EQ((lane % 4) / 2, tid) << "row " << m;
      EXPECT_EQ(lane / 4, m % 8) << "row " << m;
      EXPECT_FALSE(used[lane]);
      used[lane] = true;
    }
  }
  for (int tid = 0; tid < 4; ++tid)
    for (int n = 0; n < 8; ++n) {
      EXPECT_EQ(SfbLane(n, tid), SfbLaneFromIsa(n, tid));
      EXPECT_EQ(SfbLane(n, tid) % 4, tid);
      EXPECT_EQ(SfbLane(n, tid) / 4, n);
    }
  // e2m1 container: bits 5..2 (PTX ISA §9.7.14.5.14).
  EXPECT_EQ(E2m1Container(0xF), 0x3Cu);
  EXPECT_EQ(E2m1Container(0x1), 0x04u);
}

// Packed nibbles (two E2M1 per byte, element 2i low) to one B register, all 2^16 inputs.
TEST(Sm120MmaModel, E2m1PackedToContainers) {
  SM120_REQUIRE_GPU();
  uint32_t* dev = nullptr;
  SM120_CUDA_OK(cudaMalloc(&dev, 65536 * sizeof(uint32_t)));
  ContainersKernel<<<256, 256>>>(dev);
  SM120_CUDA_OK(cudaGetLastError());
  std::vector<uint32_t> got(65536);
  SM120_CUDA_OK(cudaMemcpy(got.data(), dev, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  SM120_CUDA_OK(cudaFree(dev));
  for (uint32_t x = 0; x < 65536; ++x) {
    uint32_t want = 0;
    for (int e = 0; e < 4; ++e) want |= E2m1Container((x >> (4 * e)) & 0xF) << (8 * e);
    ASSERT_EQ(got[x], want) << "packed 0x" << std::hex << x;
  }
}

// A single nonzero A element at each of the 512 positions, B all nonzero and random: row m of D
// must hold that element times row k of B, every other row C. Pins A's layout to the model's.
TEST(Sm120MmaModel, OneHotAEveryPosition) {
  SM120_REQUIRE_GPU();
  Rng rng(101);
  std::vector<MmaCase> cases;
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 32; ++k) {
      MmaCase cs = RandomCase(rng, /*zero_c=*/true);
      std::memset(cs.a, 0, sizeof(cs.a));
      cs.a[m][k] = RandomE4m3NonZero(rng);
      for (auto& row : cs.b)
        for (auto& v : row) v = RandomE2m1NonZero(rng);
      cases.push_back(cs);
    }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
  // Not vacuous: the hot row is nonzero in every column, the others zero.
  for (size_t i = 0; i < cases.size(); ++i)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n)
        ASSERT_EQ(got[i * 128 + m * 8 + n] != 0.0f, m == static_cast<int>(i) / 32)
            << "case " << i << " D[" << m << "][" << n << "]";
}

// A single nonzero B element at each of the 256 positions, A all nonzero.
TEST(Sm120MmaModel, OneHotBEveryPosition) {
  SM120_REQUIRE_GPU();
  Rng rng(102);
  std::vector<MmaCase> cases;
  for (int k = 0; k < 32; ++k)
    for (int n = 0; n < 8; ++n) {
      MmaCase cs = RandomCase(rng, /*zero_c=*/true);
      for (auto& row : cs.a)
        for (auto& v : row) v = RandomE4m3NonZero(rng);
      std::memset(cs.b, 0, sizeof(cs.b));
      cs.b[k][n] = RandomE2m1NonZero(rng);
      cases.push_back(cs);
    }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
  for (size_t i = 0; i < cases.size(); ++i)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n)
        ASSERT_EQ(got[i * 128 + m * 8 + n] != 0.0f, n == static_cast<int>(i) % 8)
            << "case " << i << " D[" << m << "][" << n << "]";
}

// One C element at a time, A and B zero: D must be C at the same position (C/D layout).
TEST(Sm120MmaModel, OneHotCEveryPosition) {
  SM120_REQUIRE_GPU();
  Rng rng(103);
  std::vector<MmaCase> cases;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      MmaCase cs = RandomCase(rng, /*zero_c=*/true);
      std::memset(cs.a, 0, sizeof(cs.a));
      cs.c[m][n] = 1.0f + static_cast<float>(m * 8 + n);
      cases.push_back(cs);
    }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
}

// Random codes (every finite e4m3 and e2m1 pattern, subnormals and signed zeros included),
// scales 2^-16 .. 2^16, random selectors, random C.
TEST(Sm120MmaModel, RandomData) {
  SM120_REQUIRE_GPU();
  Rng rng(104);
  std::vector<MmaCase> cases;
  for (int i = 0; i < 4096; ++i) cases.push_back(RandomCase(rng));
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
}

// Every selector combination of Table 37 (4 x 2 x 4 x 4), with junk (NaN scales too) in the bytes
// and lanes not selected: a wrong lane or byte gives a wrong scale or a NaN.
TEST(Sm120MmaModel, EverySelectorValue) {
  SM120_REQUIRE_GPU();
  Rng rng(105);
  std::vector<MmaCase> cases;
  for (int byte_a = 0; byte_a < 4; ++byte_a)
    for (int tid_a = 0; tid_a < 2; ++tid_a)
      for (int byte_b = 0; byte_b < 4; ++byte_b)
        for (int tid_b = 0; tid_b < 4; ++tid_b)
          for (int rep = 0; rep < 4; ++rep) {
            MmaCase cs = RandomCase(rng);
            cs.sel[0] = byte_a, cs.sel[1] = tid_a, cs.sel[2] = byte_b, cs.sel[3] = tid_b;
            RandomScales(cs, rng);
            cases.push_back(cs);
          }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
  size_t nans = 0;
  for (float f : got) nans += std::isnan(f);
  EXPECT_EQ(nans, 0u) << "a NaN scale from an unselected byte or lane leaked in";
}

// A NaN scale (0xFF) for one row of A or one column of B: exactly that row / column is NaN.
TEST(Sm120MmaModel, NanScale) {
  SM120_REQUIRE_GPU();
  Rng rng(106);
  std::vector<MmaCase> cases;
  for (int target = 0; target < 24; ++target) {  // rows 0..15, then columns 0..7
    MmaCase cs = RandomCase(rng);
    uint8_t sf_row[16], sf_col[8];
    RandomScaleValues(rng, sf_row, sf_col, 120, 134);
    (target < 16 ? sf_row[target] : sf_col[target - 16]) = 0xFF;
    FillJunkScales(cs.sfa, cs.sfb, rng);
    PutScales(cs.sfa, cs.sfb, cs.sel, sf_row, sf_col);
    cases.push_back(cs);
  }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
  for (int target = 0; target < 24; ++target)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n)
        ASSERT_EQ(std::isnan(got[target * 128 + m * 8 + n]), target < 16 ? m == target : n == target - 16)
            << "target " << target << " D[" << m << "][" << n << "]";
}

// An e4m3 NaN (0x7F or 0xFF) in row m of A: row m of D is NaN, even where B is zero.
TEST(Sm120MmaModel, E4m3Nan) {
  SM120_REQUIRE_GPU();
  Rng rng(107);
  std::vector<MmaCase> cases;
  for (int m = 0; m < 16; ++m)
    for (int sign = 0; sign < 2; ++sign) {
      MmaCase cs = RandomCase(rng);
      const int k = rng.Below(32);
      cs.a[m][k] = sign ? 0xFF : 0x7F;
      for (int n = 0; n < 8; ++n) cs.b[k][n] = 0;  // NaN * 0 is NaN
      cases.push_back(cs);
    }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
  for (size_t i = 0; i < cases.size(); ++i)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n)
        ASSERT_EQ(std::isnan(got[i * 128 + m * 8 + n]), m == static_cast<int>(i) / 2)
            << "case " << i << " D[" << m << "][" << n << "]";
}

// Subnormal e4m3 (exponent field 0) times +-0.5 (the e2m1 subnormal) at scale 1; then whole-range
// operands at scales whose block sums land under fp32's range (to zero), in its subnormal range
// (one rounding there, not two) and over it (to infinity).
TEST(Sm120MmaModel, SubnormalsAndRange) {
  SM120_REQUIRE_GPU();
  Rng rng(108);
  std::vector<MmaCase> cases;
  const int ranges[4][2] = {{127, 127}, {0, 24}, {50, 64}, {190, 254}};
  for (const auto& range : ranges)
    for (int rep = 0; rep < 64; ++rep) {
      const bool unit_scale = range[0] == 127;
      MmaCase cs = RandomCase(rng, /*zero_c=*/!unit_scale);
      if (unit_scale) {
        for (auto& row : cs.a)
          for (auto& v : row) v = static_cast<uint8_t>(rng.Bits() & 0x87u);
        for (auto& row : cs.b)
          for (auto& v : row) v = static_cast<uint8_t>(E2m1Container(rng.Below(2) ? 0x1 : 0x9));
      }
      RandomScales(cs, rng, range[0], range[1]);
      cases.push_back(cs);
    }
  std::vector<float> got;
  RunModel(cases, got);
  EXPECT_TRUE(MatchesReference(cases, got));
  size_t subnormal = 0, infinite = 0;
  for (float f : got) {
    subnormal += std::fpclassify(f) == FP_SUBNORMAL;
    infinite += std::isinf(f);
  }
  EXPECT_GT(subnormal, 0u) << "no fp32 subnormal results: the underflow cases test nothing";
  EXPECT_GT(infinite, 0u) << "no overflow to infinity: the large-scale cases test nothing";
}

// D <- A B + D four times into one accumulator, byte-id stepping 0..3 through the same scale
// registers (a kernel's K loop over 128 of K with one scale load), C random, infinite or NaN in a
// few places.
TEST(Sm120MmaModel, AccumulateIntoC) {
  SM120_REQUIRE_GPU();
  constexpr int kSteps = 4, kChains = 256;
  Rng rng(109);
  std::vector<MmaCase> cases;
  for (int chain = 0; chain < kChains; ++chain) {
    const int tid_a = rng.Below(2), tid_b = rng.Below(4);
    uint32_t sfa[32], sfb[32];
    FillJunkScales(sfa, sfb, rng);
    const size_t first = cases.size();
    for (int s = 0; s < kSteps; ++s) {
      MmaCase cs = RandomCase(rng);
      cs.sel[0] = s, cs.sel[1] = tid_a, cs.sel[2] = s, cs.sel[3] = tid_b;
      uint8_t sf_row[16], sf_col[8];
      RandomScaleValues(rng, sf_row, sf_col, 111, 143);
      PutScales(sfa, sfb, cs.sel, sf_row, sf_col);
      if (s == 0 && chain % 32 == 0) cs.c[rng.Below(16)][rng.Below(8)] = INFINITY;
      if (s == 0 && chain % 32 == 1) cs.c[rng.Below(16)][rng.Below(8)] = NAN;
      cases.push_back(cs);
    }
    for (int s = 0; s < kSteps; ++s) {  // one set of registers for the whole chain
      std::memcpy(cases[first + s].sfa, sfa, sizeof(sfa));
      std::memcpy(cases[first + s].sfb, sfb, sizeof(sfb));
    }
  }
  std::vector<float> got;
  RunCases(cases, kChains, got,
           [&](const MmaCase* c, float* o) { ChainKernel<kSteps><<<kChains, 32>>>(c, o); });
  size_t bad = 0, nans = 0;
  std::string first;
  for (int chain = 0; chain < kChains; ++chain)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        float ref = cases[chain * kSteps].c[m][n];
        for (int s = 0; s < kSteps; ++s) ref = Reference(cases[chain * kSteps + s], m, n, ref);
        const float out = got[chain * 128 + m * 8 + n];
        nans += std::isnan(out);
        if (SameResult(out, ref)) continue;
        if (bad++ == 0)
          first = "chain " + std::to_string(chain) + " D[" + std::to_string(m) + "][" +
                  std::to_string(n) + "]: got " + Show(out) + ", ref " + Show(ref);
      }
  EXPECT_EQ(bad, 0u) << first;
  EXPECT_EQ(nans, static_cast<size_t>(kChains / 32)) << "only the NaN placed in C may show";
}

// mma_mxf8f6f4_m16n8k32, the kernels' entry point, for a few selector sets. Here (sm_90a, emulation)
// it is the model and must match bit for bit; on SM120 hardware it is the instruction, which may
// sum in another order: allow 33 fp32 roundings of the terms' magnitudes there.
template <int kByteIdA, int kThreadIdA, int kByteIdB, int kThreadIdB>
void CheckDispatch(uint64_t seed) {
  Rng rng(seed);
  std::vector<MmaCase> cases;
  for (int i = 0; i < 256; ++i) {
    MmaCase cs = RandomCase(rng);
    cs.sel[0] = kByteIdA, cs.sel[1] = kThreadIdA, cs.sel[2] = kByteIdB, cs.sel[3] = kThreadIdB;
    RandomScales(cs, rng);
    cases.push_back(cs);
  }
  std::vector<float> got;
  RunCases(cases, static_cast<int>(cases.size()), got, [&](const MmaCase* c, float* o) {
    DispatchKernel<kByteIdA, kThreadIdA, kByteIdB, kThreadIdB><<<static_cast<unsigned>(cases.size()), 32>>>(c, o);
  });
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major != 12) {
    EXPECT_TRUE(MatchesReference(cases, got));
    return;
  }
  for (size_t i = 0; i < cases.size(); ++i)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double abs_sum = 0.0;
        BlockSum(cases[i], m, n, &abs_sum);
        const float ref = Reference(cases[i], m, n, cases[i].c[m][n]);
        const float out = got[i * 128 + m * 8 + n];
        const double allowed = 33.0 * std::ldexp(1.0, -24) * (abs_sum + std::fabs(cases[i].c[m][n]));
        ASSERT_TRUE(std::isnan(ref) ? std::isnan(out) : std::fabs(double(out) - double(ref)) <= allowed)
            << "case " << i << " D[" << m << "][" << n << "]: got " << Show(out) << ", ref " << Show(ref);
      }
}

TEST(Sm120MmaModel, DispatchFunction) {
  SM120_REQUIRE_GPU();
  CheckDispatch<0, 0, 0, 0>(110);
  CheckDispatch<1, 1, 2, 3>(111);
  CheckDispatch<3, 0, 1, 2>(112);
  CheckDispatch<2, 1, 3, 1>(113);
}

}  // namespace
}  // namespace mxmoe::cuda::sm120
