// Reductions: sum, mean, prod, amax/amin, max/min (whole and along a dim), argmax/argmin,
// var/std/var_mean, any/all, logsumexp, vector norms (the NumPy kernels of
// opforge/kernels/portable/reduction.py).
//
// One plan serves them all: the input's dims split into kept and reduced ones (ATen's
// `int[1]? dim`: None or [] reduces every dim; negatives wrap), adjacent dims merged where
// their strides allow, then for each output element (kept dims in row-major order) a loop
// over its reduced elements. out may have the keepdim shape or the reduced one (the NumPy
// kernel reshapes: any shape with the right number of elements is written in row-major
// order).
//
// Accumulation: a contiguous float32 sum or mean runs in the vector loops of
// vector_math.h (16 partial sums); other floating sums, means, variances and norms
// accumulate in double (NumPy's float32 pairwise sum is about as exact as either, so
// results agree to rounding); products multiply in the input's dtype (so a float32 product overflows where
// NumPy's does); integer and bool sums and products wrap in int64 as NumPy's do (bool and
// integer sums give int64 unless a dtype is given). amax/amin propagate NaN; argmax/argmin
// and max.dim/min.dim take the first extreme, and the first NaN is the extreme (NumPy and
// ATen agree). A max or min over nothing is refused, as ATen refuses it.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor.h"
#include "vector_math.h"

