// Fake CUDA driver (libgpuguard_fake_cuda.so): the driver entry points gpuguard uses, answered from the JSON
// topology in $GPUGUARD_FAKE_TOPOLOGY. Test fixture only; never shipped.
//
// Like the real driver it reads CUDA_VISIBLE_DEVICES once, at cuInit: comma-separated entries, each a device
// index, a full GPU UUID or a unique UUID prefix (with or without "GPU-"); enumeration stops at the first
// invalid, ambiguous or repeated entry; an empty value (or a first entry that is invalid) means no devices,
// which cuInit reports as CUDA_ERROR_NO_DEVICE.
//
// MIG (a topology GPU with "mig" instances), as the MIG user guide's "CUDA Device Enumeration" describes it:
// an entry "MIG-<uuid>" selects that instance; a MIG-enabled GPU named by index or UUID (or all GPUs, with the
// variable unset) offers its instances; and "a single CUDA process can only enumerate a single MIG device" --
// the first instance offered -- while "CUDA will not enumerate non-MIG GPU if any compute instance is
// enumerated". cuDeviceGetUuid_v2 returns the instance's UUID ("If the device is in MIG mode, returns its MIG
// UUID", CUDA driver API), the legacy cuDeviceGetUuid the parent GPU's; the PCI bus id is the parent's.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "topology.h"

namespace {

enum : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNotInitialized = 3,
  kNoDevice = 100,
  kInvalidDevice = 101,
  kInvalidContext = 201,
  kPeerAccessUnsupported = 217,
  kPeerAccessAlreadyEnabled = 704,
  kUnknown = 999,
};

struct State {
  std::mutex mutex;
  bool initialized = false;
  int init_result = kNotInitialized;
  gpuguard_fake::Topology topology;
  std::vector<int> visible;  // visible ordinal -> topology index (a MIG instance: its parent GPU's)
  std::vector<const gpuguard_fake::FakeGpu*> visible_devices;  // visible ordinal -> the GPU or MIG instance
  std::vector<int> current;  // per-thread would be truer; one current device per process is enough here
};

