// PTX wrappers the kernels use, each for an instruction CUDA C++ has no plain spelling of (or
// spells through layers that hide what is issued). All of them exist on sm_80 and later (the grid
// dependency pair, the cluster ones and the L2 prefetch on sm_90 and later), so the files compile
// for both sm_90a and sm_120a.
#pragma once

#include <cstdint>

namespace mxmoe::cuda::ptx {

// Programmatic dependent launch (PTX ISA, griddepcontrol): a kernel launched with
// LaunchKernel's PDL attribute may start while the kernel before it in the stream still runs.
// GridDependencyWait blocks until that kernel has completed and its writes are visible; every
// kernel of the MoE pipeline calls it before touching global memory (which, by induction, orders
// it after every earlier kernel too). LaunchDependents lets the next kernel's CTAs be placed once
// every CTA of this grid has issued it. Both are no-ops for a kernel launched without the attribute.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Both, at the top of a pipeline kernel.
__device__ __forceinline__ void EnterPipelineKernel() {
  GridDependencyWait();
  LaunchDependents();
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread block clusters (sm_90 and later; PTX ISA: %cluster_ctarank, barrier.cluster, mapa,
// ld.shared::cluster). ClusterSync: every thread of every CTA of the cluster arrives (release) and
// waits (acquire), so shared-memory writes before it are visible to the cluster's CTAs after it,
// and no CTA leaves while another may still read its shared memory.
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// The address of shared-window address `addr` in the shared memory of the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t MapSharedToRank(uint32_t addr, uint32_t rank) {
  uint32_t remote = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
#endif
  return remote;
}
// 16 bytes of four floats from a cluster shared-memory address (MapSharedToRank).
__device__ __forceinline__ float4 LdSharedCluster128(uint32_t addr) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}

// 16-byte global -> shared copy that bypasses L1 (.cg) and does not occupy registers, so many can
// be in flight per thread. src_bytes = 0 writes 16 zero bytes and reads nothing (PTX ISA, cp.async:
// the bytes past src-size are filled with zeros).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, uint32_t src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
// The same with a shared-memory address already in the shared window (no conversion per copy).
__device__ __forceinline__ void CpAsync16(uint32_t smem_addr, const void* gmem, uint32_t src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// Asks the L2 to fetch `bytes` (a multiple of 16) of global memory from `gmem` (16-byte aligned),
// with nothing written anywhere and nothing to wait for (PTX ISA, cp.async.bulk.prefetch.L2; sm_90
// and later, a no-op below): a hint that a later copy will read them, which then hits the L2.
__device__ __forceinline__ void PrefetchBulkL2(const void* gmem, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
#endif
}
// A word of global memory read with acquire / written with release semantics at GPU scope (PTX
// ISA, memory consistency model): the flags one CTA raises after its stores for CTAs on other SMs.
__device__ __forceinline__ int32_t LoadAcquireGpu(const int32_t* p) {
  int32_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
#endif
  return v;
}
// The same word read relaxed (no ordering: for polling, with one acquire read once it changed).
__device__ __forceinline__ int32_t LoadRelaxedGpu(const int32_t* p) {
  int32_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
#endif
  return v;
}
__device__ __forceinline__ void StoreReleaseGpu(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}
// *p += v as one atomic with acquire and release semantics at GPU scope; returns the old value.
__device__ __forceinline__ int32_t AtomicAddAcqRelGpu(int32_t* p, int32_t v) {
  int32_t old = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
#endif
  return old;
}
// *p += v with release semantics at GPU scope, no value returned (a counter others acquire).
__device__ __forceinline__ void RedAddReleaseGpu(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}
// The SM this thread runs on (PTX ISA, %smid).
__device__ __forceinline__ uint32_t SmId() {
  uint32_t id = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
#endif
  return id;
}
// The global nanosecond timer (PTX ISA, %globaltimer).
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
#endif
  return t;
}
// 16 bytes from shared memory at a shared-window address.
__device__ __forceinline__ uint4 LdShared128(uint32_t smem_addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_addr));
  return v;
}
__device__ __forceinline__ uint32_t LdShared32(uint32_t smem_addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr));
  return v;
}
// A barrier among `threads` threads (a multiple of 32) of the CTA, the others not taking part.
// Id 0 is __syncthreads' barrier.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8 and
// receives, of each matrix, row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 (PTX ISA,
// ldmatrix) -- exactly an mma.m16n8k16 B fragment register when the rows are the B columns.
__device__ __forceinline__ void LdMatrixX4(uint32_t r[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem_row)));
}

// D = A * B + D, bf16 inputs, fp32 accumulators (HMMA.16816.F32.BF16 in SASS).
// NOTE: on SM90 this is the legacy tensor-core path (wgmma is the full-rate one); it is used here
// because its per-warp fragments let the weights be dequantized in registers (SPEC section 6).
__device__ __forceinline__ void MmaBf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two bf16 products a * b in one instruction; a fused multiply-add with -0 adds nothing and keeps
// the sign of a zero product. NOTE: bf16 arithmetic has no flush-to-zero mode (PTX ISA,
// half-precision fma: .ftz is defined for .f16 only), so the E2M1 patterns that are bf16 subnormals
// (the 0.5 codes) are multiplied exactly.
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// Bytes j and j + 1 (j even) of v as bf16 exponent bits, byte j in the low half and j + 1 in the
// high: the bf16x2 value (2^(b_j - 127), 2^(b_j+1 - 127)). One PRMT and one shift for two scales,
// which MulBf16x2Half broadcasts.
template <int kByte>
__device__ __forceinline__ uint32_t ScalePairBf16x2(uint32_t v) {
  static_assert(kByte == 0 || kByte == 2);
  constexpr uint32_t kSelector = 0x4040u | ((kByte + 1) << 8) | kByte;  // [byte, 0, byte + 1, 0]
  return __byte_perm(v, 0u, kSelector) << 7;
}

// MulBf16x2 by the low (kHigh false) or high half of b in both halves: ptxas puts the broadcast on
// the multiplication's operand (HMUL2 ... R.H0_H0 / R.H1_H1), no instruction of its own (a PRMT
// broadcast stays a PRMT).
template <bool kHigh>
__device__ __forceinline__ uint32_t MulBf16x2Half(uint32_t a, uint32_t b) {
  uint32_t both;
  if constexpr (kHigh) {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\nmov.b32 %0, {h, h};\n}\n" : "=r"(both) : "r"(b));
  } else {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\nmov.b32 %0, {l, l};\n}\n" : "=r"(both) : "r"(b));
  }
  return MulBf16x2(a, both);
}

}  // namespace mxmoe::cuda::ptx
