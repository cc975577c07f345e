// The device's hardware MXFP8 conversions (src/cuda/mx_device.cuh) against the software rules of
// mxmoe/formats.h that the CPU reference uses, bit for bit: float -> e4m3 for every one of the
// 2^32 fp32 inputs, e4m3 -> float for every code, the product by 2^-s against ldexpf for every
// scale exponent s on a stride through all fp32 inputs; and the FC1 epilogue's pieces: the scale
// exponent from amax's bits for every finite amax, and the packed quantize-dequantize-to-bf16 chain
// for every s on strides through all inputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/mx_device.cuh"
#include "gpu_harness.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda {
namespace {

struct Mismatches {
  unsigned long long count;
  uint32_t example_input;  // the input bits of one mismatch (whichever wrote last)
  int example_s;
};

__device__ bool IsNanBits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

__device__ void Record(Mismatches* out, uint32_t input, int s) {
  atomicAdd(&out->count, 1ull);
  out->example_input = input;
  out->example_s = s;
}

// Inputs [base, base + n) of the 2^32 bit patterns, one per thread and iteration.
__global__ void E4m3AllInputsKernel(uint64_t base, uint64_t n, Mismatches* out) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = static_cast<uint32_t>(base + i);
    const float f = __uint_as_float(u);
    const uint8_t hw = FloatToE4m3(f), sw = float_to_e4m3(f);
    // NaN: both NaN codes (the software rule keeps the sign, the hardware's sign is unspecified).
    const bool ok = IsNanBits(u) ? (hw & 0x7F) == 0x7F && (sw & 0x7F) == 0x7F : hw == sw;
    if (!ok) Record(out, u, 0);
  }
}

__global__ void E4m3DecodeKernel(Mismatches* out) {
  const uint8_t code = static_cast<uint8_t>(threadIdx.x);
  const uint32_t hw = __float_as_uint(E4m3ToFloat(code)), sw = __float_as_uint(e4m3_to_float(code));
  const bool ok = IsNanBits(sw) ? IsNanBits(hw) : hw == sw;
  if (!ok) Record(out, code, 0);
}

// For each s in [-127, 127] (blockIdx.y), inputs u = k * stride + offset over all of 2^32.
__global__ void Pow2ProductKernel(uint32_t stride, uint32_t offset, Mismatches* out) {
  const int s = static_cast<int>(blockIdx.y) - 127;
  const uint64_t count = (0x100000000ull - offset + stride - 1) / stride;
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = static_cast<uint32_t>(k * stride + offset);
    const float a = __uint_as_float(u);
    const uint32_t hw = __float_as_uint(a * Pow2(-s)), sw = __float_as_uint(ldexpf(a, -s));
    const bool ok = IsNanBits(sw) ? IsNanBits(hw) : hw == sw;
    // The whole chain too, where the reference's value is finite.
    const float chain_hw = QuantizeE4m3Units(a, s), chain_sw = e4m3_to_float(float_to_e4m3(ldexpf(a, -s)));
    const bool chain_ok = IsNanBits(__float_as_uint(chain_sw)) ? IsNanBits(__float_as_uint(chain_hw))
                                                                : __float_as_uint(chain_hw) == __float_as_uint(chain_sw);
    if (!ok || !chain_ok) Record(out, u, s);
  }
}

// The bit-level scale rule against mxfp8_scale_exponent for the non-negative finite inputs
// [base, base + n) (bit patterns below 0x7F800000).
__global__ void ScaleExponentKernel(uint64_t base, uint64_t n, Mismatches* out) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = static_cast<uint32_t>(base + i);
    const int hw = Mxfp8ScaleExponent(__uint_as_float(u)), sw = mxfp8_scale_exponent(__uint_as_float(u));
    if (hw != sw) Record(out, u, hw);
  }
}

