// Argument access and shape helpers shared by the kernel families (tensor.h).
#include "tensor.h"

namespace opforge::portable {

const char* dtype_name(int32_t d) {
  switch (d) {
    case kUInt8: return "uint8";
    case kInt8: return "int8";
    case kInt16: return "int16";
    case kInt32: return "int32";
    case kInt64: return "int64";
    case kFloat16: return "float16";
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kBool: return "bool";
    case kBFloat16: return "bfloat16";
    case kUInt16: return "uint16";
    case kUInt32: return "uint32";
    case kUInt64: return "uint64";
    default: return "an unsupported dtype";
  }
}

bool is_none(const opforge_arg* args, int64_t n, int64_t i) {
  return i < n && args[i].tag == OPFORGE_ARG_NONE;
}

static bool arg_exists(opforge_context* ctx, int64_t n, int64_t i, const char* op, const char* what) {
  if (i < 0 || i >= n) {
    fail(ctx, "%s: argument %lld (%s) is missing — found %lld arguments", op, (long long)i, what,
         (long long)n);
    return false;
  }
  return true;
}

bool tensor_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, View* v) {
  if (!arg_exists(ctx, n, i, op, what)) return false;
  if (args[i].tag != OPFORGE_ARG_TENSOR) {
    fail(ctx, "%s: %s (argument %lld) — found a non-tensor argument (tag %d) — valid: a tensor",
         op, what, (long long)i, args[i].tag);
    return false;
  }
  const opforge_tensor& t = args[i].v.tensor;
  if (t.rank < 0 || t.rank > kMaxRank || (t.rank > 0 && (!t.sizes || !t.strides))) {
    fail(ctx, "%s: %s — found rank %d — valid: 0..%d with sizes and strides", op, what, t.rank, kMaxRank);
    return false;
  }
  int64_t item = itemsize(t.dtype);
  if (item == 0) {
    fail(ctx, "%s: %s — found dtype %d — valid: a c10::ScalarType number", op, what, t.dtype);
    return false;
  }
  int64_t numel = 1, expect = 1;
  bool dense = true;
  for (int d = t.rank - 1; d >= 0; --d) {
    if (t.sizes[d] < 0) {
      fail(ctx, "%s: %s — found size %lld in dim %d — valid: sizes >= 0", op, what,
           (long long)t.sizes[d], d);
      return false;
    }
    if (!mul_ok(numel, t.sizes[d], &numel)) {
      fail(ctx, "%s: %s — its element count overflows int64", op, what);
      return false;
    }
    if (t.sizes[d] != 1 && t.strides[d] != expect) dense = false;
    if (!mul_ok(expect, t.sizes[d], &expect)) expect = INT64_MAX;
  }
  int64_t bytes;
  if (!mul_ok(numel, item, &bytes)) {
    fail(ctx, "%s: %s — its byte size overflows int64", op, what);
    return false;
  }
  if (numel > 0 && !t.data) {
    fail(ctx, "%s: %s — found no data for %lld elements", op, what, (long long)numel);
    return false;
  }
  v->t = &t;
  v->data = static_cast<char*>(t.data);
  v->dtype = t.dtype;
  v->rank = t.rank;
  v->sizes = t.sizes;
  v->strides = t.strides;
  v->numel = numel;
  v->dense = dense;
  return true;
}

bool optional_tensor_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                         const char* op, const char* what, View* v, bool* present) {
  *present = false;
  if (i < n && args[i].tag == OPFORGE_ARG_NONE) return true;
  *present = true;
  return tensor_arg(ctx, args, n, i, op, what, v);
}

bool scalar_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, double* d, int64_t* iv, bool* integral) {
  if (!arg_exists(ctx, n, i, op, what)) return false;
  switch (args[i].tag) {
    case OPFORGE_ARG_INT:
    case OPFORGE_ARG_BOOL:
      *iv = args[i].v.i;
      *d = static_cast<double>(args[i].v.i);
      *integral = true;
      return true;
    case OPFORGE_ARG_DOUBLE:
      *d = args[i].v.d;
      *iv = 0;
      *integral = false;
      return true;
    default:
      fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: an int, float or bool scalar", op,
           what, (long long)i, args[i].tag);
      return false;
  }
}

