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
//
// Streams and events, as the GPU runs them: work is enqueued and the call returns; it completes later, in
// order per stream, and the host learns of it at a query (cuStreamQuery, cuEventQuery) or blocks for it at a
// synchronisation (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize, a synchronous copy). There are no
// kernels: a work item is a poll function (gpuguardFakeStreamEnqueue, below), which the fake NCCL uses for its
// collectives. A background thread keeps polling pending items, as a GPU runs without the host looking.
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  kInvalidHandle = 400,
  kNotReady = 600,
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
// The current context is per thread, as in the real driver: a thread that never set one has none.
thread_local int current_device = -1;

// ---- primary contexts and what they hold (for the fake NVML) -----------------------------------------------

// A device's primary context is active from its first cuDevicePrimaryCtxRetain until as many releases, as in
// the driver. While it is, and $GPUGUARD_FAKE_GPU_STATE_DIR is set, <dir>/<device uuid>/<pid> holds the bytes it
// uses (the topology's context_mib plus the device memory allocated in it), which the fake NVML lists.
struct PrimaryContexts {
  std::mutex mutex;
  std::map<int, int> retained;                 // visible ordinal -> retain count
  std::map<int, unsigned long long> allocated;  // visible ordinal -> bytes from cuMemAlloc_v2
};

PrimaryContexts& primary_contexts() {
  static auto* p = new PrimaryContexts();
  return *p;
}

// With primary_contexts().mutex held.
void record_context(int device) {
  const std::string dir = gpuguard_fake::gpu_state_dir();
  if (dir.empty()) return;
  PrimaryContexts& p = primary_contexts();
  const std::string gpu_dir = dir + "/" + state().visible_devices[static_cast<size_t>(device)]->uuid;
  const std::string file = gpu_dir + "/" + std::to_string(getpid());
  if (p.retained[device] <= 0) {
    unlink(file.c_str());
    return;
  }
  mkdir(dir.c_str(), 0777);
  mkdir(gpu_dir.c_str(), 0777);
  const unsigned long long bytes =
      static_cast<unsigned long long>(state().topology.context_mib) * 1024 * 1024 + p.allocated[device];
  const std::string tmp = file + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%llu\n", bytes);
    std::fclose(f);
    std::rename(tmp.c_str(), file.c_str());  // the fake NVML never reads half a file
  }
}

// ---- streams and events -------------------------------------------------------------------------------------

using PollFn = int (*)(void* ctx);
using ReleaseFn = void (*)(void* ctx);

struct WorkItem {
  unsigned long long seq;
  PollFn poll;
  void* ctx;
  ReleaseFn release;
};

struct Stream {
  int device = 0;
  unsigned int flags = 0;     // CU_STREAM_NON_BLOCKING = 1
  bool destroyed = false;     // cuStreamDestroy'ed: dropped once its work is done, as the driver does
  std::deque<WorkItem> pending;
  unsigned long long enqueued = 0;   // seq of the last item enqueued
  unsigned long long completed = 0;  // seq of the last item completed (items complete in order)
  bool polling = false;              // a thread is calling the front item's poll, outside the lock
};

struct Event {
  int device = 0;
  std::shared_ptr<Stream> stream;  // null until recorded: an unrecorded event counts as complete
  unsigned long long target = 0;   // complete once stream->completed reaches it
};

struct Streams {
  std::mutex mutex;
  std::condition_variable changed;  // an item completed, or one was enqueued
  std::vector<std::shared_ptr<Stream>> all;            // every stream with a device: legacy, live, draining
  std::map<Stream*, std::shared_ptr<Stream>> handles;  // streams the caller may still name
  std::map<int, std::shared_ptr<Stream>> legacy;       // device -> its legacy default stream
  std::map<Event*, std::unique_ptr<Event>> events;
  bool progress_started = false;
};

Streams* g_streams = nullptr;

// After fork() the child has no progress thread, and maybe a mutex held by a thread it does not have. The real
// driver cannot be used in a forked child at all; here the child simply starts over without streams.
void reset_streams_in_child() { g_streams = new Streams(); }

Streams& streams() {
  static const bool registered = [] {
    g_streams = new Streams();  // never destroyed: the progress thread may outlive static destructors
    pthread_atfork(nullptr, nullptr, reset_streams_in_child);
    return true;
  }();
  (void)registered;
  return *g_streams;
}

