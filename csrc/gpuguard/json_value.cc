// The strict, bounded JSON reader (see json_value.h).
#include "gpuguard/json_value.h"

#include <charconv>

namespace gpuguard {
namespace {

class Reader {
 public:
  Reader(std::string_view s, JsonLimits limits) : s_(s), limits_(limits) {}

  Result<JsonValue> document() {
    if (s_.size() > limits_.max_bytes)
      return gpuguard_error("json", "the text is " + std::to_string(s_.size()) + " bytes, over the limit of " +
                                        std::to_string(limits_.max_bytes));
    JsonValue v;
    if (!value(v, 0)) return failure();
    skip();
    if (i_ != s_.size()) {
      what_ = "text after the value";
      return failure();
    }
    return v;
  }

 private:
  Error failure() const { return gpuguard_error("json", what_ + " at offset " + std::to_string(i_)); }
  bool fail(const char* what) {
    what_ = what;
    return false;
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return fail("an unknown word");
    i_ += w.size();
    return true;
  }

  bool value(JsonValue& v, int depth) {
    if (depth > limits_.max_depth) return fail("nesting deeper than the limit");
    skip();
    if (i_ >= s_.size()) return fail("the text ends where a value should be");
    char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.kind = JsonValue::Kind::String;
      return string(v.text);
    }
    if (c == 't' || c == 'f') {
      v.kind = JsonValue::Kind::Bool;
      v.boolean = c == 't';
      return word(c == 't' ? "true" : "false");
    }
    if (c == 'n') return word("null");
    return number(v);
  }

  bool object(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::Object;
    ++i_;
    skip();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      skip();
      if (i_ >= s_.size() || s_[i_] != '"') return fail("an object key must be a string");
      std::string key;
      if (!string(key)) return false;
      skip();
      if (i_ >= s_.size() || s_[i_] != ':') return fail("':' expected after an object key");
      ++i_;
      JsonValue member;
      if (!value(member, depth + 1)) return false;
      v.members[std::move(key)] = std::move(member);
      skip();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      return fail("',' or '}' expected in an object");
    }
  }

  bool array(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::Array;
    ++i_;
    skip();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      JsonValue item;
      if (!value(item, depth + 1)) return false;
      v.items.push_back(std::move(item));
      skip();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      return fail("',' or ']' expected in an array");
    }
  }

  bool hex4(unsigned& out) {
    if (i_ + 4 > s_.size()) return fail("a \\u escape needs four hex digits");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      out <<= 4;
      if (h >= '0' && h <= '9') out |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') out |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') out |= static_cast<unsigned>(h - 'A' + 10);
      else return fail("a \\u escape needs four hex digits");
    }
    return true;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool string(std::string& out) {
    ++i_;  // the opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {  // a surrogate pair
            i_ += 2;
            unsigned low = 0;
            if (!hex4(low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return fail("a high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default:
          return fail("an unknown escape in a string");
      }
    }
    return fail("a string that never ends");
  }

  bool number(JsonValue& v) {
    std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    std::size_t digits = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    if (i_ == digits) return fail("not a JSON value");
    if (s_[digits] == '0' && i_ - digits > 1) return fail("a number with a leading zero");
    if (i_ < s_.size() && s_[i_] == '.') {
      std::size_t frac = ++i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == frac) return fail("a number with nothing after its '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      std::size_t exp = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == exp) return fail("a number with an empty exponent");
    }
    v.kind = JsonValue::Kind::Number;
    v.text = std::string(s_.substr(start, i_ - start));
    return true;
  }

  std::string_view s_;
  JsonLimits limits_;
  std::size_t i_ = 0;
  std::string what_;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  if (kind != Kind::Object) return nullptr;
  auto it = members.find(std::string(key));
  return it == members.end() ? nullptr : &it->second;
}

std::optional<std::int64_t> JsonValue::as_int() const {
  if (kind != Kind::Number && kind != Kind::String) return std::nullopt;
  std::int64_t out = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return out;
}

std::optional<std::string_view> JsonValue::as_string() const {
  if (kind != Kind::String) return std::nullopt;
  return std::string_view(text);
}

Result<JsonValue> parse_json(std::string_view text, JsonLimits limits) { return Reader(text, limits).document(); }

}  // namespace gpuguard
