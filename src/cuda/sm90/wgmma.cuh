// PTX wrappers for Hopper's warpgroup MMA (wgmma), sm_90a only. Each exists because CUDA C++ has
// no spelling of the instruction. In any other compilation pass they compile to nothing, and the
// kernels that use them guard their bodies the same way (MXMOE_WGMMA_AVAILABLE).
//
// The form used is "RS": A (the dequantized weights) from registers, B (the tokens) from shared
// memory through a matrix descriptor. PTX ISA 9.7.15.5.1.1.1: for m64nNk16 with .bf16, warp w of
// the warpgroup supplies rows 16 w .. 16 w + 15 of A in four .bf16x2 registers per lane whose
// layout is that of mma.m16n8k16's A fragment, and receives the same rows of D in N/2 fp32
// registers laid out as N/8 consecutive mma.m16n8 C fragments (Figures 148, 149). So the weights'
// prepacked fragments (weight_layout.h) feed wgmma unchanged.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MXMOE_WGMMA_AVAILABLE 1
#else
#define MXMOE_WGMMA_AVAILABLE 0
#endif

namespace mxmoe::cuda::wgmma {

// Shared memory matrix descriptor (PTX ISA 9.7.15.5.1.2.2, "Matrix Descriptor Format"): start
// address >> 4 in bits 0..13, leading-dimension byte offset >> 4 in 16..29 (unused by swizzled
// K-major layouts, "assumed to be 1"), stride-dimension byte offset >> 4 in 32..45 (K-major: from
// one group of 8 rows to the next), base offset 0 in 49..51 (the tiles are 1024-byte aligned),
// swizzle mode in 62..63 (1 = 128-byte swizzle).
__device__ __forceinline__ uint64_t SmemDescK128(uint32_t addr, uint32_t stride_bytes) {
  uint64_t desc = (addr & 0x3FFFFu) >> 4;
  desc |= uint64_t{1} << 16;
  desc |= static_cast<uint64_t>((stride_bytes & 0x3FFFFu) >> 4) << 32;
  desc |= uint64_t{1} << 62;
  return desc;
}
// The descriptor of the same operand `bytes` further along K (within one 128-byte swizzle row:
// the hardware applies the swizzle to the address it forms, as for ldmatrix).
__device__ __forceinline__ uint64_t AdvanceDesc(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Orders this thread's earlier register writes (A fragments, zeroed accumulators) before the
// asynchronous MMAs that read them.
__device__ __forceinline__ void Fence() {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void Commit() {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void Wait() {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ---- mbarriers, bulk copies (TMA) and register reallocation, for the warp-specialized kernels --
// A shared-memory mbarrier expecting `count` arrivals per phase.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Makes initialized mbarriers visible to the other threads and to the copy engine.
__device__ __forceinline__ void FenceMbarInit() {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also announces `bytes` to be delivered by bulk copies in this phase.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Waits until the phase of parity `parity` has completed. Built with -DMXMOE_DEBUG_MBAR_TIMEOUT, a
// wait that lasts ~2^31 cycles (about a second) prints the barrier and traps instead of hanging.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if MXMOE_WGMMA_AVAILABLE && defined(MXMOE_DEBUG_MBAR_TIMEOUT)
  const long long start = clock64();
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
    if (clock64() - start > (1ll << 31)) {
      printf("mxmoe: mbarrier wait timed out: smem 0x%x parity %u, block %d thread %d\n", bar, parity,
             static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
      __trap();
    }
  }
#elif MXMOE_WGMMA_AVAILABLE
  asm volatile(
      "{\n.reg .pred done;\n"
      "MXMOE_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra MXMOE_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// `bytes` (a multiple of 16) from global to shared memory through the copy engine, completing on
// `bar` (PTX ISA, cp.async.bulk).
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}
// The box of a 2D tensor map at (column c0, row c1) to shared memory, completing on `bar`
// (PTX ISA, cp.async.bulk.tensor). The map's swizzle is applied on the way.
__device__ __forceinline__ void TensorLoad2d(uint32_t dst, const void* tensor_map, int32_t c0, int32_t c1,
                                             uint32_t bar) {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
// Moves registers between warpgroups (PTX ISA, setmaxnreg): the kernel's register cap at entry
// (__launch_bounds__ with the config's kCtasPerSm blocks) is the starting point.
template <int kRegs>
__device__ __forceinline__ void RegAlloc() {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void RegDealloc() {
#if MXMOE_WGMMA_AVAILABLE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMAs that own
// it (an empty asm that "reads and writes" the register).
template <int kN>
__device__ __forceinline__ void FenceOperand(float (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

// m64nNk16 with bf16 A from registers and B from shared memory (K-major), fp32 accumulators: one
// overload per tile width the kernels use (d[N / 8][4], the D fragment of PTX ISA 9.7.15.5.1.1.1).
// The scale-d predicate is 1 (accumulate); the immediates are scale-a = scale-b = 1 and tnspB = 0.
// The D operands of the macro below, one 8-column tile (4 registers) each.
#define MXMOE_WGMMA_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
// kTiles = N / 8; kDRegs "{%0, ..., %(4 kTiles - 1)}"; kRest "{A registers}, desc" and kPred the
// operand numbers after them; the variadic part: MXMOE_WGMMA_D(0), ..., MXMOE_WGMMA_D(kTiles - 1).
#define MXMOE_WGMMA_RS(kTiles, kShape, kDRegs, kRest, kPred, ...)                                   \
  __device__ __forceinline__ void WgmmaBf16Rs(float (&d)[kTiles][4], const uint32_t (&a)[4], \
                                              uint64_t desc_b) {                             \
    MXMOE_WGMMA_ASM(kShape, kDRegs, kRest, kPred, __VA_ARGS__)                               \
  }
#if MXMOE_WGMMA_AVAILABLE
#define MXMOE_WGMMA_ASM(kShape, kDRegs, kRest, kPred, ...)                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " kPred ", 0;\n"                          \
               "wgmma.mma_async.sync.aligned." kShape ".f32.bf16.bf16 " kDRegs ", " kRest \
               ", p, 1, 1, 0;\n}\n"                                                         \
               : __VA_ARGS__                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
#define MXMOE_WGMMA_ASM(...)
#endif
MXMOE_WGMMA_RS(1, "m64n8k16",
               "{%0, %1, %2, %3}",
               "{%4, %5, %6, %7}, %8", "%9",
               MXMOE_WGMMA_D(0))
MXMOE_WGMMA_RS(2, "m64n16k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7}",
               "{%8, %9, %10, %11}, %12", "%13",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1))
MXMOE_WGMMA_RS(3, "m64n24k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}",
               "{%12, %13, %14, %15}, %16", "%17",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2))
MXMOE_WGMMA_RS(4, "m64n32k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}",
               "{%16, %17, %18, %19}, %20", "%21",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3))
MXMOE_WGMMA_RS(5, "m64n40k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19}",
               "{%20, %21, %22, %23}, %24", "%25",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4))
MXMOE_WGMMA_RS(6, "m64n48k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23}",
               "{%24, %25, %26, %27}, %28", "%29",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5))
MXMOE_WGMMA_RS(7, "m64n56k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27}",
               "{%28, %29, %30, %31}, %32", "%33",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6))
MXMOE_WGMMA_RS(8, "m64n64k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}",
               "{%32, %33, %34, %35}, %36", "%37",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7))
MXMOE_WGMMA_RS(9, "m64n72k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35}",
               "{%36, %37, %38, %39}, %40", "%41",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8))
MXMOE_WGMMA_RS(10, "m64n80k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39}",
               "{%40, %41, %42, %43}, %44", "%45",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9))
MXMOE_WGMMA_RS(11, "m64n88k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43}",
               "{%44, %45, %46, %47}, %48", "%49",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9),
               MXMOE_WGMMA_D(10))
MXMOE_WGMMA_RS(12, "m64n96k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}",
               "{%48, %49, %50, %51}, %52", "%53",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9),
               MXMOE_WGMMA_D(10), MXMOE_WGMMA_D(11))
