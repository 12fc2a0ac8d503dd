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
  s.groups.push_back({"0@gloo", "dp", entered, completed, op, sizes, "train.py:" + std::to_string(40 + rank),
                      entered > completed ? 74.4 : 0, "16"});
  s.stack = "Thread 0x0000000000000011 (most recent call first):\n  File \"/x/gpuguard/watchdog/recorder.py\", "
            "line 3 in _run\nThread 0x0000000000000010 (most recent call first):\n  File \"train.py\", line " +
            std::to_string(12 + rank) + " in step\n  File \"train.py\", line 80 in <module>\n";
  return s;
}

gpuguard::StallSubject subject() {
  return {"0@gloo", "dp", {0, 1, 2, 3}, 5653, "ALL_REDUCE", "float32[4]", "train.py:40", "progress from the recorder"};
}

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
  EXPECT_NE(r.message.find("File \"train.py\", line 14 in step"), std::string::npos);
  EXPECT_NE(r.json.find("\"stuck_ranks\": [2]"), std::string::npos) << r.json;
  // both places: where the others issued it and where their CPUs wait, and where rank 2 is instead
  EXPECT_NE(r.message.find("ranks 0, 1, 3 issued it at train.py:40; their CPU waits now: rank 0 at train.py:12 in "
                           "step, rank 1 at train.py:13 in step, rank 3 at train.py:15 in step."),
            std::string::npos) << r.message;
  EXPECT_NE(r.message.find("rank 2 is at train.py:14 in step:"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("(progress from the recorder)"), std::string::npos) << r.message;
  EXPECT_NE(r.json.find("\"group_name\": \"0\""), std::string::npos) << r.json;
  EXPECT_NE(r.json.find("\"cpu_at\": {\"0\": \"train.py:12 in step\""), std::string::npos) << r.json;
}

TEST(StallReport, TheCpuWaitSiteIsTheIssuingThreadsInnermostFrame) {
  std::string stack = "Thread 0x000000000000000a (most recent call first):\n  File \"a.py\", line 1 in f\n"
                      "Current thread 0x000000000000000b (most recent call first):\n  File \"b.py\", line 2 in g\n";
  EXPECT_EQ(gpuguard::cpu_wait_site(stack, "11"), "b.py:2 in g");
  EXPECT_EQ(gpuguard::cpu_wait_site(stack, "10"), "a.py:1 in f");
  EXPECT_EQ(gpuguard::cpu_wait_site(stack, "99"), "a.py:1 in f");  // unknown thread: the first one
  EXPECT_EQ(gpuguard::cpu_wait_site("(no stack: Python 3.10)", ""), "");
  // in torch: where, and the job's own line that called it
  std::string in_torch = "Thread 0x000000000000000a (most recent call first):\n  File \"/v/lib/python3.11/site-packages/"
                         "torch/autograd/graph.py\", line 1113 in _engine_run_backward\n  File \"/v/lib/python3.11/"
                         "site-packages/torch/_tensor.py\", line 623 in backward\n  File \"/job/train.py\", line 61 in "
                         "<module>\n";
  EXPECT_EQ(gpuguard::cpu_wait_site(in_torch, "10"),
            "/v/lib/python3.11/site-packages/torch/autograd/graph.py:1113 in _engine_run_backward, called from "
            "/job/train.py:61 in <module>");
}

TEST(StallReport, TheWatchdogsOwnThreadIsLeftOutOfTheStack) {
  std::string stack = "Thread 0x000000000000000a (most recent call first):\n  File \"/p/gpuguard/watchdog/recorder.py\", "
                      "line 1 in _run\n  File \"threading.py\", line 9 in run\n\n"
                      "Current thread 0x000000000000000b (most recent call first):\n  File \"b.py\", line 2 in g\n";
  EXPECT_EQ(gpuguard::without_threads_in(stack, "gpuguard/watchdog/recorder.py"),
            "Current thread 0x000000000000000b (most recent call first):\n  File \"b.py\", line 2 in g\n");
}

TEST(StallReport, EveryoneWaitingIsNoProgress) {
  std::vector<std::optional<RankState>> states{state(0, 5653, 5652), state(1, 5653, 5652), state(2, 5653, 5652),
                                               state(3, 5653, 5652)};
  auto r = gpuguard::compose_stall_report(subject(), states, {}, silent);
  EXPECT_EQ(r.kind, "no_progress");
  EXPECT_NE(r.message.find("and it has not completed on any of them in "), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("Either NCCL's transport hangs (the network between the ranks, or GPU peer-to-peer), or "
                           "a GPU has not reached it yet"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("gpuguard doctor --p2p --nccl"), std::string::npos);
}

TEST(StallReport, ACollectiveSomeRanksCompletedNamesTheOthersAsBehindInIt) {
  // CI saw it on a loaded machine: every rank entered DDP's first all-gather, three completed it, one had not
  std::vector<std::optional<RankState>> states{state(0, 5653, 5653), state(1, 5653, 5653), state(2, 5653, 5652),
                                               state(3, 5653, 5653)};
  auto r = gpuguard::compose_stall_report(subject(), states, {}, silent);
  EXPECT_EQ(r.kind, "rank_slow");
  EXPECT_NE(r.message.find("every rank entered ALL_REDUCE #5653 on group 'dp' (ranks 0-3); ranks 0, 1, 3 completed "
                           "it, but rank 2 has not in "),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("so the transport works: that rank is behind in it"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find("not completed on any"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find("already completed"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find("NCCL_P2P_DISABLE"), std::string::npos) << r.message;
  EXPECT_NE(r.json.find("\"stuck_ranks\": [2]"), std::string::npos) << r.json;
}

TEST(StallReport, AStallEveryRankCompletedByTheTimeItAnsweredIsResolvedAndNotReported) {
  // CI saw it on a loaded machine: a rank ran more than the threshold behind, the alarm was raised on #3, and by
  // the time the states were gathered every rank had completed #3; the report said "it has not completed on any of
  // them in 0 s" and "(ranks 0-3 already completed #3)", and took the place of the real stall that came later
  std::vector<std::optional<RankState>> states{state(0, 5654, 5653), state(1, 5653, 5653), state(2, 5655, 5655),
                                               state(3, 5653, 5653)};
  auto r = gpuguard::compose_stall_report(subject(), states, {}, silent);
  EXPECT_EQ(r.kind, gpuguard::kStallResolved);
  EXPECT_EQ(r.message, "");
  EXPECT_EQ(r.json, "");
  // one rank that did not answer is not "completed": that is still a report
  states[1] = std::nullopt;
  EXPECT_EQ(gpuguard::compose_stall_report(subject(), states, {}, silent).kind, "rank_gone");
}

TEST(StallReport, NoProgressInAOneRankGroupBlamesTheGpuNotTheNetwork) {
  // a held-back collective on a one-GPU machine: no peer, so the advice must not send the user to the network
  gpuguard::StallSubject one = subject();
  one.ranks = {0};
  std::vector<std::optional<RankState>> states{state(0, 5653, 5652)};
  auto r = gpuguard::compose_stall_report(one, states, {}, silent);
  EXPECT_EQ(r.kind, "no_progress");
  EXPECT_NE(r.message.find("(ranks 0) and it has not completed on any of them in "), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("Its group has one rank, so no network or peer GPU is involved"), std::string::npos)
      << r.message;
  EXPECT_EQ(r.message.find("NCCL_P2P_DISABLE"), std::string::npos) << r.message;
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
