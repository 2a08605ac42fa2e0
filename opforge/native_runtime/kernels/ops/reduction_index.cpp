// Index reductions: argmax/argmin and max.dim/min.dim (the NumPy kernels of
// opforge/kernels/portable/reduction.py), on the plan of reduction_plan.h. They take the
// first extreme, and the first NaN is the extreme (NumPy and ATen agree); an extreme over
// nothing is refused, as ATen refuses it. float16 compares as its exact float32 copy.
#include <cstdint>
#include <type_traits>

#include "tensor.h"
#include "vector_math.h"
#include "reduction_plan.h"

namespace opforge::portable {
namespace {

using namespace reduction_plan;

// --- argmax, argmin, max.dim, min.dim ---------------------------------------------------------

// The index (along the reduced dim, or flat over all) of the first extreme; the first NaN
// is the extreme. values: also the value (max.dim / min.dim), else nullptr.
void arg_reduce(opforge_context* ctx, const char* op, const View& self, bool has_dim, int64_t dim,
                bool is_max, const View* values, const View& indices) {
  if (!real_dtype(ctx, op, "self", self.dtype)) return;
  if (indices.dtype != kInt64) {
    fail(ctx, "%s: indices of dtype %s — valid: int64", op, dtype_name(indices.dtype));
    return;
  }
  if (values && values->dtype != self.dtype) {
    fail(ctx, "%s: values of dtype %s for self %s — valid: self's dtype", op,
         dtype_name(values->dtype), dtype_name(self.dtype));
    return;
  }
  Widened w;  // float16: compared as its exact float32 copy
  if (!widen_half(ctx, op, self, &w)) return;
  const View& x = w.view;
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
          if (values) put(*values, out_offset(*values, f), row[i]);
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
      if (values) put(*values, out_offset(*values, f), best);
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

const KernelDef kReductionIndexKernels[] = {
    {"aten::argmax.out", "T I? B T!", argmax_out},
    {"aten::argmin.out", "T I? B T!", argmin_out},
    {"aten::max.dim_max", "T I B T! T!", max_dim_max},
    {"aten::min.dim_min", "T I B T! T!", min_dim_min},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(reduction_index, kReductionIndexKernels)
