// Binding symbols and evaluating symbolic sizes (shapes.h).
#include "shapes.h"

#include <algorithm>
#include <map>

#include "errors.h"
#include "symbolic.h"

namespace opforge::rt {

namespace {

constexpr int64_t kUnbounded = (int64_t(1) << 31) - 1;  // a growing Dim without a max

struct Step {          // one input dimension a call reads
  size_t position, dim;
  int expr;            // index into distinct expressions
  int symbol = -1;     // >= 0: binds this symbol (a * s + b)
  int64_t a = 1, b = 0;
};

std::string env_text(const Method& m, const std::vector<int64_t>& env, size_t count) {
  std::string text;
  std::vector<std::pair<std::string, int64_t>> pairs;
  for (size_t s = 0; s < count; ++s) pairs.emplace_back(m.symbols[s].name, env[s]);
  std::sort(pairs.begin(), pairs.end());
  for (auto& [name, value] : pairs) text += (text.empty() ? "" : ", ") + name + "=" + std::to_string(value);
  return text;
}

}  // namespace

struct ShapeBinder::Impl {
  const Method& method;
  std::vector<SizeExpr> distinct;        // each distinct expression once
  std::vector<std::string> texts;        // their printed form
  std::vector<std::vector<int>> gather;  // per symbolic value: its expressions' indices
  std::vector<bool> is_size;             // per expression: a tensor's dimension somewhere (an
                                         // int list's -1, view's inferred dim, may be negative)
  std::vector<int> symbolic_of_value;    // value → symbolic_values position, or -1
  std::vector<Step> steps;
  std::vector<std::pair<size_t, size_t>> static_dims;  // (position, dim) without an expression
  struct CompiledGuard { SizeExpr lhs, rhs; std::string relation, text; int after = -1; };
  bool holds(const CompiledGuard& g, const std::vector<int64_t>& env) const {
    int64_t a = 0, b = 0;
    if (!opforge::rt::evaluate(g.lhs, env.data(), &a) || !opforge::rt::evaluate(g.rhs, env.data(), &b)) return false;
    if (g.relation == "==") return a == b;
    if (g.relation == "!=") return a != b;
    if (g.relation == "<=") return a <= b;
    return a < b;
  }
  std::vector<CompiledGuard> guards;
  std::vector<int64_t> mins, maxs;
  explicit Impl(const Method& m) : method(m) {}
  int intern(const std::string& text, const std::string& where) {
    auto it = std::find(texts.begin(), texts.end(), text);
    if (it != texts.end()) return static_cast<int>(it - texts.begin());
    distinct.push_back(parse_size_expr(text, method.symbols, where));
    texts.push_back(text);
    return static_cast<int>(texts.size()) - 1;
  }
};

ShapeBinder::ShapeBinder(const Method& m) : impl_(std::make_unique<Impl>(m)) {
  Impl& I = *impl_;
  const std::string where = "method '" + m.name + "'";
  for (const Symbol& s : m.symbols) {
    I.mins.push_back(s.min);
    I.maxs.push_back(s.max);
  }
  I.symbolic_of_value.assign(m.values.size(), -1);
  for (size_t k = 0; k < m.symbolic_values.size(); ++k) {
    const SymbolicValue& sv = m.symbolic_values[k];
    I.symbolic_of_value[sv.value] = static_cast<int>(k);
    std::vector<int> exprs;
    for (const std::string& text : sv.exprs) exprs.push_back(I.intern(text, where + " values[" + std::to_string(sv.value) + "]"));
    I.is_size.resize(I.distinct.size(), false);
    if (m.values[sv.value].tag == ValueTag::Tensor)
      for (int e : exprs) I.is_size[(size_t)e] = true;
    I.gather.push_back(std::move(exprs));
  }
  // the binding plan (symbolic.py binding_plan): linear dimensions bind first, then the rest are checked
  std::vector<bool> bound(m.symbols.size(), false);
  std::vector<Step> pending;
  for (size_t p = 0; p < m.inputs.size(); ++p) {
    const uint32_t index = m.inputs[p];
    const Value& v = m.values[index];
    if (v.tag != ValueTag::Tensor) {
      min_.emplace_back();
      max_.emplace_back();
      continue;
    }
    std::vector<int64_t> lo, hi;
    io_bounds(m, index, lo, hi);
    min_.push_back(lo);
    max_.push_back(hi);
    int k = I.symbolic_of_value[index];
    for (size_t d = 0; d < v.tensor.sizes.size(); ++d) {
      if (k < 0 || I.distinct[I.gather[k][d]].is_const()) {
        I.static_dims.emplace_back(p, d);
        continue;
      }
      pending.push_back(Step{p, d, I.gather[k][d]});
    }
  }
  std::vector<bool> binds(pending.size(), false);
  for (size_t j = 0; j < pending.size(); ++j) {
    Affine form;
    if (as_affine(I.distinct[pending[j].expr], &form) && form.a != 0 && !bound[form.symbol]) {
      bound[form.symbol] = true;
      binds[j] = true;
      pending[j].symbol = form.symbol;
      pending[j].a = form.a;
      pending[j].b = form.b;
      I.steps.push_back(pending[j]);
    }
  }
  for (size_t j = 0; j < pending.size(); ++j)
    if (!binds[j]) I.steps.push_back(pending[j]);
  if (std::find(bound.begin(), bound.end(), false) != bound.end()) {
    try {
      producers_ = find_producers(m, bound, where);  // data-dependent sizes
    } catch (const ProgramError& e) {
      throw ProgramError{"`opf_method_new`: " + e.message};
    }
  }
  for (const Guard& g : m.guards) {
    Impl::CompiledGuard c{parse_size_expr(g.lhs, m.symbols, where + " guard"),
                          parse_size_expr(g.rhs, m.symbols, where + " guard"), g.relation,
                          g.lhs + " " + g.relation + " " + g.rhs};
    // checked by bind() when the inputs bind all it reads, else after the producer of the
    // last data-dependent symbol it reads
    c.after = -1;
    for (size_t k = 0; k < producers_.size(); ++k)
      if (c.lhs.reads(producers_[k].symbol) || c.rhs.reads(producers_[k].symbol)) c.after = int(k);
    I.guards.push_back(std::move(c));
  }
  // growing tensors: symbolic, no storage, reading a growing symbol (symbolic.py growing_values)
  for (size_t k = 0; k < m.symbolic_values.size(); ++k) {
    const uint32_t index = m.symbolic_values[k].value;
    const Value& v = m.values[index];
    if (v.tag != ValueTag::Tensor || v.tensor.storage != StorageKind::None) continue;
    bool reads = false;
    for (int e : I.gather[k])
      for (uint32_t g : m.growing) reads = reads || I.distinct[e].reads(static_cast<int>(g));
    if (reads) growing_.push_back(index);
  }
}

ShapeBinder::~ShapeBinder() = default;

std::string ShapeBinder::describe_input(size_t position) const {
  const Impl& I = *impl_;
  const Method& m = I.method;
  const uint32_t index = m.inputs[position];
  const int k = I.symbolic_of_value[index];
  const std::vector<int64_t>& sizes = m.values[index].tensor.sizes;
  std::string text = "(";
  std::vector<int> read;
  for (size_t d = 0; d < sizes.size(); ++d) {
    text += d ? ", " : "";
    if (k < 0) { text += std::to_string(sizes[d]); continue; }
    const SizeExpr& e = I.distinct[I.gather[k][d]];
    text += I.texts[I.gather[k][d]];
    for (size_t s = 0; s < m.symbols.size(); ++s)
      if (e.reads(static_cast<int>(s)) && std::find(read.begin(), read.end(), int(s)) == read.end()) read.push_back(int(s));
  }
  text += sizes.size() == 1 ? ",)" : ")";
  std::sort(read.begin(), read.end(), [&](int a, int b) { return m.symbols[a].name < m.symbols[b].name; });
  for (size_t j = 0; j < read.size(); ++j)
    text += (j ? ", " : " with ") + m.symbols[read[j]].name + " in [" + std::to_string(m.symbols[read[j]].min) + ", " +
            std::to_string(m.symbols[read[j]].max) + "]";
  return text;
}

void ShapeBinder::bind(const std::string& api, const std::vector<const int64_t*>& sizes, std::vector<int64_t>& env) const {
  const Impl& I = *impl_;
  const Method& m = I.method;
  for (auto [p, d] : I.static_dims) {
    const int64_t expected = m.values[m.inputs[p]].tensor.sizes[d];
    if (sizes[p][d] != expected)
      raise(OPF_ERR_INPUT, "`" + api + "`: input " + std::to_string(p) + " dimension " + std::to_string(d) +
                               " — found size " + std::to_string(sizes[p][d]) + " — valid: " + std::to_string(expected) +
                               " (a static dimension; input shape " + describe_input(p) + ") — fix: pass size " +
                               std::to_string(expected) + ", or re-export with this dimension dynamic");
  }
  env.assign(m.symbols.size(), 0);
  size_t bound = 0;
  for (const Step& step : I.steps) {
    const int64_t size = sizes[step.position][step.dim];
    if (step.symbol >= 0) {
      const Symbol& s = m.symbols[step.symbol];
      int64_t shifted, value = 0, rest = 1;
      bool ok = !__builtin_sub_overflow(size, step.b, &shifted) && floor_div(shifted, step.a, &value) &&
                floor_mod(shifted, step.a, &rest);
      if (!ok || rest != 0 || value < s.min || value > s.max) {
        int64_t lo = 0, hi = 0;
        bounds(I.distinct[step.expr], I.mins.data(), I.maxs.data(), &lo, &hi);
        int64_t step_size = step.a < 0 ? -step.a : step.a;
        raise(OPF_ERR_INPUT, "`" + api + "`: input " + std::to_string(step.position) + " dimension " +
                                 std::to_string(step.dim) + " — found size " + std::to_string(size) + " — valid: " +
                                 I.texts[step.expr] + " with symbol " + s.name + " in [" + std::to_string(s.min) + ", " +
                                 std::to_string(s.max) + "] (sizes " + std::to_string(lo) + ".." + std::to_string(hi) +
                                 (step_size != 1 ? " in steps of " + std::to_string(step_size) : "") +
                                 "; input shape " + describe_input(step.position) +
                                 ") — fix: pass a size in range, or re-export with a larger max for this dimension");
      }
      env[step.symbol] = value;
      ++bound;
      continue;
    }
    int64_t expected = 0;
    if (!opforge::rt::evaluate(I.distinct[step.expr], env.data(), &expected) || size != expected)
      raise(OPF_ERR_INPUT, "`" + api + "`: input " + std::to_string(step.position) + " dimension " +
                               std::to_string(step.dim) + " — found size " + std::to_string(size) + " — valid: " +
                               I.texts[step.expr] + " = " + std::to_string(expected) + " with " +
                               env_text(m, env, env.size()) + " (bound from the other input dimensions; input shape " +
                               describe_input(step.position) + ") — fix: pass inputs whose sizes agree as exported");
  }
  for (const Producer& p : producers_) env[p.symbol] = m.symbols[p.symbol].max;  // bound mid-call
  for (const auto& g : I.guards) {
    if (g.after >= 0) continue;  // reads a data-dependent size: checked once it is produced
    if (!I.holds(g, env))
      raise(OPF_ERR_INPUT, "`" + api + "`: inputs — sizes " + env_text(m, env, env.size()) + " break the guard " +
                               g.text + " that torch.export recorded — valid: sizes for which the guard holds — fix: "
                               "pass such sizes, or re-export with example inputs of these sizes");
  }
}

void ShapeBinder::check_produced(const std::string& api, size_t producer, int64_t value, const std::string& source,
                                 std::vector<int64_t>& env) const {
  const Impl& I = *impl_;
  const Method& m = I.method;
  const Producer& p = producers_[producer];
  const Symbol& s = m.symbols[p.symbol];
  const std::string what = "`" + api + "`: data-dependent size " + s.name + " (" + source + ")";
  if (value < s.min || value > s.max)
    raise(OPF_ERR_INPUT, what + " — found " + std::to_string(value) + " — valid: [" + std::to_string(s.min) + ", " +
                             std::to_string(s.max) + "], the range the program was exported and planned with — fix: "
                             "re-export with a bound that covers it: torch._check(n <= K) where the size is made (K "
                             "the largest size a call needs)");
  env[p.symbol] = value;
  for (const auto& g : I.guards)
    if (g.after == int(producer) && !I.holds(g, env))
      raise(OPF_ERR_INPUT, what + " = " + std::to_string(value) + " — breaks the guard " + g.text +
                               " that torch.export recorded — valid: values for which it holds — fix: check the "
                               "inputs' values");
}

void ShapeBinder::evaluate(const std::string& api, const std::vector<int64_t>& env, std::vector<int64_t>& out) const {
  const Impl& I = *impl_;
  std::vector<int64_t> found(I.distinct.size());
  for (size_t e = 0; e < I.distinct.size(); ++e)
    if (!opforge::rt::evaluate(I.distinct[e], env.data(), &found[e]) || (found[e] < 0 && I.is_size[e]))
      raise(OPF_ERR_INPUT, "`" + api + "`: size expression " + I.texts[e] + " — cannot be evaluated (a zero divisor, an "
                               "overflow, or a negative tensor size) at " + env_text(I.method, env, env.size()) +
                               " — valid: sizes the exported guards admit — fix: pass other sizes, or re-export");
  out.clear();
  for (const auto& exprs : I.gather)
    for (int e : exprs) out.push_back(found[e]);
}

void io_bounds(const Method& m, uint32_t index, std::vector<int64_t>& min_sizes, std::vector<int64_t>& max_sizes) {
  const std::vector<int64_t>& sizes = m.values[index].tensor.sizes;
  min_sizes = sizes;
  max_sizes = sizes;
  const SymbolicValue* sv = nullptr;
  for (const SymbolicValue& s : m.symbolic_values)
    if (s.value == index) sv = &s;
  if (sv == nullptr) return;
  std::vector<int64_t> mins, maxs;
  for (const Symbol& s : m.symbols) {
    mins.push_back(s.min);
    maxs.push_back(s.max);
  }
  for (size_t d = 0; d < sizes.size() && d < sv->exprs.size(); ++d) {
    SizeExpr e = parse_size_expr(sv->exprs[d], m.symbols, "method '" + m.name + "'");
    int64_t lo = sizes[d], hi = sizes[d];
    if (bounds(e, mins.data(), maxs.data(), &lo, &hi)) {
      min_sizes[d] = lo;
      max_sizes[d] = hi;
    }
    for (uint32_t g : m.growing)  // a growing Dim without an upper bound
      if (e.reads(static_cast<int>(g)) && m.symbols[g].max >= kUnbounded) max_sizes[d] = INT64_MAX;
  }
}

}  // namespace opforge::rt
