// Pointwise math on one tensor — the NumPy kernels of opforge/kernels/portable/unary.py:
// exp, log, trig, sqrt, rsqrt, reciprocal, erf, sigmoid (floating ops), neg, abs, sign
// (the input's dtype), floor, ceil, round (half to even, and with decimals), trunc (the
// identity on integers), isnan and isinf.
//
// A floating op computes in out's dtype when out is floating, else in the input's floating
// dtype (float32 for integer and bool inputs), as the NumPy kernel passes `dtype=` to its
// ufunc. float32 exp, sigmoid and tanh run on elementwise_math's vectorized forms (<= 1 ulp);
// the other functions are the C library's (glibc: <= 1 ulp for float32); NumPy's float32
// loops are its own SIMD versions, so results agree to a few ulp, not bit for bit
// (tests/native_runtime/test_portable_elementwise.py states each tolerance).
#include <cmath>

#include "elementwise.h"
#include "elementwise_math.h"

namespace opforge::portable {
namespace {

enum class Fn {
  kExp, kExp2, kExpm1, kLog, kLog2, kLog10, kLog1p, kSqrt, kSin, kCos, kTan, kTanh, kAsin,
  kAcos, kAtan, kSinh, kCosh, kReciprocal, kRsqrt, kErf, kSigmoid,
};

// Apply a float32 row function to contiguous rows and to a broadcast single value.
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

template <typename T>
void run_fn(const Loop& L, Fn fn) {
  switch (fn) {
    case Fn::kExp:
      if constexpr (std::is_same<T, float>::value) run<float, float, 1>(L, FloatRow{exp_row_f32});
      else run_unary<T, T>(L, [](T x) { return std::exp(x); });
      return;
    case Fn::kSigmoid:
      if constexpr (std::is_same<T, float>::value) {
        run<float, float, 1>(L, FloatRow{sigmoid_row_f32});
      } else {
        run_unary<T, T>(L, [](T x) { T e = std::exp(-x); T d = T(1) + e; return T(1) / d; });
      }
      return;
    case Fn::kExp2: run_unary<T, T>(L, [](T x) { return std::exp2(x); }); return;
    case Fn::kExpm1: run_unary<T, T>(L, [](T x) { return std::expm1(x); }); return;
    case Fn::kLog: run_unary<T, T>(L, [](T x) { return std::log(x); }); return;
    case Fn::kLog2: run_unary<T, T>(L, [](T x) { return std::log2(x); }); return;
    case Fn::kLog10: run_unary<T, T>(L, [](T x) { return std::log10(x); }); return;
    case Fn::kLog1p: run_unary<T, T>(L, [](T x) { return std::log1p(x); }); return;
    case Fn::kSqrt: run_unary<T, T>(L, [](T x) { return std::sqrt(x); }); return;
    case Fn::kSin: run_unary<T, T>(L, [](T x) { return std::sin(x); }); return;
    case Fn::kCos: run_unary<T, T>(L, [](T x) { return std::cos(x); }); return;
    case Fn::kTan: run_unary<T, T>(L, [](T x) { return std::tan(x); }); return;
    case Fn::kTanh:
      if constexpr (std::is_same<T, float>::value) run<float, float, 1>(L, FloatRow{tanh_row_f32});
      else run_unary<T, T>(L, [](T x) { return std::tanh(x); });
      return;
    case Fn::kAsin: run_unary<T, T>(L, [](T x) { return std::asin(x); }); return;
    case Fn::kAcos: run_unary<T, T>(L, [](T x) { return std::acos(x); }); return;
    case Fn::kAtan: run_unary<T, T>(L, [](T x) { return std::atan(x); }); return;
    case Fn::kSinh: run_unary<T, T>(L, [](T x) { return std::sinh(x); }); return;
    case Fn::kCosh: run_unary<T, T>(L, [](T x) { return std::cosh(x); }); return;
    case Fn::kReciprocal: run_unary<T, T>(L, [](T x) { return T(1) / x; }); return;
    case Fn::kRsqrt: run_unary<T, T>(L, [](T x) { T r = std::sqrt(x); return T(1) / r; }); return;
    case Fn::kErf: return;  // computed in float64 for every dtype (floating())
  }
}

bool unary_args(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, View* self,
                View* out, Loop* L) {
  if (n != 2) {
    fail(ctx, "%s: found %lld arguments — valid: 2 (self, out)", op, (long long)n);
    return false;
  }
  if (!input_arg(ctx, args, n, 0, op, "self", self) || !out_arg(ctx, args, n, 1, op, out)) return false;
  const View* inputs[1] = {self};
  return broadcast_loop(ctx, op, *out, inputs, 1, L);
}

void floating(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Fn fn) {
  View self, out;
  Loop L;
  if (!unary_args(ctx, args, n, op, &self, &out, &L)) return;
  if (fn == Fn::kErf) {
    // as the NumPy kernel: erf of the input in float64, rounded once into out
    run_unary<double, double>(L, [](double x) { return std::erf(x); });
    return;
  }
  const int32_t ct = is_floating(out.dtype) ? out.dtype : is_floating(self.dtype) ? self.dtype : kFloat32;
  if (ct == kFloat64) run_fn<double>(L, fn);
  else run_fn<float>(L, fn);
}

#define OPFORGE_FLOATING(name, fn)                                              \
  void name##_out(opforge_context* ctx, opforge_arg* args, int64_t n) {         \
    floating(ctx, args, n, "aten::" #name ".out", fn);                          \
  }

OPFORGE_FLOATING(exp, Fn::kExp)
OPFORGE_FLOATING(exp2, Fn::kExp2)
OPFORGE_FLOATING(expm1, Fn::kExpm1)
OPFORGE_FLOATING(log, Fn::kLog)
OPFORGE_FLOATING(log2, Fn::kLog2)
OPFORGE_FLOATING(log10, Fn::kLog10)
OPFORGE_FLOATING(log1p, Fn::kLog1p)
OPFORGE_FLOATING(sqrt, Fn::kSqrt)
OPFORGE_FLOATING(sin, Fn::kSin)
OPFORGE_FLOATING(cos, Fn::kCos)
OPFORGE_FLOATING(tan, Fn::kTan)
OPFORGE_FLOATING(tanh, Fn::kTanh)
OPFORGE_FLOATING(asin, Fn::kAsin)
OPFORGE_FLOATING(acos, Fn::kAcos)
OPFORGE_FLOATING(atan, Fn::kAtan)
OPFORGE_FLOATING(sinh, Fn::kSinh)
OPFORGE_FLOATING(cosh, Fn::kCosh)
OPFORGE_FLOATING(reciprocal, Fn::kReciprocal)
OPFORGE_FLOATING(rsqrt, Fn::kRsqrt)
OPFORGE_FLOATING(erf, Fn::kErf)
OPFORGE_FLOATING(sigmoid, Fn::kSigmoid)

#undef OPFORGE_FLOATING

// neg, abs, sign: computed in the input's dtype (wrapping: neg and abs of INT_MIN are
// INT_MIN); bool is copied, as the NumPy kernel does for all three.
enum class Same { kNeg, kAbs, kSign };

void same_dtype(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Same kind) {
  View self, out;
  Loop L;
  if (!unary_args(ctx, args, n, op, &self, &out, &L)) return;
  dispatch_compute(self.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same<T, bool>::value) {
      run_unary<bool, bool>(L, [](bool v) { return v; });
    } else if constexpr (std::is_floating_point<T>::value) {
      switch (kind) {
        case Same::kNeg: run_unary<T, T>(L, [](T v) { return -v; }); return;
        case Same::kAbs: run_unary<T, T>(L, [](T v) { return std::fabs(v); }); return;
        case Same::kSign:  // NaN -> 0 (ATen's (x > 0) - (x < 0)); -0.0 -> 0.0
          run_unary<T, T>(L, [](T v) { return v > T(0) ? T(1) : v < T(0) ? T(-1) : T(0); });
          return;
      }
    } else {
      switch (kind) {
        case Same::kNeg: run_unary<T, T>(L, [](T v) { return wrap_sub(T(0), v); }); return;
        case Same::kAbs:
          if constexpr (std::is_signed<T>::value) run_unary<T, T>(L, [](T v) { return v < 0 ? wrap_sub(T(0), v) : v; });
          else run_unary<T, T>(L, [](T v) { return v; });
          return;
        case Same::kSign: run_unary<T, T>(L, [](T v) { return static_cast<T>((v > T(0)) - (v < T(0))); }); return;
      }
    }
  });
}

