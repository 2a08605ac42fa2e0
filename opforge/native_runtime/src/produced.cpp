// Data-dependent sizes (produced.h): which instruction binds each symbol no input binds.
#include "produced.h"

#include <algorithm>
#include <set>

#include "program_text.h"
#include "symbolic.h"

namespace opforge::rt {
namespace {

const char* const kCorrupt = "the file is corrupt; re-export it";

[[noreturn]] void fail(const std::string& subject, const std::string& found, const std::string& valid) {
  throw ProgramError{program_message(subject, found, valid, kCorrupt)};
}

// "['u0', 'u1']" (Python's repr of a sorted list of names)
std::string names_list(const Method& m, const std::set<int>& symbols) {
  std::vector<std::string> names;
  for (int s : symbols) names.push_back(m.symbols[s].name);
  std::sort(names.begin(), names.end());
  std::string text = "[";
  for (size_t k = 0; k < names.size(); ++k) text += (k ? ", '" : "'") + names[k] + "'";
  return text + "]";
}

bool integer_dtype(int32_t d) { return (d >= 0 && d <= 4) || d == 27 || d == 28 || d == 29; }

}  // namespace

std::vector<Producer> find_producers(const Method& m, const std::vector<bool>& bound_by_inputs,
                                     const std::string& where) {
  const size_t n = m.values.size(), count = m.symbols.size();
  std::set<int> pending;
  for (size_t s = 0; s < count; ++s)
    if (!bound_by_inputs[s]) pending.insert(int(s));
  std::set<int> grow;
  for (uint32_t g : m.growing)
    if (pending.count(int(g))) grow.insert(int(g));
  if (!grow.empty())
    fail(where + " symbols", names_list(m, grow) + " growing and bound by no input dimension",
         "a growing symbol is an input dimension");
  // per value: its expressions (symbolic values) and the symbols they read
  std::vector<int> entry(n, -1);
  std::vector<std::vector<SizeExpr>> exprs;
  std::vector<std::set<int>> reads;
  for (const SymbolicValue& sv : m.symbolic_values) {
    if (sv.value >= n) continue;  // the verifier refuses it
    entry[sv.value] = int(exprs.size());
    exprs.emplace_back();
    reads.emplace_back();
    for (const std::string& text : sv.exprs) {
      exprs.back().push_back(parse_size_expr(text, m.symbols, where));
      for (size_t s = 0; s < count; ++s)
        if (exprs.back().back().reads(int(s))) reads.back().insert(int(s));
    }
  }
  auto pending_read = [&](uint32_t value) {
    std::set<int> early;
    if (value < n && entry[value] >= 0)
      for (int s : reads[entry[value]])
        if (pending.count(s)) early.insert(s);
    return early;
  };
  for (size_t p = 0; p < m.inputs.size(); ++p) {
    std::set<int> early = pending_read(m.inputs[p]);
    if (!early.empty())
      fail(where + " symbols", names_list(m, early) + " bound by no input dimension, yet input " +
                                   std::to_string(p) + " is sized by them",
           "every symbol an input's sizes read is the size (or a*size+b) of some input dimension");
  }
  auto exact_symbol = [](const SizeExpr& e) { return e.nodes.size() == 1 && e.nodes[0].op == ExprOp::Sym ? int(e.nodes[0].value) : -1; };
  std::vector<Producer> found;
  for (size_t i = 0; i < m.instructions.size() && !pending.empty(); ++i) {
    const Instruction& ins = m.instructions[i];
    std::vector<Producer> made;
    std::vector<uint32_t> args;
    auto is_made = [&](int s) {
      return std::any_of(made.begin(), made.end(), [&](const Producer& p) { return p.symbol == s; });
    };
    if (ins.kind == InstructionKind::KernelCall) {
      args = ins.args;
      for (uint32_t a : ins.args) {
        if (a >= n || m.values[a].tag != ValueTag::Tensor || entry[a] < 0) continue;
        const std::vector<SizeExpr>& e = exprs[entry[a]];
        for (size_t d = 0; d < e.size(); ++d) {
          int s = exact_symbol(e[d]);
          if (s >= 0 && pending.count(s) && !is_made(s))
            made.push_back(Producer{s, uint32_t(i), a, int(d)});
        }
      }
    } else if (ins.kind == InstructionKind::Move) {
      const uint32_t src = ins.index, dst = ins.dst;
      int s = -1;
      if (dst < n && src < n && m.values[dst].tag == ValueTag::Int && entry[dst] >= 0 &&
          exprs[entry[dst]].size() == 1)
        s = exact_symbol(exprs[entry[dst]][0]);
      if (s >= 0 && pending.count(s)) {
        const Value& source = m.values[src];
        int64_t numel = 1;
        if (source.tag == ValueTag::Tensor)
          for (int64_t size : source.tensor.sizes) numel *= size;  // verified: <= 2**48 bytes
        if (source.tag != ValueTag::Tensor || numel != 1 || !integer_dtype(source.tensor.dtype) || entry[src] >= 0)
          fail(where + " instruction " + std::to_string(i) + " (Move)",
               "symbol " + m.symbols[s].name + " read from value " + std::to_string(src),
               "a static one-element integer tensor");
        made.push_back(Producer{s, uint32_t(i), src, -1});
        args = {src};
      } else {
        args = {src, dst};
      }
    } else if (ins.kind == InstructionKind::DelegateCall) {
      args = ins.args;
    }
    for (uint32_t a : args) {  // nothing reads a symbol before it is produced
      std::set<int> early = pending_read(a);
      for (const Producer& p : made)
        if (p.dim >= 0 && p.value == a) early.erase(p.symbol);
      if (!early.empty())
        fail(where + " instruction " + std::to_string(i),
             "value " + std::to_string(a) + " sized by " + names_list(m, early) + " before an instruction produces it",
             "data-dependent sizes read after the instruction that produces them");
    }
    for (const Producer& p : made) pending.erase(p.symbol);
    found.insert(found.end(), made.begin(), made.end());
  }
  if (!pending.empty()) {
    std::vector<std::string> names;
    for (int s : pending) names.push_back(m.symbols[s].name);
    std::sort(names.begin(), names.end());
    std::string text;
    for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
    fail(where + " symbols", text + " bound by no input dimension and produced by no instruction",
         "every symbol is the size (or a*size+b) of some input dimension, or a size an instruction produces (a "
         "kernel's result dimension, or a Move of a one-element integer tensor into an int)");
  }
  return found;
}

void read_size_kernel(opforge_context*, opforge_arg*, int64_t) {}

}  // namespace opforge::rt
