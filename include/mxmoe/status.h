// Status: the one error type of the C++ API. A refusal names the offending tensor or field.
#pragma once

#include <string>
#include <utility>

namespace mxmoe {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad shape, dtype, id, parameter
  kIoError = 2,          // file missing, unreadable, truncated or malformed
  kUnsupported = 3,      // a valid request this build or device cannot serve
  kCudaError = 4,        // the CUDA runtime reported an error
  kOutOfMemory = 5,
  kInternal = 6,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status Invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Io(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Cuda(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: topk_ids[3,1] = 900 is outside [-1, 896)"
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* StatusCodeName(StatusCode code);

}  // namespace mxmoe

// Propagate a non-ok Status to the caller.
#define MXMOE_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::mxmoe::Status mxmoe_status_ = (expr);    \
    if (!mxmoe_status_.ok()) return mxmoe_status_; \
  } while (0)
