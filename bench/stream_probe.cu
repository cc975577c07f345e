// mxmoe_stream_probe: how fast the decode GEMMs' weight stream can be on this GPU, with the GEMM
// taken out. Each CTA reads what one decode CTA reads (a contiguous block of weight steps plus a
// step's scales from a second array) into a ring of shared-memory stages, optionally spinning a
// fixed number of cycles per step in place of the dequantization and the MMAs. Comparing its GB/s
// with the layer kernels' says whether a kernel's time goes to the stream's shape (CTA count,
// bytes in flight, copy instruction) or to the work between the copies (perf-log v11.3).
//   mxmoe_stream_probe [--reps N]
// Prints the command, then one row per configuration: copy mode, CTAs, steps, stages, spin cycles,
// µs, GB/s and % of the read roofline (SPEC section 6: 4.06 TB/s).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/probe_util.h"
#include "cuda/ptx.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kChunkA = 8192;  // one 64-wide step of a 256-row block (16 tiles of 512 bytes)
constexpr int kChunkS = 512;   // its scales
constexpr int kStageBytes = kChunkA + kChunkS;

struct ProbeParams {
  const uint8_t* a;
  const uint8_t* s;
  const int64_t* block_of_cta;  // per CTA: the weight block it reads (block b: bytes b * steps * kChunkA)
  int steps;
  int spin;  // cycles of busy work per step after the step's copy has landed
  unsigned* sink;
};

__device__ __forceinline__ void Spin(int cycles) {
  if (cycles <= 0) return;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Consumes a landed stage: each thread reads its 16 bytes of the A chunk (so the copy must have
// landed), then spins.
__device__ __forceinline__ unsigned Consume(const uint8_t* stage, int spin) {
  const uint4 v = *reinterpret_cast<const uint4*>(stage + threadIdx.x * 16);
  Spin(spin);
  return v.x ^ v.y ^ v.z ^ v.w;
}

// Every thread copies 16-byte pieces with cp.async, one commit group per stage (the n8 kernel's
// scheme: wait for the oldest stage, barrier, refill the stage freed one step earlier, consume).
template <int kStages>
__global__ void __launch_bounds__(kThreads) CpAsyncProbe(const ProbeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int64_t block = p.block_of_cta[blockIdx.x];
  const uint8_t* src_a = p.a + block * p.steps * kChunkA;
  const uint8_t* src_s = p.s + block * p.steps * kChunkS;
  auto load = [&](int stage, int step) {
    uint8_t* dst = smem + stage * kStageBytes;
#pragma unroll
    for (int i = 0; i < kChunkA / 16 / kThreads; ++i) {
      const int u = threadIdx.x + i * kThreads;
      mxmoe::cuda::ptx::CpAsync16(dst + u * 16, src_a + static_cast<int64_t>(step) * kChunkA + u * 16);
    }
    if (threadIdx.x < kChunkS / 16)
      mxmoe::cuda::ptx::CpAsync16(dst + kChunkA + threadIdx.x * 16,
                                  src_s + static_cast<int64_t>(step) * kChunkS + threadIdx.x * 16);
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < p.steps) load(s, s);
    mxmoe::cuda::ptx::CpAsyncCommit();
  }
  unsigned acc = 0;
  for (int step = 0; step < p.steps; ++step) {
    mxmoe::cuda::ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = step + kStages - 1;
    if (next < p.steps) load(next % kStages, next);
    mxmoe::cuda::ptx::CpAsyncCommit();
    acc ^= Consume(smem + (step % kStages) * kStageBytes, p.spin);
  }
  if (acc == 0x9E3779B9u) *p.sink = acc;  // keeps the reads; practically never true
}

// One thread issues a bulk copy per stage (A chunk and scales) onto the stage's mbarrier; every
// thread waits on it, consumes, and the stage is refilled once the whole CTA is past it.
template <int kStages>
__global__ void __launch_bounds__(kThreads) BulkProbe(const ProbeParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
  namespace wg = mxmoe::cuda::wgmma;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kStages];
  const int64_t block = p.block_of_cta[blockIdx.x];
  const uint8_t* src_a = p.a + block * p.steps * kChunkA;
  const uint8_t* src_s = p.s + block * p.steps * kChunkS;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) wg::MbarInit(mxmoe::cuda::ptx::SmemAddr(&full[s]), 1);
    wg::FenceMbarInit();
  }
  __syncthreads();
  auto load = [&](int stage, int step) {
    const uint32_t bar = mxmoe::cuda::ptx::SmemAddr(&full[stage]);
    const uint32_t dst = mxmoe::cuda::ptx::SmemAddr(smem + stage * kStageBytes);
    wg::MbarArriveExpectTx(bar, kStageBytes);
    wg::BulkLoad(dst, src_a + static_cast<int64_t>(step) * kChunkA, kChunkA, bar);
    wg::BulkLoad(dst + kChunkA, src_s + static_cast<int64_t>(step) * kChunkS, kChunkS, bar);
  };
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages && s < p.steps; ++s) load(s, s);
  unsigned acc = 0;
  for (int step = 0; step < p.steps; ++step) {
    const int stage = step % kStages;
    wg::MbarWait(mxmoe::cuda::ptx::SmemAddr(&full[stage]), (step / kStages) & 1);
    acc ^= Consume(smem + stage * kStageBytes, p.spin);
    __syncthreads();  // everyone is past the stage
    if (threadIdx.x == 0 && step + kStages < p.steps) load(stage, step + kStages);
  }
  if (acc == 0x9E3779B9u) *p.sink = acc;
