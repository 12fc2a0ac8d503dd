// NCCL loaded at run time: version, unique id, communicator init under a deadline, abort, last error, and a
// tiny all-reduce probe. The copy torch already loaded is preferred, so gpuguard tests the NCCL the job uses.
#pragma once

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "gpuguard/dynlib.h"
#include "gpuguard/error.h"
#include "gpuguard/nccl_api.h"

namespace gpuguard {

using NcclUniqueId = std::array<char, nccl::kUniqueIdBytes>;

// What was loaded, for reports and `gpuguard doctor`; never fails.
struct NcclStatus {
  bool loaded = false;
  bool already_in_process = false;  // found with RTLD_NOLOAD: the copy torch (or another library) loaded
  std::string library;              // resolved path, or the names tried
  int version = 0;                  // 22809 for 2.28.9; 0 when unknown
  std::string version_string;       // "2.28.9"
  std::string reason;               // why NCCL is unusable; empty when it is usable for probing
};

// "2.28.9" from 22809 (and the pre-2.9 encoding 2708 -> "2.7.8").
std::string nccl_version_string(int code);
// "ncclInvalidUsage" for 5; "ncclResult_t 42" for codes this gpuguard does not know.
std::string nccl_result_name(int code);

class Nccl {
 public:
  static Nccl& instance();

  // $GPUGUARD_LIBNCCL alone if set; otherwise libnccl.so.2 then libnccl.so (after the RTLD_NOLOAD look-up).
  static std::vector<std::string> library_candidates();

  Status load();
  NcclStatus status();
  Result<int> version();
  Result<NcclUniqueId> unique_id();

  // The checking helper every NCCL call goes through: names the call and NCCL's result name, adds NCCL's
  // description and, when available, ncclGetLastError's text (which names ranks and devices).
  Error nccl_error(const char* call, int code, const std::string& where, nccl::ncclComm_t comm = nullptr) const;

#define GPUGUARD_NCCL_MEMBER(symbol, ret, params) nccl::PFN_##symbol symbol = nullptr;
  struct Functions {
    GPUGUARD_NCCL_REQUIRED_FUNCTIONS(GPUGUARD_NCCL_MEMBER)
    GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(GPUGUARD_NCCL_MEMBER)
  };
#undef GPUGUARD_NCCL_MEMBER
  const Functions& fn() const { return fn_; }

 private:
  Nccl() = default;
  Status load_locked();

  mutable std::mutex mutex_;
  bool load_attempted_ = false;
  bool already_in_process_ = false;
  Status load_status_ = ok_status();
  DynLib lib_;
  Functions fn_;
};

// One rank's part in forming a communicator (and, optionally, one small all-reduce) under a deadline.
struct NcclProbeOptions {
  int nranks = 1;
  int rank = 0;
  NcclUniqueId unique_id{};
  int device = 0;               // CUDA ordinal in this process (cuda:N)
  double timeout_s = 60;        // for the whole probe: init, the all-reduce and its synchronisation
  bool all_reduce = false;      // also run one ncclAllReduce(sum) of a few floats and check the result
  int all_reduce_count = 4;
};

struct NcclProbeOutcome {
  enum class Verdict { kOk, kFailed, kTimedOut };
  Verdict verdict = Verdict::kOk;
  // The step that failed or did not finish: "load NCCL", "CUDA context", "ncclCommInitRankConfig",
  // "ncclAllReduce", "synchronize", "check all-reduce result".
  std::string stage;
  Error error;                  // set unless kOk; error.message() is the full text
  std::string last_error;       // ncclGetLastError(comm) at the time of failure, verbatim
  bool aborted = false;         // ncclCommAbort was called (timeouts and failures after init began)
  double elapsed_s = 0;
  double init_s = 0;            // time to a ready communicator
  std::vector<float> all_reduce_result;
  int nccl_version = 0;
  std::string library;

  bool ok() const { return verdict == Verdict::kOk; }
  const char* verdict_name() const;
};

// Never throws; blocks the calling thread for at most about timeout_s (plus the abort itself).
NcclProbeOutcome run_nccl_probe(const NcclProbeOptions& options);

}  // namespace gpuguard
