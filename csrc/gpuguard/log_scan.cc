// The log reader under `gpuguard explain`: line splitting, the keyword pre-filter and context, in linear time.
#include "gpuguard/log_scan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace gpuguard {

namespace {

// Wu-Manber looks at the byte pair ending each window; a window longer than this gains nothing more.
constexpr std::size_t kMaxWindow = 200;

unsigned pair_at(const char* p) {
  return (static_cast<unsigned>(static_cast<unsigned char>(p[0])) << 8) | static_cast<unsigned char>(p[1]);
}

std::size_t next_of(const char* data, std::size_t from, std::size_t size, char c) {
  const void* found = from < size ? std::memchr(data + from, c, size - from) : nullptr;
  return found ? static_cast<std::size_t>(static_cast<const char*>(found) - data) : size;
}

// How many bytes in [p, p + size) equal c: eight at a time (exact zero-byte count of the XOR), the rest one by one.
std::uint64_t count_byte(const char* p, std::size_t size, char c) {
  constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
  const std::uint64_t pattern = 0x0101010101010101ULL * static_cast<unsigned char>(c);
  std::uint64_t count = 0;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, p + i, 8);
    const std::uint64_t x = word ^ pattern;                  // a zero byte where p[i..] == c
    const std::uint64_t zero = ~(((x & kLow7) + kLow7) | x | kLow7);  // its high bit set exactly there
    count += ((zero >> 7) * 0x0101010101010101ULL) >> 56;  // sum of the eight 0/1 bytes
  }
  for (; i < size; ++i) count += p[i] == c;
  return count;
}

}  // namespace

KeywordSearch::KeywordSearch(std::vector<std::string> keywords, std::vector<std::uint8_t> groups)
    : keywords_(std::move(keywords)), groups_(std::move(groups)) {
  if (keywords_.empty()) throw std::invalid_argument("log scanner: no keywords");
  if (groups_.empty()) {
    if (keywords_.size() > kMaxGroups)
      throw std::invalid_argument("log scanner: more than " + std::to_string(kMaxGroups) +
                                  " keywords without groups");
    for (std::size_t i = 0; i < keywords_.size(); ++i) groups_.push_back(static_cast<std::uint8_t>(i));
  }
  if (keywords_.size() > kMaxKeywords)
    throw std::invalid_argument("log scanner: more than " + std::to_string(kMaxKeywords) + " keywords");
  if (groups_.size() != keywords_.size())
    throw std::invalid_argument("log scanner: one group per keyword is needed");
  for (std::uint8_t g : groups_)
    if (g >= kMaxGroups)
      throw std::invalid_argument("log scanner: a group must be below " + std::to_string(kMaxGroups));
  window_ = kMaxWindow;
  for (const auto& k : keywords_) {
    if (k.size() < kMinKeywordBytes)
      throw std::invalid_argument("log scanner: keyword '" + k + "' is shorter than " +
                                  std::to_string(kMinKeywordBytes) + " bytes");
    window_ = std::min(window_, k.size());
  }
  // Every window's last byte pair says how far the window can move without skipping a keyword's start: the
  // distance from that pair's last place in any keyword's first window_ bytes to the window's end.
  shift_.assign(1u << 16, static_cast<std::uint8_t>(window_ - 1));
  ends_slot_.assign(1u << 16, 0);
  for (std::size_t k = 0; k < keywords_.size(); ++k) {
    const char* head = keywords_[k].data();
    for (std::size_t j = 1; j < window_; ++j) {
      unsigned pair = pair_at(head + j - 1);
      shift_[pair] = std::min<std::uint8_t>(shift_[pair], static_cast<std::uint8_t>(window_ - 1 - j));
    }
    std::uint16_t& slot = ends_slot_[pair_at(head + window_ - 2)];
    if (slot == 0) {
      ends_.emplace_back();
      slot = static_cast<std::uint16_t>(ends_.size());
    }
    ends_[slot - 1].push_back(static_cast<std::uint16_t>(k));
  }
}

