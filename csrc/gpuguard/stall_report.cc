// Encoding of a rank's collective progress for the store, and the classification of a stall into one report.
#include "gpuguard/stall_report.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

namespace gpuguard {
namespace {

constexpr std::string_view kMagic = "gpuguard-stall-state 2";
constexpr std::size_t kMaxGroups = 64;
constexpr std::size_t kMaxReportedStack = 16 * 1024;

// Fields are tab-separated on a line: a value never carries a tab or a newline.
std::string clean(std::string_view s) {
  std::string out(s.substr(0, 1024));
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

std::vector<std::string_view> split(std::string_view line, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    auto pos = line.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(line.substr(start));
      return out;
    }
    out.push_back(line.substr(start, pos - start));
    start = pos + 1;
  }
}

template <typename T>
bool parse_number(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string json_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", std::max(0.0, s));
  return buf;
}

const GroupProgress* find_group(const RankState& state, const std::string& name) {
  for (const auto& g : state.groups)
    if (g.name == name) return &g;
  return nullptr;
}

std::string who(const RankState& s) {
  return "rank " + std::to_string(s.rank) + " (" + (s.host.empty() ? "?" : s.host) + ", pid " +
         std::to_string(s.pid) + ", " + (s.gpu.empty() ? "no GPU" : "GPU " + s.gpu) + ")";
}

std::string ranks_word(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + format_ranks(ranks);
}

std::string have(const std::vector<int>& ranks) { return ranks.size() == 1 ? "has" : "have"; }

std::string indent(const std::string& stack) {
  std::string text = stack.size() > kMaxReportedStack ? stack.substr(0, kMaxReportedStack) + "\n..." : stack;
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

std::string call(const std::string& op, std::uint64_t seq, const std::string& sizes, const std::string& site) {
  std::string out = op + " #" + std::to_string(seq);
  if (!sizes.empty()) out += " (" + sizes + ")";
  if (!site.empty()) out += " at " + site;
  return out;
}

}  // namespace

std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    if (j >= i + 2) {
      out += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    } else {
      for (std::size_t k = i; k <= j; ++k) out += (k > i ? ", " : "") + std::to_string(ranks[k]);
    }
    i = j + 1;
  }
  return out;
}

namespace {

// '  File "/path/train.py", line 12 in step' -> {"/path/train.py", "12", "step"}; nullopt for another line.
std::optional<std::array<std::string, 3>> frame_of(const std::string& line) {
  auto file = line.find("File \"");
  if (file == std::string::npos) return std::nullopt;
  auto close = line.find("\", line ", file + 6);
  if (close == std::string::npos) return std::nullopt;
  std::string rest = line.substr(close + 8);  // "12 in step"
  auto in_at = rest.find(" in ");
  return std::array<std::string, 3>{line.substr(file + 6, close - file - 6), rest.substr(0, in_at),
                                    in_at == std::string::npos ? "" : rest.substr(in_at + 4)};
}

std::string frame_text(const std::array<std::string, 3>& f) {
  return f[0] + ":" + f[1] + (f[2].empty() ? "" : " in " + f[2]);
}

// A frame in an installed library or the standard library rather than in the job's own code.
bool library_frame(const std::string& path) {
  return path.find("/site-packages/") != std::string::npos || path.find("/dist-packages/") != std::string::npos ||
         path.find("/lib/python3") != std::string::npos;
}

}  // namespace

