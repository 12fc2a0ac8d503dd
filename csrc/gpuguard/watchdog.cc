// The collective watchdog's thread and its store protocol (see ARCHITECTURE.md, "Data flow of watch()").
//
// Healthy: one store operation per rank per tick (check whether an alarm of the current epoch exists). A rank
// that has waited in a collective past the threshold raises the alarm (compare_set: the first one composes the
// report). At an alarm, every rank publishes its progress and its Python stack (two operations), the composer
// reads them all at once (multi_get) and publishes one report, every rank reads it (two operations) and prints it.
#include "gpuguard/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "gpuguard/tcp_store_client.h"

namespace gpuguard {
namespace {

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    auto n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// The state letter of a local process in /proc/<pid>/stat, or 0 when there is no such process.
char process_state(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

}  // namespace

Watchdog::Watchdog(WatchdogOptions options, StackDumper dump_stack)
    : options_(std::move(options)), dump_stack_(std::move(dump_stack)) {
  try {
    // A plain client of the job's store (never its owner): our own, so that the watchdog needs no LibTorch.
    // store calls throw (value_or_throw): run() handles a failing tick as an exception
    store_ = value_or_throw(
        TcpStoreClient::connect(options_.store_host, options_.store_port, TcpStoreClient::kDefaultTimeout));
    value_or_throw(store_->set(key("hello/" + std::to_string(options_.rank)), encode_state(snapshot(false))));
    store_ops_ += 1;
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot reach the job's store at " + options_.store_host + ":" +
                             std::to_string(options_.store_port) + ": " + e.what());
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  stopping_ = true;
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int Watchdog::add_group(std::string name, std::string desc, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].name == name) return static_cast<int>(i);
  Group g;
  g.name = std::move(name);
  g.desc = std::move(desc);
  g.ranks = std::move(ranks);
  groups_.push_back(std::move(g));
  return static_cast<int>(groups_.size() - 1);
}

std::uint64_t Watchdog::enter(int group, std::string op, std::string sizes, std::string site) {
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (group < 0 || static_cast<std::size_t>(group) >= groups_.size()) throw std::out_of_range("no such group");
  Group& g = groups_[static_cast<std::size_t>(group)];
  if (g.entered > 0)
    g.longest_gap_s = std::max(g.longest_gap_s, std::chrono::duration<double>(now - g.last_entry).count());
  g.entered += 1;
  g.entered_at = g.last_entry = now;
  g.op = std::move(op);
  g.sizes = std::move(sizes);
  g.site = std::move(site);
  return g.entered;
}

void Watchdog::exit(int group) {
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (group < 0 || static_cast<std::size_t>(group) >= groups_.size()) throw std::out_of_range("no such group");
  Group& g = groups_[static_cast<std::size_t>(group)];
  g.completed = g.entered;
  g.longest_wait_s = std::max(g.longest_wait_s, std::chrono::duration<double>(now - g.entered_at).count());
}

double Watchdog::threshold_locked() const {
  if (options_.stall_after_s > 0) return options_.stall_after_s;
  double seen = 0;
  for (const auto& g : groups_) seen = std::max({seen, g.longest_wait_s, g.longest_gap_s});
  return std::max(options_.min_stall_s, 4 * seen);
}

double Watchdog::stall_threshold_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return threshold_locked();
}

std::string Watchdog::last_report_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_report_json_;
}

RankState Watchdog::snapshot(bool with_stack) {
  RankState s;
  s.rank = options_.rank;
  s.host = options_.host;
  s.pid = options_.pid;
  s.gpu = options_.gpu;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& g : groups_) {
      GroupProgress p{g.name, g.desc, g.entered, g.completed, g.op, g.sizes, g.site, 0};
      if (g.entered > g.completed) p.waited_s = since(g.entered_at);
      s.groups.push_back(std::move(p));
    }
  }
  if (with_stack && dump_stack_) s.stack = dump_stack_();
  return s;
}

