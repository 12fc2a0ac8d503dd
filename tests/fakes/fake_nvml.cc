// Fake NVML (libgpuguard_fake_nvml.so): the NVML entry points gpuguard uses, answered from the same JSON topology
// as the fake driver ($GPUGUARD_FAKE_TOPOLOGY). Test fixture only; never shipped.
//
// As NVML does, it ignores CUDA_VISIBLE_DEVICES: every GPU of the topology (and each MIG instance) has a handle.
// A GPU's compute processes are the topology's "processes" (other programs) plus the primary contexts that
// processes using the fake driver hold on it, read from $GPUGUARD_FAKE_GPU_STATE_DIR (<dir>/<uuid>/<pid>, the
// bytes in use), skipping pids that no longer exist. The answers follow nvml.h's documentation; README.md in this
// folder lists the differences.
#include <dirent.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "topology.h"

namespace {

enum : int {
  kSuccess = 0,
  kUninitialized = 1,
  kInvalidArgument = 2,
  kNotFound = 6,
  kInsufficientSize = 7,
  kUnknown = 999,
  kArgumentVersionMismatch = 25,
};
constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
constexpr unsigned long long kValueNotAvailable = ~0ULL;
constexpr unsigned int kNoInstance = 0xFFFFFFFFu;

struct ProcessInfo {  // nvmlProcessInfo_t
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
struct Memory {  // nvmlMemory_t
  unsigned long long total, free, used;
};
struct MemoryV2 {  // nvmlMemory_v2_t
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(MemoryV2)) | (2u << 24);

// A handle: the GPU, and the MIG instance (-1: the whole GPU).
struct Handle {
  int gpu = 0;
  int instance = -1;
};

struct State {
  std::mutex mutex;
  int init_count = 0;
  gpuguard_fake::Topology topology;
  std::vector<Handle*> handles;  // one per GPU and MIG instance, made at the first init, never freed
};

State& state() {
  static State* s = new State();
  return *s;
}

bool initialized() { return state().init_count > 0; }

const gpuguard_fake::FakeGpu& device_of(const Handle* h) {
  const auto& g = state().topology.gpus[static_cast<size_t>(h->gpu)];
  return h->instance < 0 ? g : g.mig[static_cast<size_t>(h->instance)];
}

bool valid(const void* handle) {
  for (const Handle* h : state().handles) {
    if (h == handle) return true;
  }
  return false;
}

bool alive(unsigned int pid) { return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// The contexts the fake driver's processes hold on the device with this uuid.
void recorded_contexts(const std::string& uuid, unsigned int gi, std::vector<ProcessInfo>& out) {
  const std::string dir = gpuguard_fake::gpu_state_dir();
  if (dir.empty()) return;
  DIR* d = opendir((dir + "/" + uuid).c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    unsigned long pid = std::strtoul(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid == 0 || !alive(static_cast<unsigned int>(pid))) continue;
    unsigned long long bytes = 0;
    if (FILE* f = std::fopen((dir + "/" + uuid + "/" + e->d_name).c_str(), "r")) {
      if (std::fscanf(f, "%llu", &bytes) != 1) bytes = 0;
      std::fclose(f);
    }
    out.push_back(ProcessInfo{static_cast<unsigned int>(pid), bytes, gi, gi == kNoInstance ? kNoInstance : 0});
  }
  closedir(d);
}

void processes_of(const gpuguard_fake::FakeGpu& device, unsigned int gi, std::vector<ProcessInfo>& out) {
  for (const auto& p : device.processes) {
    out.push_back(ProcessInfo{p.pid, p.used_mib < 0 ? kValueNotAvailable : static_cast<unsigned long long>(p.used_mib) * kMiB,
                              gi, gi == kNoInstance ? kNoInstance : 0});
  }
  recorded_contexts(device.uuid, gi, out);
}

// A MIG-enabled GPU's handle aggregates its instances (nvml.h: "In MIG mode, if device handle is provided, the API
// returns aggregate information"); an instance's lists its own, with its GPU instance id (its position + 1 here).
std::vector<ProcessInfo> processes(const Handle* h) {
  std::vector<ProcessInfo> out;
  const auto& gpu = state().topology.gpus[static_cast<size_t>(h->gpu)];
  if (h->instance >= 0) {
    processes_of(gpu.mig[static_cast<size_t>(h->instance)], static_cast<unsigned int>(h->instance + 1), out);
    return out;
  }
  processes_of(gpu, kNoInstance, out);
  for (size_t m = 0; m < gpu.mig.size(); ++m) processes_of(gpu.mig[m], static_cast<unsigned int>(m + 1), out);
  return out;
}

unsigned long long used_by_processes(const Handle* h) {
  unsigned long long sum = 0;
  for (const auto& p : processes(h)) sum += p.usedGpuMemory == kValueNotAvailable ? 0 : p.usedGpuMemory;
  return sum;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.init_count > 0) {  // reference counted, as NVML's
    ++s.init_count;
    return kSuccess;
  }
  try {
    s.topology = gpuguard_fake::load_topology();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuguard fake NVML: %s\n", e.what());
    return kUnknown;
  }
  if (s.handles.empty()) {
    for (size_t i = 0; i < s.topology.gpus.size(); ++i) {
      s.handles.push_back(new Handle{static_cast<int>(i), -1});
      for (size_t m = 0; m < s.topology.gpus[i].mig.size(); ++m) {
        s.handles.push_back(new Handle{static_cast<int>(i), static_cast<int>(m)});
      }
    }
  }
  s.init_count = 1;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.init_count == 0) return kUninitialized;
  --s.init_count;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int result) {
  switch (result) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case kNotFound: return "Not Found";
    case kInsufficientSize: return "Insufficient Size";
    case kArgumentVersionMismatch: return "Argument version mismatch";
    default: return "Unknown Error";
  }
}

