// The CUDA driver through RuntimeLibrary: device enumeration, the cuInit record, and the driver call check.
#include "gpuguard/cuda_driver.h"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <cstdlib>

namespace gpuguard {

namespace {

const LibrarySpec& library_spec() {
  static const LibrarySpec spec{"CUDA driver", "GPUGUARD_LIBCUDA", {"libcuda.so.1", "libcuda.so"}, "",
                                "no NVIDIA driver", "(driver too old, or not a CUDA driver)"};
  return spec;
}

}  // namespace

std::string format_gpu_uuid(const unsigned char b[16]) {
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

std::string normalize_pci_bus_id(const std::string& text) {
  unsigned long domain = 0, bus = 0, device = 0, function = 0;
  int consumed = 0;
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (std::sscanf(t.c_str(), "%lx:%lx:%lx.%lx%n", &domain, &bus, &device, &function, &consumed) == 4 &&
      consumed == static_cast<int>(t.size())) {
  } else if (std::sscanf(t.c_str(), "%lx:%lx.%lx%n", &bus, &device, &function, &consumed) == 3 &&
             consumed == static_cast<int>(t.size())) {
    domain = 0;
  } else {
    return {};
  }
  if (domain > 0xffffffffUL || bus > 0xff || device > 0x1f || function > 0x7) return {};
  char out[32];
  std::snprintf(out, sizeof(out), "%04lx:%02lx:%02lx.%lx", domain, bus, device, function);
  return out;
}

CudaDriver::CudaDriver() : lib_(library_spec()) {}

CudaDriver& CudaDriver::instance() {
  static CudaDriver* driver = new CudaDriver();  // never destroyed: used from atexit paths of torch
  return *driver;
}

std::vector<std::string> CudaDriver::library_candidates() { return library_spec().candidates(); }

Status CudaDriver::load() {
  return lib_.load([this](RuntimeLibrary::Symbols& symbols) {
    Functions& table = fn_;
    GPUGUARD_CUDA_REQUIRED_FUNCTIONS(GPUGUARD_BIND_REQUIRED)
    GPUGUARD_CUDA_OPTIONAL_FUNCTIONS(GPUGUARD_BIND_OPTIONAL)
  });
}

Status CudaDriver::check(const char* call, cu::CUresult code, const std::string& where) const {
  if (code == cu::CUDA_SUCCESS) return ok_status();
  const char* name = nullptr;
  const char* text = nullptr;
  std::string code_name = "CUresult " + std::to_string(static_cast<int>(code));
  if (fn_.cuGetErrorName != nullptr && fn_.cuGetErrorName(code, &name) == cu::CUDA_SUCCESS && name) code_name = name;
  std::string detail;
  if (fn_.cuGetErrorString != nullptr && fn_.cuGetErrorString(code, &text) == cu::CUDA_SUCCESS && text) detail = text;
  return call_error("CUDA driver", call, static_cast<int>(code), std::move(code_name), std::move(detail), where);
}

Error CudaDriver::missing(const char* call, const std::string& where) {
  return unavailable_error("CUDA driver", "dlsym", std::string("the driver does not export ") + call, where);
}

Status CudaDriver::init() {
  Status loaded = load();
  if (!loaded) return loaded;
  std::lock_guard<std::mutex> lock(mutex_);
  if (init_attempted_) return init_status_;
  init_attempted_ = true;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  visible_set_at_init_ = visible != nullptr;
  visible_at_init_ = visible ? visible : "";
  // Before cuInit, the driver answers CUDA_ERROR_NOT_INITIALIZED unless someone else initialised it already.
  int count_before = 0;
  initialized_before_gpuguard_ = fn_.cuDeviceGetCount(&count_before) == cu::CUDA_SUCCESS;
  init_status_ = call("cuInit", fn_.cuInit, GPUGUARD_WHERE, 0u);
  return init_status_;
}

bool CudaDriver::initialized() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return init_attempted_ && init_status_.ok();
}

CudaDriver::InitRecord CudaDriver::init_record() const {
  std::lock_guard<std::mutex> lock(mutex_);
  InitRecord r;
  r.attempted = init_attempted_;
  r.succeeded = init_attempted_ && init_status_.ok();
  r.visible_set = visible_set_at_init_;
  r.visible = visible_at_init_;
  r.initialized_before_gpuguard = initialized_before_gpuguard_;
  return r;
}

Result<int> CudaDriver::driver_version() {
  GPUGUARD_TRY(load());
  int version = 0;
  GPUGUARD_CU(cuDriverGetVersion, &version);
  return version;
}

Result<int> CudaDriver::device_count() {
  GPUGUARD_TRY(init());
  int count = 0;
  GPUGUARD_CU(cuDeviceGetCount, &count);
  return count;
}

Result<DeviceInfo> CudaDriver::device(int ordinal) {
  GPUGUARD_TRY(init());
  DeviceInfo info;
  info.index = ordinal;
  cu::CUdevice dev = 0;
  GPUGUARD_CU(cuDeviceGet, &dev, ordinal);

  char name[256] = {0};
  GPUGUARD_CU(cuDeviceGetName, name, static_cast<int>(sizeof(name) - 1), dev);
  info.name = name;

  cu::CUuuid uuid{};
  GPUGUARD_CU(cuDeviceGetUuid_v2, &uuid, dev);
  info.uuid = format_gpu_uuid(reinterpret_cast<const unsigned char*>(uuid.bytes));
  // A MIG device: cuDeviceGetUuid_v2 gives the instance's UUID ("If the device is in MIG mode, returns its MIG
  // UUID"), the legacy cuDeviceGetUuid the GPU's; they differ only there. Named as nvidia-smi -L and
  // CUDA_VISIBLE_DEVICES name it, MIG-<uuid>, so ranks on different instances of one GPU stay apart.
  if (CudaDriver::instance().fn().cuDeviceGetUuid != nullptr) {
    cu::CUuuid gpu_uuid{};
    GPUGUARD_CU(cuDeviceGetUuid, &gpu_uuid, dev);
    if (std::memcmp(gpu_uuid.bytes, uuid.bytes, sizeof(uuid.bytes)) != 0) info.uuid = "MIG-" + info.uuid.substr(4);
  }

  char bus_id[64] = {0};
  GPUGUARD_CU(cuDeviceGetPCIBusId, bus_id, static_cast<int>(sizeof(bus_id) - 1), dev);
  info.pci_bus_id = normalize_pci_bus_id(bus_id);
  if (info.pci_bus_id.empty()) {
    // Fall back to the attributes; the string form is what every other tool prints, so prefer it.
    int domain = 0, bus = 0, device = 0;
    GPUGUARD_CU(cuDeviceGetAttribute, &domain, cu::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
    GPUGUARD_CU(cuDeviceGetAttribute, &bus, cu::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    GPUGUARD_CU(cuDeviceGetAttribute, &device, cu::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
    char out[32];
    std::snprintf(out, sizeof(out), "%04x:%02x:%02x.0", domain, bus, device);
    info.pci_bus_id = out;
  }

  size_t bytes = 0;
  GPUGUARD_CU(cuDeviceTotalMem_v2, &bytes, dev);
  info.total_memory = bytes;
  GPUGUARD_CU(cuDeviceGetAttribute, &info.cc_major, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  GPUGUARD_CU(cuDeviceGetAttribute, &info.cc_minor, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  GPUGUARD_CU(cuDeviceGetAttribute, &info.multiprocessors, cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  return info;
}

Result<std::vector<DeviceInfo>> CudaDriver::devices() {
  auto count = device_count();
  if (!count) return count.error();
  std::vector<DeviceInfo> out;
  out.reserve(static_cast<size_t>(count.value()));
  for (int i = 0; i < count.value(); ++i) {
    auto info = device(i);
    if (!info) return info.error();
    out.push_back(std::move(info).value());
  }
  return out;
}

Result<bool> CudaDriver::can_access_peer(int a, int b) {
  GPUGUARD_TRY(init());
  cu::CUdevice da = 0, db = 0;
  GPUGUARD_CU(cuDeviceGet, &da, a);
  GPUGUARD_CU(cuDeviceGet, &db, b);
  int can = 0;
  GPUGUARD_CU(cuDeviceCanAccessPeer, &can, da, db);
  return can != 0;
}

Result<std::vector<int>> CudaDriver::active_primary_contexts() {
  GPUGUARD_TRY(load());
  int count = 0;
  // Before anyone's cuInit the driver answers CUDA_ERROR_NOT_INITIALIZED: no context can exist yet.
  const cu::CUresult counted = fn_.cuDeviceGetCount(&count);
  if (counted == cu::CUDA_ERROR_NOT_INITIALIZED) return std::vector<int>{};
  GPUGUARD_TRY(check("cuDeviceGetCount", counted, GPUGUARD_WHERE));
  std::vector<int> active;
  for (int i = 0; i < count; ++i) {
    cu::CUdevice dev = 0;
    GPUGUARD_CU(cuDeviceGet, &dev, i);
    unsigned int flags = 0;
    int is_active = 0;
    GPUGUARD_CU(cuDevicePrimaryCtxGetState, dev, &flags, &is_active);
    if (is_active != 0) active.push_back(i);
  }
  return active;
}

CudaStatus CudaDriver::status() {
  CudaStatus st;
  Status loaded = load();
  st.library_loaded = loaded.ok();
  if (!loaded) {
    st.library = lib_.candidate_list();
    st.reason = loaded.error().detail;
    return st;
  }
  st.library = lib_.loaded_from();
  auto version = driver_version();
  if (version) st.driver_version = version.value();
  Status ready = init();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    st.visible_devices_at_init = visible_at_init_;
    st.visible_devices_set_at_init = visible_set_at_init_;
  }
  if (!ready) {
    st.reason = ready.error().message();
    if (ready.error().code == cu::CUDA_ERROR_NO_DEVICE) {
      st.initialized = true;
      st.reason = st.visible_devices_set_at_init
                      ? "no CUDA device is visible (CUDA_VISIBLE_DEVICES='" + st.visible_devices_at_init + "')"
                      : "the driver reports no CUDA device";
    }
    return st;
  }
  st.initialized = true;
  auto count = device_count();
  if (!count) {
    st.reason = count.error().message();
    return st;
  }
  st.device_count = count.value();
  if (st.device_count == 0) st.reason = "the driver reports no CUDA device";
  return st;
}

}  // namespace gpuguard
