// The unfused GPU reference: SPEC section 1 step by step with plain kernels, one thread per output
// element and fp32 sums in index order, reading each weight element on its own through the
// layout's scalar decode (PackedElement). It shares nothing with the fused path but the prepacked
// weights and the combine; it is checked against the CPU ReferenceMoe on small shapes and then
// checks the fused kernels on large ones.
#include "core/activation_math.h"
#include "cuda/moe_kernels.h"
#include "cuda/weight_layout.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda {

namespace {

constexpr int kThreads = 256;

__device__ bool LocalExpert(const ReferenceParams& p, int64_t pair, int64_t* local) {
  const int32_t id = p.topk_ids[pair];
  const int64_t l = static_cast<int64_t>(id) - p.first_expert;
  *local = l;
  return id >= 0 && l >= 0 && l < p.num_local;
}

// Local expert e's weights, one element dequantized, from whichever prepacked layout holds them:
// W1 (up = false) or W3 row i, column k; W2 row n, column i.
__device__ float W13At(const ReferenceParams& p, int64_t e, int64_t i, bool up, int64_t k, int shift) {
  if (p.sm120_layout) {
    const sm120::PackedShape& s = p.w13_sm120;
    return sm120::PackedElement(p.w13_tiles + e * s.CodeBytes(), p.w13_scales + e * s.ScaleBytes(), s,
                                sm120::Fc1PackedRow(i, up), k);
  }
  const int64_t row = (i / 8) * kTileRows + i % 8 + (up ? 8 : 0);  // gate and up interleaved by 8
  return PackedElement(p.w13_tiles + e * p.w13.Tiles() * kTileBytes, p.w13_scales + e * p.w13.Tiles() * kTileScaleBytes,
                       p.w13, shift, row, k);
}
__device__ float W2At(const ReferenceParams& p, int64_t e, int64_t n, int64_t i, int shift) {
  if (p.sm120_layout) {
    const sm120::PackedShape& s = p.w2_sm120;
    return sm120::PackedElement(p.w2_tiles + e * s.CodeBytes(), p.w2_scales + e * s.ScaleBytes(), s, n, i);
  }
  return PackedElement(p.w2_tiles + e * p.w2.Tiles() * kTileBytes, p.w2_scales + e * p.w2.Tiles() * kTileScaleBytes,
                       p.w2, shift, n, i);
}

// 1. xd = deq(mxfp8_quantize(x)), one thread per 32-block.
__global__ void RefQuantizeKernel(const ReferenceParams p) {
  const int64_t blocks_per_row = p.hidden / kMxBlock;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.num_tokens * blocks_per_row) return;
  const int64_t base = idx * kMxBlock;  // t * K + b * 32
  uint8_t codes[kMxBlock];
  uint8_t scale;
  if (p.x_bf16 != nullptr) {
    float v[kMxBlock];
    for (int i = 0; i < kMxBlock; ++i) v[i] = bf16_to_float(p.x_bf16[base + i]);
    scale = mxfp8_quantize_block(v, codes);
  } else {
    for (int i = 0; i < kMxBlock; ++i) codes[i] = p.x_e4m3[base + i];
    scale = p.x_scale[idx];
  }
  const float s = ue8m0_to_float(scale);
  for (int i = 0; i < kMxBlock; ++i) p.xd[base + i] = e4m3_to_float(codes[i]) * s;
}

// 2.-4. One block per (pair, 256 intermediate rows): g, u, act, then MXFP8 per 32 rows.
__global__ void RefFc1Kernel(const ReferenceParams p) {
  extern __shared__ float smem_x[];  // [K]
  __shared__ float smem_a[kThreads];
  const int64_t pair = blockIdx.x;
  int64_t e;
  if (!LocalExpert(p, pair, &e)) return;
  const int64_t t = pair / p.top_k;
  for (int64_t k = threadIdx.x; k < p.hidden; k += kThreads) smem_x[k] = p.xd[t * p.hidden + k];
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const ExpertParams ep = p.experts[e];
  float a = 0.0f;
  if (i < p.inter) {
    float g = 0.0f, u = 0.0f;
    for (int64_t k = 0; k < p.hidden; ++k) {
      g += smem_x[k] * W13At(p, e, i, false, k, ep.fc1_shift);
      u += smem_x[k] * W13At(p, e, i, true, k, ep.fc1_shift);
    }
    if (ep.has_gate_bias) g += p.gate_bias[e * p.inter + i];
    if (ep.has_up_bias) u += p.up_bias[e * p.inter + i];
    a = apply_activation(p.act, g, u, ep.act);
  }
  smem_a[threadIdx.x] = a;
  __syncthreads();
  // I is a multiple of 32: a warp's 32 rows are one MX block, all real or all past the end.
  const int64_t i0 = i - threadIdx.x % 32;
  if (threadIdx.x % 32 == 0 && i0 < p.inter) {
    uint8_t codes[kMxBlock];
    const float s = ue8m0_to_float(mxfp8_quantize_block(smem_a + threadIdx.x, codes));
    for (int j = 0; j < kMxBlock; ++j) p.hd[pair * p.inter + i0 + j] = e4m3_to_float(codes[j]) * s;
  }
}

// 5. y = topk_weight * (aq . W2^T), one thread per (pair, output row).
__global__ void RefFc2Kernel(const ReferenceParams p) {
  extern __shared__ float smem_h[];  // [I]
  const int64_t pair = blockIdx.x;
  int64_t e;
  if (!LocalExpert(p, pair, &e)) return;
  for (int64_t i = threadIdx.x; i < p.inter; i += kThreads) smem_h[i] = p.hd[pair * p.inter + i];
  __syncthreads();
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (n >= p.hidden) return;
  const int shift = p.experts[e].fc2_shift;
  float y = 0.0f;
  for (int64_t i = 0; i < p.inter; ++i) y += smem_h[i] * W2At(p, e, n, i, shift);
  p.y[pair * p.hidden + n] = p.topk_weights[pair] * y;
}

}  // namespace

cudaError_t LaunchReference(const ReferenceParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const int64_t pairs = p.num_tokens * p.top_k;
  const int64_t quant = p.num_tokens * (p.hidden / kMxBlock);
  RefQuantizeKernel<<<static_cast<unsigned>((quant + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const size_t smem1 = p.hidden * sizeof(float), smem2 = p.inter * sizeof(float);
  if (smem1 > 48 * 1024) {
    e = cudaFuncSetAttribute(RefFc1Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem1));
    if (e != cudaSuccess) return e;
  }
  if (smem2 > 48 * 1024) {
    e = cudaFuncSetAttribute(RefFc2Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem2));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid1(static_cast<unsigned>(pairs), static_cast<unsigned>((p.inter + kThreads - 1) / kThreads));
  RefFc1Kernel<<<grid1, kThreads, smem1, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 grid2(static_cast<unsigned>(pairs), static_cast<unsigned>((p.hidden + kThreads - 1) / kThreads));
  RefFc2Kernel<<<grid2, kThreads, smem2, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mxmoe::cuda
