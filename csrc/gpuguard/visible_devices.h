// CUDA_VISIBLE_DEVICES read by the driver's rules, naming the entries the driver would silently drop.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gpuguard {

// One entry of CUDA_VISIBLE_DEVICES, as the driver reads it.
struct VisibleEntry {
  enum class Kind { kIndex, kUuid, kUuidPrefix, kMig };
  Kind kind = Kind::kIndex;
  std::string text;  // as written, without surrounding blanks
  int index = -1;    // kIndex: the physical ordinal
  std::string uuid;  // kUuid / kUuidPrefix: lowercase, without "GPU-"; kMig: the text after "MIG-"
};

// The first entry the driver stops at. The driver enumerates the entries before it and ignores the rest
// without a word: "0,1,,2" shows two GPUs, "2,2,3" shows one.
struct VisibleDevicesProblem {
  enum class Kind { kEmpty, kMalformed, kDuplicate, kRejected };
  Kind kind = Kind::kMalformed;
  int position = 0;         // 0-based entry number
  std::string entry;        // the entry's text
  int same_as = -1;         // kDuplicate: the earlier entry naming the same GPU
  std::string reason;       // one sentence for the person who wrote the variable
};

struct VisibleDevices {
  bool set = false;          // the variable exists (an empty value hides every GPU)
  std::string raw;
  std::vector<VisibleEntry> entries;  // what the driver honours: the entries before the first problem
  std::optional<VisibleDevicesProblem> problem;
  // "", "-1" and "NoDevFiles" (SLURM without GPUs) are the conventional ways to hide every GPU on purpose.
  bool hides_all_on_purpose = false;

  static const char* kind_name(VisibleEntry::Kind kind);
  static const char* kind_name(VisibleDevicesProblem::Kind kind);
};

// Parses a value of CUDA_VISIBLE_DEVICES; nullptr means unset (every GPU visible). Entries: a device index,
// a full GPU UUID or a unique UUID prefix (with or without "GPU-"), or a MIG device ("MIG-..."); blanks
// around an entry are ignored. Syntax and repetition are checked here; whether an index or UUID exists on
// this host only the driver knows (see find_rejected_entry).
VisibleDevices parse_visible_devices(const char* raw);

// The driver showed `visible_uuids` (its enumeration, in order) for `spec`. When it shows fewer devices than
// the value lists, the entry at that position is the one it rejected: an index beyond this host's GPUs, a UUID
// of no GPU here, an ambiguous prefix, or the same GPU again under another spelling. Returns that problem.
std::optional<VisibleDevicesProblem> find_rejected_entry(const VisibleDevices& spec,
                                                         const std::vector<std::string>& visible_uuids);

}  // namespace gpuguard