// Handles 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) name the current context's default stream.
int resolve_stream(Streams& ss, void* handle, std::shared_ptr<Stream>& out) {
  auto value = reinterpret_cast<uintptr_t>(handle);
  if (value <= 2) {
    if (current_device < 0) return kInvalidContext;
    auto& legacy = ss.legacy[current_device];
    if (!legacy) {
      legacy = std::make_shared<Stream>();
      legacy->device = current_device;
      ss.all.push_back(legacy);
    }
    out = legacy;
    return kSuccess;
  }
  auto it = ss.handles.find(static_cast<Stream*>(handle));
  if (it == ss.handles.end()) return kInvalidHandle;
  out = it->second;
  return kSuccess;
}

// Polls the stream's front items, in order, until one is not done. The poll runs outside the lock (it may be
// slow, or call back into the driver); `lock` holds ss.mutex on entry and on return.
void advance(Streams& ss, Stream& s, std::unique_lock<std::mutex>& lock) {
  while (!s.pending.empty() && !s.polling) {
    WorkItem item = s.pending.front();
    s.polling = true;
    lock.unlock();
    bool done = item.poll(item.ctx) != 0;
    if (done && item.release != nullptr) item.release(item.ctx);
    lock.lock();
    s.polling = false;
    if (!done) break;
    s.pending.pop_front();
    s.completed = item.seq;
    ss.changed.notify_all();
  }
}