#else
  __trap();  // SM90 only (the probe runs on the lent H200)
#endif
}

// The yardstick inside the probe: every thread streams 16-byte loads over one flat buffer.
__global__ void __launch_bounds__(512) FlatProbe(const uint4* a, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ldcs(a + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) acc ^= __ldcs(a + i).x;
  if (acc == 0x9E3779B9u) *sink = acc;
}

void Check(cudaError_t e, const char* what) { mxmoe::bench::CheckCuda("mxmoe_stream_probe", e, what); }
using mxmoe::bench::Median;

struct Shape {
  const char* name;
  int experts;           // experts touched per call
  int blocks_per_expert;  // CTAs per expert
  int steps;              // 64-wide steps per CTA
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: mxmoe_stream_probe [--reps N]\n");
      return 2;
    }
  }
  // Kimi-K3: 896 experts; FC1 6144 x 3584 (24 blocks of 56 steps), FC2 3584 x 3072 (14 of 48).
  constexpr int kExperts = 896;
  constexpr int64_t kExpertBytes = 24LL * 56 * kChunkA;  // FC1's blocks, the larger matrix
  const int64_t a_bytes = kExperts * kExpertBytes;
  const int64_t s_bytes = a_bytes / kChunkA * kChunkS;
  uint8_t *a = nullptr, *s = nullptr;
  unsigned* sink = nullptr;
  Check(cudaMalloc(&a, a_bytes), "allocating the weights");
  Check(cudaMalloc(&s, s_bytes), "allocating the scales");
  Check(cudaMalloc(&sink, sizeof(unsigned)), "allocating the sink");
  Check(cudaMemset(a, 0x11, a_bytes), "filling the weights");
  Check(cudaMemset(s, 0x22, s_bytes), "filling the scales");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");

  auto time_reps = [&](auto&& launch) {
    std::vector<float> ms;
    for (int r = -3; r < reps; ++r) {
      Check(cudaEventRecord(e0), "record");
      launch(r < 0 ? 0 : r);
      Check(cudaEventRecord(e1), "record");
      Check(cudaEventSynchronize(e1), "probe kernel");
      float t = 0;
      Check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
      if (r >= 0) ms.push_back(t);
    }
    return Median(ms) * 1e3f;  // µs
  };

  constexpr double kReadRoofGBs = 4060.0;
  std::printf("command: mxmoe_stream_probe --reps %d\n", reps);
  std::printf("%-8s %-12s %6s %6s %6s %6s %10s %8s %6s\n", "mode", "shape", "ctas", "steps", "stages", "spin", "us",
              "GB/s", "%read");
  {
    const int64_t n = 187LL * 1000 * 1000 / 16;
    const float us = time_reps([&](int r) {
      FlatProbe<<<132 * 8, 512>>>(reinterpret_cast<const uint4*>(a) + (r % 8) * n, n, sink);
    });
    const double gbs = n * 16 / us / 1e3;
    std::printf("%-8s %-12s %6d %6s %6s %6s %10.1f %8.0f %6.1f\n", "flat", "187MB", 132 * 8, "-", "-", "-", us, gbs,
                100.0 * gbs / kReadRoofGBs);
  }

  const Shape shapes[] = {
      {"fc1-t1", 16, 24, 56},
      {"fc2-t1", 16, 14, 48},
      {"fc1-t1-k2", 16, 48, 28},  // the FC1 call cut in two along K: twice the CTAs, half the steps
      {"fc2-t1-k2", 16, 28, 24},  // FC2 cut in two (n8c2's 448 CTAs): 3 against 5 stages (n8c2d)
  };
  std::mt19937 rng(12345);
  for (const Shape& shape : shapes) {
    const int ctas = shape.experts * shape.blocks_per_expert;
    const int64_t blocks_in_buffer = a_bytes / (static_cast<int64_t>(shape.steps) * kChunkA);
    const int64_t blocks_per_expert_in_buffer = blocks_in_buffer / kExperts;
    // Per rep, a fresh draw of distinct experts, so that no rep reads what the L2 still holds.
    std::vector<int64_t> host(static_cast<size_t>(reps) * ctas);
    for (int r = 0; r < reps; ++r) {
      std::vector<int> ex(kExperts);
      for (int e = 0; e < kExperts; ++e) ex[e] = e;
      std::shuffle(ex.begin(), ex.end(), rng);
      for (int c = 0; c < ctas; ++c)
        host[static_cast<size_t>(r) * ctas + c] =
            ex[c / shape.blocks_per_expert] * blocks_per_expert_in_buffer + c % shape.blocks_per_expert;
    }
    int64_t* dev = nullptr;
    Check(cudaMalloc(&dev, host.size() * sizeof(int64_t)), "allocating the block lists");
    Check(cudaMemcpy(dev, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice), "block lists");
    const double bytes = static_cast<double>(ctas) * shape.steps * kStageBytes;
    auto run = [&](const char* mode, auto kernel, int stages, int spin) {
      const int smem = stages * kStageBytes;
      Check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute");
      const float us = time_reps([&](int r) {
        ProbeParams p{a, s, dev + static_cast<int64_t>(r) * ctas, shape.steps, spin, sink};
        kernel<<<ctas, kThreads, smem>>>(p);
      });
      const double gbs = bytes / us / 1e3;
      std::printf("%-8s %-12s %6d %6d %6d %6d %10.1f %8.0f %6.1f\n", mode, shape.name, ctas, shape.steps, stages,
                  spin, us, gbs, 100.0 * gbs / kReadRoofGBs);
    };
    for (int spin : {0, 1000, 2000}) {
      run("cpasync", CpAsyncProbe<3>, 3, spin);
      run("cpasync", CpAsyncProbe<5>, 5, spin);
      run("cpasync", CpAsyncProbe<6>, 6, spin);
      run("bulk", BulkProbe<3>, 3, spin);
      run("bulk", BulkProbe<6>, 6, spin);
      run("bulk", BulkProbe<12>, 12, spin);
    }
    Check(cudaFree(dev), "free");
  }
  return 0;
}
