// The debug table's checks (debug_table.h), rule for rule those of debug.py's _checked:
// bounded text, JSON, a version-1 header, per method the five lists (sources, ops, nodes,
// captures, delegates) with their types, lengths, string caps and index columns.
#include "debug_table.h"

#include <unordered_map>
#include <vector>

#include "json.h"
#include "program_text.h"

namespace opforge::rt {
namespace {

using json::Document;
using json::Kind;
using json::Node;

constexpr size_t kMaxText = size_t(64) << 20;   // characters
constexpr uint32_t kMaxEntries = 1u << 22;      // items of a list
constexpr uint32_t kMaxString = 4096;           // characters of a name, op or source

[[noreturn]] void fail(const std::string& subject, const std::string& found,
                       const std::string& valid) {
  throw ProgramError{"`opforge.program.debug_info()`: user_metadata['opforge.debug'] " + subject +
                     " — found " + found + " — valid: " + valid +
                     " — fix: re-export the program, or drop the table with "
                     "opforge.program.strip_debug_handles"};
}

const char* type_name(const Node& n) {
  switch (n.kind) {
    case Kind::Null: return "NoneType";
    case Kind::False: case Kind::True: return "bool";
    case Kind::Int: case Kind::BigInt: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return "list";
    case Kind::Object: return "dict";
  }
  return "?";
}

class Checker {
 public:
  Checker(const Program& p, const Document& d) : p_(p), d_(d) {}

  // _list: a JSON array of at most kMaxEntries items (a missing member is None).
  const Node& list(int64_t index, const std::string& what) {
    if (index < 0) fail(what, "NoneType", "a list of at most 4194304 items");
    const Node& n = d_.at(static_cast<uint32_t>(index));
    if (n.kind != Kind::Array || n.count > kMaxEntries) {
      fail(what, type_name(n), "a list of at most 4194304 items");
    }
    return n;
  }

  // _column: items first, first + stride, ... of list n: every one an int in [lo, hi).
  void column(const std::string& what, const Node& n, uint32_t first, uint32_t stride,
              int64_t lo, int64_t hi, std::vector<int64_t>* out = nullptr) {
    bool any = false;
    int64_t min = 0, max = 0;
    bool big = false;
    for (uint32_t k = first; k < n.count; k += stride) {
      const Node& x = d_.at(d_.kid(n, k));
      if (x.kind != Kind::Int && x.kind != Kind::BigInt) fail(what, type_name(x), "integers");
      if (x.kind == Kind::BigInt) { big = true; continue; }
      if (!any || x.i < min) min = x.i;
      if (!any || x.i > max) max = x.i;
      any = true;
      if (out) out->push_back(x.i);
    }
    if (big || (any && (min < lo || max >= hi))) {
      fail(what, big ? "an integer outside int64" : std::to_string(min < lo ? min : max),
           hi > lo ? std::to_string(lo) + ".." + std::to_string(hi - 1)
                   : "none (nothing to index)");
    }
  }

  void strings(const std::string& what, const Node& n, uint32_t first, uint32_t stride,
               const char* found) {
    for (uint32_t k = first; k < n.count; k += stride) {
      const Node& s = d_.at(d_.kid(n, k));
      if (s.kind != Kind::String || s.count > kMaxString) {
        fail(what, found, "strings of at most 4096");
      }
    }
  }

