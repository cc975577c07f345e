#include "mxmoe/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "io/file_util.h"
#include "mxmoe/json.h"

namespace mxmoe {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; tensors are handed out without byte swapping");

namespace {

struct DTypeEntry {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypeTable[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},         {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},   {DType::kI16, "I16", 2},       {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},   {DType::kU64, "U64", 8},       {DType::kI64, "I64", 8},
    {DType::kF16, "F16", 2},   {DType::kBF16, "BF16", 2},     {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},   {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};

std::string Str(uint64_t v) { return std::to_string(v); }

// The product of `shape`, or false on overflow of int64.
bool CheckedNumel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

}  // namespace

const char* DTypeName(DType t) {
  for (const auto& e : kDTypeTable)
    if (e.type == t) return e.name;
  return "INVALID";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& e : kDTypeTable)
    if (name == e.name) return e.type;
  return std::nullopt;
}

size_t DTypeSize(DType t) {
  for (const auto& e : kDTypeTable)
    if (e.type == t) return e.size;
  return 0;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t TensorInfo::NumElements() const {
  int64_t n = 0;
  return CheckedNumel(shape, &n) ? n : -1;
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

Status SafetensorsFile::Open(const std::string& path, std::unique_ptr<SafetensorsFile>* out) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Io(path + ": cannot open: " + io::ErrnoMessage(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Io(path + ": not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Status::Io(path + ": " + Str(size) +
                      " bytes, too short for a safetensors file (at least the 8-byte header length)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return Status::Io(path + ": mmap failed: " + io::ErrnoMessage(map_err));
  f->map_ = map;
  f->map_size_ = size;
  MXMOE_RETURN_IF_ERROR(f->Parse());
  *out = std::move(f);
  return Status::Ok();
}

Status SafetensorsFile::Parse() {
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kSafetensorsMaxHeaderBytes)
    return Status::Io(path_ + ": header length " + Str(header_len) + " exceeds the limit of " +
                      Str(kSafetensorsMaxHeaderBytes) + " bytes (corrupt or not a safetensors file)");
  if (header_len > map_size_ - 8)
    return Status::Io(path_ + ": header length " + Str(header_len) + " exceeds the " +
                      Str(map_size_ - 8) + " bytes after the length field (file truncated?)");
  data_ = bytes + 8 + header_len;
  data_size_ = map_size_ - 8 - header_len;

  const std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  JsonValue root;
  Status st = ParseJson(header, &root);
  if (!st.ok()) return Status::Io(path_ + ": header is not valid JSON (offsets from the header start): " + st.message());
  if (!root.is_object())
    return Status::Io(path_ + ": header is a JSON " + JsonTypeName(root.type()) + ", expected an object");

  for (const auto& [key, value] : root.AsObject()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        return Status::Io(path_ + ": __metadata__ is a " + JsonTypeName(value.type()) + ", expected an object");
      for (const auto& [mk, mv] : value.AsObject()) {
        if (!mv.is_string())
          return Status::Io(path_ + ": __metadata__ entry '" + mk + "' is a " + JsonTypeName(mv.type()) +
                            ", expected a string");
        metadata_[mk] = mv.AsString();
      }
      continue;
    }
    const std::string who = path_ + ": tensor '" + key + "'";
    if (!value.is_object())
      return Status::Io(who + " is a JSON " + JsonTypeName(value.type()) + ", expected an object");
    for (const auto& member : value.AsObject()) {
      const std::string& k = member.first;
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        return Status::Io(who + ": unknown field '" + k + "' (expected dtype, shape, data_offsets)");
    }
    TensorInfo t;
    t.name = key;

    const JsonValue* dtype = value.Find("dtype");
    if (dtype == nullptr) return Status::Io(who + ": missing field 'dtype'");
    if (!dtype->is_string()) return Status::Io(who + ": dtype is a " + JsonTypeName(dtype->type()) + ", expected a string");
    const auto dt = DTypeFromName(dtype->AsString());
    if (!dt) return Status::Io(who + ": unknown dtype '" + dtype->AsString() + "'");
    t.dtype = *dt;

    const JsonValue* shape = value.Find("shape");
    if (shape == nullptr) return Status::Io(who + ": missing field 'shape'");
    if (!shape->is_array()) return Status::Io(who + ": shape is a " + JsonTypeName(shape->type()) + ", expected an array");
    for (const JsonValue& d : shape->AsArray()) {
      if (!d.is_integer() || d.AsInt() < 0)
        return Status::Io(who + ": shape holds a value that is not a non-negative integer");
      t.shape.push_back(d.AsInt());
    }
    int64_t numel = 0;
    uint64_t nbytes = 0;
    if (!CheckedNumel(t.shape, &numel) ||
        __builtin_mul_overflow(static_cast<uint64_t>(numel), DTypeSize(t.dtype), &nbytes))
      return Status::Io(who + ": shape " + ShapeToString(t.shape) + " overflows 64-bit size");

    const JsonValue* offsets = value.Find("data_offsets");
    if (offsets == nullptr) return Status::Io(who + ": missing field 'data_offsets'");
    const auto& off = offsets->AsArray();
    if (!offsets->is_array() || off.size() != 2 || !off[0].is_integer() || !off[1].is_integer() ||
        off[0].AsInt() < 0 || off[1].AsInt() < 0)
      return Status::Io(who + ": data_offsets must be [begin, end], two non-negative integers");
    const uint64_t begin = static_cast<uint64_t>(off[0].AsInt());
    const uint64_t end = static_cast<uint64_t>(off[1].AsInt());
    if (begin > end)
      return Status::Io(who + ": data_offsets begin " + Str(begin) + " is greater than end " + Str(end));
    if (end > data_size_)
      return Status::Io(who + ": data_offsets end " + Str(end) + " is past the end of the data section (" +
                        Str(data_size_) + " bytes; file truncated?)");
    if (end - begin != nbytes)
      return Status::Io(who + ": " + DTypeName(t.dtype) + " " + ShapeToString(t.shape) + " needs " +
                        Str(nbytes) + " bytes, but data_offsets [" + Str(begin) + ", " + Str(end) +
                        "] span " + Str(end - begin));
    t.data = data_ + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    t.data_begin = begin;
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.nbytes < b.nbytes;
  });
  // Empty tensors occupy no bytes and overlap nothing.
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors_) {
    if (t.nbytes == 0) continue;
    if (prev != nullptr && t.data_begin < prev->data_begin + prev->nbytes)
      return Status::Io(path_ + ": tensors '" + prev->name + "' [" + Str(prev->data_begin) + ", " +
                        Str(prev->data_begin + prev->nbytes) + ") and '" + t.name + "' [" +
                        Str(t.data_begin) + ", " + Str(t.data_begin + t.nbytes) + ") overlap");
    prev = &t;
  }
  by_name_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  return Status::Ok();
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) names.push_back(t.name);
  return names;
}

