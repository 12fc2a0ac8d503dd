// dlopen/dlsym for the CUDA driver and NCCL: candidates, the environment override, the copy already loaded.
#include "gpuguard/runtime_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>

namespace gpuguard {

bool LibrarySpec::overridden() const {
  const char* value = env_override.empty() ? nullptr : std::getenv(env_override.c_str());
  return value != nullptr && value[0] != '\0';
}

std::vector<std::string> LibrarySpec::candidates() const {
  if (overridden()) return {std::getenv(env_override.c_str())};
  return names;
}

void* RuntimeLibrary::Symbols::lookup(const char* name) const { return dlsym(handle_, name); }

std::string RuntimeLibrary::candidate_list() const {
  std::string out;
  for (const auto& name : spec_.candidates()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

Status RuntimeLibrary::open() {
  if (!spec_.overridden() && !spec_.prefer_loaded.empty()) {
    // The copy the job already uses (torch's own NCCL wheel, say): test that one, not another on the path.
    dlerror();
    void* handle = dlopen(spec_.prefer_loaded.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle != nullptr) {
      handle_ = handle;
      name_ = spec_.prefer_loaded;
      already_in_process_ = true;
      return ok_status();
    }
    dlerror();  // clear: not being loaded yet is not an error
  }
  std::string tried;
  for (const auto& name : spec_.candidates()) {
    dlerror();
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      handle_ = handle;
      name_ = name;
      return ok_status();
    }
    const char* why = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += why ? std::string(why) : name + ": unknown dlopen error";  // dlerror names the file
  }
  return unavailable_error(spec_.library, "dlopen",
                           spec_.absent + ": " + (tried.empty() ? "no candidate library names" : tried));
}

Error RuntimeLibrary::incomplete(const std::string& missing) const {
  return unavailable_error(spec_.library, "dlsym", resolved_path() + " lacks " + missing + " " + spec_.incomplete);
}

std::string RuntimeLibrary::loaded_from() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return resolved_path();
}

std::string RuntimeLibrary::resolved_path() const {
  if (handle_ == nullptr) return {};
  struct link_map* map = nullptr;
  if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return name_;
}

bool RuntimeLibrary::already_in_process() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return already_in_process_;
}

}  // namespace gpuguard
