// The run-time NCCL loader against the fake NCCL: names, the override, the version, a unique id, a missing NCCL.
#include <gtest/gtest.h>

#include <string>

#include "gpuguard/nccl.h"

TEST(NcclNames, VersionStringsAndResultNames) {
  EXPECT_EQ(gpuguard::nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(gpuguard::nccl_version_string(21400), "2.14.0");
  EXPECT_EQ(gpuguard::nccl_version_string(2708), "2.7.8");
  EXPECT_EQ(gpuguard::nccl_version_string(0), "unknown");
  EXPECT_EQ(gpuguard::nccl_result_name(5), "ncclInvalidUsage");
  EXPECT_EQ(gpuguard::nccl_result_name(7), "ncclInProgress");
  EXPECT_EQ(gpuguard::nccl_result_name(42), "ncclResult_t 42");
}

TEST(FakeNccl, LoadsTheOverrideAndReportsItsVersion) {
  auto st = gpuguard::Nccl::instance().status();
  EXPECT_TRUE(st.loaded) << st.reason;
  EXPECT_FALSE(st.already_in_process);
  EXPECT_NE(st.library.find("libgpuguard_fake_nccl.so"), std::string::npos) << st.library;
  EXPECT_EQ(st.version, 22809);
  EXPECT_EQ(st.version_string, "2.28.9");
  EXPECT_TRUE(st.reason.empty()) << st.reason;
  auto id = gpuguard::Nccl::instance().unique_id();
  ASSERT_TRUE(id.ok()) << id.error().message();
  EXPECT_EQ(std::string(id.value().data(), 19), "gpuguard-fake-nccl:");
}

TEST(NcclMissing, StatusSaysWhy) {
  auto st = gpuguard::Nccl::instance().status();
  EXPECT_FALSE(st.loaded);
  EXPECT_NE(st.reason.find("no-such-libnccl.so"), std::string::npos) << st.reason;
}
