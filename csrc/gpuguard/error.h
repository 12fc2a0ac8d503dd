// Error and Result types shared by every foreign call the core makes (CUDA driver, NCCL, stores).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpuguard {

// What went wrong in one foreign call: which library, which call, the library's own error name and
// number, and where in gpuguard it was made. message() is written for the person reading the log.
struct Error {
  std::string library;  // "CUDA driver", "NCCL", "gpuguard"
  std::string call;     // "cuDeviceGetUuid_v2"
  std::string code_name;  // "CUDA_ERROR_INVALID_DEVICE"; empty when the library gave none
  int code = 0;
  std::string detail;   // the library's description, or gpuguard's own explanation
  std::string where;    // "cuda_driver.cc:123"

  std::string message() const;
};

// A value or an Error. Deliberately small: the core returns errors upward instead of throwing or aborting.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : error_(std::move(error)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const Error& error() const { return *error_; }

 private:
  std::optional<T> value_;
  std::optional<Error> error_;
};

struct Ok {};
using Status = Result<Ok>;
inline Status ok_status() { return Status(Ok{}); }

// For callers whose failures are exceptions (the watchdog's loop, the Python bindings): the value, or a
// std::runtime_error carrying the Error's message (which names the library and the call).
template <typename T>
T value_or_throw(Result<T> result) {
  if (!result.ok()) throw std::runtime_error(result.error().message());
  return std::move(result).value();
}

std::string source_location(const char* file, int line);

// The three ways an Error comes about; the core builds every Error with one of them. `where` is
// GPUGUARD_WHERE at the place gpuguard noticed, or empty where no single line is to blame.
// gpuguard's own failure: a bad argument, a deadline passed, a result that does not check out.
Error gpuguard_error(std::string call, std::string detail, std::string where = {});
// A foreign library, or an entry point of it, cannot be used: dlopen or dlsym failed, or it lacks a function.
Error unavailable_error(std::string library, std::string call, std::string detail, std::string where = {});
// A foreign call returned a failure code: the library's own name and description for it.
Error call_error(std::string library, std::string call, int code, std::string code_name, std::string detail,
                 std::string where);

}  // namespace gpuguard

#define GPUGUARD_WHERE ::gpuguard::source_location(__FILE__, __LINE__)

// Evaluates a Status (or Result) expression; on failure, returns its Error from the enclosing function, which
// must return a Status or a Result. The per-library checking helpers (GPUGUARD_CU, GPUGUARD_NCCL) build on it.
#define GPUGUARD_TRY(expr)                                               \
  do {                                                                   \
    auto&& gpuguard_try_ = (expr);                                       \
    if (!gpuguard_try_.ok()) return gpuguard_try_.error();               \
  } while (0)
