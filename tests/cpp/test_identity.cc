// Identity records: round trip, NCCL's host hash, and every way the strict decoder rejects peers' bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gpuguard/identity.h"

namespace {

using gpuguard::IdentityRecord;

IdentityRecord full_record() {
  IdentityRecord r;
  r.group = "actor_rollout";
  r.rank = 5;
  r.local_rank = 1;
  r.world_size = 8;
  r.local_world_size = 4;
  r.host_hash = 0x1234567890abcdefULL;
  r.hostname = "node-a.cluster";
  r.gpu_uuid = "GPU-5a6b8d11-0001-4001-8001-1f2e3d4c5b61";
  r.pci_bus_id = "0000:2a:00.0";
  r.gpu_index = 1;
  r.pid = 4242;
  r.cuda_visible_devices = "0,1,2,3";
  r.visible_device_count = 4;
  r.launcher = "ray";
  r.multi_rank_gpu_enabled = true;
  r.failure_kind = "RankMappingError";
  r.failure_text = "local rank 4 but this host shows 4 GPUs\nlikely cause: ...";
  r.gpu_fraction = 1.0 / 3.0;
  r.ray_gpu_ids = "['1']";
  return r;
}

std::string encode(const IdentityRecord& r) {
  auto bytes = gpuguard::encode_identity(r);
  EXPECT_TRUE(bytes.ok()) << bytes.error().message();
  return bytes.ok() ? bytes.value() : std::string();
}

// Decoding must fail, and the message must contain `expected`.
void expect_rejected(const std::string& bytes, const std::string& expected) {
  auto r = gpuguard::decode_identity(bytes);
  ASSERT_FALSE(r.ok()) << "accepted malformed record; expected: " << expected;
  EXPECT_NE(r.error().message().find(expected), std::string::npos) << r.error().message();
  EXPECT_EQ(r.error().call, "decode identity record");
}

// Offsets in the encoding of full_record(), for targeted corruption.
constexpr size_t kFlagsOffset = 5;
constexpr size_t kGroupLengthOffset = 7;
constexpr size_t kRankOffset = kGroupLengthOffset + 2 + 13;  // "actor_rollout"
constexpr size_t kWorldSizeOffset = kRankOffset + 8;

}  // namespace

TEST(Identity, FullRecordRoundTrips) {
  IdentityRecord r = full_record();
  auto decoded = gpuguard::decode_identity(encode(r));
  ASSERT_TRUE(decoded.ok()) << decoded.error().message();
  EXPECT_EQ(decoded.value(), r);
}

TEST(Identity, MinimalRecordRoundTripsAndIsCompact) {
  IdentityRecord r;
  r.world_size = 1024;
  r.rank = 1023;
  r.hostname = "n1";
  std::string bytes = encode(r);
  auto decoded = gpuguard::decode_identity(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.error().message();
  EXPECT_EQ(decoded.value(), r);
  EXPECT_FALSE(decoded.value().cuda_visible_devices.has_value());  // unset stays distinct from ""
  EXPECT_LT(bytes.size(), 80u);
}

TEST(Identity, EmptyVisibleDevicesIsDistinctFromUnset) {
  IdentityRecord r;
  r.cuda_visible_devices = "";
  auto decoded = gpuguard::decode_identity(encode(r));
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded.value().cuda_visible_devices.has_value());
  EXPECT_EQ(*decoded.value().cuda_visible_devices, "");
}

TEST(Identity, NcclHostHashIsDjb2aOverHostnameAndBootId) {
  // Computed by hand with NCCL's formula: result = result * 33 ^ c from 5381.
  EXPECT_EQ(gpuguard::nccl_string_hash(""), 5381u);
  EXPECT_EQ(gpuguard::nccl_string_hash("a"), (5381u * 33u) ^ 'a');
  auto fp = gpuguard::host_fingerprint_from("node-a", nullptr, "3f2a-boot");
  EXPECT_EQ(fp.hashed, "node-a3f2a-boot");
  EXPECT_EQ(fp.hash, gpuguard::nccl_string_hash("node-a3f2a-boot"));
  EXPECT_FALSE(fp.from_nccl_hostid);
  auto over = gpuguard::host_fingerprint_from("node-a", "rack7-host3", "3f2a-boot");
  EXPECT_EQ(over.hashed, "rack7-host3");  // NCCL_HOSTID replaces hostname and boot id
  EXPECT_TRUE(over.from_nccl_hostid);
  EXPECT_EQ(over.hostname, "node-a");
  // Two containers on one machine: same boot id, different hostnames -> different hosts, as in NCCL.
  EXPECT_NE(gpuguard::host_fingerprint_from("c1", nullptr, "b").hash, gpuguard::host_fingerprint_from("c2", nullptr, "b").hash);
  EXPECT_FALSE(gpuguard::host_fingerprint().hostname.empty());
}