template <class OnHit>
void KeywordSearch::for_each_hit(std::string_view text, OnHit&& on_hit) const {
  const std::size_t n = text.size();
  const std::size_t m = window_;
  if (n < m) return;
  const char* d = text.data();
  for (std::size_t end = m - 1; end < n;) {  // end: index of the window's last byte
    unsigned pair = pair_at(d + end - 1);
    std::uint8_t s = shift_[pair];
    if (s != 0) {
      end += s;
      continue;
    }
    std::size_t start = end + 1 - m;
    for (std::uint16_t k : ends_[ends_slot_[pair] - 1]) {
      const std::string& kw = keywords_[k];
      if (start + kw.size() <= n && std::memcmp(d + start, kw.data(), kw.size()) == 0 && on_hit(start, k)) return;
    }
    ++end;
  }
}

std::size_t KeywordSearch::find(std::string_view text) const {
  std::size_t first = std::string_view::npos;
  for_each_hit(text, [&](std::size_t start, std::uint16_t) {
    first = start;
    return true;
  });
  return first;
}

std::uint64_t KeywordSearch::present(std::string_view text) const {
  std::uint64_t found = 0;
  for_each_hit(text, [&](std::size_t, std::uint16_t k) {
    found |= 1ULL << groups_[k];
    return false;
  });
  return found;
}

LineEndTest::LineEndTest(std::vector<std::string> heads, std::vector<std::uint8_t> groups)
    : heads_(std::move(heads)), groups_(std::move(groups)), last_pairs_(1u << 10, 0) {
  if (groups_.size() != heads_.size()) throw std::invalid_argument("log scanner: one group per line-end head is needed");
  if (heads_.size() > KeywordSearch::kMaxKeywords)
    throw std::invalid_argument("log scanner: more than " + std::to_string(KeywordSearch::kMaxKeywords) + " heads");
  for (std::size_t i = 0; i < heads_.size(); ++i) {
    const std::string& h = heads_[i];
    if (h.size() < kMinHeadBytes || h.find_first_of("\r\n") != std::string::npos || h.back() == ' ' ||
        h.back() == '\t')
      throw std::invalid_argument("log scanner: line-end head '" + h + "' is shorter than " +
                                  std::to_string(kMinHeadBytes) + " bytes, ends in a blank or holds a line end");
    if (groups_[i] >= KeywordSearch::kMaxGroups)
      throw std::invalid_argument("log scanner: a group must be below " + std::to_string(KeywordSearch::kMaxGroups));
    const unsigned pair = pair_at(h.data() + h.size() - 2);
    last_pairs_[pair >> 6] |= 1ULL << (pair & 63);
    by_pair_.emplace_back(static_cast<std::uint16_t>(pair), static_cast<std::uint16_t>(i));
  }
  std::sort(by_pair_.begin(), by_pair_.end());
}

std::uint64_t LineEndTest::at_end(const char* begin, const char* end) const {
  if (heads_.empty()) return 0;
  for (int blanks = 0; end > begin && blanks < 16 && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r');
       ++blanks)
    --end;
  if (end - begin < static_cast<std::ptrdiff_t>(kMinHeadBytes)) return 0;
  const unsigned pair = pair_at(end - 2);
  if (!(last_pairs_[pair >> 6] >> (pair & 63) & 1)) return 0;
  std::uint64_t found = 0;
  auto it = std::lower_bound(by_pair_.begin(), by_pair_.end(), std::make_pair(static_cast<std::uint16_t>(pair),
                                                                              std::uint16_t{0}));
  for (; it != by_pair_.end() && it->first == pair; ++it) {
    const std::string& h = heads_[it->second];
    if (static_cast<std::size_t>(end - begin) >= h.size() && std::memcmp(end - h.size(), h.data(), h.size()) == 0)
      found |= 1ULL << groups_[it->second];
  }
  return found;
}

