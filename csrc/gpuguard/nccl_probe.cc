// The communicator probe: NCCL's non-blocking init (and an all-reduce) polled to a deadline, aborted when late.
#include "gpuguard/nccl_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <thread>

#include "gpuguard/cuda_driver.h"

namespace gpuguard {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", s);
  return buf;
}

}  // namespace

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
// Each step returns a Status; stage_ names the step under way, and the first failure ends the probe.
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
    Status st = steps();
    if (!st) fail(st.error());
  }

 private:
  Status steps() {
    stage_ = "arguments";
    GPUGUARD_TRY(check_arguments());
    stage_ = "load NCCL";
    GPUGUARD_TRY(load());
    stage_ = "CUDA context";
    GPUGUARD_TRY(enter_context());
    stage_ = "ncclCommInitRankConfig";
    GPUGUARD_TRY(init());
    if (o_.all_reduce) GPUGUARD_TRY(all_reduce());
    return ok_status();
  }

  void fail(Error err) {
    out_.verdict = timed_out_ ? NcclProbeOutcome::Verdict::kTimedOut : NcclProbeOutcome::Verdict::kFailed;
    out_.stage = stage_;
    out_.error = std::move(err);
    if (comm_ != nullptr && nccl_.fn().ncclGetLastError != nullptr) {
      const char* last = nccl_.fn().ncclGetLastError(comm_);
      if (last != nullptr) out_.last_error = last;
    }
  }

  // A timeout ends the probe with the verdict "timed out" rather than "failed".
  Error timed_out(const std::string& call, const std::string& detail, const std::string& where) {
    timed_out_ = true;
    return gpuguard_error(call, detail, where);
  }

  Status check_arguments() {
    std::string problem;
    if (o_.nranks < 1) problem = "nranks must be at least 1, not " + std::to_string(o_.nranks);
    else if (o_.rank < 0 || o_.rank >= o_.nranks) problem = "rank " + std::to_string(o_.rank) + " is outside 0.." + std::to_string(o_.nranks - 1);
    else if (!(o_.timeout_s > 0)) problem = "timeout must be positive";
    else if (o_.all_reduce && (o_.all_reduce_count < 1 || o_.all_reduce_count > 1 << 20)) problem = "all_reduce_count must be 1..1048576";
    if (problem.empty()) return ok_status();
    return gpuguard_error("run_nccl_probe", problem, GPUGUARD_WHERE);
  }

  Status load() {
    GPUGUARD_TRY(nccl_.load());
    out_.library = nccl_.status().library;
    auto v = nccl_.version();
    if (!v) return v.error();
    out_.nccl_version = v.value();
    const auto& f = nccl_.fn();
    std::string missing;
    if (f.ncclCommInitRankConfig == nullptr) missing += "ncclCommInitRankConfig ";
    if (f.ncclCommGetAsyncError == nullptr) missing += "ncclCommGetAsyncError ";
    if (f.ncclCommAbort == nullptr) missing += "ncclCommAbort ";
    if (f.ncclCommDestroy == nullptr) missing += "ncclCommDestroy ";
    if (o_.all_reduce && f.ncclAllReduce == nullptr) missing += "ncclAllReduce ";
    if (!missing.empty()) {
      return gpuguard_error("dlsym", "NCCL " + nccl_version_string(out_.nccl_version) + " lacks " + missing +
                                         "(non-blocking init needs NCCL 2.14 or newer)",
                            GPUGUARD_WHERE);
    }
    return ok_status();
  }

  Status enter_context() {
    GPUGUARD_TRY(cuda_.init());
    const auto& cu = cuda_.fn();
    if (cu.cuDevicePrimaryCtxRetain == nullptr || cu.cuCtxSetCurrent == nullptr || cu.cuCtxSynchronize == nullptr ||
        (o_.all_reduce && (cu.cuMemAlloc_v2 == nullptr || cu.cuMemcpyHtoD_v2 == nullptr ||
                           cu.cuMemcpyDtoH_v2 == nullptr || cu.cuMemFree_v2 == nullptr))) {
      return gpuguard_error("dlsym", "the CUDA driver lacks the context and memory calls the probe needs", GPUGUARD_WHERE);
    }
    GPUGUARD_CU(cuDeviceGet, &device_, o_.device);
    GPUGUARD_CU(cuDevicePrimaryCtxRetain, &context_, device_);
    context_retained_ = true;
    // NCCL uses the CUDA runtime, which adopts the current primary context: that is how it learns the device.
    GPUGUARD_CU(cuCtxSetCurrent, context_);
    return ok_status();
  }

  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress or the deadline passes.
  Status wait_ready(const char* call) {
    auto pause = std::chrono::microseconds(200);
    for (;;) {
      nccl::ncclResult_t state = nccl::ncclInProgress;
      GPUGUARD_NCCL_ON(comm_, ncclCommGetAsyncError, comm_, &state);
      if (state == nccl::ncclSuccess) return ok_status();
      if (state != nccl::ncclInProgress) return nccl_.check(call, state, GPUGUARD_WHERE, comm_);
      if (Clock::now() >= deadline_) {
        return timed_out(call,
                         std::string(call) + " did not complete within " + format_seconds(o_.timeout_s) + " (rank " +
                             std::to_string(o_.rank) + " of " + std::to_string(o_.nranks) +
                             "); the communicator was aborted",
                         GPUGUARD_WHERE);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }

  Status init() {
    nccl::ncclConfigV21400 config{sizeof(nccl::ncclConfigV21400), nccl::kConfigMagic, nccl::kConfigVersion21400,
                                  /*blocking=*/0, nccl::kConfigUndefInt, nccl::kConfigUndefInt, nccl::kConfigUndefInt,
                                  nullptr, nccl::kConfigUndefInt};
    nccl::ncclUniqueId id{};
    std::copy(o_.unique_id.begin(), o_.unique_id.end(), id.internal);
    GPUGUARD_NCCL_ON(comm_, ncclCommInitRankConfig, &comm_, o_.nranks, id, o_.rank, &config);
    if (comm_ == nullptr) {
      return gpuguard_error("ncclCommInitRankConfig", "NCCL returned no communicator", GPUGUARD_WHERE);
    }
    GPUGUARD_TRY(wait_ready("ncclCommInitRankConfig"));
    out_.init_s = seconds_since(start_);
    return ok_status();
  }

  Status all_reduce() {
    stage_ = "ncclAllReduce";
    const std::size_t count = static_cast<std::size_t>(o_.all_reduce_count);
    std::vector<float> host(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(o_.rank + 1) * static_cast<float>(i + 1);
    GPUGUARD_CU(cuMemAlloc_v2, &device_buffer_, count * sizeof(float));
    GPUGUARD_CU(cuMemcpyHtoD_v2, device_buffer_, host.data(), count * sizeof(float));
    void* buffer = reinterpret_cast<void*>(static_cast<std::uintptr_t>(device_buffer_));
    // ncclAllReduce returns once the collective is enqueued on the stream (the legacy default stream here); a
    // non-blocking communicator may still be enqueueing it, which ncclCommGetAsyncError reports. Neither says
    // it ran: the kernel finishes later, or never on a broken fabric, and the host learns which at a sync.
    GPUGUARD_NCCL_ON(comm_, ncclAllReduce, buffer, buffer, count, nccl::ncclFloat32, nccl::ncclSum, comm_, nullptr);
    GPUGUARD_TRY(wait_ready("ncclAllReduce"));
    stage_ = "synchronize";
    GPUGUARD_TRY(synchronize());
    stage_ = "check all-reduce result";
    GPUGUARD_CU(cuMemcpyDtoH_v2, host.data(), device_buffer_, count * sizeof(float));
    out_.all_reduce_result = host;
    const float ranks_sum = static_cast<float>(o_.nranks) * static_cast<float>(o_.nranks + 1) / 2.0f;
    for (std::size_t i = 0; i < count; ++i) {
      float expected = ranks_sum * static_cast<float>(i + 1);
      if (host[i] != expected) {
        return gpuguard_error("ncclAllReduce",
                              "element " + std::to_string(i) + " is " + std::to_string(host[i]) + ", expected " +
                                  std::to_string(expected) + ": data was lost between GPUs (peer-to-peer writes "
                                  "dropped, as with ACS/IOMMU redirection)",
                              GPUGUARD_WHERE);
      }
    }
    return ok_status();
  }

  // cuCtxSynchronize has no timeout, and a hung NCCL kernel never finishes: synchronise on a helper thread
  // and give up at the deadline. ncclCommAbort (in the destructor) then makes the kernel exit.
  Status synchronize() {
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
      return timed_out("cuCtxSynchronize",
                       "the all-reduce did not finish on the GPU within " + format_seconds(o_.timeout_s) + " (rank " +
                           std::to_string(o_.rank) + " of " + std::to_string(o_.nranks) +
                           "): ncclAllReduce had enqueued it, and the host waited for its kernel in "
                           "cuCtxSynchronize; the communicator was aborted",
                       GPUGUARD_WHERE);
    }
    return cuda_.check("cuCtxSynchronize", finished.get(), GPUGUARD_WHERE);
  }

  const NcclProbeOptions& o_;
  NcclProbeOutcome& out_;
  Nccl& nccl_;
  CudaDriver& cuda_;
  Clock::time_point start_;
  Clock::time_point deadline_;
  std::string stage_;
  bool timed_out_ = false;
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
