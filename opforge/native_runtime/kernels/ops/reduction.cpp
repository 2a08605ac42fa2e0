// Reductions that fold values: sum, mean, prod, amax/amin, max/min (whole), any/all,
// logsumexp (the NumPy kernels of opforge/kernels/portable/reduction.py); the plan they run
// on is reduction_plan.h. argmax/argmin and max.dim/min.dim are in reduction_index.cpp,
// var/std/var_mean and vector norms in reduction_stats.cpp.
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
#include "reduction_plan.h"

namespace opforge::portable {
namespace {

using namespace reduction_plan;

// --- sum, mean, prod --------------------------------------------------------------------------

enum class Fold { kSum, kMean, kProd };

// dtype: the ScalarType argument (-1: none). The NumPy kernel's compute dtype: dtype if
// given, else int64 for bool/integer input (sum, prod) or out's dtype (mean); float32 in
// place of float16.
void fold(opforge_context* ctx, const char* op, const View& self, const int64_t* dims,
          int64_t count, int32_t dtype, const View& out, Fold kind) {
  if (!real_dtype(ctx, op, "self", self.dtype) || !real_dtype(ctx, op, "out", out.dtype)) return;
  int32_t ct = accumulate_dtype(dtype >= 0 ? dtype : (kind == Fold::kMean ? out.dtype
                                     : (is_floating(self.dtype) ? self.dtype : kInt64)));
  if (!real_dtype(ctx, op, "dtype", ct)) return;
  Widened w;
  if (!widen_half(ctx, op, self, &w)) return;
  const View& x = w.view;
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

// self, dim (int[1]?), keepdim, dtype?, out: sum.IntList_out and mean.out
void fold_dims_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Fold kind) {
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
  fold(ctx, op, x, dims, count, dtype, out, kind);
}

// self, dtype?, out: the whole tensor (sum.out, mean.dtype_out, prod.out)
void fold_all_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Fold kind) {
  View x, out;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) || !optional_dtype(ctx, args, n, 1, op, &dtype) ||
      !tensor_arg(ctx, args, n, 2, op, "out", &out))
    return;
  fold(ctx, op, x, nullptr, -1, dtype, out, kind);
}

void sum_intlist_out(opforge_context* c, opforge_arg* a, int64_t n) { fold_dims_kernel(c, a, n, "aten::sum.IntList_out", Fold::kSum); }
void sum_out(opforge_context* c, opforge_arg* a, int64_t n) { fold_all_kernel(c, a, n, "aten::sum.out", Fold::kSum); }
void mean_out(opforge_context* c, opforge_arg* a, int64_t n) { fold_dims_kernel(c, a, n, "aten::mean.out", Fold::kMean); }
void mean_dtype_out(opforge_context* c, opforge_arg* a, int64_t n) { fold_all_kernel(c, a, n, "aten::mean.dtype_out", Fold::kMean); }
void prod_out(opforge_context* c, opforge_arg* a, int64_t n) { fold_all_kernel(c, a, n, "aten::prod.out", Fold::kProd); }

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

// --- amax, amin, max, min, any, all ---------------------------------------------------------

enum class Pick { kMax, kMin, kAny, kAll };

void pick(opforge_context* ctx, const char* op, const View& self, const int64_t* dims,
          int64_t count, const View& out, Pick kind) {
  if (!real_dtype(ctx, op, "self", self.dtype) || !real_dtype(ctx, op, "out", out.dtype)) return;
  Widened w;  // float16: the float32 copy (exact; its extremes convert back exactly)
  if (!widen_half(ctx, op, self, &w)) return;
  const View& x = w.view;
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
  if (extreme && out.dtype != self.dtype) {
    fail(ctx, "%s: out of dtype %s for self %s — valid: self's dtype", op, dtype_name(out.dtype),
         dtype_name(self.dtype));
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
            put(out, o, vec::max(xs + base, p.count));  // NaN-propagating, as NumPy
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
        put(out, o, best);
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

// --- logsumexp ------------------------------------------------------------------------------

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
  if (!real_dtype(ctx, op, "self", x.dtype) || !is_floating(out.dtype) || out.dtype == kBFloat16) {
    fail(ctx, "%s: out of dtype %s — valid: float16, float32 or float64", op, dtype_name(out.dtype));
    return;
  }
  Widened w;
  if (!widen_half(ctx, op, x, &w)) return;
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, w.view, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs)) return;
  bool f32 = out.dtype == kFloat16;  // the NumPy kernel computes a float16 out in float32
  dispatch_real(w.view.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = w.view.ptr<T>();
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
      double r = std::log(s) + peak;
      store(out, out_offset(out, f), f32 ? static_cast<double>(static_cast<float>(r)) : r);
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
    {"aten::any.out", "T I B T!", any_dim_out},
    {"aten::any.dims_out", "T IL? B T!", any_dims_out},
    {"aten::any.all_out", "T T!", any_all_out},
    {"aten::all.out", "T I B T!", all_dim_out},
    {"aten::all.dims_out", "T IL? B T!", all_dims_out},
    {"aten::all.all_out", "T T!", all_all_out},
    {"aten::logsumexp.out", "T IL B T!", logsumexp_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(reduction, kReductionKernels)
