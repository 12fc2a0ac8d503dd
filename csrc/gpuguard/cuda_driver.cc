// Loads libcuda with dlopen and enumerates the devices visible to this process.
#include "gpuguard/cuda_driver.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace gpuguard {

namespace {

// Every driver call goes through this: on failure, return an Error naming the call and the driver's name
// for the code. The call expression is spelled once so the name in the message cannot drift from the call.
#define GPUGUARD_CU_CHECK(call_name, ...)                                          \
  do {                                                                             \
    cu::CUresult gpuguard_rc_ = fn_.call_name(__VA_ARGS__);                        \
    if (gpuguard_rc_ != cu::CUDA_SUCCESS) {                                        \
      return cu_error(#call_name, gpuguard_rc_, GPUGUARD_WHERE);                   \
    }                                                                              \
  } while (0)

Error not_loaded_error(const Status& load_status) { return load_status.error(); }

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

CudaDriver& CudaDriver::instance() {
  static CudaDriver* driver = new CudaDriver();  // never destroyed: used from atexit paths of torch
  return *driver;
}

std::vector<std::string> CudaDriver::library_candidates() {
  const char* override_path = std::getenv("GPUGUARD_LIBCUDA");
  if (override_path != nullptr && override_path[0] != '\0') return {override_path};
  return {"libcuda.so.1", "libcuda.so"};
}

Status CudaDriver::load() {
  std::lock_guard<std::mutex> lock(mutex_);
  return load_locked();
}

Status CudaDriver::load_locked() {
  if (load_attempted_) return load_status_;
  load_attempted_ = true;
  auto lib = DynLib::open_first(library_candidates(), "CUDA driver");
  if (!lib) {
    Error err = lib.error();
    err.detail = "no NVIDIA driver: " + err.detail;
    load_status_ = err;
    return load_status_;
  }
  lib_ = std::move(lib).value();
  std::string missing;
#define GPUGUARD_CUDA_RESOLVE_REQUIRED(sym, ret, params)                      \
  fn_.sym = reinterpret_cast<cu::PFN_##sym>(lib_.symbol(#sym));               \
  if (fn_.sym == nullptr) missing += std::string(missing.empty() ? "" : ", ") + #sym;
#define GPUGUARD_CUDA_RESOLVE_OPTIONAL(sym, ret, params) \
  fn_.sym = reinterpret_cast<cu::PFN_##sym>(lib_.symbol(#sym));
  GPUGUARD_CUDA_REQUIRED_FUNCTIONS(GPUGUARD_CUDA_RESOLVE_REQUIRED)
  GPUGUARD_CUDA_OPTIONAL_FUNCTIONS(GPUGUARD_CUDA_RESOLVE_OPTIONAL)
#undef GPUGUARD_CUDA_RESOLVE_REQUIRED
#undef GPUGUARD_CUDA_RESOLVE_OPTIONAL
  if (!missing.empty()) {
    Error err;
    err.library = "CUDA driver";
    err.call = "dlsym";
    err.detail = lib_.loaded_from() + " lacks " + missing + " (driver too old, or not a CUDA driver)";
    load_status_ = err;
  }
  return load_status_;
}

Error CudaDriver::cu_error(const char* call, cu::CUresult code, const std::string& where) const {
  Error err;
  err.library = "CUDA driver";
  err.call = call;
  err.code = static_cast<int>(code);
  err.where = where;
  const char* name = nullptr;
  const char* text = nullptr;
  if (fn_.cuGetErrorName != nullptr && fn_.cuGetErrorName(code, &name) == cu::CUDA_SUCCESS && name) {
    err.code_name = name;
  } else {
    err.code_name = "CUresult " + std::to_string(err.code);
  }
  if (fn_.cuGetErrorString != nullptr && fn_.cuGetErrorString(code, &text) == cu::CUDA_SUCCESS && text) {
    err.detail = text;
  }
  return err;
}

Status CudaDriver::init() {
  std::lock_guard<std::mutex> lock(mutex_);
  Status loaded = load_locked();
  if (!loaded) return loaded;
  if (init_attempted_) return init_status_;
  init_attempted_ = true;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  visible_set_at_init_ = visible != nullptr;
  visible_at_init_ = visible ? visible : "";
  // Before cuInit, the driver answers CUDA_ERROR_NOT_INITIALIZED unless someone else initialised it already.
  int count_before = 0;
  initialized_before_gpuguard_ = fn_.cuDeviceGetCount(&count_before) == cu::CUDA_SUCCESS;
  cu::CUresult rc = fn_.cuInit(0);
  if (rc != cu::CUDA_SUCCESS) init_status_ = cu_error("cuInit", rc, GPUGUARD_WHERE);
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
  Status loaded = load();
  if (!loaded) return not_loaded_error(loaded);
  int version = 0;
  GPUGUARD_CU_CHECK(cuDriverGetVersion, &version);
  return version;
}

Result<int> CudaDriver::device_count() {
  Status ready = init();
  if (!ready) return ready.error();
  int count = 0;
  GPUGUARD_CU_CHECK(cuDeviceGetCount, &count);
  return count;
}

Result<DeviceInfo> CudaDriver::device(int ordinal) {
  Status ready = init();
  if (!ready) return ready.error();
  DeviceInfo info;
  info.index = ordinal;
  cu::CUdevice dev = 0;
  GPUGUARD_CU_CHECK(cuDeviceGet, &dev, ordinal);

  char name[256] = {0};
  GPUGUARD_CU_CHECK(cuDeviceGetName, name, static_cast<int>(sizeof(name) - 1), dev);
  info.name = name;

  cu::CUuuid uuid{};
  GPUGUARD_CU_CHECK(cuDeviceGetUuid_v2, &uuid, dev);
  info.uuid = format_gpu_uuid(reinterpret_cast<const unsigned char*>(uuid.bytes));

  char bus_id[64] = {0};
  GPUGUARD_CU_CHECK(cuDeviceGetPCIBusId, bus_id, static_cast<int>(sizeof(bus_id) - 1), dev);
  info.pci_bus_id = normalize_pci_bus_id(bus_id);
  if (info.pci_bus_id.empty()) {
    // Fall back to the attributes; the string form is what every other tool prints, so prefer it.
    int domain = 0, bus = 0, device = 0;
    GPUGUARD_CU_CHECK(cuDeviceGetAttribute, &domain, cu::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
    GPUGUARD_CU_CHECK(cuDeviceGetAttribute, &bus, cu::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    GPUGUARD_CU_CHECK(cuDeviceGetAttribute, &device, cu::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
    char out[32];
    std::snprintf(out, sizeof(out), "%04x:%02x:%02x.0", domain, bus, device);
    info.pci_bus_id = out;
  }

  size_t bytes = 0;
  GPUGUARD_CU_CHECK(cuDeviceTotalMem_v2, &bytes, dev);
  info.total_memory = bytes;
  GPUGUARD_CU_CHECK(cuDeviceGetAttribute, &info.cc_major, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  GPUGUARD_CU_CHECK(cuDeviceGetAttribute, &info.cc_minor, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  GPUGUARD_CU_CHECK(cuDeviceGetAttribute, &info.multiprocessors, cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
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
  Status ready = init();
  if (!ready) return ready.error();
  if (fn_.cuDeviceCanAccessPeer == nullptr) {
    return Error{"CUDA driver", "dlsym", "", 0, "the driver does not export cuDeviceCanAccessPeer", GPUGUARD_WHERE};
  }
  cu::CUdevice da = 0, db = 0;
  GPUGUARD_CU_CHECK(cuDeviceGet, &da, a);
  GPUGUARD_CU_CHECK(cuDeviceGet, &db, b);
  int can = 0;
  GPUGUARD_CU_CHECK(cuDeviceCanAccessPeer, &can, da, db);
  return can != 0;
}

CudaStatus CudaDriver::status() {
  CudaStatus st;
  Status loaded = load();
  st.library_loaded = loaded.ok();
  if (!loaded) {
    st.library = "";
    for (const auto& c : library_candidates()) st.library += (st.library.empty() ? "" : ", ") + c;
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
