// Indexing by index tensors along one dim: embedding, index_select, gather, the scatter
// forms, slice/select scatter and the triangle masks tril/triu. Every index is checked
// against its dimension before anything is written (negative indices refused where the
// NumPy kernels refuse them: embedding, index_select, gather, scatter);
// opforge/kernels/portable/indexing.py is the specification. Advanced indexing
// (index.Tensor, index_put) is advanced_indexing.cpp.
#include <cmath>
#include <cstring>
#include <vector>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

bool index_tensor(opforge_context* ctx, const char* op, const View& index) {
  if (index_dtype(index.dtype) && index.dtype != kUInt8) return true;
  fail(ctx, "%s: index — found dtype %s — valid: an integer index tensor (int64 or int32) — "
       "re-export the program", op, dtype_name(index.dtype));
  return false;
}

// Every value of `index` in [low, size): else ctx failed with the range found.
bool check_range(opforge_context* ctx, const char* op, const View& index, int64_t size, bool negative) {
  if (index.numel == 0) return true;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for_each_element(index, index, [&](char* p, char*, const int64_t*) {
    int64_t v = read_index(p, index.dtype);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  });
  int64_t low = negative ? -size : 0;
  if (lo >= low && hi < size) return true;
  fail(ctx, "%s: index — found values in [%lld, %lld] — valid: [%lld, %lld] for a dimension of "
       "size %lld — check the indices against the tensor's shape", op, (long long)lo,
       (long long)hi, (long long)low, (long long)(size - 1), (long long)size);
  return false;
}

void embedding_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::embedding.out";
  OPF_TENSOR(0, "weight", weight);
  OPF_TENSOR(1, "indices", indices);
  OPF_TENSOR(5, "out", out);
  if (weight.rank < 1 || indices.rank + weight.rank - 1 > kMaxRank || !index_tensor(ctx, kOp, indices)) {
    if (ctx->status == 0)
      fail(ctx, "%s: weight — found rank %d — valid: rank >= 1 — re-export the program", kOp, weight.rank);
    return;
  }
  int64_t sizes[kMaxRank];
  int r = 0;
  for (int d = 0; d < indices.rank; ++d) sizes[r++] = indices.sizes[d];
  for (int d = 1; d < weight.rank; ++d) sizes[r++] = weight.sizes[d];
  if (!check_shape(ctx, kOp, out, sizes, r) || !check_range(ctx, kOp, indices, weight.sizes[0], false))
    return;
  int row_rank = weight.rank - 1;
  bool fast = out.dense && out.dtype == weight.dtype;
  int64_t row_bytes = itemsize(weight.dtype), witem = itemsize(weight.dtype);
  bool row_dense = true;
  for (int d = weight.rank - 1, expect = 1; d >= 1; --d) {
    if (weight.sizes[d] != 1 && weight.strides[d] != expect) row_dense = false;
    expect *= static_cast<int>(weight.sizes[d] > 0 ? weight.sizes[d] : 1);
    row_bytes *= weight.sizes[d];
  }
  fast = fast && row_dense;
  int64_t k = 0;
  for_each_element(indices, indices, [&](char* p, char*, const int64_t* idx) {
    int64_t row = read_index(p, indices.dtype);
    const char* src = weight.data + row * weight.strides[0] * witem;
    if (fast) {
      std::memcpy(out.data + k * row_bytes, src, row_bytes);
    } else {
      int64_t off = 0;
      for (int d = 0; d < indices.rank; ++d) off += idx[d] * out.strides[d];
      convert_strided(out.data + off * itemsize(out.dtype), out.dtype, out.strides + indices.rank,
                      src, weight.dtype, weight.strides + 1, weight.sizes + 1, row_rank);
    }
    ++k;
  });
  if (!fast && !convertible(out.dtype)) fail(ctx, "%s: out — dtype %s", kOp, dtype_name(out.dtype));
}

