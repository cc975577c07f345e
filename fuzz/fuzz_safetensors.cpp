// SafetensorsFile::Open on arbitrary files: a file is refused or every tensor it lists lies inside
// the data section with dtype size x element count bytes (every byte is read, so AddressSanitizer
// sees any view past the mapping).
#include "fuzz_util.h"
#include "mxmoe/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  const std::string path = fuzz::WriteScratch("input.safetensors", data, size);
  std::unique_ptr<SafetensorsFile> file;
  if (!SafetensorsFile::Open(path, &file).ok()) return 0;
  size_t total = 0;
  unsigned sum = 0;
  for (const std::string& name : file->Names()) {
    const TensorInfo* t = file->Find(name);
    if (t == nullptr) fuzz::Fail("a listed tensor is not found");
    if (t->nbytes != static_cast<size_t>(t->NumElements()) * DTypeSize(t->dtype))
      fuzz::Fail("tensor bytes != elements x dtype size");
    for (size_t i = 0; i < t->nbytes; ++i) sum += t->data[i];
    total += t->nbytes;
  }
  if (total > file->data_size()) fuzz::Fail("tensors overlap or exceed the data section");
  return static_cast<int>(sum & 0);
}
