// Pooling, 2-d and 3-d: max pool with indices, average pool, adaptive average and adaptive
// max pool (the NumPy kernels of opforge/kernels/portable/pooling.py). The spatial dims are
// the input's last n (n = 2 or 3), any leading dims ((N, C) or (C,)); a 2-d pool runs as a
// 3-d one with a depth of 1. Output sizes are ATen's pooling_output_shape (ceil_mode: the
// last window may hang over the right edge but must start inside the input or its left
// padding); adaptive bin i of o over m spans [floor(i m / o), ceil((i + 1) m / o)).
//
// Max pooling is ATen's CPU scan: over the window's elements inside the input in row-major
// order, from the first one (its index is kept when nothing beats -inf / the type's
// lowest), `val > max || isnan(val)` — the first maximum wins ties (and keeps its sign of
// zero), the last NaN wins. Indices are flat offsets into the input's spatial volume.
// Average pooling divides by ATen's count (count_include_pad: the window clipped to the
// padded input; otherwise to the input), or divisor_override; integers divide truncating
// toward zero, as C (and ATen) do.
//
// The parameters come from the program: every one is checked (ATen's ranges, padding at
// most half the window, the out's shape from the formula) and the NumPy kernel's padded
// workspace bound is held to the memory limit before anything is read.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "gemm.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

struct Pool {
  int spatial = 2;
  int64_t k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, p[3] = {0, 0, 0}, d[3] = {1, 1, 1};
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t xs[3] = {0, 0, 0}, ys[3] = {0, 0, 0}, is[3] = {0, 0, 0};  // spatial strides
  int lead = 0;                                                    // leading dims
  int64_t planes = 1;
};

bool param(opforge_context* ctx, const char* op, const opforge_arg* args, int64_t n, int64_t i,
           const char* what, int spatial, bool empty_ok, int64_t* out3, bool* was_empty) {
  const int64_t* v;
  int64_t count;
  if (!int_list_arg(ctx, args, n, i, op, what, &v, &count)) return false;
  if (was_empty) *was_empty = count == 0;
  if (count == 0 && empty_ok) return true;
  if (count != 1 && count != spatial) {
    fail(ctx, "%s: %s has %lld entries for %d spatial dims — valid: 1 or %d entries — pass one "
         "value per spatial dimension", op, what, (long long)count, spatial, spatial);
    return false;
  }
  for (int d = 0; d < spatial; ++d) out3[3 - spatial + d] = v[count == 1 ? 0 : d];
  return true;
}

bool at_least(opforge_context* ctx, const char* op, const char* what, const int64_t* v,
              int spatial, int64_t low) {
  for (int d = 3 - spatial; d < 3; ++d)
    if (v[d] < low) {
      fail(ctx, "%s: %s has entry %lld — valid: every entry >= %lld — re-export the model; the "
           "program was altered or corrupted", op, what, (long long)v[d], (long long)low);
      return false;
    }
  return true;
}

// The input's and outs' layout: leading dims equal, spatial dims right-aligned.
bool layout(opforge_context* ctx, const char* op, const View& x, const View& y, const View* idx,
            Pool* g) {
  int n = g->spatial;
  if (x.rank < n + 1 || y.rank != x.rank || (idx && idx->rank != x.rank)) {
    fail(ctx, "%s: input of rank %d, out of rank %d — valid: (N, C, *spatial) or (C, *spatial) "
         "with %d spatial dims, out of the same rank", op, x.rank, y.rank, n);
    return false;
  }
  g->lead = x.rank - n;
  for (int d = 0; d < g->lead; ++d)
    if (x.sizes[d] != y.sizes[d] || (idx && idx->sizes[d] != x.sizes[d])) {
      fail(ctx, "%s: out's leading dim %d is %lld, the input's %lld — valid: equal", op, d,
           (long long)y.sizes[d], (long long)x.sizes[d]);
      return false;
    }
  for (int d = 0; d < n; ++d) {
    g->in[3 - n + d] = x.sizes[g->lead + d];
    g->out[3 - n + d] = y.sizes[g->lead + d];
    g->xs[3 - n + d] = x.strides[g->lead + d];
    g->ys[3 - n + d] = y.strides[g->lead + d];
    if (idx) {
      g->is[3 - n + d] = idx->strides[g->lead + d];
      if (idx->sizes[g->lead + d] != y.sizes[g->lead + d]) {
        fail(ctx, "%s: indices and out differ in shape — valid: the same shape", op);
        return false;
      }
    }
  }
  for (int d = 0; d < g->lead; ++d) g->planes *= x.sizes[d];
  return true;
}

