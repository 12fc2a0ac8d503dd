// The collective watchdog: a thread per rank, needing no Python, that notices a collective waiting too long and
// has every rank of the job print one report naming the stuck rank, its collective and its stack.
//
// Progress comes from two places. Torch's flight recorder (read through FlightRecorderRead, no GIL) counts every
// collective of a group whatever issued it, complete when torch says so. Collectives the recorder does not see
// are reported by the caller: enter()/exit() around a call that completes when it returns, or exit_later() with a
// completion check (a CUDA event recorded on the collective's stream) that the thread polls.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpuguard/error.h"
#include "gpuguard/flight_recorder.h"
#include "gpuguard/node_relay.h"
#include "gpuguard/stall_report.h"

namespace gpuguard {

class TcpStoreClient;  // our client of the job's c10d TCPStore (tcp_store_client.h): no torch anywhere

struct WatchdogOptions {
  std::string store_host;       // the job's TCPStore (torchrun's agent store, env://'s store): a client of our own
  int store_port = 0;
  std::string prefix;           // every key lives under it (the run and this watch's generation)
  int rank = 0;
  int world_size = 1;
  std::string host;
  long pid = 0;
  std::string gpu;
  double stall_after_s = 0;     // > 0: fixed threshold; 0: adaptive, at least min_stall_s
  double min_stall_s = 60;
  double tick_s = 1;            // one store operation per rank per tick while healthy
  // The per-node tier: "" = none. Else the node's relay page (node_relay.h): the node's leader asks the store
  // each tick and writes the answer there; the others read it and ask the store only when it is missing or old.
  std::string node_relay_path;
  bool node_leader = false;
  double gather_s = 5;          // how long the rank composing the report waits for silent ranks
  std::string report_path;      // the JSON report, written on every rank ("" = none)
  bool exit_on_stall = false;   // on_stall="raise": end the process (exit_code) once the report is out
  int exit_code = 75;
  FlightRecorderRead read_recorder;           // torch's flight recorder; empty: none
  std::vector<std::string> recorder_sources;  // what to read of it: "gloo", "nccl", a hooked backend
  std::string source_note;                    // how the recorder's progress is known, for the report
  std::string calls_note;                     // how the caller-reported progress is known
  double site_wait_s = 5;                     // how long a report waits for a recorded collective's call site
};

// A collective whose completion the watchdog's thread polls: true once complete (e.g. cuEventQuery).
using CompletionCheck = std::function<Result<bool>()>;

// A call site the watchdog needs for a recorded collective; answered by the Python side (which reads the flight
// recorder's stack traces under the GIL) through next_site_request()/answer_site().
struct SiteRequest {
  std::uint64_t id = 0;
  std::string source, group;
  std::int64_t seq = 0;
};

// Every Python thread's stack, taken without the GIL (the binding provides it).
using StackDumper = std::function<std::string()>;

class Watchdog {
 public:
  // Connects to the store (throws std::runtime_error naming host:port when it cannot), publishes this rank's
  // hello record, starts the thread.
  Watchdog(WatchdogOptions options, StackDumper dump_stack);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // What users call a group and its global ranks, by torch's group name (the flight recorder knows names only).
  void describe_group(const std::string& name, std::string desc, std::vector<int> ranks);
  // A group whose collectives the caller reports (enter/exit); returns its index. `label` says who reports them.
  int add_group(std::string name, std::string desc, std::vector<int> ranks, std::string label = "");
  // The calling thread enters a collective on group `group` (cheap: one uncontended lock); returns its sequence
  // number. exit(): it completed when its call returned. exit_later(): it completes when `done` says so.
  // complete(): collective `seq` completed (e.g. from a torch Future's callback).
  std::uint64_t enter(int group, std::string op, std::string sizes, std::string site);
  void exit(int group);
  void exit_later(int group, std::uint64_t seq, CompletionCheck done);
  void complete(int group, std::uint64_t seq);

  // For the Python side's helper thread: blocks (call it without the GIL) until the watchdog needs the call site
  // of a recorded collective, or until stop(): then nullopt.
  std::optional<SiteRequest> next_site_request();
  void answer_site(std::uint64_t id, std::string site);

  void stop();
  double stall_threshold_s() const;
  std::uint64_t store_ops() const { return store_ops_.load(); }
  // Checks completed since the start (the first comes one tick after it: what start-up is measured to)
  std::uint64_t ticks() const { return ticks_.load(); }
  // Healthy ticks answered by the node's relay page instead of the store; ticks that had to ask the store
  // because the page was missing, another epoch's, or older than relay_max_age_s().
  std::uint64_t relayed_ticks() const { return relayed_ticks_.load(); }
  std::uint64_t unrelayed_ticks() const { return unrelayed_ticks_.load(); }
  double relay_max_age_s() const;
  std::uint64_t reports() const { return reports_.load(); }
  std::string last_report_json() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Group {
    std::string key;                 // name@source: the same on every rank
    std::string name, desc;
    std::vector<int> ranks;
    std::string recorder;            // the flight recorder source that counts it; "" when the caller reports it
    std::string label;               // who reports it, for the report ("w.collective()")
    std::uint64_t entered = 0, completed = 0;  // completed: every collective up to it completed
    std::string op, sizes, site, thread;       // of the last entered (reported by the caller)
    Clock::time_point waiting_since{}, last_entry{};  // since when #completed+1 is awaited; the last entry seen
    double longest_wait_s = 0, longest_gap_s = 0;
    std::uint64_t reported_seq = 0;  // a stall of this seq was reported already
    std::set<std::uint64_t> done_ahead;                         // completed out of order, beyond `completed`
    std::deque<std::pair<std::uint64_t, CompletionCheck>> pending;  // completions the thread polls, in order
  };
  struct GroupInfo {
    std::string desc;
    std::vector<int> ranks;
  };

  void run();
  void tick();
  void refresh_recorder();
  void poll_pending();
  void handle_alarm(std::uint64_t epoch, bool composer, const std::string& alarm);
  double threshold_locked() const;
  Group& recorded_group_locked(const std::string& source, const std::string& name);
  void advance_locked(Group& g, Clock::time_point now);
  RankState snapshot(bool with_stack, const std::string& subject_key, std::uint64_t subject_seq);
  std::string ask_site(const std::string& source, const std::string& group, std::int64_t seq);
  std::string key(const std::string& k) const { return options_.prefix + k; }
  void deliver(const std::string& message, const std::string& json);
  bool sleep_for(double seconds);

  WatchdogOptions options_;
  StackDumper dump_stack_;
  std::unique_ptr<TcpStoreClient> store_;  // used by the watchdog's thread only (after the constructor)
  std::optional<NodeRelay> relay_;          // the node's page (the leader's own, or the one a follower reads)
  bool alarm_known_absent();
  mutable std::mutex mutex_;
  std::vector<Group> groups_;
  std::map<std::string, GroupInfo> group_info_;
  std::string recorder_error_;       // the last failed read of the flight recorder, reported once
  std::mutex site_mutex_;
  std::condition_variable site_wake_;
  std::optional<SiteRequest> site_request_;
  std::map<std::uint64_t, std::string> site_answers_;
  std::uint64_t site_next_id_ = 0;
  std::uint64_t epoch_ = 0;
  std::string last_report_json_;
  std::atomic<std::uint64_t> store_ops_{0}, reports_{0}, relayed_ticks_{0}, unrelayed_ticks_{0}, ticks_{0};
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gpuguard
