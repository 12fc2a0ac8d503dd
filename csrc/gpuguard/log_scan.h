// The log reader under `gpuguard explain`: splits a byte stream into lines and keeps only the few that matter.
//
// A log of a large job is gigabytes, nearly all of it lines no recogniser wants. LogScanner reads the bytes as
// they come (any chunking), ends lines at '\n', '\r\n' or a lone '\r' (as a terminal does), cuts every line at
// max_line_bytes (the rest of an overlong line is skipped without being kept), and tests each line for the
// recognisers' keywords with one multi-keyword search (Wu-Manber over byte pairs: every byte is looked at a
// bounded number of times, so the whole scan is linear in the input). It hands out only
//   - the lines that hold a keyword ("hits"),
//   - the lines_after lines right after each hit (a message a terminal or viewer wrapped continues there),
//   - the up to context_lines lines before each hit (the traceback that led to it),
// each at most once and in input order, so what it hands out never exceeds what it read. Memory is bounded by
// the limits, whatever the size or shape of the input: no Python, no torch, only the standard library.
//
// A keyword a paste broke across two lines is found too: the caller searches pieces of its keywords (their first
// and last bytes), and a line that ends with the head of a short keyword (LineEndTest; its tail starts the next
// line) counts as a hit. The line ends are found with the same eight-bytes-at-a-time test that counts them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpuguard {

struct LogScanLimits {
  std::size_t max_line_bytes = 16 * 1024;   // longer lines are cut; their rest is skipped
  std::size_t context_lines = 64;           // lines before a hit handed out with it
  std::size_t context_line_bytes = 1024;    // each such line cut here
  std::size_t lines_after = 1;              // lines after a hit handed out with it (the pieces of a wrapped message)
};

// One line handed out: its 1-based number in the input, whether it holds a keyword, its bytes (cut), and the groups
// of the keywords it holds (bit g: a keyword of group g; by default each keyword is its own group), so that Python
// offers it only to the recognisers those keywords belong to.
struct ScannedLine {
  std::uint64_t number = 0;
  bool hit = false;
  std::string text;
  std::uint64_t keywords = 0;
};

// The multi-keyword search, on its own: the first keyword occurrence in a text, in time linear in the text.
class KeywordSearch {
 public:
  // Keywords are byte strings of at least kMinKeywordBytes (shorter ones make the skip useless), at most
  // kMaxKeywords of them. groups[i] (below kMaxGroups) is the bit keyword i sets in present(); without groups,
  // keyword i sets bit i (then at most kMaxGroups keywords).
  static constexpr std::size_t kMinKeywordBytes = 4;
  static constexpr std::size_t kMaxKeywords = 4096;
  static constexpr std::size_t kMaxGroups = 64;      // one bit each in ScannedLine::keywords
  explicit KeywordSearch(std::vector<std::string> keywords, std::vector<std::uint8_t> groups = {});
  // Offset of the first occurrence of any keyword, or npos.
  std::size_t find(std::string_view text) const;
  // The groups of the keywords that occur in text (bit g: group g), in one pass.
  std::uint64_t present(std::string_view text) const;
  const std::vector<std::string>& keywords() const { return keywords_; }
  const std::vector<std::uint8_t>& groups() const { return groups_; }

 private:
  // Calls on_hit(start, keyword index) for each keyword occurrence, left to right, until it returns true.
  template <class OnHit>
  void for_each_hit(std::string_view text, OnHit&& on_hit) const;
  std::vector<std::string> keywords_;
  std::vector<std::uint8_t> groups_;                // the bit of each keyword
  std::size_t window_ = 0;                          // the shortest keyword's length
  std::vector<std::uint8_t> shift_;                 // per byte pair: how far the window may move
  std::vector<std::uint16_t> ends_slot_;           // per byte pair: 1 + its index in ends_, 0 if it ends no window
  std::vector<std::vector<std::uint16_t>> ends_;    // the keywords to verify where a window ends in that pair
};