LogScanner::LogScanner(std::vector<std::string> keywords, LogScanLimits limits, std::vector<std::uint8_t> groups,
                       LineEndTest line_ends)
    : search_(std::move(keywords), std::move(groups)), line_ends_(std::move(line_ends)), limits_(limits) {
  if (limits_.max_line_bytes == 0 || limits_.context_line_bytes == 0)
    throw std::invalid_argument("log scanner: line limits must be positive");
  for (const auto& k : search_.keywords())
    if (k.find_first_of("\r\n") != std::string::npos)
      throw std::invalid_argument("log scanner: a keyword cannot hold a line end");
}

// Line ends inside one region of bytes [0, size) that ends right after a line end: '\n', "\r\n" or a lone '\r'.
class Region {
 public:
  Region(const char* d, std::size_t size) : d_(d), size_(size) {
    has_cr_ = std::memchr(d, '\r', size) != nullptr;
  }
  // The first line end at or after `from` (size_ when none).
  std::size_t end_of_line(std::size_t from) {
    if (!known_ || nl_ < from) nl_ = next_of(d_, from, size_, '\n');
    if (has_cr_ && (!known_ || cr_ < from)) cr_ = next_of(d_, from, size_, '\r');
    known_ = true;
    if (!has_cr_) return nl_;
    return std::min(nl_, cr_);
  }
  // Where the line after the one ending at `end` starts.
  std::size_t after(std::size_t end) const {
    return (d_[end] == '\r' && end + 1 < size_ && d_[end + 1] == '\n') ? end + 2 : end + 1;
  }
  // Where the line holding `at` starts, looking back no further than `floor`.
  std::size_t start_of_line(std::size_t floor, std::size_t at) const {
    std::size_t start = floor;
    if (at > floor) {
      if (const void* p = memrchr(d_ + floor, '\n', at - floor))
        start = static_cast<std::size_t>(static_cast<const char*>(p) - d_) + 1;
      if (has_cr_)
        if (const void* p = memrchr(d_ + start, '\r', at - start))
          start = static_cast<std::size_t>(static_cast<const char*>(p) - d_) + 1;
    }
    return start;
  }
  // How many lines end in [from, to).
  std::uint64_t lines_ending(std::size_t from, std::size_t to) const {
    std::uint64_t count = count_byte(d_ + from, to - from, '\n');
    if (has_cr_)
      for (std::size_t i = from; i < to; ++i)
        if (d_[i] == '\r' && !(i + 1 < size_ && d_[i + 1] == '\n')) ++count;
    return count;
  }
  // The first line among those ending in [from, to) (from: a line start) whose end `test` takes, shorter than
  // `longest`: the index of its line end, its groups in *groups and the lines ending before it in *before; `to`
  // when there is none (*before then counts them all).
  std::size_t first_line_end_hit(std::size_t from, std::size_t to, const LineEndTest& test, std::size_t longest,
                                 std::uint64_t* before, std::uint64_t* groups) {
    std::uint64_t count = 0;
    std::size_t line_start = from;
    if (!has_cr_) {  // every line ends at a '\n'
      while (line_start < to) {
        const void* nl = std::memchr(d_ + line_start, '\n', to - line_start);
        if (nl == nullptr) break;
        const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(nl) - d_);
        if (at - line_start < longest && test.may_end_with_head(d_ + line_start, d_ + at)) {
          if (std::uint64_t g = test.at_end(d_ + line_start, d_ + at)) {
            *groups = g;
            *before = count;
            return at;
          }
        }
        ++count;
        line_start = at + 1;
      }
      *before = count;
      return to;
    }
    while (line_start < to) {
      const std::size_t end = end_of_line(line_start);
      if (end >= to) break;
      if (end - line_start < longest) {
        if (std::uint64_t g = test.at_end(d_ + line_start, d_ + end)) {
          *groups = g;
          *before = count;
          return end;
        }
      }
      ++count;
      line_start = after(end);
    }
    *before = count;
    return to;
  }
  // The line that ends just before `next_start` (a line start > floor): its [start, end).
  std::pair<std::size_t, std::size_t> line_before(std::size_t floor, std::size_t next_start) const {
    std::size_t end = next_start - 1;
    if (d_[end] == '\n' && end > floor && d_[end - 1] == '\r') --end;
    return {start_of_line(floor, end), end};
  }

 private:
  const char* d_;
  std::size_t size_;
  bool has_cr_ = false;
  std::size_t nl_ = 0, cr_ = 0;   // the next '\n' and '\r' found so far, once known_
  bool known_ = false;
};


