// NVML, loaded at run time like the driver: which processes hold memory on a GPU, and how much memory it has.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpuguard/error.h"
#include "gpuguard/nvml_api.h"
#include "gpuguard/runtime_library.h"

namespace gpuguard {

// One process with a compute context on a GPU, as NVML lists it. The pid is in the pid namespace NVML answers
// in: drivers that translate pids give this process's namespace (and leave out processes outside it), older
// ones the host's.
struct GpuProcess {
  std::uint32_t pid = 0;
  std::int64_t used_memory = -1;  // bytes; -1 when NVML says NVML_VALUE_NOT_AVAILABLE
};

// What NVML says of one GPU (or MIG instance): its memory and the processes using it.
struct GpuUsage {
  std::string uuid;                 // as asked
  std::uint64_t total_memory = 0;   // bytes
  std::uint64_t used_memory = 0;    // bytes (nvmlDeviceGetMemoryInfo; includes the driver's reserve)
  std::uint64_t free_memory = 0;
  std::int64_t reserved_memory = -1;  // bytes the driver keeps (nvmlDeviceGetMemoryInfo_v2); -1 unknown
  std::vector<GpuProcess> processes;
};

// Whether NVML could be used, for reports.
struct NvmlStatus {
  bool library_loaded = false;
  bool initialized = false;
  std::string library;         // the file loaded, or the names tried
  std::string driver_version;  // "570.86.15"; empty when unknown
  std::string reason;          // why it cannot be used; empty when it can
};

class Nvml {
 public:
  // The process-wide NVML: loaded (dlopen) and initialised (nvmlInit_v2) on first use, never shut down.
  static Nvml& instance();
  // $GPUGUARD_LIBNVML if set, else libnvidia-ml.so.1.
  static std::vector<std::string> library_candidates();

  Status load();
  Status init();
  NvmlStatus status();

  // The GPU or MIG instance with this UUID ("GPU-..." or "MIG-...", as the CUDA driver names it); when NVML
  // does not know the UUID and `pci_bus_id` is given, the GPU at that bus id.
  Result<GpuUsage> usage(const std::string& uuid, const std::string& pci_bus_id = "");

  // The checking helper every NVML call goes through (GPUGUARD_NVML): ok for NVML_SUCCESS, otherwise an Error
  // naming the call, NVML's code name and nvmlErrorString's description.
  Status check(const char* call, nvml::nvmlReturn_t code, const std::string& where) const;
  template <typename... Params, typename... Args>
  Status call(const char* name, nvml::nvmlReturn_t (*entry)(Params...), const std::string& where,
              Args&&... args) const {
    if (entry == nullptr) {
      return unavailable_error("NVML", "dlsym", std::string("this NVML does not export ") + name, where);
    }
    return check(name, entry(std::forward<Args>(args)...), where);
  }

#define GPUGUARD_NVML_MEMBER(symbol, ret, params) nvml::PFN_##symbol symbol = nullptr;
  struct Functions {
    GPUGUARD_NVML_REQUIRED_FUNCTIONS(GPUGUARD_NVML_MEMBER)
    GPUGUARD_NVML_OPTIONAL_FUNCTIONS(GPUGUARD_NVML_MEMBER)
  };
#undef GPUGUARD_NVML_MEMBER
  const Functions& fn() const { return fn_; }

 private:
  Nvml();
  Result<std::vector<GpuProcess>> processes(nvml::nvmlDevice_t device);

  std::mutex mutex_;  // guards the init record
  bool init_attempted_ = false;
  Status init_status_ = ok_status();
  RuntimeLibrary lib_;
  Functions fn_;
};

// NVML's name for a return code ("NVML_ERROR_NOT_FOUND"), or "nvmlReturn_t N" for one it does not list.
std::string nvml_code_name(int code);

}  // namespace gpuguard

// GPUGUARD_NVML(nvmlDeviceGetHandleByUUID, uuid, &device): the call through the checking helper; on failure
// returns its Error from the enclosing function (which returns a Status or a Result).
#define GPUGUARD_NVML(call_name, ...)                                                                         \
  GPUGUARD_TRY(::gpuguard::Nvml::instance().call(#call_name, ::gpuguard::Nvml::instance().fn().call_name, \
                                                 GPUGUARD_WHERE __VA_OPT__(, ) __VA_ARGS__))
