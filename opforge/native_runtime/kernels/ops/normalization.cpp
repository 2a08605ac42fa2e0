// The normalisations: layer norm, inference batch norm, batch norm with batch statistics
// (what instance norm exports to), group norm (the NumPy kernels of
// opforge/kernels/portable/normalization.py). float32 and float64; statistics in the
// input's dtype, the variance biased (population), as in ATen. The arithmetic is the NumPy
// kernel's, step by step (centred values, their mean square, 1 / sqrt(var + eps), then
// weight and bias), with floating-point contraction off (CMakeLists.txt) so that no step is fused
// into an FMA the NumPy kernel does not do. float32 layer and group norms sum their rows in the vector loops
// of vector_math.h (16 partial sums, about as exact as NumPy's pairwise sum); the other
// sums run in double. Results agree with the NumPy kernel to rounding.
//
// Tensors of any strides: a normalised block that is not contiguous is gathered into a
// per-thread scratch row first.

#include <cmath>
#include <initializer_list>
#include <cstring>
#include <type_traits>

#include "gemm.h"
#include "half_compute.h"
#include "tensor.h"
#include "vector_math.h"

namespace opforge::portable {
namespace {

template <typename T> using Acc = double;  // the sums' type (float32 sums too)

// Visit every element offset of a strided block (sizes/strides over `rank` dims) in
// row-major order.
template <typename F>
void for_each_offset(int rank, const int64_t* sizes, const int64_t* strides, F&& f) {
  int64_t total = 1;
  for (int d = 0; d < rank; ++d) total *= sizes[d];
  if (total == 0) return;
  int64_t idx[kMaxRank] = {0};
  int64_t off = 0;
  for (int64_t t = 0; t < total; ++t) {
    f(off);
    for (int d = rank - 1; d >= 0; --d) {
      off += strides[d];
      if (++idx[d] < sizes[d]) break;
      off -= strides[d] * sizes[d];
      idx[d] = 0;
    }
  }
}

bool float_dtypes(opforge_context* ctx, const char* op, const View& x, const View* others,
                  int count) {
  bool ok = x.dtype == kFloat32 || x.dtype == kFloat64;
  for (int i = 0; ok && i < count; ++i) ok = others[i].dtype == x.dtype;
  if (ok) return true;
  fail(ctx, "%s: input of dtype %s (with weight, bias, statistics and outs) — valid: float32 or "
       "float64, one dtype for all (float16 too, when every floating tensor is float16; bfloat16 "
       "is not in the C++ kernels yet) — use the "
       "lean runtime's kernel or convert the input", op, dtype_name(x.dtype));
  return false;
}

bool vector_of(opforge_context* ctx, const char* op, const char* what, const View& v, int64_t n) {
  if (v.numel == n && v.rank <= 1) return true;
  fail(ctx, "%s: %s of %lld elements (rank %d) — valid: a vector of %lld — check the model's "
       "parameters", op, what, (long long)v.numel, v.rank, (long long)n);
  return false;
}

// The element at flat row-major index i of a (possibly strided) 1-d or 0-d view.
template <typename T>
inline T at1(const View& v, int64_t i) {
  return v.rank == 0 ? v.ptr<T>()[0] : v.ptr<T>()[i * v.strides[0]];
}

// --- layer norm ----------------------------------------------------------------------------

template <typename T>
void layer_norm(const View& x, int k, const View* w, const View* b, double eps, const View& y,
                const View& mean_out, const View& rstd_out, T* row, T* yrow) {
  int lead = x.rank - k;
  int64_t rows = 1, n = 1;
  for (int d = 0; d < lead; ++d) rows *= x.sizes[d];
  for (int d = lead; d < x.rank; ++d) n *= x.sizes[d];
  // weight/bias over the normalised dims: dense copies once per call would allocate, so
  // they are read through their strides (contiguous in practice)
  bool xin = true, yin = true;
  {
    int64_t e = 1;
    for (int d = x.rank - 1; d >= lead; --d) {
      if (x.sizes[d] != 1 && x.strides[d] != e) xin = false;
      if (y.sizes[d] != 1 && y.strides[d] != e) yin = false;
      e *= x.sizes[d];
    }
  }
  auto vec_at = [&](const View& v, int64_t i) -> T {  // flat index i over the normalised dims
    if (v.dense) return v.ptr<T>()[i];
    int64_t off = 0, rem = i;
    for (int d = v.rank - 1; d >= 0; --d) {
      off += (rem % v.sizes[d]) * v.strides[d];
      rem /= v.sizes[d];
    }
    return v.ptr<T>()[off];
  };
  T* mean_p = mean_out.ptr<T>();
  T* rstd_p = rstd_out.ptr<T>();
  int64_t r = 0;
  for_each_offset(lead, x.sizes, x.strides, [&](int64_t xoff) {
    const T* src = x.ptr<T>() + xoff;
    if (!xin) {
      int64_t i = 0;
      for_each_offset(k, x.sizes + lead, x.strides + lead, [&](int64_t o) { row[i++] = src[o]; });
      src = row;
    }
    T mean, var;
    if constexpr (std::is_same<T, float>::value) {  // the vector loops (vector_math.h)
      mean = vec::sum(src, n) / static_cast<float>(n);
      var = vec::sum_sq_centered(src, mean, n) / static_cast<float>(n);
    } else {
      Acc<T> s = 0;
      for (int64_t i = 0; i < n; ++i) s += src[i];
      mean = static_cast<T>(static_cast<T>(s) / static_cast<T>(n));
      Acc<T> q = 0;
      for (int64_t i = 0; i < n; ++i) {
        T c = src[i] - mean;
        q += static_cast<Acc<T>>(c * c);
      }
      var = static_cast<T>(static_cast<T>(q) / static_cast<T>(n));
    }
    T rstd = T(1) / std::sqrt(var + static_cast<T>(eps));
    // the y offset of this row (y has x's shape)
    int64_t yoff = 0, rem = r;
    for (int d = lead - 1; d >= 0; --d) {
      yoff += (rem % y.sizes[d]) * y.strides[d];
      rem /= y.sizes[d];
    }
    T* dst = yin ? y.ptr<T>() + yoff : yrow;
    // (x - mean) * rstd, then * weight, then + bias: three roundings, as the NumPy kernel's
    // steps, each a loop the compiler vectorises
    for (int64_t i = 0; i < n; ++i) dst[i] = (src[i] - mean) * rstd;
    if (w && w->dense) {
      const T* wp = w->ptr<T>();
      for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] * wp[i];
    } else if (w) {
      for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] * vec_at(*w, i);
    }
    if (b && b->dense) {
      const T* bp = b->ptr<T>();
      for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] + bp[i];
    } else if (b) {
      for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] + vec_at(*b, i);
    }
    if (!yin) {
      int64_t i = 0;
      T* base = y.ptr<T>() + yoff;
      for_each_offset(k, y.sizes + lead, y.strides + lead, [&](int64_t o) { base[o] = yrow[i++]; });
    }
    // mean / rstd: any shape of `rows` elements, written in row-major order
    auto put = [&](const View& o, T value) {
      int64_t off = 0, rm = r;
      for (int d = o.rank - 1; d >= 0; --d) {
        off += (rm % o.sizes[d]) * o.strides[d];
        rm /= o.sizes[d];
      }
      o.ptr<T>()[off] = value;
    };
    if (mean_out.dense) mean_p[r] = mean; else put(mean_out, mean);
    if (rstd_out.dense) rstd_p[r] = rstd; else put(rstd_out, rstd);
    ++r;
  });
  (void)rows;
}

