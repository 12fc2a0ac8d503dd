// The CUDA driver, loaded at run time: device enumeration and the few calls diagnostics need.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpuguard/cuda_api.h"
#include "gpuguard/error.h"
#include "gpuguard/runtime_library.h"

namespace gpuguard {

struct DeviceInfo {
  int index = 0;            // ordinal among the devices visible to this process
  std::string name;         // "NVIDIA H100 80GB HBM3"
  std::string uuid;         // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string pci_bus_id;   // "0000:18:00.0"
  std::uint64_t total_memory = 0;  // bytes
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
};

// Why there are or are not devices, for `gpuguard doctor` and for devices() returning [].
struct CudaStatus {
  bool library_loaded = false;
  bool initialized = false;
  std::string library;        // the file that was loaded, or the names tried
  int driver_version = 0;     // 12040 for 12.4; 0 when unknown
  int device_count = 0;
  std::string visible_devices_at_init;  // CUDA_VISIBLE_DEVICES as cuInit saw it
  bool visible_devices_set_at_init = false;
  std::string reason;         // empty when devices were found
};

// Formats 16 raw bytes as NVIDIA prints them: GPU-8-4-4-4-12 lowercase hex.
std::string format_gpu_uuid(const unsigned char bytes[16]);
// "00000000:18:00.0" / "0000:18:00.0" / "18:00.0" -> "0000:18:00.0"; empty when it cannot be read.
std::string normalize_pci_bus_id(const std::string& text);

class CudaDriver {
 public:
  // The process-wide driver. Loading (dlopen) happens on first use, never at import, and cuInit only in
  // init(): the driver reads CUDA_VISIBLE_DEVICES once, at cuInit, so calling it early freezes visibility.
  static CudaDriver& instance();

  // Library candidates: $GPUGUARD_LIBCUDA if set, else libcuda.so.1 then libcuda.so.
  static std::vector<std::string> library_candidates();

  Status load();
  Status init();
  bool initialized() const;
  // What gpuguard's cuInit saw, without initialising anything: bind() compares it with the environment now.
  struct InitRecord {
    bool attempted = false;        // gpuguard has called cuInit
    bool succeeded = false;
    bool visible_set = false;      // CUDA_VISIBLE_DEVICES existed at that moment
    std::string visible;           // and its value
    // cuInit had already succeeded in this process (torch, another library) before gpuguard's call: the
    // driver then froze a CUDA_VISIBLE_DEVICES that gpuguard never saw.
    bool initialized_before_gpuguard = false;
  };
  InitRecord init_record() const;

  Result<int> driver_version();
  Result<int> device_count();
  Result<DeviceInfo> device(int ordinal);
  Result<std::vector<DeviceInfo>> devices();
  Result<bool> can_access_peer(int a, int b);
  // The ordinals of the visible devices on which this process holds an active primary context (the context
  // the runtime, and so torch, creates on a device's first use), asked with cuDevicePrimaryCtxGetState, which
  // creates none. Never calls cuInit: in a process where nothing initialised the driver no context can exist,
  // and the answer is empty.
  Result<std::vector<int>> active_primary_contexts();

  // Status for reports; never fails, loads and initialises if needed.
  CudaStatus status();

  // The checking helper every driver call goes through (by way of GPUGUARD_CU): ok for CUDA_SUCCESS, otherwise an
  // Error naming the call and the driver's own error name (cuGetErrorName) and description.
  Status check(const char* call, cu::CUresult code, const std::string& where) const;
  // Calls `entry` (a member of fn()) with `args`, checked; an entry point the driver does not export is an Error too.
  template <typename... Params, typename... Args>
  Status call(const char* name, cu::CUresult (*entry)(Params...), const std::string& where, Args&&... args) const {
    if (entry == nullptr) return missing(name, where);
    return check(name, entry(std::forward<Args>(args)...), where);
  }
  static Error missing(const char* call, const std::string& where);

  // Raw entry points for diagnostics (peer copies). Null when the driver lacks them.
#define GPUGUARD_CUDA_MEMBER(symbol, ret, params) cu::PFN_##symbol symbol = nullptr;
  struct Functions {
    GPUGUARD_CUDA_REQUIRED_FUNCTIONS(GPUGUARD_CUDA_MEMBER)
    GPUGUARD_CUDA_OPTIONAL_FUNCTIONS(GPUGUARD_CUDA_MEMBER)
  };
#undef GPUGUARD_CUDA_MEMBER
  const Functions& fn() const { return fn_; }

 private:
  CudaDriver();

  mutable std::mutex mutex_;  // guards the cuInit record below
  bool init_attempted_ = false;
  Status init_status_ = ok_status();
  std::string visible_at_init_;
  bool visible_set_at_init_ = false;
  bool initialized_before_gpuguard_ = false;
  RuntimeLibrary lib_;
  Functions fn_;
};

}  // namespace gpuguard

// The checking helper for the CUDA driver, declared once: GPUGUARD_CU(cuDeviceGet, &device, ordinal) calls
// CudaDriver::instance().fn().cuDeviceGet(&device, ordinal) and, when it fails or the driver does not export it,
// returns from the enclosing function (which returns a Status or a Result) an Error naming the call and the
// driver's error name. The call is spelled once, so the name in the message cannot drift from the call made.
#define GPUGUARD_CU(call_name, ...)                                                                      \
  GPUGUARD_TRY(::gpuguard::CudaDriver::instance().call(#call_name, ::gpuguard::CudaDriver::instance().fn().call_name, \
                                                       GPUGUARD_WHERE __VA_OPT__(, ) __VA_ARGS__))
