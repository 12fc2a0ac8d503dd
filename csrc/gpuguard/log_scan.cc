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

}  // namespace

KeywordSearch::KeywordSearch(std::vector<std::string> keywords) : keywords_(std::move(keywords)) {
  if (keywords_.empty()) throw std::invalid_argument("log scanner: no keywords");
  if (keywords_.size() > std::numeric_limits<std::uint16_t>::max())
    throw std::invalid_argument("log scanner: too many keywords");
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
  ends_.assign(1u << 16, {});
  for (std::size_t k = 0; k < keywords_.size(); ++k) {
    const char* head = keywords_[k].data();
    for (std::size_t j = 1; j < window_; ++j) {
      unsigned pair = pair_at(head + j - 1);
      shift_[pair] = std::min<std::uint8_t>(shift_[pair], static_cast<std::uint8_t>(window_ - 1 - j));
    }
    ends_[pair_at(head + window_ - 2)].push_back(static_cast<std::uint16_t>(k));
  }
}

std::size_t KeywordSearch::find(std::string_view text) const {
  const std::size_t n = text.size();
  const std::size_t m = window_;
  if (n < m) return std::string_view::npos;
  const char* d = text.data();
  std::size_t end = m - 1;  // index of the window's last byte
  while (end < n) {
    unsigned pair = pair_at(d + end - 1);
    std::uint8_t s = shift_[pair];
    if (s != 0) {
      end += s;
      continue;
    }
    std::size_t start = end + 1 - m;
    for (std::uint16_t k : ends_[pair]) {
      const std::string& kw = keywords_[k];
      if (start + kw.size() <= n && std::memcmp(d + start, kw.data(), kw.size()) == 0) return start;
    }
    ++end;
  }
  return std::string_view::npos;
}

LogScanner::LogScanner(std::vector<std::string> keywords, LogScanLimits limits)
    : search_(std::move(keywords)), limits_(limits) {
  if (limits_.max_line_bytes == 0 || limits_.context_line_bytes == 0)
    throw std::invalid_argument("log scanner: line limits must be positive");
  recent_.resize(limits_.context_lines);
}

void LogScanner::emit(std::uint64_t number, bool hit, std::string_view text) {
  out_.push_back(ScannedLine{number, hit, std::string(text)});
  emitted_through_ = number;
}

void LogScanner::line(std::string_view text) {
  const std::uint64_t number = ++lines_;
  const bool hit = search_.find(text) != std::string_view::npos;
  if (hit) {
    ++hits_;
    // The lines before it that were not handed out yet, oldest first.
    for (std::size_t i = 0; i < recent_.size(); ++i) {
      const Recent& r = recent_[(recent_next_ + i) % recent_.size()];
      if (r.number > emitted_through_ && r.number < number) emit(r.number, false, r.view);
    }
    emit(number, true, text);
    emit_next_ = true;
  } else if (emit_next_) {
    emit(number, false, text);
    emit_next_ = false;
  }
  if (!recent_.empty()) {
    Recent& slot = recent_[recent_next_];
    recent_next_ = (recent_next_ + 1) % recent_.size();
    slot.number = number;
    slot.owned.clear();
    slot.view = text.substr(0, limits_.context_line_bytes);
  }
}

void LogScanner::keep_recent_beyond_feed() {
  for (Recent& r : recent_) {
    if (r.view.data() != r.owned.data()) {
      r.owned.assign(r.view);
      r.view = r.owned;
    }
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
  std::size_t nl = next_of(d, i, n, '\n');
  std::size_t cr = next_of(d, i, n, '\r');
  while (i < n) {
    if (nl < i) nl = next_of(d, i, n, '\n');
    if (cr < i) cr = next_of(d, i, n, '\r');
    const std::size_t e = std::min(nl, cr);
    const std::size_t room = limits_.max_line_bytes - std::min(partial_.size(), limits_.max_line_bytes);
    if (e == n) {  // no line end in what is left: keep the line's head, skip the rest
      partial_.append(d + i, std::min(n - i, room));
      partial_open_ = true;
      break;
    }
    if (partial_open_) {
      partial_.append(d + i, std::min(e - i, room));
      line(partial_);
      // the ring must not point into partial_, which the next line reuses
      if (!recent_.empty()) {
        Recent& last = recent_[(recent_next_ + recent_.size() - 1) % recent_.size()];
        last.owned.assign(last.view);
        last.view = last.owned;
      }
      partial_.clear();
      partial_open_ = false;
    } else {
      line(std::string_view(d + i, std::min(e - i, limits_.max_line_bytes)));
    }
    i = e + 1;
    if (d[e] == '\r') {
      if (i < n) {
        if (d[i] == '\n') ++i;
      } else {
        after_cr_ = true;
      }
    }
  }
  keep_recent_beyond_feed();
}

void LogScanner::finish() {
  if (partial_open_) {
    line(partial_);
    keep_recent_beyond_feed();
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