std::string cpu_wait_site(const std::string& stack, const std::string& thread) {
  unsigned long long wanted = 0;
  bool by_id = !thread.empty() && parse_number(std::string_view(thread), wanted);
  // the chosen thread's frames, innermost first
  std::vector<std::array<std::string, 3>> frames;
  std::istringstream in(stack);
  std::string line;
  bool in_block = false;
  while (std::getline(in, line)) {
    auto header = line.find("hread 0x");  // "Thread 0x..." or "Current thread 0x..."
    if (header != std::string::npos && line.find("(most recent call first)") != std::string::npos) {
      if (!frames.empty()) break;
      unsigned long long id = std::strtoull(line.c_str() + header + 6, nullptr, 16);
      in_block = by_id ? id == wanted : true;
      continue;
    }
    if (!in_block) continue;
    auto frame = frame_of(line);
    if (!frame) continue;
    if (frames.empty() && !by_id && (*frame)[0].find("gpuguard/watchdog/") != std::string::npos) {
      in_block = false;  // our own helper thread
      continue;
    }
    frames.push_back(std::move(*frame));
  }
  if (frames.empty()) return by_id ? cpu_wait_site(stack, "") : "";
  // Where the CPU is, and, when that is in a library or a helper module, the line of the job's own code that
  // called it: the deepest frame in the file the thread started in (the script), else the first frame outside
  // installed libraries.
  const auto& innermost = frames.front();
  const std::string& script = frames.back()[0];
  if (innermost[0] == script) return frame_text(innermost);
  if (!library_frame(script)) {
    for (const auto& f : frames)
      if (f[0] == script) return frame_text(innermost) + ", called from " + frame_text(f);
  }
  if (!library_frame(innermost[0])) return frame_text(innermost);
  for (const auto& f : frames)
    if (!library_frame(f[0])) return frame_text(innermost) + ", called from " + frame_text(f);
  return frame_text(innermost);
}

std::string without_threads_in(const std::string& stack, std::string_view path_part) {
  std::string out, block;
  bool first_frame = false, drop = false;
  auto flush = [&] {
    if (!drop) out += block;
    block.clear();
    drop = false;
  };
  std::istringstream in(stack);
  std::string line;
  while (std::getline(in, line)) {
    bool header = line.find("hread 0x") != std::string::npos && line.find("(most recent call first)") != std::string::npos;
    if (header) {
      flush();
      first_frame = true;
    } else if (first_frame && line.find("File \"") != std::string::npos) {
      drop = line.find(path_part) != std::string::npos;
      first_frame = false;
    }
    block += line + "\n";
  }
  flush();
  return out;
}

std::string encode_state(const RankState& s) {
  std::string out(kMagic);
  out += "\nrank\t" + std::to_string(s.rank) + "\nhost\t" + clean(s.host) + "\npid\t" + std::to_string(s.pid) +
         "\ngpu\t" + clean(s.gpu) + "\n";
  for (const auto& g : s.groups) {
    out += "group\t" + clean(g.name) + "\t" + clean(g.desc) + "\t" + std::to_string(g.entered) + "\t" +
           std::to_string(g.completed) + "\t" + clean(g.op) + "\t" + clean(g.sizes) + "\t" + clean(g.site) + "\t" +
           std::to_string(static_cast<long long>(std::llround(g.waited_s * 1000))) + "\t" + clean(g.thread) + "\n";
  }
  out += "stack\n";
  std::size_t room = kMaxStateBytes - std::min(kMaxStateBytes, out.size() + 1);
  out += s.stack.substr(0, room);
  return out;
}

