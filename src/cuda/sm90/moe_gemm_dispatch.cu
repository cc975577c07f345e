// GemmConfigId -> the instantiation that serves it (the configs live in moe_gemm.cuh and
// moe_wgmma.cuh).
#include "cuda/moe_kernels.h"

#include <atomic>

#include "cuda/launch_util.cuh"

namespace mxmoe::cuda {

namespace sm90 {
#define MXMOE_DECLARE_CONFIG(NAME)                                                              \
  cudaError_t LaunchGemm##NAME(bool fc1, const GemmParams& p, int64_t grid, cudaStream_t stream); \
  cudaError_t PrepareGemm##NAME();                                                              \
  GemmConfigInfo Info##NAME();
MXMOE_DECLARE_CONFIG(N8)
MXMOE_DECLARE_CONFIG(N32)
MXMOE_DECLARE_CONFIG(N64)
MXMOE_DECLARE_CONFIG(Wg64)
MXMOE_DECLARE_CONFIG(Wg128)
MXMOE_DECLARE_CONFIG(Wg128d)
MXMOE_DECLARE_CONFIG(Wg128d8)
MXMOE_DECLARE_CONFIG(N8k2)
MXMOE_DECLARE_CONFIG(N8c2)
MXMOE_DECLARE_CONFIG(Wg32x2d)
MXMOE_DECLARE_CONFIG(Wg128d4x2)
MXMOE_DECLARE_CONFIG(Wg128d3x3)
MXMOE_DECLARE_CONFIG(N8c4)
MXMOE_DECLARE_CONFIG(Wg128h)
MXMOE_DECLARE_CONFIG(N32t)
MXMOE_DECLARE_CONFIG(N8t)
MXMOE_DECLARE_CONFIG(N8f)
MXMOE_DECLARE_CONFIG(N8c2d)
#undef MXMOE_DECLARE_CONFIG
}  // namespace sm90

GemmConfigInfo GemmInfo(GemmConfigId id) {
  switch (id) {
    case GemmConfigId::kN8: return sm90::InfoN8();
    case GemmConfigId::kN32: return sm90::InfoN32();
    case GemmConfigId::kN64: return sm90::InfoN64();
    case GemmConfigId::kWg64: return sm90::InfoWg64();
    case GemmConfigId::kWg128: return sm90::InfoWg128();
    case GemmConfigId::kWg128d: return sm90::InfoWg128d();
    case GemmConfigId::kWg128d8: return sm90::InfoWg128d8();
    case GemmConfigId::kN8k2: return sm90::InfoN8k2();
    case GemmConfigId::kN8c2: return sm90::InfoN8c2();
    case GemmConfigId::kWg32x2d: return sm90::InfoWg32x2d();
    case GemmConfigId::kWg128d4x2: return sm90::InfoWg128d4x2();
    case GemmConfigId::kWg128d3x3: return sm90::InfoWg128d3x3();
    case GemmConfigId::kN8c4: return sm90::InfoN8c4();
    case GemmConfigId::kWg128h: return sm90::InfoWg128h();
    case GemmConfigId::kN32t: return sm90::InfoN32t();
    case GemmConfigId::kN8t: return sm90::InfoN8t();
    case GemmConfigId::kN8f: return sm90::InfoN8f();
    case GemmConfigId::kN8c2d: return sm90::InfoN8c2d();
  }
  return sm90::InfoN8();
}

cudaError_t PrepareGemmKernels() {
  cudaError_t e = sm90::PrepareGemmN8();
  if (e == cudaSuccess) e = sm90::PrepareGemmN32();
  if (e == cudaSuccess) e = sm90::PrepareGemmN64();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg64();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg128();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg128d();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg128d8();
  if (e == cudaSuccess) e = sm90::PrepareGemmN8k2();
  if (e == cudaSuccess) e = sm90::PrepareGemmN8c2();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg32x2d();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg128d4x2();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg128d3x3();
  if (e == cudaSuccess) e = sm90::PrepareGemmN8c4();
  if (e == cudaSuccess) e = sm90::PrepareGemmWg128h();
  if (e == cudaSuccess) e = sm90::PrepareGemmN32t();
  if (e == cudaSuccess) e = sm90::PrepareGemmN8t();
  if (e == cudaSuccess) e = sm90::PrepareGemmN8f();
  if (e == cudaSuccess) e = sm90::PrepareGemmN8c2d();
  return e;
}

namespace {
std::atomic<int> persistent_cta_limit{0};
std::atomic<int64_t> capped_fc2_launches{0};
std::atomic<int64_t> folded_combines{0};
EnvSwitch& PersistentFc1() {
  static EnvSwitch on{"MXMOE_FC1_PERSISTENT", kPersistentFc1Default};
  return on;
}
EnvInt& L2AheadSetting() {
  static EnvInt steps{"MXMOE_L2_AHEAD", 0, kMaxL2Ahead, 0};
  return steps;
}
EnvInt& Fc2SmemSetting() {
  static EnvInt bytes{"MXMOE_FC2_SMEM", 0, kMaxFc2Smem, kDefaultFc2Smem};
  return bytes;
}
EnvInt& EarlyStepsSetting() {
  static EnvInt steps{"MXMOE_EARLY_STEPS", 0, kMaxEarlySteps, kDefaultEarlySteps};
  return steps;
}
EnvInt& Fc1PrefetchFc2Setting() {
  static EnvInt steps{"MXMOE_FC1_PREFETCH_FC2", kFc1PrefetchFc2ByRule, kMaxEarlySteps, kFc1PrefetchFc2ByRule};
  return steps;
}
EnvInt& Fc2CombineSetting() {
  static EnvInt tokens{"MXMOE_FC2_COMBINE", 0, kMaxFc2CombineTokens, kDefaultFc2CombineTokens};
  return tokens;
}
}  // namespace

void SetFc1PrefetchFc2(int steps) { Fc1PrefetchFc2Setting().Set(steps); }
int Fc1PrefetchFc2() { return Fc1PrefetchFc2Setting().Get(); }
int Fc1PrefetchFc2Steps(const GemmConfigInfo& fc1) {
  const int set = Fc1PrefetchFc2();
  if (set != kFc1PrefetchFc2ByRule) return set;
  return fc1.cluster_ctas >= kFc1PrefetchFc2MinClusterCtas ? kDefaultFc1PrefetchFc2 : 0;
}
void SetFc2CombineTokens(int tokens) { Fc2CombineSetting().Set(tokens); }
int Fc2CombineTokens() { return Fc2CombineSetting().Get(); }

void SetL2Ahead(int steps) { L2AheadSetting().Set(steps); }
int L2Ahead() { return L2AheadSetting().Get(); }
void SetEarlySteps(int steps) { EarlyStepsSetting().Set(steps); }
int EarlySteps() { return EarlyStepsSetting().Get(); }
int Fc2CapSmem() { return Fc2SmemSetting().Get(); }
void SetFc2CapSmem(int bytes) { Fc2SmemSetting().Set(bytes); }
void CountCappedFc2Launch() { capped_fc2_launches.fetch_add(1, std::memory_order_relaxed); }
int64_t CappedFc2Launches() { return capped_fc2_launches.load(std::memory_order_relaxed); }
void CountFoldedCombine() { folded_combines.fetch_add(1, std::memory_order_relaxed); }
int64_t FoldedCombines() { return folded_combines.load(std::memory_order_relaxed); }

void SetPersistentFc1(bool on) { PersistentFc1().Set(on); }
bool PersistentFc1Enabled() { return PersistentFc1().Get(); }

void LimitPersistentCtas(int ctas) { persistent_cta_limit.store(ctas > 0 ? ctas : 0, std::memory_order_relaxed); }
int PersistentCtaLimit() { return persistent_cta_limit.load(std::memory_order_relaxed); }

cudaError_t LaunchGemm(GemmConfigId id, bool fc1, const GemmParams& p, int64_t grid_ctas,
                       cudaStream_t stream) {
  switch (id) {
    case GemmConfigId::kN8: return sm90::LaunchGemmN8(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN32: return sm90::LaunchGemmN32(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN64: return sm90::LaunchGemmN64(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg64: return sm90::LaunchGemmWg64(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg128: return sm90::LaunchGemmWg128(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg128d: return sm90::LaunchGemmWg128d(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg128d8: return sm90::LaunchGemmWg128d8(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN8k2: return sm90::LaunchGemmN8k2(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN8c2: return sm90::LaunchGemmN8c2(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg32x2d: return sm90::LaunchGemmWg32x2d(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg128d4x2: return sm90::LaunchGemmWg128d4x2(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg128d3x3: return sm90::LaunchGemmWg128d3x3(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN8c4: return sm90::LaunchGemmN8c4(fc1, p, grid_ctas, stream);
    case GemmConfigId::kWg128h: return sm90::LaunchGemmWg128h(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN32t: return sm90::LaunchGemmN32t(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN8t: return sm90::LaunchGemmN8t(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN8f: return sm90::LaunchGemmN8f(fc1, p, grid_ctas, stream);
    case GemmConfigId::kN8c2d: return sm90::LaunchGemmN8c2d(fc1, p, grid_ctas, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace mxmoe::cuda