  void method(const Method& m, const Node& entry, const std::string& where) {
    if (entry.kind != Kind::Object) {
      fail(where, "not an object", "{\"sources\", \"ops\", \"nodes\", \"captures\", \"delegates\"}");
    }
    const Node& sources = list(d_.member(entry, "sources"), where + " sources");
    const Node& ops = list(d_.member(entry, "ops"), where + " ops");
    strings(where + " sources", sources, 0, 1, "a long or non-string item");
    strings(where + " ops", ops, 0, 1, "a long or non-string item");
    const Node& flat = list(d_.member(entry, "nodes"), where + " nodes");
    if (flat.count % 3) {
      fail(where + " nodes", std::to_string(flat.count) + " items", "3 per node: name, op, source");
    }
    strings(where + " nodes", flat, 0, 3, "a name that is long or not a string");
    column(where + " nodes (op)", flat, 1, 3, 0, ops.count);
    column(where + " nodes (source)", flat, 2, 3, -1, sources.count);
    const int64_t count = flat.count / 3;
    const Node& c = list(d_.member(entry, "captures"), where + " captures");
    if (c.count % 4) {
      fail(where + " captures", std::to_string(c.count) + " items",
           "4 per capture: instruction, value, node, item");
    }
    column(where + " captures (instruction)", c, 0, 4, 0, int64_t(m.instructions.size()));
    std::vector<int64_t> values;
    column(where + " captures (value)", c, 1, 4, 0, int64_t(m.values.size()), &values);
    column(where + " captures (node)", c, 2, 4, 0, count);
    column(where + " captures (item)", c, 3, 4, 0, int64_t(1) << 16);
    for (int64_t v : values) {
      if (m.values[v].tag != ValueTag::Tensor) {
        fail(where + " captures (value)", "value " + std::to_string(v) + ", not a tensor",
             "a tensor value");
      }
    }
    const Node& delegates = list(d_.member(entry, "delegates"), where + " delegates");
    for (uint32_t i = 0; i < delegates.count; ++i) {
      const std::string subject = where + " delegates[" + std::to_string(i) + "]";
      const Node& d = d_.at(d_.kid(delegates, i));
      if (d.kind != Kind::Array || d.count != 2) {
        fail(subject, "something else", "[delegate, [[node, ...], ...]]");
      }
      column(subject + " delegate", d, 0, 2, 0, int64_t(p_.delegates.size()));
      const Node& per_op = list(d_.kid(d, 1), subject + " ops");
      for (uint32_t k = 0; k < per_op.count; ++k) {
        const std::string at = subject + " ops[" + std::to_string(k) + "]";
        column(at, list(d_.kid(per_op, k), at), 0, 1, 0, count);
      }
    }
  }

 private:
  const Program& p_;
  const Document& d_;
};

}  // namespace

void check_debug_table(const Program& program, const std::string& text) {
  if (utf8_length(text) > kMaxText) {
    fail("the text", std::to_string(utf8_length(text)) + " characters", "at most 67108864");
  }
  Document doc;
  std::string error;
  if (!json::parse(text, &doc, &error)) {
    fail("the text", "not JSON (" + error + ")", "the table export writes");
  }
  const Node& root = doc.at(0);
  bool ok = root.kind == Kind::Object;
  if (ok) {
    // doc.get("version") != 1 in Python: 1, 1.0 and true all equal 1
    int64_t version = doc.member(root, "version");
    const Node* v = version >= 0 ? &doc.at(static_cast<uint32_t>(version)) : nullptr;
    ok = v && ((v->kind == Kind::Int && v->i == 1) || (v->kind == Kind::Float && v->d == 1.0) ||
               v->kind == Kind::True);
    int64_t methods = doc.member(root, "methods");
    ok = ok && methods >= 0 && doc.at(static_cast<uint32_t>(methods)).kind == Kind::Object;
  }
  if (!ok) fail("the header", "no version 1 table", "{\"version\": 1, \"methods\": {...}}");
  const Node& methods = doc.at(static_cast<uint32_t>(doc.member(root, "methods")));
  std::unordered_map<std::string, const Method*> by_name;
  for (const Method& m : program.methods) by_name[m.name] = &m;
  // each key once, with its last value (a Python dict built from the object)
  std::unordered_map<std::string, uint32_t> last;
  for (uint32_t k = 0; k < methods.count; ++k) {
    last[doc.str(doc.at(doc.kid(methods, 2 * k)))] = doc.kid(methods, 2 * k + 1);
  }
  Checker checker(program, doc);
  for (uint32_t k = 0; k < methods.count; ++k) {
    const std::string name = doc.str(doc.at(doc.kid(methods, 2 * k)));
    if (last[name] != doc.kid(methods, 2 * k + 1)) continue;  // a later duplicate wins
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      fail("method " + quoted(name.substr(0, 60)), "not a method of the program",
           "the program's methods");
    }
    checker.method(*it->second, doc.at(last[name]), "method " + quoted(name));
  }
}

}  // namespace opforge::rt
