// Binary arithmetic: add, sub, rsub, mul, div (every rounding mode), floor_divide, pow,
// remainder, fmod, maximum/minimum (max.out, min.out), atan2 — the NumPy kernels of
// opforge/kernels/portable/arithmetic.py restated over the broadcasting loop.
//
// Each op computes in ATen's promoted dtype (true division and atan2 in float32 for
// integer operands), a Scalar converted to it first (an int wraps into a narrower integer
// type, as NumPy's astype does), and its result is cast into out's dtype. Integers wrap
// on overflow; integer division, remainder and fmod refuse a zero divisor before writing
// anything; INT_MIN // -1 is INT_MIN and INT_MIN % -1 is 0, as NumPy gives them. Float
// floor division and remainder follow NumPy's divmod (the remainder takes the divisor's
// sign, a zero remainder is a zero of the divisor's sign).
#include <cmath>

#include "elementwise.h"
#include "elementwise_math.h"

namespace opforge::portable {
namespace {

enum class Bin { kAdd, kSub, kMul, kDiv, kFloorDiv, kTruncDiv, kRem, kFmod, kPow, kMax, kMin, kAtan2 };

template <typename T> constexpr bool is_bool_v = std::is_same<T, bool>::value;

template <typename T> inline T op_add(T a, T b) {
  if constexpr (is_bool_v<T>) return a || b;
  else if constexpr (std::is_integral<T>::value) return wrap_add(a, b);
  else return a + b;
}
template <typename T> inline T op_sub(T a, T b) {
  if constexpr (std::is_integral<T>::value) return wrap_sub(a, b);
  else return a - b;
}
template <typename T> inline T op_mul(T a, T b) {
  if constexpr (is_bool_v<T>) return a && b;
  else if constexpr (std::is_integral<T>::value) return wrap_mul(a, b);
  else return a * b;
}

// NumPy's npy_divmod for floats: floor quotient and remainder with the divisor's sign.
template <typename T> inline T float_floor_div(T a, T b) {
  if (b == T(0)) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != T(0)) {
    if ((b < T(0)) != (mod < T(0))) div -= T(1);
  }
  if (div != T(0)) {
    T floordiv = std::floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
    return floordiv;
  }
  return std::copysign(T(0), a / b);
}
template <typename T> inline T float_remainder(T a, T b) {
  T mod = std::fmod(a, b);
  if (b == T(0)) return mod;
  if (mod != T(0)) {
    if ((b < T(0)) != (mod < T(0))) mod += b;
  } else {
    mod = std::copysign(T(0), b);
  }
  return mod;
}

// Integer division and remainders (b != 0: checked before the loop runs).
template <typename T> inline bool is_minus_one(T b) {
  if constexpr (std::is_signed<T>::value) return b == T(-1);
  else return false;
}
template <typename T> inline T int_floor_div(T a, T b) {
  if (b == T(0)) return T(0);
  if (is_minus_one(b)) return wrap_sub(T(0), a);  // INT_MIN // -1 == INT_MIN
  T q = a / b;
  if constexpr (std::is_signed<T>::value) {
    if (((a < 0) != (b < 0)) && q * b != a) --q;
  }
  return q;
}
template <typename T> inline T int_trunc_div(T a, T b) {
  if (b == T(0)) return T(0);
  if (is_minus_one(b)) return wrap_sub(T(0), a);
  return a / b;
}
template <typename T> inline T int_remainder(T a, T b) {
  if (b == T(0) || is_minus_one(b)) return T(0);
  T r = a % b;
  if constexpr (std::is_signed<T>::value) {
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
  }
  return r;
}
template <typename T> inline T int_fmod(T a, T b) {
  if (b == T(0) || is_minus_one(b)) return T(0);
  return a % b;
}

// Integer power by squaring (wrapping); a negative exponent of a tensor exponent gives
// 1 for base 1, +-1 for base -1 by the exponent's parity and 0 otherwise, as in ATen.
template <typename T> inline T int_pow(T base, T e) {
  if constexpr (std::is_signed<T>::value) {
    if (e < 0) {
      if (base == T(1)) return T(1);
      if (base == T(-1)) return (e & 1) ? T(-1) : T(1);
      return T(0);
    }
  }
  T result = T(1);
  while (e) {
    if (e & 1) result = wrap_mul(result, base);
    e = static_cast<T>(e >> 1);
    if (e) base = wrap_mul(base, base);
  }
  return result;
}

// float32 add/sub/mul/div/max/min rows on elementwise_math's cloned loops
struct F32Row {
  RowOp op;
  void operator()(float* o, const void* const* in, const int64_t* step, int64_t n) const {
    binary_row_f32(op, o, static_cast<const float*>(in[0]), step[0],
                   static_cast<const float*>(in[1]), step[1], n);
  }
};

template <typename CT>
void run_op(const Loop& L, Bin kind, const Scalar* alpha, bool half) {
  constexpr bool kFloat = std::is_floating_point<CT>::value;
  if constexpr (std::is_same<CT, float>::value) {
    if (half && kind == Bin::kMax) {
      run_binary<float, float>(L, [](float a, float b) { return numpy_maximum_f16(a, b); });
      return;
    }
    if (half && kind == Bin::kMin) {
      run_binary<float, float>(L, [](float a, float b) { return numpy_minimum_f16(a, b); });
      return;
    }
    const RowOp op = kind == Bin::kAdd ? RowOp::kAdd : kind == Bin::kSub ? RowOp::kSub
                     : kind == Bin::kMul ? RowOp::kMul : kind == Bin::kDiv ? RowOp::kDiv
                     : kind == Bin::kMax ? RowOp::kMax : RowOp::kMin;
    const bool simple = kind == Bin::kAdd || kind == Bin::kSub || kind == Bin::kMul ||
                        kind == Bin::kDiv || kind == Bin::kMax || kind == Bin::kMin;
    if (simple && !alpha) {
      run<float, float, 2>(L, F32Row{op});
      return;
    }
  }
  switch (kind) {
    case Bin::kAdd:
    case Bin::kSub: {
      const bool add = kind == Bin::kAdd;
      if (!alpha) {
        if (add) run_binary<CT, CT>(L, [](CT a, CT b) { return op_add(a, b); });
        else if constexpr (!is_bool_v<CT>) run_binary<CT, CT>(L, [](CT a, CT b) { return op_sub(a, b); });
      } else {
        const CT s = alpha->as<CT>();
        if (add) {
          run_binary<CT, CT>(L, [s](CT a, CT b) { CT p = op_mul(b, s); return op_add(a, p); });
        } else if constexpr (!is_bool_v<CT>) {
          run_binary<CT, CT>(L, [s](CT a, CT b) { CT p = op_mul(b, s); return op_sub(a, p); });
        }
      }
      return;
    }
    case Bin::kMul: run_binary<CT, CT>(L, [](CT a, CT b) { return op_mul(a, b); }); return;
    case Bin::kMax: run_binary<CT, CT>(L, [](CT a, CT b) { return numpy_maximum(a, b); }); return;
    case Bin::kMin: run_binary<CT, CT>(L, [](CT a, CT b) { return numpy_minimum(a, b); }); return;
    default: break;
  }
  if constexpr (kFloat) {
    switch (kind) {
      case Bin::kDiv: run_binary<CT, CT>(L, [](CT a, CT b) { return a / b; }); return;
      case Bin::kFloorDiv: run_binary<CT, CT>(L, [](CT a, CT b) { return float_floor_div(a, b); }); return;
      case Bin::kTruncDiv: run_binary<CT, CT>(L, [](CT a, CT b) { CT q = a / b; return std::trunc(q); }); return;
      case Bin::kRem: run_binary<CT, CT>(L, [](CT a, CT b) { return float_remainder(a, b); }); return;
      case Bin::kFmod: run_binary<CT, CT>(L, [](CT a, CT b) { return std::fmod(a, b); }); return;
      case Bin::kPow: run_binary<CT, CT>(L, [](CT a, CT b) { return std::pow(a, b); }); return;
      case Bin::kAtan2: run_binary<CT, CT>(L, [](CT a, CT b) { return std::atan2(a, b); }); return;
      default: return;
    }
  } else if constexpr (!is_bool_v<CT>) {
    switch (kind) {
      case Bin::kFloorDiv: run_binary<CT, CT>(L, [](CT a, CT b) { return int_floor_div(a, b); }); return;
      case Bin::kTruncDiv: run_binary<CT, CT>(L, [](CT a, CT b) { return int_trunc_div(a, b); }); return;
      case Bin::kRem: run_binary<CT, CT>(L, [](CT a, CT b) { return int_remainder(a, b); }); return;
      case Bin::kFmod: run_binary<CT, CT>(L, [](CT a, CT b) { return int_fmod(a, b); }); return;
      case Bin::kPow: run_binary<CT, CT>(L, [](CT a, CT b) { return int_pow(a, b); }); return;
      default: return;  // kDiv and kAtan2 compute in floating point
    }
  }
}

const char* bin_name(Bin kind) {
  switch (kind) {
    case Bin::kAdd: return "addition"; case Bin::kSub: return "subtraction";
    case Bin::kMul: return "multiplication"; case Bin::kDiv: return "division";
    case Bin::kFloorDiv: return "floor division"; case Bin::kTruncDiv: return "truncating division";
    case Bin::kRem: return "remainder"; case Bin::kFmod: return "fmod"; case Bin::kPow: return "power";
    case Bin::kMax: return "maximum"; case Bin::kMin: return "minimum"; case Bin::kAtan2: return "atan2";
  }
  return "op";
}

// Argument layout of one overload: is self / other a Scalar, is there an alpha (index 2),
// a rounding mode (index 2), and where the out is.
struct Layout {
  bool self_scalar, other_scalar, alpha, mode;
};

void binary(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Bin kind,
            Layout layout, bool reversed = false) {
  const int64_t out_index = 2 + (layout.alpha || layout.mode ? 1 : 0);
  if (n != out_index + 1) {
    fail(ctx, "%s: found %lld arguments — valid: %lld", op, (long long)n, (long long)(out_index + 1));
    return;
  }
  Arg self, other;
  View out;
  Scalar alpha;
  bool has_alpha = false;
  if (!operand_arg(ctx, args, n, 0, op, "self", layout.self_scalar, &self) ||
      !operand_arg(ctx, args, n, 1, op, "other", layout.other_scalar, &other) ||
      !out_arg(ctx, args, n, out_index, op, &out))
    return;
  if (layout.alpha) {
    if (!scalar_value(ctx, args, n, 2, op, "alpha", &alpha)) return;
    has_alpha = alpha.kind == Scalar::kFloating ? alpha.d != 1.0 : alpha.i != 1;
  }
  if (layout.mode) {
    const char* mode = nullptr;
    int64_t size = 0;
    bool none = false;
    if (!string_arg(ctx, args, n, 2, op, "rounding_mode", &mode, &size, &none)) return;
    if (none) {
      kind = Bin::kDiv;
    } else if (string_is(mode, size, "floor")) {
      kind = Bin::kFloorDiv;
    } else if (string_is(mode, size, "trunc")) {
      kind = Bin::kTruncDiv;
    } else {
      fail(ctx, "%s: rounding_mode='%.*s' — is not a rounding mode — valid: None, 'trunc', "
           "'floor' — fix: pass one of these", op, static_cast<int>(size > 64 ? 64 : size), mode);
      return;
    }
  }
  const Operand promo[2] = {self.promo(), other.promo()};
  int32_t ct = result_type(ctx, op, promo, 2);
  if (ct < 0) return;
  if ((kind == Bin::kDiv || kind == Bin::kAtan2) && !is_floating(ct)) ct = kFloat32;
  const bool floating = is_floating(ct);
  if (ct == kBool && kind != Bin::kAdd && kind != Bin::kMul && kind != Bin::kMax && kind != Bin::kMin) {
    fail(ctx, "%s: %s of bool operands — not supported (as in ATen and NumPy) — valid: numeric "
         "operands — fix: use logical_xor / bitwise ops, or cast to an integer dtype", op,
         bin_name(kind));
    return;
  }
  const Arg& divisor = reversed ? self : other;
  const Arg& exponent = other;
  bool refused = false;
  dispatch_compute(ct, [&](auto tag) {
    using CT = decltype(tag);
    if constexpr (std::is_integral<CT>::value && !is_bool_v<CT>) {
      if (kind == Bin::kFloorDiv || kind == Bin::kTruncDiv || kind == Bin::kRem || kind == Bin::kFmod) {
        bool zero = divisor.is_scalar ? divisor.scalar.as<CT>() == CT(0)
                                      : any_element<CT>(divisor.view, [](CT v) { return v == CT(0); });
        if (zero) {
          fail(ctx, "%s: integer %s — a divisor is zero — integer division needs non-zero "
               "divisors — fix: mask the zeros or divide in floating point", op, bin_name(kind));
          refused = true;
          return;
        }
      }
      if constexpr (std::is_signed<CT>::value) {
        if (kind == Bin::kPow && exponent.is_scalar && exponent.scalar.as<CT>() < CT(0)) {
          fail(ctx, "%s: integer power — a negative exponent of an integer base — integer bases "
               "need exponents >= 0 — fix: cast the base to a floating dtype", op);
          refused = true;
          return;
        }
      }
    }
    (void)floating;
  });
  if (refused) return;
  dispatch_compute(ct, [&](auto tag) {
    using CT = decltype(tag);
    CT sa{}, sb{};
    const View a = loop_view<CT>(reversed ? other : self, &sa);
    const View b = loop_view<CT>(reversed ? self : other, &sb);
    const View* inputs[2] = {&a, &b};
    Loop L;
    if (!broadcast_loop(ctx, op, out, inputs, 2, &L)) return;
    run_op<CT>(L, kind, has_alpha ? &alpha : nullptr, ct == kFloat16);
  });
}

constexpr Layout kTT{false, false, false, false};
constexpr Layout kTS{false, true, false, false};
constexpr Layout kST{true, false, false, false};
constexpr Layout kTTAlpha{false, false, true, false};
constexpr Layout kTSAlpha{false, true, true, false};
constexpr Layout kTTMode{false, false, false, true};
constexpr Layout kTSMode{false, true, false, true};

#define OPFORGE_BINARY(fn, key, kind, layout, reversed)                      \
  void fn(opforge_context* ctx, opforge_arg* args, int64_t n) {             \
    binary(ctx, args, n, key, kind, layout, reversed);                      \
  }

OPFORGE_BINARY(add_out, "aten::add.out", Bin::kAdd, kTTAlpha, false)
OPFORGE_BINARY(add_scalar_out, "aten::add.Scalar_out", Bin::kAdd, kTSAlpha, false)
OPFORGE_BINARY(sub_out, "aten::sub.out", Bin::kSub, kTTAlpha, false)
OPFORGE_BINARY(sub_scalar_out, "aten::sub.Scalar_out", Bin::kSub, kTSAlpha, false)
OPFORGE_BINARY(rsub_tensor_out, "aten::rsub.Tensor_out", Bin::kSub, kTTAlpha, true)
OPFORGE_BINARY(rsub_scalar_out, "aten::rsub.Scalar_out", Bin::kSub, kTSAlpha, true)
OPFORGE_BINARY(mul_out, "aten::mul.out", Bin::kMul, kTT, false)
OPFORGE_BINARY(mul_scalar_out, "aten::mul.Scalar_out", Bin::kMul, kTS, false)
OPFORGE_BINARY(div_out, "aten::div.out", Bin::kDiv, kTT, false)
OPFORGE_BINARY(div_scalar_out, "aten::div.Scalar_out", Bin::kDiv, kTS, false)
OPFORGE_BINARY(div_out_mode, "aten::div.out_mode", Bin::kDiv, kTTMode, false)
OPFORGE_BINARY(div_scalar_mode_out, "aten::div.Scalar_mode_out", Bin::kDiv, kTSMode, false)
OPFORGE_BINARY(floor_divide_out, "aten::floor_divide.out", Bin::kFloorDiv, kTT, false)
OPFORGE_BINARY(floor_divide_scalar_out, "aten::floor_divide.Scalar_out", Bin::kFloorDiv, kTS, false)
OPFORGE_BINARY(pow_tensor_tensor_out, "aten::pow.Tensor_Tensor_out", Bin::kPow, kTT, false)
OPFORGE_BINARY(pow_tensor_scalar_out, "aten::pow.Tensor_Scalar_out", Bin::kPow, kTS, false)
OPFORGE_BINARY(pow_scalar_out, "aten::pow.Scalar_out", Bin::kPow, kST, false)
OPFORGE_BINARY(remainder_tensor_out, "aten::remainder.Tensor_out", Bin::kRem, kTT, false)
OPFORGE_BINARY(remainder_scalar_out, "aten::remainder.Scalar_out", Bin::kRem, kTS, false)
OPFORGE_BINARY(remainder_scalar_tensor_out, "aten::remainder.Scalar_Tensor_out", Bin::kRem, kST, false)
OPFORGE_BINARY(fmod_tensor_out, "aten::fmod.Tensor_out", Bin::kFmod, kTT, false)
OPFORGE_BINARY(fmod_scalar_out, "aten::fmod.Scalar_out", Bin::kFmod, kTS, false)
OPFORGE_BINARY(maximum_out, "aten::maximum.out", Bin::kMax, kTT, false)
OPFORGE_BINARY(max_other_out, "aten::max.out", Bin::kMax, kTT, false)
OPFORGE_BINARY(minimum_out, "aten::minimum.out", Bin::kMin, kTT, false)
OPFORGE_BINARY(min_other_out, "aten::min.out", Bin::kMin, kTT, false)
OPFORGE_BINARY(atan2_out, "aten::atan2.out", Bin::kAtan2, kTT, false)

#undef OPFORGE_BINARY

const KernelDef kBinaryKernels[] = {
    {"aten::add.out", "T T S T!", add_out},
    {"aten::add.Scalar_out", "T S S T!", add_scalar_out},
    {"aten::sub.out", "T T S T!", sub_out},
    {"aten::sub.Scalar_out", "T S S T!", sub_scalar_out},
    {"aten::rsub.Tensor_out", "T T S T!", rsub_tensor_out},
    {"aten::rsub.Scalar_out", "T S S T!", rsub_scalar_out},
    {"aten::mul.out", "T T T!", mul_out},
    {"aten::mul.Scalar_out", "T S T!", mul_scalar_out},
    {"aten::div.out", "T T T!", div_out},
    {"aten::div.Scalar_out", "T S T!", div_scalar_out},
    {"aten::div.out_mode", "T T STR? T!", div_out_mode},
    {"aten::div.Scalar_mode_out", "T S STR? T!", div_scalar_mode_out},
    {"aten::floor_divide.out", "T T T!", floor_divide_out},
    {"aten::floor_divide.Scalar_out", "T S T!", floor_divide_scalar_out},
    {"aten::pow.Tensor_Tensor_out", "T T T!", pow_tensor_tensor_out},
    {"aten::pow.Tensor_Scalar_out", "T S T!", pow_tensor_scalar_out},
    {"aten::pow.Scalar_out", "S T T!", pow_scalar_out},
    {"aten::remainder.Tensor_out", "T T T!", remainder_tensor_out},
    {"aten::remainder.Scalar_out", "T S T!", remainder_scalar_out},
    {"aten::remainder.Scalar_Tensor_out", "S T T!", remainder_scalar_tensor_out},
    {"aten::fmod.Tensor_out", "T T T!", fmod_tensor_out},
    {"aten::fmod.Scalar_out", "T S T!", fmod_scalar_out},
    {"aten::maximum.out", "T T T!", maximum_out},
    {"aten::max.out", "T T T!", max_other_out},
    {"aten::minimum.out", "T T T!", minimum_out},
    {"aten::min.out", "T T T!", min_other_out},
    {"aten::atan2.out", "T T T!", atan2_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(binary, kBinaryKernels)
