// File helpers shared by the JSON, safetensors and checkpoint writers and readers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mxmoe/status.h"

namespace mxmoe::io {

// The whole file; for small files only (config.json, index files).
Status ReadFileToString(const std::string& path, std::string* out);

// Writes the concatenation of `chunks` to a temporary file in the directory of `path`, flushes it,
// and renames it over `path`: a failure at any point leaves no partial `path` behind.
Status AtomicWriteFile(const std::string& path, const std::vector<std::string_view>& chunks);

// strerror(errno) in one call, thread-safe.
std::string ErrnoMessage(int err);

}  // namespace mxmoe::io
