// Launch-side helpers shared by the grouped-GEMM launchers of both architectures.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace mxmoe::cuda {

// Lets a config's FC1 and FC2 kernels use `bytes` of dynamic shared memory (above 48 KB a kernel
// needs the opt-in).
template <class KernelFc1, class KernelFc2>
cudaError_t AllowDynamicSmem(KernelFc1 fc1, KernelFc2 fc2, int bytes) {
  cudaError_t e = cudaFuncSetAttribute(fc1, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(fc2, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// A 1D grid of `ctas` blocks; false (nothing to launch) for none, an error past gridDim.x's range.
inline cudaError_t GridOf(int64_t ctas, dim3* grid, bool* launch) {
  *launch = ctas > 0;
  if (ctas > INT_MAX) return cudaErrorInvalidConfiguration;
  *grid = dim3(static_cast<unsigned>(ctas > 0 ? ctas : 1));
  return cudaSuccess;
}

// Whether environment variable `name` is set to exactly `value` (read on every call: callers on
// hot paths cache it).
inline bool EnvFlagIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// A process-wide on/off switch, read once from environment variable `name` (1: on, 0: off, else
// `fallback`), which the tests may flip.
class EnvSwitch {
 public:
  EnvSwitch(const char* name, bool fallback)
      : on_(EnvFlagIs(name, "1") ? true : EnvFlagIs(name, "0") ? false : fallback) {}
  void Set(bool on) { on_.store(on, std::memory_order_relaxed); }
  bool Get() const { return on_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> on_;
};

// A process-wide integer setting, read once from environment variable `name`: a decimal in
// [lo, hi], else `fallback` (unset, or another value, which is reported once on stderr so that a
// mistyped A/B does not pass unnoticed). The tests may change it (Set clamps to [lo, hi]).
class EnvInt {
 public:
  EnvInt(const char* name, int lo, int hi, int fallback) : lo_(lo), hi_(hi), value_(fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    char* end = nullptr;
    const long parsed = std::strtol(v, &end, 10);
    if (*v != '\0' && *end == '\0' && parsed >= lo && parsed <= hi) {
      value_.store(static_cast<int>(parsed), std::memory_order_relaxed);
    } else {
      std::fprintf(stderr, "mxmoe: %s=%s ignored: expected an integer from %d to %d (using %d)\n", name, v, lo, hi,
                   fallback);
    }
  }
  void Set(int v) { value_.store(v < lo_ ? lo_ : v > hi_ ? hi_ : v, std::memory_order_relaxed); }
  int Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  int lo_, hi_;
  std::atomic<int> value_;
};

// Programmatic dependent launch (ptx.cuh, GridDependencyWait) by launch site: the kernel that
// launches with the attribute may start while the kernel before it in the stream still runs.
// MXMOE_PDL=1 turns every site on, MXMOE_PDL=0 every site off; MXMOE_PDL=<site>[+<site>...] only the
// sites named: route (the quantization, routing, gather and position kernels), fc1 (the FC1 GEMM,
// and n8f's one kernel), fc2 (the FC2 GEMM), combine. Another value is reported once on stderr and
// ignored. Without the variable (or with an ignored value), a call's sites are those its thread set
// (ScopedPdlDefault): the decode calls take kPdlDecodeSites, every other launch none.
enum class PdlSite : unsigned { kRoute = 1u, kFc1 = 2u, kFc2 = 4u, kCombine = 8u };
// The site of a GEMM kernel's launch.
constexpr PdlSite GemmPdlSite(bool fc1) { return fc1 ? PdlSite::kFc1 : PdlSite::kFc2; }
inline constexpr unsigned kPdlAllSites = static_cast<unsigned>(PdlSite::kRoute) | static_cast<unsigned>(PdlSite::kFc1) |
                                         static_cast<unsigned>(PdlSite::kFc2) |
                                         static_cast<unsigned>(PdlSite::kCombine);

// The sites a value of MXMOE_PDL names, as a mask of PdlSite; -1 for a value that is not "1", "0",
// empty or site names joined by '+' (not ',': the A/B script's lists split at commas).
inline int ParsePdlSites(const char* v) {
  if (v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0) return 0;
  if (std::strcmp(v, "1") == 0) return static_cast<int>(kPdlAllSites);
  static constexpr struct {
    const char* name;
    PdlSite site;
  } kNames[] = {
      {"route", PdlSite::kRoute}, {"fc1", PdlSite::kFc1}, {"fc2", PdlSite::kFc2}, {"combine", PdlSite::kCombine}};
  unsigned mask = 0;
  for (const char* p = v;;) {
    const char* end = std::strchr(p, '+');
    const size_t len = end != nullptr ? static_cast<size_t>(end - p) : std::strlen(p);
    bool known = false;
    for (const auto& n : kNames) {
      if (std::strlen(n.name) == len && std::strncmp(p, n.name, len) == 0) {
        mask |= static_cast<unsigned>(n.site);
        known = true;
      }
    }
    if (!known) return -1;
    if (end == nullptr) break;
    p = end + 1;
  }
  return static_cast<int>(mask);
}

// The decode calls' sites (at most kDecodeMaxPairs pairs; cuda_moe.cu): the edges into FC1 and into
// the combine. On an H100 they took 0.2-5% off 8 of the 9 decode rows of perf-log v23 (Kimi-K3,
// GPT-OSS-120B, DeepSeek-V3 at T = 1, 2, 8) and cost DeepSeek-V3 at T = 2 1.2% (2.4% on CUDA
// graphs). Every site at once was slower (v18, v23), most likely through the edge into FC2: a late
// trigger recovered most of that loss (v23; the FC2 site alone was not measured).
inline constexpr unsigned kPdlDecodeSites =
    static_cast<unsigned>(PdlSite::kFc1) | static_cast<unsigned>(PdlSite::kCombine);

// The sites of the launches this thread makes while MXMOE_PDL is unset or ignored (none outside a
// scope).
inline unsigned& PdlDefaultSites() {
  static thread_local unsigned sites = 0;
  return sites;
}

// Sets this thread's default sites for the scope's launches and restores the ones before it.
class ScopedPdlDefault {
 public:
  explicit ScopedPdlDefault(unsigned sites) : before_(PdlDefaultSites()) { PdlDefaultSites() = sites; }
  ~ScopedPdlDefault() { PdlDefaultSites() = before_; }
  ScopedPdlDefault(const ScopedPdlDefault&) = delete;
  ScopedPdlDefault& operator=(const ScopedPdlDefault&) = delete;

 private:
  unsigned before_;
};

// MXMOE_PDL's mask (read once), or -1 where it is unset or ignored.
inline int PdlSitesFromEnv() {
  static const int sites = [] {
    const char* v = std::getenv("MXMOE_PDL");
    if (v == nullptr) return -1;
    const int parsed = ParsePdlSites(v);
    if (parsed < 0)
      std::fprintf(stderr, "mxmoe: MXMOE_PDL=%s ignored: expected 1, 0 or sites from route+fc1+fc2+combine\n", v);
    return parsed;
  }();
  return sites;
}

inline bool PdlAt(PdlSite site) {
  const int from_env = PdlSitesFromEnv();
  const unsigned sites = from_env >= 0 ? static_cast<unsigned>(from_env) : PdlDefaultSites();
  return (sites & static_cast<unsigned>(site)) != 0;
}

// LaunchKernel in thread block clusters of `cluster_x` consecutive CTAs along x (grid.x a multiple
// of it; 1: no clusters).
template <class... Params, class... Args>
cudaError_t LaunchKernelInClusters(void (*kernel)(Params...), PdlSite site, dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (PdlAt(site)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attr;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when PdlAt(site): the
// kernel must call ptx::GridDependencyWait before it touches global memory. Works under stream
// capture (the graph gets a programmatic edge).
template <class... Params, class... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), PdlSite site, dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  return LaunchKernelInClusters(kernel, site, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

// CTAs of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory that fit one SM
// (the CUDA occupancy API; the kernel's shared memory limit must have been raised first).
// Negative: the API's error code, negated.
template <class... Params>
int ResidentCtas(void (*kernel)(Params...), int threads, size_t smem) {
  int ctas = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem);
  return e == cudaSuccess ? ctas : -static_cast<int>(e);
}

// The three entry points of one GEMM config, defined in the config's own translation unit (one
// config per unit, so that they compile in parallel) and declared by the dispatch file: LAUNCH,
// PREPARE and INFO name the kernel family's function templates, LABEL the config's name.
#define MXMOE_DEFINE_GEMM_CONFIG(NAME, CONFIG, LABEL, LAUNCH, PREPARE, INFO)                            \
  cudaError_t LaunchGemm##NAME(bool fc1, const GemmParams& p, int64_t grid_ctas, cudaStream_t stream) { \
    return LAUNCH<CONFIG>(fc1, p, grid_ctas, stream);                                                  \
  }                                                                                                    \
  cudaError_t PrepareGemm##NAME() { return PREPARE<CONFIG>(); }                                        \
  GemmConfigInfo Info##NAME() { return INFO<CONFIG>(LABEL); }

}  // namespace mxmoe::cuda
