// libFuzzer target: explain's log reader (gpuguard/log_scan.h) on any bytes -- long lines, ANSI sequences, NULs,
// every line end -- must hand out the same lines however the bytes are split between reads, only lines it may
// hand out, in order, never more than it read. Built and run by scripts/fuzz.sh.
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
const std::vector<std::string> kKeywords = {"Duplicate GPU detected", "invalid device ordinal", "to be on the same",
                                            "watchdog got stuck", "WorkNCCL(", "\x1b[31mERR", "Ab\0cd"s};

std::vector<gpuguard::ScannedLine> run(std::string_view input, const gpuguard::LogScanLimits& limits,
                                       std::size_t piece) {
  gpuguard::LogScanner scanner(kKeywords, limits);
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
    std::uint64_t mask = 0;
    for (std::size_t k = 0; k < kKeywords.size(); ++k)
      if (a.hit && a.text.find(kKeywords[k]) != std::string::npos) mask |= 1ULL << k;
    if (a.keywords != mask) std::abort();  // a hit names exactly the keywords it holds
    if (a.number <= last) std::abort();  // in order, each line once
    last = a.number;
    if (a.text.size() > limits.max_line_bytes) std::abort();
    if (a.text.find_first_of("\r\n") != std::string::npos) std::abort();
    bool holds = false;
    for (const auto& k : kKeywords) holds = holds || a.text.find(k) != std::string::npos;
    if (a.hit != holds && a.hit) std::abort();  // a hit holds a keyword in its kept head
    if (!a.hit && holds && a.text.size() < limits.max_line_bytes) std::abort();  // a whole line with one is a hit
    handed += a.text.size();
  }
  if (handed > log.size()) std::abort();
  return 0;
}
