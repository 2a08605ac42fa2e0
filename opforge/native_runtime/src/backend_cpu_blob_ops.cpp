// The cpu blob plan's per-tensor, per-op, io, state and debug checks (backend_cpu_blob.h),
// rule for rule as blob.py's check_plan, _check_named, _check_state and _check_debug, with
// their messages; the blob's header and the plan's parsing are backend_cpu_blob.cpp's.
#include "backend_cpu_blob.h"

#include <algorithm>
#include <set>

#include "backend_cpu_json.h"
#include "symbolic.h"

namespace opforge::rt::cpu::blob_detail {
namespace {

// A value as Python's str(v)[:40] would show it, roughly (for messages).
std::string shown(const Json& j, const JValue* v) {
  if (v == nullptr || v->type == JType::Null) return "None";
  switch (v->type) {
    case JType::Bool: return v->b ? "True" : "False";
    case JType::Int: return v->big ? "(a big int)" : std::to_string(v->i);
    case JType::Float: return std::to_string(v->d);
    case JType::String: {
      std::string s = j.str(*v).substr(0, 40), out;
      for (char c : s) out += (c >= 0x20 && c < 0x7f) ? c : '?';
      return "'" + out + "'";
    }
    case JType::Array: return "(a list)";
    default: return "(an object)";
  }
}

struct Checker {
  const Json& j;
  const ExprTable* exprs = nullptr;  // a dynamic plan's: a size field may be an expression
  mutable bool read_expr = false;    // set when one was read (the tensor's strides are tidied)

  // A size field (dims, strides, an alias offset, an op attribute): an int, or in a dynamic
  // plan an expression evaluated at the symbol values (cpu/dynamic.py concrete_plan).
  int64_t size_in(const JValue* v, int64_t lo, int64_t hi, const std::string& what) const {
    if (exprs == nullptr || v == nullptr || v->type != JType::String) return int_in(v, lo, hi, what);
    auto it = exprs->parsed.find(j.str(*v));
    int64_t out = 0;
    if (it == exprs->parsed.end() || !evaluate(it->second, exprs->env->data(), &out))
      refuse(what + ": a size expression that cannot be evaluated at these sizes");
    if (out < lo || out > hi)
      refuse(what + " is " + std::to_string(out) + " at these sizes, not in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]");
    read_expr = true;
    return out;
  }
  std::vector<int64_t> sizes(const JValue* v, int64_t n_max, int64_t lo, int64_t hi, const std::string& what) const {
    if (v == nullptr || v->type != JType::Array || v->count > n_max)
      refuse(what + " is not a list of at most " + std::to_string(n_max) + " ints");
    std::vector<int64_t> out;
    out.reserve(v->count);
    for (uint32_t k = 0; k < v->count; ++k) out.push_back(size_in(&j.item(*v, k), lo, hi, what + " item"));
    return out;
  }

