// Comparisons (eq, ne, lt, le, gt, ge; Tensor and Scalar), where and masked_fill — the
// NumPy kernels of opforge/kernels/portable/comparison.py over the broadcasting loop.
//
// A comparison converts both operands to their promoted dtype first (an int32 tensor
// against 2.5 compares in float32, as ATen does) and writes bool, cast into out's dtype.
// where and masked_fill do not promote: each value is cast straight into out's dtype
// (NumPy's copyto), the condition or mask taken by its truth value.
#include "elementwise.h"
#include "elementwise_math.h"

namespace opforge::portable {
namespace {

enum class Cmp { kEq, kNe, kLt, kLe, kGt, kGe };

struct F32CompareRow {
  RowCmp op;
  void operator()(bool* o, const void* const* in, const int64_t* step, int64_t n) const {
    compare_row_f32(op, o, static_cast<const float*>(in[0]), step[0],
                    static_cast<const float*>(in[1]), step[1], n);
  }
};

template <typename CT>
void run_compare(const Loop& L, Cmp kind) {
  if constexpr (std::is_same<CT, float>::value) {
    run<float, bool, 2>(L, F32CompareRow{static_cast<RowCmp>(static_cast<int>(kind))});
    return;
  }
  switch (kind) {
    case Cmp::kEq: run_binary<CT, bool>(L, [](CT a, CT b) { return a == b; }); return;
    case Cmp::kNe: run_binary<CT, bool>(L, [](CT a, CT b) { return a != b; }); return;
    case Cmp::kLt: run_binary<CT, bool>(L, [](CT a, CT b) { return a < b; }); return;
    case Cmp::kLe: run_binary<CT, bool>(L, [](CT a, CT b) { return a <= b; }); return;
    case Cmp::kGt: run_binary<CT, bool>(L, [](CT a, CT b) { return a > b; }); return;
    case Cmp::kGe: run_binary<CT, bool>(L, [](CT a, CT b) { return a >= b; }); return;
  }
}

void compare(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, Cmp kind,
             bool other_scalar) {
  if (n != 3) {
    fail(ctx, "%s: found %lld arguments — valid: 3 (self, other, out)", op, (long long)n);
    return;
  }
  Arg self, other;
  View out;
  if (!operand_arg(ctx, args, n, 0, op, "self", false, &self) ||
      !operand_arg(ctx, args, n, 1, op, "other", other_scalar, &other) ||
      !out_arg(ctx, args, n, 2, op, &out))
    return;
  const Operand promo[2] = {self.promo(), other.promo()};
  const int32_t ct = result_type(ctx, op, promo, 2);
  if (ct < 0) return;
  dispatch_compute(ct, [&](auto tag) {
    using CT = decltype(tag);
    CT sa{}, sb{};
    const View a = loop_view<CT>(self, &sa), b = loop_view<CT>(other, &sb);
    const View* inputs[2] = {&a, &b};
    Loop L;
    if (broadcast_loop(ctx, op, out, inputs, 2, &L)) run_compare<CT>(L, kind);
  });
}

#define OPFORGE_COMPARE(name, kind)                                                    \
  void name##_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {         \
    compare(ctx, args, n, "aten::" #name ".Tensor_out", kind, false);                  \
  }                                                                                    \
  void name##_scalar_out(opforge_context* ctx, opforge_arg* args, int64_t n) {         \
    compare(ctx, args, n, "aten::" #name ".Scalar_out", kind, true);                   \
  }

OPFORGE_COMPARE(eq, Cmp::kEq)
OPFORGE_COMPARE(ne, Cmp::kNe)
OPFORGE_COMPARE(lt, Cmp::kLt)
OPFORGE_COMPARE(le, Cmp::kLe)
OPFORGE_COMPARE(gt, Cmp::kGt)
OPFORGE_COMPARE(ge, Cmp::kGe)

#undef OPFORGE_COMPARE

// out = condition ? x : y, with x and y cast into out's dtype (either may be a Scalar).
void select(opforge_context* ctx, const char* op, const View& condition, const Arg& x,
            const Arg& y, const View& out) {
  dispatch_compute(out.dtype, [&](auto tag) {
    using CT = decltype(tag);
    CT sx{}, sy{};
    const View xv = loop_view<CT>(x, &sx), yv = loop_view<CT>(y, &sy);
    // A bool condition is read as its bytes (uint8: the compiler vectorizes byte loads, not
    // bool ones); any other dtype by its truth value, converted to bool.
    View cond = condition;
    const bool bytes = cond.dtype == kBool || cond.dtype == kUInt8;
    if (bytes) cond.dtype = kUInt8;
    const View* inputs[3] = {&cond, &xv, &yv};
    Loop L;
    if (!broadcast_loop(ctx, op, out, inputs, 3, &L)) return;
    if (bytes) {
      auto pick = [](uint8_t c, CT a, CT b) { return c != 0 ? a : b; };
      run_ternary<CT, CT, decltype(pick), uint8_t>(L, pick);
    } else {
      auto pick = [](bool c, CT a, CT b) { return c ? a : b; };
      run_ternary<CT, CT, decltype(pick), bool>(L, pick);
    }
  });
}

void where_self_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::where.self_out";
  View condition, out;
  Arg self, other;
  if (n != 4) {
    fail(ctx, "%s: found %lld arguments — valid: 4 (condition, self, other, out)", op, (long long)n);
    return;
  }
  if (!input_arg(ctx, args, n, 0, op, "condition", &condition) ||
      !operand_arg(ctx, args, n, 1, op, "self", false, &self) ||
      !operand_arg(ctx, args, n, 2, op, "other", false, &other) || !out_arg(ctx, args, n, 3, op, &out))
    return;
  select(ctx, op, condition, self, other, out);
}

void masked_fill(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, bool scalar) {
  View mask, out;
  Arg self, value;
  if (n != 4) {
    fail(ctx, "%s: found %lld arguments — valid: 4 (self, mask, value, out)", op, (long long)n);
    return;
  }
  if (!operand_arg(ctx, args, n, 0, op, "self", false, &self) || !input_arg(ctx, args, n, 1, op, "mask", &mask) ||
      !operand_arg(ctx, args, n, 2, op, "value", scalar, &value) || !out_arg(ctx, args, n, 3, op, &out))
    return;
  select(ctx, op, mask, value, self, out);
}

void masked_fill_scalar_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  masked_fill(ctx, args, n, "aten::masked_fill.Scalar_out", true);
}
void masked_fill_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  masked_fill(ctx, args, n, "aten::masked_fill.Tensor_out", false);
}