// ATen's pooling_output_shape, the geometry checks and the workspace bound.
bool check_geometry(opforge_context* ctx, const char* op, Pool* g, bool ceil_mode, bool average,
                    int64_t item) {
  int n = g->spatial;
  if (!at_least(ctx, op, "kernel_size", g->k, n, 1) || !at_least(ctx, op, "stride", g->s, n, 1) ||
      !at_least(ctx, op, "dilation", g->d, n, 1) || !at_least(ctx, op, "padding", g->p, n, 0))
    return false;
  int64_t padded = g->planes, windows = g->planes;
  for (int a = 3 - n; a < 3; ++a) {
    int64_t reach;
    if (!mul_ok(g->d[a], g->k[a] - 1, &reach) || !add_ok(reach, 1, &reach)) goto overflow;
    int64_t half = average ? g->k[a] / 2 : reach / 2;
    if (g->p[a] > half) {
      fail(ctx, "%s: padding %lld — more than half the effective kernel size (kernel_size %lld, "
           "dilation %lld: at most %lld) — valid: pad <= half the window, as ATen requires — "
           "re-export the model; the program was altered or corrupted", op, (long long)g->p[a],
           (long long)g->k[a], (long long)g->d[a], (long long)half);
      return false;
    }
    int64_t span;  // in + 2p - reach (p <= reach / 2 so this cannot overflow past in + reach)
    if (!add_ok(g->in[a], 2 * g->p[a] - reach, &span)) goto overflow;
    // checked: a hostile stride or padding near int64's ends overflowed these
    int64_t num, o, last, end;
    if (!add_ok(span, ceil_mode ? g->s[a] - 1 : 0, &num)) goto overflow;
    // floor(num / s) + 1, s >= 1: C++ division truncates, so step down for a negative rest
    if (!add_ok(num / g->s[a] - (num % g->s[a] != 0 && num < 0 ? 1 : 0), 1, &o)) goto overflow;
    if (ceil_mode) {
      if (!mul_ok(o - 1, g->s[a], &last) || !add_ok(g->in[a], g->p[a], &end)) goto overflow;
      if (last >= end) --o;
    }
    if (o < 1 || g->out[a] != o) {
      fail(ctx, "%s: output spatial size %lld in dim %d — the input (%lld), kernel_size %lld, "
           "stride %lld, padding %lld, dilation %lld give %lld — valid: the output shape ATen "
           "computes from them — re-export the model; the program's parameters and tensors "
           "disagree", op, (long long)g->out[a], a - (3 - n), (long long)g->in[a],
           (long long)g->k[a], (long long)g->s[a], (long long)g->p[a], (long long)g->d[a],
           (long long)o);
      return false;
    }
    int64_t need, right;  // the NumPy kernel's padded extent, and its right padding
    if (!mul_ok(o - 1, g->s[a], &need) || !add_ok(need, reach, &need) ||
        !add_ok(need, -g->in[a], &right) || !add_ok(right, -g->p[a], &right))
      goto overflow;
    if (right < g->p[a]) right = g->p[a];
    if (!mul_ok(padded, g->in[a] + g->p[a] + right, &padded) || !mul_ok(windows, o, &windows) ||
        !mul_ok(windows, g->k[a], &windows))
      goto overflow;
  }
  {
    int64_t total, copied = average ? g->planes : 0;
    for (int a = 3 - n; average && a < 3; ++a)
      if (!mul_ok(copied, g->in[a], &copied)) goto overflow;
    if (!add_ok(padded, windows, &total) || !add_ok(total, copied, &total) ||
        !mul_ok(total, item, &total) || !add_ok(total, windows, &total) || total > workspace_limit(ctx))
      goto overflow;
  }
  return true;
overflow:
  fail(ctx, "%s: the workspace for this input, kernel_size, stride, padding and dilation — is "
       "over the memory limit (%lld bytes) — valid: a workspace within the limit — 1. check the "
       "op's parameters (a corrupt or hostile program asks for absurd ones); 2. if the model "
       "really needs it, raise OPFORGE_MAX_MEMORY", op, (long long)workspace_limit(ctx));
  return false;
}

