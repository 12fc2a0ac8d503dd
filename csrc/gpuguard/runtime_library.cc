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
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out = spec_.overridden() ? "" : preferred_;
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
      found_by_ = "already loaded in this process";
      return ok_status();
    }
    dlerror();  // clear: not being loaded yet is not an error
  }
  std::string tried;
  auto try_open = [&](const std::string& name, std::string found_by) {
    dlerror();
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      handle_ = handle;
      name_ = name;
      found_by_ = std::move(found_by);
      return true;
    }
    const char* why = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += why ? std::string(why) : name + ": unknown dlopen error";  // dlerror names the file
    return false;
  };
  if (spec_.overridden()) {
    if (try_open(spec_.candidates().front(), "$" + spec_.env_override)) return ok_status();
  } else {
    if (!preferred_.empty() && try_open(preferred_, preferred_origin_)) return ok_status();
    const std::string passed_over = tried.empty() ? "" : " (" + preferred_origin_ + " did not load: " + tried + ")";
    for (const auto& name : spec_.names) {
      if (try_open(name, "the dynamic loader's search for " + name + passed_over)) return ok_status();
    }
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

bool RuntimeLibrary::prefer(std::string path, std::string origin) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (attempted_) return false;
  preferred_ = std::move(path);
  preferred_origin_ = std::move(origin);
  return true;
}

std::string RuntimeLibrary::found_by() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return found_by_;
}

bool RuntimeLibrary::already_in_process() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return already_in_process_;
}

}  // namespace gpuguard
