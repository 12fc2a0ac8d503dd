// The run-time NCCL loader against the fake NCCL: names, the override, the preferred file, the version, a unique id,
// a missing NCCL.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gpuguard/nccl.h"
#include "gpuguard/runtime_library.h"

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
  // GPUGUARD_LIBNCCL wins over the file the Python layer prefers (torch's NCCL).
  EXPECT_TRUE(gpuguard::Nccl::instance().prefer("/no/such/torch/libnccl.so.2", "torch's NCCL"));
  auto st = gpuguard::Nccl::instance().status();
  EXPECT_TRUE(st.loaded) << st.reason;
  EXPECT_FALSE(st.already_in_process);
  EXPECT_EQ(st.found_by, "$GPUGUARD_LIBNCCL");
  EXPECT_FALSE(gpuguard::Nccl::instance().prefer("/too/late/libnccl.so.2", "too late"));
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

// A library spec whose override is never set and whose only name is nowhere: what prefer() adds is all there is.
gpuguard::LibrarySpec spec_without_names() {
  return {"NCCL", "GPUGUARD_TEST_UNSET_OVERRIDE", {"libgpuguard-no-such-nccl.so.2"}, "", "not found", "(not NCCL?)"};
}

TEST(RuntimeLibraryPrefer, OpensThePreferredFileBeforeTheNamesAndSaysWhy) {
  const char* fake = std::getenv("GPUGUARD_LIBNCCL");
  ASSERT_NE(fake, nullptr);
  gpuguard::RuntimeLibrary lib(spec_without_names());
  EXPECT_TRUE(lib.prefer(fake, "torch's NCCL (test)"));
  auto status = lib.load([](gpuguard::RuntimeLibrary::Symbols&) {});
  ASSERT_TRUE(status.ok()) << status.error().message();
  EXPECT_EQ(lib.found_by(), "torch's NCCL (test)");
  EXPECT_NE(lib.loaded_from().find("libgpuguard_fake_nccl.so"), std::string::npos) << lib.loaded_from();
  EXPECT_FALSE(lib.prefer("/elsewhere/libnccl.so.2", "too late"));
  EXPECT_EQ(lib.found_by(), "torch's NCCL (test)");
}

TEST(RuntimeLibraryPrefer, APreferredFileThatDoesNotLoadIsNamedInTheError) {
  gpuguard::RuntimeLibrary lib(spec_without_names());
  EXPECT_TRUE(lib.prefer("/no/such/site-packages/nvidia/nccl/lib/libnccl.so.2", "torch's NCCL (test)"));
  EXPECT_EQ(lib.candidate_list(), "/no/such/site-packages/nvidia/nccl/lib/libnccl.so.2, libgpuguard-no-such-nccl.so.2");
  auto status = lib.load([](gpuguard::RuntimeLibrary::Symbols&) {});
  ASSERT_FALSE(status.ok());
  const std::string message = status.error().message();
  EXPECT_NE(message.find("/no/such/site-packages/nvidia/nccl/lib/libnccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("libgpuguard-no-such-nccl.so.2"), std::string::npos) << message;
  EXPECT_EQ(lib.found_by(), "");
}

TEST(RuntimeLibraryPrefer, FallingBackToTheNamesSaysWhyThePreferredFileWasPassedOver) {
  const char* fake = std::getenv("GPUGUARD_LIBNCCL");
  ASSERT_NE(fake, nullptr);
  gpuguard::RuntimeLibrary lib({"NCCL", "GPUGUARD_TEST_UNSET_OVERRIDE", {fake}, "", "not found", "(not NCCL?)"});
  EXPECT_TRUE(lib.prefer("/no/such/libnccl.so.2", "torch's NCCL (test)"));
  auto status = lib.load([](gpuguard::RuntimeLibrary::Symbols&) {});
  ASSERT_TRUE(status.ok()) << status.error().message();
  const std::string found_by = lib.found_by();
  EXPECT_EQ(found_by.rfind(std::string("the dynamic loader's search for ") + fake +
                           " (torch's NCCL (test) did not load: /no/such/libnccl.so.2: ", 0), 0u)
      << found_by;
}
