// Promotion, scalar arguments and the broadcasting loop's set-up (elementwise.h).
#include "elementwise.h"

#include <cstdlib>

namespace opforge::portable {

bool scalar_value(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                  const char* op, const char* what, Scalar* out) {
  double d;
  int64_t iv;
  bool integral;
  if (!scalar_arg(ctx, args, n, i, op, what, &d, &iv, &integral)) return false;
  out->d = d;
  out->i = iv;
  out->kind = !integral ? Scalar::kFloating
              : args[i].tag == OPFORGE_ARG_BOOL ? Scalar::kBoolean : Scalar::kInteger;
  return true;
}

namespace {

int category(int32_t d) { return d == kBool ? 0 : is_floating(d) ? 2 : 1; }
bool is_unsigned(int32_t d) { return d == kUInt8 || d == kUInt16 || d == kUInt32 || d == kUInt64; }
int bits(int32_t d) { return static_cast<int>(itemsize(d)) * 8; }
int32_t signed_of_bits(int b) {
  return b == 8 ? kInt8 : b == 16 ? kInt16 : b == 32 ? kInt32 : b == 64 ? kInt64 : -1;
}

// The lower tier changes the result only when it is of a higher category (result_type).
int32_t combine(int32_t higher, int32_t lower) {
  if (higher < 0) return lower;
  if (lower < 0) return higher;
  if (is_floating(higher)) return higher;
  if (higher == kBool || category(lower) > category(higher)) return promote_types(higher, lower);
  return higher;
}

}  // namespace

int32_t promote_types(int32_t a, int32_t b) {
  if (a < 0) return b;
  if (b < 0) return a;
  if (!loop_dtype(a) || !loop_dtype(b)) return -1;
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) return bits(a) >= bits(b) ? a : b;  // float16 < float32 < float64
  bool ua = is_unsigned(a), ub = is_unsigned(b);
  if (ua == ub) return bits(a) >= bits(b) ? a : b;
  int32_t u = ua ? a : b, s = ua ? b : a;
  if (bits(s) > bits(u)) return s;
  return signed_of_bits(2 * bits(u));  // uint8 + int8 -> int16; uint64 + signed: none
}

int32_t result_type(opforge_context* ctx, const char* op, const Operand* ops, int n) {
  int32_t tier[3] = {-1, -1, -1};
  for (int k = 0; k < n; ++k) {
    int32_t p = promote_types(tier[ops[k].tier], ops[k].dtype);
    if (p < 0) {
      fail(ctx, "%s: the operands' dtypes do not promote — found %s with %s — valid: bool, "
           "integer and float16/32/64 dtypes ATen promotes (no uint64 with a signed type) — "
           "fix: cast one operand", op, tier[ops[k].tier] >= 0 ? dtype_name(tier[ops[k].tier]) : "",
           dtype_name(ops[k].dtype));
      return -1;
    }
    tier[ops[k].tier] = p;
  }
  int32_t r = combine(tier[kDimTensor], combine(tier[kZeroDim], tier[kWrapped]));
  if (r < 0) fail(ctx, "%s: no operands to promote", op);
  return r;
}

bool make_loop(opforge_context* ctx, const char* op, const View& out, const View* const* inputs,
               int ninputs, Loop* L) {
  L->ctx = ctx;
  if (ninputs + 1 > kMaxOperands) {
    fail(ctx, "%s: %d inputs — valid: at most %d (an internal limit of the loop)", op, ninputs,
         kMaxOperands - 1);
    return false;
  }
  const int R = out.rank;
  const View* ops[kMaxOperands] = {&out};
  for (int k = 0; k < ninputs; ++k) ops[k + 1] = inputs[k];
  const int nops = ninputs + 1;
  int64_t st[kMaxOperands][kMaxRank];
  for (int k = 0; k < nops; ++k) {
    const View& v = *ops[k];
    if (v.rank > R) {
      fail(ctx, "%s: input %d has rank %d — valid: at most the out's rank %d (it must broadcast "
           "to the out's shape)", op, k - 1, v.rank, R);
      return false;
    }
    const int64_t item = itemsize(v.dtype);
    int64_t span = 0;
    for (int d = 0; d < R; ++d) {
      const int id = d - (R - v.rank);
      const int64_t size = out.sizes[d];
      int64_t s = 0;
      if (id >= 0 && v.sizes[id] == size && size != 1) {
        if (!mul_ok(v.strides[id], item, &s)) s = INT64_MAX;
        int64_t reach;
        if (s == INT64_MAX || !mul_ok(s < 0 ? -s : s, size - 1, &reach) || !add_ok(span, reach, &span)) {
          fail(ctx, "%s: operand %d — its byte offsets overflow int64 (stride %lld in dim %d)", op,
               k, (long long)v.strides[id], id);
          return false;
        }
      } else if (id >= 0 && v.sizes[id] != 1 && v.sizes[id] != size) {
        fail(ctx, "%s: input %d does not broadcast to the out — found size %lld in its dim %d "
             "against %lld — valid: equal sizes or 1", op, k - 1, (long long)v.sizes[id], id,
             (long long)size);
        return false;
      }
      st[k][d] = s;
    }
    L->data[k] = v.data;
    L->dtype[k] = v.dtype;
  }
  L->nops = nops;
  L->numel = out.numel;
  // drop size-1 dims; merge a dim into the one outside it where every operand allows it
  int m = 0;
  for (int d = 0; d < R; ++d) {
    const int64_t size = out.sizes[d];
    if (size == 1) continue;
    bool merge = m > 0;
    for (int k = 0; merge && k < nops; ++k) {
      int64_t outer;
      merge = mul_ok(st[k][d], size, &outer) && L->strides[k][m - 1] == outer;
    }
    if (merge) {
      L->sizes[m - 1] *= size;  // <= numel: fits
      for (int k = 0; k < nops; ++k) L->strides[k][m - 1] = st[k][d];
    } else {
      L->sizes[m] = size;
      for (int k = 0; k < nops; ++k) L->strides[k][m] = st[k][d];
      ++m;
    }
  }
  L->rank = m;
  return true;
}

