// Fake NCCL (libgpuguard_fake_nccl.so): the NCCL entry points gpuguard uses, driven by the "nccl" section of
// the topology in $GPUGUARD_FAKE_TOPOLOGY. Test fixture only; never shipped.
//
// Ranks of one communicator really meet: they are separate processes that share a directory named after the
// unique id ($GPUGUARD_FAKE_NCCL_DIR/<id>, default /tmp/gpuguard-fake-nccl-<uid>/<id>). Each rank writes its
// device there at init, and, like NCCL, a rank fails with ncclInvalidUsage and "Duplicate GPU detected : rank
// A and rank B both on CUDA device <bus id>" when another rank on its host uses the same PCI bus id.
// All-reduce really sums the ranks' buffers (the fake driver's device memory is host memory).
// Behaviours (topology "nccl.behavior"): ok; duplicate (ranks 0 and 1 report a duplicate GPU as if they
// shared rank 0's device); hang (init never completes); hang_unless_p2p_disabled (the first all-reduce never
// completes unless NCCL_P2P_DISABLE=1). A communicator that never completes stays ncclInProgress until
// ncclCommAbort, which is what real NCCL does in non-blocking mode.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "topology.h"

namespace {

enum : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

constexpr char kIdMagic[] = "gpuguard-fake-nccl:";
constexpr size_t kIdBytes = 128;
struct UniqueId {
  char internal[kIdBytes];
};
struct ConfigV21400 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};

struct Comm {
  std::string dir;
  int rank = 0;
  int nranks = 1;
  bool blocking = true;
  int state = ncclInProgress;
  bool initialised = false;
  std::string behavior;
  std::string bus_id;
  std::string uuid;
  unsigned long long host_hash = 0;
  std::string last_error;
  // the all-reduce in flight
  bool reduce_pending = false;
  int reduce_seq = 0;
  float* recv = nullptr;
  size_t count = 0;
};

std::mutex g_mutex;
std::string g_last_error;

void set_error(Comm* comm, const std::string& text) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last_error = text;
  if (comm != nullptr) comm->last_error = text;
}

std::string base_dir() {
  const char* env = std::getenv("GPUGUARD_FAKE_NCCL_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return "/tmp/gpuguard-fake-nccl-" + std::to_string(getuid());
}

bool write_atomically(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return false;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream buf;
  buf << in.rdbuf();
  out = buf.str();
  return true;
}

// NCCL's host hash: DJB2a over hostname + boot id, or over $NCCL_HOSTID.
unsigned long long host_hash() {
  char name[1024] = {0};
  gethostname(name, sizeof(name) - 1);
  std::string s;
  if (const char* id = std::getenv("NCCL_HOSTID")) {
    s = id;
  } else {
    std::string boot;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    in >> boot;
    s = std::string(name) + boot;
  }
  unsigned long long h = 5381;
  for (char c : s) h = ((h << 5) + h) ^ static_cast<unsigned long long>(static_cast<long long>(c));
  return h;
}

// The device of the current context, asked of the fake driver as real NCCL asks the CUDA runtime.
bool current_device(std::string& uuid, std::string& bus_id, std::string& why) {
  const char* path = std::getenv("GPUGUARD_LIBCUDA");
  if (path == nullptr) path = "libcuda.so.1";
  void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen(path, RTLD_NOW);
  if (lib == nullptr) {
    why = std::string("Cuda failure: cannot load ") + path;
    return false;
  }
  using GetDevice = int (*)(int*);
  using GetUuid = int (*)(unsigned char*, int);
  using GetBus = int (*)(char*, int, int);
  auto get_device = reinterpret_cast<GetDevice>(dlsym(lib, "cuCtxGetDevice"));
  auto get_uuid = reinterpret_cast<GetUuid>(dlsym(lib, "cuDeviceGetUuid_v2"));
  auto get_bus = reinterpret_cast<GetBus>(dlsym(lib, "cuDeviceGetPCIBusId"));
  int device = -1;
  if (get_device == nullptr || get_uuid == nullptr || get_bus == nullptr || get_device(&device) != 0) {
    why = "Cuda failure 'invalid device context' (no current CUDA device)";
    return false;
  }
  unsigned char raw[16];
  char bus[64] = {0};
  if (get_uuid(raw, device) != 0 || get_bus(bus, sizeof(bus) - 1, device) != 0) {
    why = "Cuda failure 'invalid device ordinal'";
    return false;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", raw[0],
                raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8], raw[9], raw[10], raw[11], raw[12],
                raw[13], raw[14], raw[15]);
  uuid = text;
  bus_id = bus;
  return true;
}

