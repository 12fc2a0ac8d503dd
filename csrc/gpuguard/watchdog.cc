// The collective watchdog's thread and its store protocol (see ARCHITECTURE.md, "Data flow of a stall report").
//
// Healthy: one store operation per rank per tick (check whether an alarm of the current epoch exists), or, with
// the per-node tier, one per node: the node's leader writes the answer to a shared page (node_relay.h) that the
// other ranks of the node read instead, falling back to the store whenever that answer is missing or old. A rank
// that has waited in a collective past the threshold raises the alarm (compare_set: the first one composes the
// report). At an alarm, every rank publishes its progress and its Python stack (two operations), the composer
// reads them all at once (multi_get) and publishes one report, every rank reads it (two operations) and prints it.
#include "gpuguard/watchdog.h"

#include <fcntl.h>
#include <pthread.h>
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
    value_or_throw(store_->set(key("hello/" + std::to_string(options_.rank)), encode_state(snapshot(false, "", 0))));
    store_ops_ += 1;
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot reach the job's store at " + options_.store_host + ":" +
                             std::to_string(options_.store_port) + ": " + e.what());
  }
  if (options_.node_leader && !options_.node_relay_path.empty()) {
    auto page = NodeRelay::create(options_.node_relay_path, options_.tick_s);
    if (!page.ok()) {  // the tier is an optimisation: without it this node's ranks ask the store themselves
      write_all(2, "gpuguard.watch: rank " + std::to_string(options_.rank) + ": no per-node relay (" +
                       page.error().message() + "); this node's ranks each ask the job's store\n");
    } else {
      relay_.emplace(std::move(page).value());
    }
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  stopping_ = true;
  wake_.notify_all();
  {
    std::lock_guard<std::mutex> lock(site_mutex_);
  }
  site_wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  relay_.reset();  // the leader's page is unlinked now, not when Python frees this object (maybe never, at exit)
}

// ---- progress: the groups, as the caller reports them and as the flight recorder counts them ----------------

void Watchdog::describe_group(const std::string& name, std::string desc, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& info = group_info_[name];
  info.desc = std::move(desc);
  info.ranks = std::move(ranks);
  for (auto& g : groups_) {
    if (g.name != name) continue;
    g.desc = info.desc;
    g.ranks = info.ranks;
  }
}

int Watchdog::add_group(std::string name, std::string desc, std::vector<int> ranks, std::string label) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string key = name + "@calls";
  for (std::size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].key == key) return static_cast<int>(i);
  group_info_[name] = GroupInfo{desc, ranks};
  Group g;
  g.key = std::move(key);
  g.name = std::move(name);
  g.desc = std::move(desc);
  g.ranks = std::move(ranks);
  g.label = std::move(label);
  groups_.push_back(std::move(g));
  return static_cast<int>(groups_.size() - 1);
}

Watchdog::Group& Watchdog::recorded_group_locked(const std::string& source, const std::string& name) {
  std::string key = name + "@" + source;
  for (auto& g : groups_)
    if (g.key == key) return g;
  Group g;
  g.key = std::move(key);
  g.name = name;
  g.recorder = source;
  if (auto info = group_info_.find(name); info != group_info_.end()) {
    g.desc = info->second.desc;
    g.ranks = info->second.ranks;
  }
  groups_.push_back(std::move(g));
  return groups_.back();
}

// After `completed` or `entered` changed: the collectives completed out of order that now follow on, the longest
// wait, and since when the next one is awaited.
void Watchdog::advance_locked(Group& g, Clock::time_point now) {
  std::uint64_t before = g.completed;
  while (!g.done_ahead.empty() && *g.done_ahead.begin() <= g.completed + 1) {
    g.completed = std::max(g.completed, *g.done_ahead.begin());
    g.done_ahead.erase(g.done_ahead.begin());
  }
  if (g.completed != before)
    g.longest_wait_s = std::max(g.longest_wait_s, std::chrono::duration<double>(now - g.waiting_since).count());
  if (g.completed != before && g.entered > g.completed) g.waiting_since = now;
}