  int64_t int_in(const JValue* v, int64_t lo, int64_t hi, const std::string& what) const {
    if (v == nullptr || v->type != JType::Int || v->big || v->i < lo || v->i > hi)
      refuse(what + " is " + shown(j, v) + ", not an int in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v->i;
  }
  template <typename T>
  std::vector<T> ints(const JValue* v, int64_t n_max, int64_t lo, int64_t hi, const std::string& what) const {
    if (v == nullptr || v->type != JType::Array || v->count > n_max)
      refuse(what + " is not a list of at most " + std::to_string(n_max) + " ints");
    std::vector<T> out;
    out.reserve(v->count);
    for (uint32_t k = 0; k < v->count; ++k) out.push_back((T)int_in(&j.item(*v, k), lo, hi, what + " item"));
    return out;
  }
  static bool number(const JValue& v) { return v.type == JType::Int || v.type == JType::Float; }
};

const char* const kRoles[] = {"input", "output", "const", "temp", "alias", "dead", "state"};
const char* const kOpKinds[] = {
    "conv", "deconv", "matmul", "pool", "eltwise", "binary", "softmax", "layer_norm",
    "reduction", "copy", "ew", "reduce", "embedding", "group_norm", "kernel", "package",
    "qconv", "qmatmul", "quant", "index", "index_put", "index_copy", "rms_norm", "rope",
    "int_matmul", "int_embedding", "attention", "int_dot_matmul"};  // blob.py OP_KINDS, in its order

// engine.py KERNEL_TAGS
int32_t kernel_tag(const std::string& name) {
  static const struct { const char* name; int32_t tag; } kTags[] = {
      {"none", 0}, {"tensor", 1}, {"int", 4}, {"double", 5}, {"bool", 6}, {"int_list", 9}, {"double_list", 10}};
  for (const auto& t : kTags)
    if (name == t.name) return t.tag;
  return -1;
}

std::string role_name(Role r) { return kRoles[(int)r]; }

// dynamic.py _tidy: a size-1 dim's stride as a dense layout would have it (it addresses
// nothing; oneDNN recognises dense layouts only then), for a tensor with symbolic sizes.
void tidy(const std::vector<int64_t>& dims, std::vector<int64_t>& strides) {
  for (size_t k = dims.size(); k-- > 0;) {
    if (dims[k] != 1) continue;
    int64_t best = 1;
    bool any = false;
    for (size_t m = k + 1; m < dims.size(); ++m) {
      if (dims[m] == 1) continue;
      int64_t v = strides[m] > (int64_t(1) << 62) / std::max<int64_t>(dims[m], 1) ? int64_t(1) << 62 : strides[m] * dims[m];
      best = any ? std::max(best, v) : v;
      any = true;
    }
    strides[k] = best;
  }
}

void check_tensors(const Json& j, const Checker& c, const JValue& tensors, Plan& plan) {
  const int64_t n = tensors.count;
  plan.tensors.resize((size_t)n);
  for (int64_t i = 0; i < n; ++i) {
    const JValue& t = j.item(tensors, (uint32_t)i);
    PlanTensor& out = plan.tensors[(size_t)i];
    std::string at = "tensors[" + std::to_string(i) + "]";
    if (t.type != JType::Object) refuse(at + " is not an object");
    out.dtype = (int32_t)c.int_in(j.member(t, "dtype"), 0, 15, at + ".dtype");
    if (dtype_itemsize(out.dtype) == 0) refuse(at + ".dtype " + std::to_string(out.dtype));
    c.read_expr = false;
    out.dims = c.sizes(j.member(t, "dims"), kMaxRank, 0, kBig, at + ".dims");
    out.strides = c.sizes(j.member(t, "strides"), kMaxRank, 0, kBig, at + ".strides");
    if (out.dims.size() != out.strides.size())
      refuse(at + ": " + std::to_string(out.dims.size()) + " dims but " + std::to_string(out.strides.size()) + " strides");
    if (c.read_expr) tidy(out.dims, out.strides);
    const JValue* role = j.member(t, "role");
    int r = -1;
    if (role != nullptr && role->type == JType::String)
      for (int k = 0; k < 7; ++k)
        if (j.str(*role) == kRoles[k]) r = k;
    if (r < 0) refuse(at + ".role " + shown(j, role));
    out.role = (Role)r;
    if (out.role == Role::Alias) {
      out.base = (int32_t)c.int_in(j.member(t, "base"), 0, n - 1, at + ".base");
      if (out.base >= i) refuse(at + " aliases a later tensor");
      out.offset = c.size_in(j.member(t, "offset"), 0, kBig, at + ".offset");
    }
    const JValue* named = j.member(t, "named");
    const JValue* data = j.member(t, "data");
    if (named != nullptr) {
      if (named->type != JType::Array || named->count != 2 || j.item(*named, 0).type != JType::String ||
          j.item(*named, 0).count == 0 || j.item(*named, 0).count > 256 * 4)
        refuse(at + ".named is not [key, nbytes]");
      out.named_key = j.str(j.item(*named, 0));
      size_t chars = 0;  // Python counts code points: at most 256
      for (unsigned char ch : out.named_key) chars += (ch & 0xC0) != 0x80;
      if (chars > 256) refuse(at + ".named is not [key, nbytes]");
      out.named_nbytes = c.int_in(&j.item(*named, 1), 0, kNamedMaxBytes, at + ".named nbytes");
      if (out.role != Role::Const || data != nullptr)
        refuse(at + " is named but is not a constant, or also has data");
    } else if (data != nullptr) {
      auto span = c.ints<int64_t>(data, 2, 0, plan.data_size, at + ".data");
      if (span.size() != 2) refuse(at + ".data has " + std::to_string(span.size()) + " items, not [offset, nbytes]");
      if (out.role != Role::Const || span[0] + span[1] > plan.data_size || span[0] % 64)
        refuse(at + ".data [" + std::to_string(span[0]) + ", " + std::to_string(span[0] + span[1]) +
               ") outside the " + std::to_string(plan.data_size) + " data bytes, unaligned, or not a constant");
      out.data_offset = span[0];
      out.data_nbytes = span[1];
    } else if (out.role == Role::Const) {
      refuse(at + " is a constant without data");
    }
  }
}

void check_ops(const Json& j, const Checker& c, const JValue& ops, Plan& plan) {
  const int64_t n = (int64_t)plan.tensors.size();
  plan.ops.resize(ops.count);
  for (uint32_t i = 0; i < ops.count; ++i) {
    const JValue& op = j.item(ops, i);
    PlanOp& out = plan.ops[i];
    std::string at = "ops[" + std::to_string(i) + "]";
    const JValue* kind = op.type == JType::Object ? j.member(op, "kind") : nullptr;
    bool known = false;
    if (kind != nullptr && kind->type == JType::String)
      for (const char* k : kOpKinds) known = known || j.str(*kind) == k;
    if (!known) refuse(at + " is not an op of a known kind");
    out.kind = j.str(*kind);
    out.in = c.ints<int32_t>(j.member(op, "in"), 64, 0, n - 1, at + ".in");
    out.out = c.ints<int32_t>(j.member(op, "out"), 64, 0, n - 1, at + ".out");
    out.ia = c.sizes(j.member(op, "ia"), 4096, -(int64_t(1) << 62), int64_t(1) << 62, at + ".ia");
    const JValue* fa = j.member(op, "fa");
    if (fa == nullptr || fa->type != JType::Array || fa->count > 64) refuse(at + ".fa");
    for (uint32_t k = 0; k < fa->count; ++k) {
      const JValue& x = j.item(*fa, k);
      if (!Checker::number(x) || x.big) refuse(at + ".fa");
      out.fa.push_back(x.type == JType::Int ? (double)x.i : x.d);
    }
    const JValue* post = j.member(op, "post");
    if (post == nullptr || post->type != JType::Array || post->count > 32) refuse(at + ".post");
    for (uint32_t k = 0; k < post->count; ++k) {
      const JValue& p = j.item(*post, k);
      if (p.type != JType::Array || p.count != 5) refuse(at + ".post item");
      const JValue &p0 = j.item(p, 0), &p1 = j.item(p, 1), &p2 = j.item(p, 2), &p3 = j.item(p, 3);
      // p[0] in (0, 1): Python's test lets True and False through as 1 and 0
      bool kind_ok = (p0.type == JType::Int && !p0.big && (p0.i == 0 || p0.i == 1)) || p0.type == JType::Bool;
      if (!kind_ok || p1.type != JType::Int || p1.big || p1.i < INT32_MIN || p1.i > INT32_MAX ||
          !Checker::number(p2) || !Checker::number(p3) || p2.big || p3.big)
        refuse(at + ".post item");
      PlanPostOp po;
      po.kind = p0.type == JType::Bool ? (int32_t)p0.b : (int32_t)p0.i;
      po.alg = (int32_t)p1.i;
      po.alpha = p2.type == JType::Int ? (double)p2.i : p2.d;
      po.beta = p3.type == JType::Int ? (double)p3.i : p3.d;
      if (po.kind == 1) po.tensor = (int32_t)c.int_in(&j.item(p, 4), 0, n - 1, at + ".post tensor");
      out.post.push_back(po);
    }
    const JValue* name = j.member(op, "name");
    if (name != nullptr && name->type != JType::String) refuse(at + ".name");
    out.name = name ? j.str(*name) : "";
    if (out.kind == "kernel") {
      const JValue* args = j.member(op, "args");
      if (args == nullptr || args->type != JType::Array || args->count > 256) refuse(at + ".args");
      for (uint32_t k = 0; k < args->count; ++k) {
        const JValue& item = j.item(*args, k);
        // engine.py _add_kernel's checks, made at parse time here
        int32_t tag = item.type == JType::Array && item.count == 2 && j.item(item, 0).type == JType::String
                          ? kernel_tag(j.str(j.item(item, 0))) : -1;
        if (tag < 0) refuse("kernel argument " + std::to_string(k) + " of " + at);
        const JValue& value = j.item(item, 1);
        PlanKernelArg a;
        a.tag = tag;
        if (tag == 9 || tag == 10) {
          if (value.type != JType::Array || value.count > 4096) refuse("kernel list argument of " + at);
          for (uint32_t m = 0; m < value.count; ++m) {
            const JValue& x = j.item(value, m);
            if (!Checker::number(x) || x.big) refuse("kernel list argument of " + at);
            if (tag == 9 && x.type != JType::Int) refuse("kernel int list argument of " + at);
            if (tag == 9) a.ints.push_back(x.i);
            else a.doubles.push_back(x.type == JType::Int ? (double)x.i : x.d);
          }
        } else if (tag == 5) {
          if (!Checker::number(value) || value.big) refuse("kernel double argument of " + at);
          a.d = value.type == JType::Int ? (double)value.i : value.d;
        } else {
          if (value.type != JType::Int || value.big) refuse("kernel int argument of " + at);
          a.i = value.i;
        }
        out.args.push_back(std::move(a));
      }
    }
    if (out.kind == "package") {
      const JValue* node = j.member(op, "node");
      if (node == nullptr || node->type != JType::String) refuse(at + ".node");
      out.node = j.str(*node);
    }
  }
}

std::vector<int64_t> row_major(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size());
  int64_t step = 1;
  for (size_t k = dims.size(); k-- > 0;) {
    strides[k] = step;
    int64_t d = dims[k] > 1 ? dims[k] : 1;
    step = step > (int64_t(1) << 41) / d ? (int64_t(1) << 41) + 1 : step * d;  // past any stride
  }
  return strides;
}

void check_io_state_debug(const Json& j, const Checker& c, const JValue& doc, Plan& plan) {
  const int64_t n = (int64_t)plan.tensors.size();
  plan.inputs = c.ints<int32_t>(j.member(doc, "inputs"), 1 << 16, 0, n - 1, "inputs");
  plan.outputs = c.ints<int32_t>(j.member(doc, "outputs"), 1 << 16, 0, n - 1, "outputs");
  for (int io = 0; io < 2; ++io) {
    const char* role = io == 0 ? "input" : "output";
    for (int32_t tid : io == 0 ? plan.inputs : plan.outputs) {
      const PlanTensor& t = plan.tensors[(size_t)tid];
      Role want = io == 0 ? Role::Input : Role::Output;
      if (t.role != want && !(io == 0 && t.role == Role::State))
        refuse(std::string(role) + "s list tensor " + std::to_string(tid) + ", which is a " + role_name(t.role));
      if (t.strides != row_major(t.dims))
        refuse(std::string(role) + " tensor " + std::to_string(tid) +
               " is not row-major contiguous (the runtime passes C-contiguous arrays)");
    }
  }
  std::set<int32_t> io(plan.inputs.begin(), plan.inputs.end());
  io.insert(plan.outputs.begin(), plan.outputs.end());
  if (io.size() != plan.inputs.size() + plan.outputs.size())
    refuse("a tensor listed twice among the inputs and outputs");
  for (int64_t i = 0; i < n; ++i) {
    Role r = plan.tensors[(size_t)i].role;
    if ((r == Role::Input || r == Role::Output || r == Role::State) && !io.count((int32_t)i))
      refuse("tensors[" + std::to_string(i) + "] is an " + role_name(r) + " the delegate does not list");
  }
  const JValue* impls = j.member(doc, "impls");
  if (impls != nullptr && impls->type != JType::Array) refuse("impls");

  // state: [input position, call output position] per state input written in place
  const JValue* state = j.member(doc, "state");
  const int64_t n_in = (int64_t)plan.inputs.size();
  if (state != nullptr && (state->type != JType::Array || state->count > n_in))
    refuse("a state list longer than the inputs");
  const int64_t calls = (int64_t)plan.outputs.size() + (state ? state->count : 0);
  std::set<int64_t> positions, outs;
  for (uint32_t k = 0; state && k < state->count; ++k) {
    const JValue& e = j.item(*state, k);
    std::string at = "state[" + std::to_string(k) + "]";
    if (e.type != JType::Array || e.count != 2) refuse(at + " is not [input position, output position]");
    int64_t position = c.int_in(&j.item(e, 0), 0, n_in - 1, at + " input");
    int64_t output = c.int_in(&j.item(e, 1), 0, calls - 1, at + " output");
    if (plan.tensors[(size_t)plan.inputs[(size_t)position]].role != Role::State)
      refuse(at + " names input " + std::to_string(position) + ", which is not a state tensor");
    positions.insert(position);
    outs.insert(output);
    plan.state.push_back({position, output});
  }
  if (positions.size() != plan.state.size() || outs.size() != plan.state.size())
    refuse("a state input or output position listed twice");
  for (int64_t k = 0; k < n_in; ++k)
    if (plan.tensors[(size_t)plan.inputs[(size_t)k]].role == Role::State && !positions.count(k))
      refuse("tensors[" + std::to_string(plan.inputs[(size_t)k]) + "] is a state input the state list "
             "does not name (a state tensor is written in place and passed back as an output)");

  // debug: [output position, node name, result index] for the trailing outputs
  const JValue* debug = j.member(doc, "debug");
  const int64_t n_out = (int64_t)plan.outputs.size();
  if (debug != nullptr && (debug->type != JType::Array || debug->count > n_out))
    refuse("a debug list longer than the outputs");
  const int64_t first = n_out - (debug ? debug->count : 0);
  for (uint32_t k = 0; debug && k < debug->count; ++k) {
    const JValue& e = j.item(*debug, k);
    std::string at = "debug[" + std::to_string(k) + "]";
    size_t chars = 0;
    if (e.type == JType::Array && e.count == 3 && j.item(e, 1).type == JType::String)
      for (unsigned char ch : j.str(j.item(e, 1))) chars += (ch & 0xC0) != 0x80;
    if (e.type != JType::Array || e.count != 3 || j.item(e, 1).type != JType::String || chars > 4096)
      refuse(at + " is not [output, node name, result index]");
    c.int_in(&j.item(e, 0), first + k, first + k, at + " output");
    c.int_in(&j.item(e, 2), 0, 1 << 16, at + " result index");
  }
  plan.num_debug = debug ? debug->count : 0;
}

}  // namespace

void check_plan_doc(const Json& j, const JValue& doc, const ExprTable* exprs, Plan& plan) {
  Checker c{j};
  c.exprs = exprs;
  const JValue* tensors = j.member(doc, "tensors");
  if (tensors == nullptr || tensors->type != JType::Array || tensors->count > kMaxTensors) refuse("no tensor table");
  check_tensors(j, c, *tensors, plan);
  const JValue* ops = j.member(doc, "ops");
  if (ops == nullptr || ops->type != JType::Array || ops->count > kMaxTensors) refuse("no op list");
  check_ops(j, c, *ops, plan);
  check_io_state_debug(j, c, doc, plan);
}

}  // namespace opforge::rt::cpu::blob_detail
