// safetensors files: a strict memory-mapped reader and an atomic writer.
//
// Format: u64 little-endian header length N, N bytes of JSON header, then the data section. The
// header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the
// data section) and may hold "__metadata__", an object of string -> string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "mxmoe/status.h"

namespace mxmoe {

enum class DType : int32_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
};
inline constexpr DType kAllDTypes[] = {DType::kBool, DType::kU8,   DType::kI8,     DType::kU16,
                                       DType::kI16,  DType::kU32,  DType::kI32,    DType::kU64,
                                       DType::kI64,  DType::kF16,  DType::kBF16,   DType::kF32,
                                       DType::kF64,  DType::kF8E4M3, DType::kF8E5M2};

// The header spelling: "BOOL", "U8", ..., "F8_E4M3", "F8_E5M2".
const char* DTypeName(DType t);
// Exact (case-sensitive) header spelling.
std::optional<DType> DTypeFromName(std::string_view name);
size_t DTypeSize(DType t);

// "[3072, 112]"
std::string ShapeToString(const std::vector<int64_t>& shape);

// Header lengths above this are refused: real headers are far smaller, and the bound keeps a
// corrupt length from making us parse (or allocate for) gigabytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100u << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  // Into the read-only mapping, valid while the SafetensorsFile lives. Not aligned in general:
  // copy with memcpy rather than casting to a wider type.
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  uint64_t data_begin = 0;  // offset into the data section

  int64_t NumElements() const;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the whole header (every dtype, shape and offset, and that
  // no two tensors overlap). Tensor data pages are read only when touched.
  static Status Open(const std::string& path, std::unique_ptr<SafetensorsFile>* out);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Null when absent.
  const TensorInfo* Find(std::string_view name) const;
  // Tensor names, in data-offset order.
  std::vector<std::string> Names() const;
  size_t NumTensors() const { return tensors_.size(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t data_size() const { return data_size_; }

  // The tensor `name`, checked against dtype and shape: see ExpectTensor.
  Status Get(std::string_view name, DType dtype, const std::vector<int64_t>& shape,
             const TensorInfo** out) const;

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // the data section
  size_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;  // sorted by data offset
  std::unordered_map<std::string_view, size_t> by_name_;  // views into tensors_[i].name
  std::map<std::string, std::string> metadata_;
};

// Ok when `t` is a tensor of `dtype` and `shape`. Otherwise, naming the tensor and `file`:
//   "missing tensor 'topk_ids' in FILE"   (t == null)
//   "tensor 'x.weight_scale' in FILE: expected U8 [3072, 112], found U8 [3072, 111]"
Status ExpectTensor(const TensorInfo* t, std::string_view name, DType dtype,
                    const std::vector<int64_t>& shape, const std::string& file);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // nbytes bytes, little-endian elements
  size_t nbytes = 0;           // must equal DTypeSize(dtype) * numel(shape)
};

// Writes tensors in the given order, the header padded with spaces so that the data section
// starts 8-byte aligned. Through a temporary file renamed over `path`: a failure never leaves a
// partial file at `path`.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace mxmoe