void native_layer_norm_out(opforge_context* ctx, opforge_arg* args, int64_t nargs) {
  const char* op = "aten::native_layer_norm.out";
  View x, w, b, y, mean, rstd;
  bool has_w, has_b;
  const int64_t* shape;
  int64_t k;
  double eps;
  if (!tensor_arg(ctx, args, nargs, 0, op, "input", &x) ||
      !int_list_arg(ctx, args, nargs, 1, op, "normalized_shape", &shape, &k) ||
      !optional_tensor_arg(ctx, args, nargs, 2, op, "weight", &w, &has_w) ||
      !optional_tensor_arg(ctx, args, nargs, 3, op, "bias", &b, &has_b) ||
      !double_arg(ctx, args, nargs, 4, op, "eps", &eps) ||
      !tensor_arg(ctx, args, nargs, 5, op, "out0", &y) ||
      !tensor_arg(ctx, args, nargs, 6, op, "out1", &mean) ||
      !tensor_arg(ctx, args, nargs, 7, op, "out2", &rstd))
    return;
  if (k < 1 || k > x.rank) {
    fail(ctx, "%s: normalized_shape of %lld dims for an input of rank %d — valid: 1..rank dims "
         "— check the model's layer norm", op, (long long)k, x.rank);
    return;
  }
  int lead = x.rank - static_cast<int>(k);
  int64_t n = 1, rows = 1;
  for (int64_t i = 0; i < k; ++i) {
    if (x.sizes[lead + i] != shape[i]) {
      fail(ctx, "%s: normalized_shape entry %lld is %lld, the input's dim %lld is %lld — valid: "
           "the input's trailing dims — check the model's layer norm", op, (long long)i,
           (long long)shape[i], (long long)(lead + i), (long long)x.sizes[lead + i]);
      return;
    }
    n *= shape[i];
  }
  for (int d = 0; d < lead; ++d) rows *= x.sizes[d];
  View others[5] = {y, mean, rstd, has_w ? w : y, has_b ? b : y};
  if (!float_dtypes(ctx, op, x, others, 5) || !check_shape(ctx, op, y, x.sizes, x.rank)) return;
  for (const View* v : {has_w ? &w : nullptr, has_b ? &b : nullptr}) {
    if (!v) continue;
    bool same = v->rank == k;
    for (int64_t i = 0; same && i < k; ++i) same = v->sizes[i] == shape[i];
    if (!same) {
      fail(ctx, "%s: %s of rank %d — valid: normalized_shape's shape — check the model's layer "
           "norm", op, v == &w ? "weight" : "bias", v->rank);
      return;
    }
  }
  if (mean.numel != rows || rstd.numel != rows) {
    fail(ctx, "%s: out1/out2 of %lld/%lld elements — valid: %lld (the input's leading dims, "
         "normalised dims 1)", op, (long long)mean.numel, (long long)rstd.numel, (long long)rows);
    return;
  }
  if (x.numel == 0) return;
  int64_t item = itemsize(x.dtype);
  void* row = scratch(ctx, 0, n * item);
  void* yrow = scratch(ctx, 1, n * item);
  if (!row || !yrow) {
    fail(ctx, "%s: a row buffer of %lld bytes — could not be allocated", op, (long long)(n * item));
    return;
  }
  if (x.dtype == kFloat32)
    layer_norm<float>(x, static_cast<int>(k), has_w ? &w : nullptr, has_b ? &b : nullptr, eps, y,
                      mean, rstd, static_cast<float*>(row), static_cast<float*>(yrow));
  else
    layer_norm<double>(x, static_cast<int>(k), has_w ? &w : nullptr, has_b ? &b : nullptr, eps, y,
                       mean, rstd, static_cast<double*>(row), static_cast<double*>(yrow));
}

