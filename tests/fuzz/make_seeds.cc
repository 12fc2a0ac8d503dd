// Writes a seed corpus for fuzz_identity_decode: valid records (alone and several per input, sharing a GPU).
#include <cstdio>
#include <fstream>
#include <string>

#include "gpuguard/identity.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::string dir = argv[1];
  gpuguard::IdentityRecord r;
  r.world_size = 4;
  r.local_world_size = 4;
  r.hostname = "node-a";
  r.host_hash = 42;
  r.gpu_uuid = "GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60";
  r.pci_bus_id = "0000:18:00.0";
  r.gpu_index = 0;
  r.visible_device_count = 1;
  r.launcher = "torchrun";
  std::string shared;
  for (int rank = 0; rank < 4; ++rank) {
    r.rank = rank;
    r.local_rank = rank;
    r.cuda_visible_devices = rank % 2 ? std::optional<std::string>("0") : std::nullopt;
    if (rank == 3) {
      r.gpu_fraction = 0.25;
      r.ray_gpu_ids = "['0']";
      r.failure_kind = "RankMappingError";
      r.failure_text = "local rank 3\nbut 1 GPU";
    }
    auto bytes = gpuguard::encode_identity(r);
    if (!bytes.ok()) return 1;
    std::ofstream(dir + "/record" + std::to_string(rank), std::ios::binary) << bytes.value();
    shared += (shared.empty() ? "" : "|") + bytes.value();
  }
  std::ofstream(dir + "/shared4", std::ios::binary) << shared;
  return 0;
}