namespace opforge::portable {
namespace {

// kept dims (outer loop) and reduced dims (inner loop), merged where contiguous
struct Plan {
  int nk = 0, nr = 0;
  int64_t ks[kMaxRank], kx[kMaxRank];  // kept sizes, input strides
  int64_t rs[kMaxRank], rx[kMaxRank];  // reduced sizes, input strides
  int64_t outputs = 1, count = 1;      // output elements, elements reduced into each
  int64_t reduced_at[kMaxRank];        // for arg reductions: the reduced dim's own size
};

// Append a dim to a (sizes, strides) list, merging it into the previous one when the
// previous continues it (row-major order kept).
void push(int* n, int64_t* sizes, int64_t* strides, int64_t size, int64_t stride) {
  if (size == 1) return;
  if (*n > 0 && strides[*n - 1] == size * stride) {
    sizes[*n - 1] *= size;
    strides[*n - 1] = stride;
    return;
  }
  sizes[*n] = size;
  strides[*n] = stride;
  ++*n;
}

// dims: nullptr/count <= 0 (count -1: None, 0: []) reduces all.
bool make_plan(opforge_context* ctx, const char* op, const View& x, const int64_t* dims,
               int64_t count, Plan* p, bool* reduce) {
  for (int d = 0; d < kMaxRank; ++d) reduce[d] = count <= 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t d;
    if (!wrap_dim(ctx, op, dims[i], x.rank, &d)) return false;
    if (x.rank == 0) continue;
    if (reduce[d]) {
      fail(ctx, "%s: dim %lld appears twice in the dim list — valid: distinct dims", op,
           (long long)dims[i]);
      return false;
    }
    reduce[d] = true;
  }
  for (int d = 0; d < x.rank; ++d) {
    if (reduce[d]) {
      push(&p->nr, p->rs, p->rx, x.sizes[d], x.strides[d]);
      p->count *= x.sizes[d];
    } else {
      push(&p->nk, p->ks, p->kx, x.sizes[d], x.strides[d]);
      p->outputs *= x.sizes[d];
    }
  }
  return true;
}

// The out's element offset for row-major flat index f (out dense: f).
inline int64_t out_offset(const View& out, int64_t f) {
  if (out.dense) return f;
  int64_t off = 0;
  for (int d = out.rank - 1; d >= 0; --d) {
    off += (f % out.sizes[d]) * out.strides[d];
    f /= out.sizes[d];
  }
  return off;
}

bool out_count(opforge_context* ctx, const char* op, const View& out, int64_t expect) {
  if (out.numel == expect) return true;
  fail(ctx, "%s: out of %lld elements — valid: %lld, the reduced shape (with or without keepdim)",
       op, (long long)out.numel, (long long)expect);
  return false;
}

// Visit every input offset of one output element's reduced block.
template <typename F>
inline void each_reduced(const Plan& p, int64_t base, F&& f) {
  if (p.nr == 0) { f(base); return; }
  if (p.nr == 1) {
    for (int64_t i = 0; i < p.rs[0]; ++i) f(base + i * p.rx[0]);
    return;
  }
  int64_t idx[kMaxRank] = {0};
  int64_t off = base;
  for (int64_t t = 0; t < p.count; ++t) {
    f(off);
    for (int d = p.nr - 1; d >= 0; --d) {
      off += p.rx[d];
      if (++idx[d] < p.rs[d]) break;
      off -= p.rx[d] * p.rs[d];
      idx[d] = 0;
    }
  }
}

// Visit every output element: (flat index, input base offset).
template <typename F>
inline void each_output(const Plan& p, F&& f) {
  int64_t idx[kMaxRank] = {0};
  int64_t off = 0;
  for (int64_t t = 0; t < p.outputs; ++t) {
    f(t, off);
    for (int d = p.nk - 1; d >= 0; --d) {
      off += p.kx[d];
      if (++idx[d] < p.ks[d]) break;
      off -= p.kx[d] * p.ks[d];
      idx[d] = 0;
    }
  }
}

// Store a double / int64 into out's element (out of any real dtype; NumPy's unsafe cast).
inline void store(const View& out, int64_t off, double v) {
  dispatch_real(out.dtype, [&](auto tag) {
    using O = decltype(tag);
    if constexpr (std::is_same<O, bool>::value) out.ptr<O>()[off] = v != 0.0;
    else if constexpr (std::is_floating_point<O>::value) out.ptr<O>()[off] = static_cast<O>(v);
    else out.ptr<O>()[off] = std::isfinite(v) && std::fabs(v) < 9.2e18 ? static_cast<O>(static_cast<int64_t>(v)) : O(0);
  });
}
inline void store_int(const View& out, int64_t off, int64_t v) {
  dispatch_real(out.dtype, [&](auto tag) {
    using O = decltype(tag);
    if constexpr (std::is_same<O, bool>::value) out.ptr<O>()[off] = v != 0;
    else out.ptr<O>()[off] = static_cast<O>(v);
  });
}

bool real_dtype(opforge_context* ctx, const char* op, const char* what, int32_t d) {
  if (d == kBool || is_integral(d, false) || d == kFloat32 || d == kFloat64) return true;
  fail(ctx, "%s: %s of dtype %s — valid: bool, integer, float32 or float64 (float16/bfloat16 "
       "are not in the C++ kernels yet) — use the lean runtime's kernel", op, what, dtype_name(d));
  return false;
}

// --- sum, mean, prod --------------------------------------------------------------------------

enum class Fold { kSum, kMean, kProd };

// dtype: the ScalarType argument (-1: none). The NumPy kernel's compute dtype: dtype if
// given, else int64 for bool/integer input (sum, prod) or out's dtype (mean).
void fold(opforge_context* ctx, const char* op, const View& x, const int64_t* dims,
          int64_t count, int32_t dtype, const View& out, Fold kind) {
  if (!real_dtype(ctx, op, "self", x.dtype) || !real_dtype(ctx, op, "out", out.dtype)) return;
  int32_t ct = dtype >= 0 ? dtype : (kind == Fold::kMean ? out.dtype
                                     : (is_floating(x.dtype) ? x.dtype : kInt64));
  if (!real_dtype(ctx, op, "dtype", ct)) return;
  if (kind == Fold::kMean && !is_floating(ct)) {
    fail(ctx, "%s: a mean computed in %s — valid: a floating dtype (ATen cannot infer an integer "
         "mean's dtype either) — pass dtype=float32", op, dtype_name(ct));
    return;
  }
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, x, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs)) return;
  bool floating = is_floating(ct);
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.ptr<T>();
    each_output(p, [&](int64_t f, int64_t base) {
      int64_t o = out_offset(out, f);
      if (floating) {
        if (kind == Fold::kProd) {
          // in the compute dtype, as NumPy multiplies
          if (ct == kFloat32) {
            float acc = 1.0f;
            each_reduced(p, base, [&](int64_t i) { acc *= static_cast<float>(xs[i]); });
            store(out, o, acc);
          } else {
            double acc = 1.0;
            each_reduced(p, base, [&](int64_t i) { acc *= static_cast<double>(xs[i]); });
            store(out, o, acc);
          }
          return;
        }
        if constexpr (std::is_same<T, float>::value) {
          if (ct == kFloat32 && p.nr <= 1 && (p.nr == 0 || p.rx[0] == 1)) {
            // a contiguous float32 block: the vector loops, 16 partial sums (vector_math.h)
            float s = vec::sum(xs + base, p.count);
            store(out, o, kind == Fold::kMean ? s / static_cast<float>(p.count) : s);
            return;
          }
        }
        double acc = 0.0;
        if (ct == kFloat32) {  // the input rounded to float32 first (dtype=float32 of a double)
          each_reduced(p, base, [&](int64_t i) { acc += static_cast<float>(xs[i]); });
        } else {
          each_reduced(p, base, [&](int64_t i) { acc += static_cast<double>(xs[i]); });
        }
        if (kind == Fold::kMean) {
          if (ct == kFloat32) store(out, o, static_cast<float>(acc) / static_cast<float>(p.count));
          else store(out, o, acc / static_cast<double>(p.count));
        } else {
          store(out, o, ct == kFloat32 ? static_cast<double>(static_cast<float>(acc)) : acc);
        }
        return;
      }
      // integer compute dtype: wrapping int64 arithmetic, the input cast to ct first
      uint64_t acc = kind == Fold::kProd ? 1u : 0u;
      each_reduced(p, base, [&](int64_t i) {
        int64_t v;
        if constexpr (std::is_floating_point<T>::value)
          v = std::isfinite(xs[i]) && std::fabs(xs[i]) < 9.2e18 ? static_cast<int64_t>(xs[i]) : 0;
        else v = static_cast<int64_t>(xs[i]);
        if (kind == Fold::kProd) acc *= static_cast<uint64_t>(v);
        else acc += static_cast<uint64_t>(v);
      });
      store_int(out, o, static_cast<int64_t>(acc));
    });
  });
}