// Offsets of every leading index (row-major) for a tensor's leading dims.
template <typename F>
void each_plane(const View& v, int lead, F&& f) {
  int64_t idx[kMaxRank] = {0};
  int64_t total = 1;
  for (int d = 0; d < lead; ++d) total *= v.sizes[d];
  int64_t off = 0;
  for (int64_t t = 0; t < total; ++t) {
    f(t, off);
    for (int d = lead - 1; d >= 0; --d) {
      off += v.strides[d];
      if (++idx[d] < v.sizes[d]) break;
      off -= v.strides[d] * v.sizes[d];
      idx[d] = 0;
    }
  }
}

// plane offsets of y (and indices) for plane number t
inline int64_t plane_offset(const View& v, int lead, int64_t t) {
  int64_t off = 0;
  for (int d = lead - 1; d >= 0; --d) {
    off += (t % v.sizes[d]) * v.strides[d];
    t /= v.sizes[d];
  }
  return off;
}

// --- max pool -------------------------------------------------------------------------------

template <typename T>
void max_pool(const Pool& g, const View& x, const View& y, const View& ind) {
  T lowest = std::is_floating_point<T>::value ? -std::numeric_limits<T>::infinity()
                                              : std::numeric_limits<T>::lowest();
  each_plane(x, g.lead, [&](int64_t t, int64_t xo) {
    const T* xp = x.ptr<T>() + xo;
    T* yp = y.ptr<T>() + plane_offset(y, g.lead, t);
    int64_t* ip = ind.ptr<int64_t>() + plane_offset(ind, g.lead, t);
    if (g.k[0] == 1 && g.in[0] == 1 && g.k[1] == 2 && g.k[2] == 2 && g.s[1] == 2 && g.s[2] == 2 &&
        g.p[1] == 0 && g.p[2] == 0 && g.d[1] == 1 && g.d[2] == 1 && g.xs[2] == 1 &&
        2 * g.out[1] <= g.in[1] && 2 * g.out[2] <= g.in[2]) {
      // 2x2, stride 2, unpadded, every window whole (no ceil_mode overhang: most small
      // CNNs): the four taps in ATen's order, by selects
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        const T* r0 = xp + 2 * oh * g.xs[1];
        const T* r1 = r0 + g.xs[1];
        T* yo = yp + oh * g.ys[1];
        int64_t* io = ip + oh * g.is[1];
        int64_t base = 2 * oh * g.in[2];
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          T v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
          int64_t off[4] = {0, 1, g.in[2], g.in[2] + 1};
          T best = v[0];
          int64_t at = 0;
          for (int q = 1; q < 4; ++q) {
            bool nan = false;
            if constexpr (std::is_floating_point<T>::value) nan = v[q] != v[q];
            bool take = (v[q] > best) | nan;  // | not ||: no branch
            best = take ? v[q] : best;
            at = take ? off[q] : at;
          }
          // the first tap is inside the input: ATen's scan starts from it (max = -inf, then
          // val > max || isnan(val) takes it unless it is -inf, when its index is kept)
          yo[ow * g.ys[2]] = best;
          io[ow * g.is[2]] = base + 2 * ow + at;
        }
      }
      return;
    }
    if (g.k[0] == 1 && g.in[0] == 1 && g.d[2] == 1 && g.xs[2] == 1) {
      // 2-d, rows contiguous: the taps' bounds per output row once, then per window the
      // same scan with no per-tap arithmetic but the index
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        int64_t sh = oh * g.s[1] - g.p[1];
        int64_t h0 = sh < 0 ? sh + ((-sh + g.d[1] - 1) / g.d[1]) * g.d[1] : sh;
        int64_t h1 = sh + (g.k[1] - 1) * g.d[1] + 1;
        if (h1 > g.in[1]) h1 = g.in[1];
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          int64_t sw = ow * g.s[2] - g.p[2];
          int64_t w0 = sw < 0 ? 0 : sw;
          int64_t w1 = sw + g.k[2] < g.in[2] ? sw + g.k[2] : g.in[2];
          T best = lowest;
          int64_t at = h0 * g.in[2] + w0;
          for (int64_t ih = h0; ih < h1; ih += g.d[1]) {
            const T* row = xp + ih * g.xs[1];
            for (int64_t iw = w0; iw < w1; ++iw) {
              T v = row[iw];
              bool nan = false;
              if constexpr (std::is_floating_point<T>::value) nan = v != v;
              bool take = (v > best) | nan;  // selects (and | not ||), not branches: random data mispredicts
              best = take ? v : best;
              at = take ? ih * g.in[2] + iw : at;
            }
          }
          yp[oh * g.ys[1] + ow * g.ys[2]] = best;
          ip[oh * g.is[1] + ow * g.is[2]] = at;
        }
      }
      return;
    }
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          int64_t st[3] = {od * g.s[0] - g.p[0], oh * g.s[1] - g.p[1], ow * g.s[2] - g.p[2]};
          int64_t lo[3], hi[3];  // first inside tap and end, per axis (ATen: while (i < 0) i += d)
          for (int a = 0; a < 3; ++a) {
            int64_t first = st[a] < 0 ? st[a] + ((-st[a] + g.d[a] - 1) / g.d[a]) * g.d[a] : st[a];
            int64_t end = st[a] + (g.k[a] - 1) * g.d[a] + 1;
            if (end > g.in[a]) end = g.in[a];
            lo[a] = first;
            hi[a] = end;
          }
          T best = lowest;
          int64_t at = (lo[0] * g.in[1] + lo[1]) * g.in[2] + lo[2];
          for (int64_t i0 = lo[0]; i0 < hi[0]; i0 += g.d[0])
            for (int64_t i1 = lo[1]; i1 < hi[1]; i1 += g.d[1]) {
              const T* row = xp + i0 * g.xs[0] + i1 * g.xs[1];
              for (int64_t i2 = lo[2]; i2 < hi[2]; i2 += g.d[2]) {
                T v = row[i2 * g.xs[2]];
                bool nan = false;
                if constexpr (std::is_floating_point<T>::value) nan = v != v;
                bool take = (v > best) | nan;  // selects (and | not ||), not branches: random data mispredicts
                best = take ? v : best;
                at = take ? (i0 * g.in[1] + i1) * g.in[2] + i2 : at;
              }
            }
          yp[od * g.ys[0] + oh * g.ys[1] + ow * g.ys[2]] = best;
          ip[od * g.is[0] + oh * g.is[1] + ow * g.is[2]] = at;
        }
  });
}

