// Fake NCCL (libgpuguard_fake_nccl.so): the NCCL entry points gpuguard uses, driven by the "nccl" section of
// the topology in $GPUGUARD_FAKE_TOPOLOGY. Test fixture only; never shipped.
//
// Ranks of one communicator really meet: they are separate processes that share a directory named after the
// unique id ($GPUGUARD_FAKE_NCCL_DIR/<id>, default /tmp/gpuguard-fake-nccl-<uid>/<id>). Each rank writes its
// device there at init, and, like NCCL, a rank fails with ncclInvalidUsage and "Duplicate GPU detected : rank
// A and rank B both on CUDA device <bus id>" when another rank on its host uses the same PCI bus id.
// All-reduce really sums the ranks' buffers (the fake driver's device memory is host memory). Like NCCL,
// ncclAllReduce only enqueues the collective on the caller's stream and returns (blocking and non-blocking
// communicators alike): the exchange and the sum happen later, in a work item the fake driver polls
// (gpuguardFakeStreamEnqueue), and the caller learns of completion at a host sync or an event query.
// ncclCommGetAsyncError reports the communicator (its non-blocking init, asynchronous errors), never a
// collective's progress.
// Behaviours (topology "nccl.behavior"): ok; duplicate (ranks 0 and 1 report a duplicate GPU as if they
// shared rank 0's device); hang (init never completes); hang_unless_p2p_disabled (all-reduces are enqueued but
// never complete unless NCCL_P2P_DISABLE=1); hang_all_reduce (no all-reduce ever completes). A communicator
// whose init never completes stays ncclInProgress until ncclCommAbort, which is what real NCCL does in
// non-blocking mode; ncclCommAbort also ends the collectives in flight, as it makes NCCL's kernels exit.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
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

// What outlives the communicator: the collectives in flight report their errors here, after an abort too.
struct CommErrors {
  std::atomic<int> async_error{ncclSuccess};
  std::string last_error;  // guarded by g_mutex
};

// One all-reduce enqueued on a stream: the fake driver polls it as the GPU would run its kernel. It copies what
// it needs of the communicator, which the caller may abort or destroy while it is in flight.
struct AllReduceOp {
  std::string dir;
  int rank = 0;
  int nranks = 1;
  int seq = 0;
  bool hangs = false;  // the topology's behaviour: this all-reduce never completes
  const float* send = nullptr;
  float* recv = nullptr;
  size_t count = 0;
  bool contributed = false;  // this rank's buffer was published to the others
  std::atomic<bool> aborted{false};
  std::shared_ptr<CommErrors> errors;
};

struct Comm {
  std::string dir;
  int rank = 0;
  int nranks = 1;
  bool blocking = true;
  int state = ncclInProgress;  // init: ncclInProgress until every rank is there, then ncclSuccess or an error
  bool initialised = false;
  std::string behavior;
  bool p2p_disabled = false;  // NCCL_P2P_DISABLE=1 at init, which is when NCCL reads it
  std::string bus_id;
  std::string uuid;
  int cuda_dev = 0;  // the device's index in this process, as NCCL's "[N]" prints it
  unsigned long long host_hash = 0;
  std::shared_ptr<CommErrors> errors = std::make_shared<CommErrors>();
  int reduce_seq = 0;
  std::vector<std::shared_ptr<AllReduceOp>> in_flight;  // for ncclCommAbort
};

// Leaked: a collective may still be polled by the fake driver's thread while the process exits.
std::mutex& g_mutex = *new std::mutex();
std::string& g_last_error = *new std::string();

// ncclGetLastError's text: the process's last, and the communicator's (null: none yet).
void set_last_error(CommErrors* errors, const std::string& text) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last_error = text;
  if (errors != nullptr) errors->last_error = text;
}
void set_error(Comm* comm, const std::string& text) { set_last_error(comm->errors.get(), text); }