bool out_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i, const char* op,
             View* out) {
  if (!tensor_arg(ctx, args, n, i, op, "out", out)) return false;
  if (!loop_dtype(out->dtype)) {
    fail(ctx, "%s: out has dtype %s — valid: bool, an integer dtype, float16, float32 or "
         "float64 — fix: give the op an out of one of these", op, dtype_name(out->dtype));
    return false;
  }
  return true;
}

bool input_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i, const char* op,
               const char* what, View* v) {
  if (!tensor_arg(ctx, args, n, i, op, what, v)) return false;
  if (!loop_dtype(v->dtype)) {
    fail(ctx, "%s: %s has dtype %s — valid: bool, an integer dtype, float16, float32 or float64 "
         "— fix: cast it first (bfloat16 and complex inputs have no portable kernel)", op, what,
         dtype_name(v->dtype));
    return false;
  }
  return true;
}

bool broadcast_loop(opforge_context* ctx, const char* op, const View& out, const View* const* inputs,
                    int ninputs, Loop* loop) {
  int64_t shape[kMaxRank];
  int rank = 0;
  if (ninputs > 0) {
    View acc = *inputs[0];
    int64_t tmp[kMaxRank];
    for (int k = 1; k < ninputs; ++k) {
      if (!broadcast_shape(ctx, op, acc, *inputs[k], tmp, &rank)) return false;
      std::memcpy(shape, tmp, sizeof(int64_t) * rank);
      acc.rank = rank;
      acc.sizes = shape;
    }
    if (ninputs == 1) {
      rank = acc.rank;
      for (int d = 0; d < rank; ++d) shape[d] = acc.sizes[d];
    }
  }
  if (!check_shape(ctx, op, out, shape, rank)) return false;
  return make_loop(ctx, op, out, inputs, ninputs, loop);
}

}  // namespace opforge::portable

namespace opforge::portable {

bool operand_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                 const char* op, const char* what, bool scalar, Arg* a) {
  // A number where the schema has a Tensor is ATen's wrapped number (torch.export leaves
  // `x * 0.5` as aten::mul.Tensor with a Python float): it promotes as a Scalar does.
  const bool number = i >= 0 && i < n && (args[i].tag == OPFORGE_ARG_INT ||
                                          args[i].tag == OPFORGE_ARG_DOUBLE ||
                                          args[i].tag == OPFORGE_ARG_BOOL);
  a->is_scalar = scalar || number;
  if (a->is_scalar) return scalar_value(ctx, args, n, i, op, what, &a->scalar);
  return input_arg(ctx, args, n, i, op, what, &a->view);
}

bool string_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, const char** data, int64_t* size, bool* none) {
  *none = false;
  if (i < 0 || i >= n) {
    fail(ctx, "%s: argument %lld (%s) is missing — found %lld arguments", op, (long long)i, what,
         (long long)n);
    return false;
  }
  if (args[i].tag == OPFORGE_ARG_NONE) {
    *none = true;
    return true;
  }
  if (args[i].tag != OPFORGE_ARG_STRING || args[i].v.list.size < 0 ||
      (args[i].v.list.size > 0 && !args[i].v.list.data)) {
    fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: a string", op, what, (long long)i,
         args[i].tag);
    return false;
  }
  *data = static_cast<const char*>(args[i].v.list.data);
  *size = args[i].v.list.size;
  return true;
}

}  // namespace opforge::portable