bool optional_dtype(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                    const char* op, int32_t* dtype) {
  if (is_none(args, n, i)) { *dtype = -1; return true; }
  int64_t v;
  if (i >= n || args[i].tag != OPFORGE_ARG_SCALAR_TYPE) {
    fail(ctx, "%s: dtype (argument %lld) — valid: a ScalarType or None", op, (long long)i);
    return false;
  }
  v = args[i].v.i;
  *dtype = static_cast<int32_t>(v);
  return true;
}

void sum_intlist_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::sum.IntList_out";
  View x, out;
  const int64_t* dims;
  int64_t count;
  bool keepdim;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) ||
      !optional_dtype(ctx, args, n, 3, op, &dtype) || !tensor_arg(ctx, args, n, 4, op, "out", &out))
    return;
  fold(ctx, op, x, dims, count, dtype, out, Fold::kSum);
}

void sum_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::sum.out";
  View x, out;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !optional_dtype(ctx, args, n, 1, op, &dtype) ||
      !tensor_arg(ctx, args, n, 2, op, "out", &out))
    return;
  fold(ctx, op, x, nullptr, -1, dtype, out, Fold::kSum);
}

void mean_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::mean.out";
  View x, out;
  const int64_t* dims;
  int64_t count;
  bool keepdim;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) ||
      !optional_dtype(ctx, args, n, 3, op, &dtype) || !tensor_arg(ctx, args, n, 4, op, "out", &out))
    return;
  fold(ctx, op, x, dims, count, dtype, out, Fold::kMean);
}

void mean_dtype_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::mean.dtype_out";
  View x, out;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !optional_dtype(ctx, args, n, 1, op, &dtype) ||
      !tensor_arg(ctx, args, n, 2, op, "out", &out))
    return;
  fold(ctx, op, x, nullptr, -1, dtype, out, Fold::kMean);
}