bool max_dtypes(opforge_context* ctx, const char* op, const View& x, const View& y, const View& ind) {
  if (x.dtype == y.dtype && ind.dtype == kInt64 && x.dtype != kBool &&
      (x.dtype == kFloat32 || x.dtype == kFloat64 || is_integral(x.dtype, false)))
    return true;
  fail(ctx, "%s: self %s, out %s, indices %s — valid: float32, float64 or integer self, out of "
       "self's dtype, int64 indices — convert the input", op, dtype_name(x.dtype),
       dtype_name(y.dtype), dtype_name(ind.dtype));
  return false;
}

template <typename F>
bool dispatch_pool(int32_t dtype, F&& f) {
  return dispatch_real(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same<T, bool>::value) f(tag);
  });
}

void max_pool_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, int spatial) {
  View x, y, ind;
  bool ceil_mode, stride_empty;
  Pool g;
  g.spatial = spatial;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !param(ctx, op, args, n, 1, "kernel_size", spatial, false, g.k, nullptr) ||
      !param(ctx, op, args, n, 2, "stride", spatial, true, g.s, &stride_empty) ||
      !param(ctx, op, args, n, 3, "padding", spatial, false, g.p, nullptr) ||
      !param(ctx, op, args, n, 4, "dilation", spatial, false, g.d, nullptr) ||
      !bool_arg(ctx, args, n, 5, op, "ceil_mode", &ceil_mode) ||
      !tensor_arg(ctx, args, n, 6, op, "out", &y) || !tensor_arg(ctx, args, n, 7, op, "indices", &ind))
    return;
  if (stride_empty)
    for (int a = 0; a < 3; ++a) g.s[a] = g.k[a];
  if (!layout(ctx, op, x, y, &ind, &g) || !max_dtypes(ctx, op, x, y, ind) ||
      !check_geometry(ctx, op, &g, ceil_mode, false, itemsize(x.dtype)))
    return;
  if (y.numel == 0) return;
  dispatch_pool(x.dtype, [&](auto tag) { max_pool<decltype(tag)>(g, x, y, ind); });
}

