// Tensor maps (TMA descriptors) for the token operand of the kernels fed by TMA (the wgmma ones and
// MoeGemmTmaKernel), made on the host per launch.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe_kernels.h"

namespace mxmoe::cuda::sm90 {

// A 2D map over bf16 rows: `rows` rows of `cols` valid elements, `row_stride` elements apart,
// read in boxes of 64 columns (128 bytes, one swizzle row) x box_rows rows, with the 128-byte
// swizzle wgmma's K-major operand uses; columns and rows outside the tensor read as zeros.
cudaError_t MakeBf16RowMap(CUtensorMap* map, const uint16_t* base, int64_t cols, int64_t rows,
                           int64_t row_stride, int box_rows);

// A map of a GEMM's token operand p.b (p.b_rows rows in sorted order; at least one, so that a call
// without pairs, whose grid exits at once, still gets a map) in boxes of box_rows rows.
cudaError_t MakeTokenMap(const GemmParams& p, int box_rows, CUtensorMap* map);

}  // namespace mxmoe::cuda::sm90
