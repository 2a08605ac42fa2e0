// Factory ops: full, zeros, ones, empty, arange, scalar_tensor and their *_like forms.
// out arrives with the dtype and shape the exporter decided, so these kernels only check
// it and write values (opforge/kernels/portable/factory.py is the specification).
#include <cmath>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

// NumPy's fill refuses a Python int outside an integer dtype's range.
bool fits(opforge_context* ctx, const char* op, int32_t dtype, int64_t v) {
  int64_t lo = 0, hi = 0;
  switch (dtype) {
    case kInt8: lo = INT8_MIN, hi = INT8_MAX; break;
    case kUInt8: lo = 0, hi = UINT8_MAX; break;
    case kInt16: lo = INT16_MIN, hi = INT16_MAX; break;
    case kUInt16: lo = 0, hi = UINT16_MAX; break;
    case kInt32: lo = INT32_MIN, hi = INT32_MAX; break;
    case kUInt32: lo = 0, hi = UINT32_MAX; break;
    case kUInt64: lo = 0, hi = INT64_MAX; break;
    default: return true;
  }
  if (v >= lo && v <= hi) return true;
  fail(ctx, "%s: fill_value — found %lld — valid: [%lld, %lld] for out's dtype %s — pass a "
       "value the dtype holds", op, (long long)v, (long long)lo, (long long)hi, dtype_name(dtype));
  return false;
}

void fill_with(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp,
               int64_t value_index, int64_t out_index, const int64_t* size, int64_t count,
               const View* like) {
  OPF_TENSOR(out_index, "out", out);
  if (size && !check_shape(ctx, kOp, out, size, static_cast<int>(count))) return;
  if (like && !check_shape(ctx, kOp, out, like->sizes, like->rank)) return;
  double d = 0;
  int64_t i = 0;
  bool integral = true;
  if (value_index >= 0 && !scalar_arg(ctx, args, n, value_index, kOp, "fill_value", &d, &i, &integral))
    return;
  if (value_index < -1) i = -value_index - 2;  // zeros (-2) and ones (-3)
  if (integral && args[value_index >= 0 ? value_index : 0].tag != OPFORGE_ARG_BOOL &&
      !fits(ctx, kOp, out.dtype, i))
    return;
  fill_scalar(ctx, kOp, out, d, i, integral);
}

#define OPF_SIZED_FILL(name, key, value_index, out_index)                          \
  void name(opforge_context* ctx, opforge_arg* args, int64_t n) {                  \
    static const char kOp[] = key;                                                 \
    OPF_INTS(0, "size", size, count);                                              \
    if (count < 0 || count > kMaxRank) {                                           \
      fail(ctx, "%s: size — found %lld entries — valid: 0..%d", kOp, (long long)count, kMaxRank); \
      return;                                                                      \
    }                                                                              \
    fill_with(ctx, args, n, kOp, value_index, out_index, size, count, nullptr);    \
  }
#define OPF_LIKE_FILL(name, key, value_index, out_index)                           \
  void name(opforge_context* ctx, opforge_arg* args, int64_t n) {                  \
    static const char kOp[] = key;                                                 \
    OPF_TENSOR(0, "self", self);                                                   \
    fill_with(ctx, args, n, kOp, value_index, out_index, nullptr, 0, &self);       \
  }

OPF_SIZED_FILL(full_out, "aten::full.out", 1, 2)
OPF_SIZED_FILL(zeros_out, "aten::zeros.out", -2, 1)
OPF_SIZED_FILL(ones_out, "aten::ones.out", -3, 1)
OPF_LIKE_FILL(full_like_out, "aten::full_like.out", 1, 3)
OPF_LIKE_FILL(zeros_like_out, "aten::zeros_like.out", -2, 2)
OPF_LIKE_FILL(ones_like_out, "aten::ones_like.out", -3, 2)

void scalar_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::scalar_tensor.out";
  fill_with(ctx, args, n, kOp, 0, 1, nullptr, 0, nullptr);
}

void empty_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::empty.out";
  OPF_INTS(0, "size", size, count);
  OPF_TENSOR(2, "out", out);
  check_shape(ctx, kOp, out, size, static_cast<int>(count < 0 || count > kMaxRank ? -1 : count));
}

void empty_like_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::empty_like.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(2, "out", out);
  check_shape(ctx, kOp, out, self.sizes, self.rank);
}

struct Number {
  double d;
  int64_t i;
  bool integral;
};

bool number_arg(opforge_context* ctx, opforge_arg* args, int64_t n, int64_t index,
                const char* op, const char* what, Number* v) {
  return scalar_arg(ctx, args, n, index, op, what, &v->d, &v->i, &v->integral);
}

// int(x) of a Scalar: truncation towards zero, as Python's int() and ATen's cast.
int64_t truncated(const Number& v) { return v.integral ? v.i : static_cast<int64_t>(std::trunc(v.d)); }

