// Activations and clamps — the NumPy kernels of opforge/kernels/portable/activation.py:
// relu, hardtanh, clamp / clamp_min / clamp_max (Scalar and Tensor bounds), gelu (erf and
// tanh forms), silu, leaky_relu, elu, hardsigmoid, hardswish, softplus.
//
// relu and the clamps compute in the promoted dtype with NumPy's maximum / minimum (NaN
// propagates; min > max gives max everywhere). The other activations compute in out's
// floating dtype (float16 in float32) with their Scalar parameters rounded to it, step by
// step as the NumPy kernel's ufuncs do; float32 GELU and SiLU run on elementwise_math's
// vectorized formulas (GELU rounded once from float64 inside: within 1 ulp of x Phi(x)).
#include <cmath>

#include "elementwise.h"
#include "elementwise_math.h"

namespace opforge::portable {
namespace {

struct FloatRow {
  void (*fn)(float*, const float*, int64_t);
  void operator()(float* o, const void* const* in, const int64_t* step, int64_t n) const {
    const float* a = static_cast<const float*>(in[0]);
    if (step[0]) {
      fn(o, a, n);
    } else {
      float v;
      fn(&v, a, 1);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    }
  }
};

void relu_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::relu.out";
  View self, out;
  if (n != 2) {
    fail(ctx, "%s: found %lld arguments — valid: 2 (self, out)", op, (long long)n);
    return;
  }
  if (!input_arg(ctx, args, n, 0, op, "self", &self) || !out_arg(ctx, args, n, 1, op, &out)) return;
  const View* inputs[1] = {&self};
  Loop L;
  if (!broadcast_loop(ctx, op, out, inputs, 1, &L)) return;
  if (self.dtype == kFloat16) {
    run_unary<float, float>(L, [](float v) { return numpy_maximum_f16(v, 0.0f); });
    return;
  }
  dispatch_compute(self.dtype, [&](auto tag) {
    using T = decltype(tag);
    run_unary<T, T>(L, [](T v) { return numpy_maximum(v, T(0)); });  // NaN stays NaN
  });
}

// clamp(self, low, high): either bound may be absent (not both), a Scalar or a tensor.
struct Bound {
  bool present = false;
  Arg arg;
};

void clamp(opforge_context* ctx, const char* op, const View& self, const Bound& low,
           const Bound& high, const View& out) {
  if (!low.present && !high.present) {
    fail(ctx, "%s: min and max — both are None — at least one bound is needed — fix: pass min, "
         "max or both", op);
    return;
  }
  Operand promo[3] = {operand(self)};
  int count = 1;
  if (low.present) promo[count++] = low.arg.promo();
  if (high.present) promo[count++] = high.arg.promo();
  const int32_t ct = result_type(ctx, op, promo, count);
  if (ct < 0) return;
  dispatch_compute(ct, [&](auto tag) {
    using T = decltype(tag);
    T slo{}, shi{};
    View lo, hi;
    const View* inputs[3] = {&self};
    int k = 1;
    if (low.present) { lo = loop_view<T>(low.arg, &slo); inputs[k++] = &lo; }
    if (high.present) { hi = loop_view<T>(high.arg, &shi); inputs[k++] = &hi; }
    Loop L;
    if (!broadcast_loop(ctx, op, out, inputs, k, &L)) return;
    if (ct == kFloat16 && low.present && high.present) {
      run_ternary<T, T>(L, [](T x, T a, T b) { return numpy_minimum_f16(numpy_maximum_f16(x, a), b); });
    } else if (ct == kFloat16 && low.present) {
      run_binary<T, T>(L, [](T x, T a) { return numpy_maximum_f16(x, a); });
    } else if (ct == kFloat16) {
      run_binary<T, T>(L, [](T x, T b) { return numpy_minimum_f16(x, b); });
    } else if (low.present && high.present) {
      run_ternary<T, T>(L, [](T x, T a, T b) { return numpy_minimum(numpy_maximum(x, a), b); });
    } else if (low.present) {
      run_binary<T, T>(L, [](T x, T a) { return numpy_maximum(x, a); });
    } else {
      run_binary<T, T>(L, [](T x, T b) { return numpy_minimum(x, b); });
    }
  });
}

bool read_bound(opforge_context* ctx, opforge_arg* args, int64_t n, int64_t i, const char* op,
                const char* what, bool scalar, bool optional, Bound* b) {
  if (optional && is_none(args, n, i)) return true;
  b->present = true;
  return operand_arg(ctx, args, n, i, op, what, scalar, &b->arg);
}

// (self, low?, high?, out) with the bounds at the given positions (-1: absent)
void clamp_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, int64_t nargs,
                  int low_at, int high_at, bool scalar, bool optional) {
  if (n != nargs) {
    fail(ctx, "%s: found %lld arguments — valid: %lld", op, (long long)n, (long long)nargs);
    return;
  }
  View self, out;
  Bound low, high;
  if (!input_arg(ctx, args, n, 0, op, "self", &self) || !out_arg(ctx, args, n, nargs - 1, op, &out)) return;
  if (low_at >= 0 && !read_bound(ctx, args, n, low_at, op, "min", scalar, optional, &low)) return;
  if (high_at >= 0 && !read_bound(ctx, args, n, high_at, op, "max", scalar, optional, &high)) return;
  clamp(ctx, op, self, low, high, out);
}