void neg_out(opforge_context* ctx, opforge_arg* args, int64_t n) { same_dtype(ctx, args, n, "aten::neg.out", Same::kNeg); }
void abs_out(opforge_context* ctx, opforge_arg* args, int64_t n) { same_dtype(ctx, args, n, "aten::abs.out", Same::kAbs); }
void sign_out(opforge_context* ctx, opforge_arg* args, int64_t n) { same_dtype(ctx, args, n, "aten::sign.out", Same::kSign); }

// floor, ceil, round (half to even), trunc on floating inputs; integers are copied.
enum class Rounding { kFloor, kCeil, kRound, kTrunc };

void rounding(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Rounding kind) {
  View self, out;
  Loop L;
  if (!unary_args(ctx, args, n, op, &self, &out, &L)) return;
  dispatch_compute(self.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point<T>::value) {
      switch (kind) {
        case Rounding::kFloor: run_unary<T, T>(L, [](T v) { return std::floor(v); }); return;
        case Rounding::kCeil: run_unary<T, T>(L, [](T v) { return std::ceil(v); }); return;
        case Rounding::kRound: run_unary<T, T>(L, [](T v) { return std::nearbyint(v); }); return;
        case Rounding::kTrunc: run_unary<T, T>(L, [](T v) { return std::trunc(v); }); return;
      }
    } else {
      run_unary<T, T>(L, [](T v) { return v; });
    }
  });
}

