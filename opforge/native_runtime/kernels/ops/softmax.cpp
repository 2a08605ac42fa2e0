// Softmax and log-softmax along one dim (the NumPy kernels of
// opforge/kernels/portable/normalization.py): the row's maximum subtracted first (a row
// that is all -inf gives NaN, -inf - -inf, as in ATen; a NaN anywhere in a row makes the
// row NaN), exp, the sum, then a division (softmax) or the log of the sum subtracted
// (log-softmax), each a separate rounding as in the NumPy kernel.
//
// float32 rows along a contiguous dim run in the vector loops of vector_math.h (our own exp,
// within 1 ulp; libm's expf is a call per element); float64 uses std::exp, and rows along
// other dims are read through their strides with the same exp one element at a time.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gemm.h"
#include "half_compute.h"
#include "tensor.h"
#include "vector_math.h"

namespace opforge::portable {
namespace {

inline double exp_t(double x) { return std::exp(x); }
inline float exp_t(float x) { return vec::exp(x); }

template <typename T>
T row_max(const T* x, int64_t n, int64_t s) {
  T m = x[0];
  for (int64_t i = 1; i < n; ++i) {
    T v = x[i * s];
    m = (v > m || v != v) ? v : m;
    if (m != m) return m;  // NaN: the row is NaN
  }
  return m;
}

// Softmax (log == false) or log-softmax of one row of n elements (strides sx, sy).
template <typename T>
void row(const T* x, int64_t sx, T* y, int64_t sy, int64_t n, bool log, T* buf) {
  if constexpr (std::is_same<T, float>::value) {
    if (sx == 1 && sy == 1) {  // the vector loops (vector_math.h)
      float m = vec::max(x, n);
      if (log) {
        float ls = std::log(vec::exp_shifted(x, m, buf, n));
        for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
      } else {
        float sum = vec::exp_shifted(x, m, y, n);
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] / sum;
      }
      return;
    }
  }
  T m = row_max<T>(x, n, sx);
  T sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    T e = exp_t(x[i * sx] - m);
    buf[i] = e;
    sum += e;
  }
  if (log) {
    T ls = std::log(sum);
    for (int64_t i = 0; i < n; ++i) y[i * sy] = (x[i * sx] - m) - ls;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i * sy] = buf[i] / sum;
  }
}

template <typename T>
void softmax(const View& x, const View& y, int64_t dim, bool log, T* buf) {
  if (x.rank == 0) {
    row<T>(x.ptr<T>(), 1, y.ptr<T>(), 1, 1, log, buf);
    return;
  }
  int64_t n = x.sizes[dim];
  // every index of the other dims, x's and y's offsets together
  int64_t idx[kMaxRank] = {0};
  int64_t total = x.numel / (n ? n : 1);
  int64_t ox = 0, oy = 0;
  for (int64_t t = 0; t < total; ++t) {
    row<T>(x.ptr<T>() + ox, x.strides[dim], y.ptr<T>() + oy, y.strides[dim], n, log, buf);
    for (int d = x.rank - 1; d >= 0; --d) {
      if (d == dim) continue;
      ox += x.strides[d];
      oy += y.strides[d];
      if (++idx[d] < x.sizes[d]) break;
      ox -= x.strides[d] * x.sizes[d];
      oy -= y.strides[d] * y.sizes[d];
      idx[d] = 0;
    }
  }
}

void softmax_like(opforge_context* ctx, opforge_arg* args, int64_t nargs, const char* op, bool log) {
  View x, y;
  int64_t dim;
  bool half_to_float;
  if (!tensor_arg(ctx, args, nargs, 0, op, "self", &x) ||
      !int_arg(ctx, args, nargs, 1, op, "dim", &dim) ||
      !bool_arg(ctx, args, nargs, 2, op, "half_to_float", &half_to_float) ||
      !tensor_arg(ctx, args, nargs, 3, op, "out", &y))
    return;
  if (!wrap_dim(ctx, op, dim, x.rank, &dim) || !check_shape(ctx, op, y, x.sizes, x.rank)) return;
  if (x.dtype != y.dtype || (x.dtype != kFloat32 && x.dtype != kFloat64)) {
    fail(ctx, "%s: self %s, out %s — valid: float16, float32 or float64, one dtype (a float16 "
         "self with a float32 out is not in the C++ kernels yet) — use the lean runtime's kernel", op, dtype_name(x.dtype),
         dtype_name(y.dtype));
    return;
  }
  if (x.numel == 0) return;
  int64_t n = x.rank ? x.sizes[dim] : 1;
  void* buf = scratch(ctx, 0, n * itemsize(x.dtype));
  if (!buf) {
    fail(ctx, "%s: a row buffer — could not be allocated", op);
    return;
  }
  if (x.dtype == kFloat32) softmax<float>(x, y, dim, log, static_cast<float*>(buf));
  else softmax<double>(x, y, dim, log, static_cast<double*>(buf));
}

void softmax_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  softmax_like(ctx, args, n, "aten::_softmax.out", false);
}

void log_softmax_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  softmax_like(ctx, args, n, "aten::_log_softmax.out", true);
}

const KernelDef kSoftmaxKernels[] = {
    {"aten::_softmax.out", "T I B T!", with_half<softmax_out, 1>},
    {"aten::_log_softmax.out", "T I B T!", with_half<log_softmax_out, 1>},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(softmax, kSoftmaxKernels)
