// Who-is-where record of one rank, its compact versioned encoding and a strict decoder for peers' bytes.
//
// Records cross the job through a key-value store that any rank (or anything else that can reach the store)
// can write, so the decoder treats its input as untrusted: every size is bounded, every field validated, and
// anything malformed is rejected with an Error saying what and where, never a crash or a partial record.
// No torch, no CUDA: this file and placement.* build with a bare compiler (the libFuzzer target does that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/error.h"

namespace gpuguard {

// Bounds the decoder enforces (and the encoder refuses to exceed). Generous for real values, small enough
// that a store full of hostile records cannot make a rank allocate much.
struct IdentityLimits {
  static constexpr std::size_t kMaxRecordBytes = 16 * 1024;
  static constexpr std::size_t kMaxGroup = 128;
  static constexpr std::size_t kMaxHostname = 255;         // HOST_NAME_MAX on Linux is 64; FQDNs up to 255
  static constexpr std::size_t kMaxUuid = 80;              // "GPU-" + 36, or "MIG-..." forms
  static constexpr std::size_t kMaxPciBusId = 32;
  static constexpr std::size_t kMaxVisibleDevices = 4096;  // raw CUDA_VISIBLE_DEVICES
  static constexpr std::size_t kMaxLauncher = 64;
  static constexpr std::size_t kMaxFailureKind = 64;
  static constexpr std::size_t kMaxFailureText = 4096;
  static constexpr std::size_t kMaxRayGpuIds = 512;
  static constexpr std::int32_t kMaxWorldSize = 1 << 24;
  static constexpr std::int32_t kMaxDeviceCount = 1 << 16;
  static constexpr double kMaxGpuFraction = 1024.0;
};

// Which host a rank runs on, computed exactly as NCCL's getHostHash() does: DJB2a over the full hostname
// followed by /proc/sys/kernel/random/boot_id, or over $NCCL_HOSTID alone when that is set. Two containers
// on one machine share the boot id but usually not the hostname; NCCL then treats them as different hosts,
// and so does this fingerprint (the GPU UUID is what catches their sharing).
struct HostFingerprint {
  std::string hostname;  // gethostname(), full
  std::string hashed;    // the exact string hashed (hostname + boot id, or NCCL_HOSTID)
  std::uint64_t hash = 0;
  bool from_nccl_hostid = false;
};

// NCCL's string hash (DJB2a: result = result * 33 ^ c, starting at 5381).
std::uint64_t nccl_string_hash(std::string_view text);
// Reads the hostname, NCCL_HOSTID and the boot id of this process's host.
HostFingerprint host_fingerprint();
// The same computation from explicit inputs (tests; boot_id may be empty when the file is unreadable).
HostFingerprint host_fingerprint_from(const std::string& hostname, const char* nccl_hostid,
                                      const std::string& boot_id);

struct IdentityRecord {
  std::string group = "default";
  std::int32_t rank = 0;
  std::int32_t local_rank = -1;        // -1: unknown
  std::int32_t world_size = 1;
  std::int32_t local_world_size = -1;  // -1: unknown
  std::uint64_t host_hash = 0;         // HostFingerprint::hash
  std::string hostname;
  std::string gpu_uuid;                // empty: no GPU bound (CPU rank, or resolution failed)
  std::string pci_bus_id;              // "0000:18:00.0"; empty when unknown
  std::int32_t gpu_index = -1;         // cuda:N in this process; -1 when no GPU
  std::uint32_t pid = 0;
  std::optional<std::string> cuda_visible_devices;  // raw value; nullopt when unset
  std::int32_t visible_device_count = -1;           // devices this process sees; -1 unknown
  std::string launcher;                // "torchrun", "slurm", "ray", ...
  bool multi_rank_gpu_enabled = false; // NCCL_MULTI_RANK_GPU_ENABLE=1 in this rank's environment
  // A rank whose own resolution failed still publishes its record, with the failure, so that the other
  // ranks stop at once and name it instead of waiting for it.
  std::optional<std::string> failure_kind;  // the gpuguard error class, e.g. "RankMappingError"
  std::string failure_text;
  // Ray: the fraction of a GPU the actor was given (1/3 under max_colocate 3), and Ray's GPU ids as text.
  std::optional<double> gpu_fraction;
  std::string ray_gpu_ids;

  bool operator==(const IdentityRecord& other) const = default;
};

// Format version 1: "GGID", version byte, flags (u16), then the fields in declaration order: integers
// little-endian fixed width, strings as u16 length + UTF-8 bytes, the optional fields only when flagged.
constexpr std::uint8_t kIdentityFormatVersion = 1;

// Fails (never truncates silently) when a field is out of range; failure_text alone is cut to its bound.
Result<std::string> encode_identity(const IdentityRecord& record);
// Strict: exact length, known version and flags, bounded UTF-8 strings without control characters,
// ranks and counts in range. The Error's detail says which field and why.
Result<IdentityRecord> decode_identity(std::string_view bytes);
// The checks decode applies to a record, for records built in memory (the encoder uses it).
Status validate_identity(const IdentityRecord& record);

}  // namespace gpuguard
