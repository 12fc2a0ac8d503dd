// libFuzzer target: the watchdog's reading of torch's flight recorder dump (the strict JSON reader under it) on
// arbitrary bytes: no crash, no unbounded recursion, and a dump it accepts has sane counters and sizes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "gpuguard/flight_recorder.h"
#include "gpuguard/json_value.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto json = gpuguard::parse_json(text, {1u << 20, 32});
  if (!json && json.error().message().find("at offset") == std::string::npos &&
      json.error().message().find("over the limit") == std::string::npos)
    std::abort();  // every refusal names where or why
  auto dump = gpuguard::parse_flight_recorder_dump(text);
  if (dump) {
    for (const auto& c : dump.value().collectives)
      if (c.sizes.size() > 4096) std::abort();  // describe_recorded_sizes stays one short phrase
  }
  return 0;
}
