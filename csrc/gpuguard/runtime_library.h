// Run-time loading of a foreign shared library (libcuda, libnccl): gpuguard never links them at build time.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "gpuguard/error.h"

namespace gpuguard {

// Where to look for one library, and how to explain its absence.
struct LibrarySpec {
  std::string library;                  // Error::library: "CUDA driver", "NCCL"
  std::string env_override;             // "GPUGUARD_LIBCUDA": when set and non-empty, the only candidate
  std::vector<std::string> names;       // tried in order otherwise: {"libcuda.so.1", "libcuda.so"}
  std::string prefer_loaded;            // unless overridden, first use the copy of this name the process has
                                        // already loaded (RTLD_NOLOAD); empty: always dlopen the candidates
  std::string absent;                   // prefixes the dlopen error: "no NVIDIA driver"
  std::string incomplete;               // follows the missing symbols: "(driver too old, or not a CUDA driver)"

  bool overridden() const;  // env_override is set and non-empty
  // The override alone if set, else the names.
  std::vector<std::string> candidates() const;
};

// One foreign library, opened and its symbol table resolved once (the first load()), thread-safe. Never closed:
// other code in the process (torch) may hold pointers into it.
class RuntimeLibrary {
 public:
  explicit RuntimeLibrary(LibrarySpec spec) : spec_(std::move(spec)) {}
  RuntimeLibrary(const RuntimeLibrary&) = delete;
  RuntimeLibrary& operator=(const RuntimeLibrary&) = delete;

  // Resolves a function table: required() records a missing symbol, optional() leaves its slot null.
  class Symbols {
   public:
    template <typename Fn>
    void required(Fn& slot, const char* name) {
      slot = reinterpret_cast<Fn>(lookup(name));
      if (slot == nullptr) missing_ += std::string(missing_.empty() ? "" : ", ") + name;
    }
    template <typename Fn>
    void optional(Fn& slot, const char* name) {
      slot = reinterpret_cast<Fn>(lookup(name));
    }

   private:
    friend class RuntimeLibrary;
    explicit Symbols(void* handle) : handle_(handle) {}
    void* lookup(const char* name) const;
    void* handle_;
    std::string missing_;
  };

  // The first call opens the library and hands `bind` the Symbols to fill the caller's function table; the
  // Status (which names everything tried, or every missing required symbol) is kept and returned thereafter.
  template <typename Bind>
  Status load(Bind&& bind) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (attempted_) return status_;
    attempted_ = true;
    status_ = open();
    if (status_.ok()) {
      Symbols symbols(handle_);
      bind(symbols);
      if (!symbols.missing_.empty()) status_ = incomplete(symbols.missing_);
    }
    return status_;
  }

  // Before the first load(): try `path` after the copy already loaded and before LibrarySpec::names (never
  // instead of the override); `origin` says where the caller found it ("torch's NCCL: ..."), for found_by().
  // The caller knows what the job will load (torch's RPATH), which the names on the loader's path need not be.
  // False, and nothing changes, once load() has run.
  bool prefer(std::string path, std::string origin);
  // LibrarySpec::candidates(), comma-separated, for reports on a library that did not load.
  std::string candidate_list() const;
  // The file actually loaded (dlinfo), empty until it is open. For reports.
  std::string loaded_from() const;
  // The copy already in the process was used (see LibrarySpec::prefer_loaded).
  bool already_in_process() const;
  // Which rule chose the file that opened: "$GPUGUARD_LIBNCCL", "already loaded in this process", prefer()'s
  // origin, or "the dynamic loader's search for libnccl.so.2" (saying why the preferred file did not load).
  // Empty until it is open.
  std::string found_by() const;

 private:
  Status open();  // with mutex_ held
  Error incomplete(const std::string& missing) const;
  std::string resolved_path() const;  // with mutex_ held

  const LibrarySpec spec_;
  mutable std::mutex mutex_;
  bool attempted_ = false;
  Status status_ = ok_status();
  void* handle_ = nullptr;
  std::string name_;  // the candidate that opened
  bool already_in_process_ = false;
  std::string preferred_;         // prefer()'s path
  std::string preferred_origin_;  // and where it came from
  std::string found_by_;
};

// Binds one entry of an API header's X-list (symbol, return type, parameters) to the same-named member of the
// function table `table`, inside a load() callback whose parameter is named `symbols`.
#define GPUGUARD_BIND_REQUIRED(sym, ret, params) symbols.required(table.sym, #sym);
#define GPUGUARD_BIND_OPTIONAL(sym, ret, params) symbols.optional(table.sym, #sym);

}  // namespace gpuguard