Status SafetensorsFile::Get(std::string_view name, DType dtype, const std::vector<int64_t>& shape,
                            const TensorInfo** out) const {
  const TensorInfo* t = Find(name);
  MXMOE_RETURN_IF_ERROR(ExpectTensor(t, name, dtype, shape, path_));
  *out = t;
  return Status::Ok();
}

Status ExpectTensor(const TensorInfo* t, std::string_view name, DType dtype,
                    const std::vector<int64_t>& shape, const std::string& file) {
  if (t == nullptr) return Status::Io("missing tensor '" + std::string(name) + "' in " + file);
  if (t->dtype != dtype || t->shape != shape)
    return Status::Invalid("tensor '" + std::string(name) + "' in " + file + ": expected " +
                           DTypeName(dtype) + " " + ShapeToString(shape) + ", found " +
                           DTypeName(t->dtype) + " " + ShapeToString(t->shape));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Writer

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  JsonValue header = JsonValue::MakeObject();
  if (!metadata.empty()) {
    JsonValue meta = JsonValue::MakeObject();
    for (const auto& [k, v] : metadata) meta.Set(k, JsonValue::String(v));
    header.Set("__metadata__", std::move(meta));
  }
  std::unordered_set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string who = path + ": tensor '" + t.name + "'";
    if (t.name == "__metadata__") return Status::Invalid(who + ": the name is reserved for metadata");
    if (!names.insert(t.name).second) return Status::Invalid(who + " is given twice");
    if (DTypeSize(t.dtype) == 0)
      return Status::Invalid(who + ": invalid dtype " + std::to_string(static_cast<int>(t.dtype)));
    int64_t numel = 0;
    uint64_t nbytes = 0;
    if (!CheckedNumel(t.shape, &numel) ||
        __builtin_mul_overflow(static_cast<uint64_t>(numel), DTypeSize(t.dtype), &nbytes))
      return Status::Invalid(who + ": shape " + ShapeToString(t.shape) + " has a negative or overflowing size");
    if (nbytes != t.nbytes)
      return Status::Invalid(who + ": " + DTypeName(t.dtype) + " " + ShapeToString(t.shape) + " needs " +
                             Str(nbytes) + " bytes, given " + Str(t.nbytes));
    if (nbytes > 0 && t.data == nullptr) return Status::Invalid(who + ": data is null");
    JsonValue entry = JsonValue::MakeObject();
    entry.Set("dtype", JsonValue::String(DTypeName(t.dtype)));
    JsonValue shape = JsonValue::MakeArray();
    for (int64_t d : t.shape) shape.Append(JsonValue::Integer(d));
    entry.Set("shape", std::move(shape));
    JsonValue off = JsonValue::MakeArray();
    off.Append(JsonValue::Integer(static_cast<int64_t>(offset)));
    off.Append(JsonValue::Integer(static_cast<int64_t>(offset + nbytes)));
    entry.Set("data_offsets", std::move(off));
    header.Set(t.name, std::move(entry));
    offset += nbytes;
  }
  std::string text;
  MXMOE_RETURN_IF_ERROR(WriteJson(header, &text));
  // Pad so that the data section begins at a multiple of 8 (the length field is 8 bytes).
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  const uint64_t len = text.size();
  std::memcpy(len_bytes, &len, 8);

  std::vector<std::string_view> chunks;
  chunks.reserve(tensors.size() + 2);
  chunks.emplace_back(reinterpret_cast<const char*>(len_bytes), 8);
  chunks.emplace_back(text);
  for (const TensorToWrite& t : tensors)
    if (t.nbytes > 0) chunks.emplace_back(static_cast<const char*>(t.data), t.nbytes);
  return io::AtomicWriteFile(path, chunks);
}

}  // namespace mxmoe