bool Watchdog::sleep_for(double seconds) {
  std::unique_lock<std::mutex> lock(wake_mutex_);
  return !wake_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stopping_.load(); });
}

void Watchdog::run() {
  int failures = 0;
  while (sleep_for(options_.tick_s)) {
    try {
      tick();
      failures = 0;
    } catch (const std::exception& e) {
      if (stopping_) return;
      if (++failures == 3) {
        write_all(2, "gpuguard.watch: rank " + std::to_string(options_.rank) + ": the job's store at " +
                         options_.store_host + ":" + std::to_string(options_.store_port) +
                         " stopped answering (" + e.what() + "); the watchdog stops.\n");
        return;
      }
    }
  }
}

void Watchdog::tick() {
  auto& store = *store_;
  std::string alarm_key = key("alarm/" + std::to_string(epoch_));
  store_ops_ += 1;
  bool composer = false;
  std::string alarm;
  if (!value_or_throw(store.check({alarm_key}))) {
    std::string mine;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      double threshold = threshold_locked();
      for (const auto& g : groups_) {
        if (g.entered > g.completed && g.entered != g.reported_seq && since(g.entered_at) > threshold) {
          mine = std::to_string(options_.rank) + "\t" + g.name + "\t" + std::to_string(g.entered);
          break;
        }
      }
    }
    if (mine.empty()) return;
    store_ops_ += 1;
    auto got = value_or_throw(store.compare_set(alarm_key, "", mine));
    composer = got == mine;
    alarm = got;
  } else {
    store_ops_ += 1;
    alarm = value_or_throw(store.get(alarm_key));
  }
  // An alarm is handled once, even when the store fails halfway: the next tick looks at the next epoch.
  std::uint64_t epoch = epoch_++;
  handle_alarm(epoch, composer, alarm);
}

