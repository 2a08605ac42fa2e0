// Convolution, 1-d to 3-d, strided, padded, dilated, grouped, and transposed (the NumPy
// kernel of opforge/kernels/portable/convolution.py, ATen's convolution.out).
//
// Every convolution is handled as a 3-d one (a 1-d or 2-d one gets leading spatial dims of
// size 1), per image and per group:
//   - 1x1, stride 1, unpadded: out = W · x, the input itself as the GEMM's right operand;
//   - depthwise (one input and one output channel per group): a direct multiply-add over
//     the kernel taps, rows at a time (9 taps cost less than building columns);
//   - otherwise im2col: the windows gathered into a (taps x positions) column matrix in a
//     per-thread scratch buffer, then out = W · columns by the blocked GEMM (gemm.h);
//   - transposed: columns = W^T · x by the GEMM, then scattered (added) into out, one tap
//     at a time in tap order, as the NumPy kernel's overlap-add.
// Strides of input, weight and out are honoured (channels-last tensors too): the GEMM takes
// any strides, and out's spatial dims only need to merge into one stride (else the product
// goes through scratch).
//
// Checks before any memory is touched, as _workspace.check_convolution: parameters in
// range, ATen's channel rules, the out's shape from ATen's formula, then the NumPy kernel's
// workspace bound against the memory limit (gemm.h workspace_limit(ctx)). The GEMM runs
// on the threads the runtime lends (gemm.h); the depthwise loop splits over channels.
#include <atomic>
#include <cstring>
#include <type_traits>

#include "gemm.h"
#include "parallel.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

constexpr const char* kOp = "aten::convolution.out";

// An int[] argument with 1 entry (broadcast) or `spatial` entries, into 3 slots (leading
// dims padded with `fill`).
bool param3(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
            const char* what, int spatial, int64_t fill, int64_t low, int64_t* out3) {
  const int64_t* v;
  int64_t count;
  if (!int_list_arg(ctx, args, n, i, kOp, what, &v, &count)) return false;
  if (count != 1 && count != spatial) {
    fail(ctx, "%s: %s has %lld entries for %d spatial dims — valid: 1 or %d entries — pass "
         "one value per spatial dimension", kOp, what, (long long)count, spatial, spatial);
    return false;
  }
  for (int d = 0; d < 3; ++d) out3[d] = fill;
  for (int d = 0; d < spatial; ++d) {
    int64_t x = v[count == 1 ? 0 : d];
    if (x < low) {
      fail(ctx, "%s: %s has entry %lld — valid: every entry >= %lld — re-export the model; "
           "the program was altered or corrupted", kOp, what, (long long)x, (long long)low);
      return false;
    }
    out3[3 - spatial + d] = x;
  }
  return true;
}

// A tensor's dims as (lead..., C, D, H, W): `lead` leading dims (0 or 1) kept, spatial
// dims right-aligned into 3 (missing ones size 1, stride 0).
struct Vol {
  int64_t n = 1, sn = 0;  // batch (1 when unbatched)
  int64_t c = 0, sc = 0;
  int64_t size[3] = {1, 1, 1}, stride[3] = {0, 0, 0};
};

Vol vol(const View& v, bool batched, int spatial) {
  Vol r;
  int d = 0;
  if (batched) { r.n = v.sizes[0]; r.sn = v.strides[0]; d = 1; }
  r.c = v.sizes[d];
  r.sc = v.strides[d];
  for (int s = 0; s < spatial; ++s) {
    r.size[3 - spatial + s] = v.sizes[d + 1 + s];
    r.stride[3 - spatial + s] = v.strides[d + 1 + s];
  }
  return r;
}

// The one stride of a (D, H, W) block read as a flat index, or 0 if it does not merge.
int64_t merged_stride(const int64_t* size, const int64_t* stride) {
  int64_t unit = 0, expect = 0;
  for (int d = 2; d >= 0; --d) {
    if (size[d] == 1) continue;
    if (unit == 0) { unit = stride[d]; expect = stride[d] * size[d]; continue; }
    if (stride[d] != expect) return 0;
    expect *= size[d];
  }
  return unit == 0 ? 1 : unit;
}

struct Geometry {
  int spatial = 0;
  bool batched = true, transposed = false;
  int64_t groups = 1;
  int64_t k[3], s[3], p[3], d[3], op[3];
  Vol x, w, y;
  int64_t cin_g = 0, cout_g = 0, taps = 0, positions = 0, in_positions = 0;
};