// The heads of keywords at the end of a line (blanks and '\r' after them aside): a line ending with one holds the
// start of a keyword a break cut, whose rest begins the next line.
class LineEndTest {
 public:
  static constexpr std::size_t kMinHeadBytes = 3;   // shorter heads end too many ordinary lines
  LineEndTest() = default;
  // Throws std::invalid_argument for a head shorter than kMinHeadBytes or holding a line end, a group out of range.
  LineEndTest(std::vector<std::string> heads, std::vector<std::uint8_t> groups);
  bool empty() const { return heads_.empty(); }
  // The groups of the heads the line [begin, end) ends with; 0 when none.
  std::uint64_t at_end(const char* begin, const char* end) const;
  // Whether the line [begin, end) may end with a head: false for nearly every line, at the cost of a table look-up.
  bool may_end_with_head(const char* begin, const char* end) const {
    if (end - begin < 2) return false;
    const unsigned char last = static_cast<unsigned char>(end[-1]);
    if (last == ' ' || last == '\t' || last == '\r') return true;  // blanks after a head: the full test
    const unsigned pair = (static_cast<unsigned>(static_cast<unsigned char>(end[-2])) << 8) | last;
    return last_pairs_[pair >> 6] >> (pair & 63) & 1;
  }

 private:
  std::vector<std::string> heads_;
  std::vector<std::uint8_t> groups_;
  std::vector<std::uint64_t> last_pairs_;                          // one bit per byte pair some head ends with
  std::vector<std::pair<std::uint16_t, std::uint16_t>> by_pair_;  // (last pair, head index), sorted
};

class Region;   // the whole lines of one read, in log_scan.cc

class LogScanner {
 public:
  // Throws std::invalid_argument for a keyword that is too short, a group out of range or a zero limit.
  LogScanner(std::vector<std::string> keywords, LogScanLimits limits = {}, std::vector<std::uint8_t> groups = {},
             LineEndTest line_ends = {});

  // Reads the next bytes of the stream; lines it completes are judged at once.
  void feed(std::string_view bytes);
  // The stream ended: a last line without a terminator is judged too.
  void finish();
  // The lines handed out since the last take(), in input order.
  std::vector<ScannedLine> take();

  std::uint64_t lines() const { return lines_; }
  std::uint64_t hits() const { return hits_; }
  const LogScanLimits& limits() const { return limits_; }

 private:
  struct Recent {                 // one of the last context_lines lines, for context before a hit
    std::uint64_t number = 0;
    std::string text;             // cut at context_line_bytes
  };

  void line(std::string_view text);   // one complete line, already cut at max_line_bytes
  void region(const char* data, std::size_t size);   // whole lines, judged with one search across them
  // Hands out the hit [start, end) of the region being read (line `number`), its context, and what follows.
  void hit_in_region(Region& r, const char* data, std::uint64_t number, std::size_t start, std::size_t end,
                     std::uint64_t groups);
  void remember(std::uint64_t number, std::string_view text);
  // Hands out the lines before hit `number` not handed out yet: `here` (newest first), then older remembered.
  void context_before(std::uint64_t number, std::vector<std::pair<std::uint64_t, std::string_view>> here);
  void emit(std::uint64_t number, bool hit, std::string_view text);
  void emit_hit(std::uint64_t number, std::string_view text, std::uint64_t groups);
  // The groups a line ends with the head of (none for a line cut at max_line_bytes: its end is not seen).
  std::uint64_t ends_with_head(std::string_view text, bool whole) const;

  KeywordSearch search_;
  LineEndTest line_ends_;
  LogScanLimits limits_;
  std::uint64_t lines_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t emitted_through_ = 0;   // the last line number handed out
  std::size_t after_left_ = 0;          // lines still to hand out after the last hit
  std::string partial_;                 // head of a line still waiting for its end (cut at max_line_bytes)
  bool partial_open_ = false;
  bool after_cr_ = false;               // the last byte fed was a '\r': a '\n' next belongs to it
  std::deque<Recent> recent_;           // the last context_lines lines before the current read
  std::vector<ScannedLine> out_;
};

}  // namespace gpuguard
