// The collective watchdog: a thread per rank, needing no Python, that notices a collective waiting too long and
// has every rank of the job print one report naming the stuck rank, its collective and its stack.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  double gather_s = 5;          // how long the rank composing the report waits for silent ranks
  std::string report_path;      // the JSON report, written on every rank ("" = none)
  bool exit_on_stall = false;   // on_stall="raise": end the process (exit_code) once the report is out
  int exit_code = 75;
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

  // A process group, registered once by the Python layer; returns its index for enter()/exit().
  int add_group(std::string name, std::string desc, std::vector<int> ranks);
  // The calling thread enters / leaves a collective on group `group` (cheap: one uncontended lock).
  std::uint64_t enter(int group, std::string op, std::string sizes, std::string site);
  void exit(int group);

  void stop();
  double stall_threshold_s() const;
  std::uint64_t store_ops() const { return store_ops_.load(); }
  std::uint64_t reports() const { return reports_.load(); }
  std::string last_report_json() const;

 private:
  struct Group {
    std::string name, desc;
    std::vector<int> ranks;
    std::uint64_t entered = 0, completed = 0;
    std::string op, sizes, site;
    std::chrono::steady_clock::time_point entered_at{}, last_entry{};
    double longest_wait_s = 0, longest_gap_s = 0;
    std::uint64_t reported_seq = 0;  // a stall of this seq was reported already
  };
  using Clock = std::chrono::steady_clock;

  void run();
  void tick();
  void handle_alarm(std::uint64_t epoch, bool composer, const std::string& alarm);
  double threshold_locked() const;
  RankState snapshot(bool with_stack);
  std::string key(const std::string& k) const { return options_.prefix + k; }
  void deliver(const std::string& message, const std::string& json);
  bool sleep_for(double seconds);

  WatchdogOptions options_;
  StackDumper dump_stack_;
  std::unique_ptr<TcpStoreClient> store_;  // used by the watchdog's thread only (after the constructor)
  mutable std::mutex mutex_;
  std::vector<Group> groups_;
  std::uint64_t epoch_ = 0;
  std::string last_report_json_;
  std::atomic<std::uint64_t> store_ops_{0}, reports_{0};
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gpuguard