std::optional<RankState> decode_state(std::string_view bytes) {
  if (bytes.size() > kMaxStateBytes) return std::nullopt;
  RankState s;
  std::size_t pos = 0;
  bool magic = false, have_rank = false;
  while (pos <= bytes.size()) {
    auto end = bytes.find('\n', pos);
    std::string_view line = bytes.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    pos = end == std::string_view::npos ? bytes.size() + 1 : end + 1;
    if (!magic) {
      if (line != kMagic) return std::nullopt;
      magic = true;
      continue;
    }
    if (line == "stack") {
      if (pos <= bytes.size()) s.stack = std::string(bytes.substr(pos));
      return have_rank ? std::optional<RankState>(std::move(s)) : std::nullopt;
    }
    auto f = split(line, '\t');
    if (f[0] == "rank" && f.size() == 2) {
      if (!parse_number(f[1], s.rank) || s.rank < 0) return std::nullopt;
      have_rank = true;
    } else if (f[0] == "host" && f.size() == 2) {
      s.host = std::string(f[1]);
    } else if (f[0] == "pid" && f.size() == 2) {
      if (!parse_number(f[1], s.pid)) return std::nullopt;
    } else if (f[0] == "gpu" && f.size() == 2) {
      s.gpu = std::string(f[1]);
    } else if (f[0] == "group" && f.size() == 10) {
      if (s.groups.size() >= kMaxGroups) return std::nullopt;
      GroupProgress g;
      long long waited_ms = 0;
      g.name = std::string(f[1]);
      g.desc = std::string(f[2]);
      if (!parse_number(f[3], g.entered) || !parse_number(f[4], g.completed) || !parse_number(f[8], waited_ms))
        return std::nullopt;
      g.op = std::string(f[5]);
      g.sizes = std::string(f[6]);
      g.site = std::string(f[7]);
      g.waited_s = static_cast<double>(waited_ms) / 1000;
      g.thread = std::string(f[9]);
      s.groups.push_back(std::move(g));
    } else {
      return std::nullopt;
    }
  }
  return std::nullopt;  // no stack line: truncated
}

