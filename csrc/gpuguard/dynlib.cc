// dlopen/dlsym wrapper used by the CUDA driver and NCCL loaders.
#include "gpuguard/dynlib.h"

#include <dlfcn.h>
#include <link.h>

namespace gpuguard {

DynLib::~DynLib() {
  // Driver libraries are never unloaded: other code in the process (torch) may hold pointers into them.
  handle_ = nullptr;
}

DynLib::DynLib(DynLib&& other) noexcept : handle_(other.handle_), path_(std::move(other.path_)) {
  other.handle_ = nullptr;
}

DynLib& DynLib::operator=(DynLib&& other) noexcept {
  handle_ = other.handle_;
  path_ = std::move(other.path_);
  other.handle_ = nullptr;
  return *this;
}

Result<DynLib> DynLib::open_first(const std::vector<std::string>& candidates, const std::string& what) {
  std::string tried;
  for (const auto& name : candidates) {
    dlerror();
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      DynLib lib;
      lib.handle_ = handle;
      lib.path_ = name;
      return lib;
    }
    const char* why = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += why ? std::string(why) : name + ": unknown dlopen error";  // dlerror names the file
  }
  Error err;
  err.library = what;
  err.call = "dlopen";
  err.detail = tried.empty() ? "no candidate library names" : tried;
  return err;
}

DynLib DynLib::already_loaded(const std::string& name) {
  DynLib lib;
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle != nullptr) {
    lib.handle_ = handle;
    lib.path_ = name;
  } else {
    dlerror();  // clear: not being loaded yet is not an error
  }
  return lib;
}

std::string DynLib::loaded_from() const {
  if (handle_ == nullptr) return {};
  struct link_map* map = nullptr;
  if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return path_;
}

void* DynLib::symbol(const char* name) const {
  if (handle_ == nullptr) return nullptr;
  return dlsym(handle_, name);
}

}  // namespace gpuguard