void index_select_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::index_select.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "index", index);
  OPF_TENSOR(3, "out", out);
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d) || !index_tensor(ctx, kOp, index)) return;
  if (index.rank > 1) {
    fail(ctx, "%s: index — found rank %d — valid: a 0-d or 1-d index — re-export the program",
         kOp, index.rank);
    return;
  }
  // a 0-d self is indexed as a 1-element vector
  int64_t one = 1, zero = 0;
  const int64_t* ssizes = self.rank ? self.sizes : &one;
  const int64_t* sstrides = self.rank ? self.strides : &zero;
  int rank = self.rank ? self.rank : 1;
  int64_t sizes[kMaxRank];
  for (int k = 0; k < rank; ++k) sizes[k] = ssizes[k];
  sizes[d] = index.numel;
  if (self.rank == 0 && out.rank == 0) {
    if (index.numel != 1) {
      fail(ctx, "%s: index — found %lld values for a 0-d out — valid: one", kOp, (long long)index.numel);
      return;
    }
  } else if (!check_shape(ctx, kOp, out, sizes, rank)) {
    return;
  }
  if (!check_range(ctx, kOp, index, ssizes[d], false)) return;
  int64_t ostrides[kMaxRank], osizes[kMaxRank], item = itemsize(self.dtype), oitem = itemsize(out.dtype);
  for (int k = 0; k < rank; ++k) osizes[k] = ssizes[k], ostrides[k] = out.rank ? out.strides[k] : 0;
  osizes[d] = 1;
  int64_t k = 0;
  for_each_element(index, index, [&](char* p, char*, const int64_t*) {
    int64_t i = read_index(p, index.dtype);
    copy_checked(ctx, kOp, out.data + k * ostrides[d] * oitem, out.dtype, ostrides,
                 self.data + i * sstrides[d] * item, self.dtype, sstrides, osizes, rank);
    ++k;
  });
}

void gather_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::gather.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "index", index);
  OPF_TENSOR(4, "out", out);
  if (!index_tensor(ctx, kOp, index)) return;
  if (self.rank == 0) {
    int64_t zeros[kMaxRank] = {};
    copy_checked(ctx, kOp, out.data, out.dtype, out.strides, self.data, self.dtype, zeros, out.sizes, out.rank);
    return;
  }
  if (index.numel == 0) return;  // ATen returns before checking an empty index's rank
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d) || !check_shape(ctx, kOp, out, index.sizes, index.rank)) return;
  bool fits = index.rank == self.rank;
  for (int k = 0; fits && k < self.rank; ++k) fits = k == d || index.sizes[k] <= self.sizes[k];
  if (!fits) {
    fail(ctx, "%s: index — its shape exceeds self's outside dim %lld (or its rank differs) — "
         "valid: index.size(d) <= self.size(d) for d != dim — re-export the program", kOp, (long long)d);
    return;
  }
  if (!check_range(ctx, kOp, index, self.sizes[d], false)) return;
  if (!convertible(out.dtype) || !convertible(self.dtype)) {
    fail(ctx, "%s: out — dtype %s", kOp, dtype_name(out.dtype));
    return;
  }
  int64_t item = itemsize(self.dtype);
  bool same = out.dtype == self.dtype;
  for_each_element(index, out, [&](char* p, char* po, const int64_t* idx) {
    int64_t off = read_index(p, index.dtype) * self.strides[d];
    for (int k = 0; k < self.rank; ++k)
      if (k != d) off += idx[k] * self.strides[k];
    if (same) std::memcpy(po, self.data + off * item, item);
    else store_double(po, out.dtype, load_double(self.data + off * item, self.dtype));
  });
}

// --- scatter --------------------------------------------------------------------------------

enum Reduce { kAssign, kAdd, kMultiply };

// dst[0] = dst[0] (op) value, in dst's dtype (float16 rounded once, as NumPy's ufuncs do)
void combine(char* dst, int32_t dtype, const char* src, int32_t src_dtype, Reduce r) {
  if (r == kAssign) {
    if (dtype == src_dtype) std::memcpy(dst, src, itemsize(dtype));
    else store_double(dst, dtype, load_double(src, src_dtype));
    return;
  }
  if (is_integral(dtype, false)) {  // wrapping integer arithmetic, as NumPy's
    uint64_t a = static_cast<uint64_t>(load_int64(dst, dtype)), b = static_cast<uint64_t>(load_int64(src, src_dtype));
    store_scalar(dst, dtype, 0, static_cast<int64_t>(r == kAdd ? a + b : a * b), true);
    return;
  }
  double a = load_double(dst, dtype), b = load_double(src, src_dtype);
  if (dtype == kFloat32) b = static_cast<float>(b);
  if (dtype == kFloat16) b = half_to_float(double_to_half(b));
  store_double(dst, dtype, r == kAdd ? a + b : a * b);
}