// im2col for one image and one group: columns[(c, kd, kh, kw)][(od, oh, ow)].
template <typename T>
void im2col(const Geometry& g, const T* x, T* col, int64_t c_begin, int64_t c_end) {
  const Vol& X = g.x;
  const Vol& Y = g.y;
  int64_t P = g.positions;
  int64_t row = c_begin * g.k[0] * g.k[1] * g.k[2];
  for (int64_t c = c_begin; c < c_end; ++c)
    for (int64_t kd = 0; kd < g.k[0]; ++kd)
      for (int64_t kh = 0; kh < g.k[1]; ++kh)
        for (int64_t kw = 0; kw < g.k[2]; ++kw, ++row) {
          T* dst = col + row * P;
          int64_t iw0 = kw * g.d[2] - g.p[2];
          for (int64_t od = 0; od < Y.size[0]; ++od) {
            int64_t id = od * g.s[0] - g.p[0] + kd * g.d[0];
            for (int64_t oh = 0; oh < Y.size[1]; ++oh, dst += Y.size[2]) {
              int64_t ih = oh * g.s[1] - g.p[1] + kh * g.d[1];
              if (id < 0 || id >= X.size[0] || ih < 0 || ih >= X.size[1]) {
                for (int64_t ow = 0; ow < Y.size[2]; ++ow) dst[ow] = T(0);
                continue;
              }
              const T* src = x + c * X.sc + id * X.stride[0] + ih * X.stride[1];
              if (g.s[2] == 1 && X.stride[2] == 1) {
                // [0, lo) left padding, [lo, hi) a copy, [hi, OW) right padding
                int64_t lo = iw0 < 0 ? -iw0 : 0;
                int64_t hi = X.size[2] - iw0;
                if (lo > Y.size[2]) lo = Y.size[2];
                if (hi > Y.size[2]) hi = Y.size[2];
                if (hi < lo) hi = lo;
                for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = T(0);
                if (hi > lo) std::memcpy(dst + lo, src + iw0 + lo, (hi - lo) * sizeof(T));
                for (int64_t ow = hi; ow < Y.size[2]; ++ow) dst[ow] = T(0);
              } else {
                for (int64_t ow = 0; ow < Y.size[2]; ++ow) {
                  int64_t iw = iw0 + ow * g.s[2];
                  dst[ow] = (iw >= 0 && iw < X.size[2]) ? src[iw * X.stride[2]] : T(0);
                }
              }
            }
          }
        }
}

// Depthwise: one input channel to one output channel, a direct sum over the taps, in tap
// order (as the NumPy kernel's bound depthwise path), into out's plane for channel c.
template <typename T>
void depthwise(const Geometry& g, const T* x, const T* w, int64_t wk[3], T* y, T* rowbuf) {
  const Vol& X = g.x;
  const Vol& Y = g.y;
  for (int64_t od = 0; od < Y.size[0]; ++od)
    for (int64_t oh = 0; oh < Y.size[1]; ++oh) {
      T* acc = rowbuf;
      for (int64_t ow = 0; ow < Y.size[2]; ++ow) acc[ow] = T(0);
      for (int64_t kd = 0; kd < g.k[0]; ++kd) {
        int64_t id = od * g.s[0] - g.p[0] + kd * g.d[0];
        if (id < 0 || id >= X.size[0]) continue;
        for (int64_t kh = 0; kh < g.k[1]; ++kh) {
          int64_t ih = oh * g.s[1] - g.p[1] + kh * g.d[1];
          if (ih < 0 || ih >= X.size[1]) continue;
          const T* src = x + id * X.stride[0] + ih * X.stride[1];
          for (int64_t kw = 0; kw < g.k[2]; ++kw) {
            T wv = w[kd * wk[0] + kh * wk[1] + kw * wk[2]];
            int64_t iw0 = kw * g.d[2] - g.p[2];
            // ow with 0 <= iw0 + ow * s < W
            int64_t lo = iw0 >= 0 ? 0 : (-iw0 + g.s[2] - 1) / g.s[2];
            int64_t hi = X.size[2] - iw0 <= 0 ? 0 : (X.size[2] - iw0 + g.s[2] - 1) / g.s[2];
            if (hi > Y.size[2]) hi = Y.size[2];
            if (g.s[2] == 1 && X.stride[2] == 1) {
              const T* s0 = src + iw0;
              for (int64_t ow = lo; ow < hi; ++ow) acc[ow] += wv * s0[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow)
                acc[ow] += wv * src[(iw0 + ow * g.s[2]) * X.stride[2]];
            }
          }
        }
      }
      T* dst = y + od * Y.stride[0] + oh * Y.stride[1];
      for (int64_t ow = 0; ow < Y.size[2]; ++ow) dst[ow * Y.stride[2]] = acc[ow];
    }
}

