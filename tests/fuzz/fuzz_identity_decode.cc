// libFuzzer target: the identity-record decoder and the placement analysis must survive any bytes a peer
// (or anything else with access to the store) can write. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "gpuguard/identity.h"
#include "gpuguard/placement.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  // Several records per input, separated by a byte that cannot start a record ('|'), so that the analysis
  // sees groups of hostile-but-valid records too.
  std::vector<gpuguard::IdentityRecord> records;
  std::size_t start = 0;
  while (start <= input.size() && records.size() < 64) {
    std::size_t bar = input.find('|', start);
    std::string_view piece = input.substr(start, bar == std::string_view::npos ? std::string_view::npos : bar - start);
    auto decoded = gpuguard::decode_identity(piece);
    if (decoded.ok()) {
      // Whatever decodes must encode again to exactly the same bytes (the format has one spelling).
      auto again = gpuguard::encode_identity(decoded.value());
      if (!again.ok() || again.value() != piece) std::abort();
      records.push_back(std::move(decoded).value());
    } else if (decoded.error().detail.empty()) {
      std::abort();  // every rejection must say why
    }
    if (bar == std::string_view::npos) break;
    start = bar + 1;
  }
  auto report = gpuguard::analyze_placement(records);
  if (report.severity != gpuguard::PlacementReport::Severity::kOk && report.message.empty()) std::abort();
  return 0;
}