// --- batch norm -----------------------------------------------------------------------------

// y[n, c, ...] = x[n, c, ...] * scale[c] + shift[c] (in two roundings), any strides.
template <typename T>
void per_channel_affine(const View& x, const View& y, const T* scale, const T* shift) {
  int64_t N = x.sizes[0], C = x.sizes[1];
  int inner = x.rank - 2;
  for (int64_t ni = 0; ni < N; ++ni)
    for (int64_t c = 0; c < C; ++c) {
      const T* xs = x.ptr<T>() + ni * x.strides[0] + c * x.strides[1];
      T* ys = y.ptr<T>() + ni * y.strides[0] + c * y.strides[1];
      T sc = scale[c], sh = shift[c];
      int64_t inner_n = 1;
      for (int d = 2; d < x.rank; ++d) inner_n *= x.sizes[d];
      // contiguous planes (NCHW) go straight; others by offsets
      bool xc = true, yc = true;
      int64_t e = 1;
      for (int d = x.rank - 1; d >= 2; --d) {
        if (x.sizes[d] != 1 && x.strides[d] != e) xc = false;
        if (y.sizes[d] != 1 && y.strides[d] != e) yc = false;
        e *= x.sizes[d];
      }
      if (xc && yc) {
        for (int64_t i = 0; i < inner_n; ++i) {
          T v = xs[i] * sc;
          ys[i] = v + sh;
        }
      } else {
        int64_t yo[kMaxRank];
        (void)yo;
        int64_t i = 0;
        for_each_offset(inner, x.sizes + 2, x.strides + 2, [&](int64_t o) {
          int64_t off = 0, rem = i++;
          for (int d = x.rank - 1; d >= 2; --d) {
            off += (rem % y.sizes[d]) * y.strides[d];
            rem /= y.sizes[d];
          }
          T v = xs[o] * sc;
          ys[off] = v + sh;
        });
      }
    }
}