// With NCCL_DEBUG=WARN (or INFO, TRACE), NCCL prints a WARN line on stdout as well as keeping the last error, in
// src/debug.cc's form: "[date time] host:pid:tid [cudaDev] file:line NCCL WARN text" (the timestamp since 2.23;
// the host up to its first '.'). torch's error then repeats the text after "Last error:", without the prefix.
void nccl_warn(const Comm& c, const char* where, const std::string& text) {
  const char* level = std::getenv("NCCL_DEBUG");
  std::string upper;
  for (const char* p = level; p != nullptr && *p != '\0'; ++p) upper += static_cast<char>(std::toupper(*p));
  if (upper != "WARN" && upper != "INFO" && upper != "TRACE") return;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  if (char* dot = std::strchr(host, '.')) *dot = '\0';
  char stamp[32] = {0};
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
  std::printf("[%s] %s:%d:%ld [%d] %s NCCL WARN %s\n", stamp, host, static_cast<int>(getpid()),
              static_cast<long>(gettid()), c.cuda_dev, where, text.c_str());
  std::fflush(stdout);
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

// The driver gpuguard (or the test) loaded: the one $GPUGUARD_LIBCUDA names, already in the process.
void* driver_library(std::string& why) {
  const char* path = std::getenv("GPUGUARD_LIBCUDA");
  if (path == nullptr) path = "libcuda.so.1";
  void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen(path, RTLD_NOW);
  if (lib == nullptr) why = std::string("Cuda failure: cannot load ") + path;
  return lib;
}

// The device of the current context, asked of the fake driver as real NCCL asks the CUDA runtime.
bool current_device(std::string& uuid, std::string& bus_id, int& index, std::string& why) {
  void* lib = driver_library(why);
  if (lib == nullptr) return false;
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
  index = device;
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

// Init fails as NCCL <= 2.29's does for two ranks on one GPU (src/init.cc): its WARN line, then ncclInvalidUsage
// with the same text as the last error.
void fail_as_duplicate(Comm& c, int other, const std::string& bus) {
  std::string text = "Duplicate GPU detected : rank " + std::to_string(c.rank) + " and rank " + std::to_string(other) +
                     " both on CUDA device " + bus_id_number(bus);
  nccl_warn(c, "init.cc:904", text);
  set_error(&c, text);
  c.state = ncclInvalidUsage;
}

std::string peer_path(const Comm& c, int rank) { return c.dir + "/peer." + std::to_string(rank); }
std::string reduce_path(const std::string& dir, int seq, int rank) {
  return dir + "/allreduce" + std::to_string(seq) + "." + std::to_string(rank);
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
    fail_as_duplicate(c, 1 - c.rank, bus0);
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
      fail_as_duplicate(c, r, c.bus_id);
      return;
    }
  }
  c.initialised = true;
  c.state = ncclSuccess;
}

// The all-reduce's "kernel", polled by the fake driver once everything before it on the stream is done: it
// publishes this rank's buffer as it is now, then completes once every rank's is there. Returns 1 when done.
int poll_all_reduce(void* ctx) {
  auto& op = **static_cast<std::shared_ptr<AllReduceOp>*>(ctx);
  if (op.aborted) return 1;  // ncclCommAbort makes the kernel exit
  if (op.hangs) return 0;
  if (!op.contributed) {
    std::string data(reinterpret_cast<const char*>(op.send), op.count * sizeof(float));
    if (!write_atomically(reduce_path(op.dir, op.seq, op.rank), data)) {
      set_last_error(op.errors.get(), "fake NCCL: cannot write to " + op.dir);
      op.errors->async_error = ncclSystemError;
      return 1;
    }
    op.contributed = true;
  }
  std::vector<float> sum(op.count, 0.0f);
  for (int r = 0; r < op.nranks; ++r) {
    std::string data;
    if (!read_file(reduce_path(op.dir, op.seq, r), data)) return 0;  // a peer's kernel has not started yet
    if (data.size() != op.count * sizeof(float)) {
      set_last_error(op.errors.get(), "fake NCCL: rank " + std::to_string(r) + " reduced a different element count");
      op.errors->async_error = ncclInvalidUsage;
      return 1;
    }
    for (size_t i = 0; i < op.count; ++i) {
      float v;
      std::memcpy(&v, data.data() + i * sizeof(float), sizeof(float));
      sum[i] += v;
    }
  }
  std::memcpy(op.recv, sum.data(), op.count * sizeof(float));
  return 1;
}

void release_all_reduce(void* ctx) { delete static_cast<std::shared_ptr<AllReduceOp>*>(ctx); }

// The fake driver's work-item entry point (tests/fakes/fake_cuda.cc).
using StreamEnqueue = int (*)(void* stream, int (*poll)(void*), void* ctx, void (*release)(void*));
StreamEnqueue stream_enqueue(std::string& why) {
  void* lib = driver_library(why);
  if (lib == nullptr) return nullptr;
  auto enqueue = reinterpret_cast<StreamEnqueue>(dlsym(lib, "gpuguardFakeStreamEnqueue"));
  if (enqueue == nullptr) {
    why = "fake NCCL: the CUDA driver does not export gpuguardFakeStreamEnqueue (the fake NCCL needs the fake "
          "driver: set GPUGUARD_LIBCUDA to libgpuguard_fake_cuda.so)";
  }
  return enqueue;
}

// Init only: the collectives never change the communicator's state, except by an asynchronous error.
void progress(Comm& c) {
  if (c.state == ncclInProgress && !c.initialised) progress_init(c);
  if (c.state == ncclSuccess && c.errors->async_error != ncclSuccess) c.state = c.errors->async_error;
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
  copy = comm != nullptr ? comm->errors->last_error : g_last_error;
  return copy.c_str();
}

