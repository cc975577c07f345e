// See tensor_map.h. The encoder is a driver entry point, reached through the runtime so that the
// library does not link libcuda itself.
#include "cuda/sm90/tensor_map.h"

#include <cudaTypedefs.h>

namespace mxmoe::cuda::sm90 {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 Encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

cudaError_t MakeBf16RowMap(CUtensorMap* map, const uint16_t* base, int64_t cols, int64_t rows,
                           int64_t row_stride, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = Encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (cols <= 0 || rows <= 0 || box_rows <= 0 || box_rows > 256 || (row_stride * 2) % 16 != 0)
    return cudaErrorInvalidValue;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride * 2)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(base), dims, strides,
                            box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t MakeTokenMap(const GemmParams& p, int box_rows, CUtensorMap* map) {
  return MakeBf16RowMap(map, p.b, p.a_shape.cols, p.b_rows > 0 ? p.b_rows : 1, p.b_stride, box_rows);
}

}  // namespace mxmoe::cuda::sm90
