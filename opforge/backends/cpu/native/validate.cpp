// The validation layer: every op the blob asks for passes here before any primitive,
// memory or loop plan exists for it.
//
// validate() checks what holds for every kind (ids, at most one pending post-op chain that
// the kind can take, no write to a constant or a delegate input, wherever it lives), then
// calls the kind's contract, which lives beside the kind's engine code in its family file
// and states, for that kind: operand counts (exact), ranks, dtypes, shapes, layouts, the
// storage every walk reaches (checked arithmetic), and a work bound (a loop's iterations
// are at most the elements of a storage it writes or reads without repetition).
//
// Tensors themselves were checked when added (ofc_add_tensor): rank <= 8, dims and strides
// in [0, 2^40], span and element count computed with checked arithmetic, aliases inside
// their root's storage and naming their root directly.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "engine.h"

namespace ofc {

bool read_only(const Engine& e, int id) {
  const Tensor& r = e.tensors[(size_t)e.root(id)];
  return r.is_const || r.storage == BOUND_INPUT;
}

bool row_major(const Tensor& t) {
  int64_t step = 1;
  for (int k = (int)t.dims.size() - 1; k >= 0; --k) {
    if (t.dims[(size_t)k] != 1 && t.strides[(size_t)k] != step) return false;
    step = mul_c(step, std::max<int64_t>(t.dims[(size_t)k], 1), "row-major strides");
  }
  return true;
}

bool dense(const Tensor& t) { return t.span == t.numel; }

dims_t dnnl_dims(const Tensor& t) { return t.dims.empty() ? dims_t{1} : t.dims; }

// Sufficient for no two indices to reach one element: sorted by stride, each stride passes
// the reach of all smaller ones. Every layout the lowering writes (row-major, channels-last,
// permutations, slices) passes; a zero or overlapping stride on an extent > 1 does not.
bool injective(const dims_t& dims, const dims_t& strides) {
  std::vector<std::pair<int64_t, int64_t>> walk;  // (|stride|, extent)
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0) return true;  // no element at all
    if (dims[k] > 1) walk.emplace_back(strides[k] < 0 ? -strides[k] : strides[k], dims[k]);
  }
  std::sort(walk.begin(), walk.end());
  int64_t reach = 0;  // largest offset the smaller strides reach
  for (auto& [s, d] : walk) {
    if (s <= reach) return false;
    reach = add_c(reach, mul_c(d - 1, s, "walk"), "walk");
  }
  return true;
}

// off + idx·strides stays in [0, span) for every idx < dims (checked: no wrap)
void check_reach(const dims_t& dims, const dims_t& strides, int64_t off, int64_t span,
                 const char* what) {
  if (dims.size() != strides.size()) fail(std::string(what) + ": dims and strides differ in rank");
  int64_t lo = off, hi = off;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] < 0) fail(std::string(what) + ": negative size");
    if (dims[k] == 0) return;  // reaches nothing
  }
  for (size_t k = 0; k < dims.size(); ++k) {
    int64_t reach = mul_c(dims[k] - 1, strides[k], what);
    if (reach < 0) lo = add_c(lo, reach, what); else hi = add_c(hi, reach, what);
  }
  if (lo < 0 || hi >= span)
    fail(std::string(what) + ": reads or writes outside its tensor (elements " + std::to_string(lo) +
         ".." + std::to_string(hi) + " of " + std::to_string(span) + ")");
}

int64_t count_of(const dims_t& dims, const char* what) {
  int64_t n = 1;
  for (auto d : dims) {
    if (d < 0) fail(std::string(what) + ": negative size");
    n = mul_c(n, d, what);
  }
  return n;
}

void need(bool ok, const std::string& kind, const std::string& what) {
  if (!ok) fail(kind + ": " + what);
}

void need_rank(const Tensor& t, size_t lo, size_t hi, const std::string& kind, const char* what) {
  if (t.dims.size() < lo || t.dims.size() > hi)
    fail(kind + ": " + what + " has rank " + std::to_string(t.dims.size()) + ", valid: " +
         std::to_string(lo) + (lo == hi ? "" : ".." + std::to_string(hi)));
}

void need_dtype(const Tensor& t, int32_t dt, const std::string& kind, const char* what) {
  if (t.dtype != dt)
    fail(kind + ": " + what + " has dtype code " + std::to_string(t.dtype) + ", valid: " + std::to_string(dt));
}

void need_count(const OpCall& c, size_t n_in, size_t n_out) {
  if (c.ins.size() != n_in || c.outs.size() != n_out)
    fail(c.kind + ": " + std::to_string(c.ins.size()) + " inputs and " + std::to_string(c.outs.size()) +
         " outputs, valid: " + std::to_string(n_in) + " and " + std::to_string(n_out));
}

// a tensor handed to a oneDNN primitive: a oneDNN dtype, no element reached twice (oneDNN
// reads and writes its memory as a plain layout of its dims)
void need_dnnl_operand(const Engine& e, int id, const std::string& kind, const char* what) {
  const Tensor& t = e.tensors[(size_t)id];
  if (t.dtype != F32 && t.dtype != I32 && t.dtype != I8 && t.dtype != U8)
    fail(kind + ": " + what + " has dtype code " + std::to_string(t.dtype) + ", which oneDNN does not take");
  if (!injective(t.dims, t.strides))
    fail(kind + ": " + what + " has overlapping strides (an element reached twice)");
}

