// The peer-copy probe against the fake driver (topology set per ctest entry): a healthy box verifies, a box
// whose peer writes are dropped (ACS/IOMMU) is caught although cuDeviceCanAccessPeer says yes.
#include <gtest/gtest.h>

#include "gpuguard/cuda_driver.h"
#include "gpuguard/p2p_probe.h"

namespace {

constexpr std::size_t kBytes = 1 << 16;

TEST(PeerCopyPattern, FillerNeverEqualsPatternAndPairsDiffer) {
  for (std::size_t i = 0; i < 4096; ++i) {
    ASSERT_NE(gpuguard::peer_copy_pattern(0, 1, i), gpuguard::peer_copy_filler(0, 1, i)) << i;
  }
  int same = 0;
  for (std::size_t i = 0; i < 256; ++i) same += gpuguard::peer_copy_pattern(0, 1, i) == gpuguard::peer_copy_pattern(1, 0, i);
  EXPECT_EQ(same, 0) << "the two directions of a pair must write different bytes";
}

TEST(PeerCopyHealthy, EveryOrderedPairVerifies) {
  auto count = gpuguard::CudaDriver::instance().device_count();
  ASSERT_TRUE(count.ok()) << count.error().message();
  ASSERT_EQ(count.value(), 4);
  for (int s = 0; s < 4; ++s) {
    for (int d = 0; d < 4; ++d) {
      if (s == d) continue;
      auto r = gpuguard::peer_copy_probe(s, d, kBytes);
      ASSERT_TRUE(r.ok()) << r.error().message();
      EXPECT_TRUE(r.value().peer_access_reported);
      EXPECT_TRUE(r.value().peer_access_enabled);
      EXPECT_TRUE(r.value().verified) << s << "->" << d;
      EXPECT_EQ(r.value().mismatched_bytes, 0u);
      EXPECT_EQ(r.value().bytes, kBytes);
    }
  }
  // A second probe in the same process finds peer access already enabled; that is not an error.
  auto again = gpuguard::peer_copy_probe(0, 1, kBytes);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_TRUE(again.value().verified);
}

TEST(PeerCopyDropped, CapabilitySaysYesButNothingArrives) {
  auto r = gpuguard::peer_copy_probe(0, 1, kBytes);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r.value().peer_access_reported) << "the point: the capability flag lies";
  EXPECT_FALSE(r.value().verified);
  EXPECT_EQ(r.value().mismatched_bytes, kBytes);
  EXPECT_EQ(r.value().first_mismatch, 0u);
  EXPECT_TRUE(r.value().destination_unchanged) << "a dropped write leaves the destination as it was";
}

TEST(PeerCopyNoPeer, StagedCopyStillVerifiesAndSaysPeerAccessWasOff) {
  auto r = gpuguard::peer_copy_probe(1, 0, kBytes);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_FALSE(r.value().peer_access_reported);
  EXPECT_FALSE(r.value().peer_access_enabled);
  EXPECT_TRUE(r.value().verified);
}

TEST(PeerCopyErrors, BadArgumentsAndOrdinalsAreNamedErrors) {
  auto same = gpuguard::peer_copy_probe(0, 0, kBytes);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.error().message().find("same device"), std::string::npos) << same.error().message();
  auto empty = gpuguard::peer_copy_probe(0, 1, 0);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message().find("0 bytes"), std::string::npos);
  auto out_of_range = gpuguard::peer_copy_probe(0, 7, kBytes);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_EQ(out_of_range.error().call, "cuDeviceGet");
  EXPECT_EQ(out_of_range.error().code_name, "CUDA_ERROR_INVALID_DEVICE");
}

}  // namespace
