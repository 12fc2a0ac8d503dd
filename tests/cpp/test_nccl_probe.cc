// The communicator probe against the fake NCCL and fake driver. Each rank is a forked child (NCCL and the
// driver are per process); the topology is fixed per ctest entry.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpuguard/cuda_driver.h"
#include "gpuguard/nccl.h"
#include "gpuguard/nccl_probe.h"

namespace {

struct RankResult {
  std::string verdict, stage, code_name, last_error, message, sum;
  bool aborted = false;
};

// Forks one child per entry of `visible` (its CUDA_VISIBLE_DEVICES); each runs the probe as rank i and
// reports back through a pipe. The parent never initialises CUDA, so every child starts fresh.
std::vector<RankResult> run_ranks(const std::vector<std::string>& visible, double timeout_s, bool all_reduce,
                                  const char* extra_env = nullptr) {
  auto id = gpuguard::Nccl::instance().unique_id();
  EXPECT_TRUE(id.ok()) << id.error().message();
  std::vector<int> read_ends;
  std::vector<pid_t> children;
  int n = static_cast<int>(visible.size());
  for (int rank = 0; rank < n; ++rank) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      setenv("CUDA_VISIBLE_DEVICES", visible[static_cast<size_t>(rank)].c_str(), 1);
      if (extra_env != nullptr) putenv(const_cast<char*>(extra_env));
      gpuguard::NcclProbeOptions o;
      o.nranks = n;
      o.rank = rank;
      o.unique_id = id.value();
      o.device = 0;
      o.timeout_s = timeout_s;
      o.all_reduce = all_reduce;
      auto out = gpuguard::run_nccl_probe(o);
      std::string sum;
      for (float v : out.all_reduce_result) sum += std::to_string(static_cast<int>(v)) + ",";
      std::string line = std::string(out.verdict_name()) + "\x1f" + out.stage + "\x1f" + out.error.code_name + "\x1f" +
                         out.last_error + "\x1f" + (out.ok() ? "" : out.error.message()) + "\x1f" + sum + "\x1f" +
                         (out.aborted ? "1" : "0");
      if (write(fds[1], line.data(), line.size()) < 0) _exit(3);
      _exit(0);
    }
    close(fds[1]);
    read_ends.push_back(fds[0]);
    children.push_back(pid);
  }
  std::vector<RankResult> results;
  for (int rank = 0; rank < n; ++rank) {
    std::string text;
    char buf[4096];
    ssize_t got;
    while ((got = read(read_ends[static_cast<size_t>(rank)], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(got));
    close(read_ends[static_cast<size_t>(rank)]);
    int status = 0;
    waitpid(children[static_cast<size_t>(rank)], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " crashed";
    std::vector<std::string> parts;
    size_t start = 0;
    for (;;) {
      size_t sep = text.find('\x1f', start);
      parts.push_back(text.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
      if (sep == std::string::npos) break;
      start = sep + 1;
    }
    RankResult r;
    if (parts.size() == 7) r = {parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6] == "1"};
    results.push_back(r);
  }
  return results;
}

}  // namespace

TEST(FakeNccl, FourRanksOnFourGpusFormACommunicatorAndAllReduce) {
  auto results = run_ranks({"0", "1", "2", "3"}, 20, /*all_reduce=*/true);
  ASSERT_EQ(results.size(), 4u);
  for (const auto& r : results) {
    EXPECT_EQ(r.verdict, "ok") << r.message;
    // ranks contribute (rank+1)*(i+1): the sum over 4 ranks is 10*(i+1)
    EXPECT_EQ(r.sum, "10,20,30,40,");
    EXPECT_FALSE(r.aborted);
  }
}

TEST(FakeNccl, TwoRanksOnOneGpuFailAsNcclDoesNamingTheBusId) {
  auto results = run_ranks({"0", "0"}, 20, false);
  ASSERT_EQ(results.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.verdict, "failed");
    EXPECT_EQ(r.stage, "ncclCommInitRankConfig");
    EXPECT_EQ(r.code_name, "ncclInvalidUsage");
    std::string expected = "Duplicate GPU detected : rank " + std::to_string(rank) + " and rank " +
                           std::to_string(1 - rank) + " both on CUDA device 18000";
    EXPECT_EQ(r.last_error, expected);
    EXPECT_NE(r.message.find("NCCL call ncclCommInitRankConfig failed: ncclInvalidUsage (5)"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find(expected), std::string::npos) << r.message;
    EXPECT_TRUE(r.aborted);
  }
}

TEST(FakeNcclDuplicate, ForcedDuplicateFailsRanksZeroAndOneOnly) {
  auto results = run_ranks({"0", "1", "2"}, 20, false);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].last_error, "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 18000");
  EXPECT_EQ(results[1].last_error, "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000");
  EXPECT_EQ(results[2].verdict, "ok") << results[2].message;
}

TEST(FakeNcclHang, InitThatNeverCompletesTimesOutAndIsAborted) {
  auto results = run_ranks({"0", "1"}, 0.5, false);
  for (const auto& r : results) {
    EXPECT_EQ(r.verdict, "timed out");
    EXPECT_EQ(r.stage, "ncclCommInitRankConfig");
    EXPECT_NE(r.message.find("did not complete within 0.5 s"), std::string::npos) << r.message;
    EXPECT_TRUE(r.aborted);
  }
}

TEST(FakeNcclBrokenP2p, FirstAllReduceHangsUnlessP2pIsDisabled) {
  auto hung = run_ranks({"0", "1"}, 0.5, true);
  for (const auto& r : hung) {
    // as on a GPU: ncclAllReduce returns once enqueued, and the hang shows where the host waits for the kernel
    EXPECT_EQ(r.verdict, "timed out");
    EXPECT_EQ(r.stage, "synchronize");
    EXPECT_NE(r.message.find("the all-reduce did not finish on the GPU within 0.5 s"), std::string::npos) << r.message;
    EXPECT_TRUE(r.aborted);
  }
  auto cured = run_ranks({"0", "1"}, 20, true, "NCCL_P2P_DISABLE=1");
  for (const auto& r : cured) {
    EXPECT_EQ(r.verdict, "ok") << r.message;
    EXPECT_EQ(r.sum, "3,6,9,12,");
  }
}

TEST(NcclMissing, TheProbeFailsAtLoad) {
  gpuguard::NcclProbeOptions o;
  auto out = gpuguard::run_nccl_probe(o);
  EXPECT_EQ(out.verdict, gpuguard::NcclProbeOutcome::Verdict::kFailed);
  EXPECT_EQ(out.stage, "load NCCL");
}

TEST(NcclProbeArguments, BadRankIsNamed) {
  gpuguard::NcclProbeOptions o;
  o.nranks = 2;
  o.rank = 2;
  auto out = gpuguard::run_nccl_probe(o);
  EXPECT_EQ(out.stage, "arguments");
  EXPECT_NE(out.error.message().find("rank 2 is outside 0..1"), std::string::npos) << out.error.message();
}