std::uint64_t Watchdog::enter(int group, std::string op, std::string sizes, std::string site) {
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (group < 0 || static_cast<std::size_t>(group) >= groups_.size()) throw std::out_of_range("no such group");
  Group& g = groups_[static_cast<std::size_t>(group)];
  if (g.entered > 0)
    g.longest_gap_s = std::max(g.longest_gap_s, std::chrono::duration<double>(now - g.last_entry).count());
  g.entered += 1;
  g.last_entry = now;
  if (g.entered == g.completed + 1) g.waiting_since = now;
  g.op = std::move(op);
  g.sizes = std::move(sizes);
  g.site = std::move(site);
  g.thread = std::to_string(static_cast<unsigned long long>(::pthread_self()));
  return g.entered;
}

void Watchdog::complete(int group, std::uint64_t seq) {
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (group < 0 || static_cast<std::size_t>(group) >= groups_.size()) throw std::out_of_range("no such group");
  Group& g = groups_[static_cast<std::size_t>(group)];
  if (seq > g.completed && seq <= g.entered) g.done_ahead.insert(seq);
  advance_locked(g, now);
}

void Watchdog::exit(int group) {
  std::uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (group < 0 || static_cast<std::size_t>(group) >= groups_.size()) throw std::out_of_range("no such group");
    seq = groups_[static_cast<std::size_t>(group)].entered;
  }
  complete(group, seq);
}

void Watchdog::exit_later(int group, std::uint64_t seq, CompletionCheck done) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (group < 0 || static_cast<std::size_t>(group) >= groups_.size()) throw std::out_of_range("no such group");
  groups_[static_cast<std::size_t>(group)].pending.emplace_back(seq, std::move(done));
}

// The completion checks, polled in order per group (a stream completes in order), outside the lock: a driver
// call must never hold up a training thread's enter().
void Watchdog::poll_pending() {
  for (std::size_t i = 0;; ++i) {
    std::uint64_t seq = 0;
    CompletionCheck check;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (i >= groups_.size()) return;
      if (groups_[i].pending.empty()) continue;
      seq = groups_[i].pending.front().first;
      check = groups_[i].pending.front().second;
    }
    while (check) {
      auto done = check();
      if (!done) {
        write_all(2, "gpuguard.watch: rank " + std::to_string(options_.rank) + ": cannot tell whether collective #" +
                         std::to_string(seq) + " completed (" + done.error().message() + "); counting it as completed\n");
      } else if (!done.value()) {
        break;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      Group& g = groups_[i];
      g.pending.pop_front();
      if (seq > g.completed && seq <= g.entered) g.done_ahead.insert(seq);
      advance_locked(g, Clock::now());
      check = nullptr;
      if (!g.pending.empty()) {
        seq = g.pending.front().first;
        check = g.pending.front().second;
      }
    }
  }
}