// The product of one image and group (gemm fails ctx itself, naming the op).
template <typename T>
bool gemm_t(opforge_context* ctx, int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa,
            const T* b, int64_t rsb, int64_t csb, T* c, int64_t rsc, int64_t csc, bool acc) {
  return gemm(ctx, kOp, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, acc);
}

template <typename T>
bool forward(opforge_context* ctx, const Geometry& g, const View& xv, const View& wv,
             const View& yv) {
  const Vol &X = g.x, &W = g.w, &Y = g.y;
  const T* x = xv.ptr<T>();
  const T* w = wv.ptr<T>();
  T* y = yv.ptr<T>();
  int64_t P = g.positions;
  int64_t ystride = merged_stride(Y.size, Y.stride);  // out's positions as one stride
  int64_t wtap = merged_stride(W.size, W.stride);    // the weight's kernel taps
  // the weight's (C_in/g, *k) as one column stride: taps merge, and C_in's stride follows
  int64_t ktaps = g.k[0] * g.k[1] * g.k[2];
  bool wmerge = wtap != 0 && (g.cin_g == 1 || W.sc == wtap * ktaps);
  bool pointwise = ktaps == 1 && g.s[0] == 1 && g.s[1] == 1 && g.s[2] == 1 && g.p[0] == 0 &&
                   g.p[1] == 0 && g.p[2] == 0;
  bool dw = g.cin_g == 1 && g.cout_g == 1;
  if (dw) {
    // planes (image, channel) split over threads, each with its own row buffer
    int64_t wk[3] = {W.stride[0], W.stride[1], W.stride[2]};
    int64_t planes = X.n * g.groups, per_plane = P * ktaps;
    int64_t parts = parallel_parts(ctx, planes, per_plane >= kParallelGrain ? 1 : kParallelGrain / per_plane);
    std::atomic<bool> no_memory{false};
    parallel_ranges(ctx, planes, parts, 1, [&](int64_t p0, int64_t p1) {
      T* row = static_cast<T*>(scratch(ctx, 0, Y.size[2] * static_cast<int64_t>(sizeof(T))));
      if (!row) {
        no_memory.store(true, std::memory_order_relaxed);
        return;
      }
      for (int64_t p = p0; p < p1; ++p) {
        int64_t n = p / g.groups, c = p % g.groups;
        depthwise<T>(g, x + n * X.sn + c * X.sc, w + c * wv.strides[0], wk, y + n * Y.sn + c * Y.sc, row);
      }
    });
    if (no_memory.load()) goto nomem;
    return true;
  }
  {
    // the weight as a dense (C_out, taps) matrix where its strides do not merge
    const T* wm = w;
    int64_t wrs = wv.strides[0], wcs = wtap;
    if (!wmerge) {
      int64_t bytes = wv.sizes[0] * g.taps * static_cast<int64_t>(sizeof(T));
      T* dense = static_cast<T*>(scratch(ctx, 1, bytes));
      if (!dense) goto nomem;
      for (int64_t o = 0; o < wv.sizes[0]; ++o) {
        int64_t t = 0;
        for (int64_t c = 0; c < g.cin_g; ++c)
          for (int64_t a = 0; a < W.size[0]; ++a)
            for (int64_t b = 0; b < W.size[1]; ++b)
              for (int64_t e = 0; e < W.size[2]; ++e, ++t)
                dense[o * g.taps + t] = w[o * wv.strides[0] + c * W.sc + a * W.stride[0] +
                                          b * W.stride[1] + e * W.stride[2]];
      }
      wm = dense;
      wrs = g.taps;
      wcs = 1;
    }
    T* col = nullptr;
    int64_t xstride = merged_stride(X.size, X.stride);
    bool direct = pointwise && xstride != 0;
    if (!direct) {
      int64_t bytes = g.taps * P * static_cast<int64_t>(sizeof(T));
      col = static_cast<T*>(scratch(ctx, 0, bytes));
      if (!col) goto nomem;
    }
    // out's positions not one stride (an unusual permuted layout): a dense product first
    T* dense_y = nullptr;
    if (ystride == 0) {
      dense_y = static_cast<T*>(scratch(ctx, 2, g.cout_g * P * static_cast<int64_t>(sizeof(T))));
      if (!dense_y) goto nomem;
    }
    for (int64_t n = 0; n < X.n; ++n)
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        const T* xg = x + n * X.sn + gi * g.cin_g * X.sc;
        const T* a = wm + gi * g.cout_g * wrs;
        T* yg = y + n * Y.sn + gi * g.cout_g * Y.sc;
        const T* b;
        int64_t rsb, csb;
        if (direct) {
          b = xg; rsb = X.sc; csb = xstride;
        } else {
          // the columns of input channels [c0, c1) per task (a copy: 2^16 elements a task)
          parallel_ranges(ctx, g.cin_g, parallel_parts(ctx, g.cin_g, (int64_t(1) << 16) / (ktaps * P) + 1),
                          1, [&](int64_t c0, int64_t c1) { im2col<T>(g, xg, col, c0, c1); });
          b = col; rsb = P; csb = 1;
        }
        T* c = dense_y ? dense_y : yg;
        if (!gemm_t<T>(ctx, g.cout_g, P, g.taps, a, wrs, wcs, b, rsb, csb, c, dense_y ? P : Y.sc,
                       dense_y ? 1 : ystride, false))
          return false;
        if (dense_y)
          for (int64_t o = 0; o < g.cout_g; ++o) {
            int64_t t = 0;
            for (int64_t a0 = 0; a0 < Y.size[0]; ++a0)
              for (int64_t b0 = 0; b0 < Y.size[1]; ++b0)
                for (int64_t e0 = 0; e0 < Y.size[2]; ++e0, ++t)
                  yg[o * Y.sc + a0 * Y.stride[0] + b0 * Y.stride[1] + e0 * Y.stride[2]] =
                      dense_y[o * P + t];
          }
      }
    return true;
  }
