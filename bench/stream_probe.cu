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
  const int64_t* chunk_of_cta;  // per CTA: its first step's chunk (bytes chunk * kChunkA of a, * kChunkS of s)
  const int32_t* steps_of_cta;  // per CTA: its steps
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
  const int64_t chunk = p.chunk_of_cta[blockIdx.x];
  const int steps = p.steps_of_cta[blockIdx.x];
  const uint8_t* src_a = p.a + chunk * kChunkA;
  const uint8_t* src_s = p.s + chunk * kChunkS;
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
    if (s < steps) load(s, s);
    mxmoe::cuda::ptx::CpAsyncCommit();
  }
  unsigned acc = 0;
  for (int step = 0; step < steps; ++step) {
    mxmoe::cuda::ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = step + kStages - 1;
    if (next < steps) load(next % kStages, next);
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
  const int64_t chunk = p.chunk_of_cta[blockIdx.x];
  const int steps = p.steps_of_cta[blockIdx.x];
  const uint8_t* src_a = p.a + chunk * kChunkA;
  const uint8_t* src_s = p.s + chunk * kChunkS;
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
    for (int s = 0; s < kStages && s < steps; ++s) load(s, s);
  unsigned acc = 0;
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    wg::MbarWait(mxmoe::cuda::ptx::SmemAddr(&full[stage]), (step / kStages) & 1);
    acc ^= Consume(smem + stage * kStageBytes, p.spin);
    __syncthreads();  // everyone is past the stage
    if (threadIdx.x == 0 && step + kStages < steps) load(stage, step + kStages);
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

// A stream of one call: parts of experts x blocks, each block a CTA reading `steps` consecutive
// steps. The parts of a shape run in one launch, or one launch each back to back (`separate`).
struct Part {
  int experts;            // experts touched per call
  int blocks_per_expert;  // CTAs per expert
  int steps;              // 64-wide steps per CTA
};
struct Shape {
  const char* name;
  std::vector<Part> parts;
  bool separate = false;
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
  for (const int mb : {187, 281}) {  // FC1's bytes at T = 1, and the whole layer's
    const int64_t n = mb * 1000LL * 1000 / 16;
    const float us = time_reps([&](int r) {
      FlatProbe<<<132 * 8, 512>>>(reinterpret_cast<const uint4*>(a) + (r % 8) * n, n, sink);
    });
    const double gbs = n * 16 / us / 1e3;
    const std::string name = std::to_string(mb) + "MB";
    std::printf("%-8s %-12s %6d %6s %6s %6s %10.1f %8.0f %6.1f\n", "flat", name.c_str(), 132 * 8, "-", "-", "-", us,
                gbs, 100.0 * gbs / kReadRoofGBs);
  }

  // A T = 1 layer streams FC1's and then FC2's weights of its 16 experts (281 MB). "layer-t1": both
  // cut as n8c2 cuts them (FC1 768 CTAs of 28 steps, FC2 448 of 24), in one launch, as if FC2 did
  // not wait for FC1 (what a kernel with these CTA shapes could at best stream); "layer-t1-2l": the
  // same as two launches back to back, as the layer's FC1 and FC2 kernels run (perf-log v31).
  const Part fc1_k2{16, 48, 28}, fc2_k2{16, 28, 24};
  const Shape shapes[] = {
      {"fc1-t1", {{16, 24, 56}}},               // FC1 at T = 1: a CTA per 256-row block over the whole reduction
      {"fc2-t1", {{16, 14, 48}}},               // FC2 likewise
      {"fc1-t1-k2", {fc1_k2}},                  // the FC1 call cut in two along K: twice the CTAs, half the steps
      {"fc2-t1-k2", {fc2_k2}},                  // FC2 cut in two (n8c2's 448 CTAs): 3 against 5 stages (n8c2d)
      {"layer-t1", {fc1_k2, fc2_k2}},           // both GEMMs' streams in one launch
      {"layer-t1-2l", {fc1_k2, fc2_k2}, true},  // ... and in two
  };
  constexpr int64_t kChunksPerExpert = kExpertBytes / kChunkA;
  std::mt19937 rng(12345);
  for (const Shape& shape : shapes) {
    // The grids of the shape's launches: each part's, or all parts' CTAs in one.
    std::vector<int> grids;
    double bytes = 0;
    for (const Part& part : shape.parts) {
      grids.push_back(part.experts * part.blocks_per_expert);
      bytes += static_cast<double>(grids.back()) * part.steps * kStageBytes;
    }
    int ctas = 0;
    for (int g : grids) ctas += g;
    if (!shape.separate) grids.assign(1, ctas);
    // Per rep, a fresh draw of distinct experts (each part its own), so that no rep reads what the L2
    // still holds; CTA c of a part reads block c % blocks_per_expert of its expert's region.
    std::vector<int64_t> chunks(static_cast<size_t>(reps) * ctas);
    std::vector<int32_t> steps(chunks.size());
    for (int r = 0; r < reps; ++r) {
      std::vector<int> ex(kExperts);
      for (int e = 0; e < kExperts; ++e) ex[e] = e;
      std::shuffle(ex.begin(), ex.end(), rng);
      size_t c = static_cast<size_t>(r) * ctas;
      int first_expert = 0;
      for (const Part& part : shape.parts) {
        for (int b = 0; b < part.experts * part.blocks_per_expert; ++b, ++c) {
          chunks[c] = ex[first_expert + b / part.blocks_per_expert] * kChunksPerExpert +
                      static_cast<int64_t>(b % part.blocks_per_expert) * part.steps;
          steps[c] = part.steps;
        }
        first_expert += part.experts;
      }
    }
    int64_t* dev_chunks = nullptr;
    int32_t* dev_steps = nullptr;
    Check(cudaMalloc(&dev_chunks, chunks.size() * sizeof(int64_t)), "allocating the chunk lists");
    Check(cudaMalloc(&dev_steps, steps.size() * sizeof(int32_t)), "allocating the step lists");
    Check(cudaMemcpy(dev_chunks, chunks.data(), chunks.size() * sizeof(int64_t), cudaMemcpyHostToDevice), "chunks");
    Check(cudaMemcpy(dev_steps, steps.data(), steps.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "steps");
    auto run = [&](const char* mode, auto kernel, int stages, int spin) {
      const int smem = stages * kStageBytes;
      Check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute");
      const float us = time_reps([&](int r) {
        int64_t offset = static_cast<int64_t>(r) * ctas;
        for (int n : grids) {
          kernel<<<n, kThreads, smem>>>(ProbeParams{a, s, dev_chunks + offset, dev_steps + offset, spin, sink});
          offset += n;
        }
      });
      const double gbs = bytes / us / 1e3;
      const std::string steps_col = shape.parts.size() == 1 ? std::to_string(shape.parts[0].steps) : "-";
      std::printf("%-8s %-12s %6d %6s %6d %6d %10.1f %8.0f %6.1f\n", mode, shape.name, ctas, steps_col.c_str(), stages,
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
    Check(cudaFree(dev_chunks), "free");
    Check(cudaFree(dev_steps), "free");
  }
  return 0;
}