StallReport compose_stall_report(const StallSubject& subject, const std::vector<std::optional<RankState>>& states,
                                 const std::vector<std::optional<RankState>>& hellos, const SilenceReason& silence) {
  struct At {
    std::string op, sizes, site;
    std::vector<int> ranks;
    std::string stack;
  };
  std::vector<int> gone, behind, waiting, past;
  std::vector<std::string> gone_lines, behind_lines;
  std::map<std::pair<std::string, std::string>, At> at_seq;  // (op, sizes) -> who called it as #seq
  std::string first_stack, waiting_stack, issued_at;
  std::vector<std::pair<int, std::string>> cpu_at;  // each answering rank's CPU, where it is now
  double waited = 0;
  for (std::size_t i = 0; i < subject.ranks.size(); ++i) {
    int rank = subject.ranks[i];
    const auto& st = i < states.size() ? states[i] : std::nullopt;
    if (!st) {
      gone.push_back(rank);
      RankState hello;
      if (i < hellos.size() && hellos[i]) hello = *hellos[i];
      hello.rank = rank;
      gone_lines.push_back(who(hello) + " did not answer: " + silence(hello));
      continue;
    }
    const GroupProgress* g = find_group(*st, subject.group);
    std::uint64_t entered = g ? g->entered : 0, completed = g ? g->completed : 0;
    cpu_at.emplace_back(rank, cpu_wait_site(st->stack, g && entered >= subject.seq ? g->thread : ""));
    if (entered < subject.seq) {
      behind.push_back(rank);
      std::string line = who(*st) + " never entered " + subject.op + " #" + std::to_string(subject.seq) +
                         " on group '" + subject.desc + "'";
      line += entered ? "; its last collective there was " + call(g->op, g->entered, g->sizes, g->site) +
                            (completed >= entered ? " (completed)" : " (still in it)")
                      : "; it entered no collective there yet";
      for (const auto& other : st->groups)
        if (other.name != subject.group && other.entered > other.completed)
          line += "; it is waiting in " + call(other.op, other.entered, other.sizes, other.site) + " on group '" +
                  other.desc + "' for " + seconds(other.waited_s) + " s";
      std::string now_at = cpu_at.back().second;
      line += ". rank " + std::to_string(rank) + " is at " + (now_at.empty() ? std::string("(no stack)") : now_at) +
              ":\n" + indent(st->stack);
      behind_lines.push_back(line);
      if (first_stack.empty()) first_stack = st->stack;
    } else if (entered == subject.seq && completed < subject.seq) {
      waiting.push_back(rank);
      waited = std::max(waited, g->waited_s);
      auto& at = at_seq[{g->op, g->sizes}];
      at.op = g->op;
      at.sizes = g->sizes;
      at.site = g->site;
      at.ranks.push_back(rank);
      if (at.stack.empty()) at.stack = st->stack;
      if (waiting_stack.empty()) waiting_stack = st->stack;
      if (issued_at.empty()) issued_at = g->site;
    } else {
      past.push_back(rank);
    }
  }

  // every rank answered and had completed it by then: the collective moved after all, late but not stuck (a rank
  // that ran seconds behind on a loaded host); a report would say "not completed on any" of ranks that all did
  if (gone.empty() && behind.empty() && waiting.empty()) return StallReport{kStallResolved, "", ""};

  std::string where = subject.op + " #" + std::to_string(subject.seq) + " on group '" + subject.desc + "' (ranks " +
                      format_ranks(subject.ranks) + ")";
  if (issued_at.empty()) issued_at = subject.site;
  // Both places of the ranks in the collective: where it was issued, and where their CPU waits now.
  auto both_places = [&]() {
    std::string out = "\n  " + ranks_word(waiting) + " issued it" + (issued_at.empty() ? "" : " at " + issued_at);
    std::string waits;
    for (const auto& [rank, at] : cpu_at) {
      if (at.empty() || std::find(waiting.begin(), waiting.end(), rank) == waiting.end()) continue;
      waits += std::string(waits.empty() ? "" : ", ") + "rank " + std::to_string(rank) + " at " + at;
      if (waits.size() > 600) break;
    }
    if (!waits.empty()) out += "; their CPU waits now: " + waits;
    return out + ".";
  };
  std::string kind, message, stack;
  std::vector<int> stuck;
  if (!gone.empty()) {
    kind = "rank_gone";
    stuck = gone;
    message = "gpuguard: collective stall: " + ranks_word(gone) + " of " + where + (gone.size() == 1 ? " is" : " are") +
              " gone or unreachable";
    for (const auto& l : gone_lines) message += "\n  " + l;
    if (!waiting.empty())
      message += "\n  " + ranks_word(waiting) + " " + have(waiting) + " waited in " + subject.op + " #" +
                 std::to_string(subject.seq) + " for " + seconds(waited) + " s." + both_places();
    message += "\n  Fix: look at the log and the host of the named rank (killed by the OOM killer, a crash, a "
               "lost node); the others will wait until the collective timeout.";
  } else if (at_seq.size() > 1) {
    kind = "desync";
    std::vector<At> calls;
    for (auto& [key, at] : at_seq) calls.push_back(at);
    std::sort(calls.begin(), calls.end(), [](const At& a, const At& b) { return a.ranks.size() > b.ranks.size(); });
    message = "gpuguard: collective stall: desync on collective #" + std::to_string(subject.seq) + " of group '" +
              subject.desc + "' (ranks " + format_ranks(subject.ranks) + "): the ranks called different collectives";
    for (const auto& c : calls) {
      message += "\n  " + ranks_word(c.ranks) + " called " + call(c.op, subject.seq, c.sizes, c.site);
      if (&c != &calls.front()) stuck.insert(stuck.end(), c.ranks.begin(), c.ranks.end());
    }
    stack = calls.size() > 1 ? calls[1].stack : "";
    message += "\n  Fix: every rank of a group must call the same collectives, with the same sizes, in the same "
               "order; look for a rank-dependent branch around the call sites above. " +
               std::string("rank ") + std::to_string(calls[1].ranks.front()) + " is at:\n" + indent(stack);
  } else if (!behind.empty()) {
    kind = "rank_behind";
    stuck = behind;
    message = "gpuguard: collective stall: " + ranks_word(behind) + " never entered " + where + "; " +
              (waiting.empty() ? std::string("the others") : ranks_word(waiting)) + " " + have(waiting) +
              " waited in it for " + seconds(waited) + " s.";
    if (!waiting.empty()) message += both_places();
    for (const auto& l : behind_lines) message += "\n  " + l;
    message += "\n  Fix: the stack above is where the rank is instead; a rank-dependent branch, a data loader "
               "or I/O stall, or a collective it skipped.";
    stack = first_stack;
  } else if (!past.empty() && !waiting.empty()) {
    // every rank entered it and some completed it: the data moved, so neither the program nor the transport holds
    // it; the ranks still in it are behind (a loaded host, a GPU busy with earlier work)
    kind = "rank_slow";
    stuck = waiting;
    message = "gpuguard: collective stall: every rank entered " + where + "; " + ranks_word(past) +
              " completed it, but " + ranks_word(waiting) + " " + have(waiting) + " not in " + seconds(waited) +
              " s. The collective moved on the others, so the transport works: " +
              (waiting.size() == 1 ? "that rank is" : "those ranks are") +
              " behind in it. Its GPU has not finished it yet, still running the work queued before it (a long "
              "kernel, or a GPU shared with another process), or its process gets too little CPU to move on (a "
              "loaded host)."
              "\n  Fix: look at what runs on that GPU (nvidia-smi) and at the host's load (top); torch.profiler "
              "around the steps before the call site shows a long kernel.";
    message += both_places();
    stack = waiting_stack;
    past.clear();  // named above
  } else {
    kind = "no_progress";
    stuck = waiting;
    message = "gpuguard: collective stall: every rank entered " + where + " and it has not completed on any of "
              "them in " + seconds(waited) + " s: the collective itself is stuck, not a rank.";
    if (subject.ranks.size() == 1) {  // no peer: neither the network nor peer-to-peer can hold it
      message += " Its group has one rank, so no network or peer GPU is involved: the GPU has not reached it yet, "
                 "still running the work queued before it (a long kernel, or a GPU shared with another process)."
                 "\n  Fix: look at what runs on the GPU (nvidia-smi; torch.profiler around the steps before the "
                 "call site).";
    } else {
      message += " Either NCCL's transport hangs (the network between the ranks, or GPU peer-to-peer), or a GPU "
                 "has not reached it yet, still running the work queued before it (a long kernel)."
                 "\n  Fix: run `gpuguard doctor --p2p --nccl` on a node of this job, and try the job with "
                 "NCCL_P2P_DISABLE=1 (doctor says whether that cures it); if the transport is sound, look at what "
                 "runs on the GPUs (nvidia-smi).";
    }
    message += both_places();
    stack = waiting_stack;
  }
  if (!past.empty())
    message += "\n  (" + ranks_word(past) + " already completed #" + std::to_string(subject.seq) + ")";
  if (!subject.source.empty()) message += "\n  (" + subject.source + ")";

  std::ostringstream json;
  json << "{\"gpuguard_stall\": {\"kind\": " << json_string(kind) << ", \"group\": " << json_string(subject.desc)
       << ", \"group_name\": " << json_string(subject.group.substr(0, subject.group.rfind('@')))
       << ", \"group_ranks\": " << json_ranks(subject.ranks)
       << ", \"seq\": " << subject.seq << ", \"op\": " << json_string(subject.op)
       << ", \"sizes\": " << json_string(subject.sizes) << ", \"stuck_ranks\": " << json_ranks(stuck)
       << ", \"waiting_ranks\": " << json_ranks(waiting) << ", \"gone_ranks\": " << json_ranks(gone)
       << ", \"waited_s\": " << seconds(waited) << ", \"issued_at\": " << json_string(issued_at)
       << ", \"source\": " << json_string(subject.source) << ", \"cpu_at\": {";
  bool first_cpu = true;
  for (const auto& [rank, at] : cpu_at) {
    json << (first_cpu ? "" : ", ") << "\"" << rank << "\": " << json_string(at);
    first_cpu = false;
  }
  json << "}, \"stack\": " << json_string(stack.substr(0, kMaxReportedStack))
       << ", \"message\": " << json_string(message) << "}}";
  return {kind, message, json.str()};
}

}  // namespace gpuguard