// One status read per recorder source and tick: microseconds, no GIL, the recorder's lock held only to copy the
// groups' counters.
void Watchdog::refresh_recorder() {
  if (!options_.read_recorder) return;
  for (const auto& source : options_.recorder_sources) {
    auto text = options_.read_recorder(source, false);
    auto dump = text ? parse_flight_recorder_dump(text.value()) : Result<FlightRecorderDump>(text.error());
    std::lock_guard<std::mutex> lock(mutex_);
    if (!dump) {
      std::string error = dump.error().message();
      if (error != recorder_error_)
        write_all(2, "gpuguard.watch: rank " + std::to_string(options_.rank) + ": cannot read torch's flight "
                     "recorder (" + source + "): " + error + "; its collectives go unwatched until it can\n");
      recorder_error_ = error;
      continue;
    }
    recorder_error_.clear();
    auto now = Clock::now();
    for (const auto& st : dump.value().groups) {
      Group& g = recorded_group_locked(source, st.name);
      auto enqueued = static_cast<std::uint64_t>(std::max<std::int64_t>(0, st.enqueued));
      auto completed = static_cast<std::uint64_t>(std::max<std::int64_t>(0, st.completed));
      bool was_waiting = g.entered > g.completed;
      if (enqueued != g.entered) {
        if (g.entered > 0)
          g.longest_gap_s = std::max(g.longest_gap_s, std::chrono::duration<double>(now - g.last_entry).count());
        g.last_entry = now;
      }
      if (completed != g.completed && was_waiting)
        g.longest_wait_s = std::max(g.longest_wait_s, std::chrono::duration<double>(now - g.waiting_since).count());
      if (enqueued > completed && (!was_waiting || completed != g.completed)) g.waiting_since = now;
      g.entered = enqueued;
      g.completed = completed;
    }
  }
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

// ---- call sites of recorded collectives: asked of the Python side, never waited for long ------------------

std::optional<SiteRequest> Watchdog::next_site_request() {
  std::unique_lock<std::mutex> lock(site_mutex_);
  site_wake_.wait(lock, [this] { return stopping_.load() || site_request_.has_value(); });
  if (stopping_) return std::nullopt;
  SiteRequest request = *site_request_;
  site_request_.reset();
  return request;
}

void Watchdog::answer_site(std::uint64_t id, std::string site) {
  {
    std::lock_guard<std::mutex> lock(site_mutex_);
    site_answers_[id] = std::move(site);
  }
  site_wake_.notify_all();
}

std::string Watchdog::ask_site(const std::string& source, const std::string& group, std::int64_t seq) {
  std::unique_lock<std::mutex> lock(site_mutex_);
  std::uint64_t id = ++site_next_id_;
  site_request_ = SiteRequest{id, source, group, seq};
  site_wake_.notify_all();
  // bounded inside the composer's gather time, so that a rank whose GIL is held elsewhere still answers in time
  // (the first symbolisation of stack traces, the slow one, was paid by watch() before the job trained)
  double wait_s = std::min(options_.site_wait_s, options_.gather_s * 0.8);
  bool answered = site_wake_.wait_for(lock, std::chrono::duration<double>(wait_s), [&] {
    return stopping_.load() || site_answers_.count(id) != 0;
  });
  if (!answered || stopping_) {
    if (site_request_ && site_request_->id == id) site_request_.reset();
    return "";
  }
  std::string site = std::move(site_answers_[id]);
  site_answers_.erase(id);
  return site;
}

RankState Watchdog::snapshot(bool with_stack, const std::string& subject_key, std::uint64_t subject_seq) {
  RankState s;
  s.rank = options_.rank;
  s.host = options_.host;
  s.pid = options_.pid;
  s.gpu = options_.gpu;
  // At an alarm, the recorded collectives themselves: what each group's subject (or last) collective was.
  std::map<std::pair<std::string, std::string>, std::map<std::int64_t, RecordedCollective>> recorded;
  if (with_stack && options_.read_recorder) {
    for (const auto& source : options_.recorder_sources) {
      auto text = options_.read_recorder(source, true);
      if (!text) continue;
      auto dump = parse_flight_recorder_dump(text.value());
      if (!dump) continue;
      for (auto& c : dump.value().collectives)
        if (!c.p2p) recorded[{source, c.group}][c.seq] = std::move(c);
    }
  }
  std::vector<std::tuple<std::size_t, std::string, std::string, std::int64_t>> sites;  // (group, source, name, seq)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& g : groups_) {
      GroupProgress p{g.key, g.desc, g.entered, g.completed, g.op, g.sizes, g.site, 0, g.thread};
      if (g.entered > g.completed) p.waited_s = since(g.waiting_since);
      if (!g.recorder.empty()) {
        std::uint64_t seq = g.key == subject_key && g.entered >= subject_seq ? subject_seq : g.entered;
        auto found = recorded.find({g.recorder, g.name});
        if (found != recorded.end()) {
          auto c = found->second.find(static_cast<std::int64_t>(seq));
          if (c != found->second.end()) {
            p.op = c->second.op;
            p.sizes = c->second.sizes;
            p.thread = c->second.thread_id;
            if (p.desc.empty()) p.desc = c->second.desc;
          }
        }
        // only a rank that issued the stalled collective says where: the others' sites are not in the report
        if (with_stack && g.key == subject_key && subject_seq > 0 && g.entered >= subject_seq)
          sites.emplace_back(s.groups.size(), g.recorder, g.name, static_cast<std::int64_t>(subject_seq));
      }
      s.groups.push_back(std::move(p));
    }
  }
  for (const auto& [index, source, name, seq] : sites) s.groups[index].site = ask_site(source, name, seq);
  if (with_stack && dump_stack_) s.stack = without_threads_in(dump_stack_(), "gpuguard/watchdog/recorder.py");
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
      ticks_ += 1;
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

double Watchdog::relay_max_age_s() const { return 3 * options_.tick_s; }

