// The one-time repack of the checkpoint's MXFP4 tensors (already staged on the device) into the
// SM120 layout (weight_layout_sm120.h). One thread writes one lane's 16 bytes of one n8 tile of
// one (group, k-tile) piece, and the lanes with t = 0 the column's four scale bytes.
#include "cuda/sm120/sm120_kernels.h"
#include "cuda/sm120/weight_layout_sm120.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda::sm120 {

namespace {

constexpr int kThreads = 256;
constexpr int kThreadsPerPiece = kGroupNTiles * 32;

template <bool kW13>
__global__ void __launch_bounds__(kThreads)
    RepackKernel(const ExpertSource* sources, int num, int64_t first_local, int64_t hidden, int64_t inter,
                 const PackedShape shape, uint8_t* codes_out, uint8_t* scales_out) {
  const int64_t per_expert = shape.Pieces() * kThreadsPerPiece;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= num * per_expert) return;
  const int64_t batch_idx = idx / per_expert, rem = idx % per_expert;
  const int64_t piece = rem / kThreadsPerPiece;
  const int j = static_cast<int>((rem % kThreadsPerPiece) / 32), lane = static_cast<int>(rem % 32);
  const int g = lane / 4, t = lane % 4;
  const int64_t group = piece / shape.k_tiles, kt = piece % shape.k_tiles;
  const ExpertSource src = sources[batch_idx];
  const int64_t cols = kW13 ? hidden : inter;

  // The MMA column this lane feeds is packed row 64 group + 8 j + g.
  const int64_t r = group * kGroupRows + 8 * j + g;
  const uint8_t* row_codes = nullptr;
  const uint8_t* row_scales = nullptr;
  if (kW13) {
    bool up;
    const int64_t i = Fc1Intermediate(r, &up);
    if (i < inter) {
      row_codes = (up ? src.w3_packed : src.w1_packed) + i * (cols / 2);
      row_scales = (up ? src.w3_scales : src.w1_scales) + i * (cols / kMxBlock);
    }
  } else if (r < hidden) {
    row_codes = src.w2_packed + r * (cols / 2);
    row_scales = src.w2_scales + r * (cols / kMxBlock);
  }
  auto code_at = [&](int64_t k) -> uint32_t {
    if (row_codes == nullptr || k >= cols) return 0;  // padding: zero codes
    return e2m1_unpack(row_codes, k);
  };

  uint32_t words[kKSteps];
  for (int s = 0; s < kKSteps; ++s) {
    uint32_t w = 0;
    for (int b = 0; b < 4; ++b) {
      const int64_t k = kt * kKTile + 32 * s + 4 * t + b;
      w |= (code_at(k) | (code_at(k + 16) << 4)) << (8 * b);
    }
    words[s] = w;
  }
  const int64_t out_piece = (first_local + batch_idx) * shape.Pieces() + piece;
  reinterpret_cast<uint4*>(codes_out + out_piece * kPieceBytes + LaneCodeOffset(j, lane))[0] =
      make_uint4(words[0], words[1], words[2], words[3]);
  if (t == 0) {
    uint32_t word = 0;
    for (int s = 0; s < kKSteps; ++s) {
      const int64_t block = kt * kKSteps + s;
      uint8_t scale = kPadScale;
      if (row_scales != nullptr && block * kMxBlock < cols) scale = row_scales[block];
      word |= static_cast<uint32_t>(scale) << (8 * s);
    }
    reinterpret_cast<uint32_t*>(scales_out + out_piece * kPieceScaleBytes + LaneScaleOffset(lane))[j] = word;
  }
}

}  // namespace

cudaError_t LaunchRepackExperts(const ExpertSource* sources_dev, int num, int64_t first_local, int64_t hidden,
                                int64_t inter, const PackedShape& w13, const PackedShape& w2, uint8_t* w13_codes,
                                uint8_t* w13_scales, uint8_t* w2_codes, uint8_t* w2_scales, cudaStream_t stream) {
  const int64_t threads13 = num * w13.Pieces() * kThreadsPerPiece, threads2 = num * w2.Pieces() * kThreadsPerPiece;
  if (threads13 > 0)
    RepackKernel<true><<<static_cast<unsigned>((threads13 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        sources_dev, num, first_local, hidden, inter, w13, w13_codes, w13_scales);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (threads2 > 0)
    RepackKernel<false><<<static_cast<unsigned>((threads2 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        sources_dev, num, first_local, hidden, inter, w2, w2_codes, w2_scales);
  return cudaGetLastError();
}

}  // namespace mxmoe::cuda::sm120