bool int_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
             const char* op, const char* what, int64_t* out) {
  if (!arg_exists(ctx, n, i, op, what)) return false;
  if (args[i].tag != OPFORGE_ARG_INT && args[i].tag != OPFORGE_ARG_BOOL) {
    fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: an int", op, what, (long long)i, args[i].tag);
    return false;
  }
  *out = args[i].v.i;
  return true;
}

bool double_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, double* out) {
  if (!arg_exists(ctx, n, i, op, what)) return false;
  if (args[i].tag == OPFORGE_ARG_DOUBLE) { *out = args[i].v.d; return true; }
  if (args[i].tag == OPFORGE_ARG_INT) { *out = static_cast<double>(args[i].v.i); return true; }
  fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: a float", op, what, (long long)i, args[i].tag);
  return false;
}

bool bool_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
              const char* op, const char* what, bool* out) {
  if (!arg_exists(ctx, n, i, op, what)) return false;
  if (args[i].tag != OPFORGE_ARG_BOOL && args[i].tag != OPFORGE_ARG_INT) {
    fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: a bool", op, what, (long long)i, args[i].tag);
    return false;
  }
  *out = args[i].v.i != 0;
  return true;
}

bool int_list_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                  const char* op, const char* what, const int64_t** data, int64_t* count) {
  if (!arg_exists(ctx, n, i, op, what)) return false;
  if (args[i].tag == OPFORGE_ARG_NONE) { *data = nullptr; *count = -1; return true; }
  if (args[i].tag != OPFORGE_ARG_INT_LIST || args[i].v.list.size < 0 ||
      (args[i].v.list.size > 0 && !args[i].v.list.data)) {
    fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: an int list", op, what, (long long)i,
         args[i].tag);
    return false;
  }
  *data = static_cast<const int64_t*>(args[i].v.list.data);
  *count = args[i].v.list.size;
  return true;
}

bool broadcast_shape(opforge_context* ctx, const char* op, const View& a, const View& b,
                     int64_t* out, int* out_rank) {
  int rank = a.rank > b.rank ? a.rank : b.rank;
  for (int k = 0; k < rank; ++k) {
    int ia = a.rank - rank + k, ib = b.rank - rank + k;
    int64_t sa = ia >= 0 ? a.sizes[ia] : 1, sb = ib >= 0 ? b.sizes[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      fail(ctx, "%s: the operands do not broadcast — found size %lld against %lld in dim %d of the "
           "result — valid: equal sizes or 1", op, (long long)sa, (long long)sb, k);
      return false;
    }
    out[k] = sa == 1 ? sb : sa;
  }
  *out_rank = rank;
  return true;
}

bool check_shape(opforge_context* ctx, const char* op, const View& out, const int64_t* sizes, int rank) {
  bool same = out.rank == rank;
  for (int d = 0; same && d < rank; ++d) same = out.sizes[d] == sizes[d];
  if (same) return true;
  char found[256], want[256];
  int f = 0, w = 0;
  f += std::snprintf(found + f, sizeof found - f, "[");
  for (int d = 0; d < out.rank && f < 200; ++d)
    f += std::snprintf(found + f, sizeof found - f, d ? ", %lld" : "%lld", (long long)out.sizes[d]);
  std::snprintf(found + f, sizeof found - f, "]");
  w += std::snprintf(want + w, sizeof want - w, "[");
  for (int d = 0; d < rank && w < 200; ++d)
    w += std::snprintf(want + w, sizeof want - w, d ? ", %lld" : "%lld", (long long)sizes[d]);
  std::snprintf(want + w, sizeof want - w, "]");
  fail(ctx, "%s: out has shape %s — valid: %s, the result's shape", op, found, want);
  return false;
}

bool wrap_dim(opforge_context* ctx, const char* op, int64_t dim, int rank, int64_t* out) {
  int64_t r = rank == 0 ? 1 : rank;
  if (dim < -r || dim >= r) {
    fail(ctx, "%s: dim %lld is out of range — valid: [%lld, %lld]", op, (long long)dim,
         (long long)-r, (long long)(r - 1));
    return false;
  }
  *out = dim < 0 ? dim + r : dim;
  return true;
}

}  // namespace opforge::portable