void prod_int_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::prod.int_out";
  View x, out;
  int64_t dim;
  bool keepdim;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !int_arg(ctx, args, n, 1, op, "dim", &dim) ||
      !bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) ||
      !optional_dtype(ctx, args, n, 3, op, &dtype) || !tensor_arg(ctx, args, n, 4, op, "out", &out))
    return;
  fold(ctx, op, x, &dim, 1, dtype, out, Fold::kProd);
}

void prod_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::prod.out";
  View x, out;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !optional_dtype(ctx, args, n, 1, op, &dtype) ||
      !tensor_arg(ctx, args, n, 2, op, "out", &out))
    return;
  fold(ctx, op, x, nullptr, -1, dtype, out, Fold::kProd);
}

// --- amax, amin, max, min, any, all ---------------------------------------------------------

enum class Pick { kMax, kMin, kAny, kAll };

void pick(opforge_context* ctx, const char* op, const View& x, const int64_t* dims,
          int64_t count, const View& out, Pick kind) {
  if (!real_dtype(ctx, op, "self", x.dtype) || !real_dtype(ctx, op, "out", out.dtype)) return;
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, x, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs)) return;
  bool extreme = kind == Pick::kMax || kind == Pick::kMin;
  if (extreme && p.count == 0 && p.outputs > 0) {
    fail(ctx, "%s: self of %lld elements reduced over empty dims — valid: a non-empty reduction "
         "(a max or min of nothing is undefined; ATen refuses it too) — reduce over non-empty "
         "dims", op, (long long)x.numel);
    return;
  }
  if (extreme && out.dtype != x.dtype) {
    fail(ctx, "%s: out of dtype %s for self %s — valid: self's dtype", op, dtype_name(out.dtype),
         dtype_name(x.dtype));
    return;
  }
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.ptr<T>();
    each_output(p, [&](int64_t f, int64_t base) {
      int64_t o = out_offset(out, f);
      if (extreme) {
        if constexpr (std::is_same<T, float>::value) {
          if (kind == Pick::kMax && p.nr <= 1 && (p.nr == 0 || p.rx[0] == 1)) {
            out.ptr<T>()[o] = vec::max(xs + base, p.count);  // NaN-propagating, as NumPy
            return;
          }
        }
        T best = xs[base];
        bool nan = false;
        each_reduced(p, base, [&](int64_t i) {
          T v = xs[i];
          if constexpr (std::is_floating_point<T>::value) {
            if (v != v) nan = true;
          }
          if (kind == Pick::kMax ? v > best : v < best) best = v;
        });
        if constexpr (std::is_floating_point<T>::value) {
          if (nan) best = std::numeric_limits<T>::quiet_NaN();
        }
        out.ptr<T>()[o] = best;
        return;
      }
      bool acc = kind == Pick::kAll;
      each_reduced(p, base, [&](int64_t i) {
        bool v = xs[i] != T(0);  // NaN is true, as in NumPy and ATen
        if constexpr (std::is_floating_point<T>::value) v = v || xs[i] != xs[i];
        acc = kind == Pick::kAll ? (acc && v) : (acc || v);
      });
      store_int(out, o, acc ? 1 : 0);
    });
  });
}

void dim_list_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Pick kind,
                     bool single_dim) {
  View x, out;
  const int64_t* dims;
  int64_t count, one;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x)) return;
  if (single_dim) {
    if (!int_arg(ctx, args, n, 1, op, "dim", &one)) return;
    dims = &one;
    count = 1;
  } else if (!int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count)) {
    return;
  }
  if (!bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) || !tensor_arg(ctx, args, n, 3, op, "out", &out))
    return;
  pick(ctx, op, x, dims, count, out, kind);
}

