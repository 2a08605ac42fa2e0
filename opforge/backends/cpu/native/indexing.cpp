// Indexing with one index tensor on one dimension: a gather of rows (`index`, ATen's
// index.Tensor, e.g. rotary cos/sin tables read at the positions) and writes of rows
// (`index_put`, `index_copy`: a KV cache written at the positions of a decoding step).
//
// Every tensor is viewed around the indexed dimension as (outer, N, inner); n is the
// index's element count.
//
// Contract of `index`: ins [self (outer, N, inner), index], outs [out (outer, n, inner)].
// Contract of `index_put` and `index_copy`: ins [self (outer, N, inner), index,
//   values (outer, n, inner)], outs [out (outer, N, inner)]. `out` is either `self` itself
//   (same root, same offset: the write happens in place, so `self` must be writable, which
//   the common checks allow only for a tensor the blob marks as program state) or a tensor
//   of another root, into which `self` is copied first. Neither `index` nor `values` may
//   share `out`'s root (they are read while it is written).
// All kinds: no attributes, no post-ops; self, values and out of one dtype (any: rows are
//   copied as bytes), or (index_put, index_copy: a half-precision KV cache's write) self and
//   out float16 or bfloat16 and values float32, each value rounded to nearest even as torch's
//   `.to()` does (half.h); index int64 or int32 of any shape; every tensor row-major and dense
//   (its elements fill its span, inside its root's storage: ofc_add_tensor checked that).
// Indices: `index` and `index_put` count a negative index from the end (ATen's advanced
//   indexing); `index_copy` refuses it (ATen's index_copy_). Every index is checked before
//   anything is written: a bad one fails the call and leaves `out` untouched.
// Work: one row copy of `inner` elements per (outer, index) pair (the elements of `values`
//   or of `out`, bounded by storage), plus one copy of `self` when `out` is not `self`.
#include <algorithm>
#include <cstring>

#include "engine.h"
#include "half.h"
#include "loops.h"

namespace ofc {

namespace {

// the op's ATen name, for run-time errors in the runtime's style
const char* aten_name(const std::string& kind) {
  if (kind == "index") return "aten::index.Tensor";
  if (kind == "index_put") return "aten::index_put";
  return "aten::index_copy";
}

struct IndexOp : Op {
  std::string kind;
  bool put = false, wrap = true;
  int32_t half = 0;      // F16 or BF16: float32 values rounded into a half-precision self
  bool vector = false;   // half.h's vector paths
  int64_t outer = 0, N = 0, inner = 0, n = 0, item = 0;
  std::vector<int64_t> rows;  // the checked rows of one call (sized at build)

  // every index of this call in [0, N), or the call fails before anything is written
  void check_rows(Engine& e) {
    const Tensor& ix = e.tensors[(size_t)ins[1]];
    const void* ip = e.ptr(ins[1]);
    int64_t lo = 0, hi = 0;
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) {
      int64_t r = load_as<int64_t>(ip, ix.dtype, i);
      lo = i == 0 ? r : std::min(lo, r);
      hi = i == 0 ? r : std::max(hi, r);
      int64_t row = r < 0 && wrap ? r + N : r;  // N <= 2^40: no overflow for r < 0
      if (row < 0 || row >= N) bad = true;
      rows[(size_t)i] = row;
    }
    if (bad)
      fail(std::string("`") + aten_name(kind) + "`: index — found values in [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "] — valid: [" + std::to_string(wrap ? -N : 0) + ", " +
           std::to_string(N - 1) + "] for a dimension of size " + std::to_string(N) +
           " — check the indices against the tensor's shape (nothing was written)");
  }