nomem:
  fail(ctx, "%s: the workspace — could not be allocated — valid: memory for the column "
       "matrix (taps x positions) — free memory or raise the memory limit (OPFORGE_MAX_MEMORY)", kOp);
  return false;
}

template <typename T>
bool transposed(opforge_context* ctx, const Geometry& g, const View& xv, const View& wv,
                const View& yv) {
  const Vol &X = g.x, &W = g.w, &Y = g.y;
  const T* x = xv.ptr<T>();
  const T* w = wv.ptr<T>();
  T* y = yv.ptr<T>();
  int64_t Pin = g.in_positions;
  int64_t ktaps = g.k[0] * g.k[1] * g.k[2];
  int64_t rows = g.cout_g * ktaps;  // (o, kd, kh, kw)
  int64_t xstride = merged_stride(X.size, X.stride);
  // W^T for group gi: element ((o, tap), c) of weight[gi*cin_g + c, o, tap]
  int64_t wtap = merged_stride(W.size, W.stride);
  bool wmerge = wtap != 0 && (g.cout_g == 1 || W.sc == wtap * ktaps);
  int64_t bytes = rows * Pin * static_cast<int64_t>(sizeof(T));
  T* col = static_cast<T*>(scratch(ctx, 0, bytes));
  const T* xd = nullptr;
  if (!col) goto nomem;
  if (!wmerge) {
    fail(ctx, "%s: a transposed convolution's weight whose (C_out/groups, *kernel) dims do not "
         "merge into one stride — valid: a dense weight — pass a contiguous weight", kOp);
    return false;
  }
  if (xstride == 0) {
    int64_t xb = g.cin_g * Pin * static_cast<int64_t>(sizeof(T));
    T* dense = static_cast<T*>(scratch(ctx, 1, xb));
    if (!dense) goto nomem;
    xd = dense;
  }
  // out starts at zero: the taps add into it
  for (int64_t n = 0; n < Y.n; ++n)
    for (int64_t c = 0; c < Y.c; ++c)
      for (int64_t a = 0; a < Y.size[0]; ++a)
        for (int64_t b = 0; b < Y.size[1]; ++b)
          for (int64_t e = 0; e < Y.size[2]; ++e)
            y[n * Y.sn + c * Y.sc + a * Y.stride[0] + b * Y.stride[1] + e * Y.stride[2]] = T(0);
  for (int64_t n = 0; n < X.n; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const T* xg = x + n * X.sn + gi * g.cin_g * X.sc;
      const T* bm = xg;
      int64_t rsb = X.sc, csb = xstride;
      if (xstride == 0) {
        T* dense = const_cast<T*>(xd);
        for (int64_t c = 0; c < g.cin_g; ++c) {
          int64_t t = 0;
          for (int64_t a = 0; a < X.size[0]; ++a)
            for (int64_t b = 0; b < X.size[1]; ++b)
              for (int64_t e = 0; e < X.size[2]; ++e, ++t)
                dense[c * Pin + t] = xg[c * X.sc + a * X.stride[0] + b * X.stride[1] + e * X.stride[2]];
        }
        bm = dense; rsb = Pin; csb = 1;
      }
      const T* wg = w + gi * g.cin_g * wv.strides[0];
      if (!gemm_t<T>(ctx, rows, Pin, g.cin_g, wg, wtap, wv.strides[0], bm, rsb, csb, col, Pin, 1, false))
        return false;
      T* yg = y + n * Y.sn + gi * g.cout_g * Y.sc;
      for (int64_t o = 0; o < g.cout_g; ++o)
        for (int64_t kd = 0; kd < g.k[0]; ++kd)
          for (int64_t kh = 0; kh < g.k[1]; ++kh)
            for (int64_t kw = 0; kw < g.k[2]; ++kw) {
              const T* src = col + ((o * g.k[0] + kd) * g.k[1] * g.k[2] + kh * g.k[2] + kw) * Pin;
              T* yo = yg + o * Y.sc;
              for (int64_t id = 0; id < X.size[0]; ++id) {
                int64_t od = id * g.s[0] - g.p[0] + kd * g.d[0];
                if (od < 0 || od >= Y.size[0]) { src += X.size[1] * X.size[2]; continue; }
                for (int64_t ih = 0; ih < X.size[1]; ++ih, src += X.size[2]) {
                  int64_t oh = ih * g.s[1] - g.p[1] + kh * g.d[1];
                  if (oh < 0 || oh >= Y.size[1]) continue;
                  T* dst = yo + od * Y.stride[0] + oh * Y.stride[1];
                  for (int64_t iw = 0; iw < X.size[2]; ++iw) {
                    int64_t ow = iw * g.s[2] - g.p[2] + kw * g.d[2];
                    if (ow >= 0 && ow < Y.size[2]) dst[ow * Y.stride[2]] += src[iw];
                  }
                }
              }
            }
    }
  return true;
nomem:
  fail(ctx, "%s: the workspace — could not be allocated — valid: memory for the column "
       "matrix — free memory or raise OPFORGE_MAX_MEMORY", kOp);
  return false;
}

