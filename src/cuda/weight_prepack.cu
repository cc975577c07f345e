// The one-time repack of the checkpoint's MXFP4 tensors (already copied to the device) into the
// kernels' layout (weight_layout.h). One thread writes one lane's 16 bytes of one tile.
#include "cuda/moe_kernels.h"
#include "cuda/weight_layout.h"
#include "mxmoe/formats.h"

namespace mxmoe::cuda {

namespace {

constexpr int kThreads = 256;

struct SourceRow {
  const uint8_t* packed = nullptr;  // the row's bytes, or null for a padding row
  const uint8_t* scales = nullptr;
};

template <bool kW13>
__global__ void __launch_bounds__(kThreads)
    RepackKernel(const ExpertSource* sources, int num, int64_t first_local, int64_t hidden,
                 int64_t inter, const PackedShape shape, const ExpertParams* params,
                 uint8_t* tiles_out, uint8_t* scales_out) {
  const int64_t per_expert = shape.Tiles() * 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= num * per_expert) return;
  const int64_t batch_idx = idx / per_expert, rem = idx % per_expert;
  const int lane = static_cast<int>(rem % 32);
  const int64_t rg = (rem / 32) / shape.col_tiles, kt = (rem / 32) % shape.col_tiles;
  const int64_t local = first_local + batch_idx;
  const ExpertSource src = sources[batch_idx];
  const int shift = kW13 ? params[local].fc1_shift : params[local].fc2_shift;
  const int g = lane >> 2, c = lane & 3;
  const int64_t cols = kW13 ? hidden : inter;

  // The lane's two rows: g and g + 8 of the row group. W13: gate row 8 rg + g, up row 8 rg + g.
  SourceRow rows[2];
  for (int half = 0; half < 2; ++half) {
    int64_t r;
    const uint8_t *packed, *scales;
    bool valid;
    if (kW13) {
      r = rg * 8 + g;
      packed = half == 0 ? src.w1_packed : src.w3_packed;
      scales = half == 0 ? src.w1_scales : src.w3_scales;
      valid = r < inter;
    } else {
      r = rg * kTileRows + g + 8 * half;
      packed = src.w2_packed;
      scales = src.w2_scales;
      valid = r < hidden;
    }
    if (valid) {
      rows[half].packed = packed + r * (cols / 2);
      rows[half].scales = scales + r * (cols / kMxBlock);
    }
  }

  uint32_t words[4];
  for (int ks = 0; ks < 4; ++ks) {
    uint8_t codes[8];
    for (int reg = 0; reg < 4; ++reg) {
      const SourceRow& row = rows[reg & 1];  // regs 0, 2: row g; regs 1, 3: row g + 8
      const int64_t k = kt * kTileCols + ks * 16 + 2 * c + (reg >= 2 ? 8 : 0);
      uint8_t byte = 0;
      // A block whose scale is NaN gets zero codes: 0 * inf = NaN for every element.
      if (row.packed != nullptr && k < cols && row.scales[k / kMxBlock] != kUe8m0Nan)
        byte = row.packed[k / 2];
      codes[2 * reg] = byte & 0xF;  // element k (low nibble), then k + 1
      codes[2 * reg + 1] = byte >> 4;
    }
    words[ks] = EncodeWord(codes);
  }
  const int64_t tile = local * shape.Tiles() + shape.TileIndex(rg, kt);
  reinterpret_cast<uint4*>(tiles_out + tile * kTileBytes)[lane] =
      make_uint4(words[0], words[1], words[2], words[3]);
  if (c == 0) {
    uint32_t word = 0;
    for (int j = 0; j < 4; ++j) {  // (row g, block 0), (g + 8, 0), (g, 1), (g + 8, 1)
      const SourceRow& row = rows[j & 1];
      const int64_t block = kt * 2 + j / 2;
      uint8_t stored = 127;  // padding: finite, its codes are zero
      if (row.packed != nullptr && block * kMxBlock < cols) stored = StoredScale(row.scales[block], shift);
      word |= static_cast<uint32_t>(stored) << (8 * j);
    }
    reinterpret_cast<uint32_t*>(scales_out + tile * kTileScaleBytes)[g] = word;
  }
}

}  // namespace

cudaError_t LaunchRepackExperts(const ExpertSource* sources_dev, int num, int64_t first_local,
                                int64_t hidden, int64_t inter, const PackedShape& w13,
                                const PackedShape& w2, const ExpertParams* params_dev,
                                uint8_t* w13_tiles, uint8_t* w13_scales, uint8_t* w2_tiles,
                                uint8_t* w2_scales, cudaStream_t stream) {
  const int64_t threads13 = num * w13.Tiles() * 32, threads2 = num * w2.Tiles() * 32;
  RepackKernel<true><<<static_cast<unsigned>((threads13 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      sources_dev, num, first_local, hidden, inter, w13, params_dev, w13_tiles, w13_scales);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  RepackKernel<false><<<static_cast<unsigned>((threads2 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      sources_dev, num, first_local, hidden, inter, w2, params_dev, w2_tiles, w2_scales);
  return cudaGetLastError();
}

}  // namespace mxmoe::cuda