  void run(Engine& e) override {
    check_rows(e);
    const char* src = static_cast<const char*>(e.ptr(ins[0]));
    char* out = static_cast<char*>(e.ptr(outs[0]));
    size_t row = (size_t)(inner * item);
    if (!put) {  // gather: out[o, i] = self[o, rows[i]]
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(out + (o * n + i) * (int64_t)row, src + (o * N + rows[(size_t)i]) * (int64_t)row, row);
      return;
    }
    if (out != src) std::memcpy(out, src, (size_t)(outer * N) * row);
    const char* values = static_cast<const char*>(e.ptr(ins[2]));
    for (int64_t o = 0; o < outer; ++o)  // repeated rows: the last write wins, as ATen on a CPU
      for (int64_t i = 0; i < n; ++i) {
        char* to = out + (o * N + rows[(size_t)i]) * (int64_t)row;
        if (half != 0)  // (values: float32 rows of `inner` elements)
          f32_to_half(reinterpret_cast<const float*>(values) + (o * n + i) * inner,
                      reinterpret_cast<uint16_t*>(to), inner, half, vector);
        else
          std::memcpy(to, values + (o * n + i) * (int64_t)row, row);
      }
  }
};

}  // namespace

void contract_indexing(const Engine& e, const OpCall& c) {
  bool put = c.kind != "index";
  need_count(c, put ? 3 : 2, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.empty() && c.fa.empty(), c.kind, "takes no attributes");
  const Tensor& self = e.tensors[(size_t)c.ins[0]];
  const Tensor& ix = e.tensors[(size_t)c.ins[1]];
  const Tensor& out = e.tensors[(size_t)c.outs[0]];
  need_rank(self, 3, 3, c.kind, "self (outer, N, inner)");
  need_rank(out, 3, 3, c.kind, "the output (outer, rows, inner)");
  need(ix.dtype == I64 || ix.dtype == I32, c.kind, "the index must be int64 or int32");
  need(out.dtype == self.dtype, c.kind, "self and the output must have one dtype");
  need(row_major(self) && dense(self) && row_major(ix) && dense(ix) && row_major(out) && dense(out),
       c.kind, "self, the index and the output must be contiguous");
  int64_t outer = self.dims[0], inner = self.dims[2];
  int64_t rows = put ? self.dims[1] : ix.numel;
  need(out.dims[0] == outer && out.dims[1] == rows && out.dims[2] == inner, c.kind,
       "the output must be (outer, " + std::string(put ? "N" : "index elements") + ", inner) of self");
  int out_root = e.root(c.outs[0]);
  need(e.root(c.ins[1]) != out_root, c.kind, "the index shares the output's storage");
  if (!put) {
    need(e.root(c.ins[0]) != out_root, c.kind, "self shares the output's storage");
    return;
  }
  const Tensor& values = e.tensors[(size_t)c.ins[2]];
  need_rank(values, 3, 3, c.kind, "the values (outer, index elements, inner)");
  const bool half = self.dtype == F16 || self.dtype == BF16;
  need(values.dtype == self.dtype || (half && values.dtype == F32), c.kind,
       "self and the values must have one dtype (or float16/bfloat16 self, float32 values)");
  need(row_major(values) && dense(values), c.kind, "the values must be contiguous");
  need(values.dims[0] == outer && values.dims[1] == ix.numel && values.dims[2] == inner, c.kind,
       "the values must be (outer, index elements, inner) of self");
  need(e.root(c.ins[2]) != out_root, c.kind, "the values share the output's storage");
  if (e.root(c.ins[0]) == out_root)  // in place: exactly self, never an overlapping part of it
    need(self.offset == out.offset, c.kind, "the output overlaps self without being self");
}

void build_indexing(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  const Tensor& self = e.tensors[(size_t)c.ins[0]];
  auto op = std::make_unique<IndexOp>();
  op->kind = c.kind;
  op->put = c.kind != "index";
  op->wrap = c.kind != "index_copy";
  op->outer = self.dims[0];
  op->N = self.dims[1];
  op->inner = self.dims[2];
  op->n = e.tensors[(size_t)c.ins[1]].numel;
  op->item = (int64_t)itemsize(self.dtype);
  if (op->put && e.tensors[(size_t)c.ins[2]].dtype != self.dtype) {  // F32 into F16/BF16
    op->half = self.dtype;
    op->vector = half_vector_allowed();
  }
  mul_c(op->inner, op->item, c.kind.c_str());  // a row's bytes (bounded by the span checks)
  e.reserve(mul_c(op->n, (int64_t)sizeof(int64_t), "index rows"), "index rows");
  op->rows.assign((size_t)op->n, 0);
  op->name = c.kind;
  push_op(e, std::move(op), c);
}

}  // namespace ofc