void floor_out(opforge_context* ctx, opforge_arg* args, int64_t n) { rounding(ctx, args, n, "aten::floor.out", Rounding::kFloor); }
void ceil_out(opforge_context* ctx, opforge_arg* args, int64_t n) { rounding(ctx, args, n, "aten::ceil.out", Rounding::kCeil); }
void round_out(opforge_context* ctx, opforge_arg* args, int64_t n) { rounding(ctx, args, n, "aten::round.out", Rounding::kRound); }
void trunc_out(opforge_context* ctx, opforge_arg* args, int64_t n) { rounding(ctx, args, n, "aten::trunc.out", Rounding::kTrunc); }

// round(x, decimals) as NumPy's np.round: x * 10^d, rint, / 10^d (for d < 0: / then *), the
// factor rounded to x's dtype; integers are copied for d >= 0 and refused for d < 0
// (NumPy cannot cast its float64 result back into an integer out).
void round_decimals_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::round.decimals_out";
  if (n != 3) {
    fail(ctx, "%s: found %lld arguments — valid: 3 (self, decimals, out)", op, (long long)n);
    return;
  }
  View self, out;
  int64_t decimals;
  if (!input_arg(ctx, args, n, 0, op, "self", &self) || !int_arg(ctx, args, n, 1, op, "decimals", &decimals) ||
      !out_arg(ctx, args, n, 2, op, &out))
    return;
  const View* inputs[1] = {&self};
  Loop L;
  if (!broadcast_loop(ctx, op, out, inputs, 1, &L)) return;
  if (!is_floating(self.dtype)) {
    if (decimals < 0) {
      fail(ctx, "%s: decimals=%lld of an integer tensor — valid: decimals >= 0 for integers (the "
           "NumPy kernel refuses it too) — fix: cast to a floating dtype first", op, (long long)decimals);
      return;
    }
    dispatch_real(self.dtype, [&](auto tag) {
      using T = decltype(tag);
      run_unary<T, T>(L, [](T v) { return v; });
    });
    return;
  }
  const int64_t e = decimals < 0 ? -decimals : decimals;
  double factor = 1.0;
  for (int64_t i = 0; i < e && factor < 1e308; ++i) factor *= 10.0;  // NumPy's power_of_ten
  if (e > 400) factor = INFINITY;
  dispatch_compute(self.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point<T>::value) {
      const T f = static_cast<T>(factor);
      if (decimals >= 0) {
        run_unary<T, T>(L, [f](T v) { T y = v * f; y = std::nearbyint(y); return y / f; });
      } else {
        run_unary<T, T>(L, [f](T v) { T y = v / f; y = std::nearbyint(y); return y * f; });
      }
    }
  });
}