void max_pool2d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  max_pool_kernel(c, a, n, "aten::max_pool2d_with_indices.out", 2);
}
void max_pool3d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  max_pool_kernel(c, a, n, "aten::max_pool3d_with_indices.out", 3);
}

// --- average pool ---------------------------------------------------------------------------

template <typename T>
void avg_pool(const Pool& g, const View& x, const View& y, bool include_pad, int64_t divisor_override) {
  each_plane(x, g.lead, [&](int64_t t, int64_t xo) {
    const T* xp = x.ptr<T>() + xo;
    T* yp = y.ptr<T>() + plane_offset(y, g.lead, t);
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          int64_t o[3] = {od, oh, ow};
          int64_t lo[3], hi[3], count = 1;
          for (int a = 0; a < 3; ++a) {
            int64_t start = o[a] * g.s[a] - g.p[a];
            int64_t end = start + g.k[a];
            if (end > g.in[a] + g.p[a]) end = g.in[a] + g.p[a];
            int64_t cs = start, ce = end;
            if (!include_pad) { if (cs < 0) cs = 0; if (ce > g.in[a]) ce = g.in[a]; }
            count *= ce - cs;
            lo[a] = start < 0 ? 0 : start;
            hi[a] = end > g.in[a] ? g.in[a] : end;
          }
          using Acc = typename std::conditional<std::is_floating_point<T>::value, T, int64_t>::type;
          Acc total = 0;
          for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0)
            for (int64_t i1 = lo[1]; i1 < hi[1]; ++i1) {
              const T* row = xp + i0 * g.xs[0] + i1 * g.xs[1];
              for (int64_t i2 = lo[2]; i2 < hi[2]; ++i2) total += static_cast<Acc>(row[i2 * g.xs[2]]);
            }
          int64_t divisor = divisor_override ? divisor_override : count;
          T r;
          if constexpr (std::is_floating_point<T>::value) {
            r = static_cast<T>(static_cast<double>(total) / static_cast<double>(divisor));
          } else {
            // C truncation, as ATen; INT64_MIN / -1 (a hostile divisor_override) wraps
            r = divisor == 0    ? T(0)
                : divisor == -1 ? static_cast<T>(0 - static_cast<uint64_t>(total))
                                : static_cast<T>(total / divisor);
          }
          yp[od * g.ys[0] + oh * g.ys[1] + ow * g.ys[2]] = r;
        }
  });
}