// A follower of the per-node tier: whether the leader's page says, recently enough, that the alarm of this
// rank's epoch does not exist. Anything else (no page yet, another epoch, an alarm, an old answer) sends the rank
// to the store, so a leader that died or stalls costs its node one store operation per rank per tick again,
// never a missed alarm.
bool Watchdog::alarm_known_absent() {
  if (options_.node_relay_path.empty() || options_.node_leader) return false;
  if (!relay_) {
    auto page = NodeRelay::open(options_.node_relay_path);
    if (!page.ok()) {
      unrelayed_ticks_ += 1;
      return false;
    }
    relay_.emplace(std::move(page).value());
  }
  auto reading = relay_->read();
  if (reading && reading->epoch == epoch_ && !reading->alarm && reading->age_s <= relay_max_age_s()) {
    relayed_ticks_ += 1;
    return true;
  }
  if (!reading || reading->age_s > relay_max_age_s()) {
    relay_.reset();  // no answer, or an old one: the next tick opens the path again (a new leader's page)
  }
  unrelayed_ticks_ += 1;
  return false;
}

void Watchdog::tick() {
  refresh_recorder();
  poll_pending();
  auto& store = *store_;
  std::string alarm_key = key("alarm/" + std::to_string(epoch_));
  bool composer = false;
  std::string alarm;
  bool exists = false;
  if (!alarm_known_absent()) {
    store_ops_ += 1;
    exists = value_or_throw(store.check({alarm_key}));
    if (options_.node_leader && relay_) relay_->publish(epoch_, exists);
  }
  if (!exists) {
    std::string mine;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      double threshold = threshold_locked();
      for (const auto& g : groups_) {
        // the oldest collective not completed: the one every rank of the group must reach first
        if (g.entered > g.completed && g.completed + 1 != g.reported_seq && since(g.waiting_since) > threshold) {
          mine = std::to_string(options_.rank) + "\t" + g.key + "\t" + std::to_string(g.completed + 1);
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
  // The alarm names (raiser, group key, seq); that collective is not raised again by any rank once reported.
  std::istringstream fields(alarm);
  std::string raiser, group_key, seq_text;
  std::getline(fields, raiser, '\t');
  std::getline(fields, group_key, '\t');
  std::getline(fields, seq_text, '\t');
  std::uint64_t seq = std::strtoull(seq_text.c_str(), nullptr, 10);
  RankState me = snapshot(true, group_key, seq);
  StallSubject subject;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& g : groups_) {
      if (g.key != group_key) continue;
      g.reported_seq = seq;
      subject = StallSubject{g.key, g.desc, g.ranks, seq, g.op, g.sizes, g.site,
                             g.recorder.empty() ? options_.calls_note : options_.source_note};
      if (subject.ranks.empty())
        for (int r = 0; r < options_.world_size; ++r) subject.ranks.push_back(r);
    }
  }
  for (const auto& p : me.groups) {
    if (p.name != group_key) continue;
    subject.op = p.op;
    subject.sizes = p.sizes;
    subject.site = p.site;
    if (subject.desc.empty()) subject.desc = p.desc;
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
    message = report.message;  // both "" for a stall that resolved: the others read that and print nothing
    json = report.json;
    store_ops_ += 3;
    value_or_throw(store.set(key(e + "answered"), std::to_string(arrived)));
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
  if (json.empty()) return;  // resolved before the report: every rank had completed the collective
  deliver(message, json);
  if (!options_.exit_on_stall) return;
  // on_stall="raise": the first rank to exit makes the launcher kill the others, perhaps before they printed the
  // report; so every rank counts itself delivered and waits (boundedly) for the others that answered to do so.
  write_all(2, "[rank " + std::to_string(options_.rank) + "] gpuguard: on_stall='raise': ending this process "
               "with exit code " + std::to_string(options_.exit_code) + "\n");
  try {  // the process ends whatever the store does now
    store_ops_ += 2;
    std::int64_t expected = std::strtoll(value_or_throw(store.get(key(e + "answered"))).c_str(), nullptr, 10);
    value_or_throw(store.add(key(e + "delivered"), 1));
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options_.gather_s + 5));
    while (Clock::now() < until && !stopping_) {
      store_ops_ += 1;
      if (value_or_throw(store.add(key(e + "delivered"), 0)) >= expected) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception&) {
  }
  std::_Exit(options_.exit_code);
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
}

}  // namespace gpuguard
