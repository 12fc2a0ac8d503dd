// NVML through RuntimeLibrary: memory and compute processes of one GPU, and the NVML call check.
#include "gpuguard/nvml.h"

#include <cstdlib>

namespace gpuguard {

namespace {

const LibrarySpec& library_spec() {
  static const LibrarySpec spec{"NVML", "GPUGUARD_LIBNVML", {"libnvidia-ml.so.1"}, "",
                                "no NVIDIA management library (libnvidia-ml.so.1 ships with the driver)",
                                "(driver too old, or not NVML)"};
  return spec;
}

// More processes than this on one GPU is not a real answer: the list is cut there.
constexpr unsigned int kMaxProcesses = 4096;

}  // namespace

std::string nvml_code_name(int code) {
  switch (code) {
    case 0: return "NVML_SUCCESS";
    case 1: return "NVML_ERROR_UNINITIALIZED";
    case 2: return "NVML_ERROR_INVALID_ARGUMENT";
    case 3: return "NVML_ERROR_NOT_SUPPORTED";
    case 4: return "NVML_ERROR_NO_PERMISSION";
    case 5: return "NVML_ERROR_ALREADY_INITIALIZED";
    case 6: return "NVML_ERROR_NOT_FOUND";
    case 7: return "NVML_ERROR_INSUFFICIENT_SIZE";
    case 8: return "NVML_ERROR_INSUFFICIENT_POWER";
    case 9: return "NVML_ERROR_DRIVER_NOT_LOADED";
    case 10: return "NVML_ERROR_TIMEOUT";
    case 11: return "NVML_ERROR_IRQ_ISSUE";
    case 12: return "NVML_ERROR_LIBRARY_NOT_FOUND";
    case 13: return "NVML_ERROR_FUNCTION_NOT_FOUND";
    case 14: return "NVML_ERROR_CORRUPTED_INFOROM";
    case 15: return "NVML_ERROR_GPU_IS_LOST";
    case 16: return "NVML_ERROR_RESET_REQUIRED";
    case 17: return "NVML_ERROR_OPERATING_SYSTEM";
    case 18: return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    case 19: return "NVML_ERROR_IN_USE";
    case 20: return "NVML_ERROR_MEMORY";
    case 21: return "NVML_ERROR_NO_DATA";
    case 999: return "NVML_ERROR_UNKNOWN";
    default: return "nvmlReturn_t " + std::to_string(code);
  }
}

Nvml::Nvml() : lib_(library_spec()) {}

Nvml& Nvml::instance() {
  static Nvml* nvml = new Nvml();  // never destroyed, like the driver: used from atexit paths
  return *nvml;
}

std::vector<std::string> Nvml::library_candidates() { return library_spec().candidates(); }

Status Nvml::load() {
  return lib_.load([this](RuntimeLibrary::Symbols& symbols) {
    Functions& table = fn_;
    GPUGUARD_NVML_REQUIRED_FUNCTIONS(GPUGUARD_BIND_REQUIRED)
    GPUGUARD_NVML_OPTIONAL_FUNCTIONS(GPUGUARD_BIND_OPTIONAL)
  });
}

Status Nvml::check(const char* call, nvml::nvmlReturn_t code, const std::string& where) const {
  if (code == nvml::NVML_SUCCESS) return ok_status();
  const char* text = fn_.nvmlErrorString != nullptr ? fn_.nvmlErrorString(code) : nullptr;
  return call_error("NVML", call, static_cast<int>(code), nvml_code_name(code), text ? text : "", where);
}

Status Nvml::init() {
  GPUGUARD_TRY(load());
  std::lock_guard<std::mutex> lock(mutex_);
  if (init_attempted_) return init_status_;
  init_attempted_ = true;
  // Reference counted by NVML; never shut down (other code in the process, torch's OOM report, may use it too).
  init_status_ = call("nvmlInit_v2", fn_.nvmlInit_v2, GPUGUARD_WHERE);
  return init_status_;
}

NvmlStatus Nvml::status() {
  NvmlStatus st;
  Status loaded = load();
  st.library_loaded = loaded.ok();
  if (!loaded) {
    st.library = lib_.candidate_list();
    st.reason = loaded.error().detail;
    return st;
  }
  st.library = lib_.loaded_from();
  Status ready = init();
  if (!ready) {
    st.reason = ready.error().message();
    return st;
  }
  st.initialized = true;
  if (fn_.nvmlSystemGetDriverVersion != nullptr) {
    char version[96] = {0};
    if (fn_.nvmlSystemGetDriverVersion(version, sizeof(version) - 1) == nvml::NVML_SUCCESS) st.driver_version = version;
  }
  return st;
}

Result<std::vector<GpuProcess>> Nvml::processes(nvml::nvmlDevice_t device) {
  if (fn_.nvmlDeviceGetComputeRunningProcesses_v3 == nullptr) {
    return unavailable_error("NVML", "dlsym",
                             "this NVML does not export nvmlDeviceGetComputeRunningProcesses_v3 (an older driver)");
  }
  // The documented protocol: *infoCount = 0 asks for the count (NVML_ERROR_INSUFFICIENT_SIZE with the count, or
  // NVML_SUCCESS when none run); the list may grow between the calls, so ask again, with room to spare.
  unsigned int count = 0;
  nvml::nvmlReturn_t rc = fn_.nvmlDeviceGetComputeRunningProcesses_v3(device, &count, nullptr);
  if (rc == nvml::NVML_SUCCESS) return std::vector<GpuProcess>{};
  std::vector<nvml::nvmlProcessInfo_t> infos;
  for (int attempt = 0; attempt < 4 && rc == nvml::NVML_ERROR_INSUFFICIENT_SIZE; ++attempt) {
    unsigned int room = count + 8 < kMaxProcesses ? count + 8 : kMaxProcesses;
    infos.assign(room, nvml::nvmlProcessInfo_t{});
    count = room;
    rc = fn_.nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos.data());
    if (rc == nvml::NVML_ERROR_INSUFFICIENT_SIZE && room == kMaxProcesses) {  // keep what fits, as far as it goes
      count = room;
      rc = nvml::NVML_SUCCESS;
    }
  }
  GPUGUARD_TRY(check("nvmlDeviceGetComputeRunningProcesses_v3", rc, GPUGUARD_WHERE));
  std::vector<GpuProcess> out;
  out.reserve(count);
  for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
    GpuProcess p;
    p.pid = infos[i].pid;
    p.used_memory = infos[i].usedGpuMemory == nvml::kValueNotAvailable
                        ? -1
                        : static_cast<std::int64_t>(infos[i].usedGpuMemory);
    out.push_back(p);
  }
  return out;
}