template <typename T>
void batch_norm_inference(const View& x, const View* w, const View* b, const View& rm,
                          const View& rv, double eps, const View& y, T* scale, T* shift) {
  int64_t C = x.sizes[1];
  for (int64_t c = 0; c < C; ++c) {
    // the NumPy kernel's scale and shift, rounding for rounding
    T s = T(1) / std::sqrt(at1<T>(rv, c) + static_cast<T>(eps));
    if (w) s = s * at1<T>(*w, c);
    T sh = -at1<T>(rm, c) * s;
    if (b) sh = sh + at1<T>(*b, c);
    scale[c] = s;
    shift[c] = sh;
  }
  per_channel_affine<T>(x, y, scale, shift);
}

void batch_norm_no_training_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::_native_batch_norm_legit_no_training.out";
  View x, w, b, rm, rv, y, o1, o2;
  bool has_w, has_b;
  double momentum, eps;
  if (!tensor_arg(ctx, args, n, 0, op, "input", &x) ||
      !optional_tensor_arg(ctx, args, n, 1, op, "weight", &w, &has_w) ||
      !optional_tensor_arg(ctx, args, n, 2, op, "bias", &b, &has_b) ||
      !tensor_arg(ctx, args, n, 3, op, "running_mean", &rm) ||
      !tensor_arg(ctx, args, n, 4, op, "running_var", &rv) ||
      !double_arg(ctx, args, n, 5, op, "momentum", &momentum) ||
      !double_arg(ctx, args, n, 6, op, "eps", &eps) ||
      !tensor_arg(ctx, args, n, 7, op, "out0", &y) ||
      !tensor_arg(ctx, args, n, 8, op, "out1", &o1) ||
      !tensor_arg(ctx, args, n, 9, op, "out2", &o2))
    return;
  if (x.rank < 2) {
    fail(ctx, "%s: input of rank %d — valid: (N, C, ...) of rank >= 2", op, x.rank);
    return;
  }
  View others[5] = {y, rm, rv, has_w ? w : y, has_b ? b : y};
  if (!float_dtypes(ctx, op, x, others, 5) || !check_shape(ctx, op, y, x.sizes, x.rank)) return;
  int64_t C = x.sizes[1];
  if (!vector_of(ctx, op, "running_mean", rm, C) || !vector_of(ctx, op, "running_var", rv, C) ||
      (has_w && !vector_of(ctx, op, "weight", w, C)) || (has_b && !vector_of(ctx, op, "bias", b, C)))
    return;
  int64_t item = itemsize(x.dtype);
  void* scale = scratch(ctx, 0, C * item);
  void* shift = scratch(ctx, 1, C * item);
  if (!scale || !shift) {
    fail(ctx, "%s: per-channel buffers — could not be allocated", op);
    return;
  }
  if (x.numel == 0 && C == 0) return;
  if (x.dtype == kFloat32)
    batch_norm_inference<float>(x, has_w ? &w : nullptr, has_b ? &b : nullptr, rm, rv, eps, y,
                                static_cast<float*>(scale), static_cast<float*>(shift));
  else
    batch_norm_inference<double>(x, has_w ? &w : nullptr, has_b ? &b : nullptr, rm, rv, eps, y,
                                 static_cast<double*>(scale), static_cast<double*>(shift));
}