// The GPU: polls every stream with pending work, about every millisecond, whoever is looking.
void progress_loop(Streams* ss) {
  std::unique_lock<std::mutex> lock(ss->mutex);
  for (;;) {
    std::vector<std::shared_ptr<Stream>> busy;
    for (auto& s : ss->all) {
      if (!s->pending.empty()) busy.push_back(s);
    }
    if (busy.empty()) {
      ss->changed.wait(lock);
      continue;
    }
    for (auto& s : busy) advance(*ss, *s, lock);
    // destroyed streams leave once drained
    for (size_t i = 0; i < ss->all.size();) {
      if (ss->all[i]->destroyed && ss->all[i]->pending.empty()) {
        ss->all.erase(ss->all.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    ss->changed.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void start_progress(Streams& ss) {
  if (ss.progress_started) return;
  ss.progress_started = true;
  std::thread(progress_loop, &ss).detach();
}

// Blocks until `s` has completed everything up to `target` (forever, for work that never completes: the real
// driver has no timeout either).
void wait_for(Streams& ss, const std::shared_ptr<Stream>& s, unsigned long long target,
              std::unique_lock<std::mutex>& lock) {
  for (;;) {
    advance(ss, *s, lock);
    if (s->completed >= target) return;
    ss.changed.wait_for(lock, std::chrono::milliseconds(2));
  }
}

// Waits for the current context's streams: all of them (cuCtxSynchronize), or, for a synchronous copy, those
// that synchronise with the legacy default stream (every stream not created CU_STREAM_NON_BLOCKING).
int synchronize_context(bool blocking_streams_only) {
  if (current_device < 0) return kInvalidContext;
  Streams& ss = streams();
  std::unique_lock<std::mutex> lock(ss.mutex);
  std::vector<std::pair<std::shared_ptr<Stream>, unsigned long long>> targets;
  for (auto& s : ss.all) {
    if (s->device != current_device) continue;
    if (blocking_streams_only && (s->flags & 1u) != 0) continue;
    targets.emplace_back(s, s->enqueued);
  }
  for (auto& [s, target] : targets) wait_for(ss, s, target, lock);
  return kSuccess;
}

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
    case kInvalidHandle: *name = "CUDA_ERROR_INVALID_HANDLE"; return kSuccess;
    case kNotReady: *name = "CUDA_ERROR_NOT_READY"; return kSuccess;
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
    case kInvalidHandle: *text = "invalid resource handle"; return kSuccess;
    case kNotReady: *text = "device not ready"; return kSuccess;
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

// Active from the first retain until as many releases; asking creates nothing, as in the driver.
__attribute__((visibility("default"))) int cuDevicePrimaryCtxGetState(int device, unsigned int* flags, int* active) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (flags == nullptr || active == nullptr) return kInvalidValue;
  PrimaryContexts& p = primary_contexts();
  std::lock_guard<std::mutex> lock(p.mutex);
  *flags = 0;
  *active = p.retained[device] > 0 ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxRetain(void** context, int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  if (context == nullptr) return kInvalidValue;
  *context = context_for(device);
  PrimaryContexts& p = primary_contexts();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (++p.retained[device] == 1) record_context(device);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDevicePrimaryCtxRelease_v2(int device) {
  int rc = check_device(device);
  if (rc != kSuccess) return rc;
  PrimaryContexts& p = primary_contexts();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.retained[device] <= 0) return kInvalidContext;  // released more often than retained
  if (--p.retained[device] == 0) {
    p.allocated[device] = 0;  // the context's memory goes with it
    record_context(device);
  }
  return kSuccess;
}

__attribute__((visibility("default"))) int cuCtxSetCurrent(void* context) {
  if (context == nullptr) {  // unbinds the thread's context, as the driver does
    current_device = -1;
    return kSuccess;
  }
  int device = device_of_context(context);
  int rc = check_device(device);
  if (rc != kSuccess) return kInvalidContext;
  current_device = device;
  return kSuccess;
}

// Which device the current context belongs to: the fake NCCL asks this, as real NCCL asks the runtime.
__attribute__((visibility("default"))) int cuCtxGetCurrent(void** context) {
  if (context == nullptr) return kInvalidValue;
  if (!state().initialized) return kNotInitialized;  // as the real driver answers before cuInit
  *context = current_device < 0 ? nullptr : context_for(current_device);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuCtxGetDevice(int* device) {
  if (device == nullptr) return kInvalidValue;
  if (current_device < 0) return kInvalidContext;
  *device = current_device;
  return kSuccess;
}

// Blocks until every stream of the current context has finished what was enqueued before the call.
__attribute__((visibility("default"))) int cuCtxSynchronize() { return synchronize_context(false); }

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
  {
    PrimaryContexts& p = primary_contexts();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.allocated[current_device] += bytes;
    record_context(current_device);
  }
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
      {
        PrimaryContexts& p = primary_contexts();
        std::lock_guard<std::mutex> lock(p.mutex);
        unsigned long long& held = p.allocated[all[i]->device];
        held -= std::min<unsigned long long>(held, all[i]->bytes.size());
        record_context(all[i]->device);
      }
      delete all[i];
      all.erase(all.begin() + static_cast<long>(i));
      return kSuccess;
    }
  }
  return kInvalidValue;
}

// The synchronous copies run on the legacy default stream: they wait for the work enqueued before them on every
// stream that synchronises with it (a copy to the host is where a program blocks on a hung kernel).
__attribute__((visibility("default"))) int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
  if (find_allocation(dst, bytes) == nullptr || src == nullptr) return kInvalidValue;
  if (current_device >= 0) synchronize_context(true);
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
  if (find_allocation(src, bytes) == nullptr || dst == nullptr) return kInvalidValue;
  if (current_device >= 0) synchronize_context(true);
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

// ---- streams and events (see the top of this file) ----------------------------------------------------------

__attribute__((visibility("default"))) int cuStreamCreate(void** stream, unsigned int flags) {
  if (stream == nullptr || flags > 1) return kInvalidValue;
  if (current_device < 0) return kInvalidContext;
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mutex);
  auto s = std::make_shared<Stream>();
  s->device = current_device;
  s->flags = flags;
  ss.all.push_back(s);
  ss.handles[s.get()] = s;
  *stream = s.get();
  return kSuccess;
}

// Like the driver, returns at once; work still pending on the stream completes, then the stream goes.
__attribute__((visibility("default"))) int cuStreamDestroy_v2(void* stream) {
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return kInvalidHandle;
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mutex);
  auto it = ss.handles.find(static_cast<Stream*>(stream));
  if (it == ss.handles.end()) return kInvalidHandle;
  it->second->destroyed = true;
  if (it->second->pending.empty()) {
    for (size_t i = 0; i < ss.all.size(); ++i) {
      if (ss.all[i] == it->second) {
        ss.all.erase(ss.all.begin() + static_cast<long>(i));
        break;
      }
    }
  }
  ss.handles.erase(it);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuStreamQuery(void* stream) {
  Streams& ss = streams();
  std::unique_lock<std::mutex> lock(ss.mutex);
  std::shared_ptr<Stream> s;
  int rc = resolve_stream(ss, stream, s);
  if (rc != kSuccess) return rc;
  advance(ss, *s, lock);
  return s->pending.empty() ? kSuccess : kNotReady;
}

__attribute__((visibility("default"))) int cuStreamSynchronize(void* stream) {
  Streams& ss = streams();
  std::unique_lock<std::mutex> lock(ss.mutex);
  std::shared_ptr<Stream> s;
  int rc = resolve_stream(ss, stream, s);
  if (rc != kSuccess) return rc;
  wait_for(ss, s, s->enqueued, lock);
  return kSuccess;
}

#ifndef GPUGUARD_FAKE_CUDA_WITHOUT_EVENTS  // libgpuguard_fake_cuda_without_events.so: a driver lacking them
__attribute__((visibility("default"))) int cuEventCreate(void** event, unsigned int flags) {
  if (event == nullptr || flags > 7) return kInvalidValue;
  if (current_device < 0) return kInvalidContext;
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mutex);
  auto e = std::make_unique<Event>();
  e->device = current_device;
  *event = e.get();
  ss.events[e.get()] = std::move(e);
  return kSuccess;
}

// The event completes once everything enqueued on the stream before it has.
__attribute__((visibility("default"))) int cuEventRecord(void* event, void* stream) {
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mutex);
  auto it = ss.events.find(static_cast<Event*>(event));
  if (it == ss.events.end()) return kInvalidHandle;
  std::shared_ptr<Stream> s;
  int rc = resolve_stream(ss, stream, s);
  if (rc != kSuccess) return rc;
  if (s->device != it->second->device) return kInvalidHandle;  // event and stream of different contexts
  it->second->stream = s;
  it->second->target = s->enqueued;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuEventQuery(void* event) {
  Streams& ss = streams();
  std::unique_lock<std::mutex> lock(ss.mutex);
  auto it = ss.events.find(static_cast<Event*>(event));
  if (it == ss.events.end()) return kInvalidHandle;
  std::shared_ptr<Stream> s = it->second->stream;
  unsigned long long target = it->second->target;
  if (!s) return kSuccess;
  if (s->completed < target) advance(ss, *s, lock);
  return s->completed >= target ? kSuccess : kNotReady;
}

__attribute__((visibility("default"))) int cuEventSynchronize(void* event) {
  Streams& ss = streams();
  std::unique_lock<std::mutex> lock(ss.mutex);
  auto it = ss.events.find(static_cast<Event*>(event));
  if (it == ss.events.end()) return kInvalidHandle;
  std::shared_ptr<Stream> s = it->second->stream;
  if (s) wait_for(ss, s, it->second->target, lock);
  return kSuccess;
}

__attribute__((visibility("default"))) int cuEventDestroy_v2(void* event) {
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mutex);
  return ss.events.erase(static_cast<Event*>(event)) == 1 ? kSuccess : kInvalidHandle;
}

#endif  // GPUGUARD_FAKE_CUDA_WITHOUT_EVENTS

// Not a driver entry point: the fake's stand-in for a kernel launch. Enqueues on `stream` (0: the current
// context's legacy default stream) a work item that is complete once poll(ctx) returns 1; poll is called
// from any thread, one call at a time, only once every item enqueued before it on the stream is complete, and
// never again after it returned 1. release(ctx), if given, is called once, after the last poll. Returns a
// CUresult (CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE for a bad stream). The fake NCCL finds it
// with dlsym.
__attribute__((visibility("default"))) int gpuguardFakeStreamEnqueue(void* stream, PollFn poll, void* ctx,
                                                                     ReleaseFn release) {
  if (poll == nullptr) return kInvalidValue;
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mutex);
  std::shared_ptr<Stream> s;
  int rc = resolve_stream(ss, stream, s);
  if (rc != kSuccess) return rc;
  s->pending.push_back(WorkItem{++s->enqueued, poll, ctx, release});
  start_progress(ss);
  ss.changed.notify_all();
  return kSuccess;
}

}  // extern "C"
