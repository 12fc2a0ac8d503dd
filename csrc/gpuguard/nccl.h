// NCCL loaded at run time (the copy torch loads): version, unique id, status, and GPUGUARD_NCCL.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "gpuguard/error.h"
#include "gpuguard/nccl_api.h"
#include "gpuguard/runtime_library.h"

namespace gpuguard {

using NcclUniqueId = std::array<char, nccl::kUniqueIdBytes>;

// What was loaded, for reports and `gpuguard doctor`; never fails.
struct NcclStatus {
  bool loaded = false;
  bool already_in_process = false;  // found with RTLD_NOLOAD: the copy torch (or another library) loaded
  std::string library;              // resolved path, or the names tried
  std::string found_by;             // the rule that chose it (RuntimeLibrary::found_by); empty when not loaded
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

  // $GPUGUARD_LIBNCCL alone if set; otherwise libnccl.so.2 then libnccl.so (after the RTLD_NOLOAD look-up and
  // the file given to prefer()).
  static std::vector<std::string> library_candidates();
  // The NCCL the job will load (torch's, which Python finds: gpuguard.system.nccl_library), tried before the loader's
  // search unless $GPUGUARD_LIBNCCL is set or a libnccl.so.2 is already loaded. False once NCCL was loaded.
  bool prefer(std::string path, std::string origin) { return lib_.prefer(std::move(path), std::move(origin)); }

  Status load();
  NcclStatus status();
  Result<int> version();
  Result<NcclUniqueId> unique_id();

  // The checking helper every NCCL call goes through (by way of GPUGUARD_NCCL): ok for ncclSuccess, otherwise an
  // Error naming the call and NCCL's result name, with NCCL's description and, when available, ncclGetLastError's
  // text (which names ranks and devices). With a communicator (gpuguard's are non-blocking) ncclInProgress is no
  // failure: the call has started, and ncclCommGetAsyncError says when it ends.
  Status check(const char* call, int code, const std::string& where, nccl::ncclComm_t comm = nullptr) const;
  // Calls `entry` (a member of fn()) with `args`, checked against the communicator `*comm` as it is after the call
  // (null: none); an entry point NCCL does not export is an Error too.
  template <typename... Params, typename... Args>
  Status call(const char* name, nccl::ncclResult_t (*entry)(Params...), const nccl::ncclComm_t* comm,
              const std::string& where, Args&&... args) const {
    if (entry == nullptr) {
      return unavailable_error("NCCL", "dlsym", std::string("NCCL does not export ") + name, where);
    }
    nccl::ncclResult_t code = entry(std::forward<Args>(args)...);
    return check(name, code, where, comm != nullptr ? *comm : nullptr);
  }

#define GPUGUARD_NCCL_MEMBER(symbol, ret, params) nccl::PFN_##symbol symbol = nullptr;
  struct Functions {
    GPUGUARD_NCCL_REQUIRED_FUNCTIONS(GPUGUARD_NCCL_MEMBER)
    GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(GPUGUARD_NCCL_MEMBER)
  };
#undef GPUGUARD_NCCL_MEMBER
  const Functions& fn() const { return fn_; }

 private:
  Nccl();

  RuntimeLibrary lib_;
  Functions fn_;
};

}  // namespace gpuguard

// The checking helper for NCCL, declared once: GPUGUARD_NCCL(ncclGetVersion, &version) calls
// Nccl::instance().fn().ncclGetVersion(&version) and, when it fails, returns from the enclosing function (which
// returns a Status or a Result) an Error naming the call and NCCL's result name. GPUGUARD_NCCL_ON(comm, call, ...)
// is the same for a call on the non-blocking communicator `comm` (a variable, read after the call), whose last
// error the Error adds and for which ncclInProgress means the call has started.
#define GPUGUARD_NCCL(call_name, ...)                                                                   \
  GPUGUARD_TRY(::gpuguard::Nccl::instance().call(#call_name, ::gpuguard::Nccl::instance().fn().call_name, nullptr, \
                                                 GPUGUARD_WHERE __VA_OPT__(, ) __VA_ARGS__))
#define GPUGUARD_NCCL_ON(comm, call_name, ...)                                                          \
  GPUGUARD_TRY(::gpuguard::Nccl::instance().call(#call_name, ::gpuguard::Nccl::instance().fn().call_name, &(comm), \
                                                 GPUGUARD_WHERE __VA_OPT__(, ) __VA_ARGS__))
