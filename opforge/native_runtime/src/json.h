// A small, bounded JSON reader for the program's user-metadata tables (the debug table).
//
// It accepts exactly what Python's json.loads accepts (NaN, Infinity and -Infinity
// included, lone \uD800-style surrogates kept), so the native verifier refuses a table when
// and only when opforge.program does: the one exception is nesting, capped at
// kMaxJsonDepth where Python stops at its recursion limit (about 990 levels). The parser is
// iterative (no recursion at all) and builds a flat node array: memory is linear in the
// text (at most ~20 bytes per input byte), work is linear too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace opforge::rt::json {

constexpr int kMaxJsonDepth = 512;

enum class Kind : uint8_t { Null, False, True, Int, BigInt, Float, String, Array, Object };

struct Node {
  Kind kind = Kind::Null;
  uint32_t count = 0;   // Array: items; Object: members; String: code points
  uint32_t first = 0;   // Array/Object: index into Document::kids (an object's kids are
                        // key, value pairs: the key a String node); String: offset into text
  uint32_t length = 0;  // String: bytes (decoded; lone surrogates as 3-byte sequences)
  int64_t i = 0;        // Int
  double d = 0.0;       // Float
};

struct Document {
  std::vector<Node> nodes;   // nodes[0] is the root
  std::vector<uint32_t> kids;
  std::string text;          // decoded strings, back to back

  const Node& at(uint32_t i) const { return nodes[i]; }
  uint32_t kid(const Node& n, uint32_t k) const { return kids[n.first + k]; }
  std::string str(const Node& n) const { return text.substr(n.first, n.length); }
  // The value of `key` in object `n` (the last one, as Python's dict keeps), or -1.
  int64_t member(const Node& n, const std::string& key) const;
};

// Parses `text` (valid UTF-8); false with *error set when Python's json.loads would raise.
bool parse(const std::string& text, Document* doc, std::string* error);

}  // namespace opforge::rt::json
