// A rank's progress through its collectives, as it publishes it at a stall, and the one report composed from all.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard {

// One process group as one rank saw it: the last collective it entered and the last it completed.
struct GroupProgress {
  std::string name;             // the group's name, the same on every rank (torch's group_name)
  std::string desc;             // what users call it ('dp', 'default_pg'), for the report
  std::uint64_t entered = 0;    // sequence number of the last collective entered (1-based; 0 = none yet)
  std::uint64_t completed = 0;  // sequence number of the last collective completed
  std::string op;               // of the last entered collective, e.g. ALL_REDUCE
  std::string sizes;            // e.g. float32[4]
  std::string site;             // where it was issued: a Python call site (file:line) or the framework that issued it
  double waited_s = 0;          // how long it has been in the entered collective (0 when completed)
  std::string thread;           // the issuing thread (pthread id, decimal): its stack is where the CPU waits
};

// What one rank publishes when an alarm is raised; also its hello record (no groups, no stack) at start.
struct RankState {
  int rank = -1;
  std::string host;
  long pid = 0;
  std::string gpu;              // GPU UUID, or "" on the CPU
  std::vector<GroupProgress> groups;
  std::string stack;            // every Python thread's stack, dumped without the GIL
};

// Longest encoded state a rank accepts from the store (untrusted bytes).
inline constexpr std::size_t kMaxStateBytes = 64 * 1024;

std::string encode_state(const RankState& state);
// Strict: nullopt for anything malformed or longer than kMaxStateBytes.
std::optional<RankState> decode_state(std::string_view bytes);

// The stalled collective as the rank that raised the alarm saw it.
struct StallSubject {
  std::string group;            // name
  std::string desc;
  std::vector<int> ranks;       // the group's global ranks
  std::uint64_t seq = 0;
  std::string op, sizes, site;
  std::string source;           // where the progress came from, as the report states it
};

struct StallReport {
  std::string kind;             // rank_behind | rank_slow | no_progress | desync | rank_gone, or resolved
  std::string message;          // what every rank prints ("" when resolved)
  std::string json;             // {"gpuguard_stall": {...}} ("" when resolved)
};

// The kind of a stall that ended before its report: every rank answered, and every one had completed the
// collective by then (a rank was late, not stuck). Nothing is printed for it.
inline constexpr const char* kStallResolved = "resolved";

// Why a rank did not answer, given its hello record: "its process is gone", "...not answering...".
using SilenceReason = std::function<std::string(const RankState& hello)>;

// states[i] and hellos[i] belong to subject.ranks[i]; a state that is nullopt did not arrive.
StallReport compose_stall_report(const StallSubject& subject, const std::vector<std::optional<RankState>>& states,
                                 const std::vector<std::optional<RankState>>& hellos, const SilenceReason& silence);

// "0-4, 6, 7"
std::string format_ranks(std::vector<int> ranks);

// Where a thread's CPU is now: the innermost frame of `thread` (decimal pthread id; "" = the first thread whose
// innermost frame is not gpuguard's own) in a stack dump as faulthandler writes it, as "file:line in function".
// "" when the dump has no such thread.
std::string cpu_wait_site(const std::string& stack, const std::string& thread);

// The stack dump without the threads whose innermost frame is in a file whose path contains `path_part` (the
// watchdog's own helper thread, which is no part of the job).
std::string without_threads_in(const std::string& stack, std::string_view path_part);

}  // namespace gpuguard