// The FC1 epilogue's packed chain against the software rules, for each s in [-127, 127]
// (blockIdx.y): the pair (u, u ^ 0x80400001) for u = k * stride + offset over all of 2^32.
__global__ void DequantizedPairKernel(uint32_t stride, uint32_t offset, Mismatches* out) {
  const int s = static_cast<int>(blockIdx.y) - 127;
  const uint64_t count = (0x100000000ull - offset + stride - 1) / stride;
  const float scale = ue8m0_to_float(static_cast<uint8_t>(s + 127));
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = static_cast<uint32_t>(k * stride + offset);
    const float lo = __uint_as_float(u), hi = __uint_as_float(u ^ 0x80400001u);
    const uint32_t hw = DequantizedMxfp8PairBf16(lo, hi, s);
    const uint16_t sw_lo = float_to_bf16(e4m3_to_float(float_to_e4m3(ldexpf(lo, -s))) * scale);
    const uint16_t sw_hi = float_to_bf16(e4m3_to_float(float_to_e4m3(ldexpf(hi, -s))) * scale);
    const auto same = [](uint16_t a, uint16_t b) {
      const bool nan_a = (a & 0x7FFFu) > 0x7F80u, nan_b = (b & 0x7FFFu) > 0x7F80u;
      return nan_a || nan_b ? nan_a && nan_b : a == b;
    };
    if (!same(static_cast<uint16_t>(hw & 0xFFFFu), sw_lo) || !same(static_cast<uint16_t>(hw >> 16), sw_hi))
      Record(out, u, s);
  }
}

class MxDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    MXMOE_REQUIRE_SM90();
    ASSERT_EQ(cudaMalloc(&out_, sizeof(Mismatches)), cudaSuccess);
    ASSERT_EQ(cudaMemset(out_, 0, sizeof(Mismatches)), cudaSuccess);
  }
  void TearDown() override {
    if (out_ != nullptr) cudaFree(out_);
  }
  Mismatches Read() {
    Mismatches m{};
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&m, out_, sizeof(m), cudaMemcpyDeviceToHost), cudaSuccess);
    return m;
  }
  Mismatches* out_ = nullptr;
};

TEST_F(MxDevice, E4m3EncodeMatchesSoftwareForEveryFloat) {
  constexpr uint64_t kSlice = 1ull << 30;  // four launches, each well under a second
  for (uint64_t base = 0; base < (1ull << 32); base += kSlice) E4m3AllInputsKernel<<<1056, 256>>>(base, kSlice, out_);
  const Mismatches m = Read();
  EXPECT_EQ(m.count, 0u) << "e.g. input bits 0x" << std::hex << m.example_input;
}

TEST_F(MxDevice, E4m3DecodeMatchesSoftwareForEveryCode) {
  E4m3DecodeKernel<<<1, 256>>>(out_);
  const Mismatches m = Read();
  EXPECT_EQ(m.count, 0u) << "e.g. code 0x" << std::hex << m.example_input;
}

TEST_F(MxDevice, ScaledValueMatchesLdexpfForEveryScale) {
  // 255 scales x ~1.1 M inputs spread over every exponent and sign (two prime strides).
  Pow2ProductKernel<<<dim3(264, 255), 256>>>(4099, 7, out_);
  Pow2ProductKernel<<<dim3(264, 255), 256>>>(65537, 0, out_);
  const Mismatches m = Read();
  EXPECT_EQ(m.count, 0u) << "e.g. a bits 0x" << std::hex << m.example_input << std::dec << ", s " << m.example_s;
}

TEST_F(MxDevice, ScaleExponentMatchesSoftwareForEveryFiniteAmax) {
  constexpr uint64_t kSlice = 1ull << 30;
  for (uint64_t base = 0; base < 0x7F800000ull; base += kSlice)
    ScaleExponentKernel<<<1056, 256>>>(base, std::min<uint64_t>(kSlice, 0x7F800000ull - base), out_);
  const Mismatches m = Read();
  EXPECT_EQ(m.count, 0u) << "e.g. amax bits 0x" << std::hex << m.example_input << std::dec << " gave s "
                         << m.example_s;
}

TEST_F(MxDevice, DequantizedPairMatchesSoftwareForEveryScale) {
  // 255 scales x ~1.1 M pairs spread over every exponent and sign, NaN and infinity included.
  DequantizedPairKernel<<<dim3(264, 255), 256>>>(4099, 3, out_);
  DequantizedPairKernel<<<dim3(264, 255), 256>>>(65537, 1, out_);
  const Mismatches m = Read();
  EXPECT_EQ(m.count, 0u) << "e.g. lo bits 0x" << std::hex << m.example_input << std::dec << ", s " << m.example_s;
}

}  // namespace
}  // namespace mxmoe::cuda