void amax_out(opforge_context* c, opforge_arg* a, int64_t n) { dim_list_kernel(c, a, n, "aten::amax.out", Pick::kMax, false); }
void amin_out(opforge_context* c, opforge_arg* a, int64_t n) { dim_list_kernel(c, a, n, "aten::amin.out", Pick::kMin, false); }
void any_dim_out(opforge_context* c, opforge_arg* a, int64_t n) { dim_list_kernel(c, a, n, "aten::any.out", Pick::kAny, true); }
void any_dims_out(opforge_context* c, opforge_arg* a, int64_t n) { dim_list_kernel(c, a, n, "aten::any.dims_out", Pick::kAny, false); }
void all_dim_out(opforge_context* c, opforge_arg* a, int64_t n) { dim_list_kernel(c, a, n, "aten::all.out", Pick::kAll, true); }
void all_dims_out(opforge_context* c, opforge_arg* a, int64_t n) { dim_list_kernel(c, a, n, "aten::all.dims_out", Pick::kAll, false); }

void whole_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Pick kind) {
  View x, out;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !tensor_arg(ctx, args, n, 1, op, "out", &out)) return;
  pick(ctx, op, x, nullptr, -1, out, kind);
}

void max_unary_out(opforge_context* c, opforge_arg* a, int64_t n) { whole_kernel(c, a, n, "aten::max.unary_out", Pick::kMax); }
void min_unary_out(opforge_context* c, opforge_arg* a, int64_t n) { whole_kernel(c, a, n, "aten::min.unary_out", Pick::kMin); }
void any_all_out(opforge_context* c, opforge_arg* a, int64_t n) { whole_kernel(c, a, n, "aten::any.all_out", Pick::kAny); }
void all_all_out(opforge_context* c, opforge_arg* a, int64_t n) { whole_kernel(c, a, n, "aten::all.all_out", Pick::kAll); }

// --- argmax, argmin, max.dim, min.dim ---------------------------------------------------------

// The index (along the reduced dim, or flat over all) of the first extreme; the first NaN
// is the extreme. values: also the value (max.dim / min.dim), else nullptr.
void arg_reduce(opforge_context* ctx, const char* op, const View& x, bool has_dim, int64_t dim,
                bool is_max, const View* values, const View& indices) {
  if (!real_dtype(ctx, op, "self", x.dtype)) return;
  if (indices.dtype != kInt64) {
    fail(ctx, "%s: indices of dtype %s — valid: int64", op, dtype_name(indices.dtype));
    return;
  }
  if (values && values->dtype != x.dtype) {
    fail(ctx, "%s: values of dtype %s for self %s — valid: self's dtype", op,
         dtype_name(values->dtype), dtype_name(x.dtype));
    return;
  }
  Plan p;
  bool reduce[kMaxRank];
  int64_t d = 0;
  if (has_dim && !wrap_dim(ctx, op, dim, x.rank, &d)) return;
  if (!has_dim || x.rank == 0) {
    // flat index over the whole tensor in row-major order: reduce every dim, unmerged
    // ranks are handled by computing the flat index from the element's position
    if (!make_plan(ctx, op, x, nullptr, -1, &p, reduce)) return;
  } else if (!make_plan(ctx, op, x, &d, 1, &p, reduce)) {
    return;
  }
  if (!out_count(ctx, op, indices, p.outputs) || (values && !out_count(ctx, op, *values, p.outputs)))
    return;
  if (p.count == 0 && p.outputs > 0) {
    fail(ctx, "%s: self of shape with an empty reduced dim — valid: a non-empty dim (the extreme "
         "of nothing is undefined; ATen refuses it too) — reduce over a non-empty dim", op);
    return;
  }
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.ptr<T>();
    each_output(p, [&](int64_t f, int64_t base) {
      if constexpr (std::is_same<T, float>::value) {
        if (is_max && p.nr <= 1 && (p.nr == 0 || p.rx[0] == 1)) {
          // contiguous float32: the vector maximum, then its first occurrence (the first
          // NaN when there is one)
          const float* row = xs + base;
          float m = vec::max(row, p.count);
          int64_t i = 0;
          // blocks of 64 tested with a vectorisable OR first, then scanned
          if (m != m) {
            for (;; i += 64) {
              int hit = 0;
              if (i + 64 <= p.count)
                for (int j = 0; j < 64; ++j) hit |= row[i + j] != row[i + j];
              if (hit || i + 64 > p.count) break;
            }
            while (row[i] == row[i]) ++i;
          } else {
            for (;; i += 64) {
              int hit = 0;
              if (i + 64 <= p.count)
                for (int j = 0; j < 64; ++j) hit |= row[i + j] == m;
              if (hit || i + 64 > p.count) break;
            }
            while (row[i] != m) ++i;
          }
          indices.ptr<int64_t>()[out_offset(indices, f)] = i;
          if (values) values->ptr<T>()[out_offset(*values, f)] = row[i];
          return;
        }
      }
      T best = T(0);
      int64_t at = -1, k = 0;
      bool found_nan = false;
      each_reduced(p, base, [&](int64_t i) {
        T v = xs[i];
        if (!found_nan) {
          bool nan = false;
          if constexpr (std::is_floating_point<T>::value) nan = v != v;
          if (nan) { best = v; at = k; found_nan = true; }
          else if (at < 0 || (is_max ? v > best : v < best)) { best = v; at = k; }
        }
        ++k;
      });
      indices.ptr<int64_t>()[out_offset(indices, f)] = at;
      if (values) values->ptr<T>()[out_offset(*values, f)] = best;
    });
  });
}

