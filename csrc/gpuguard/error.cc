// Formatting of gpuguard::Error.
#include "gpuguard/error.h"

#include <cstring>

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

}  // namespace gpuguard
