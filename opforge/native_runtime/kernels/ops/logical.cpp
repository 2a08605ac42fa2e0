// Logical and bitwise ops: logical_and/or/xor/not, bitwise_and/or/xor (Tensor, Scalar,
// Scalar_Tensor) and bitwise_not — the NumPy kernels of comparison.py.
//
// Logical ops take each operand by its truth value in its own dtype (NaN is true) and
// write bool, cast into out's dtype; bool operands run as bool, others through float64,
// which keeps every non-zero value non-zero. Bitwise ops compute in the promoted dtype,
// which must be bool or an integer (NumPy and ATen refuse floats); bitwise_not keeps its
// input's dtype (logical not on bool).
#include "elementwise.h"

namespace opforge::portable {
namespace {

enum class Logic { kAnd, kOr, kXor };

template <typename CT>
void run_logic(const Loop& L, Logic kind) {
  switch (kind) {
    case Logic::kAnd: run_binary<CT, bool>(L, [](CT a, CT b) { return (a != CT(0)) && (b != CT(0)); }); return;
    case Logic::kOr: run_binary<CT, bool>(L, [](CT a, CT b) { return (a != CT(0)) || (b != CT(0)); }); return;
    case Logic::kXor: run_binary<CT, bool>(L, [](CT a, CT b) { return (a != CT(0)) != (b != CT(0)); }); return;
  }
}

void logical(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Logic kind) {
  View a, b, out;
  if (n != 3) {
    fail(ctx, "%s: found %lld arguments — valid: 3 (self, other, out)", op, (long long)n);
    return;
  }
  if (!input_arg(ctx, args, n, 0, op, "self", &a) || !input_arg(ctx, args, n, 1, op, "other", &b) ||
      !out_arg(ctx, args, n, 2, op, &out))
    return;
  // bool operands are read as their bytes (uint8: byte loads vectorize, bool ones do not)
  const bool bytes = a.dtype == kBool && b.dtype == kBool;
  if (bytes) a.dtype = b.dtype = kUInt8;
  const View* inputs[2] = {&a, &b};
  Loop L;
  if (!broadcast_loop(ctx, op, out, inputs, 2, &L)) return;
  if (bytes) run_logic<uint8_t>(L, kind);
  else run_logic<double>(L, kind);
}

void logical_and_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  logical(ctx, args, n, "aten::logical_and.out", Logic::kAnd);
}
void logical_or_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  logical(ctx, args, n, "aten::logical_or.out", Logic::kOr);
}
void logical_xor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  logical(ctx, args, n, "aten::logical_xor.out", Logic::kXor);
}

void logical_not_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::logical_not.out";
  View a, out;
  if (n != 2) {
    fail(ctx, "%s: found %lld arguments — valid: 2 (self, out)", op, (long long)n);
    return;
  }
  if (!input_arg(ctx, args, n, 0, op, "self", &a) || !out_arg(ctx, args, n, 1, op, &out)) return;
  const bool bytes = a.dtype == kBool;
  if (bytes) a.dtype = kUInt8;
  const View* inputs[1] = {&a};
  Loop L;
  if (!broadcast_loop(ctx, op, out, inputs, 1, &L)) return;
  if (bytes) run_unary<uint8_t, bool>(L, [](uint8_t v) { return v == 0; });
  else run_unary<double, bool>(L, [](double v) { return v == 0.0; });
}

enum class Bits { kAnd, kOr, kXor };

void bitwise(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Bits kind,
             bool self_scalar, bool other_scalar) {
  Arg self, other;
  View out;
  if (n != 3) {
    fail(ctx, "%s: found %lld arguments — valid: 3 (self, other, out)", op, (long long)n);
    return;
  }
  if (!operand_arg(ctx, args, n, 0, op, "self", self_scalar, &self) ||
      !operand_arg(ctx, args, n, 1, op, "other", other_scalar, &other) || !out_arg(ctx, args, n, 2, op, &out))
    return;
  const Operand promo[2] = {self.promo(), other.promo()};
  const int32_t ct = result_type(ctx, op, promo, 2);
  if (ct < 0) return;
  if (!is_integral(ct, true)) {
    fail(ctx, "%s: bitwise op in %s — valid: bool or integer operands — fix: cast to an integer "
         "dtype", op, dtype_name(ct));
    return;
  }
  dispatch_real(ct, [&](auto tag) {
    using CT = decltype(tag);
    if constexpr (std::is_integral<CT>::value) {
      CT sa{}, sb{};
      const View a = loop_view<CT>(self, &sa), b = loop_view<CT>(other, &sb);
      const View* inputs[2] = {&a, &b};
      Loop L;
      if (!broadcast_loop(ctx, op, out, inputs, 2, &L)) return;
      switch (kind) {
        case Bits::kAnd: run_binary<CT, CT>(L, [](CT x, CT y) { return static_cast<CT>(x & y); }); return;
        case Bits::kOr: run_binary<CT, CT>(L, [](CT x, CT y) { return static_cast<CT>(x | y); }); return;
        case Bits::kXor: run_binary<CT, CT>(L, [](CT x, CT y) { return static_cast<CT>(x ^ y); }); return;
      }
    }
  });
}

