// Duplicate-device detection over identity records: which ranks of one group share a GPU, the likely
// cause, the fix, and the report every rank raises. No torch, no CUDA (the fuzz target links it bare).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpuguard/identity.h"

namespace gpuguard {

// What the analysis knows beyond the records it is given. The cross-rank exchange hands over a bounded
// sample (the ranks on shared devices, capped), so the true totals come separately; when a total is
// missing it is counted from the records.
struct PlacementContext {
  std::map<std::string, int> device_rank_totals;  // GPU UUID -> ranks of the group on it
  std::map<std::uint64_t, int> host_rank_totals;  // host hash -> ranks of the group on that host
  int shared_devices_total = -1;                  // shared devices in the job; -1: count from records
  int ranks_sharing_total = -1;                   // ranks on shared devices in the job; -1: count
};

// Machine-readable causes (stable names; tests and `gpuguard explain` use them).
enum class PlacementCause {
  kSameVisibleDevices,    // every rank on the device was given one CUDA_VISIBLE_DEVICES value
  kAllOnDeviceZero,       // ranks sit on cuda:0 of a host that shows more GPUs: set_device missing
  kMoreRanksThanGpus,     // more ranks on a host than it has GPUs
  kFractionalRayGpus,     // Ray actors given a fraction of a GPU (max_colocate > 1)
  kGlobalRankAsLocal,     // local rank equals the global rank past the first node
  kContainersShareGpu,    // different hosts (hostnames) report the same GPU UUID
  kLaunchersShareHost,    // several launcher agents on one host, each handing out the same local ranks
  kMigInstancesOfOneGpu,  // ranks on different MIG instances of one GPU: distinct devices (a warning, not an error)
};
// How many causes there are: keep it the last one's value + 1 (the bindings read names back through it).
constexpr int kPlacementCauseCount = static_cast<int>(PlacementCause::kMigInstancesOfOneGpu) + 1;
const char* placement_cause_name(PlacementCause cause);

struct SharedDevice {
  std::string group;
  std::string gpu_uuid;
  std::string pci_bus_id;
  int total_ranks = 0;                 // may exceed ranks.size() when the exchange capped the sample
  std::vector<IdentityRecord> ranks;   // sorted by rank
  std::vector<PlacementCause> causes;
  bool warning_only = false;           // not a shared device: different MIG instances of one GPU (gpu_uuid
                                       // empty, pci_bus_id the GPU's, ranks one or more per instance)
};

struct PlacementReport {
  enum class Severity { kOk, kWarning, kError };
  Severity severity = Severity::kOk;
  std::vector<SharedDevice> shared;    // ordered by lowest rank
  int shared_devices_total = 0;
  int ranks_sharing_total = 0;
  std::vector<PlacementCause> causes;  // union over the shared devices, in order of first appearance
  std::string message;                 // the full report; empty when severity is kOk

  const char* severity_name() const;
};

// Groups records by (group, GPU UUID); sharing across different groups is allowed and not reported.
// Records without a GPU, or with a failure, take no part; a record given twice counts once. Ranks of a group
// on different MIG instances ("MIG-..." UUIDs) of one GPU (same host, same PCI bus id) are reported as a
// warning: distinct devices, which NCCL refuses (<= 2.29 compares PCI bus ids; >= 2.30 the GPU's UUID, unless
// NCCL_MULTI_RANK_GPU_ENABLE=1).
// Ranks on one device (GPU or MIG instance) are an error even with NCCL_MULTI_RANK_GPU_ENABLE=1, which
// only switches NCCL's own check off.
PlacementReport analyze_placement(const std::vector<IdentityRecord>& records, const PlacementContext& context = {});

// How many devices and ranks per device the report lists before summarising the rest.
constexpr int kReportMaxDevices = 16;
constexpr int kReportMaxRanksPerDevice = 16;

}  // namespace gpuguard
