// The fake topology's JSON as a tree with throwing accessors, read by the core's strict reader
// (csrc/gpuguard/json_value.h): the fakes parse no JSON of their own.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpuguard/json_value.h"

namespace gpuguard_fake {

struct Json {
  using Kind = gpuguard::JsonValue::Kind;
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  // a string's value, or a number as written
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool has(const std::string& key) const { return kind == Kind::Object && object.count(key) != 0; }
  const Json& at(const std::string& key) const {
    auto it = object.find(key);
    if (kind != Kind::Object || it == object.end()) throw std::runtime_error("missing key \"" + key + "\"");
    return it->second;
  }
  const std::string& as_string(const char* what) const {
    if (kind != Kind::String) throw std::runtime_error(std::string(what) + " must be a string");
    return text;
  }
  long long as_int(const char* what) const {
    gpuguard::JsonValue v;
    v.kind = kind;
    v.text = text;
    auto n = kind == Kind::Number ? v.as_int() : std::nullopt;
    if (!n) throw std::runtime_error(std::string(what) + " must be an integer");
    return *n;
  }
  bool as_bool(const char* what) const {
    if (kind != Kind::Bool) throw std::runtime_error(std::string(what) + " must be true or false");
    return boolean;
  }
};

inline Json to_json(const gpuguard::JsonValue& v) {
  Json out;
  out.kind = v.kind;
  out.boolean = v.boolean;
  out.text = v.text;
  for (const auto& item : v.items) out.array.push_back(to_json(item));
  for (const auto& [key, member] : v.members) out.object.emplace(key, to_json(member));
  return out;
}

// Throws std::runtime_error naming what is wrong and where.
inline Json parse_json(const std::string& text) {
  auto parsed = gpuguard::parse_json(text);
  if (!parsed) throw std::runtime_error(parsed.error().detail);
  return to_json(parsed.value());
}

}  // namespace gpuguard_fake
