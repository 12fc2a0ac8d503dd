// libFuzzer target: explain's log reader (gpuguard/log_scan.h) on any bytes -- long lines, ANSI sequences, NULs,
// every line end, pasted logs (scripts/fuzz.sh seeds it with tests/python/paste_corpus.py's shapes) -- must hand
// out the same lines however the bytes are split between reads, only lines it may hand out, in order, never more
// than it read; a hit holds a keyword or ends with a line-end head, and names exactly their groups.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/log_scan.h"

namespace {

// Keywords of the shape explain registers (tests/fuzz/log_scan.dict holds these and more for the mutator).
using namespace std::string_literals;
// Pieces of keywords as explain registers them (the first and last 11 bytes, each in its recogniser's group) and
// heads of short keywords it looks for at line ends.
const std::vector<std::string> kKeywords = {"Duplicate G", "GPU detected", "invalid dev", "ice ordinal",
                                            "to be on the", "watchdog got stuck", "WorkNCCL(", "\x1b[31mERR", "Ab\0cd"s};
const std::vector<std::uint8_t> kGroups = {0, 0, 1, 1, 2, 3, 4, 5, 6};
const std::vector<std::string> kHeads = {"gpuguard_s", "NCCL DIA", "(local", "Dupl"};
const std::vector<std::uint8_t> kHeadGroups = {7, 8, 9, 0};

std::uint64_t expected_groups(const std::string& text, bool whole) {
  std::uint64_t mask = 0;
  for (std::size_t k = 0; k < kKeywords.size(); ++k)
    if (text.find(kKeywords[k]) != std::string::npos) mask |= 1ULL << kGroups[k];
  if (whole) {
    std::size_t end = text.size();
    for (int blanks = 0; end > 0 && blanks < 16 && (text[end - 1] == ' ' || text[end - 1] == '\t' ||
                                                    text[end - 1] == '\r'); ++blanks)
      --end;
    for (std::size_t h = 0; h < kHeads.size(); ++h)
      if (end >= kHeads[h].size() && text.compare(end - kHeads[h].size(), kHeads[h].size(), kHeads[h]) == 0)
        mask |= 1ULL << kHeadGroups[h];
  }
  return mask;
}

std::vector<gpuguard::ScannedLine> run(std::string_view input, const gpuguard::LogScanLimits& limits,
                                       std::size_t piece) {
  gpuguard::LogScanner scanner(kKeywords, limits, kGroups, gpuguard::LineEndTest(kHeads, kHeadGroups));
  std::vector<gpuguard::ScannedLine> out;
  for (std::size_t at = 0; at < input.size(); at += piece) {
    scanner.feed(input.substr(at, piece));
    for (auto& l : scanner.take()) out.push_back(std::move(l));
  }
  scanner.finish();
  for (auto& l : scanner.take()) out.push_back(std::move(l));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  // The first bytes choose the limits and the split; the rest is the log.
  gpuguard::LogScanLimits limits;
  limits.max_line_bytes = 8 + data[0] % 64;
  limits.context_lines = data[1] % 5;
  limits.context_line_bytes = 1 + data[1] / 5 % 40;
  limits.lines_after = data[2] / 17 % 6;
  const std::size_t piece = 1 + data[2] % 17;
  std::string_view log(reinterpret_cast<const char*>(data) + 3, size - 3);

  auto whole = run(log, limits, log.empty() ? 1 : log.size());
  auto pieces = run(log, limits, piece);
  if (whole.size() != pieces.size()) std::abort();
  std::size_t handed = 0;
  std::uint64_t last = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const auto& a = whole[i];
    const auto& b = pieces[i];
    if (a.number != b.number || a.hit != b.hit || a.text != b.text || a.keywords != b.keywords) std::abort();
    if (a.number <= last) std::abort();  // in order, each line once
    last = a.number;
    if (a.text.size() > limits.max_line_bytes) std::abort();
    if (a.text.find_first_of("\r\n") != std::string::npos) std::abort();
    // a hit names exactly the groups of what it holds (a head at its end only when the whole line was kept)
    const std::uint64_t mask = expected_groups(a.text, a.text.size() < limits.max_line_bytes);
    if (a.hit && a.keywords != mask) std::abort();
    if (a.hit && mask == 0) std::abort();  // a hit holds a keyword or ends with a head
    if (!a.hit && mask != 0 && a.text.size() < limits.max_line_bytes && a.text.size() < limits.context_line_bytes)
      std::abort();  // a whole line with one is a hit (context lines are cut shorter: theirs may hide it)
    handed += a.text.size();
  }
  if (handed > log.size()) std::abort();
  return 0;
}
