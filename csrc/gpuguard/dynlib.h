// Run-time loading of shared libraries (libcuda, libnccl): gpuguard never links them at build time.
#pragma once

#include <string>
#include <vector>

#include "gpuguard/error.h"

namespace gpuguard {

// An open shared library; closed on destruction unless released. Move-only.
class DynLib {
 public:
  DynLib() = default;
  ~DynLib();
  DynLib(DynLib&& other) noexcept;
  DynLib& operator=(DynLib&& other) noexcept;
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  // Tries each candidate in order; the error lists what every attempt said.
  static Result<DynLib> open_first(const std::vector<std::string>& candidates, const std::string& what);
  // The copy of `name` this process has already loaded (dlopen RTLD_NOLOAD), or a closed DynLib if none.
  static DynLib already_loaded(const std::string& name);

  bool is_open() const { return handle_ != nullptr; }
  const std::string& path() const { return path_; }
  // Resolved path of the file actually loaded (dlinfo), for reports.
  std::string loaded_from() const;
  void* symbol(const char* name) const;

 private:
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace gpuguard