State& state() {
  static State* s = new State();
  return *s;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// Returns the topology index an entry names, or -1 when it is invalid or ambiguous.
int resolve_entry(const std::string& raw, const gpuguard_fake::Topology& topo) {
  std::string entry = trim(raw);
  if (entry.empty()) return -1;
  bool digits = true;
  for (char c : entry) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (digits) {
    if (entry.size() > 6) return -1;
    int index = std::atoi(entry.c_str());
    return index < static_cast<int>(topo.gpus.size()) ? index : -1;
  }
  std::string prefix = entry;
  for (auto& c : prefix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (prefix.rfind("gpu-", 0) == 0) prefix = prefix.substr(4);
  if (prefix.empty()) return -1;
  int found = -1;
  for (size_t i = 0; i < topo.gpus.size(); ++i) {
    std::string body = topo.gpus[i].uuid.substr(4);  // canonical lowercase, without "GPU-"
    if (body.compare(0, prefix.size(), prefix) == 0) {
      if (found >= 0) return -1;  // ambiguous prefix
      found = static_cast<int>(i);
    }
  }
  return found;
}

// A "MIG-<uuid>" entry (the whole uuid, or a unique prefix of it): {GPU index, instance index}, or {-1, -1}.
std::pair<int, int> resolve_mig_entry(const std::string& raw, const gpuguard_fake::Topology& topo) {
  std::string entry = trim(raw);
  for (auto& c : entry) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (entry.rfind("mig-", 0) != 0 || entry.size() == 4) return {-1, -1};
  std::pair<int, int> found{-1, -1};
  for (size_t i = 0; i < topo.gpus.size(); ++i) {
    for (size_t m = 0; m < topo.gpus[i].mig.size(); ++m) {
      // canonical "MIG-" + lowercase hex: compare the lowercase bodies
      if (topo.gpus[i].mig[m].uuid.compare(4, entry.size() - 4, entry, 4) == 0) {
        if (found.first >= 0) return {-1, -1};
        found = {static_cast<int>(i), static_cast<int>(m)};
      }
    }
  }
  return found;
}

// The enumeration rules above, applied to the GPUs the variable selected (in its order).
void enumerate(const gpuguard_fake::Topology& topo, const std::vector<std::pair<int, int>>& selected,
               std::vector<int>& visible, std::vector<const gpuguard_fake::FakeGpu*>& devices) {
  for (const auto& [index, instance] : selected) {
    const auto& g = topo.gpus[static_cast<size_t>(index)];
    if (instance >= 0 || !g.mig.empty()) {  // the first MIG device offered is the only device
      visible.assign(1, index);
      devices.assign(1, &g.mig[static_cast<size_t>(instance >= 0 ? instance : 0)]);
      return;
    }
  }
  for (const auto& sel : selected) {
    visible.push_back(sel.first);
    devices.push_back(&topo.gpus[static_cast<size_t>(sel.first)]);
  }
}

std::vector<int> visible_devices(const gpuguard_fake::Topology& topo,
                                 std::vector<const gpuguard_fake::FakeGpu*>& devices) {
  std::vector<int> all;
  std::vector<std::pair<int, int>> selected;
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr) {
    for (size_t i = 0; i < topo.gpus.size(); ++i) selected.emplace_back(static_cast<int>(i), -1);
    enumerate(topo, selected, all, devices);
    return all;
  }
  std::string value = env;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    std::string entry = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::pair<int, int> sel = resolve_mig_entry(entry, topo);
    if (sel.first < 0) sel = {resolve_entry(entry, topo), -1};
    bool repeated = false;
    for (const auto& v : selected) repeated = repeated || v == sel;
    if (sel.first < 0 || repeated) break;
    selected.push_back(sel);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  enumerate(topo, selected, all, devices);
  return all;
}

int check_device(int device) {
  State& s = state();
  if (!s.initialized || s.init_result != kSuccess) return kNotInitialized;
  if (device < 0 || device >= static_cast<int>(s.visible.size())) return kInvalidDevice;
  return kSuccess;
}

const gpuguard_fake::FakeGpu& gpu(int device) {
  State& s = state();
  return *s.visible_devices[static_cast<size_t>(device)];
}

// Fake contexts and device memory: a context is (device + 1) cast to a pointer; device memory is host memory.
struct Allocation {
  int device;
  std::vector<unsigned char> bytes;
};
std::vector<Allocation*>& allocations() {
  static auto* a = new std::vector<Allocation*>();
  return *a;
}
void* context_for(int device) { return reinterpret_cast<void*>(static_cast<uintptr_t>(device + 1)); }
int device_of_context(void* ctx) { return static_cast<int>(reinterpret_cast<uintptr_t>(ctx)) - 1; }
int current_device = -1;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int cuGetErrorName(int error, const char** name) {
  switch (error) {
    case kSuccess: *name = "CUDA_SUCCESS"; return kSuccess;
    case kInvalidValue: *name = "CUDA_ERROR_INVALID_VALUE"; return kSuccess;
    case kOutOfMemory: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return kSuccess;
    case kNotInitialized: *name = "CUDA_ERROR_NOT_INITIALIZED"; return kSuccess;
    case kNoDevice: *name = "CUDA_ERROR_NO_DEVICE"; return kSuccess;
    case kInvalidDevice: *name = "CUDA_ERROR_INVALID_DEVICE"; return kSuccess;
    case kInvalidContext: *name = "CUDA_ERROR_INVALID_CONTEXT"; return kSuccess;
    case kPeerAccessUnsupported: *name = "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"; return kSuccess;
    case kPeerAccessAlreadyEnabled: *name = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"; return kSuccess;
    case kUnknown: *name = "CUDA_ERROR_UNKNOWN"; return kSuccess;
    default: *name = nullptr; return kInvalidValue;
  }
}

__attribute__((visibility("default"))) int cuGetErrorString(int error, const char** text) {
  switch (error) {
    case kSuccess: *text = "no error"; return kSuccess;
    case kInvalidValue: *text = "invalid argument"; return kSuccess;
    case kOutOfMemory: *text = "out of memory"; return kSuccess;
    case kNotInitialized: *text = "initialization error"; return kSuccess;
    case kNoDevice: *text = "no CUDA-capable device is detected"; return kSuccess;
    case kInvalidDevice: *text = "invalid device ordinal"; return kSuccess;
    case kInvalidContext: *text = "invalid device context"; return kSuccess;
    case kPeerAccessUnsupported: *text = "peer access is not supported between these two devices"; return kSuccess;
    case kPeerAccessAlreadyEnabled: *text = "peer access is already enabled"; return kSuccess;
    case kUnknown: *text = "unknown error"; return kSuccess;
    default: *text = nullptr; return kInvalidValue;
  }
}

__attribute__((visibility("default"))) int cuInit(unsigned int flags) {
  // $GPUGUARD_FAKE_CALL_LOG: append one line per cuInit, so tests can prove when CUDA was initialised.
  if (const char* log = std::getenv("GPUGUARD_FAKE_CALL_LOG")) {
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "cuInit CUDA_VISIBLE_DEVICES=%s\n",
                   std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
      std::fclose(f);
    }
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (flags != 0) return kInvalidValue;
  if (s.initialized) return s.init_result;
  s.initialized = true;
  try {
    s.topology = gpuguard_fake::load_topology();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuguard fake CUDA driver: %s\n", e.what());
    s.init_result = kUnknown;
    return s.init_result;
  }
  s.visible = visible_devices(s.topology, s.visible_devices);
  s.init_result = s.visible.empty() ? kNoDevice : kSuccess;
  return s.init_result;
}

__attribute__((visibility("default"))) int cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  // Like the real driver this works before cuInit; the topology may not be read yet.
  try {
    *version = gpuguard_fake::load_topology().driver_version;
  } catch (const std::exception&) {
    *version = 13000;
  }
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int* count) {
  State& s = state();
  if (count == nullptr) return kInvalidValue;
  if (!s.initialized || s.init_result != kSuccess) return kNotInitialized;
  *count = static_cast<int>(s.visible.size());
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGet(int* device, int ordinal) {
  if (device == nullptr) return kInvalidValue;
  int rc = check_device(ordinal);
  if (rc != kSuccess) return rc;
  *device = ordinal;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetName(char* name, int length, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (name == nullptr || length <= 0) return kInvalidValue;
  std::snprintf(name, static_cast<size_t>(length), "%s", gpu(device).name.c_str());
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetUuid_v2(unsigned char* uuid, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (uuid == nullptr) return kInvalidValue;
  std::memcpy(uuid, gpu(device).uuid_bytes, 16);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetUuid(unsigned char* uuid, int device) {
  int rc = cuDeviceGetUuid_v2(uuid, device);
  if (rc == kSuccess && gpu(device).is_mig) std::memcpy(uuid, gpu(device).parent_uuid_bytes, 16);
  return rc;
}

__attribute__((visibility("default"))) int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (bytes == nullptr) return kInvalidValue;
  *bytes = static_cast<size_t>(gpu(device).memory_mib) * 1024 * 1024;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetAttribute(int* value, int attribute, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (value == nullptr) return kInvalidValue;
  const auto& g = gpu(device);
  switch (attribute) {
    case 16: *value = g.multiprocessors; return kSuccess;
    case 33: *value = g.pci_bus; return kSuccess;
    case 34: *value = g.pci_device; return kSuccess;
    case 50: *value = g.pci_domain; return kSuccess;
    case 75: *value = g.cc_major; return kSuccess;
    case 76: *value = g.cc_minor; return kSuccess;
    default: return kInvalidValue;
  }
}

__attribute__((visibility("default"))) int cuDeviceGetPCIBusId(char* bus_id, int length, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (bus_id == nullptr || length < 13) return kInvalidValue;
  const auto& g = gpu(device);
  std::snprintf(bus_id, static_cast<size_t>(length), "%04x:%02x:%02x.0", g.pci_domain, g.pci_bus, g.pci_device);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceCanAccessPeer(int* can_access, int device, int peer) {
  int rc = check_device(device);
  if (rc == kSuccess) rc = check_device(peer);
  if (rc != kSuccess) return rc;
  if (can_access == nullptr) return kInvalidValue;
  State& s = state();
  size_t a = static_cast<size_t>(s.visible[static_cast<size_t>(device)]);
  size_t b = static_cast<size_t>(s.visible[static_cast<size_t>(peer)]);
  *can_access = (device != peer && s.topology.peer_access[a][b]) ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxGetState(int device, unsigned int* flags, int* active) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (flags == nullptr || active == nullptr) return kInvalidValue;
  *flags = 0;
  *active = 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxRetain(void** context, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (context == nullptr) return kInvalidValue;
  *context = context_for(device);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxRelease_v2(int device) { return check_device(device); }

__attribute__((visibility("default"))) int cuCtxSetCurrent(void* context) {
  int device = device_of_context(context);
  int rc = check_device(device);
  if (rc != kSuccess) return kInvalidContext;
  current_device = device;
  return kSuccess;
}

// Which device the current context belongs to: the fake NCCL asks this, as real NCCL asks the runtime.
__attribute__((visibility("default"))) int cuCtxGetCurrent(void** context) {
  if (context == nullptr) return kInvalidValue;
  *context = current_device < 0 ? nullptr : context_for(current_device);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuCtxGetDevice(int* device) {
  if (device == nullptr) return kInvalidValue;
  if (current_device < 0) return kInvalidContext;
  *device = current_device;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuCtxSynchronize() {
  return current_device < 0 ? kInvalidContext : kSuccess;
}

__attribute__((visibility("default"))) int cuCtxEnablePeerAccess(void* peer_context, unsigned int flags) {
  if (current_device < 0 || flags != 0) return current_device < 0 ? kInvalidContext : kInvalidValue;
  int peer = device_of_context(peer_context);
  int can = 0;
  int rc = cuDeviceCanAccessPeer(&can, current_device, peer);
  if (rc != kSuccess) return rc;
  return can ? kSuccess : kPeerAccessUnsupported;
}

__attribute__((visibility("default"))) int cuMemAlloc_v2(unsigned long long* pointer, size_t bytes) {
  if (current_device < 0) return kInvalidContext;
  if (pointer == nullptr || bytes == 0) return kInvalidValue;
  if (bytes > (size_t{1} << 30)) return kOutOfMemory;
  auto* a = new Allocation{current_device, std::vector<unsigned char>(bytes)};
  allocations().push_back(a);
  *pointer = reinterpret_cast<unsigned long long>(a->bytes.data());
  return kSuccess;
}

static Allocation* find_allocation(unsigned long long pointer, size_t bytes) {
  for (auto* a : allocations()) {
    auto base = reinterpret_cast<unsigned long long>(a->bytes.data());
    if (pointer >= base && pointer + bytes <= base + a->bytes.size()) return a;
  }
  return nullptr;
}

__attribute__((visibility("default"))) int cuMemFree_v2(unsigned long long pointer) {
  auto& all = allocations();
  for (size_t i = 0; i < all.size(); ++i) {
    if (reinterpret_cast<unsigned long long>(all[i]->bytes.data()) == pointer) {
      delete all[i];
      all.erase(all.begin() + static_cast<long>(i));
      return kSuccess;
    }
  }
  return kInvalidValue;
}

__attribute__((visibility("default"))) int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
  if (find_allocation(dst, bytes) == nullptr || src == nullptr) return kInvalidValue;
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
  if (find_allocation(src, bytes) == nullptr || dst == nullptr) return kInvalidValue;
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuMemcpyPeer(unsigned long long dst, void* dst_context,
                                                        unsigned long long src, void* src_context, size_t bytes) {
  Allocation* d = find_allocation(dst, bytes);
  Allocation* s = find_allocation(src, bytes);
  if (d == nullptr || s == nullptr) return kInvalidValue;
  if (d->device != device_of_context(dst_context) || s->device != device_of_context(src_context)) return kInvalidContext;
  // A topology with broken peer writes (ACS/IOMMU) reports success and delivers nothing, as the hardware does.
  if (state().topology.peer_copy_drops_writes && d->device != s->device) return kSuccess;
  std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return kSuccess;
}

}  // extern "C"