void arg_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, bool is_max) {
  View x, out;
  int64_t dim = 0;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x)) return;
  bool has_dim = !is_none(args, n, 1);
  if (has_dim && !int_arg(ctx, args, n, 1, op, "dim", &dim)) return;
  if (!bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) || !tensor_arg(ctx, args, n, 3, op, "out", &out))
    return;
  arg_reduce(ctx, op, x, has_dim, dim, is_max, nullptr, out);
}

void argmax_out(opforge_context* c, opforge_arg* a, int64_t n) { arg_kernel(c, a, n, "aten::argmax.out", true); }
void argmin_out(opforge_context* c, opforge_arg* a, int64_t n) { arg_kernel(c, a, n, "aten::argmin.out", false); }

void extreme_dim(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, bool is_max) {
  View x, values, indices;
  int64_t dim;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !int_arg(ctx, args, n, 1, op, "dim", &dim) ||
      !bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) ||
      !tensor_arg(ctx, args, n, 3, op, is_max ? "max" : "min", &values) ||
      !tensor_arg(ctx, args, n, 4, op, is_max ? "max_values" : "min_indices", &indices))
    return;
  arg_reduce(ctx, op, x, true, dim, is_max, &values, indices);
}

void max_dim_max(opforge_context* c, opforge_arg* a, int64_t n) { extreme_dim(c, a, n, "aten::max.dim_max", true); }
void min_dim_min(opforge_context* c, opforge_arg* a, int64_t n) { extreme_dim(c, a, n, "aten::min.dim_min", false); }

// --- var, std, var_mean -------------------------------------------------------------------------

void moments(opforge_context* ctx, const char* op, const View& x, const int64_t* dims,
             int64_t count, double correction, const View& out, bool sqrt_it, const View* mean_out) {
  if (!is_floating(x.dtype) || (x.dtype != kFloat32 && x.dtype != kFloat64) || out.dtype != x.dtype ||
      (mean_out && mean_out->dtype != x.dtype)) {
    fail(ctx, "%s: self %s, out %s — valid: float32 or float64, one dtype (ATen's var and std "
         "take floating tensors only)", op, dtype_name(x.dtype), dtype_name(out.dtype));
    return;
  }
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, x, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs) ||
      (mean_out && !out_count(ctx, op, *mean_out, p.outputs)))
    return;
  double denom = static_cast<double>(p.count) - correction;
  if (denom < 0) denom = 0;  // N - correction <= 0 gives inf or nan, as in ATen and NumPy
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point<T>::value) {
      const T* xs = x.ptr<T>();
      each_output(p, [&](int64_t f, int64_t base) {
        double s = 0;
        each_reduced(p, base, [&](int64_t i) { s += xs[i]; });
        T mean = static_cast<T>(static_cast<T>(s) / static_cast<T>(p.count));
        double q = 0;
        each_reduced(p, base, [&](int64_t i) {
          T c = xs[i] - mean;
          q += static_cast<double>(c * c);
        });
        T var = static_cast<T>(static_cast<T>(q) / static_cast<T>(denom));
        out.ptr<T>()[out_offset(out, f)] = sqrt_it ? std::sqrt(var) : var;
        if (mean_out) mean_out->ptr<T>()[out_offset(*mean_out, f)] = mean;
      });
    }
  });
}

