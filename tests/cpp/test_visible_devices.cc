// CUDA_VISIBLE_DEVICES parsing: the driver's rules, and the first entry it would silently stop at, named.
#include <gtest/gtest.h>

#include "gpuguard/visible_devices.h"

using gpuguard::find_rejected_entry;
using gpuguard::parse_visible_devices;
using gpuguard::VisibleDevicesProblem;
using gpuguard::VisibleEntry;

namespace {
const std::string kUuid0 = "GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60";
const std::string kUuid1 = "GPU-5a6b8d11-0001-4001-8001-1f2e3d4c5b61";
}  // namespace

TEST(VisibleDevices, UnsetMeansEveryGpu) {
  auto spec = parse_visible_devices(nullptr);
  EXPECT_FALSE(spec.set);
  EXPECT_TRUE(spec.entries.empty());
  EXPECT_FALSE(spec.problem);
  EXPECT_FALSE(spec.hides_all_on_purpose);
}

TEST(VisibleDevices, ConventionalHideAllValuesAreNotErrors) {
  for (const char* raw : {"", " ", "-1", "NoDevFiles"}) {
    auto spec = parse_visible_devices(raw);
    EXPECT_TRUE(spec.set) << raw;
    EXPECT_TRUE(spec.hides_all_on_purpose) << raw;
    EXPECT_TRUE(spec.entries.empty()) << raw;
    EXPECT_FALSE(spec.problem) << raw;
  }
}

TEST(VisibleDevices, IndicesUuidsPrefixesAndMigInOrder) {
  auto spec = parse_visible_devices(("3, 1," + kUuid0 + ",5a6b8d11,MIG-GPU-" + kUuid1.substr(4) + "/1/0").c_str());
  ASSERT_FALSE(spec.problem) << spec.problem->reason;
  ASSERT_EQ(spec.entries.size(), 5u);
  EXPECT_EQ(spec.entries[0].kind, VisibleEntry::Kind::kIndex);
  EXPECT_EQ(spec.entries[0].index, 3);
  EXPECT_EQ(spec.entries[1].text, "1");  // blanks around an entry are ignored, as the driver does
  EXPECT_EQ(spec.entries[2].kind, VisibleEntry::Kind::kUuid);
  EXPECT_EQ(spec.entries[2].uuid, kUuid0.substr(4));
  EXPECT_EQ(spec.entries[3].kind, VisibleEntry::Kind::kUuidPrefix);
  EXPECT_EQ(spec.entries[4].kind, VisibleEntry::Kind::kMig);
}

TEST(VisibleDevices, UuidIsCaseInsensitive) {
  auto spec = parse_visible_devices("gpu-5A6B7C00");
  ASSERT_FALSE(spec.problem);
  EXPECT_EQ(spec.entries[0].uuid, "5a6b7c00");
}

TEST(VisibleDevices, EmptyEntryIsNamedAndEarlierEntriesKept) {
  auto spec = parse_visible_devices("0,1,,2");
  ASSERT_TRUE(spec.problem);
  EXPECT_EQ(spec.problem->kind, VisibleDevicesProblem::Kind::kEmpty);
  EXPECT_EQ(spec.problem->position, 2);
  EXPECT_EQ(spec.problem->reason, "entry 3 is empty (two commas in a row, or a comma at the end)");
  EXPECT_EQ(spec.entries.size(), 2u);
  EXPECT_EQ(parse_visible_devices("0,1,").problem->position, 2);
}

TEST(VisibleDevices, MalformedEntryIsNamed) {
  auto spec = parse_visible_devices("1,bogus,2");
  ASSERT_TRUE(spec.problem);
  EXPECT_EQ(spec.problem->kind, VisibleDevicesProblem::Kind::kMalformed);
  EXPECT_EQ(spec.problem->entry, "bogus");
  EXPECT_EQ(spec.problem->reason,
            "entry 2 ('bogus') is neither a device index, a GPU UUID or UUID prefix (GPU-xxxxxxxx-...), nor a MIG "
            "device (MIG-...)");
  EXPECT_EQ(spec.entries.size(), 1u);
}

TEST(VisibleDevices, NegativeIndexAfterOthersIsNamed) {
  auto spec = parse_visible_devices("0,-1");
  ASSERT_TRUE(spec.problem);
  EXPECT_FALSE(spec.hides_all_on_purpose);
  EXPECT_EQ(spec.problem->reason, "entry 2 ('-1') is not a device index: a negative number hides every GPU from here on");
}

TEST(VisibleDevices, MisshapenUuidsAreMalformed) {
  EXPECT_TRUE(parse_visible_devices("GPU-").problem);
  EXPECT_TRUE(parse_visible_devices("GPU-5a6b7c000000").problem);  // the dash belongs after 8 digits
  EXPECT_TRUE(parse_visible_devices((kUuid0 + "0").c_str()).problem);  // too long
  EXPECT_TRUE(parse_visible_devices("1234567890").problem);  // too large for an index
  EXPECT_TRUE(parse_visible_devices("MIG-").problem);
}

TEST(VisibleDevices, RepeatedIndexIsADuplicate) {
  auto spec = parse_visible_devices("2,2,3");
  ASSERT_TRUE(spec.problem);
  EXPECT_EQ(spec.problem->kind, VisibleDevicesProblem::Kind::kDuplicate);
  EXPECT_EQ(spec.problem->position, 1);
  EXPECT_EQ(spec.problem->same_as, 0);
  EXPECT_EQ(spec.problem->reason, "entry 2 ('2') names the same GPU as entry 1 ('2')");
}

TEST(VisibleDevices, UuidAndItsPrefixAreADuplicate) {
  auto spec = parse_visible_devices(("0," + kUuid0 + ",GPU-5a6b7c").c_str());
  ASSERT_TRUE(spec.problem);
  EXPECT_EQ(spec.problem->kind, VisibleDevicesProblem::Kind::kDuplicate);
  EXPECT_EQ(spec.problem->position, 2);
  EXPECT_EQ(spec.problem->same_as, 1);
}

TEST(VisibleDevices, RejectedIndexIsTheFirstOneTheDriverDidNotShow) {
  auto spec = parse_visible_devices("0,1,99,2");
  auto rejected = find_rejected_entry(spec, {kUuid0, kUuid1});
  ASSERT_TRUE(rejected);
  EXPECT_EQ(rejected->kind, VisibleDevicesProblem::Kind::kRejected);
  EXPECT_EQ(rejected->position, 2);
  EXPECT_EQ(rejected->entry, "99");
  EXPECT_EQ(rejected->reason,
            "entry 3 ('99') was rejected by the driver: this host has no GPU 99, or it is a GPU already listed "
            "under its UUID; the driver shows 2 devices and ignores everything from it on");
}

TEST(VisibleDevices, UuidOfAGpuAlreadyShownIsADuplicate) {
  auto spec = parse_visible_devices(("0," + kUuid0.substr(0, 12)).c_str());
  auto rejected = find_rejected_entry(spec, {kUuid0});
  ASSERT_TRUE(rejected);
  EXPECT_EQ(rejected->kind, VisibleDevicesProblem::Kind::kDuplicate);
  EXPECT_EQ(rejected->same_as, 0);
}

TEST(VisibleDevices, NothingRejectedWhenTheDriverShowsEveryEntry) {
  EXPECT_FALSE(find_rejected_entry(parse_visible_devices("0,1"), {kUuid0, kUuid1}));
  EXPECT_FALSE(find_rejected_entry(parse_visible_devices(nullptr), {}));
  EXPECT_FALSE(find_rejected_entry(parse_visible_devices(""), {}));
}