void arange(opforge_context* ctx, const char* kOp, Number start, Number end, Number step,
            const View& out) {
  int sign_span = end.integral && start.integral ? (end.i > start.i) - (end.i < start.i)
                                                 : (end.d > start.d) - (end.d < start.d);
  int sign_step = step.integral ? (step.i > 0) - (step.i < 0) : (step.d > 0) - (step.d < 0);
  if (sign_step == 0 || sign_span * sign_step < 0 || std::isnan(start.d) || std::isnan(end.d) ||
      std::isnan(step.d)) {
    fail(ctx, "%s: start=%g, end=%g, step=%g — the step is zero or points away from end — "
         "valid: step != 0 with sign(step) == sign(end - start)", kOp, start.d, end.d, step.d);
    return;
  }
  if (std::isinf(start.d) || std::isinf(end.d) ||
      (!start.integral && std::fabs(start.d) > 9.2e18) || (!end.integral && std::fabs(end.d) > 9.2e18)) {
    fail(ctx, "%s: start=%g, end=%g — valid: finite bounds — re-export the program", kOp, start.d, end.d);
    return;
  }
  bool floating = is_floating(out.dtype);
  int64_t start_i = floating ? 0 : truncated(start), step_i = floating ? 0 : truncated(step);
  int64_t count;
  if (out.dtype == kInt64) {
    // ATen counts an int64 range in integers, on truncated bounds
    if (step_i == 0) {
      fail(ctx, "%s: step=%g — truncates to 0 for an int64 range — valid: |step| >= 1 for "
           "integer outputs — pass an integer step", kOp, step.d);
      return;
    }
    __int128 span = static_cast<__int128>(truncated(end)) - start_i + step_i - ((step_i > 0) - (step_i < 0));
    __int128 a = span < 0 ? -span : span, b = step_i < 0 ? -static_cast<__int128>(step_i) : step_i;
    __int128 c = a / b * (((span >= 0) == (step_i > 0)) ? 1 : -1);
    count = c > INT64_MAX ? INT64_MAX : static_cast<int64_t>(c);
  } else {
    double span = end.integral && start.integral ? static_cast<double>(static_cast<__int128>(end.i) - start.i)
                                                 : end.d - start.d;
    double c = std::ceil(span / step.d);
    count = c > 9.2e18 ? INT64_MAX : static_cast<int64_t>(c);
  }
  if (count < 0) count = 0;
  if (count != out.numel) {
    fail(ctx, "%s: out — has %lld elements, the range has %lld — out must be planned with the "
         "range's length — re-export the program", kOp, (long long)out.numel, (long long)count);
    return;
  }
  if (out.rank > 1) {
    fail(ctx, "%s: out — found rank %d — valid: a 1-d out — re-export the program", kOp, out.rank);
    return;
  }
  int64_t stride = out.rank ? out.strides[0] : 0, item = itemsize(out.dtype);
  for (int64_t k = 0; k < count; ++k) {
    char* p = out.data + k * stride * item;
    if (floating) {
      store_double(p, out.dtype, static_cast<double>(k) * step.d + start.d);
    } else {
      uint64_t v = static_cast<uint64_t>(k) * static_cast<uint64_t>(step_i) + static_cast<uint64_t>(start_i);
      store_scalar(p, out.dtype, 0, static_cast<int64_t>(v), true);
    }
  }
}

void arange_start_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::arange.start_out";
  Number start, end, step;
  if (!number_arg(ctx, args, n, 0, kOp, "start", &start) || !number_arg(ctx, args, n, 1, kOp, "end", &end) ||
      !number_arg(ctx, args, n, 2, kOp, "step", &step))
    return;
  OPF_TENSOR(3, "out", out);
  arange(ctx, kOp, start, end, step, out);
}

void arange_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::arange.out";
  Number end;
  if (!number_arg(ctx, args, n, 0, kOp, "end", &end)) return;
  OPF_TENSOR(1, "out", out);
  arange(ctx, kOp, Number{0, 0, true}, end, Number{1, 1, true}, out);
}

const KernelDef kFactoryKernels[] = {
    {"aten::full.out", "IL S T!", full_out},
    {"aten::full_like.out", "T S I? T!", full_like_out},
    {"aten::scalar_tensor.out", "S T!", scalar_tensor_out},
    {"aten::zeros.out", "IL T!", zeros_out},
    {"aten::ones.out", "IL T!", ones_out},
    {"aten::zeros_like.out", "T I? T!", zeros_like_out},
    {"aten::ones_like.out", "T I? T!", ones_like_out},
    {"aten::empty.out", "IL I? T!", empty_out},
    {"aten::empty_like.out", "T I? T!", empty_like_out},
    {"aten::arange.start_out", "S S S T!", arange_start_out},
    {"aten::arange.out", "S T!", arange_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(factory, kFactoryKernels)