#define OPFORGE_BITWISE(name, kind)                                                          \
  void bitwise_##name##_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {     \
    bitwise(ctx, args, n, "aten::bitwise_" #name ".Tensor_out", kind, false, false);         \
  }                                                                                          \
  void bitwise_##name##_scalar_out(opforge_context* ctx, opforge_arg* args, int64_t n) {     \
    bitwise(ctx, args, n, "aten::bitwise_" #name ".Scalar_out", kind, false, true);          \
  }                                                                                          \
  void bitwise_##name##_scalar_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) { \
    bitwise(ctx, args, n, "aten::bitwise_" #name ".Scalar_Tensor_out", kind, true, false);   \
  }

OPFORGE_BITWISE(and, Bits::kAnd)
OPFORGE_BITWISE(or, Bits::kOr)
OPFORGE_BITWISE(xor, Bits::kXor)

#undef OPFORGE_BITWISE

void bitwise_not_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::bitwise_not.out";
  View a, out;
  if (n != 2) {
    fail(ctx, "%s: found %lld arguments — valid: 2 (self, out)", op, (long long)n);
    return;
  }
  if (!input_arg(ctx, args, n, 0, op, "self", &a) || !out_arg(ctx, args, n, 1, op, &out)) return;
  if (!is_integral(a.dtype, true)) {
    fail(ctx, "%s: self has dtype %s — valid: bool or an integer dtype — fix: cast it to an "
         "integer dtype", op, dtype_name(a.dtype));
    return;
  }
  const bool bytes = a.dtype == kBool;
  if (bytes) a.dtype = kUInt8;
  const View* inputs[1] = {&a};
  Loop L;
  if (!broadcast_loop(ctx, op, out, inputs, 1, &L)) return;
  if (bytes) {  // logical not of bool bytes
    run_unary<uint8_t, bool>(L, [](uint8_t v) { return v == 0; });
    return;
  }
  dispatch_real(a.dtype, [&](auto tag) {
    using CT = decltype(tag);
    if constexpr (std::is_same<CT, bool>::value) run_unary<bool, bool>(L, [](bool v) { return !v; });
    else if constexpr (std::is_integral<CT>::value) run_unary<CT, CT>(L, [](CT v) { return static_cast<CT>(~v); });
  });
}

const KernelDef kLogicalKernels[] = {
    {"aten::logical_and.out", "T T T!", logical_and_out},
    {"aten::logical_or.out", "T T T!", logical_or_out},
    {"aten::logical_xor.out", "T T T!", logical_xor_out},
    {"aten::logical_not.out", "T T!", logical_not_out},
    {"aten::bitwise_and.Tensor_out", "T T T!", bitwise_and_tensor_out},
    {"aten::bitwise_and.Scalar_out", "T S T!", bitwise_and_scalar_out},
    {"aten::bitwise_and.Scalar_Tensor_out", "S T T!", bitwise_and_scalar_tensor_out},
    {"aten::bitwise_or.Tensor_out", "T T T!", bitwise_or_tensor_out},
    {"aten::bitwise_or.Scalar_out", "T S T!", bitwise_or_scalar_out},
    {"aten::bitwise_or.Scalar_Tensor_out", "S T T!", bitwise_or_scalar_tensor_out},
    {"aten::bitwise_xor.Tensor_out", "T T T!", bitwise_xor_tensor_out},
    {"aten::bitwise_xor.Scalar_out", "T S T!", bitwise_xor_scalar_out},
    {"aten::bitwise_xor.Scalar_Tensor_out", "S T T!", bitwise_xor_scalar_tensor_out},
    {"aten::bitwise_not.out", "T T!", bitwise_not_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(logical, kLogicalKernels)