void Watchdog::handle_alarm(std::uint64_t epoch, bool composer, const std::string& alarm) {
  auto& store = *store_;
  std::string e = "epoch/" + std::to_string(epoch) + "/";
  RankState me = snapshot(true);

  // The alarm names (raiser, group, seq); that collective is not raised again by any rank once reported.
  std::istringstream fields(alarm);
  std::string raiser, group_name, seq_text;
  std::getline(fields, raiser, '\t');
  std::getline(fields, group_name, '\t');
  std::getline(fields, seq_text, '\t');
  StallSubject subject;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& g : groups_) {
      if (g.name != group_name) continue;
      if (std::to_string(g.entered) == seq_text) g.reported_seq = g.entered;
      subject = StallSubject{g.name, g.desc, g.ranks, g.entered, g.op, g.sizes, g.site};
    }
  }

  store_ops_ += 2;
  auto index = value_or_throw(store.add(key(e + "n"), 1)) - 1;
  value_or_throw(store.set(key(e + "state/" + std::to_string(index)), encode_state(me)));

  std::string message, json;
  if (composer) {
    auto gather_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options_.gather_s));
    std::int64_t arrived = 0;
    while (true) {
      store_ops_ += 1;
      arrived = value_or_throw(store.add(key(e + "n"), 0));
      if (arrived >= options_.world_size || Clock::now() >= gather_until || stopping_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::vector<std::string> keys;
    for (std::int64_t i = 0; i < arrived; ++i) keys.push_back(key(e + "state/" + std::to_string(i)));
    std::vector<std::string> values;
    try {  // a rank counted itself in and publishes its state the next moment
      store_ops_ += 2;
      value_or_throw(store.wait(keys, std::chrono::milliseconds(5000)));
      values = value_or_throw(store.multi_get(keys));
    } catch (const std::exception&) {  // ... unless it died in between: read the states that are there
      values.clear();
      for (const auto& k : keys) {
        store_ops_ += 1;
        if (!value_or_throw(store.check({k}))) continue;
        store_ops_ += 1;
        values.push_back(value_or_throw(store.get(k)));
      }
    }
    std::vector<std::optional<RankState>> states(subject.ranks.size()), hellos(subject.ranks.size());
    for (const auto& v : values) {
      auto st = decode_state(v);
      if (!st) continue;
      auto at = std::find(subject.ranks.begin(), subject.ranks.end(), st->rank);
      if (at != subject.ranks.end()) states[static_cast<std::size_t>(at - subject.ranks.begin())] = std::move(st);
    }
    for (std::size_t i = 0; i < subject.ranks.size(); ++i) {
      if (states[i]) continue;
      std::string hello_key = key("hello/" + std::to_string(subject.ranks[i]));
      store_ops_ += 1;
      if (!value_or_throw(store.check({hello_key}))) continue;
      store_ops_ += 1;
      hellos[i] = decode_state(value_or_throw(store.get(hello_key)));
    }
    std::string my_host = options_.host;
    double gather_s = options_.gather_s;
    auto report = compose_stall_report(subject, states, hellos, [&](const RankState& hello) -> std::string {
      if (hello.pid == 0)
        return "its watchdog never started (gpuguard.watch() starts it at once when the process group exists, "
               "else at the rank's first collective): it reached no collective yet, or died";
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f", gather_s);
      if (hello.host == my_host) {
        char state = process_state(hello.pid);
        if (state == 0 || state == 'Z' || state == 'X')
          return "its process (pid " + std::to_string(hello.pid) + ") is gone: it died (look for an OOM kill, a "
                 "crash or a signal in its log)";
        if (state == 'T' || state == 't')
          return "its process (pid " + std::to_string(hello.pid) + ") is stopped (SIGSTOP or a debugger)";
        return "its process (pid " + std::to_string(hello.pid) + ") exists but did not answer within " + buf +
               " s (frozen, or swapping)";
      }
      return "no answer within " + std::string(buf) + " s from host " + hello.host +
             ": the process died or the host is unreachable";
    });
    message = report.message;
    json = report.json;
    store_ops_ += 2;
    value_or_throw(store.set(key(e + "report/message"), message));
    value_or_throw(store.set(key(e + "report/json"), json));
  } else {
    auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.gather_s + 30));
    std::string report_key = key(e + "report/json");
    while (true) {
      store_ops_ += 1;
      if (value_or_throw(store.check({report_key}))) break;
      if (Clock::now() >= give_up || stopping_) {
        write_all(2, "gpuguard.watch: rank " + std::to_string(options_.rank) + ": a stall was raised (" + alarm +
                         ") but no report came; the rank composing it may be gone.\n");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    store_ops_ += 2;
    json = value_or_throw(store.get(report_key));
    message = value_or_throw(store.get(key(e + "report/message")));
  }
  deliver(message, json);
}

void Watchdog::deliver(const std::string& message, const std::string& json) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_report_json_ = json;
  }
  reports_ += 1;
  std::string out = "[rank " + std::to_string(options_.rank) + "] " + message + "\n";
  if (!options_.report_path.empty()) {
    int fd = ::open(options_.report_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      write_all(fd, json + "\n");
      ::close(fd);
      out += "[rank " + std::to_string(options_.rank) + "] gpuguard: the report as JSON: " + options_.report_path + "\n";
    } else {
      out += "[rank " + std::to_string(options_.rank) + "] gpuguard: could not write " + options_.report_path + "\n";
    }
  }
  // The JSON also goes to the log, one line, so that `gpuguard explain` finds it in what the job printed.
  out += json + "\n";
  write_all(2, out);
  if (options_.exit_on_stall) {
    write_all(2, "[rank " + std::to_string(options_.rank) + "] gpuguard: on_stall='raise': ending this process "
                 "with exit code " + std::to_string(options_.exit_code) + "\n");
    std::_Exit(options_.exit_code);
  }
}

}  // namespace gpuguard
