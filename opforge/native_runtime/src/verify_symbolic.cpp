// The verifier's checks of a method's symbolic part (format versions 3 and 4): symbols,
// symbolic values, guards, growing tensors, the binding of every symbol, and state.
// Mirrors opforge/program/verify_symbolic.py; its docstring lists the rules.
//
// One deliberate difference: bounds are computed in int64 and an expression whose interval
// leaves int64 at ANY node is refused, where Python's big ints only check the final bounds.
// What the native verifier accepts can therefore always be evaluated without overflow.
#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "produced.h"
#include "program_text.h"
#include "verify_internal.h"

namespace opforge::rt {
namespace {

const char* const kCorrupt = "the file is corrupt or hostile; re-export the model";

[[noreturn]] void fail(const std::string& subject, const std::string& found,
                       const std::string& valid, const std::string& fix = "") {
  throw ProgramError{program_message(subject, found, valid, fix)};
}

void expr_bounds(const ParsedExpr& p, const Method& m, const std::vector<int64_t>& mins,
                 const std::vector<int64_t>& maxs, const std::string& subject, int64_t* lo,
                 int64_t* hi) {
  const SizeExpr& e = p.expr;
  if (!p.unknown.empty()) {
    fail(subject, to_string(e, m.symbols) + " reads undeclared symbol(s) ['" + p.unknown + "']",
         "expressions over the method's symbols", kCorrupt);
  }
  if (!bounds(e, mins.data(), maxs.data(), lo, hi)) {
    fail(subject, to_string(e, m.symbols) +
                      " divides by a value that can be zero, or leaves int64 on the way",
         "divisors bounded away from zero and values within int64", kCorrupt);
  }
}

}  // namespace

ParsedSymbolic parse_symbolic(const Method& m, const std::string& where) {
  ParsedSymbolic out;
  const std::string at = where + " symbolic sizes";
  out.values.reserve(m.symbolic_values.size());
  for (const SymbolicValue& sv : m.symbolic_values) {
    std::vector<ParsedExpr> exprs(sv.exprs.size());
    for (size_t d = 0; d < sv.exprs.size(); ++d) {
      exprs[d].expr = parse_size_expr(sv.exprs[d], m.symbols, at, &exprs[d].unknown);
    }
    out.values.push_back(std::move(exprs));
  }
  for (const Guard& g : m.guards) {
    out.lhs.emplace_back();
    out.lhs.back().expr = parse_size_expr(g.lhs, m.symbols, at, &out.lhs.back().unknown);
    out.rhs.emplace_back();
    out.rhs.back().expr = parse_size_expr(g.rhs, m.symbols, at, &out.rhs.back().unknown);
  }
  return out;
}

std::vector<bool> growing_values(const Method& m, const ParsedSymbolic& parsed) {
  std::vector<bool> out(m.values.size(), false);
  if (m.growing.empty()) return out;
  for (size_t i = 0; i < m.symbolic_values.size(); ++i) {
    const uint32_t v = m.symbolic_values[i].value;
    if (v >= m.values.size() || m.values[v].tag != ValueTag::Tensor ||
        m.values[v].tensor.storage != StorageKind::None) {
      continue;
    }
    for (const ParsedExpr& e : parsed.values[i]) {
      for (uint32_t s : m.growing) {
        if (e.expr.reads(static_cast<int>(s))) out[v] = true;
      }
    }
  }
  return out;
}

void verify_symbolic(const Method& m, const ParsedSymbolic& parsed, const std::string& where) {
  const size_t n = m.values.size();
  std::vector<int64_t> mins, maxs;
  std::set<std::string> names;
  for (size_t i = 0; i < m.symbols.size(); ++i) {
    if (!names.insert(m.symbols[i].name).second) {
      fail(where + " symbols[" + std::to_string(i) + "]",
           quoted(m.symbols[i].name) + " a second time", "unique symbol names", kCorrupt);
    }
    mins.push_back(m.symbols[i].min);
    maxs.push_back(m.symbols[i].max);
  }
  const std::vector<bool> growing = growing_values(m, parsed);
  std::vector<bool> seen(n, false);
  // value index -> its entry (for binding: each value is listed once, checked below)
  std::unordered_map<uint32_t, size_t> entry_of;
  for (size_t i = 0; i < m.symbolic_values.size(); ++i) {
    const SymbolicValue& sv = m.symbolic_values[i];
    const std::string at = where + " symbolic_values[" + std::to_string(i) + "]";
    if (sv.value >= n) {
      fail(at + ".value", std::to_string(sv.value),
           "a value index below " + std::to_string(n), kCorrupt);
    }
    if (seen[sv.value]) {
      fail(at + ".value", "value " + std::to_string(sv.value) + " a second time",
           "each value once", kCorrupt);
    }
    seen[sv.value] = true;
    entry_of[sv.value] = i;
    const Value& value = m.values[sv.value];
    size_t expected;
    if (value.tag == ValueTag::Tensor) expected = value.tensor.sizes.size();
    else if (value.tag == ValueTag::Int) expected = 1;
    else if (value.tag == ValueTag::IntList) expected = value.ints.size();
    else {
      fail(at + ".value", "value " + std::to_string(sv.value) + " of another kind",
           "a TensorValue, IntValue or IntListValue", kCorrupt);
    }
    if (sv.exprs.size() != expected) {
      fail(at + ".exprs", std::to_string(sv.exprs.size()) + " expression(s)",
           std::to_string(expected) + ", one per size or element", kCorrupt);
    }
    bool symbolic = false;
    for (size_t d = 0; d < expected; ++d) {
      const SizeExpr& e = parsed.values[i][d].expr;
      const std::string sub = at + ".exprs[" + std::to_string(d) + "]";
      int64_t lo, hi;
      expr_bounds(parsed.values[i][d], m, mins, maxs, sub, &lo, &hi);
      if (value.tag == ValueTag::Tensor &&
          (lo < 0 || (hi > value.tensor.sizes[d] && !growing[sv.value]))) {
        fail(sub, to_string(e, m.symbols) + " in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]",
             "sizes in [0, " + std::to_string(value.tensor.sizes[d]) +
                 "] (the tensor's size at the upper bound, which its slot holds)", kCorrupt);
      }
      symbolic = symbolic || !e.is_const();
    }
    if (value.tag == ValueTag::Tensor && value.tensor.storage != StorageKind::Arena && symbolic &&
        !growing[sv.value]) {
      fail(at + ".value", "value " + std::to_string(sv.value) +
                              " with symbolic sizes and no arena storage",
           "symbolic tensors planned into an arena", kCorrupt);
    }
  }
  for (size_t i = 0; i < m.guards.size(); ++i) {
    int64_t lo, hi;
    expr_bounds(parsed.lhs[i], m, mins, maxs, where + " guards[" + std::to_string(i) + "].lhs",
                &lo, &hi);
    expr_bounds(parsed.rhs[i], m, mins, maxs, where + " guards[" + std::to_string(i) + "].rhs",
                &lo, &hi);
  }
  if (!m.symbols.empty()) {  // binding_plan: every symbol is a*dim+b of some input dimension
    std::vector<bool> bound(m.symbols.size(), false);
    for (uint32_t index : m.inputs) {
      auto it = entry_of.find(index);
      if (it == entry_of.end()) continue;
      for (const ParsedExpr& p : parsed.values[it->second]) {
        if (p.expr.is_const()) continue;
        int s = affine_symbol(p.expr);
        if (s >= 0) bound[s] = true;
      }
    }
    // the rest are data-dependent sizes, each produced by an instruction (produced.h)
    if (std::find(bound.begin(), bound.end(), false) != bound.end())
      find_producers(m, bound, "method '" + m.name + "'");
  }
  std::set<std::string> state_names;
  std::vector<bool> input(n, false);
  for (uint32_t i : m.inputs) {
    if (i < n) input[i] = true;
  }
  for (size_t i = 0; i < m.state.size(); ++i) {
    const StateSlot& slot = m.state[i];
    const std::string at = where + " state[" + std::to_string(i) + "]";
    if (!state_names.insert(slot.name).second) {
      fail(at + ".name", quoted(slot.name) + " a second time", "each state name once per method",
           kCorrupt);
    }
    if (slot.value >= n || m.values[slot.value].tag != ValueTag::Tensor ||
        m.values[slot.value].tensor.storage < StorageKind::Constant) {
      fail(at + ".value", "value " + std::to_string(slot.value),
           "a constant TensorValue (the state's initial value)", kCorrupt);
    }
    if (input[slot.value] || seen[slot.value]) {
      fail(at + ".value", "value " + std::to_string(slot.value) + ", an input or symbolic",
           "a static tensor that is no method input", kCorrupt);
    }
  }
}

void verify_shared_state(const Program& p) {
  std::unordered_map<std::string, std::pair<const Method*, const TensorDef*>> first;
  for (const Method& m : p.methods) {
    for (const StateSlot& slot : m.state) {
      const TensorDef& t = m.values[slot.value].tensor;  // checked by verify_symbolic
      auto [it, fresh] = first.emplace(slot.name, std::make_pair(&m, &t));
      if (fresh) continue;
      const TensorDef& other = *it->second.second;
      if (other.dtype != t.dtype || other.sizes != t.sizes) {
        fail("method " + quoted(m.name) + " state " + quoted(slot.name),
             dtype_name(t.dtype) + " tensor, but method " + quoted(it->second.first->name) +
                 " has " + dtype_name(other.dtype) + " of other sizes",
             "one dtype and size per state name across methods", kCorrupt);
      }
    }
  }
}

}  // namespace opforge::rt
