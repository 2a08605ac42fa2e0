// A small, bounded JSON reader for the cpu blob's plan (backend_cpu_blob.cpp): the
// grammar of Python's json.loads, NaN / Infinity / -Infinity included (the plan is written
// with allow_nan=True), into a flat table of values. Nesting is limited to kMaxDepth (a
// plan needs 5 levels; Python's json stops near its recursion limit, ~1000), so the
// recursion is bounded; the table grows with the text (a
// value takes at least one byte of it). Strict UTF-8 is checked by the caller.
//
// TODO(issue 44): use src/json.h, the runtime's JSON parser, once it lands (it did not
// exist when this was written); this reader keeps Python's int / float distinction that
// blob.py's checks rely on (a dims item of 2.0 is refused) and its NaN tokens.
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
  double d = 0;            // a Float's value (and an Int's, for a list of numbers)
  uint32_t first = 0;      // String: offset into the text pool; Array/Object: into kids
  uint32_t count = 0;      // String: bytes; Array: items; Object: members
};

class Json {
 public:
  static constexpr int kMaxDepth = 512;
  // Parse `text`; false with `error` set ("at byte 12: ...") when it is not JSON.
  bool parse(const char* text, size_t size, std::string* error);

  const JValue& root() const { return values_[0]; }
  const JValue& item(const JValue& array, uint32_t k) const { return values_[kids_[array.first + k]]; }
  // An object's member, or nullptr (the last one of a repeated key, as Python keeps).
  const JValue* member(const JValue& object, const char* key) const;
  std::string str(const JValue& s) const { return pool_.substr(s.first, s.count); }

 private:
  uint32_t value(int depth);
  uint32_t add(const JValue& v);
  void skip_space();
  bool string_into(std::string* out);
  [[noreturn]] void fail(const std::string& what);

  const char* p_ = nullptr;
  const char* end_ = nullptr;
  const char* begin_ = nullptr;
  std::vector<JValue> values_;
  std::vector<uint32_t> kids_;  // Array: item indices; Object: key, value index pairs
  std::string pool_;
};

}  // namespace opforge::rt::cpu
