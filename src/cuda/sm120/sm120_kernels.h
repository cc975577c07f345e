// Host-callable launchers of the SM120 path (the kernels live beside this header): the weight
// repack into the SM120 layout (weight_layout_sm120.h) and the fused grouped GEMMs built on the
// block-scaled mma.sync (mma_mxf8f6f4.cuh). Raw pointers and a stream in, a cudaError_t out;
// cuda_moe.cu turns those into Status messages. Everything around the GEMMs (input quantization,
// routing sort, tile list, combine) is shared with the SM90 path (moe_kernels.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe_kernels.h"
#include "cuda/sm120/weight_layout_sm120.h"

namespace mxmoe::cuda::sm120 {

// ---- weight repacking (weight_prepack_sm120.cu) -----------------------------------------------
// Experts [first_local, first_local + num) from their staged checkpoint tensors.
cudaError_t LaunchRepackExperts(const ExpertSource* sources_dev, int num, int64_t first_local,
                                int64_t hidden, int64_t inter, const PackedShape& w13,
                                const PackedShape& w2, uint8_t* w13_codes, uint8_t* w13_scales,
                                uint8_t* w2_codes, uint8_t* w2_scales, cudaStream_t stream);

// ---- the fused grouped GEMMs (moe_gemm_sm120*.cu) ------------------------------------------------
// Orientation: MMA M is tokens (A = e4m3 activations with their UE8M0 scales), N is weight rows
// (B = the packed e2m1 weights with theirs), K the reduction. A CTA computes BLOCK_M token rows of
// one expert's segment (one entry of the routing's tile list) by BLOCK_N weight rows.
struct GemmParams {
  // A: e4m3 rows, a_stride bytes apart (a multiple of 128), and their UE8M0 scales, a_scale_stride
  // bytes apart (a_stride / 32). FC1: the quantized input per token; FC2: the intermediate per
  // sorted position. Columns at or past k_valid are read as zero.
  const uint8_t* a_codes = nullptr;
  const uint8_t* a_scales = nullptr;
  int64_t a_stride = 0;
  int64_t a_scale_stride = 0;
  int64_t k_valid = 0;
  // B: the packed weights of all local experts (expert e at e * CodeBytes() / e * ScaleBytes()).
  const uint8_t* b_codes = nullptr;
  const uint8_t* b_scales = nullptr;
  PackedShape b_shape;
  int32_t n_blocks = 0;  // CTAs along the weight rows: ceil(groups / warps along N)
  // Routing (routing.cu): pair ids grouped by expert, per-expert offsets, the tile list.
  const int32_t* sorted_pairs = nullptr;
  const int32_t* expert_offsets = nullptr;
  const int2* tiles = nullptr;  // (local expert, first position in its segment), BLOCK_M apart
  const int32_t* num_tiles = nullptr;
  int32_t top_k = 0;
  const ExpertParams* experts = nullptr;
  // FC1 epilogue: bias, activation, MXFP8 re-quantization into h (e4m3 codes + UE8M0 scales, in
  // the layout FC2 reads as A) at the sorted position.
  ActivationType act = ActivationType::Situ;
  const float* gate_bias = nullptr;  // [num_local, inter] or null
  const float* up_bias = nullptr;
  int64_t inter = 0;
  uint8_t* h_codes = nullptr;
  uint8_t* h_scales = nullptr;
  int64_t h_stride = 0;
  int64_t h_scale_stride = 0;
  // FC2 epilogue: y[pair, n] = topk_weight * (aq . W2^T), fp32, for the ordered combine.
  float* y = nullptr;
  int64_t y_stride = 0;
  const float* topk_weights = nullptr;
};

// The instantiations (moe_gemm_sm120.cuh lists their configs).
enum class GemmConfigId : int { kM16 = 0, kM64 = 1 };
inline constexpr int kNumGemmConfigs = 2;

struct GemmConfigInfo {
  const char* name;
  int block_m;  // tokens per CTA: the routing's tile size
  int block_n;  // weight rows per CTA
  int threads;
  int stages;
  int smem_bytes;  // dynamic shared memory per CTA
  int min_blocks;  // CTAs per SM the config is sized for
};
GemmConfigInfo GemmInfo(GemmConfigId id);
// Raises the dynamic shared memory limit of every SM120 GEMM kernel (once per device, at Create).
cudaError_t PrepareGemmKernels();
// grid_ctas = n_blocks * (upper bound of the tile count); CTAs past the real count exit at once.
cudaError_t LaunchGemm(GemmConfigId id, bool fc1, const GemmParams& p, int64_t grid_ctas,
                       cudaStream_t stream);
// The config for a chunk with about pairs_per_expert pairs per touched expert.
// MXMOE_SM120_CONFIG=m16|m64 forces one; MXMOE_DEBUG_HEURISTICS=1 prints the choice.
GemmConfigId ChooseGemmConfig(double pairs_per_expert);
// Makes every later ChooseGemmConfig pick `config` (-1: back to the choice above), for the tests
// that run each config. Process-wide; MXMOE_SM120_CONFIG sets it at the first choice.
void ForceGemmConfig(int config);

// Whether this build compiled the SM120 kernels for sm_90a with the software model of the MMA
// (MXMOE_SM120_EMULATION), so that an SM90 device can run them (MXMOE_CUDA_PATH=sm120).
bool EmulationBuilt();

// Row strides of the e4m3 activation operands: K (or I) padded to a whole k-tile, and its scales.
inline int64_t OperandStride(int64_t cols) { return RoundUpTo(cols, kKTile); }
inline int64_t OperandScaleStride(int64_t cols) { return OperandStride(cols) / kMxBlock; }

}  // namespace mxmoe::cuda::sm120
