// explain's log reader: line ends of every kind, cut lines, context handed out once, any split of the bytes.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "gpuguard/log_scan.h"

using gpuguard::KeywordSearch;
using gpuguard::LogScanLimits;
using gpuguard::LogScanner;
using gpuguard::ScannedLine;

namespace {

// What `scanner` hands over when `log` is fed to it `piece` bytes at a time, then finished.
std::vector<ScannedLine> scan_in_pieces(LogScanner& scanner, const std::string& log, std::size_t piece) {
  std::vector<ScannedLine> out;
  for (std::size_t at = 0; at < log.size(); at += piece) {
    scanner.feed(std::string_view(log).substr(at, piece));
    for (auto& l : scanner.take()) out.push_back(l);
  }
  scanner.finish();
  for (auto& l : scanner.take()) out.push_back(l);
  return out;
}

std::vector<ScannedLine> scan(const std::string& log, std::size_t piece, LogScanLimits limits = {}) {
  LogScanner scanner({"Duplicate GPU detected", "invalid device ordinal"}, limits);
  return scan_in_pieces(scanner, log, piece);
}

std::string describe(const std::vector<ScannedLine>& lines) {
  std::string s;
  for (const auto& l : lines) s += std::to_string(l.number) + (l.hit ? "*" : " ") + l.text + "|";
  return s;
}

}  // namespace

TEST(KeywordSearch, FindsTheFirstOccurrenceOfAnyKeyword) {
  KeywordSearch search({"invalid device ordinal", "Duplicate GPU"});
  EXPECT_EQ(search.find("xx Duplicate GPU yy invalid device ordinal"), 3u);
  EXPECT_EQ(search.find("invalid device ordina"), std::string_view::npos);
  EXPECT_EQ(search.find(""), std::string_view::npos);
  EXPECT_THROW(KeywordSearch({"ab"}), std::invalid_argument);
}

TEST(LogScanner, EveryLineEndCountsOnceAndHitsComeWithTheirNeighbours) {
  const std::string log = "a\r\nb\rc\nDuplicate GPU detected : rank 1\r\nafter\nlast invalid device ordinal";
  for (std::size_t piece : {1u, 2u, 3u, 7u, 1000u}) {
    auto out = scan(log, piece);
    EXPECT_EQ(describe(out), "1 a|2 b|3 c|4*Duplicate GPU detected : rank 1|5 after|6*last invalid device ordinal|")
        << "piece " << piece;
  }
}

TEST(LogScanner, ContextIsCappedAndHandedOutOnce) {
  LogScanLimits limits;
  limits.context_lines = 2;
  limits.context_line_bytes = 3;
  auto out = scan("one\ntwo\nthree\ninvalid device ordinal\nfour\ninvalid device ordinal\n", 5, limits);
  EXPECT_EQ(describe(out), "2 two|3 thr|4*invalid device ordinal|5 four|6*invalid device ordinal|");
}

TEST(LogScanner, AnOverlongLineIsCutAndItsRestNeverKept) {
  LogScanLimits limits;
  limits.max_line_bytes = 30;
  std::string log = "invalid device ordinal" + std::string(1 << 20, 'x') + "\nnext\n";
  auto out = scan(log, 4096, limits);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].text, "invalid device ordinal" + std::string(8, 'x'));
  EXPECT_EQ(out[1].text, "next");
  // a keyword beyond the cut does not make a hit
  EXPECT_TRUE(scan(std::string(40, 'y') + "invalid device ordinal\n", 7, limits).empty());
}

TEST(KeywordSearch, GroupsNameTheBitsAKeywordSets) {
  // two fragments of one message in one group: a line holding either sets that group's bit only
  KeywordSearch search({"Duplicate GP", "PU detected", "invalid dev", "ice ordinal"}, {3, 3, 0, 0});
  EXPECT_EQ(search.present("Duplicate GPU detected"), 1ULL << 3);
  EXPECT_EQ(search.present("CUDA error: invalid device"), 1ULL << 0);
  EXPECT_EQ(search.present("ordinal ... PU detected"), 1ULL << 3);
  EXPECT_EQ(search.present("nothing"), 0u);
  EXPECT_THROW(KeywordSearch({"abcd", "efgh"}, {0}), std::invalid_argument);   // one group per keyword
  EXPECT_THROW(KeywordSearch({"abcd"}, {64}), std::invalid_argument);          // beyond the mask
  std::vector<std::string> many(65, "abcd");
  EXPECT_THROW(KeywordSearch{many}, std::invalid_argument);                     // 65 bits without groups
  EXPECT_NO_THROW(KeywordSearch(many, std::vector<std::uint8_t>(65, 1)));
}

TEST(LogScanner, LinesAfterAHitAreHandedOutUpToTheLimitEvenAcrossReads) {
  LogScanLimits limits;
  limits.context_lines = 1;
  limits.lines_after = 3;
  const std::string log = "a\nb\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA\ndevice\n1000\nc\nd\ne\n";
  for (std::size_t piece : {1u, 2u, 5u, 1000u}) {
    EXPECT_EQ(describe(scan(log, piece, limits)), "2 b|3*Duplicate GPU detected : rank 1 and rank 0 both on CUDA|"
                                                  "4 device|5 1000|6 c|")
        << "piece " << piece;
  }
  limits.lines_after = 0;
  EXPECT_EQ(describe(scan(log, 7, limits)), "2 b|3*Duplicate GPU detected : rank 1 and rank 0 both on CUDA|");
}

TEST(LineEndTest, AHeadAtALinesEndBlanksAsideIsFoundAndNothingElse) {
  gpuguard::LineEndTest test({"gpuguard_s", "NCCL DIA"}, {4, 9});
  auto at_end = [&](const std::string& line) { return test.at_end(line.data(), line.data() + line.size()); };
  EXPECT_EQ(at_end("[rank0]: {\"gpuguard_s"), 1ULL << 4);
  EXPECT_EQ(at_end("node042:12345 NCCL DIA \t\r"), 1ULL << 9);   // blanks and a '\r' after it
  EXPECT_EQ(at_end("NCCL DIAG"), 0u);                              // more than the head: the keyword is whole
  EXPECT_EQ(at_end("gpuguard_s in the middle"), 0u);
  EXPECT_EQ(at_end("s"), 0u);
  EXPECT_THROW(gpuguard::LineEndTest({"ab"}, {0}), std::invalid_argument);     // too short
  EXPECT_THROW(gpuguard::LineEndTest({"abc "}, {0}), std::invalid_argument);   // ends in a blank
  EXPECT_THROW(gpuguard::LineEndTest({"abc"}, {64}), std::invalid_argument);   // beyond the mask
}

TEST(LogScanner, ALineEndingWithAHeadIsAHitHoweverTheBytesArrive) {
  LogScanLimits limits;
  limits.context_lines = 0;
  limits.lines_after = 1;
  const std::string log = "ok\nRuntimeError: CUDA error: invalid dev\nice ordinal\nlast\n";
  for (std::size_t piece : {1u, 3u, 1000u}) {
    LogScanner scanner({"Duplicate GPU detected"}, limits, {}, gpuguard::LineEndTest({"invalid dev"}, {5}));
    std::vector<ScannedLine> out = scan_in_pieces(scanner, log, piece);
    EXPECT_EQ(describe(out), "2*RuntimeError: CUDA error: invalid dev|3 ice ordinal|") << "piece " << piece;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out[0].keywords, 1ULL << 5);
  }
}
