// A strict, bounded JSON reader for text gpuguard does not trust (torch's flight recorder dumps): depth and size
// limits, numbers kept as their text so that 64-bit integers survive, errors that name the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/error.h"

namespace gpuguard {

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;                          // a string's value, or a number as written
  std::vector<JsonValue> items;              // an array's
  std::map<std::string, JsonValue> members;  // an object's (a repeated key keeps the last value)

  // The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* find(std::string_view key) const;
  // An integer written as a number or as a decimal string (torch writes some counters as strings); nullopt for
  // anything else, a fraction, or a value outside int64.
  std::optional<std::int64_t> as_int() const;
  // A string's value, or nullopt.
  std::optional<std::string_view> as_string() const;
};

struct JsonLimits {
  std::size_t max_bytes = 64u << 20;
  int max_depth = 64;
};

// Parses one JSON document; an Error names what is wrong and where (call "json").
Result<JsonValue> parse_json(std::string_view text, JsonLimits limits = {});

}  // namespace gpuguard
