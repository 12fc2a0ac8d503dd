// The run-time driver loader, against the fake driver (environment set per test by ctest).
#include <gtest/gtest.h>

#include "gpuguard/cuda_driver.h"

TEST(FakeDriver, Visible35) {
  auto& driver = gpuguard::CudaDriver::instance();
  auto devices = driver.devices();
  ASSERT_TRUE(devices.ok()) << devices.error().message();
  ASSERT_EQ(devices.value().size(), 2u);
  // GPU 3 and GPU 5 of tests/fakes/topologies/h100x8.json, in the order CUDA_VISIBLE_DEVICES gave them.
  EXPECT_EQ(devices.value()[0].uuid, "GPU-5a6baf33-0003-4003-8003-1f2e3d4c5b63");
  EXPECT_EQ(devices.value()[0].pci_bus_id, "0000:5d:00.0");
  EXPECT_EQ(devices.value()[0].index, 0);
  EXPECT_EQ(devices.value()[1].uuid, "GPU-5a6bd155-0005-4005-8005-1f2e3d4c5b65");
  EXPECT_EQ(devices.value()[1].index, 1);
  EXPECT_EQ(devices.value()[1].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(devices.value()[1].total_memory, 81559ull * 1024 * 1024);
  EXPECT_EQ(devices.value()[1].cc_major, 9);
  auto st = driver.status();
  EXPECT_EQ(st.driver_version, 13000);
  EXPECT_EQ(st.visible_devices_at_init, "3,5");
  EXPECT_TRUE(st.reason.empty()) << st.reason;
}

TEST(FakeDriver, DeviceOutOfRangeNamesTheCallAndTheDriverErrorName) {
  auto r = gpuguard::CudaDriver::instance().device(7);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().call, "cuDeviceGet");
  EXPECT_EQ(r.error().code_name, "CUDA_ERROR_INVALID_DEVICE");
  EXPECT_NE(r.error().message().find("invalid device ordinal"), std::string::npos) << r.error().message();
}

TEST(FakeDriver, NoneVisible) {
  auto st = gpuguard::CudaDriver::instance().status();
  EXPECT_TRUE(st.library_loaded);
  EXPECT_EQ(st.device_count, 0);
  EXPECT_EQ(st.reason, "no CUDA device is visible (CUDA_VISIBLE_DEVICES='')");
  auto devices = gpuguard::CudaDriver::instance().devices();
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.error().code_name, "CUDA_ERROR_NO_DEVICE");
}

TEST(FakeDriver, MissingLibrary) {
  auto st = gpuguard::CudaDriver::instance().status();
  EXPECT_FALSE(st.library_loaded);
  EXPECT_NE(st.reason.find("no-such-libcuda.so"), std::string::npos) << st.reason;
  EXPECT_NE(st.reason.find("no NVIDIA driver"), std::string::npos) << st.reason;
  auto devices = gpuguard::CudaDriver::instance().devices();
  EXPECT_FALSE(devices.ok());
}