void need_post_ops_allowed(const OpCall& c, bool allowed) {
  if (!allowed && !c.post.empty()) fail(c.kind + ": takes no post-ops");
}

dims_t take(const std::vector<int64_t>& ia, size_t& k, size_t n) {
  if (n > ia.size() || k > ia.size() - n) fail("attributes too short");
  dims_t out(ia.begin() + (long)k, ia.begin() + (long)(k + n));
  k += n;
  return out;
}

namespace {

using Contract = void (*)(const Engine&, const OpCall&);

const std::unordered_map<std::string, Contract>& contracts() {
  static const std::unordered_map<std::string, Contract> table = {
      {"conv", contract_conv},           {"deconv", contract_conv},
      {"matmul", contract_matmul},       {"pool", contract_pool},
      {"eltwise", contract_eltwise},     {"binary", contract_binary},
      {"softmax", contract_softmax},     {"layer_norm", contract_layer_norm},
      {"rms_norm", contract_rms_norm},   {"rope", contract_rope},
      {"attention", contract_attention},
      {"group_norm", contract_group_norm}, {"reduction", contract_reduction},
      {"reduce", contract_reduce},       {"copy", contract_copy},
      {"ew", contract_ew},               {"qconv", contract_int8},
      {"qmatmul", contract_int8},        {"quant", contract_quant},
      {"embedding", contract_embedding}, {"index", contract_indexing},
      {"index_put", contract_indexing},  {"index_copy", contract_indexing},
      {"int_matmul", contract_int_matmul}, {"int_embedding", contract_int_embedding},
      {"int_dot_matmul", contract_int_dot_matmul},
  };
  return table;
}

void common(const Engine& e, const std::string& kind, const std::vector<int>& ins,
            const std::vector<int>& outs) {
  for (int id : ins)
    if (id < 0 || (size_t)id >= e.tensors.size()) fail(kind + ": tensor id " + std::to_string(id) + " out of range");
  for (int id : outs) {
    if (id < 0 || (size_t)id >= e.tensors.size()) fail(kind + ": tensor id " + std::to_string(id) + " out of range");
    if (read_only(e, id))
      fail(kind + ": writes tensor " + std::to_string(id) + ", which is " +
           (e.tensors[(size_t)e.root(id)].is_const ? "a constant" : "a delegate input") +
           " (read-only: it may live in the program's read-only mapping; a delegate writes only "
           "the inputs its blob marks as program state)");
  }
}

}  // namespace

void validate(const Engine& e, const OpCall& c) {
  auto it = contracts().find(c.kind);
  if (it == contracts().end()) fail("unknown op kind '" + c.kind + "'");
  common(e, c.kind, c.ins, c.outs);
  // half-precision tensors are a KV cache's storage: only its write and attention read them
  // (and int_dot_matmul its f16 weight scales, checked by its contract)
  if (c.kind != "index" && c.kind != "index_put" && c.kind != "index_copy" && c.kind != "attention" &&
      c.kind != "int_dot_matmul")
    for (const auto* list : {&c.ins, &c.outs})
      for (int id : *list)
        need(e.tensors[(size_t)id].dtype != F16 && e.tensors[(size_t)id].dtype != BF16, c.kind,
             "a float16 or bfloat16 operand (the engine reads them in the KV cache's write and "
             "attention only)");
  for (const PostOp& p : c.post) {
    if (p.binary) {
      need(p.tensor >= 0 && (size_t)p.tensor < e.tensors.size(), c.kind, "post-op tensor id out of range");
      need_dnnl_operand(e, p.tensor, c.kind, "a binary post-op operand");
      // float ops only take binary post-ops (the lowering fuses nothing else), and the
      // engine's exact NaN epilogue (nan.cpp) reads the operand as float32; int8 ops run
      // every post-op in oneDNN (no epilogue) and add a uint8 residual (quantization.cpp)
      bool int8 = c.kind == "qconv" || c.kind == "qmatmul";
      int32_t dt = e.tensors[(size_t)p.tensor].dtype;
      need(dt == F32 || (int8 && dt == U8), c.kind,
           "a binary post-op operand that is not float32 (int8 ops: or uint8)");
      need(c.outs.size() == 1, c.kind, "post-ops on an op without one output");
      dims_t o = dnnl_dims(e.tensors[(size_t)c.outs[0]]), b = dnnl_dims(e.tensors[(size_t)p.tensor]);
      need(b.size() == o.size(), c.kind, "a binary post-op operand of another rank than the output");
      for (size_t k = 0; k < b.size(); ++k)
        need(b[k] == o[k] || b[k] == 1, c.kind, "a binary post-op operand that does not broadcast");
    }
  }
  it->second(e, c);
}

void validate_callout(const Engine& e, const std::vector<int>& ins, const std::vector<int>& outs,
                      const char* what) {
  common(e, what, ins, outs);
  for (const auto* list : {&ins, &outs})
    for (int id : *list) {
      const Tensor& t = e.tensors[(size_t)id];
      // the call-out ABI passes sizes only: the elements must be C-contiguous, and all of
      // them inside the tensor's storage
      if (!row_major(t) || t.numel > e.avail(id))
        fail(std::string(what) + ": tensor " + std::to_string(id) +
             " is not C-contiguous within its storage (the call-out ABI passes sizes only)");
    }
}

}  // namespace ofc