__attribute__((visibility("default"))) int nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (!initialized()) return kUninitialized;
  if (version == nullptr) return kInvalidArgument;
  const std::string& v = state().topology.nvml_driver_version;
  if (length < v.size() + 1) return kInsufficientSize;
  std::memcpy(version, v.c_str(), v.size() + 1);
  return kSuccess;
}

// An exact UUID of a GPU or MIG instance ("GPU-..." / "MIG-...", lowercase as NVML prints them).
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  if (!initialized()) return kUninitialized;
  if (uuid == nullptr || device == nullptr) return kInvalidArgument;
  const std::string wanted = uuid;
  if (wanted.rfind("GPU-", 0) != 0 && wanted.rfind("MIG-", 0) != 0) return kInvalidArgument;
  for (Handle* h : state().handles) {
    if (device_of(h).uuid == wanted) {
      *device = h;
      return kSuccess;
    }
  }
  return kNotFound;
}

// nvml.h's formats: domain:bus:device.function, domain:bus:device, bus:device.function (hex). A MIG-enabled GPU's
// bus id names the GPU itself.
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  if (!initialized()) return kUninitialized;
  if (bus_id == nullptr || device == nullptr) return kInvalidArgument;
  unsigned domain = 0, bus = 0, dev = 0, function = 0;
  int used = 0;
  const int length = static_cast<int>(std::strlen(bus_id));
  if (!((std::sscanf(bus_id, "%x:%x:%x.%x%n", &domain, &bus, &dev, &function, &used) == 4 && used == length) ||
        (std::sscanf(bus_id, "%x:%x:%x%n", &domain, &bus, &dev, &used) == 3 && used == length) ||
        ((domain = 0), std::sscanf(bus_id, "%x:%x.%x%n", &bus, &dev, &function, &used) == 3 && used == length))) {
    return kInvalidArgument;
  }
  for (Handle* h : state().handles) {
    const auto& g = device_of(h);
    if (h->instance < 0 && static_cast<unsigned>(g.pci_domain) == domain && static_cast<unsigned>(g.pci_bus) == bus &&
        static_cast<unsigned>(g.pci_device) == dev && function == 0) {
      *device = h;
      return kSuccess;
    }
  }
  return kNotFound;
}

// nvml.h: "The total amount is equal to the sum of the amounts of free and used memory"; used includes the
// driver's reserve.
__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo(void* device, Memory* memory) {
  if (!initialized()) return kUninitialized;
  if (!valid(device) || memory == nullptr) return kInvalidArgument;
  const Handle* h = static_cast<const Handle*>(device);
  const unsigned long long total = static_cast<unsigned long long>(device_of(h).memory_mib) * kMiB;
  unsigned long long used = static_cast<unsigned long long>(state().topology.nvml_reserved_mib) * kMiB + used_by_processes(h);
  if (used > total) used = total;
  *memory = Memory{total, total - used, used};
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo_v2(void* device, MemoryV2* memory) {
  if (!initialized()) return kUninitialized;
  if (!valid(device) || memory == nullptr) return kInvalidArgument;
  if (memory->version != kMemoryV2Version) return kArgumentVersionMismatch;
  Memory v1{};
  nvmlDeviceGetMemoryInfo(device, &v1);
  memory->total = v1.total;
  memory->reserved = static_cast<unsigned long long>(state().topology.nvml_reserved_mib) * kMiB;
  memory->free = v1.free;
  memory->used = v1.used;
  return kSuccess;
}

// nvml.h: "call this function with *infoCount = 0. The return code will be NVML_ERROR_INSUFFICIENT_SIZE, or
// NVML_SUCCESS if none are running. For this call infos is allowed to be NULL"; a count too small is
// NVML_ERROR_INSUFFICIENT_SIZE with the count needed.
__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count,
                                                                                 ProcessInfo* infos) {
  if (!initialized()) return kUninitialized;
  if (!valid(device) || count == nullptr) return kInvalidArgument;
  const std::vector<ProcessInfo> found = processes(static_cast<const Handle*>(device));
  if (*count < found.size()) {
    *count = static_cast<unsigned int>(found.size());
    return kInsufficientSize;
  }
  if (infos == nullptr && !found.empty()) return kInvalidArgument;
  for (size_t i = 0; i < found.size(); ++i) infos[i] = found[i];
  *count = static_cast<unsigned int>(found.size());
  return kSuccess;
}

}  // extern "C"