bool reduce_arg(opforge_context* ctx, opforge_arg* args, int64_t n, int64_t i, const char* op, Reduce* r) {
  if (i >= n || args[i].tag != OPFORGE_ARG_STRING || args[i].v.list.size < 0 ||
      (args[i].v.list.size && !args[i].v.list.data)) {
    fail(ctx, "%s: reduce (argument %lld) — found no string — valid: 'add' or 'multiply'", op, (long long)i);
    return false;
  }
  const char* s = static_cast<const char*>(args[i].v.list.data);
  int64_t len = args[i].v.list.size;
  auto is = [&](const char* w) { return static_cast<int64_t>(std::strlen(w)) == len && std::memcmp(s, w, len) == 0; };
  if (is("add") || is("sum")) { *r = kAdd; return true; }
  if (is("multiply") || is("prod")) { *r = kMultiply; return true; }
  fail(ctx, "%s: reduce='%.*s' — is not a scatter reduction — valid: 'add', 'multiply' — pass "
       "one of these", op, static_cast<int>(len > 64 ? 64 : len), s);
  return false;
}

// Where a scatter writes: self's shape (a 0-d tensor scatters like a 1-element vector), the
// dim, and src (absent for a value). prepare() validates the operands and copies self into
// out; each() visits index in row-major order with f(out offset in elements, row-major
// position in out, src element or nullptr).
struct ScatterPlan {
  const char* op;
  const View* index;
  const View* src;  // nullptr: a value
  const View* out;
  int64_t d = 0, one = 1, zero = 0;
  const int64_t* sizes = nullptr;
  const int64_t* ostrides = nullptr;

  bool prepare(opforge_context* ctx, const View& self, int64_t dim) {
    if (!check_shape(ctx, op, *out, self.sizes, self.rank) || !index_tensor(ctx, op, *index)) return false;
    if (!convertible(out->dtype) || !convertible(self.dtype) || (src && !convertible(src->dtype))) {
      fail(ctx, "%s: out — dtype %s — valid: a real dtype", op, dtype_name(out->dtype));
      return false;
    }
    sizes = self.rank ? self.sizes : &one;
    ostrides = self.rank ? out->strides : &zero;
    if (index->numel) {
      if (!wrap_dim(ctx, op, dim, self.rank, &d)) return false;
      bool fits = index->rank == self.rank || (self.rank == 0 && index->rank <= 1);
      for (int k = 0; fits && k < index->rank; ++k)
        fits = (k == d || index->sizes[k] <= sizes[k]) &&
               (!src || src->rank == 0 || (src->rank == index->rank && index->sizes[k] <= src->sizes[k]));
      if (!fits) {
        fail(ctx, "%s: index — its shape exceeds self's outside dim %lld or src's (or its rank "
             "differs) — valid: index.size(d) <= self.size(d) for d != dim, <= src.size(d) — "
             "re-export the program", op, (long long)d);
        return false;
      }
      if (!check_range(ctx, op, *index, sizes[d], false)) return false;
    }
    return out->data == self.data || !self.numel ||
           copy_checked(ctx, op, out->data, out->dtype, out->strides, self.data, self.dtype,
                        self.strides, self.sizes, self.rank);
  }

