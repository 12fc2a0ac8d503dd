// A small strict JSON reader for the fake libraries' topology files (test fixtures; no dependencies).
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpuguard_fake {

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
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
    return string;
  }
  long long as_int(const char* what) const {
    if (kind != Kind::Number || number != static_cast<double>(static_cast<long long>(number))) {
      throw std::runtime_error(std::string(what) + " must be an integer");
    }
    return static_cast<long long>(number);
  }
  bool as_bool(const char* what) const {
    if (kind != Kind::Bool) throw std::runtime_error(std::string(what) + " must be true or false");
    return boolean;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  Json parse() {
    Json v = value(0);
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool eat(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }
  Json value(int depth) {
    if (depth > 64) fail("nesting too deep");
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      v.kind = Json::Kind::Object;
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      while (true) {
        skip();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a key");
        std::string key = str();
        skip();
        if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':'");
        ++i_;
        v.object[key] = value(depth + 1);
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::Array;
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      while (true) {
        v.array.push_back(value(depth + 1));
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::String;
      v.string = str();
      return v;
    }
    if (eat("true")) {
      v.kind = Json::Kind::Bool;
      v.boolean = true;
      return v;
    }
    if (eat("false")) {
      v.kind = Json::Kind::Bool;
      return v;
    }
    if (eat("null")) return v;
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    while (i_ < s_.size() && (isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == 'e' ||
                              s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      ++i_;
    }
    if (start == i_) fail("unexpected character");
    v.kind = Json::Kind::Number;
    try {
      size_t used = 0;
      v.number = std::stod(s_.substr(start, i_ - start), &used);
      if (used != i_ - start) fail("bad number");
    } catch (const std::logic_error&) {
      fail("bad number");
    }
    return v;
  }
  std::string str() {
    ++i_;  // opening quote
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("bad escape");
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
          if (i_ + 4 > s_.size()) fail("bad \\u escape");
          unsigned code = static_cast<unsigned>(std::stoul(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace gpuguard_fake