void LogScanner::emit(std::uint64_t number, bool hit, std::string_view text) {
  out_.push_back(ScannedLine{number, hit, std::string(text), 0});
  emitted_through_ = number;
}

void LogScanner::emit_hit(std::uint64_t number, std::string_view text, std::uint64_t groups) {
  out_.push_back(ScannedLine{number, true, std::string(text), search_.present(text) | groups});
  emitted_through_ = number;
}

std::uint64_t LogScanner::ends_with_head(std::string_view text, bool whole) const {
  return whole ? line_ends_.at_end(text.data(), text.data() + text.size()) : 0;
}

void LogScanner::remember(std::uint64_t number, std::string_view text) {
  if (limits_.context_lines == 0) return;
  if (recent_.size() == limits_.context_lines) recent_.pop_front();
  recent_.push_back(Recent{number, std::string(text.substr(0, limits_.context_line_bytes))});
}

void LogScanner::context_before(std::uint64_t number, std::vector<std::pair<std::uint64_t, std::string_view>> here) {
  // `here`: lines of the current region before the hit, newest first; older ones come from `recent_`.
  std::size_t wanted = limits_.context_lines;
  std::vector<std::pair<std::uint64_t, std::string_view>> lines;
  for (auto& l : here) {
    if (lines.size() == wanted || l.first <= emitted_through_) break;
    lines.push_back(l);
  }
  // remembered lines continue `lines` only if their numbers follow on without a gap
  std::uint64_t expected = (lines.empty() ? number : lines.back().first) - 1;
  for (auto it = recent_.rbegin(); it != recent_.rend() && lines.size() < wanted && expected > emitted_through_;
       ++it) {
    if (it->number > expected) continue;
    if (it->number != expected) break;
    lines.emplace_back(it->number, it->text);
    --expected;
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) emit(it->first, false, it->second);
}

void LogScanner::line(std::string_view text) {
  const std::uint64_t number = ++lines_;
  // a line as long as the cut may have been cut: its end is not the line's
  const std::uint64_t head_groups = ends_with_head(text, text.size() < limits_.max_line_bytes);
  const bool hit = head_groups != 0 || search_.find(text) != std::string_view::npos;
  if (hit) {
    ++hits_;
    context_before(number, {});
    emit_hit(number, text, head_groups);
    after_left_ = limits_.lines_after;
  } else if (after_left_ > 0) {
    emit(number, false, text);
    --after_left_;
  }
  remember(number, text);
}

void LogScanner::hit_in_region(Region& r, const char* d, std::uint64_t number, std::size_t start, std::size_t end,
                               std::uint64_t groups) {
  const std::size_t cut = limits_.max_line_bytes;
  std::vector<std::pair<std::uint64_t, std::string_view>> before;
  std::size_t next_start = start;
  for (std::uint64_t k = 1; k <= limits_.context_lines && next_start > 0 && number - k > emitted_through_; ++k) {
    auto [s, e] = r.line_before(0, next_start);
    before.emplace_back(number - k, std::string_view(d + s, std::min({e - s, cut, limits_.context_line_bytes})));
    next_start = s;
  }
  lines_ = number;
  ++hits_;
  context_before(number, std::move(before));
  emit_hit(number, std::string_view(d + start, std::min(end - start, cut)), groups);
  after_left_ = limits_.lines_after;
}