// NCCL prints the bus id as a number: the string with ':' and '.' dropped, read as hex (0000:18:00.0 -> 18000).
std::string bus_id_number(const std::string& bus) {
  std::string digits;
  for (char c : bus) if (c != ':' && c != '.') digits += c;
  char out[32];
  std::snprintf(out, sizeof(out), "%llx", std::strtoull(digits.c_str(), nullptr, 16));
  return out;
}

std::string peer_path(const Comm& c, int rank) { return c.dir + "/peer." + std::to_string(rank); }
std::string reduce_path(const Comm& c, int seq, int rank) {
  return c.dir + "/allreduce" + std::to_string(seq) + "." + std::to_string(rank);
}

void progress_init(Comm& c) {
  if (c.behavior == "hang") return;
  std::vector<std::string> peers(static_cast<size_t>(c.nranks));
  for (int r = 0; r < c.nranks; ++r) {
    if (!read_file(peer_path(c, r), peers[static_cast<size_t>(r)])) return;  // not everyone is here yet
  }
  if (c.behavior == "duplicate" && c.nranks >= 2 && c.rank <= 1) {
    std::istringstream first(peers[0]);
    std::string uuid0, bus0;
    first >> uuid0 >> bus0;
    set_error(&c, "Duplicate GPU detected : rank " + std::to_string(c.rank) + " and rank " + std::to_string(1 - c.rank) +
                      " both on CUDA device " + bus_id_number(bus0));
    c.state = ncclInvalidUsage;
    return;
  }
  for (int r = 0; r < c.nranks; ++r) {
    if (r == c.rank) continue;
    std::istringstream in(peers[static_cast<size_t>(r)]);
    std::string uuid, bus;
    unsigned long long hash = 0;
    in >> uuid >> bus >> hash;
    // NCCL compares host hash and bus id (not the UUID), exactly so.
    if (hash == c.host_hash && bus == c.bus_id) {
      set_error(&c, "Duplicate GPU detected : rank " + std::to_string(c.rank) + " and rank " + std::to_string(r) +
                        " both on CUDA device " + bus_id_number(c.bus_id));
      c.state = ncclInvalidUsage;
      return;
    }
  }
  c.initialised = true;
  c.state = ncclSuccess;
}

void progress_reduce(Comm& c) {
  if (c.behavior == "hang_all_reduce") return;  // a fabric fault that disabling P2P does not cure
  if (c.behavior == "hang_unless_p2p_disabled") {
    const char* p2p = std::getenv("NCCL_P2P_DISABLE");
    if (p2p == nullptr || std::string(p2p) != "1") return;
  }
  std::vector<float> sum(c.count, 0.0f);
  for (int r = 0; r < c.nranks; ++r) {
    std::string data;
    if (!read_file(reduce_path(c, c.reduce_seq, r), data)) return;
    if (data.size() != c.count * sizeof(float)) {
      set_error(&c, "fake NCCL: rank " + std::to_string(r) + " reduced a different element count");
      c.state = ncclInvalidUsage;
      c.reduce_pending = false;
      return;
    }
    for (size_t i = 0; i < c.count; ++i) {
      float v;
      std::memcpy(&v, data.data() + i * sizeof(float), sizeof(float));
      sum[i] += v;
    }
  }
  std::memcpy(c.recv, sum.data(), c.count * sizeof(float));
  c.reduce_pending = false;
  ++c.reduce_seq;
  c.state = ncclSuccess;
}

void progress(Comm& c) {
  if (c.state != ncclInProgress) return;
  if (!c.initialised) {
    progress_init(c);
  } else if (c.reduce_pending) {
    progress_reduce(c);
  }
}

int finish(Comm& c) {
  progress(c);
  if (!c.blocking) return c.state;
  while (c.state == ncclInProgress) {  // blocking mode: wait as NCCL does (forever, for a hang)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    progress(c);
  }
  return c.state;
}

