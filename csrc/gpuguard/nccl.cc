// Loads NCCL with dlopen (preferring the copy already in the process) and runs the communicator probe.
#include "gpuguard/nccl.h"

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>

#include "gpuguard/cuda_driver.h"

namespace gpuguard {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Error gpuguard_error(const std::string& call, const std::string& detail, const std::string& where) {
  Error err;
  err.library = "gpuguard";
  err.call = call;
  err.detail = detail;
  err.where = where;
  return err;
}

}  // namespace

std::string nccl_version_string(int code) {
  if (code <= 0) return "unknown";
  // NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on.
  int major = 0, minor = 0, patch = 0;
  if (code < 10000) {
    major = code / 1000;
    minor = (code % 1000) / 100;
    patch = code % 100;
  } else {
    major = code / 10000;
    minor = (code % 10000) / 100;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string nccl_result_name(int code) {
  switch (code) {
    case nccl::ncclSuccess: return "ncclSuccess";
    case nccl::ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case nccl::ncclSystemError: return "ncclSystemError";
    case nccl::ncclInternalError: return "ncclInternalError";
    case nccl::ncclInvalidArgument: return "ncclInvalidArgument";
    case nccl::ncclInvalidUsage: return "ncclInvalidUsage";
    case nccl::ncclRemoteError: return "ncclRemoteError";
    case nccl::ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t " + std::to_string(code);
  }
}

Nccl& Nccl::instance() {
  static Nccl* nccl = new Nccl();  // never destroyed: NCCL may be in use by torch during exit
  return *nccl;
}

std::vector<std::string> Nccl::library_candidates() {
  const char* override_path = std::getenv("GPUGUARD_LIBNCCL");
  if (override_path != nullptr && override_path[0] != '\0') return {override_path};
  return {"libnccl.so.2", "libnccl.so"};
}

Status Nccl::load() {
  std::lock_guard<std::mutex> lock(mutex_);
  return load_locked();
}

Status Nccl::load_locked() {
  if (load_attempted_) return load_status_;
  load_attempted_ = true;
  auto candidates = library_candidates();
  const bool overridden = std::getenv("GPUGUARD_LIBNCCL") != nullptr && std::getenv("GPUGUARD_LIBNCCL")[0] != '\0';
  if (!overridden) {
    // The copy torch's CUDA build loaded (its own nvidia-nccl wheel): the NCCL the job will actually use.
    DynLib present = DynLib::already_loaded("libnccl.so.2");
    if (present.is_open()) {
      lib_ = std::move(present);
      already_in_process_ = true;
    }
  }
  if (!lib_.is_open()) {
    auto lib = DynLib::open_first(candidates, "NCCL");
    if (!lib) {
      Error err = lib.error();
      err.detail = "NCCL is not installed or not on the library path: " + err.detail;
      load_status_ = err;
      return load_status_;
    }
    lib_ = std::move(lib).value();
  }
  std::string missing;
#define GPUGUARD_NCCL_RESOLVE_REQUIRED(sym, ret, params)                \
  fn_.sym = reinterpret_cast<nccl::PFN_##sym>(lib_.symbol(#sym));         \
  if (fn_.sym == nullptr) missing += std::string(missing.empty() ? "" : ", ") + #sym;
#define GPUGUARD_NCCL_RESOLVE_OPTIONAL(sym, ret, params) \
  fn_.sym = reinterpret_cast<nccl::PFN_##sym>(lib_.symbol(#sym));
  GPUGUARD_NCCL_REQUIRED_FUNCTIONS(GPUGUARD_NCCL_RESOLVE_REQUIRED)
  GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(GPUGUARD_NCCL_RESOLVE_OPTIONAL)
#undef GPUGUARD_NCCL_RESOLVE_REQUIRED
#undef GPUGUARD_NCCL_RESOLVE_OPTIONAL
  if (!missing.empty()) {
    load_status_ = Error{"NCCL", "dlsym", "", 0, lib_.loaded_from() + " lacks " + missing + " (not an NCCL library?)",
                         GPUGUARD_WHERE};
  }
  return load_status_;
}

Error Nccl::nccl_error(const char* call, int code, const std::string& where, nccl::ncclComm_t comm) const {
  Error err;
  err.library = "NCCL";
  err.call = call;
  err.code = code;
  err.code_name = nccl_result_name(code);
  err.where = where;
  if (fn_.ncclGetErrorString != nullptr) {
    const char* text = fn_.ncclGetErrorString(static_cast<nccl::ncclResult_t>(code));
    if (text != nullptr) err.detail = text;
  }
  if (fn_.ncclGetLastError != nullptr) {
    // NCCL's last error is the line that names ranks and devices ("Duplicate GPU detected : rank 1 and
    // rank 0 both on CUDA device 18000"); it is per thread and global when comm is null.
    const char* last = fn_.ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') {
      err.detail += std::string(err.detail.empty() ? "" : "; ") + "NCCL's last error: " + last;
    }
  }
  return err;
}

// One checking helper for every NCCL call: on failure, return an Error naming the call and ncclResult_t.
#define GPUGUARD_NCCL_CHECK(nccl_obj, call_name, ...)                                         \
  do {                                                                                      \
    nccl::ncclResult_t gpuguard_rc_ = (nccl_obj).fn().call_name(__VA_ARGS__);               \
    if (gpuguard_rc_ != nccl::ncclSuccess) {                                                \
      return (nccl_obj).nccl_error(#call_name, gpuguard_rc_, GPUGUARD_WHERE);               \
    }                                                                                       \
  } while (0)

Result<int> Nccl::version() {
  Status loaded = load();
  if (!loaded) return loaded.error();
  int v = 0;
  GPUGUARD_NCCL_CHECK(*this, ncclGetVersion, &v);
  return v;
}

Result<NcclUniqueId> Nccl::unique_id() {
  Status loaded = load();
  if (!loaded) return loaded.error();
  nccl::ncclUniqueId id{};
  GPUGUARD_NCCL_CHECK(*this, ncclGetUniqueId, &id);
  NcclUniqueId out{};
  std::copy(std::begin(id.internal), std::end(id.internal), out.begin());
  return out;
}

NcclStatus Nccl::status() {
  NcclStatus st;
  Status loaded = load();
  if (!loaded) {
    for (const auto& c : library_candidates()) st.library += (st.library.empty() ? "" : ", ") + c;
    st.reason = loaded.error().message();
    return st;
  }
  st.loaded = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    st.already_in_process = already_in_process_;
    st.library = lib_.loaded_from();
  }
  auto v = version();
  if (v) {
    st.version = v.value();
    st.version_string = nccl_version_string(st.version);
  } else {
    st.reason = v.error().message();
    return st;
  }
  if (fn_.ncclCommInitRankConfig == nullptr || fn_.ncclCommGetAsyncError == nullptr || fn_.ncclCommAbort == nullptr) {
    st.reason = "NCCL " + st.version_string +
                " lacks non-blocking communicator init (ncclCommInitRankConfig, NCCL 2.14 or newer): gpuguard "
                "cannot probe it under a deadline";
  }
  return st;
}

const char* NcclProbeOutcome::verdict_name() const {
  switch (verdict) {
    case Verdict::kOk: return "ok";
    case Verdict::kFailed: return "failed";
    case Verdict::kTimedOut: return "timed out";
  }
  return "unknown";
}

namespace {

// State of one probe. Owns the communicator and the CUDA resources, releases them in the destructor, and
// aborts the communicator on any failure after init began (NCCL's own advice for a communicator in error).
class Probe {
 public:
  Probe(const NcclProbeOptions& o, NcclProbeOutcome& out)
      : o_(o), out_(out), nccl_(Nccl::instance()), cuda_(CudaDriver::instance()), start_(Clock::now()),
        deadline_(start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s))) {}

  ~Probe() {
    const auto& cu = cuda_.fn();
    if (device_buffer_ != 0 && cu.cuMemFree_v2 != nullptr && !sync_abandoned_) cu.cuMemFree_v2(device_buffer_);
    if (comm_ != nullptr) {
      if (out_.ok()) {
        nccl_.fn().ncclCommDestroy(comm_);
      } else {
        nccl_.fn().ncclCommAbort(comm_);
        out_.aborted = true;
      }
    }
    if (context_retained_ && cu.cuDevicePrimaryCtxRelease_v2 != nullptr && !sync_abandoned_) {
      cu.cuDevicePrimaryCtxRelease_v2(device_);
    }
    out_.elapsed_s = seconds_since(start_);
  }

  void run() {
    if (!check_arguments()) return;
    if (!load()) return;
    if (!enter_context()) return;
    if (!init()) return;
    if (o_.all_reduce && !all_reduce()) return;
  }

 private:
  bool fail(const std::string& stage, Error err, NcclProbeOutcome::Verdict v = NcclProbeOutcome::Verdict::kFailed) {
    out_.verdict = v;
    out_.stage = stage;
    out_.error = std::move(err);
    if (comm_ != nullptr && nccl_.fn().ncclGetLastError != nullptr) {
      const char* last = nccl_.fn().ncclGetLastError(comm_);
      if (last != nullptr) out_.last_error = last;
    }
    return false;
  }

  bool check_arguments() {
    std::string problem;
    if (o_.nranks < 1) problem = "nranks must be at least 1, not " + std::to_string(o_.nranks);
    else if (o_.rank < 0 || o_.rank >= o_.nranks) problem = "rank " + std::to_string(o_.rank) + " is outside 0.." + std::to_string(o_.nranks - 1);
    else if (!(o_.timeout_s > 0)) problem = "timeout must be positive";
    else if (o_.all_reduce && (o_.all_reduce_count < 1 || o_.all_reduce_count > 1 << 20)) problem = "all_reduce_count must be 1..1048576";
    if (problem.empty()) return true;
    return fail("arguments", gpuguard_error("run_nccl_probe", problem, GPUGUARD_WHERE));
  }

  bool load() {
    Status loaded = nccl_.load();
    if (!loaded) return fail("load NCCL", loaded.error());
    out_.library = nccl_.status().library;
    auto v = nccl_.version();
    if (!v) return fail("load NCCL", v.error());
    out_.nccl_version = v.value();
    const auto& f = nccl_.fn();
    std::string missing;
    if (f.ncclCommInitRankConfig == nullptr) missing += "ncclCommInitRankConfig ";
    if (f.ncclCommGetAsyncError == nullptr) missing += "ncclCommGetAsyncError ";
    if (f.ncclCommAbort == nullptr) missing += "ncclCommAbort ";
    if (f.ncclCommDestroy == nullptr) missing += "ncclCommDestroy ";
    if (o_.all_reduce && f.ncclAllReduce == nullptr) missing += "ncclAllReduce ";
    if (!missing.empty()) {
      return fail("load NCCL", gpuguard_error("dlsym", "NCCL " + nccl_version_string(out_.nccl_version) + " lacks " +
                                                           missing + "(non-blocking init needs NCCL 2.14 or newer)",
                                              GPUGUARD_WHERE));
    }
    return true;
  }

#define GPUGUARD_PROBE_CU(stage, call_name, ...)                                                \
  do {                                                                                          \
    cu::CUresult gpuguard_rc_ = cuda_.fn().call_name(__VA_ARGS__);                              \
    if (gpuguard_rc_ != cu::CUDA_SUCCESS) return fail(stage, cuda_.cu_error(#call_name, gpuguard_rc_, GPUGUARD_WHERE)); \
  } while (0)

  bool enter_context() {
    Status ready = cuda_.init();
    if (!ready) return fail("CUDA context", ready.error());
    const auto& cu = cuda_.fn();
    if (cu.cuDevicePrimaryCtxRetain == nullptr || cu.cuCtxSetCurrent == nullptr || cu.cuCtxSynchronize == nullptr ||
        (o_.all_reduce && (cu.cuMemAlloc_v2 == nullptr || cu.cuMemcpyHtoD_v2 == nullptr ||
                           cu.cuMemcpyDtoH_v2 == nullptr || cu.cuMemFree_v2 == nullptr))) {
      return fail("CUDA context", gpuguard_error("dlsym", "the CUDA driver lacks the context and memory calls the probe needs",
                                                 GPUGUARD_WHERE));
    }
    GPUGUARD_PROBE_CU("CUDA context", cuDeviceGet, &device_, o_.device);
    GPUGUARD_PROBE_CU("CUDA context", cuDevicePrimaryCtxRetain, &context_, device_);
    context_retained_ = true;
    // NCCL uses the CUDA runtime, which adopts the current primary context: that is how it learns the device.
    GPUGUARD_PROBE_CU("CUDA context", cuCtxSetCurrent, context_);
    return true;
  }

  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress or the deadline passes.
  bool wait_ready(const char* stage) {
    auto pause = std::chrono::microseconds(200);
    for (;;) {
      nccl::ncclResult_t state = nccl::ncclInProgress;
      nccl::ncclResult_t rc = nccl_.fn().ncclCommGetAsyncError(comm_, &state);
      if (rc != nccl::ncclSuccess) return fail(stage, nccl_.nccl_error("ncclCommGetAsyncError", rc, GPUGUARD_WHERE, comm_));
      if (state == nccl::ncclSuccess) return true;
      if (state != nccl::ncclInProgress) return fail(stage, nccl_.nccl_error(stage, state, GPUGUARD_WHERE, comm_));
      if (Clock::now() >= deadline_) {
        return fail(stage,
                    gpuguard_error(stage, std::string(stage) + " did not complete within " + format_seconds(o_.timeout_s) +
                                              " (rank " + std::to_string(o_.rank) + " of " + std::to_string(o_.nranks) +
                                              "); the communicator was aborted",
                                   GPUGUARD_WHERE),
                    NcclProbeOutcome::Verdict::kTimedOut);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }

  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g s", s);
    return buf;
  }

  bool init() {
    nccl::ncclConfigV21400 config{sizeof(nccl::ncclConfigV21400), nccl::kConfigMagic, nccl::kConfigVersion21400,
                                  /*blocking=*/0, nccl::kConfigUndefInt, nccl::kConfigUndefInt, nccl::kConfigUndefInt,
                                  nullptr, nccl::kConfigUndefInt};
    nccl::ncclUniqueId id{};
    std::copy(o_.unique_id.begin(), o_.unique_id.end(), id.internal);
    nccl::ncclResult_t rc = nccl_.fn().ncclCommInitRankConfig(&comm_, o_.nranks, id, o_.rank, &config);
    if (rc != nccl::ncclSuccess && rc != nccl::ncclInProgress) {
      return fail("ncclCommInitRankConfig", nccl_.nccl_error("ncclCommInitRankConfig", rc, GPUGUARD_WHERE, comm_));
    }
    if (comm_ == nullptr) {
      return fail("ncclCommInitRankConfig", gpuguard_error("ncclCommInitRankConfig", "NCCL returned no communicator", GPUGUARD_WHERE));
    }
    if (!wait_ready("ncclCommInitRankConfig")) return false;
    out_.init_s = seconds_since(start_);
    return true;
  }

  bool all_reduce() {
    const std::size_t count = static_cast<std::size_t>(o_.all_reduce_count);
    std::vector<float> host(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(o_.rank + 1) * static_cast<float>(i + 1);
    GPUGUARD_PROBE_CU("ncclAllReduce", cuMemAlloc_v2, &device_buffer_, count * sizeof(float));
    GPUGUARD_PROBE_CU("ncclAllReduce", cuMemcpyHtoD_v2, device_buffer_, host.data(), count * sizeof(float));
    void* buffer = reinterpret_cast<void*>(static_cast<std::uintptr_t>(device_buffer_));
    nccl::ncclResult_t rc =
        nccl_.fn().ncclAllReduce(buffer, buffer, count, nccl::ncclFloat32, nccl::ncclSum, comm_, nullptr);
    if (rc != nccl::ncclSuccess && rc != nccl::ncclInProgress) {
      return fail("ncclAllReduce", nccl_.nccl_error("ncclAllReduce", rc, GPUGUARD_WHERE, comm_));
    }
    if (!wait_ready("ncclAllReduce")) return false;
    if (!synchronize()) return false;
    GPUGUARD_PROBE_CU("check all-reduce result", cuMemcpyDtoH_v2, host.data(), device_buffer_, count * sizeof(float));
    out_.all_reduce_result = host;
    const float ranks_sum = static_cast<float>(o_.nranks) * static_cast<float>(o_.nranks + 1) / 2.0f;
    for (std::size_t i = 0; i < count; ++i) {
      float expected = ranks_sum * static_cast<float>(i + 1);
      if (host[i] != expected) {
        return fail("check all-reduce result",
                    gpuguard_error("ncclAllReduce",
                                   "element " + std::to_string(i) + " is " + std::to_string(host[i]) + ", expected " +
                                       std::to_string(expected) + ": data was lost between GPUs (peer-to-peer writes "
                                       "dropped, as with ACS/IOMMU redirection)",
                                   GPUGUARD_WHERE));
      }
    }
    return true;
  }

  // cuCtxSynchronize has no timeout, and a hung NCCL kernel never finishes: synchronise on a helper thread
  // and give up at the deadline. ncclCommAbort (in the destructor) then makes the kernel exit.
  bool synchronize() {
    struct Shared {
      std::promise<cu::CUresult> done;
    };
    auto shared = std::make_shared<Shared>();
    auto finished = shared->done.get_future();
    const auto& cu = cuda_.fn();
    cu::CUcontext context = context_;
    std::thread([shared, &cu, context] {
      cu::CUresult rc = cu.cuCtxSetCurrent(context);
      if (rc == cu::CUDA_SUCCESS) rc = cu.cuCtxSynchronize();
      shared->done.set_value(rc);
    }).detach();
    if (finished.wait_until(deadline_) != std::future_status::ready) {
      sync_abandoned_ = true;  // the helper thread may still use the buffer and the context: leave them
      return fail("synchronize",
                  gpuguard_error("synchronize", "the all-reduce kernel did not finish within " + format_seconds(o_.timeout_s) +
                                                    "; the communicator was aborted",
                                 GPUGUARD_WHERE),
                  NcclProbeOutcome::Verdict::kTimedOut);
    }
    cu::CUresult rc = finished.get();
    if (rc != cu::CUDA_SUCCESS) return fail("synchronize", cuda_.cu_error("cuCtxSynchronize", rc, GPUGUARD_WHERE));
    return true;
  }
#undef GPUGUARD_PROBE_CU

  const NcclProbeOptions& o_;
  NcclProbeOutcome& out_;
  Nccl& nccl_;
  CudaDriver& cuda_;
  Clock::time_point start_;
  Clock::time_point deadline_;
  nccl::ncclComm_t comm_ = nullptr;
  cu::CUdevice device_ = 0;
  cu::CUcontext context_ = nullptr;
  bool context_retained_ = false;
  cu::CUdeviceptr device_buffer_ = 0;
  bool sync_abandoned_ = false;
};

}  // namespace

NcclProbeOutcome run_nccl_probe(const NcclProbeOptions& options) {
  NcclProbeOutcome out;
  {
    Probe probe(options, out);
    probe.run();
  }
  return out;
}

}  // namespace gpuguard
