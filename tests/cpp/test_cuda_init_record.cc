// What gpuguard's cuInit saw, and whether another library had initialised the driver first (the fact the
// "CUDA_VISIBLE_DEVICES set too late" check starts from). Environment set per test by ctest.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "gpuguard/cuda_driver.h"

TEST(InitRecord, GpuguardFirst) {
  auto& driver = gpuguard::CudaDriver::instance();
  EXPECT_FALSE(driver.init_record().attempted);  // asking never initialises
  ASSERT_TRUE(driver.init().ok());
  auto record = driver.init_record();
  EXPECT_TRUE(record.attempted);
  EXPECT_TRUE(record.succeeded);
  EXPECT_TRUE(record.visible_set);
  EXPECT_EQ(record.visible, "1,2");
  EXPECT_FALSE(record.initialized_before_gpuguard);
}

TEST(InitRecord, AnotherLibraryFirst) {
  // Stands in for torch: the same driver library, initialised before gpuguard looks.
  void* lib = dlopen(std::getenv("GPUGUARD_LIBCUDA"), RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto cu_init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit"));
  ASSERT_NE(cu_init, nullptr);
  ASSERT_EQ(cu_init(0), 0);
  auto& driver = gpuguard::CudaDriver::instance();
  ASSERT_TRUE(driver.init().ok());
  EXPECT_TRUE(driver.init_record().initialized_before_gpuguard);
}