MXMOE_WGMMA_RS(13, "m64n104k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
               ", %48, %49, %50, %51}",
               "{%52, %53, %54, %55}, %56", "%57",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9),
               MXMOE_WGMMA_D(10), MXMOE_WGMMA_D(11), MXMOE_WGMMA_D(12))
MXMOE_WGMMA_RS(14, "m64n112k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
               ", %48, %49, %50, %51, %52, %53, %54, %55}",
               "{%56, %57, %58, %59}, %60", "%61",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9),
               MXMOE_WGMMA_D(10), MXMOE_WGMMA_D(11), MXMOE_WGMMA_D(12), MXMOE_WGMMA_D(13))
MXMOE_WGMMA_RS(15, "m64n120k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
               ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59}",
               "{%60, %61, %62, %63}, %64", "%65",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9),
               MXMOE_WGMMA_D(10), MXMOE_WGMMA_D(11), MXMOE_WGMMA_D(12), MXMOE_WGMMA_D(13), MXMOE_WGMMA_D(14))
MXMOE_WGMMA_RS(16, "m64n128k16",
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
               ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}",
               "{%64, %65, %66, %67}, %68", "%69",
               MXMOE_WGMMA_D(0), MXMOE_WGMMA_D(1), MXMOE_WGMMA_D(2), MXMOE_WGMMA_D(3), MXMOE_WGMMA_D(4),
               MXMOE_WGMMA_D(5), MXMOE_WGMMA_D(6), MXMOE_WGMMA_D(7), MXMOE_WGMMA_D(8), MXMOE_WGMMA_D(9),
               MXMOE_WGMMA_D(10), MXMOE_WGMMA_D(11), MXMOE_WGMMA_D(12), MXMOE_WGMMA_D(13),
               MXMOE_WGMMA_D(14), MXMOE_WGMMA_D(15))
#undef MXMOE_WGMMA_RS
#undef MXMOE_WGMMA_ASM
#undef MXMOE_WGMMA_D

}  // namespace mxmoe::cuda::wgmma
