// The cpu plan's JSON reader (backend_cpu_json.h).
#include "backend_cpu_json.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace opforge::rt::cpu {
namespace {
struct JsonFailure {
  std::string what;
};
}  // namespace

void Json::fail(const std::string& what) {
  throw JsonFailure{"at byte " + std::to_string(p_ - begin_) + ": " + what};
}

uint32_t Json::add(const JValue& v) {
  if (values_.size() >= 0xFFFFFFF0u) fail("too many values");
  values_.push_back(v);
  return (uint32_t)values_.size() - 1;
}

void Json::skip_space() {
  while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
}

static void put_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += (char)cp;
  } else if (cp < 0x800) {
    *out += (char)(0xC0 | (cp >> 6));
    *out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += (char)(0xE0 | (cp >> 12));
    *out += (char)(0x80 | ((cp >> 6) & 0x3F));
    *out += (char)(0x80 | (cp & 0x3F));
  } else {
    *out += (char)(0xF0 | (cp >> 18));
    *out += (char)(0x80 | ((cp >> 12) & 0x3F));
    *out += (char)(0x80 | ((cp >> 6) & 0x3F));
    *out += (char)(0x80 | (cp & 0x3F));
  }
}

bool Json::string_into(std::string* out) {
  ++p_;  // the opening quote
  while (true) {
    if (p_ >= end_) fail("an unterminated string");
    unsigned char c = (unsigned char)*p_;
    if (c == '"') {
      ++p_;
      return true;
    }
    if (c < 0x20) fail("a control character in a string");
    if (c != '\\') {
      *out += (char)c;
      ++p_;
      continue;
    }
    if (++p_ >= end_) fail("an unterminated escape");
    char e = *p_++;
    switch (e) {
      case '"': *out += '"'; break;
      case '\\': *out += '\\'; break;
      case '/': *out += '/'; break;
      case 'b': *out += '\b'; break;
      case 'f': *out += '\f'; break;
      case 'n': *out += '\n'; break;
      case 'r': *out += '\r'; break;
      case 't': *out += '\t'; break;
      case 'u': {
        auto hex4 = [&]() {
          if (end_ - p_ < 4) fail("a short \\u escape");
          uint32_t v = 0;
          for (int k = 0; k < 4; ++k) {
            char h = *p_++;
            v <<= 4;
            if (h >= '0' && h <= '9') v |= (uint32_t)(h - '0');
            else if (h >= 'a' && h <= 'f') v |= (uint32_t)(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= (uint32_t)(h - 'A' + 10);
            else fail("a bad \\u escape");
          }
          return v;
        };
        uint32_t cp = hex4();
        // a surrogate pair makes one code point; a lone surrogate is kept (as Python does)
        if (cp >= 0xD800 && cp < 0xDC00 && end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') {
          const char* save = p_;
          p_ += 2;
          uint32_t low = hex4();
          if (low >= 0xDC00 && low < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          else p_ = save;
        }
        put_utf8(out, cp);
        break;
      }
      default: fail("a bad escape");
    }
  }
}

uint32_t Json::value(int depth) {
  if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
  skip_space();
  if (p_ >= end_) fail("a missing value");
  JValue v;
  char c = *p_;
  auto word = [&](const char* w) {
    size_t n = std::strlen(w);
    if ((size_t)(end_ - p_) < n || std::memcmp(p_, w, n) != 0) return false;
    p_ += n;
    return true;
  };
  if (c == '{' || c == '[') {
    const bool object = c == '{';
    ++p_;
    std::vector<uint32_t> kids;
    skip_space();
    if (p_ < end_ && *p_ == (object ? '}' : ']')) {
      ++p_;
    } else {
      while (true) {
        if (object) {
          skip_space();
          if (p_ >= end_ || *p_ != '"') fail("an object key that is not a string");
          std::string key;
          string_into(&key);
          JValue k;
          k.type = JType::String;
          k.first = (uint32_t)pool_.size();
          k.count = (uint32_t)key.size();
          pool_ += key;
          kids.push_back(add(k));
          skip_space();
          if (p_ >= end_ || *p_ != ':') fail("a missing ':'");
          ++p_;
        }
        kids.push_back(value(depth + 1));
        skip_space();
        if (p_ < end_ && *p_ == ',') { ++p_; continue; }
        if (p_ < end_ && *p_ == (object ? '}' : ']')) { ++p_; break; }
        fail(object ? "a missing ',' or '}'" : "a missing ',' or ']'");
      }
    }
    if (kids_.size() + kids.size() >= 0xFFFFFFF0u) fail("too many values");
    v.type = object ? JType::Object : JType::Array;
    v.first = (uint32_t)kids_.size();
    v.count = (uint32_t)(object ? kids.size() / 2 : kids.size());
    kids_.insert(kids_.end(), kids.begin(), kids.end());
  } else if (c == '"') {
    std::string s;
    string_into(&s);
    if (pool_.size() + s.size() >= 0xFFFFFFF0u) fail("too much text");
    v.type = JType::String;
    v.first = (uint32_t)pool_.size();
    v.count = (uint32_t)s.size();
    pool_ += s;
  } else if (word("null")) {
    v.type = JType::Null;
  } else if (word("true")) {
    v.type = JType::Bool;
    v.b = true;
  } else if (word("false")) {
    v.type = JType::Bool;
  } else if (word("NaN")) {
    v.type = JType::Float;
    v.d = std::numeric_limits<double>::quiet_NaN();
  } else if (word("Infinity")) {
    v.type = JType::Float;
    v.d = std::numeric_limits<double>::infinity();
  } else if (word("-Infinity")) {
    v.type = JType::Float;
    v.d = -std::numeric_limits<double>::infinity();
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const char* start = p_;
    if (*p_ == '-') ++p_;
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("a bad number");
    if (*p_ == '0') ++p_;
    else while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    bool is_float = false;
    if (p_ < end_ && *p_ == '.') {
      is_float = true;
      ++p_;
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("a bad number");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      is_float = true;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("a bad number");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    std::string text(start, p_);
    v.d = std::strtod(text.c_str(), nullptr);
    if (is_float) {
      v.type = JType::Float;
    } else {
      v.type = JType::Int;
      errno = 0;
      long long x = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) v.big = true;
      v.i = (int64_t)x;
    }
  } else {
    fail("an unexpected character");
  }
  return add(v);
}

bool Json::parse(const char* text, size_t size, std::string* error) {
  begin_ = p_ = text;
  end_ = text + size;
  values_.clear();
  kids_.clear();
  pool_.clear();
  values_.reserve(1);
  values_.push_back(JValue{});  // the root's slot, filled below
  try {
    uint32_t root = value(0);
    skip_space();
    if (p_ != end_) fail("extra data after the value");
    values_[0] = values_[root];
    return true;
  } catch (const JsonFailure& f) {
    *error = f.what;
    return false;
  }
}

const JValue* Json::member(const JValue& object, const char* key) const {
  if (object.type != JType::Object) return nullptr;
  const JValue* found = nullptr;
  size_t n = std::strlen(key);
  for (uint32_t k = 0; k < object.count; ++k) {
    const JValue& name = values_[kids_[object.first + 2 * k]];
    if (name.count == n && pool_.compare(name.first, n, key) == 0) found = &values_[kids_[object.first + 2 * k + 1]];
  }
  return found;
}

}  // namespace opforge::rt::cpu