  template <typename F>
  void each(F&& f) const {
    const int irank = index->rank;
    const int64_t sitem = src ? itemsize(src->dtype) : 0;
    for_each_element(*index, *index, [&](char* p, char*, const int64_t* idx) {
      const int64_t at = read_index(p, index->dtype);
      int64_t off = at * ostrides[d], flat = 0;
      for (int k = 0; k < irank; ++k) {
        if (k != d) off += idx[k] * ostrides[k];
        flat = flat * sizes[k] + (k == d ? at : idx[k]);
      }
      const char* from = nullptr;
      if (src) {
        int64_t soff = 0;
        for (int k = 0; k < src->rank; ++k) soff += idx[k] * src->strides[k];
        from = src->data + soff * sitem;
      }
      f(off, flat, from);
    });
  }
};

// scatter(self, dim, index, src or value, [reduce], out)
void scatter(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp, bool value,
             int64_t reduce_index, Reduce fixed, int64_t out_index) {
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "index", index);
  OPF_TENSOR(out_index, "out", out);
  Reduce reduce = fixed;
  if (reduce_index >= 0 && !reduce_arg(ctx, args, n, reduce_index, kOp, &reduce)) return;
  View src;
  double vd = 0;
  int64_t vi = 0;
  bool vint = false;
  if (value) {
    if (!scalar_arg(ctx, args, n, 3, kOp, "value", &vd, &vi, &vint)) return;
  } else if (!tensor_arg(ctx, args, n, 3, kOp, "src", &src)) {
    return;
  }
  ScatterPlan plan{kOp, &index, value ? nullptr : &src, &out};
  if (!plan.prepare(ctx, self, dim) || index.numel == 0) return;
  alignas(16) char constant[16];
  if (value) store_scalar(constant, out.dtype, vd, vi, vint);
  const int64_t oitem = itemsize(out.dtype);
  plan.each([&](int64_t off, int64_t, const char* from) {
    combine(out.data + off * oitem, out.dtype, from ? from : constant,
            from ? src.dtype : out.dtype, reduce);
  });
}

void scatter_src_out(opforge_context* c, opforge_arg* a, int64_t n) { scatter(c, a, n, "aten::scatter.src_out", false, -1, kAssign, 4); }
void scatter_value_out(opforge_context* c, opforge_arg* a, int64_t n) { scatter(c, a, n, "aten::scatter.value_out", true, -1, kAssign, 4); }
void scatter_reduce_out(opforge_context* c, opforge_arg* a, int64_t n) { scatter(c, a, n, "aten::scatter.reduce_out", false, 4, kAssign, 5); }
void scatter_value_reduce_out(opforge_context* c, opforge_arg* a, int64_t n) { scatter(c, a, n, "aten::scatter.value_reduce_out", true, 4, kAssign, 5); }
void scatter_add_out(opforge_context* c, opforge_arg* a, int64_t n) { scatter(c, a, n, "aten::scatter_add.out", false, -1, kAdd, 4); }

// --- scatter_reduce (two tensors) ------------------------------------------------------------
// out = self, then src's elements folded into the positions index names along dim, in index
// order (NumPy's ufunc.at in out's dtype, as the NumPy kernel): sum and mean add, prod
// multiplies (integers wrap), amax/amin keep the larger/smaller with NaN winning (np.maximum,
// np.minimum: the kept one on a tie). Without include_self a named position starts from the
// fold's identity. mean then divides each named position by its count (self counting once
// with include_self): floats in out's dtype, integers flooring.

enum class Fold { kSum, kProd, kMean, kMax, kMin };

bool fold_arg(opforge_context* ctx, opforge_arg* args, int64_t n, int64_t i, const char* op, Fold* f) {
  static const struct { const char* name; Fold fold; } kFolds[] = {
      {"sum", Fold::kSum}, {"prod", Fold::kProd}, {"mean", Fold::kMean}, {"amax", Fold::kMax},
      {"amin", Fold::kMin}};
  const char* s = nullptr;
  int64_t len = 0;
  if (i < n && args[i].tag == OPFORGE_ARG_STRING && args[i].v.list.size >= 0 &&
      (args[i].v.list.size == 0 || args[i].v.list.data)) {
    s = static_cast<const char*>(args[i].v.list.data);
    len = args[i].v.list.size;
    for (const auto& k : kFolds)
      if (static_cast<int64_t>(std::strlen(k.name)) == len && std::memcmp(s, k.name, len) == 0) {
        *f = k.fold;
        return true;
      }
  }
  fail(ctx, "%s: reduce='%.*s' — is not a scatter reduction — valid: 'sum', 'prod', 'mean', "
       "'amax', 'amin' — pass one of these", op, static_cast<int>(len > 64 ? 64 : len), s ? s : "");
  return false;
}

