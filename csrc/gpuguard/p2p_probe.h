// A real GPU-to-GPU copy, verified byte for byte: cuDeviceCanAccessPeer is known to say yes on machines where
// ACS or the IOMMU silently drop peer writes, which is what leaves NCCL hanging on its first collective.
#pragma once

#include <cstddef>
#include <string>

#include "gpuguard/error.h"

namespace gpuguard {

struct PeerCopyResult {
  int src = 0;                   // visible device ordinals
  int dst = 0;
  std::size_t bytes = 0;
  bool peer_access_reported = false;  // what cuDeviceCanAccessPeer(dst, src) said
  bool peer_access_enabled = false;   // peer access was enabled, so the copy took the direct peer path
  bool verified = false;              // the destination holds exactly what the source held
  std::size_t mismatched_bytes = 0;   // how many destination bytes differ from the source
  std::size_t first_mismatch = 0;     // offset of the first differing byte (meaningful when mismatched_bytes > 0)
  bool destination_unchanged = false; // every destination byte still holds what was there before the copy
  double copy_milliseconds = 0.0;     // cuMemcpyPeer + synchronisation
};

// Copies `bytes` from device `src` to device `dst` through cuMemcpyPeer, with peer access enabled where the
// driver reports it (otherwise the driver stages the copy through host memory, which tests nothing about P2P),
// and compares the destination with the source pattern. An Error names the failing driver call. Never hangs on
// its own account, but a broken driver can: run it in a child process under a deadline (gpuguard doctor does).
Result<PeerCopyResult> peer_copy_probe(int src, int dst, std::size_t bytes);

// The byte written at `offset` for the pair (src, dst): distinct per pair and per offset, never the filler the
// destination starts with, so a stale or dropped copy cannot pass for a good one.
unsigned char peer_copy_pattern(int src, int dst, std::size_t offset);
unsigned char peer_copy_filler(int src, int dst, std::size_t offset);

}  // namespace gpuguard