bool correction_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                    const char* op, double* c) {
  if (is_none(args, n, i)) { *c = 1.0; return true; }
  int64_t iv;
  bool integral;
  return scalar_arg(ctx, args, n, i, op, "correction", c, &iv, &integral);
}

void var_correction_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::var.correction_out";
  View x, out;
  const int64_t* dims;
  int64_t count;
  double corr;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !correction_arg(ctx, args, n, 2, op, &corr) || !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) ||
      !tensor_arg(ctx, args, n, 4, op, "out", &out))
    return;
  moments(ctx, op, x, dims, count, corr, out, false, nullptr);
}

void var_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::var.out";
  View x, out;
  const int64_t* dims;
  int64_t count;
  bool unbiased, keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !bool_arg(ctx, args, n, 2, op, "unbiased", &unbiased) ||
      !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) || !tensor_arg(ctx, args, n, 4, op, "out", &out))
    return;
  moments(ctx, op, x, dims, count, unbiased ? 1.0 : 0.0, out, false, nullptr);
}

void std_correction_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::std.correction_out";
  View x, out;
  const int64_t* dims;
  int64_t count;
  double corr;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !correction_arg(ctx, args, n, 2, op, &corr) || !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) ||
      !tensor_arg(ctx, args, n, 4, op, "out", &out))
    return;
  moments(ctx, op, x, dims, count, corr, out, true, nullptr);
}

void var_mean_correction_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::var_mean.correction_out";
  View x, out0, out1;
  const int64_t* dims;
  int64_t count;
  double corr;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !correction_arg(ctx, args, n, 2, op, &corr) || !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) ||
      !tensor_arg(ctx, args, n, 4, op, "out0", &out0) || !tensor_arg(ctx, args, n, 5, op, "out1", &out1))
    return;
  moments(ctx, op, x, dims, count, corr, out0, false, &out1);
}

// --- logsumexp, vector norm -----------------------------------------------------------------

template <typename T>
inline double as_double(T v) { return static_cast<double>(v); }

void logsumexp_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::logsumexp.out";
  View x, out;
  const int64_t* dims;
  int64_t count;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !bool_arg(ctx, args, n, 2, op, "keepdim", &keepdim) || !tensor_arg(ctx, args, n, 3, op, "out", &out))
    return;
  if (!real_dtype(ctx, op, "self", x.dtype) || (out.dtype != kFloat32 && out.dtype != kFloat64)) {
    fail(ctx, "%s: out of dtype %s — valid: float32 or float64", op, dtype_name(out.dtype));
    return;
  }
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, x, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs)) return;
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.ptr<T>();
    each_output(p, [&](int64_t f, int64_t base) {
      double peak = -INFINITY;
      bool nan = false;
      each_reduced(p, base, [&](int64_t i) {
        double v = as_double(xs[i]);
        if (v != v) nan = true;
        if (v > peak) peak = v;
      });
      if (nan || !std::isfinite(peak)) peak = nan ? NAN : 0.0;  // all -inf gives -inf, inf inf
      if (nan) { store(out, out_offset(out, f), NAN); return; }
      double s = 0;
      each_reduced(p, base, [&](int64_t i) { s += std::exp(as_double(xs[i]) - peak); });
      store(out, out_offset(out, f), std::log(s) + peak);
    });
  });
}

