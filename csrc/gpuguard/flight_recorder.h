// torch's flight recorder as the watchdog reads it: the C interface gpuguard._libtorch fills in (it links LibTorch;
// the core does not), and the parts of a dump that decide a stall (each group's status, the recorded collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/error.h"

extern "C" {
// Plain C across the two compiled modules: they may be built with different C++ standard library ABIs.
typedef void (*gpuguard_text_sink)(void* context, const char* data, size_t size);
struct gpuguard_flight_recorder_reader {
  int abi_version;  // gpuguard::kFlightRecorderReaderAbi
  // Writes the dump of `source` ("gloo", "nccl", a hooked backend's name) as JSON to sink and returns 0; with
  // include_collectives == 0 only the groups' status and configuration. On failure returns nonzero and writes
  // the reason instead. Takes no GIL: callable from any thread.
  int (*read)(const char* source, int include_collectives, gpuguard_text_sink sink, void* context);
};
}

namespace gpuguard {

inline constexpr int kFlightRecorderReaderAbi = 1;
inline constexpr const char* kFlightRecorderCapsuleName = "gpuguard.flight_recorder_reader";

// One process group's progress as torch keeps it (pg_status): sequence numbers of its collectives.
struct RecordedGroupStatus {
  std::string name;              // torch's group name (the same on every rank), e.g. "0" for the default group
  std::int64_t enqueued = 0;     // last_enqueued_collective
  std::int64_t started = -1;     // last_started_collective (-1: not tracked, e.g. gloo)
  std::int64_t completed = 0;    // last_completed_collective
};

// One recorded collective (an entry of the dump).
struct RecordedCollective {
  std::string group, desc;       // process_group: (name, description)
  std::int64_t seq = 0;          // collective_seq_id
  std::string op;                // ALL_REDUCE (profiling_name "gloo:all_reduce" without its backend)
  std::string sizes;             // float32[4], as the wrappers describe a tensor
  std::string state;             // scheduled | started | completed
  bool retired = false;
  bool p2p = false;
  std::int64_t created_ns = 0;   // wall clock, ns since the epoch
  std::string thread_id;         // the issuing thread (decimal pthread id, as torch writes it)
  std::string thread_name;
};

struct FlightRecorderDump {
  std::string version;
  std::vector<RecordedGroupStatus> groups;
  std::vector<RecordedCollective> collectives;  // empty unless read with include_collectives
};

// Strict: an Error naming what is missing or malformed (the dump is text from another library).
Result<FlightRecorderDump> parse_flight_recorder_dump(std::string_view json);

// The C reader as a C++ call: (source, include_collectives) -> the JSON text.
using FlightRecorderRead = std::function<Result<std::string>(const std::string& source, bool include_collectives)>;
FlightRecorderRead flight_recorder_read(const gpuguard_flight_recorder_reader* reader);

// "float32[4]" for one input, "list[2] of float32[4]" for several (torch's dtype names: Float, BFloat16, ...).
std::string describe_recorded_sizes(const std::vector<std::vector<std::int64_t>>& sizes,
                                    const std::vector<std::string>& dtypes);

}  // namespace gpuguard