template <typename T>
void add_bias(const Geometry& g, const View& bias, const View& yv) {
  const Vol& Y = g.y;
  T* y = yv.ptr<T>();
  for (int64_t n = 0; n < Y.n; ++n)
    for (int64_t c = 0; c < Y.c; ++c) {
      T b = bias.ptr<T>()[c * bias.strides[0]];
      for (int64_t a = 0; a < Y.size[0]; ++a)
        for (int64_t e = 0; e < Y.size[1]; ++e) {
          T* row = y + n * Y.sn + c * Y.sc + a * Y.stride[0] + e * Y.stride[1];
          for (int64_t f = 0; f < Y.size[2]; ++f) row[f * Y.stride[2]] += b;
        }
    }
}

// checked product of n values
bool prod_ok(const int64_t* v, int count, int64_t* out) {
  int64_t r = 1;
  for (int i = 0; i < count; ++i)
    if (!mul_ok(r, v[i], &r)) return false;
  *out = r;
  return true;
}

void convolution_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  View x, w, bias, y;
  bool has_bias, transposed_flag;
  int64_t groups;
  if (!tensor_arg(ctx, args, n, 0, kOp, "input", &x) ||
      !tensor_arg(ctx, args, n, 1, kOp, "weight", &w) ||
      !optional_tensor_arg(ctx, args, n, 2, kOp, "bias", &bias, &has_bias) ||
      !bool_arg(ctx, args, n, 6, kOp, "transposed", &transposed_flag) ||
      !int_arg(ctx, args, n, 8, kOp, "groups", &groups) ||
      !tensor_arg(ctx, args, n, 9, kOp, "out", &y))
    return;
  if (w.rank < 3 || w.rank > 5 || (x.rank != w.rank && x.rank != w.rank - 1) ||
      y.rank != x.rank) {
    fail(ctx, "%s: input of rank %d, weight of rank %d, out of rank %d — valid: weight (C_out, "
         "C_in/groups, *kernel) with 1 to 3 spatial dims, input and out (N, C, *spatial) or "
         "(C, *spatial) — check the operands' shapes", kOp, x.rank, w.rank, y.rank);
    return;
  }
  if (x.dtype != w.dtype || x.dtype != y.dtype || (has_bias && bias.dtype != y.dtype) ||
      (y.dtype != kFloat32 && y.dtype != kFloat64)) {
    fail(ctx, "%s: input %s, weight %s, out %s — valid: float32 or float64, one dtype for all "
         "(ATen refuses mixed and integer convolutions) — convert the operands", kOp,
         dtype_name(x.dtype), dtype_name(w.dtype), dtype_name(y.dtype));
    return;
  }
  Geometry g;
  g.spatial = w.rank - 2;
  g.batched = x.rank == w.rank;
  g.transposed = transposed_flag;
  g.groups = groups;
  if (!param3(ctx, args, n, 3, "stride", g.spatial, 1, 1, g.s) ||
      !param3(ctx, args, n, 4, "padding", g.spatial, 0, 0, g.p) ||
      !param3(ctx, args, n, 5, "dilation", g.spatial, 1, 1, g.d))
    return;
  for (int d = 0; d < 3; ++d) g.op[d] = 0;
  if (g.transposed && !param3(ctx, args, n, 7, "output_padding", g.spatial, 0, 0, g.op)) return;
  if (groups < 1) {
    fail(ctx, "%s: groups=%lld — valid: >= 1 — re-export the model", kOp, (long long)groups);
    return;
  }
  g.x = vol(x, g.batched, g.spatial);
  g.y = vol(y, g.batched, g.spatial);
  g.w = vol(w, true, g.spatial);  // n = dim 0 of the weight, c = dim 1
  for (int d = 0; d < 3; ++d) g.k[d] = g.w.size[d];
  int64_t wc0 = w.sizes[0], wc1 = w.sizes[1];
  bool ok;
  int64_t channels = 0;  // wc1 * groups, checked: groups comes from the file
  if (!mul_ok(wc1, groups, &channels)) channels = -1;
  if (g.transposed) {
    ok = wc0 == g.x.c && g.x.c % groups == 0 && g.y.c == channels;
    g.cin_g = g.x.c / groups;
    g.cout_g = wc1;
  } else {
    ok = g.x.c == channels && wc0 == g.y.c && g.y.c % groups == 0;
    g.cin_g = wc1;
    g.cout_g = g.y.c / groups;
  }
  if (!ok || g.y.n != g.x.n) {
    fail(ctx, "%s: channels — input C=%lld, weight (%lld, %lld, ...), groups=%lld, out C=%lld "
         "N=%lld (input N=%lld) — valid: %s, and the out's batch and channels from them — "
         "re-export the model; the program's parameters and tensors disagree", kOp,
         (long long)g.x.c, (long long)wc0, (long long)wc1, (long long)groups, (long long)g.y.c,
         (long long)g.y.n, (long long)g.x.n,
         g.transposed ? "weight (C_in, C_out/groups, *k) with C_in % groups == 0"
                      : "weight (C_out, C_in/groups, *k) with C_out % groups == 0");
    return;
  }
  // ATen's output sizes (checked arithmetic: the parameters come from the file)
  for (int d = 0; d < 3; ++d) {
    int64_t reach, span, expect;
    if (!mul_ok(g.d[d], g.k[d] - 1, &reach)) goto overflow;
    if (g.transposed) {
      int64_t a, b;
      if (!mul_ok(g.x.size[d] - 1, g.s[d], &a) || !mul_ok(2, g.p[d], &b) ||
          !add_ok(a, -b, &a) || !add_ok(a, reach, &a) || !add_ok(a, g.op[d] + 1, &expect))
        goto overflow;
    } else {
      int64_t b;
      if (!mul_ok(2, g.p[d], &b) || !add_ok(g.x.size[d], b, &span) ||
          !add_ok(span, -reach - 1, &span))
        goto overflow;
      // Python's floor division, as ATen's formula (a negative span gives a size < 1)
      expect = (span >= 0 ? span / g.s[d] : -((-span + g.s[d] - 1) / g.s[d])) + 1;
    }
    if (expect < 0 || g.y.size[d] != expect) {
      fail(ctx, "%s: output spatial dim %d of size %lld — the input, stride %lld, padding "
           "%lld, dilation %lld and kernel %lld give %lld — valid: the output shape ATen "
           "computes from them — re-export the model; the program's parameters and tensors "
           "disagree", kOp, d - (3 - g.spatial), (long long)g.y.size[d], (long long)g.s[d],
           (long long)g.p[d], (long long)g.d[d], (long long)g.k[d], (long long)expect);
      return;
    }
  }
  if (has_bias && (bias.rank != 1 || bias.sizes[0] != g.y.c)) {
    fail(ctx, "%s: bias of rank %d — valid: (C_out,) = (%lld,)", kOp, bias.rank, (long long)g.y.c);
    return;
  }
  {
    // the NumPy kernel's workspace (padded input, columns, result; transposed: columns and
    // canvas), refused above the memory limit as it is there
    int64_t item = itemsize(y.dtype), taps, total = 0;
    if (!prod_ok(g.k, 3, &taps)) goto overflow;
    int64_t outpos, inpos;
    if (!prod_ok(g.y.size, 3, &outpos) || !prod_ok(g.x.size, 3, &inpos)) goto overflow;
    g.positions = outpos;
    g.in_positions = inpos;
    if (!mul_ok(g.cin_g, taps, &g.taps)) goto overflow;
    int64_t a, b;
    if (g.transposed) {
      int64_t full = 1;
      for (int d = 0; d < 3; ++d) {
        int64_t f, r;
        if (!mul_ok(g.x.size[d] - 1, g.s[d], &f) || !mul_ok(g.d[d], g.k[d] - 1, &r) ||
            !add_ok(f, r + 1 + g.op[d], &f) || !mul_ok(full, f, &full))
          goto overflow;
      }
      if (!mul_ok(g.x.n, g.y.c, &a) || !mul_ok(a, taps, &b) || !mul_ok(b, inpos, &b) ||
          !mul_ok(a, full, &a) || !add_ok(a, b, &total))
        goto overflow;
    } else {
      int64_t padded = 1;
      for (int d = 0; d < 3; ++d) {
        int64_t e;
        if (!add_ok(g.x.size[d], 2 * g.p[d], &e) || !mul_ok(padded, e, &padded)) goto overflow;
      }
      if (!mul_ok(padded, g.x.n * g.x.c, &a) || !mul_ok(g.x.n, outpos, &b) ||
          !mul_ok(b, g.taps * groups, &total) || !add_ok(total, a, &total) ||
          !mul_ok(g.x.n, g.y.c, &a) || !mul_ok(a, outpos, &a) || !add_ok(total, a, &total))
        goto overflow;
    }
    if (!mul_ok(total, item, &total) || total > workspace_limit(ctx)) goto overflow;
  }
  if (y.numel == 0) return;
  if (y.dtype == kFloat32) {
    if (!(g.transposed ? transposed<float>(ctx, g, x, w, y) : forward<float>(ctx, g, x, w, y))) return;
    if (has_bias) add_bias<float>(g, bias, y);
  } else {
    if (!(g.transposed ? transposed<double>(ctx, g, x, w, y) : forward<double>(ctx, g, x, w, y))) return;
    if (has_bias) add_bias<double>(g, bias, y);
  }
  return;
overflow:
  fail(ctx, "%s: the workspace for input, weight, stride, padding and dilation — is over the "
       "memory limit (%lld bytes) or overflows int64 — valid: a workspace within the limit — "
       "1. check the op's padding, dilation, stride and kernel size (a corrupt or hostile "
       "program asks for absurd ones); 2. if the model really needs it, raise "
       "the memory limit (opf_load_options.max_memory / OPFORGE_MAX_MEMORY)", kOp,
       (long long)workspace_limit(ctx));
}

const KernelDef kConvolutionKernels[] = {
    {"aten::convolution.out", "T T T? IL IL IL B IL I T!", convolution_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(convolution, kConvolutionKernels)
