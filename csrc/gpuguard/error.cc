// Construction and formatting of gpuguard::Error.
#include "gpuguard/error.h"

#include <cstring>
#include <utility>

namespace gpuguard {

std::string Error::message() const {
  std::string out = call.empty() ? library : library + " call " + call;
  out += " failed";
  if (!code_name.empty()) {
    out += ": " + code_name + " (" + std::to_string(code) + ")";
  }
  if (!detail.empty()) out += ": " + detail;
  if (!where.empty()) out += " [gpuguard " + where + "]";
  return out;
}

std::string source_location(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

Error gpuguard_error(std::string call, std::string detail, std::string where) {
  return Error{"gpuguard", std::move(call), "", 0, std::move(detail), std::move(where)};
}

Error unavailable_error(std::string library, std::string call, std::string detail, std::string where) {
  return Error{std::move(library), std::move(call), "", 0, std::move(detail), std::move(where)};
}

Error call_error(std::string library, std::string call, int code, std::string code_name, std::string detail,
                 std::string where) {
  return Error{std::move(library), std::move(call), std::move(code_name), code, std::move(detail), std::move(where)};
}

}  // namespace gpuguard