// Batch statistics per channel (over N and the spatial dims), then the affine map.
template <typename T>
void batch_stats(const View& x, const View* w, const View* b, double eps, const View& y,
                 const View& save_mean, const View& save_invstd, T* scale, T* shift) {
  int64_t N = x.sizes[0], C = x.sizes[1];
  int inner = x.rank - 2;
  int64_t count = N;
  for (int d = 2; d < x.rank; ++d) count *= x.sizes[d];
  for (int64_t c = 0; c < C; ++c) {
    Acc<T> s = 0;
    for (int64_t ni = 0; ni < N; ++ni)
      for_each_offset(inner, x.sizes + 2, x.strides + 2, [&](int64_t o) {
        s += x.ptr<T>()[ni * x.strides[0] + c * x.strides[1] + o];
      });
    // an empty batch: 0 / 0 is NaN, as in ATen
    T mean = static_cast<T>(static_cast<T>(s) / static_cast<T>(count));
    Acc<T> q = 0;
    for (int64_t ni = 0; ni < N; ++ni)
      for_each_offset(inner, x.sizes + 2, x.strides + 2, [&](int64_t o) {
        T d = x.ptr<T>()[ni * x.strides[0] + c * x.strides[1] + o] - mean;
        q += static_cast<Acc<T>>(d * d);
      });
    T var = static_cast<T>(static_cast<T>(q) / static_cast<T>(count));
    T invstd = T(1) / std::sqrt(var + static_cast<T>(eps));
    save_mean.ptr<T>()[save_mean.rank ? c * save_mean.strides[0] : 0] = mean;
    save_invstd.ptr<T>()[save_invstd.rank ? c * save_invstd.strides[0] : 0] = invstd;
    scale[c] = invstd;
    shift[c] = mean;
  }
  // y = (x - mean) * invstd [* w] [+ b], each step rounded as the NumPy kernel's
  for (int64_t ni = 0; ni < N; ++ni)
    for (int64_t c = 0; c < C; ++c) {
      T mean = shift[c], invstd = scale[c];
      T wc = w ? at1<T>(*w, c) : T(1), bc = b ? at1<T>(*b, c) : T(0);
      const T* xs = x.ptr<T>() + ni * x.strides[0] + c * x.strides[1];
      T* ys = y.ptr<T>() + ni * y.strides[0] + c * y.strides[1];
      int64_t i = 0;
      for_each_offset(inner, x.sizes + 2, x.strides + 2, [&](int64_t o) {
        int64_t off = 0, rem = i++;
        for (int d = x.rank - 1; d >= 2; --d) {
          off += (rem % y.sizes[d]) * y.strides[d];
          rem /= y.sizes[d];
        }
        T v = (xs[o] - mean) * invstd;
        if (w) v = v * wc;
        if (b) v = v + bc;
        ys[off] = v;
      });
    }
}