void hardtanh_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::hardtanh.out", 4, 1, 2, true, false);
}
void clamp_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::clamp.out", 4, 1, 2, true, true);
}
void clamp_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::clamp.Tensor_out", 4, 1, 2, false, true);
}
void clamp_min_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::clamp_min.out", 3, 1, -1, true, false);
}
void clamp_min_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::clamp_min.Tensor_out", 3, 1, -1, false, false);
}
void clamp_max_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::clamp_max.out", 3, -1, 1, true, false);
}
void clamp_max_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  clamp_kernel(ctx, args, n, "aten::clamp_max.Tensor_out", 3, -1, 1, false, false);
}

// The activations below compute in out's floating dtype (the NumPy kernel's opmath).
enum class Act { kGeluErf, kGeluTanh, kSilu, kLeakyRelu, kElu, kHardsigmoid, kHardswish, kSoftplus };

struct Params {
  Scalar p[3];  // leaky_relu: slope; elu: alpha, scale, input_scale; softplus: beta, threshold
};

template <typename T>
void run_act(const Loop& L, Act act, const Params& P) {
  constexpr bool kF32 = std::is_same<T, float>::value;
  switch (act) {
    case Act::kGeluErf:
      if constexpr (kF32) {
        run<float, float, 1>(L, FloatRow{gelu_erf_row_f32});
      } else {
        run_unary<T, T>(L, [](T x) {
          const T t = x * T(0.7071067811865476);
          return x * (0.5 * (1.0 + std::erf(static_cast<double>(t))));
        });
      }
      return;
    case Act::kGeluTanh:
      if constexpr (kF32) {
        run<float, float, 1>(L, FloatRow{gelu_tanh_row_f32});
      } else {
        run_unary<T, T>(L, [](T x) {
          T c = T(0.044715) * x;
          c = c * x;
          c = c * x;
          const T inner = T(0.7978845608028654) * (x + c);
          const T th = std::tanh(inner);
          const T h = T(0.5) * x;
          return h * (T(1) + th);
        });
      }
      return;
    case Act::kSilu:
      if constexpr (kF32) {
        run<float, float, 1>(L, FloatRow{silu_row_f32});
      } else {
        run_unary<T, T>(L, [](T x) { T e = std::exp(-x); T d = T(1) + e; return x / d; });
      }
      return;
    case Act::kLeakyRelu: {
      const T slope = P.p[0].as<T>();
      run_unary<T, T>(L, [slope](T x) { return x > T(0) ? x : x * slope; });
      return;
    }
    case Act::kElu: {
      const T alpha = P.p[0].as<T>(), scale = P.p[1].as<T>(), input_scale = P.p[2].as<T>();
      run_unary<T, T>(L, [=](T x) {
        const T scaled = x * input_scale;
        const T m = std::expm1(scaled);
        const T negative = alpha * m;
        return scale * (x > T(0) ? x : negative);
      });
      return;
    }
    case Act::kHardsigmoid:
      run_unary<T, T>(L, [](T x) {
        const T s = x + T(3);
        return numpy_minimum(numpy_maximum(s, T(0)), T(6)) / T(6);
      });
      return;
    case Act::kHardswish:
      run_unary<T, T>(L, [](T x) {
        const T s = x + T(3);
        const T c = numpy_minimum(numpy_maximum(s, T(0)), T(6));
        const T p = x * c;
        return p / T(6);
      });
      return;
    case Act::kSoftplus: {
      const T beta = P.p[0].as<T>(), threshold = P.p[1].as<T>();
      if constexpr (kF32) {
        run_unary<T, T>(L, [=](T x) {
          const T bx = x * beta;
          const T soft = std::log1p(exp_f32(bx)) / beta;
          return bx > threshold ? x : soft;
        });
      } else {
        run_unary<T, T>(L, [=](T x) {
          const T bx = x * beta;
          const T soft = std::log1p(std::exp(bx)) / beta;
          return bx > threshold ? x : soft;
        });
      }
      return;
    }
  }
}