void avg_pool_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, int spatial) {
  View x, y;
  bool ceil_mode, include_pad, stride_empty;
  int64_t divisor = 0;
  Pool g;
  g.spatial = spatial;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !param(ctx, op, args, n, 1, "kernel_size", spatial, false, g.k, nullptr) ||
      !param(ctx, op, args, n, 2, "stride", spatial, true, g.s, &stride_empty) ||
      !param(ctx, op, args, n, 3, "padding", spatial, false, g.p, nullptr) ||
      !bool_arg(ctx, args, n, 4, op, "ceil_mode", &ceil_mode) ||
      !bool_arg(ctx, args, n, 5, op, "count_include_pad", &include_pad) ||
      (!is_none(args, n, 6) && !int_arg(ctx, args, n, 6, op, "divisor_override", &divisor)) ||
      !tensor_arg(ctx, args, n, 7, op, "out", &y))
    return;
  if (stride_empty)
    for (int a = 0; a < 3; ++a) g.s[a] = g.k[a];
  if (!layout(ctx, op, x, y, nullptr, &g)) return;
  if (x.dtype != y.dtype || x.dtype == kBool ||
      !(x.dtype == kFloat32 || x.dtype == kFloat64 || is_integral(x.dtype, false))) {
    fail(ctx, "%s: self %s, out %s — valid: float32, float64 or integer, one dtype", op,
         dtype_name(x.dtype), dtype_name(y.dtype));
    return;
  }
  if (!check_geometry(ctx, op, &g, ceil_mode, true, itemsize(x.dtype))) return;
  if (y.numel == 0) return;
  dispatch_pool(x.dtype, [&](auto tag) { avg_pool<decltype(tag)>(g, x, y, include_pad, divisor); });
}

void avg_pool2d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  avg_pool_kernel(c, a, n, "aten::avg_pool2d.out", 2);
}
void avg_pool3d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  avg_pool_kernel(c, a, n, "aten::avg_pool3d.out", 3);
}

// --- adaptive pools -------------------------------------------------------------------------

inline int64_t bin_start(int64_t i, int64_t m, int64_t o) { return (i * m) / o; }
inline int64_t bin_end(int64_t i, int64_t m, int64_t o) { return ((i + 1) * m + o - 1) / o; }

template <typename T>
void adaptive(const Pool& g, const View& x, const View& y, const View* ind) {
  each_plane(x, g.lead, [&](int64_t t, int64_t xo) {
    const T* xp = x.ptr<T>() + xo;
    T* yp = y.ptr<T>() + plane_offset(y, g.lead, t);
    int64_t* ip = ind ? ind->ptr<int64_t>() + plane_offset(*ind, g.lead, t) : nullptr;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          int64_t o[3] = {od, oh, ow}, lo[3], hi[3], count = 1;
          for (int a = 0; a < 3; ++a) {
            lo[a] = bin_start(o[a], g.in[a], g.out[a]);
            hi[a] = bin_end(o[a], g.in[a], g.out[a]);
            count *= hi[a] - lo[a];
          }
          int64_t yo = od * g.ys[0] + oh * g.ys[1] + ow * g.ys[2];
          if (ind) {  // the maximum: ATen's scan from the bin's first element
            T best = xp[lo[0] * g.xs[0] + lo[1] * g.xs[1] + lo[2] * g.xs[2]];
            int64_t at = (lo[0] * g.in[1] + lo[1]) * g.in[2] + lo[2];
            for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0)
              for (int64_t i1 = lo[1]; i1 < hi[1]; ++i1)
                for (int64_t i2 = lo[2]; i2 < hi[2]; ++i2) {
                  T v = xp[i0 * g.xs[0] + i1 * g.xs[1] + i2 * g.xs[2]];
                  bool nan = false;
                  if constexpr (std::is_floating_point<T>::value) nan = v != v;
                  bool take = (v > best) | nan;  // selects (and | not ||), not branches: random data mispredicts
                  best = take ? v : best;
                  at = take ? (i0 * g.in[1] + i1) * g.in[2] + i2 : at;
                }
            yp[yo] = best;
            ip[od * g.is[0] + oh * g.is[1] + ow * g.is[2]] = at;
          } else {
            double total = 0;
            for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0)
              for (int64_t i1 = lo[1]; i1 < hi[1]; ++i1)
                for (int64_t i2 = lo[2]; i2 < hi[2]; ++i2)
                  total += static_cast<double>(xp[i0 * g.xs[0] + i1 * g.xs[1] + i2 * g.xs[2]]);
            yp[yo] = static_cast<T>(total / static_cast<double>(count));
          }
        }
  });
}