// The dtypes whose NumPy arithmetic the kernel reproduces (bfloat16 and the wide unsigned
// integers promote differently in NumPy's floor_divide and maximum).
bool fold_dtype(int32_t d) {
  return d == kFloat16 || d == kFloat32 || d == kFloat64 || d == kBool || d == kUInt8 ||
         d == kInt8 || d == kInt16 || d == kInt32 || d == kInt64;
}

void fold_identity(char* p, int32_t dtype, Fold f) {
  if (f == Fold::kSum || f == Fold::kMean || f == Fold::kProd) {
    store_scalar(p, dtype, 0, f == Fold::kProd ? 1 : 0, true);
  } else if (is_floating(dtype)) {
    store_double(p, dtype, f == Fold::kMax ? -INFINITY : INFINITY);
  } else if (dtype == kBool) {
    store_scalar(p, dtype, 0, f == Fold::kMin ? 1 : 0, true);
  } else {
    const int bits = 8 * static_cast<int>(itemsize(dtype));
    const bool sign = dtype != kUInt8;
    const int64_t hi = sign ? (bits == 64 ? INT64_MAX : (int64_t{1} << (bits - 1)) - 1) : (int64_t{1} << bits) - 1;
    const int64_t lo = sign ? -hi - 1 : 0;
    store_scalar(p, dtype, 0, f == Fold::kMax ? lo : hi, true);
  }
}

void fold_into(char* dst, int32_t dtype, const char* src, int32_t src_dtype, Fold f) {
  if (f != Fold::kMax && f != Fold::kMin) {
    combine(dst, dtype, src, src_dtype, f == Fold::kProd ? kMultiply : kAdd);
    return;
  }
  alignas(16) char v[16];  // src cast to out's dtype first, as the NumPy kernel's astype
  combine(v, dtype, src, src_dtype, kAssign);
  bool keep;
  if (is_floating(dtype)) {
    double a = load_double(dst, dtype), b = load_double(v, dtype);
    keep = std::isnan(a) || (!std::isnan(b) && (f == Fold::kMax ? a >= b : a <= b));
  } else {
    int64_t a = load_int64(dst, dtype), b = load_int64(v, dtype);
    keep = f == Fold::kMax ? a >= b : a <= b;
  }
  if (!keep) std::memcpy(dst, v, itemsize(dtype));
}

void scatter_reduce_two_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::scatter_reduce.two_out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "index", index);
  OPF_TENSOR(3, "src", src);
  OPF_BOOL(5, "include_self", include_self);
  OPF_TENSOR(6, "out", out);
  Fold fold;
  if (!fold_arg(ctx, args, n, 4, kOp, &fold)) return;
  if (!fold_dtype(out.dtype)) {
    fail(ctx, "%s: out — found dtype %s — valid: float16/32/64, bool, uint8, int8/16/32/64 — "
         "re-export the program", kOp, dtype_name(out.dtype));
    return;
  }
  ScatterPlan plan{kOp, &index, &src, &out};
  if (!plan.prepare(ctx, self, dim) || index.numel == 0) return;
  const int64_t oitem = itemsize(out.dtype);
  if (!include_self)
    plan.each([&](int64_t off, int64_t, const char*) { fold_identity(out.data + off * oitem, out.dtype, fold); });
  std::vector<int64_t> count;
  if (fold == Fold::kMean) count.assign(static_cast<size_t>(out.numel), 0);
  plan.each([&](int64_t off, int64_t flat, const char* from) {
    fold_into(out.data + off * oitem, out.dtype, from, src.dtype, fold);
    if (fold == Fold::kMean) ++count[static_cast<size_t>(flat)];
  });
  if (fold != Fold::kMean) return;
  const int64_t base = include_self ? 1 : 0;
  plan.each([&](int64_t off, int64_t flat, const char*) {
    int64_t& c = count[static_cast<size_t>(flat)];
    if (c <= 0) return;  // divided already (a repeated index)
    const int64_t by = c + base;
    c = -1;
    char* p = out.data + off * oitem;
    if (is_floating(out.dtype)) {
      alignas(16) char divisor[16];  // the count in out's dtype, as np.divide's operand
      store_scalar(divisor, out.dtype, 0, by, true);
      double a = load_double(p, out.dtype), b = load_double(divisor, out.dtype);
      store_double(p, out.dtype, out.dtype == kFloat16 ? static_cast<double>(static_cast<float>(a) / static_cast<float>(b)) : a / b);
    } else {
      int64_t a = load_int64(p, out.dtype), q = a / by;
      if (a % by != 0 && a < 0) --q;  // floor, by > 0
      store_scalar(p, out.dtype, 0, q, true);
    }
  });
}