void activation(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Act act,
                int nparams) {
  const int64_t want = 2 + nparams;
  if (n != want) {
    fail(ctx, "%s: found %lld arguments — valid: %lld", op, (long long)n, (long long)want);
    return;
  }
  View self, out;
  Params P;
  if (!input_arg(ctx, args, n, 0, op, "self", &self) || !out_arg(ctx, args, n, want - 1, op, &out)) return;
  if (act == Act::kGeluErf) {  // the approximate string picks the form
    const char* s = nullptr;
    int64_t size = 0;
    bool none = false;
    if (!string_arg(ctx, args, n, 1, op, "approximate", &s, &size, &none)) return;
    if (none || string_is(s, size, "none")) {
      act = Act::kGeluErf;
    } else if (string_is(s, size, "tanh")) {
      act = Act::kGeluTanh;
    } else {
      fail(ctx, "%s: approximate='%.*s' — is not a GELU approximation — valid: 'none', 'tanh' — "
           "fix: pass one of these", op, static_cast<int>(size > 64 ? 64 : size), s);
      return;
    }
  } else {
    for (int k = 0; k < nparams; ++k)
      if (!scalar_value(ctx, args, n, 1 + k, op, "parameter", &P.p[k])) return;
  }
  if (!is_floating(out.dtype)) {
    fail(ctx, "%s: out has dtype %s — valid: a floating dtype — fix: give the activation a "
         "float16, float32 or float64 out", op, dtype_name(out.dtype));
    return;
  }
  const View* inputs[1] = {&self};
  Loop L;
  if (!broadcast_loop(ctx, op, out, inputs, 1, &L)) return;
  if (out.dtype == kFloat64) run_act<double>(L, act, P);
  else run_act<float>(L, act, P);
}

void gelu_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::gelu.out", Act::kGeluErf, 1); }
void silu_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::silu.out", Act::kSilu, 0); }
void leaky_relu_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::leaky_relu.out", Act::kLeakyRelu, 1); }
void elu_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::elu.out", Act::kElu, 3); }
void hardsigmoid_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::hardsigmoid.out", Act::kHardsigmoid, 0); }
void hardswish_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::hardswish.out", Act::kHardswish, 0); }
void softplus_out(opforge_context* ctx, opforge_arg* args, int64_t n) { activation(ctx, args, n, "aten::softplus.out", Act::kSoftplus, 2); }

const KernelDef kActivationKernels[] = {
    {"aten::relu.out", "T T!", relu_out},
    {"aten::hardtanh.out", "T S S T!", hardtanh_out},
    {"aten::clamp.out", "T S? S? T!", clamp_out},
    {"aten::clamp.Tensor_out", "T T? T? T!", clamp_tensor_out},
    {"aten::clamp_min.out", "T S T!", clamp_min_out},
    {"aten::clamp_min.Tensor_out", "T T T!", clamp_min_tensor_out},
    {"aten::clamp_max.out", "T S T!", clamp_max_out},
    {"aten::clamp_max.Tensor_out", "T T T!", clamp_max_tensor_out},
    {"aten::gelu.out", "T STR T!", gelu_out},
    {"aten::silu.out", "T T!", silu_out},
    {"aten::leaky_relu.out", "T S T!", leaky_relu_out},
    {"aten::elu.out", "T S S S T!", elu_out},
    {"aten::hardsigmoid.out", "T T!", hardsigmoid_out},
    {"aten::hardswish.out", "T T!", hardswish_out},
    {"aten::softplus.out", "T S S T!", softplus_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(activation, kActivationKernels)
