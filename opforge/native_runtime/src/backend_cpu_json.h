// The cpu blob's plan as JSON values (backend_cpu_blob.cpp): the runtime's bounded,
// iterative JSON reader (json.h: exactly what Python's json.loads accepts, NaN / Infinity /
// -Infinity included, nesting capped at 512 where Python stops near 990) seen through
// the few accessors the plan checks use, with Python's int / float / bool distinction
// that blob.py's checks rely on (a dims item of 2.0 or true is refused).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opforge::rt::cpu {

enum class JType : uint8_t { Null, Bool, Int, Float, String, Array, Object };

struct JValue {
  JType type = JType::Null;
  bool big = false;        // an Int outside int64 (Python keeps it; every check refuses it)
  bool b = false;
  int64_t i = 0;
  double d = 0;            // a Float's value
  uint32_t first = 0;      // String: offset into the text pool; Array/Object: into kids
  uint32_t count = 0;      // String: bytes; Array: items; Object: members
};

class Json {
 public:
  // Parse `text` (valid UTF-8); false with `error` set when json.loads would raise.
  bool parse(const char* text, size_t size, std::string* error);

  const JValue& root() const { return values_[0]; }
  const JValue& item(const JValue& array, uint32_t k) const { return values_[kids_[array.first + k]]; }
  // An object's member, or nullptr (the last one of a repeated key, as Python keeps).
  const JValue* member(const JValue& object, const char* key) const;
  std::string str(const JValue& s) const { return pool_.substr(s.first, s.count); }

 private:
  std::vector<JValue> values_;
  std::vector<uint32_t> kids_;  // Array: item indices; Object: key, value index pairs
  std::string pool_;
};

}  // namespace opforge::rt::cpu
