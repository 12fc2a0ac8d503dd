// Loads NCCL with dlopen (the copy already in the process, else the job's): version, unique id, status, checking.
#include "gpuguard/nccl.h"

#include <algorithm>
#include <iterator>

namespace gpuguard {

namespace {

const LibrarySpec& library_spec() {
  static const LibrarySpec spec{"NCCL", "GPUGUARD_LIBNCCL", {"libnccl.so.2", "libnccl.so"},
                                // The copy torch's CUDA build loaded (its own nvidia-nccl wheel): the NCCL the
                                // job will actually use.
                                "libnccl.so.2", "NCCL is not installed or not on the library path",
                                "(not an NCCL library?)"};
  return spec;
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

Nccl::Nccl() : lib_(library_spec()) {}

Nccl& Nccl::instance() {
  static Nccl* nccl = new Nccl();  // never destroyed: NCCL may be in use by torch during exit
  return *nccl;
}

std::vector<std::string> Nccl::library_candidates() { return library_spec().candidates(); }

Status Nccl::load() {
  return lib_.load([this](RuntimeLibrary::Symbols& symbols) {
    Functions& table = fn_;
    GPUGUARD_NCCL_REQUIRED_FUNCTIONS(GPUGUARD_BIND_REQUIRED)
    GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(GPUGUARD_BIND_OPTIONAL)
  });
}

Status Nccl::check(const char* call, int code, const std::string& where, nccl::ncclComm_t comm) const {
  if (code == nccl::ncclSuccess || (comm != nullptr && code == nccl::ncclInProgress)) return ok_status();
  std::string detail;
  if (fn_.ncclGetErrorString != nullptr) {
    const char* text = fn_.ncclGetErrorString(static_cast<nccl::ncclResult_t>(code));
    if (text != nullptr) detail = text;
  }
  if (fn_.ncclGetLastError != nullptr) {
    // NCCL's last error is the line that names ranks and devices ("Duplicate GPU detected : rank 1 and
    // rank 0 both on CUDA device 18000"); it is per thread and global when comm is null.
    const char* last = fn_.ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') {
      detail += std::string(detail.empty() ? "" : "; ") + "NCCL's last error: " + last;
    }
  }
  return call_error("NCCL", call, code, nccl_result_name(code), std::move(detail), where);
}

Result<int> Nccl::version() {
  GPUGUARD_TRY(load());
  int v = 0;
  GPUGUARD_NCCL(ncclGetVersion, &v);
  return v;
}

Result<NcclUniqueId> Nccl::unique_id() {
  GPUGUARD_TRY(load());
  nccl::ncclUniqueId id{};
  GPUGUARD_NCCL(ncclGetUniqueId, &id);
  NcclUniqueId out{};
  std::copy(std::begin(id.internal), std::end(id.internal), out.begin());
  return out;
}

NcclStatus Nccl::status() {
  NcclStatus st;
  Status loaded = load();
  if (!loaded) {
    st.library = lib_.candidate_list();
    st.reason = loaded.error().message();
    return st;
  }
  st.loaded = true;
  st.already_in_process = lib_.already_in_process();
  st.library = lib_.loaded_from();
  st.found_by = lib_.found_by();
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

}  // namespace gpuguard