void batch_norm_batch_stats_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::_native_batch_norm_legit.no_stats_out";
  View x, w, b, y, sm, si;
  bool has_w, has_b, training;
  double momentum, eps;
  if (!tensor_arg(ctx, args, n, 0, op, "input", &x) ||
      !optional_tensor_arg(ctx, args, n, 1, op, "weight", &w, &has_w) ||
      !optional_tensor_arg(ctx, args, n, 2, op, "bias", &b, &has_b) ||
      !bool_arg(ctx, args, n, 3, op, "training", &training) ||
      !double_arg(ctx, args, n, 4, op, "momentum", &momentum) ||
      !double_arg(ctx, args, n, 5, op, "eps", &eps) ||
      !tensor_arg(ctx, args, n, 6, op, "out", &y) ||
      !tensor_arg(ctx, args, n, 7, op, "save_mean", &sm) ||
      !tensor_arg(ctx, args, n, 8, op, "save_invstd", &si))
    return;
  if (!training) {
    fail(ctx, "%s: training=False — without running statistics there is nothing to normalise "
         "with (ATen refuses it too) — valid: training=True — export a model whose norms track "
         "running statistics", op);
    return;
  }
  if (x.rank < 2) {
    fail(ctx, "%s: input of rank %d — valid: (N, C, ...) of rank >= 2", op, x.rank);
    return;
  }
  View others[5] = {y, sm, si, has_w ? w : y, has_b ? b : y};
  if (!float_dtypes(ctx, op, x, others, 5) || !check_shape(ctx, op, y, x.sizes, x.rank)) return;
  int64_t C = x.sizes[1];
  if (!vector_of(ctx, op, "save_mean", sm, C) || !vector_of(ctx, op, "save_invstd", si, C) ||
      (has_w && !vector_of(ctx, op, "weight", w, C)) || (has_b && !vector_of(ctx, op, "bias", b, C)))
    return;
  int64_t item = itemsize(x.dtype);
  void* scale = scratch(ctx, 0, C * item);
  void* shift = scratch(ctx, 1, C * item);
  if (!scale || !shift) {
    fail(ctx, "%s: per-channel buffers — could not be allocated", op);
    return;
  }
  if (x.dtype == kFloat32)
    batch_stats<float>(x, has_w ? &w : nullptr, has_b ? &b : nullptr, eps, y, sm, si,
                       static_cast<float*>(scale), static_cast<float*>(shift));
  else
    batch_stats<double>(x, has_w ? &w : nullptr, has_b ? &b : nullptr, eps, y, sm, si,
                        static_cast<double*>(scale), static_cast<double*>(shift));
}

// --- group norm -----------------------------------------------------------------------------

template <typename T>
void group_norm(const View& x, const View* w, const View* b, int64_t N, int64_t C, int64_t HxW,
                int64_t G, double eps, const View& y, const View& mean_out, const View& rstd_out) {
  // x is read as (N, G, C/G * HxW) in row-major order (the NumPy kernel's reshape)
  const T* xs = x.ptr<T>();
  T* ys = y.ptr<T>();
  int64_t per = C / G * HxW;
  for (int64_t ni = 0; ni < N; ++ni)
    for (int64_t g = 0; g < G; ++g) {
      const T* src = xs + (ni * G + g) * per;
      T mean, var;
      if constexpr (std::is_same<T, float>::value) {
        mean = vec::sum(src, per) / static_cast<float>(per);
        var = vec::sum_sq_centered(src, mean, per) / static_cast<float>(per);
      } else {
        Acc<T> s = 0;
        for (int64_t i = 0; i < per; ++i) s += src[i];
        mean = static_cast<T>(static_cast<T>(s) / static_cast<T>(per));
        Acc<T> q = 0;
        for (int64_t i = 0; i < per; ++i) {
          T d = src[i] - mean;
          q += static_cast<Acc<T>>(d * d);
        }
        var = static_cast<T>(static_cast<T>(q) / static_cast<T>(per));
      }
      T rstd = T(1) / std::sqrt(var + static_cast<T>(eps));
      T* dst = ys + (ni * G + g) * per;
      for (int64_t cc = 0; cc < C / G; ++cc) {
        int64_t c = g * (C / G) + cc;
        T wc = w ? at1<T>(*w, c) : T(1), bc = b ? at1<T>(*b, c) : T(0);
        for (int64_t i = cc * HxW; i < (cc + 1) * HxW; ++i) {
          T v = (src[i] - mean) * rstd;
          if (w) v = v * wc;
          if (b) v = v + bc;
          dst[i] = v;
        }
      }
      mean_out.ptr<T>()[ni * G + g] = mean;
      rstd_out.ptr<T>()[ni * G + g] = rstd;
    }
}