Result<GpuUsage> Nvml::usage(const std::string& uuid, const std::string& pci_bus_id) {
  GPUGUARD_TRY(init());
  nvml::nvmlDevice_t device = nullptr;
  nvml::nvmlReturn_t by_uuid = fn_.nvmlDeviceGetHandleByUUID(uuid.c_str(), &device);
  if (by_uuid == nvml::NVML_ERROR_NOT_FOUND && !pci_bus_id.empty() && !uuid.starts_with("MIG-")) {
    GPUGUARD_NVML(nvmlDeviceGetHandleByPciBusId_v2, pci_bus_id.c_str(), &device);
  } else {
    GPUGUARD_TRY(check("nvmlDeviceGetHandleByUUID", by_uuid, GPUGUARD_WHERE));
  }
  GpuUsage usage;
  usage.uuid = uuid;
  nvml::nvmlMemory_t memory{};
  GPUGUARD_NVML(nvmlDeviceGetMemoryInfo, device, &memory);
  usage.total_memory = memory.total;
  usage.used_memory = memory.used;
  usage.free_memory = memory.free;
  if (fn_.nvmlDeviceGetMemoryInfo_v2 != nullptr) {
    nvml::nvmlMemory_v2_t v2{};
    v2.version = nvml::kMemoryV2Version;
    if (fn_.nvmlDeviceGetMemoryInfo_v2(device, &v2) == nvml::NVML_SUCCESS) {
      usage.reserved_memory = static_cast<std::int64_t>(v2.reserved);
    }
  }
  auto listed = processes(device);
  if (!listed) return listed.error();
  usage.processes = std::move(listed).value();
  return usage;
}

}  // namespace gpuguard
