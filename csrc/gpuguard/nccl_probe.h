// The NCCL communicator probe: one rank forms a communicator (and runs one small all-reduce) under a deadline.
#pragma once

#include <string>
#include <vector>

#include "gpuguard/error.h"
#include "gpuguard/nccl.h"

namespace gpuguard {

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
