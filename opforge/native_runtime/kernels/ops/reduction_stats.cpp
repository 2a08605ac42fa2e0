// Statistics reductions: var/std/var_mean and linalg_vector_norm (the NumPy kernels of
// opforge/kernels/portable/reduction.py), on the plan of reduction_plan.h. Variances and
// norms accumulate in double (NumPy's float32 pairwise sum is about as exact, so results
// agree to rounding); float16 computes in float32 (reduction_plan.h's widen_half).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor.h"
#include "reduction_plan.h"

namespace opforge::portable {
namespace {

using namespace reduction_plan;

// --- var, std, var_mean -------------------------------------------------------------------------

void moments(opforge_context* ctx, const char* op, const View& self, const int64_t* dims,
             int64_t count, double correction, const View& out, bool sqrt_it, const View* mean_out) {
  if ((self.dtype != kFloat16 && self.dtype != kFloat32 && self.dtype != kFloat64) ||
      out.dtype != self.dtype || (mean_out && mean_out->dtype != self.dtype)) {
    fail(ctx, "%s: self %s, out %s — valid: float16, float32 or float64, one dtype (ATen's var "
         "and std take floating tensors only)", op, dtype_name(self.dtype), dtype_name(out.dtype));
    return;
  }
  Widened w;  // float16 computes in float32, as np.var(dtype=float32), rounded once into out
  if (!widen_half(ctx, op, self, &w)) return;
  const View& x = w.view;
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
        put(out, out_offset(out, f), sqrt_it ? std::sqrt(var) : var);
        if (mean_out) put(*mean_out, out_offset(*mean_out, f), mean);
      });
    }
  });
}

// where a kernel's correction comes from: var.out's bool unbiased (1 or 0), or the
// correction_out overloads' optional scalar (None: 1)
enum class Correction { kBool, kScalar };

bool correction_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                    const char* op, Correction from, double* c) {
  if (from == Correction::kBool) {
    bool unbiased;
    if (!bool_arg(ctx, args, n, i, op, "unbiased", &unbiased)) return false;
    *c = unbiased ? 1.0 : 0.0;
    return true;
  }
  if (is_none(args, n, i)) { *c = 1.0; return true; }
  int64_t iv;
  bool integral;
  return scalar_arg(ctx, args, n, i, op, "correction", c, &iv, &integral);
}

// self, dim?, unbiased | correction?, keepdim, out — var_mean: out0 (the variance), out1
// (the mean)
void moments_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op,
                    Correction from, bool take_sqrt, bool with_mean = false) {
  View x, out, mean;
  const int64_t* dims;
  int64_t count;
  double corr;
  bool keepdim;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !int_list_arg(ctx, args, n, 1, op, "dim", &dims, &count) ||
      !correction_arg(ctx, args, n, 2, op, from, &corr) || !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) ||
      !tensor_arg(ctx, args, n, 4, op, with_mean ? "out0" : "out", &out) ||
      (with_mean && !tensor_arg(ctx, args, n, 5, op, "out1", &mean)))
    return;
  moments(ctx, op, x, dims, count, corr, out, take_sqrt, with_mean ? &mean : nullptr);
}

void var_correction_out(opforge_context* c, opforge_arg* a, int64_t n) { moments_kernel(c, a, n, "aten::var.correction_out", Correction::kScalar, false); }
void var_out(opforge_context* c, opforge_arg* a, int64_t n) { moments_kernel(c, a, n, "aten::var.out", Correction::kBool, false); }
void std_correction_out(opforge_context* c, opforge_arg* a, int64_t n) { moments_kernel(c, a, n, "aten::std.correction_out", Correction::kScalar, true); }
void var_mean_correction_out(opforge_context* c, opforge_arg* a, int64_t n) {
  moments_kernel(c, a, n, "aten::var_mean.correction_out", Correction::kScalar, false, true);
}

// --- vector norm ----------------------------------------------------------------------------

void linalg_vector_norm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::linalg_vector_norm.out";
  View self, out;
  const int64_t* dims;
  int64_t count, iv;
  double ord;
  bool keepdim, integral;
  int32_t dtype;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &self) ||
      !scalar_arg(ctx, args, n, 1, op, "ord", &ord, &iv, &integral) ||
      !int_list_arg(ctx, args, n, 2, op, "dim", &dims, &count) ||
      !bool_arg(ctx, args, n, 3, op, "keepdim", &keepdim) ||
      !optional_dtype(ctx, args, n, 4, op, &dtype) || !tensor_arg(ctx, args, n, 5, op, "out", &out))
    return;
  if (!real_dtype(ctx, op, "self", self.dtype) || !is_floating(out.dtype) || out.dtype == kBFloat16) {
    fail(ctx, "%s: out of dtype %s — valid: float16, float32 or float64", op, dtype_name(out.dtype));
    return;
  }
  Widened w;  // float16 computes in float32, as the NumPy kernel
  if (!widen_half(ctx, op, self, &w)) return;
  const View& x = w.view;
  Plan p;
  bool reduce[kMaxRank];
  if (!make_plan(ctx, op, x, dims, count, &p, reduce) || !out_count(ctx, op, out, p.outputs)) return;
  bool inf = std::isinf(ord);
  if (inf && p.count == 0 && out.numel > 0) {
    fail(ctx, "%s: self — the reduced dims are empty — valid: a non-empty reduction for "
         "ord=inf/-inf (a max has no identity; ATen refuses it too) — reduce over non-empty dims", op);
    return;
  }
  // compute in float32 unless the input (or dtype) is float64, as the NumPy kernel's ct; a
  // float16 dtype rounds the input to float16 first (the NumPy kernel's astype)
  bool f32 = !((dtype >= 0 ? dtype : self.dtype) == kFloat64);
  bool to_half = dtype == kFloat16 && self.dtype != kFloat16;
  dispatch_real(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = x.ptr<T>();
    each_output(p, [&](int64_t f, int64_t base) {
      double r;
      auto val = [&](int64_t i) {
        double v = as_double(xs[i]);
        if (to_half) return static_cast<double>(half_to_float(double_to_half(v)));
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
      store(out, out_offset(out, f), f32 ? static_cast<double>(static_cast<float>(r)) : r);
    });
  });
}

const KernelDef kReductionStatsKernels[] = {
    {"aten::var.correction_out", "T IL? S? B T!", var_correction_out},
    {"aten::var.out", "T IL? B B T!", var_out},
    {"aten::std.correction_out", "T IL? S? B T!", std_correction_out},
    {"aten::var_mean.correction_out", "T IL? S? B T! T!", var_mean_correction_out},
    {"aten::linalg_vector_norm.out", "T S IL? B ST? T!", linalg_vector_norm_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(reduction_stats, kReductionStatsKernels)