void linalg_vector_norm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::linalg_vector_norm.out";
  View x, out;
  const int64_t* dims;
  int64_t count, iv;
  double ord;
  bool keepdim, integral;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !scalar_arg(ctx, args, n, 1, op, "ord", &ord, &iv, &integral) ||
      !int_list_arg(ctx, args, n, 2, op, "dim", &dims, &count) ||
      !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) ||
      !optional_dtype(ctx, args, n, 4, op, &dtype) || !tensor_arg(ctx, args, n, 5, op, "out", &out))
    return;
  if (!real_dtype(ctx, op, "self", x.dtype) || (out.dtype != kFloat32 && out.dtype != kFloat64)) {
    fail(ctx, "%s: out of dtype %s — valid: float32 or float64", op, dtype_name(out.dtype));
    return;
  }
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, x, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs)) return;
  bool inf = std::isinf(ord);
  if (inf && p.count == 0 && out.numel > 0) {
    fail(ctx, "%s: self — the reduced dims are empty — valid: a non-empty reduction for "
         "ord=inf/-inf (a max has no identity; ATen refuses it too) — reduce over non-empty dims", op);
    return;
  }
  // compute in float32 unless the input (or dtype) is float64, as the NumPy kernel's ct
  bool f32 = !((dtype >= 0 ? dtype : x.dtype) == kFloat64);
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.ptr<T>();
    each_output(p, [&](int64_t f, int64_t base) {
      double r;
      auto val = [&](int64_t i) {
        double v = as_double(xs[i]);
        return f32 ? static_cast<double>(static_cast<float>(v)) : v;
      };
      if (inf) {
        double best = ord > 0 ? -INFINITY : INFINITY;
        bool nan = false;
        each_reduced(p, base, [&](int64_t i) {
          double a = std::fabs(val(i));
          if (a != a) nan = true;
          best = ord > 0 ? (a > best ? a : best) : (a < best ? a : best);
        });
        r = nan ? NAN : best;
      } else if (ord == 0) {
        double c = 0;
        each_reduced(p, base, [&](int64_t i) { c += val(i) != 0 ? 1 : 0; });
        r = c;
      } else {
        double s = 0;
        if (ord == 2) {
          each_reduced(p, base, [&](int64_t i) { double v = val(i); s += v * v; });
          r = std::sqrt(s);
        } else if (ord == 1) {
          each_reduced(p, base, [&](int64_t i) { s += std::fabs(val(i)); });
          r = s;
        } else {
          each_reduced(p, base, [&](int64_t i) { s += std::pow(std::fabs(val(i)), ord); });
          r = std::pow(s, 1.0 / ord);
        }
      }
      store(out, out_offset(out, f), r);
    });
  });
}

const KernelDef kReductionKernels[] = {
    {"aten::sum.IntList_out", "T IL? B ST? T!", sum_intlist_out},
    {"aten::sum.out", "T ST? T!", sum_out},
    {"aten::mean.out", "T IL? B ST? T!", mean_out},
    {"aten::mean.dtype_out", "T ST? T!", mean_dtype_out},
    {"aten::prod.int_out", "T I B ST? T!", prod_int_out},
    {"aten::prod.out", "T ST? T!", prod_out},
    {"aten::amax.out", "T IL B T!", amax_out},
    {"aten::amin.out", "T IL B T!", amin_out},
    {"aten::max.unary_out", "T T!", max_unary_out},
    {"aten::min.unary_out", "T T!", min_unary_out},
    {"aten::argmax.out", "T I? B T!", argmax_out},
    {"aten::argmin.out", "T I? B T!", argmin_out},
    {"aten::max.dim_max", "T I B T! T!", max_dim_max},
    {"aten::min.dim_min", "T I B T! T!", min_dim_min},
    {"aten::var.correction_out", "T IL? S? B T!", var_correction_out},
    {"aten::var.out", "T IL? B B T!", var_out},
    {"aten::std.correction_out", "T IL? S? B T!", std_correction_out},
    {"aten::var_mean.correction_out", "T IL? S? B T! T!", var_mean_correction_out},
    {"aten::any.out", "T I B T!", any_dim_out},
    {"aten::any.dims_out", "T IL? B T!", any_dims_out},
    {"aten::any.all_out", "T T!", any_all_out},
    {"aten::all.out", "T I B T!", all_dim_out},
    {"aten::all.dims_out", "T IL? B T!", all_dims_out},
    {"aten::all.all_out", "T T!", all_all_out},
    {"aten::logsumexp.out", "T IL B T!", logsumexp_out},
    {"aten::linalg_vector_norm.out", "T S IL? B ST? T!", linalg_vector_norm_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(reduction, kReductionKernels)