void adaptive_kernel(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op,
                     int spatial, bool max) {
  View x, y, ind;
  Pool g;
  g.spatial = spatial;
  int64_t size[3] = {1, 1, 1};
  if (!tensor_arg(ctx, args, n, 0, op, "self", &x) ||
      !param(ctx, op, args, n, 1, "output_size", spatial, false, size, nullptr) ||
      !tensor_arg(ctx, args, n, 2, op, "out", &y) ||
      (max && !tensor_arg(ctx, args, n, 3, op, "indices", &ind)))
    return;
  if (!layout(ctx, op, x, y, max ? &ind : nullptr, &g)) return;
  for (int a = 3 - spatial; a < 3; ++a)
    if (size[a] != g.out[a]) {
      fail(ctx, "%s: output_size entry %lld — the output tensor's spatial size is %lld — valid: "
           "the two equal — re-export the model; the program's parameters and tensors disagree",
           op, (long long)size[a], (long long)g.out[a]);
      return;
    }
  if (max ? !max_dtypes(ctx, op, x, y, ind)
          : (x.dtype != y.dtype || (x.dtype != kFloat32 && x.dtype != kFloat64))) {
    if (!max)
      fail(ctx, "%s: self %s, out %s — valid: float32 or float64, one dtype", op,
           dtype_name(x.dtype), dtype_name(y.dtype));
    return;
  }
  if (y.numel == 0) return;
  for (int a = 0; a < 3; ++a)
    if (g.in[a] == 0) {
      fail(ctx, "%s: an empty spatial dim in the input — valid: non-empty spatial dims (ATen "
           "refuses them too)", op);
      return;
    }
  dispatch_pool(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (max || std::is_floating_point<T>::value) adaptive<T>(g, x, y, max ? &ind : nullptr);
  });
}

void adaptive_avg2d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  adaptive_kernel(c, a, n, "aten::_adaptive_avg_pool2d.out", 2, false);
}
void adaptive_avg3d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  adaptive_kernel(c, a, n, "aten::_adaptive_avg_pool3d.out", 3, false);
}
void adaptive_max2d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  adaptive_kernel(c, a, n, "aten::adaptive_max_pool2d.out", 2, true);
}
void adaptive_max3d_out(opforge_context* c, opforge_arg* a, int64_t n) {
  adaptive_kernel(c, a, n, "aten::adaptive_max_pool3d.out", 3, true);
}

const KernelDef kPoolingKernels[] = {
    {"aten::max_pool2d_with_indices.out", "T IL IL IL IL B T! T!", max_pool2d_out},
    {"aten::max_pool3d_with_indices.out", "T IL IL IL IL B T! T!", max_pool3d_out},
    {"aten::avg_pool2d.out", "T IL IL IL B B I? T!", avg_pool2d_out},
    {"aten::avg_pool3d.out", "T IL IL IL B B I? T!", avg_pool3d_out},
    {"aten::_adaptive_avg_pool2d.out", "T IL T!", adaptive_avg2d_out},
    {"aten::_adaptive_avg_pool3d.out", "T IL T!", adaptive_avg3d_out},
    {"aten::adaptive_max_pool2d.out", "T IL T! T!", adaptive_max2d_out},
    {"aten::adaptive_max_pool3d.out", "T IL T! T!", adaptive_max3d_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(pooling, kPoolingKernels)
