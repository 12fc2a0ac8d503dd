// Error::message() is what users read when a driver or NCCL call fails: it must name the call and the code.
#include <gtest/gtest.h>

#include "gpuguard/error.h"

TEST(Error, MessageNamesLibraryCallCodeAndLocation) {
  gpuguard::Error e{"CUDA driver", "cuDeviceGetUuid_v2", "CUDA_ERROR_INVALID_DEVICE", 101,
                    "invalid device ordinal", "cuda_driver.cc:42"};
  EXPECT_EQ(e.message(),
            "CUDA driver call cuDeviceGetUuid_v2 failed: CUDA_ERROR_INVALID_DEVICE (101): invalid device "
            "ordinal [gpuguard cuda_driver.cc:42]");
}

TEST(Error, MessageWithoutCallOrCode) {
  gpuguard::Error e;
  e.library = "gpuguard";
  e.detail = "store returned garbage";
  EXPECT_EQ(e.message(), "gpuguard failed: store returned garbage");
}

TEST(Result, HoldsValueOrError) {
  gpuguard::Result<int> good = 7;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good.value(), 7);
  gpuguard::Result<int> bad = gpuguard::Error{"NCCL", "ncclGetUniqueId", "ncclSystemError", 2, "", ""};
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code_name, "ncclSystemError");
}

TEST(Error, SourceLocationKeepsOnlyTheFileName) {
  EXPECT_EQ(gpuguard::source_location("/a/b/c/nccl.cc", 12), "nccl.cc:12");
}