const KernelDef kComparisonKernels[] = {
    {"aten::eq.Tensor_out", "T T T!", eq_tensor_out},
    {"aten::eq.Scalar_out", "T S T!", eq_scalar_out},
    {"aten::ne.Tensor_out", "T T T!", ne_tensor_out},
    {"aten::ne.Scalar_out", "T S T!", ne_scalar_out},
    {"aten::lt.Tensor_out", "T T T!", lt_tensor_out},
    {"aten::lt.Scalar_out", "T S T!", lt_scalar_out},
    {"aten::le.Tensor_out", "T T T!", le_tensor_out},
    {"aten::le.Scalar_out", "T S T!", le_scalar_out},
    {"aten::gt.Tensor_out", "T T T!", gt_tensor_out},
    {"aten::gt.Scalar_out", "T S T!", gt_scalar_out},
    {"aten::ge.Tensor_out", "T T T!", ge_tensor_out},
    {"aten::ge.Scalar_out", "T S T!", ge_scalar_out},
    {"aten::where.self_out", "T T T T!", where_self_out},
    {"aten::masked_fill.Scalar_out", "T T S T!", masked_fill_scalar_out},
    {"aten::masked_fill.Tensor_out", "T T T T!", masked_fill_tensor_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(comparison, kComparisonKernels)