// --- slice / select scatter -------------------------------------------------------------------

// out = self, then src written into out's (strided) region of `sizes` at `offset`.
void scatter_region(opforge_context* ctx, const char* kOp, const View& self, const View& src,
                    const View& out, int64_t offset, const int64_t* sizes, const int64_t* ostrides, int rank) {
  int64_t sstrides[kMaxRank];
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  if (!broadcast_strides(ctx, kOp, "src", src, sizes, rank, sstrides)) return;
  if (out.data != self.data && self.numel &&
      !copy_checked(ctx, kOp, out.data, out.dtype, out.strides, self.data, self.dtype, self.strides,
                    self.sizes, self.rank))
    return;
  for (int k = 0; k < rank; ++k)
    if (sizes[k] == 0) return;
  copy_checked(ctx, kOp, out.data + offset * itemsize(out.dtype), out.dtype, ostrides, src.data,
               src.dtype, sstrides, sizes, rank);
}

void slice_scatter_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::slice_scatter.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "src", src);
  OPF_INT(2, "dim", dim);
  OPF_INT(5, "step", step);
  OPF_TENSOR(6, "out", out);
  int64_t d;
  if (self.rank == 0 || !wrap_dim(ctx, kOp, dim, self.rank, &d)) {
    if (self.rank == 0) fail(ctx, "%s: self — found a 0-d tensor — valid: rank >= 1", kOp);
    return;
  }
  if (step <= 0) {
    fail(ctx, "%s: step — found %lld — valid: step >= 1 — re-export the program", kOp, (long long)step);
    return;
  }
  int64_t size = self.sizes[d], start = 0, end = size;
  if (!is_none(args, n, 3) && !int_arg(ctx, args, n, 3, kOp, "start", &start)) return;
  if (!is_none(args, n, 4) && !int_arg(ctx, args, n, 4, kOp, "end", &end)) return;
  if (start < 0) start = start < -size ? 0 : start + size;
  if (end < 0) end = end < -size ? 0 : end + size;
  if (start > size) start = size;
  if (end > size) end = size;
  int64_t sizes[kMaxRank], strides[kMaxRank];
  for (int k = 0; k < self.rank; ++k) sizes[k] = self.sizes[k], strides[k] = out.rank == self.rank ? out.strides[k] : 0;
  sizes[d] = end > start ? (end - start - 1) / step + 1 : 0;
  strides[d] *= step;
  scatter_region(ctx, kOp, self, src, out, start * (out.rank == self.rank ? out.strides[d] : 0), sizes, strides, self.rank);
}

