// The JSON topology that drives the fake CUDA driver and fake NCCL (see README.md in this folder).
#pragma once

#include <string>
#include <vector>

namespace gpuguard_fake {

// A process with a compute context on a GPU that is not one of the test's own (a leftover run, another user's
// job): what the fake NVML lists besides the contexts the fake driver's processes hold.
struct FakeProcess {
  unsigned int pid = 0;
  long long used_mib = 0;  // -1: NVML_VALUE_NOT_AVAILABLE
};

struct FakeGpu {
  std::string name;
  std::string uuid;        // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  unsigned char uuid_bytes[16] = {0};
  std::string pci_bus_id;  // "0000:18:00.0"
  int pci_domain = 0, pci_bus = 0, pci_device = 0;
  long long memory_mib = 0;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  // MIG: a GPU with MIG enabled lists its instances (each a CUDA device of its own, "MIG-<uuid>"); an instance
  // carries its parent's PCI bus id and, in parent_uuid_bytes, the parent's UUID (legacy cuDeviceGetUuid).
  std::vector<FakeGpu> mig;
  bool is_mig = false;
  unsigned char parent_uuid_bytes[16] = {0};
  std::vector<FakeProcess> processes;  // "processes": other programs' contexts on this GPU (or MIG instance)
};

struct Topology {
  int driver_version = 13000;
  std::vector<FakeGpu> gpus;
  std::vector<std::vector<bool>> peer_access;  // [i][j]: cuDeviceCanAccessPeer(i, j)
  bool peer_copy_drops_writes = false;         // capability says yes, but peer writes are lost (ACS/IOMMU)
  int nccl_version = 22809;
  std::string nccl_behavior = "ok";  // ok | duplicate | hang | hang_unless_p2p_disabled | hang_all_reduce
  long long context_mib = 414;      // what one primary context of the fake driver holds on its GPU (for NVML)
  long long nvml_reserved_mib = 0;  // what NVML says the driver reserves on each GPU
  std::string nvml_driver_version = "580.82.07";
};

// $GPUGUARD_FAKE_GPU_STATE_DIR: where the fake driver's processes record their contexts for the fake NVML (one
// file <dir>/<device uuid>/<pid> holding the bytes in use); empty when unset (then nothing is recorded).
std::string gpu_state_dir();

// Reads $GPUGUARD_FAKE_TOPOLOGY. Throws std::runtime_error naming the file and the problem.
Topology load_topology();
Topology parse_topology(const std::string& text);

}  // namespace gpuguard_fake