// isnan / isinf: bool; never true for integer and bool tensors.
void classify(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, bool nan) {
  View self, out;
  Loop L;
  if (!unary_args(ctx, args, n, op, &self, &out, &L)) return;
  if (!is_floating(self.dtype)) {
    run_unary<bool, bool>(L, [](bool) { return false; });
    return;
  }
  if (self.dtype == kFloat64) {
    if (nan) run_unary<double, bool>(L, [](double v) { return v != v; });
    else run_unary<double, bool>(L, [](double v) { return v == INFINITY || v == -INFINITY; });
  } else {
    if (nan) run_unary<float, bool>(L, [](float v) { return v != v; });
    else run_unary<float, bool>(L, [](float v) { return v == INFINITY || v == -INFINITY; });
  }
}

void isnan_out(opforge_context* ctx, opforge_arg* args, int64_t n) { classify(ctx, args, n, "aten::isnan.out", true); }
void isinf_out(opforge_context* ctx, opforge_arg* args, int64_t n) { classify(ctx, args, n, "aten::isinf.out", false); }

const KernelDef kUnaryKernels[] = {
    {"aten::exp.out", "T T!", exp_out},
    {"aten::exp2.out", "T T!", exp2_out},
    {"aten::expm1.out", "T T!", expm1_out},
    {"aten::log.out", "T T!", log_out},
    {"aten::log2.out", "T T!", log2_out},
    {"aten::log10.out", "T T!", log10_out},
    {"aten::log1p.out", "T T!", log1p_out},
    {"aten::sqrt.out", "T T!", sqrt_out},
    {"aten::sin.out", "T T!", sin_out},
    {"aten::cos.out", "T T!", cos_out},
    {"aten::tan.out", "T T!", tan_out},
    {"aten::tanh.out", "T T!", tanh_out},
    {"aten::asin.out", "T T!", asin_out},
    {"aten::acos.out", "T T!", acos_out},
    {"aten::atan.out", "T T!", atan_out},
    {"aten::sinh.out", "T T!", sinh_out},
    {"aten::cosh.out", "T T!", cosh_out},
    {"aten::reciprocal.out", "T T!", reciprocal_out},
    {"aten::rsqrt.out", "T T!", rsqrt_out},
    {"aten::erf.out", "T T!", erf_out},
    {"aten::sigmoid.out", "T T!", sigmoid_out},
    {"aten::neg.out", "T T!", neg_out},
    {"aten::abs.out", "T T!", abs_out},
    {"aten::sign.out", "T T!", sign_out},
    {"aten::floor.out", "T T!", floor_out},
    {"aten::ceil.out", "T T!", ceil_out},
    {"aten::round.out", "T T!", round_out},
    {"aten::trunc.out", "T T!", trunc_out},
    {"aten::round.decimals_out", "T I T!", round_decimals_out},
    {"aten::isnan.out", "T T!", isnan_out},
    {"aten::isinf.out", "T T!", isinf_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(unary, kUnaryKernels)