void native_group_norm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::native_group_norm.out";
  View x, w, b, y, mean, rstd;
  bool has_w, has_b;
  int64_t N, C, HxW, G;
  double eps;
  if (!tensor_arg(ctx, args, n, 0, op, "input", &x) ||
      !optional_tensor_arg(ctx, args, n, 1, op, "weight", &w, &has_w) ||
      !optional_tensor_arg(ctx, args, n, 2, op, "bias", &b, &has_b) ||
      !int_arg(ctx, args, n, 3, op, "N", &N) || !int_arg(ctx, args, n, 4, op, "C", &C) ||
      !int_arg(ctx, args, n, 5, op, "HxW", &HxW) || !int_arg(ctx, args, n, 6, op, "group", &G) ||
      !double_arg(ctx, args, n, 7, op, "eps", &eps) ||
      !tensor_arg(ctx, args, n, 8, op, "out0", &y) ||
      !tensor_arg(ctx, args, n, 9, op, "out1", &mean) ||
      !tensor_arg(ctx, args, n, 10, op, "out2", &rstd))
    return;
  int64_t total = 0, ng = 0;
  if (N < 0 || C < 0 || HxW < 0 || G < 1 || C % G != 0 || x.rank < 2 || x.sizes[0] != N ||
      x.sizes[1] != C || !mul_ok(N, C, &total) || !mul_ok(total, HxW, &total) ||
      total != x.numel || !mul_ok(N, G, &ng)) {
    fail(ctx, "%s: N=%lld, C=%lld, HxW=%lld, group=%lld for an input of %lld elements — valid: "
         "the input (N, C, *) with N*C*HxW elements and C %% group == 0 — check the model's "
         "group norm", op, (long long)N, (long long)C, (long long)HxW, (long long)G,
         (long long)x.numel);
    return;
  }
  View others[5] = {y, mean, rstd, has_w ? w : y, has_b ? b : y};
  if (!float_dtypes(ctx, op, x, others, 5) || !check_shape(ctx, op, y, x.sizes, x.rank)) return;
  if ((has_w && !vector_of(ctx, op, "weight", w, C)) || (has_b && !vector_of(ctx, op, "bias", b, C)))
    return;
  if (mean.numel != ng || rstd.numel != ng || !mean.dense || !rstd.dense || !x.dense || !y.dense) {
    fail(ctx, "%s: out1/out2 of %lld/%lld elements (or a strided tensor) — valid: (N, group) = "
         "%lld elements, dense tensors — check the memory plan", op, (long long)mean.numel,
         (long long)rstd.numel, (long long)ng);
    return;
  }
  if (x.dtype == kFloat32)
    group_norm<float>(x, has_w ? &w : nullptr, has_b ? &b : nullptr, N, C, HxW, G, eps, y, mean, rstd);
  else
    group_norm<double>(x, has_w ? &w : nullptr, has_b ? &b : nullptr, N, C, HxW, G, eps, y, mean, rstd);
}

const KernelDef kNormalizationKernels[] = {
    {"aten::native_layer_norm.out", "T IL T? T? D T! T! T!", with_half<native_layer_norm_out, 3>},
    {"aten::_native_batch_norm_legit_no_training.out", "T T? T? T T D D T! T! T!",
     with_half<batch_norm_no_training_out, 3>},
    {"aten::_native_batch_norm_legit.no_stats_out", "T T? T? B D D T! T! T!",
     with_half<batch_norm_batch_stats_out, 3>},
    {"aten::native_group_norm.out", "T T? T? I I I I D T! T! T!", with_half<native_group_norm_out, 3>},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(normalization, kNormalizationKernels)