gpuguard_fake::Topology topology_or_default() {
  try {
    return gpuguard_fake::load_topology();
  } catch (const std::exception&) {
    return gpuguard_fake::Topology{};
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const char* ncclGetErrorString(int result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

__attribute__((visibility("default"))) const char* ncclGetLastError(Comm* comm) {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lock(g_mutex);
  copy = comm != nullptr ? comm->last_error : g_last_error;
  return copy.c_str();
}

__attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = topology_or_default().nccl_version;
  return ncclSuccess;
}

__attribute__((visibility("default"))) int ncclGetUniqueId(UniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id->internal, 0, kIdBytes);
  std::random_device rd;
  std::string text = kIdMagic;
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) text += hex[rd() % 16];
  std::memcpy(id->internal, text.data(), text.size());
  return ncclSuccess;
}

__attribute__((visibility("default"))) int ncclCommInitRankConfig(Comm** out, int nranks, UniqueId id, int rank,
                                                                  ConfigV21400* config) {
  if (out == nullptr) return ncclInvalidArgument;
  *out = nullptr;
  if (config != nullptr && config->magic != 0xcafebeef) {
    set_error(nullptr, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    set_error(nullptr, "Invalid rank requested : " + std::to_string(rank) + "/" + std::to_string(nranks));
    return ncclInvalidArgument;
  }
  if (std::strncmp(id.internal, kIdMagic, std::strlen(kIdMagic)) != 0) {
    set_error(nullptr, "fake NCCL: the unique id was not made by ncclGetUniqueId");
    return ncclInvalidArgument;
  }
  auto* c = new Comm();
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = config == nullptr || config->blocking != 0;
  c->behavior = topology_or_default().nccl_behavior;
  c->host_hash = host_hash();
  std::string why;
  if (!current_device(c->uuid, c->bus_id, why)) {
    set_error(c, why);
    delete c;
    return ncclUnhandledCudaError;
  }
  std::string base = base_dir();
  std::string name(id.internal + std::strlen(kIdMagic), 32);
  c->dir = base + "/" + name;
  mkdir(base.c_str(), 0700);
  if (mkdir(c->dir.c_str(), 0700) != 0 && errno != EEXIST) {
    set_error(c, "fake NCCL: cannot create " + c->dir + ": " + std::strerror(errno));
    delete c;
    return ncclSystemError;
  }
  std::string me = c->uuid + " " + c->bus_id + " " + std::to_string(c->host_hash) + " " + std::to_string(getpid()) + "\n";
  if (!write_atomically(peer_path(*c, rank), me)) {
    set_error(c, "fake NCCL: cannot write to " + c->dir);
    delete c;
    return ncclSystemError;
  }
  *out = c;
  int rc = finish(*c);
  return c->blocking ? rc : (rc == ncclSuccess ? ncclSuccess : ncclInProgress);
}

__attribute__((visibility("default"))) int ncclCommGetAsyncError(Comm* comm, int* state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  progress(*comm);
  *state = comm->state;
  return ncclSuccess;
}

__attribute__((visibility("default"))) int ncclAllReduce(const void* send, void* recv, size_t count, int datatype,
                                                         int op, Comm* comm, void* /*stream*/) {
  if (comm == nullptr || send == nullptr || recv == nullptr) return ncclInvalidArgument;
  if (!comm->initialised || comm->state != ncclSuccess) {
    set_error(comm, "fake NCCL: all-reduce on a communicator that is not ready");
    return ncclInvalidUsage;
  }
  if (datatype != 7 || op != 0) {
    set_error(comm, "fake NCCL: only float32 sums are implemented");
    return ncclInvalidArgument;
  }
  std::string data(static_cast<const char*>(send), count * sizeof(float));
  if (!write_atomically(reduce_path(*comm, comm->reduce_seq, comm->rank), data)) {
    set_error(comm, "fake NCCL: cannot write to " + comm->dir);
    return ncclSystemError;
  }
  comm->reduce_pending = true;
  comm->recv = static_cast<float*>(recv);
  comm->count = count;
  comm->state = ncclInProgress;
  int rc = finish(*comm);
  return comm->blocking ? rc : (rc == ncclSuccess ? ncclSuccess : ncclInProgress);
}

__attribute__((visibility("default"))) int ncclCommAbort(Comm* comm) {
  delete comm;
  return ncclSuccess;
}

__attribute__((visibility("default"))) int ncclCommDestroy(Comm* comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  delete comm;
  return ncclSuccess;
}

}  // extern "C"