TEST(Identity, EncoderRefusesInvalidFieldsAndCutsOnlyTheFailureText) {
  IdentityRecord r = full_record();
  r.rank = 8;
  auto bad = gpuguard::encode_identity(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("rank 8 is outside 0..7"), std::string::npos) << bad.error().message();

  r = full_record();
  r.failure_text = std::string(10000, 'x');
  auto cut = gpuguard::decode_identity(encode(r));
  ASSERT_TRUE(cut.ok()) << cut.error().message();
  EXPECT_EQ(cut.value().failure_text.size(), gpuguard::IdentityLimits::kMaxFailureText);
  EXPECT_EQ(cut.value().failure_text.substr(cut.value().failure_text.size() - 3), "...");
}

TEST(IdentityDecoder, RejectsEmptyAndForeignBytes) {
  expect_rejected("", "bad magic");
  expect_rejected("GGI", "bad magic");
  expect_rejected("{\"rank\": 0}", "bad magic");
}

TEST(IdentityDecoder, RejectsOtherFormatVersions) {
  std::string b = encode(full_record());
  b[4] = 2;
  expect_rejected(b, "record format version 2 is not the version 1");
  expect_rejected(b, "run the same gpuguard version on every rank");
}

TEST(IdentityDecoder, RejectsUnknownFlags) {
  std::string b = encode(full_record());
  b[kFlagsOffset + 1] = static_cast<char>(0x80);
  expect_rejected(b, "unknown flag bits");
}

TEST(IdentityDecoder, RejectsEveryTruncation) {
  std::string b = encode(full_record());
  for (size_t n = 0; n < b.size(); ++n) {
    auto r = gpuguard::decode_identity(std::string_view(b).substr(0, n));
    EXPECT_FALSE(r.ok()) << "a record cut to " << n << " of " << b.size() << " bytes was accepted";
  }
  expect_rejected(b.substr(0, b.size() - 1), "truncated in ray_gpu_ids");
}

TEST(IdentityDecoder, RejectsTrailingBytes) {
  expect_rejected(encode(full_record()) + "x", "1 trailing bytes after the record");
}

TEST(IdentityDecoder, RejectsOversizedInputBeforeParsing) {
  expect_rejected(std::string(gpuguard::IdentityLimits::kMaxRecordBytes + 1, 'G'), "at most 16384 are allowed");
}

TEST(IdentityDecoder, RejectsStringLengthsAboveTheirBound) {
  std::string b = encode(full_record());
  b[kGroupLengthOffset] = static_cast<char>(0xff);
  b[kGroupLengthOffset + 1] = static_cast<char>(0xff);
  expect_rejected(b, "group claims 65535 bytes; at most 128 are allowed");
}

TEST(IdentityDecoder, RejectsStringLengthsPastTheEnd) {
  IdentityRecord r;  // short record: a group length of 120 runs past its end
  std::string b = encode(r);
  b[kGroupLengthOffset] = 120;
  expect_rejected(b, "truncated in group (claims 120 bytes");
}

TEST(IdentityDecoder, RejectsRanksOutsideTheWorld) {
  std::string b = encode(full_record());
  std::string negative = b;
  std::memset(&negative[kRankOffset], 0xff, 4);  // -1
  expect_rejected(negative, "rank -1 is outside 0..7");
  std::string zero_world = b;
  std::memset(&zero_world[kWorldSizeOffset], 0, 4);
  expect_rejected(zero_world, "world_size 0 is outside");
}

