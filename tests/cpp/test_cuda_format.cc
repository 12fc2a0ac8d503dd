// UUID and PCI bus id formatting must match what nvidia-smi and NCCL print, or reports will not line up.
#include <gtest/gtest.h>

#include "gpuguard/cuda_driver.h"

TEST(CudaFormat, UuidIsGpuDash8_4_4_4_12LowercaseHex) {
  const unsigned char bytes[16] = {0x5a, 0x6b, 0x7c, 0x00, 0x00, 0x0a, 0x40, 0x00,
                                   0x80, 0x00, 0x1f, 0x2e, 0x3d, 0x4c, 0x5b, 0xFF};
  EXPECT_EQ(gpuguard::format_gpu_uuid(bytes), "GPU-5a6b7c00-000a-4000-8000-1f2e3d4c5bff");
}

TEST(CudaFormat, PciBusIdIsNormalisedToFourDigitDomain) {
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("00000000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("0000:AB:00.0"), "0000:ab:00.0");
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("18:00.0"), "0000:18:00.0");
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("0001:3b:1f.7"), "0001:3b:1f.7");
}

TEST(CudaFormat, PciBusIdRejectsGarbage) {
  EXPECT_EQ(gpuguard::normalize_pci_bus_id(""), "");
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("not-a-bus"), "");
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("0000:18:00.0 trailing"), "");
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("0000:100:00.0"), "");  // bus is one byte
  EXPECT_EQ(gpuguard::normalize_pci_bus_id("0000:18:20.0"), "");   // device is 5 bits
}
