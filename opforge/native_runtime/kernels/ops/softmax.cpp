// Softmax and log-softmax along one dim (the NumPy kernels of
// opforge/kernels/portable/normalization.py): the row's maximum subtracted first (a row
// that is all -inf gives NaN, -inf - -inf, as in ATen; a NaN anywhere in a row makes the
// row NaN), exp, the sum, then a division (softmax) or the log of the sum subtracted
// (log-softmax), each a separate rounding as in the NumPy kernel.
//
// exp of float32 is our own (Cody-Waite range reduction and a degree-6 polynomial, within
// 2 ulp, exact 0 below the underflow bound and inf above the overflow one) so that the
// loop over a row vectorises; libm's expf is a call per element. float64 uses std::exp.
// Rows along the last, contiguous dim run straight; other dims are read through strides.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gemm.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

inline float exp_f32(float x) {
  const float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  float xc = x < -104.0f ? -104.0f : (x > 88.72283935546875f ? 88.72283935546875f : x);
  float t = xc * kLog2e + 0.5f;
  int32_t ni = static_cast<int32_t>(t);  // floor(t), without a libm call (vectorises)
  ni -= t < static_cast<float>(ni) ? 1 : 0;
  float n = static_cast<float>(ni);
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r;
  p = p + 1.0f;
  // 2^n in two halves so that n = 128 (x near the overflow bound) does not overflow the
  // exponent field before the multiply
  int32_t h = ni >> 1;
  int32_t bits1 = (h + 127) << 23, bits2 = (ni - h + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &bits1, 4);
  std::memcpy(&s2, &bits2, 4);
  float y = p * s1 * s2;
  y = x < -104.0f ? 0.0f : y;
  y = x > 88.72283935546875f ? INFINITY : y;
  return x != x ? x : y;
}

inline double exp_t(double x) { return std::exp(x); }
inline float exp_t(float x) { return exp_f32(x); }

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
  T m = row_max<T>(x, n, sx);
  if (sx == 1 && sy == 1) {
    // y holds exp(x - m) (softmax) or x - m (log-softmax) with buf exp(x - m)
    T* e = log ? buf : y;
    for (int64_t i = 0; i < n; ++i) {
      T z = x[i] - m;
      if (log) y[i] = z;
      e[i] = exp_t(z);
    }
    T lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += e[i + l];
    T sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < n; ++i) sum += e[i];
    if (log) {
      T ls = std::log(sum);
      for (int64_t j = 0; j < n; ++j) y[j] = y[j] - ls;
    } else {
      for (int64_t j = 0; j < n; ++j) y[j] = y[j] / sum;
    }
    return;
  }
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
    fail(ctx, "%s: self %s, out %s — valid: float32 or float64, one dtype (float16 is not in the "
         "C++ kernels yet) — use the lean runtime's kernel", op, dtype_name(x.dtype),
         dtype_name(y.dtype));
    return;
  }
  if (x.numel == 0) return;
  int64_t n = x.rank ? x.sizes[dim] : 1;
  void* buf = scratch(0, n * itemsize(x.dtype));
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
    {"aten::_softmax.out", "T I B T!", softmax_out},
    {"aten::_log_softmax.out", "T I B T!", log_softmax_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(softmax, kSoftmaxKernels)