TEST(IdentityDecoder, RejectsFieldValuesThatCannotBeReal) {
  struct Case {
    void (*mutate)(IdentityRecord&);
    const char* expected;
  };
  const Case cases[] = {
      {[](IdentityRecord& r) { r.group = ""; }, "group is empty"},
      {[](IdentityRecord& r) { r.local_rank = 4; }, "local_rank 4 must be -1 (unknown) or below local_world_size 4"},
      {[](IdentityRecord& r) { r.local_world_size = 0; }, "local_world_size 0"},
      {[](IdentityRecord& r) { r.hostname = "bad\x01host"; }, "hostname contains control character 0x01"},
      {[](IdentityRecord& r) { r.hostname = "bad\xff"; }, "hostname is not valid UTF-8"},
      {[](IdentityRecord& r) { r.hostname = "\xc0\xaf"; }, "hostname is not valid UTF-8"},          // overlong '/'
      {[](IdentityRecord& r) { r.hostname = "\xed\xa0\x80"; }, "hostname is not valid UTF-8"},      // surrogate
      {[](IdentityRecord& r) { r.gpu_uuid = "5a6b8d11-0001"; }, "gpu_uuid must start with GPU- or MIG-"},
      {[](IdentityRecord& r) { r.gpu_uuid = "GPU-12"; }, "gpu_uuid has too few hex digits"},
      {[](IdentityRecord& r) { r.gpu_uuid = "GPU-5a6b8d11 0001"; }, "gpu_uuid contains a character"},
      {[](IdentityRecord& r) { r.pci_bus_id = "18:00.0"; }, "pci_bus_id '18:00.0' is not of the form 0000:18:00.0"},
      {[](IdentityRecord& r) { r.pci_bus_id = "0000:18:00.9"; }, "is not of the form"},
      {[](IdentityRecord& r) { r.gpu_index = -1; }, "gpu_index -1 and gpu_uuid"},
      {[](IdentityRecord& r) { r.visible_device_count = -2; }, "visible_device_count -2 is out of range"},
      {[](IdentityRecord& r) { r.cuda_visible_devices = "0\n1"; }, "cuda_visible_devices contains control character 0x0a"},
      {[](IdentityRecord& r) { r.failure_kind = "Rank Mapping"; }, "failure_kind must be an identifier"},
      {[](IdentityRecord& r) { r.failure_text = "a\x1b[31m"; }, "failure_text contains control character 0x1b"},
      {[](IdentityRecord& r) { r.gpu_fraction = 0.0; }, "gpu_fraction must be a finite number"},
      {[](IdentityRecord& r) { r.gpu_fraction = 1.0 / 0.0; }, "gpu_fraction must be a finite number"},
      {[](IdentityRecord& r) { r.gpu_fraction = -0.5; }, "gpu_fraction must be a finite number"},
  };
  for (const auto& c : cases) {
    IdentityRecord r = full_record();
    c.mutate(r);
    // The encoder refuses it ...
    auto enc = gpuguard::encode_identity(r);
    ASSERT_FALSE(enc.ok()) << c.expected;
    EXPECT_NE(enc.error().message().find(c.expected), std::string::npos) << enc.error().message();
  }
}

TEST(IdentityDecoder, RejectsInvalidFieldsWrittenByHandAroundTheEncoder) {
  // ... and the decoder refuses the same values when a peer writes them directly: patch a valid encoding.
  IdentityRecord r = full_record();
  r.hostname = "node-a.clusteX";
  std::string b = encode(r);
  size_t at = b.find("node-a.clusteX");
  ASSERT_NE(at, std::string::npos);
  b[at + 13] = '\x07';
  expect_rejected(b, "hostname contains control character 0x07");

  r = full_record();
  std::string f = encode(r);
  // NaN fraction: find the 8 bytes of 1/3 and overwrite with a NaN pattern.
  double third = 1.0 / 3.0;
  std::string pattern(reinterpret_cast<const char*>(&third), 8);
  size_t pos = f.find(pattern);
  ASSERT_NE(pos, std::string::npos);
  const unsigned char nan_bits[8] = {0, 0, 0, 0, 0, 0, 0xf8, 0x7f};
  std::memcpy(&f[pos], nan_bits, 8);
  expect_rejected(f, "gpu_fraction must be a finite number");
}