// A copy of this library answers the version written in "<its file>.version" beside it (e.g. libnccl.so.2.version
// holding 22803), before the topology's: two copies loaded into one process, standing in for two NCCLs (a system
// one and a wheel's), then tell which of them answered.
static int version_beside_this_file() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&version_beside_this_file), &info) == 0 || info.dli_fname == nullptr) return 0;
  std::ifstream in(std::string(info.dli_fname) + ".version");
  int version = 0;
  return in >> version ? version : 0;
}

__attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  static const int beside = version_beside_this_file();
  *version = beside > 0 ? beside : topology_or_default().nccl_version;
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
    set_last_error(nullptr, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    set_last_error(nullptr, "Invalid rank requested : " + std::to_string(rank) + "/" + std::to_string(nranks));
    return ncclInvalidArgument;
  }
  if (std::strncmp(id.internal, kIdMagic, std::strlen(kIdMagic)) != 0) {
    set_last_error(nullptr, "fake NCCL: the unique id was not made by ncclGetUniqueId");
    return ncclInvalidArgument;
  }
  auto* c = new Comm();
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = config == nullptr || config->blocking != 0;
  c->behavior = topology_or_default().nccl_behavior;
  const char* p2p = std::getenv("NCCL_P2P_DISABLE");
  c->p2p_disabled = p2p != nullptr && std::string(p2p) == "1";
  c->host_hash = host_hash();
  std::string why;
  if (!current_device(c->uuid, c->bus_id, c->cuda_dev, why)) {
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

// The blocking init PyNccl-style users call (nccl.h: "implicitly synchronizes with other ranks").
__attribute__((visibility("default"))) int ncclCommInitRank(Comm** out, int nranks, UniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, nullptr);
}

__attribute__((visibility("default"))) int ncclCommGetAsyncError(Comm* comm, int* state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  progress(*comm);
  *state = comm->state;
  return ncclSuccess;
}

// Enqueues the all-reduce on `stream` (null: the legacy default stream of the current context) and returns.
__attribute__((visibility("default"))) int ncclAllReduce(const void* send, void* recv, size_t count, int datatype,
                                                         int op, Comm* comm, void* stream) {
  if (comm == nullptr || send == nullptr || recv == nullptr) return ncclInvalidArgument;
  progress(*comm);
  if (!comm->initialised || comm->state != ncclSuccess) {
    set_error(comm, "fake NCCL: all-reduce on a communicator that is not ready");
    return ncclInvalidUsage;
  }
  if (datatype != 7 || op != 0) {
    set_error(comm, "fake NCCL: only float32 sums are implemented");
    return ncclInvalidArgument;
  }
  std::string why;
  StreamEnqueue enqueue = stream_enqueue(why);
  if (enqueue == nullptr) {
    set_error(comm, why);
    return ncclUnhandledCudaError;
  }
  auto item = std::make_shared<AllReduceOp>();
  item->dir = comm->dir;
  item->rank = comm->rank;
  item->nranks = comm->nranks;
  item->seq = comm->reduce_seq;
  item->hangs = comm->behavior == "hang_all_reduce" ||  // a fabric fault that disabling P2P does not cure
                (comm->behavior == "hang_unless_p2p_disabled" && !comm->p2p_disabled);
  item->send = static_cast<const float*>(send);
  item->recv = static_cast<float*>(recv);
  item->count = count;
  item->errors = comm->errors;
  auto* ctx = new std::shared_ptr<AllReduceOp>(item);
  int rc = enqueue(stream, poll_all_reduce, ctx, release_all_reduce);
  if (rc != 0) {
    delete ctx;
    set_error(comm, "Cuda failure " + std::to_string(rc) + " enqueueing the all-reduce on stream " +
                        std::to_string(reinterpret_cast<std::uintptr_t>(stream)));
    return ncclUnhandledCudaError;
  }
  ++comm->reduce_seq;
  // forget the collectives that finished; keep those in flight for ncclCommAbort
  std::vector<std::shared_ptr<AllReduceOp>> still;
  for (auto& p : comm->in_flight) {
    if (p.use_count() > 1) still.push_back(p);  // the driver still holds it
  }
  still.push_back(item);
  comm->in_flight = std::move(still);
  return ncclSuccess;
}

__attribute__((visibility("default"))) int ncclCommAbort(Comm* comm) {
  if (comm == nullptr) return ncclSuccess;
  for (auto& item : comm->in_flight) item->aborted = true;
  delete comm;
  return ncclSuccess;
}

__attribute__((visibility("default"))) int ncclCommDestroy(Comm* comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  delete comm;
  return ncclSuccess;
}

}  // extern "C"
