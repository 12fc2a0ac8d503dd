// The watchdog's pure part: a rank's state through the store codec (strict), and the classification of a stall.
#include <gtest/gtest.h>

#include "gpuguard/stall_report.h"

using gpuguard::RankState;

namespace {

RankState state(int rank, std::uint64_t entered, std::uint64_t completed, const std::string& op = "ALL_REDUCE",
                const std::string& sizes = "float32[4]") {
  RankState s;
  s.rank = rank;
  s.host = "node" + std::to_string(rank / 2);
  s.pid = 1000 + rank;
  s.groups.push_back({"0", "dp", entered, completed, op, sizes, "train.py:" + std::to_string(40 + rank),
                      entered > completed ? 74.4 : 0});
  s.stack = "Thread 0x1 (most recent call first):\n  File \"train.py\", line 12 in step\n";
  return s;
}

gpuguard::StallSubject subject() { return {"0", "dp", {0, 1, 2, 3}, 5653, "ALL_REDUCE", "float32[4]", "train.py:40"}; }

std::string silent(const RankState&) { return "its process is gone"; }

}  // namespace

TEST(StallState, RoundTripsAndKeepsTheStack) {
  auto s = state(5, 7, 6);
  s.host = "bad\thost\nname";
  auto back = gpuguard::decode_state(gpuguard::encode_state(s));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rank, 5);
  EXPECT_EQ(back->host, "bad host name");
  ASSERT_EQ(back->groups.size(), 1u);
  EXPECT_EQ(back->groups[0].entered, 7u);
  EXPECT_EQ(back->groups[0].op, "ALL_REDUCE");
  EXPECT_DOUBLE_EQ(back->groups[0].waited_s, 74.4);
  EXPECT_EQ(back->stack, s.stack);
}

TEST(StallState, RejectsMalformedBytes) {
  auto good = gpuguard::encode_state(state(1, 1, 1));
  EXPECT_FALSE(gpuguard::decode_state(""));
  EXPECT_FALSE(gpuguard::decode_state("not a state\nstack\n"));
  EXPECT_FALSE(gpuguard::decode_state(good.substr(0, good.find("stack"))));  // truncated
  std::string bad_number = good;
  bad_number.replace(bad_number.find("rank\t1"), 6, "rank\tx");
  EXPECT_FALSE(gpuguard::decode_state(bad_number));
  EXPECT_FALSE(gpuguard::decode_state(std::string(gpuguard::kMaxStateBytes + 1, 'a')));
}

TEST(StallReport, RankRangesAreCompressed) {
  EXPECT_EQ(gpuguard::format_ranks({0, 1, 2, 3, 4, 6, 7}), "0-4, 6, 7");
  EXPECT_EQ(gpuguard::format_ranks({3}), "3");
}

TEST(StallReport, ARankThatNeverEnteredIsNamedWithItsStack) {
  std::vector<std::optional<RankState>> states{state(0, 5653, 5652), state(1, 5653, 5652), state(2, 5652, 5652),
                                               state(3, 5653, 5652)};
  auto r = gpuguard::compose_stall_report(subject(), states, {}, silent);
  EXPECT_EQ(r.kind, "rank_behind");
  EXPECT_NE(r.message.find("rank 2 never entered ALL_REDUCE #5653 on group 'dp' (ranks 0-3); ranks 0, 1, 3 have "
                           "waited in it for 74 s."), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("File \"train.py\", line 12 in step"), std::string::npos);
  EXPECT_NE(r.json.find("\"stuck_ranks\": [2]"), std::string::npos) << r.json;
}

TEST(StallReport, EveryoneWaitingIsNoProgress) {
  std::vector<std::optional<RankState>> states{state(0, 5653, 5652), state(1, 5653, 5652), state(2, 5653, 5652),
                                               state(3, 5653, 5652)};
  auto r = gpuguard::compose_stall_report(subject(), states, {}, silent);
  EXPECT_EQ(r.kind, "no_progress");
  EXPECT_NE(r.message.find("gpuguard doctor --p2p --nccl"), std::string::npos);
}

TEST(StallReport, DifferentSizesAtOneSequenceNumberAreADesync) {
  std::vector<std::optional<RankState>> states{state(0, 5653, 5652), state(1, 5653, 5652),
                                               state(2, 5653, 5652, "ALL_REDUCE", "float32[8]"), state(3, 5653, 5652)};
  auto r = gpuguard::compose_stall_report(subject(), states, {}, silent);
  EXPECT_EQ(r.kind, "desync");
  EXPECT_NE(r.message.find("rank 2 called ALL_REDUCE #5653 (float32[8]) at train.py:42"), std::string::npos)
      << r.message;
}

TEST(StallReport, ASilentRankIsNamedGoneWithItsHostFromItsHello) {
  std::vector<std::optional<RankState>> states{state(0, 5653, 5652), state(1, 5653, 5652), std::nullopt,
                                               state(3, 5653, 5652)};
  std::vector<std::optional<RankState>> hellos{std::nullopt, std::nullopt, state(2, 0, 0), std::nullopt};
  auto r = gpuguard::compose_stall_report(subject(), states, hellos, silent);
  EXPECT_EQ(r.kind, "rank_gone");
  EXPECT_NE(r.message.find("rank 2 (node1, pid 1002, no GPU) did not answer: its process is gone"),
            std::string::npos) << r.message;
}