void LogScanner::region(const char* d, std::size_t size) {
  Region r(d, size);
  const std::size_t cut = limits_.max_line_bytes;
  std::size_t pos = 0;
  while (pos < size) {
    if (after_left_ > 0) {  // the lines right after a hit are handed out whatever they hold
      std::size_t end = r.end_of_line(pos);
      line(std::string_view(d + pos, std::min(end - pos, cut)));
      pos = r.after(end);
      continue;
    }
    std::size_t found = search_.find(std::string_view(d + pos, size - pos));
    const std::size_t keyword_line = found == std::string_view::npos ? size : r.start_of_line(pos, found + pos);
    if (!line_ends_.empty()) {  // a line before it that ends with a keyword's head is a hit first
      std::uint64_t before = 0, groups = 0;
      const std::size_t end = r.first_line_end_hit(pos, keyword_line, line_ends_, cut, &before, &groups);
      if (end < keyword_line) {
        const std::size_t start = r.start_of_line(pos, end);
        hit_in_region(r, d, lines_ + before + 1, start, end, groups);
        pos = r.after(end);
        continue;
      }
      if (found == std::string_view::npos) {
        lines_ += before;
        break;
      }
    }
    if (found == std::string_view::npos) {
      lines_ += r.lines_ending(pos, size);
      break;
    }
    found += pos;
    const std::size_t start = keyword_line;
    const std::size_t end = r.end_of_line(found);
    const std::uint64_t number = lines_ + r.lines_ending(pos, start) + 1;
    const std::string_view text(d + start, std::min(end - start, cut));
    // a keyword past the cut does not count: the line is judged on its first max_line_bytes
    if (found >= start + cut || search_.find(text) == std::string_view::npos) {
      lines_ = number;
      pos = r.after(end);
      continue;
    }
    hit_in_region(r, d, number, start, end, ends_with_head(text, end - start < cut));
    pos = r.after(end);
  }
  // The region's last lines are the context of a hit early in the next one.
  std::vector<std::pair<std::uint64_t, std::string_view>> last;
  std::size_t next_start = size;
  for (std::uint64_t k = 0; k < limits_.context_lines && next_start > 0 && lines_ > k; ++k) {
    auto [s, e] = r.line_before(0, next_start);
    last.emplace_back(lines_ - k, std::string_view(d + s, std::min(e - s, cut)));
    next_start = s;
  }
  for (auto it = last.rbegin(); it != last.rend(); ++it) {
    if (!recent_.empty() && recent_.back().number >= it->first) continue;
    remember(it->first, it->second);
  }
}

void LogScanner::feed(std::string_view bytes) {
  const char* d = bytes.data();
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  if (after_cr_ && n > 0) {
    after_cr_ = false;
    if (d[0] == '\n') i = 1;  // "\r\n" split between two reads is one line end
  }
  if (i == n) return;
  // The last line end in these bytes: everything before it is whole lines.
  std::size_t last = n;
  if (const void* p = memrchr(d + i, '\n', n - i)) last = static_cast<std::size_t>(static_cast<const char*>(p) - d);
  const std::size_t cr_from = last == n ? i : last;
  if (const void* p = memrchr(d + cr_from, '\r', n - cr_from))
    last = static_cast<std::size_t>(static_cast<const char*>(p) - d);
  const std::size_t room = limits_.max_line_bytes - std::min(partial_.size(), limits_.max_line_bytes);
  if (last == n) {  // no line end: the head of a line still open
    partial_.append(d + i, std::min(n - i, room));
    partial_open_ = true;
    return;
  }
  std::size_t whole_end = last + 1;  // one past the last line end
  if (d[last] == '\r' && last + 1 == n) after_cr_ = true;
  if (partial_open_) {  // the line begun in an earlier read ends here
    Region r(d + i, whole_end - i);
    std::size_t end = i + r.end_of_line(0);
    partial_.append(d + i, std::min(end - i, room));
    line(partial_);
    partial_.clear();
    partial_open_ = false;
    i += r.after(end - i);
  }
  if (i < whole_end) region(d + i, whole_end - i);
  if (whole_end < n) {
    partial_.assign(d + whole_end, std::min(n - whole_end, limits_.max_line_bytes));
    partial_open_ = true;
  }
}

void LogScanner::finish() {
  if (partial_open_) {
    line(partial_);
    partial_.clear();
    partial_open_ = false;
  }
  after_cr_ = false;
}

std::vector<ScannedLine> LogScanner::take() {
  std::vector<ScannedLine> out;
  out.swap(out_);
  return out;
}

}  // namespace gpuguard
