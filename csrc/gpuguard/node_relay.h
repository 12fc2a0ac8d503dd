// The watchdog's per-node tier: one rank per node asks the job's store, the others read its answer from a page
// of shared memory on their node.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "gpuguard/error.h"

namespace gpuguard {

// What the node's leader last learned from the job's store: whether the alarm of `epoch` existed, and how long
// ago it asked.
struct RelayReading {
  std::uint64_t epoch = 0;
  bool alarm = false;
  double age_s = 0;
};

// A page in a file (under /dev/shm) that the node's leader writes after each of its checks of the job's store
// and the other ranks of the node read instead of asking the store themselves. Writes are a seqlock over 64-bit
// atomics (lock-free, so valid across processes): a reader never takes a half-written answer, and never waits.
// Whatever the file holds is checked (a magic number and version); a page another program or version wrote, a
// missing file, or an answer too old reads as nothing, and the rank then asks the store itself.
class NodeRelay {
 public:
  // The leader's page: created (or taken over from a run that crashed) at `path`, mode 0600, for a leader that
  // answers every `tick_s`. An Error names the path and the call that failed.
  static Result<NodeRelay> create(const std::string& path, double tick_s);
  // Removes the pages in `directory` whose names begin with `name_prefix` and whose leader has written nothing for
  // `idle_s` seconds and ten of its ticks: pages of leaders killed before they could remove their own. A live
  // leader's page that is removed all the same keeps working for the ranks that opened it. Returns how many.
  static int remove_abandoned(const std::string& directory, const std::string& name_prefix, double idle_s);
  // Another rank's view of its leader's page; an Error when there is none yet (the leader has not started).
  static Result<NodeRelay> open(const std::string& path);

  NodeRelay(NodeRelay&& other) noexcept;
  NodeRelay& operator=(NodeRelay&& other) noexcept;
  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;
  ~NodeRelay();  // unmaps; the leader's page is also unlinked (its readers keep their mapping, which goes stale)

  // The leader: the alarm of `epoch` does (not) exist, as the store said just now.
  void publish(std::uint64_t epoch, bool alarm);
  // A consistent reading, or nullopt when the page is not a relay page or is being written at this instant.
  std::optional<RelayReading> read() const;
  const std::string& path() const { return path_; }

 private:
  struct Page;
  NodeRelay(std::string path, Page* page, bool owner) : path_(std::move(path)), page_(page), owner_(owner) {}
  void release();

  std::string path_;
  Page* page_ = nullptr;
  bool owner_ = false;
};

}  // namespace gpuguard