void select_scatter_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::select_scatter.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "src", src);
  OPF_INT(2, "dim", dim);
  OPF_INT(3, "index", index);
  OPF_TENSOR(4, "out", out);
  int64_t d;
  if (self.rank == 0 || !wrap_dim(ctx, kOp, dim, self.rank, &d)) {
    if (self.rank == 0) fail(ctx, "%s: self — found a 0-d tensor — valid: rank >= 1", kOp);
    return;
  }
  int64_t size = self.sizes[d];
  if (index < -size || index >= size) {
    fail(ctx, "%s: index — found %lld — valid: [%lld, %lld] for dim %lld of size %lld — check "
         "the index against the tensor's shape", kOp, (long long)index, (long long)-size,
         (long long)(size - 1), (long long)d, (long long)size);
    return;
  }
  if (index < 0) index += size;
  if (out.rank != self.rank) {
    check_shape(ctx, kOp, out, self.sizes, self.rank);
    return;
  }
  int64_t sizes[kMaxRank], strides[kMaxRank];
  int r = 0;
  for (int k = 0; k < self.rank; ++k)
    if (k != d) sizes[r] = self.sizes[k], strides[r++] = out.strides[k];
  scatter_region(ctx, kOp, self, src, out, index * out.strides[d], sizes, strides, r);
}

// --- tril / triu ------------------------------------------------------------------------------

template <bool kLower>
void triangle(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp) {
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "diagonal", diagonal);
  OPF_TENSOR(2, "out", out);
  if (self.rank < 2) {
    fail(ctx, "%s: self — found rank %d — valid: rank >= 2 — re-export the program", kOp, self.rank);
    return;
  }
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  if (out.data != self.data &&
      !copy_checked(ctx, kOp, out.data, out.dtype, out.strides, self.data, self.dtype, self.strides,
                    self.sizes, self.rank))
    return;
  alignas(16) char zero[16] = {};
  if (!convertible(out.dtype)) return;
  store_scalar(zero, out.dtype, 0, 0, true);
  int64_t zeros[kMaxRank] = {}, item = itemsize(out.dtype);
  int r = self.rank;
  int64_t rows = self.sizes[r - 2], cols = self.sizes[r - 1];
  // each (batch, row): zero the columns outside the kept band
  View batch = out;
  batch.rank = r - 2;
  int64_t row_sizes[kMaxRank];
  for (int k = 0; k < r - 2; ++k) row_sizes[k] = out.sizes[k];
  batch.sizes = row_sizes;
  batch.numel = 1;
  for (int k = 0; k < r - 2; ++k) batch.numel *= row_sizes[k];
  for_each_element(batch, batch, [&](char* base, char*, const int64_t*) {
    for (int64_t i = 0; i < rows; ++i) {
      // keep col - row <= diagonal (tril) or >= diagonal (triu)
      int64_t edge = i + diagonal;  // tril keeps cols <= edge; triu keeps cols >= edge
      int64_t from, to;
      if (kLower) from = edge + 1 < 0 ? 0 : edge + 1, to = cols;
      else from = 0, to = edge < cols ? edge : cols;
      if (from >= to) continue;
      int64_t len = to - from;
      char* p = base + (i * out.strides[r - 2] + from * out.strides[r - 1]) * item;
      copy_strided(p, out.strides + r - 1, zero, zeros, &len, 1, item);
    }
  });
}
void tril_out(opforge_context* c, opforge_arg* a, int64_t n) { triangle<true>(c, a, n, "aten::tril.out"); }
void triu_out(opforge_context* c, opforge_arg* a, int64_t n) { triangle<false>(c, a, n, "aten::triu.out"); }

const KernelDef kIndexingKernels[] = {
    {"aten::embedding.out", "T T I B B T!", embedding_out},
    {"aten::index_select.out", "T I T T!", index_select_out},
    {"aten::gather.out", "T I T B T!", gather_out},
    {"aten::scatter.src_out", "T I T T T!", scatter_src_out},
    {"aten::scatter.value_out", "T I T S T!", scatter_value_out},
    {"aten::scatter.reduce_out", "T I T T STR T!", scatter_reduce_out},
    {"aten::scatter.value_reduce_out", "T I T S STR T!", scatter_value_reduce_out},
    {"aten::scatter_add.out", "T I T T T!", scatter_add_out},
    {"aten::scatter_reduce.two_out", "T I T T STR B T!", scatter_reduce_two_out},
    {"aten::slice_scatter.out", "T T I I? I? I T!", slice_scatter_out},
    {"aten::select_scatter.out", "T T I I T!", select_scatter_out},
    {"aten::tril.out", "T I T!", tril_out},
    {"aten::triu.out", "T I T!", triu_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(indexing, kIndexingKernels)
