// Quantize / dequantize (quantized_decomposed, torchao): the NumPy kernels of the same keys
// (opforge/kernels/portable/quantized.py) bit for bit, in their arithmetic order and float
// precision:
//   quantize    clamp(rint(C(x) * C(1 / scale)) + C(zero_point), qmin, qmax) cast to out,
//               C = float32 per tensor (1 / scale in double, rounded to float32), per
//               channel / block the promotion of float32 and the scales' dtype;
//   dequantize  per tensor (F(q) - F(zp)) * F(scale), F = out's float dtype; per channel
//               C(int64(q) - int64(zp)) * C(scale); per block P(F(q) - F(zp)) * P(scale),
//               P = the promotion of F and the scales' dtype.
// float16 arithmetic is NumPy's: each operation in float32, rounded to float16.
#include <cmath>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstring>
#include <vector>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

// Arithmetic in one of NumPy's float dtypes: values carried as double, rounded to the
// dtype after every operation (float16 via float32, as NumPy computes it).
struct Precision {
  int32_t dtype;
  double round(double v) const {
    switch (dtype) {
      case kFloat32: return static_cast<float>(v);
      case kFloat16: return half_to_float(double_to_half(v));
      case kBFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
      default: return v;
    }
  }
  double sub(double a, double b) const { return dtype == kFloat16 ? round(static_cast<float>(a) - static_cast<float>(b)) : round(a - b); }
  double mul(double a, double b) const { return dtype == kFloat16 ? round(static_cast<float>(a) * static_cast<float>(b)) : round(a * b); }
  double div(double a, double b) const { return dtype == kFloat16 ? round(static_cast<float>(a) / static_cast<float>(b)) : round(a / b); }
};

// np.result_type(float32, d) for a float d: float64 stays, the rest give float32.
int32_t with_float32(int32_t d) { return d == kFloat64 ? kFloat64 : kFloat32; }
// np.result_type of two float dtypes.
int32_t promote(int32_t a, int32_t b) {
  if (a == kFloat64 || b == kFloat64) return kFloat64;
  if (a == kFloat32 || b == kFloat32) return kFloat32;
  if (a == b) return a;
  return kFloat32;  // float16 with bfloat16
}

bool float_out(opforge_context* ctx, const char* op, const View& out) {
  if (out.dtype == kFloat16 || out.dtype == kFloat32 || out.dtype == kFloat64) return true;
  fail(ctx, "%s: out — found dtype %s — valid: a float dtype — re-export the program", op,
       dtype_name(out.dtype));
  return false;
}

bool convertible_in(opforge_context* ctx, const char* op, const char* what, const View& v) {
  if (convertible(v.dtype)) return true;
  fail(ctx, "%s: %s — found dtype %s — valid: a real dtype", op, what, dtype_name(v.dtype));
  return false;
}

// Round half to even without the C library (x86-64's baseline has no roundss, and
// nearbyint is a call): adding and subtracting 1.5 * 2^23 rounds a float below 2^22 in
// magnitude to an integer in the default rounding mode; larger ones already are integers
// (inf and NaN pass). The sign is put back, as rint gives -0.0 for -0.3.
inline float rint_float(float t) {
  if (!(std::fabs(t) < 4194304.0f)) return t;
  return std::copysign((t + 12582912.0f) - 12582912.0f, t);
}
inline double rint_double(double t) {
  if (!(std::fabs(t) < 2251799813685248.0)) return t;
  return std::copysign((t + 6755399441055744.0) - 6755399441055744.0, t);
}

// float -> integer as NumPy's cast on x86 (through a truncating int32 conversion)
template <typename Q>
inline Q to_int(float t) {
  return static_cast<Q>(t > -2147483649.0f && t < 2147483648.0f ? static_cast<int32_t>(t) : INT32_MIN);
}

// quantize_run in portable C++ without a branch (compilers vectorize it): rint_float's trick
// picked by a test on the bits (only a zero's sign differs, which no integer keeps), the
// clamp as selects (a NaN fails both), a NaN mapped to -2^31, which the int32 conversion
// turns into INT32_MIN as to_int does. Exact when lo and hi are in int32's range (every
// clamped value then is); else the scalar loop. Kept out of line: inlined into
// quantize_per_tensor_out's switch, GCC left it scalar.
template <typename Q>
#if defined(__GNUC__)
__attribute__((noinline))
#endif
void quantize_loop(const float* x, Q* out, int64_t n, float inverse, float zp, float lo, float hi) {
  const bool in_int32 = lo >= -2147483648.0f && lo < 2147483648.0f && hi >= -2147483648.0f &&
                        hi < 2147483648.0f;
  if (!in_int32) {
    for (int64_t i = 0; i < n; ++i) {
      float t = rint_float(x[i] * inverse) + zp;
      t = t < lo ? lo : t;
      t = t > hi ? hi : t;
      out[i] = to_int<Q>(t);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    float t = x[i] * inverse;
    float r = (t + 12582912.0f) - 12582912.0f;
    uint32_t tb, rb;
    std::memcpy(&tb, &t, 4);
    std::memcpy(&rb, &r, 4);
    const uint32_t small = (tb & 0x7fffffffu) < 0x4a800000u ? 0xffffffffu : 0u;  // |t| < 2^22
    const uint32_t picked = (rb & small) | (tb & ~small);
    std::memcpy(&t, &picked, 4);
    t = t + zp;
    t = t < lo ? lo : t;  // np.clip's order: hi wins over a lo > hi
    t = t > hi ? hi : t;
    t = t == t ? t : -2147483648.0f;
    out[i] = static_cast<Q>(static_cast<int32_t>(t));
  }
}

// One run of float32 values quantized to integers with one inverse scale and zero point:
// rint(x * inverse) + zp clamped to [lo, hi] (NaN kept), cast as to_int does (a truncating
// int32 conversion, then its low bytes). 8-bit outs with SSE2 (x86-64's baseline) 16 at a
// time: cvtps rounds half to even in the default mode (exact below 2^23; larger floats are
// integers already), max/min take the bound only when the comparison holds (a NaN stays),
// cvttps gives INT32_MIN for NaN and out-of-range values as the scalar path does; the sign
// of a zero does not reach an integer. The rest through quantize_loop.
template <typename Q>
void quantize_run(const float* x, Q* out, int64_t n, float inverse, float zp, float lo, float hi) {
  int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (sizeof(Q) == 1) {
    const __m128 vinv = _mm_set1_ps(inverse), vzp = _mm_set1_ps(zp), vlo = _mm_set1_ps(lo),
                 vhi = _mm_set1_ps(hi), big = _mm_set1_ps(8388608.0f);
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128i low_byte = _mm_set1_epi32(0xff);
    auto one = [&](const float* p) {
      __m128 t = _mm_mul_ps(_mm_loadu_ps(p), vinv);
      __m128 r = _mm_cvtepi32_ps(_mm_cvtps_epi32(t));
      __m128 small = _mm_cmplt_ps(_mm_and_ps(t, abs_mask), big);
      t = _mm_or_ps(_mm_and_ps(small, r), _mm_andnot_ps(small, t));
      t = _mm_add_ps(t, vzp);
      t = _mm_max_ps(vlo, t);
      t = _mm_min_ps(vhi, t);
      return _mm_and_si128(_mm_cvttps_epi32(t), low_byte);
    };
    for (; i + 16 <= n; i += 16) {
      __m128i a = _mm_packs_epi32(one(x + i), one(x + i + 4));
      __m128i b = _mm_packs_epi32(one(x + i + 8), one(x + i + 12));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(a, b));
    }
  }
#endif
  quantize_loop(x + i, out + i, n - i, inverse, zp, lo, hi);
}

// clamp as np.clip: NaN stays NaN
double clip(double t, double lo, double hi) {
  if (std::isnan(t)) return t;
  return t < lo ? lo : t > hi ? hi : t;
}

// round half to even in precision p (np.rint)
double rint_in(const Precision& p, double t) { return p.round(rint_double(t)); }

void quantize_per_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::quantize_per_tensor.out";
  OPF_TENSOR(0, "input", x);
  double scale;
  if (!double_arg(ctx, args, n, 1, kOp, "scale", &scale)) return;
  OPF_INT(2, "zero_point", zero_point);
  OPF_INT(3, "quant_min", qmin);
  OPF_INT(4, "quant_max", qmax);
  OPF_TENSOR(6, "out", out);
  if (!check_shape(ctx, kOp, out, x.sizes, x.rank) || !convertible_in(ctx, kOp, "input", x) ||
      !convertible_in(ctx, kOp, "out", out))
    return;
  const float inverse = static_cast<float>(1.0 / scale), zp = static_cast<float>(zero_point);
  const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
  auto one = [&](float v) {
    float t = rint_float(v * inverse) + zp;
    t = t < lo ? lo : t;  // np.clip's order (a NaN stays)
    return t > hi ? hi : t;
  };
  if (x.dense && out.dense && x.dtype == kFloat32) {  // the common cases
    const float* px = x.ptr<float>();
    switch (out.dtype) {
      case kInt8: quantize_run(px, out.ptr<int8_t>(), x.numel, inverse, zp, lo, hi); return;
      case kUInt8: quantize_run(px, out.ptr<uint8_t>(), x.numel, inverse, zp, lo, hi); return;
      case kInt16: quantize_run(px, out.ptr<int16_t>(), x.numel, inverse, zp, lo, hi); return;
      case kInt32: quantize_run(px, out.ptr<int32_t>(), x.numel, inverse, zp, lo, hi); return;
      default: break;
    }
  }
  for_each_element(x, out, [&](char* px, char* po, const int64_t*) {
    store_double(po, out.dtype, one(static_cast<float>(load_double(px, x.dtype))));
  });
}

void dequantize_per_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::dequantize_per_tensor.out";
  OPF_TENSOR(0, "input", q);
  double scale;
  if (!double_arg(ctx, args, n, 1, kOp, "scale", &scale)) return;
  OPF_INT(2, "zero_point", zero_point);
  OPF_TENSOR(7, "out", out);
  if (!check_shape(ctx, kOp, out, q.sizes, q.rank) || !float_out(ctx, kOp, out) ||
      !convertible_in(ctx, kOp, "input", q))
    return;
  if (q.dense && out.dense && out.dtype == kFloat32) {  // the common cases, in float32
    // the generic loop's bits: its doubles are float32 values (float(q) rounds an int32 once,
    // directly or through double), and a float32 - or * done in double and rounded is float32's
    const float zp = static_cast<float>(static_cast<double>(zero_point)), s = static_cast<float>(scale);
    float* po = out.ptr<float>();
    auto run = [&](auto t) {
      using Q = decltype(t);
      const Q* pq = q.ptr<Q>();
      for (int64_t i = 0; i < q.numel; ++i) po[i] = (static_cast<float>(pq[i]) - zp) * s;
    };
    switch (q.dtype) {
      case kInt8: run(int8_t{}); return;
      case kUInt8: run(uint8_t{}); return;
      case kInt16: run(int16_t{}); return;
      case kUInt16: run(uint16_t{}); return;
      case kInt32: run(int32_t{}); return;
      default: break;
    }
  }
  Precision p{out.dtype};
  const double zp = p.round(static_cast<double>(zero_point)), s = p.round(scale);
  for_each_element(q, out, [&](char* pq, char* po, const int64_t*) {
    double t = p.round(load_double(pq, q.dtype));  // q.astype(out dtype)
    store_double(po, out.dtype, p.mul(p.sub(t, zp), s));
  });
}

// scales / zero points of a per-channel op: 1-d, `channels` of them, matching axis's size
// (or 1, which broadcasts as in NumPy).
bool channel_params(opforge_context* ctx, const char* op, const View& x, int64_t axis,
                    const View& scales, int64_t* dim) {
  if (x.rank == 0 || !wrap_dim(ctx, op, axis, x.rank, dim)) {
    if (x.rank == 0) fail(ctx, "%s: input — found a 0-d tensor — valid: rank >= 1", op);
    return false;
  }
  int64_t channels = scales.numel;
  if (scales.rank != 1 || (channels != x.sizes[*dim] && channels != 1)) {
    fail(ctx, "%s: scales — found %lld of rank %d for axis %lld of size %lld — valid: one per "
         "channel, 1-d — re-export the program", op, (long long)channels, scales.rank,
         (long long)*dim, (long long)x.sizes[*dim]);
    return false;
  }
  return true;
}

const char* element(const View& v, int64_t i) { return v.data + i * v.strides[0] * itemsize(v.dtype); }

void quantize_per_channel_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::quantize_per_channel.out";
  OPF_TENSOR(0, "input", x);
  OPF_TENSOR(1, "scales", scales);
  OPF_TENSOR(2, "zero_points", zps);
  OPF_INT(3, "axis", axis);
  OPF_INT(4, "quant_min", qmin);
  OPF_INT(5, "quant_max", qmax);
  OPF_TENSOR(7, "out", out);
  int64_t dim;
  if (!check_shape(ctx, kOp, out, x.sizes, x.rank) || !channel_params(ctx, kOp, x, axis, scales, &dim))
    return;
  if (zps.numel != scales.numel || !is_floating(scales.dtype) || !convertible_in(ctx, kOp, "input", x) ||
      !convertible_in(ctx, kOp, "zero_points", zps) || !convertible_in(ctx, kOp, "out", out)) {
    if (ctx->status == 0)
      fail(ctx, "%s: scales and zero_points — found %lld scales (%s) and %lld zero points — "
           "valid: float scales, one zero point per scale — re-export the program", kOp,
           (long long)scales.numel, dtype_name(scales.dtype), (long long)zps.numel);
    return;
  }
  Precision c{with_float32(scales.dtype)};
  std::vector<double> inverse(scales.numel), zp(scales.numel);
  for (int64_t k = 0; k < scales.numel; ++k) {
    inverse[k] = c.div(1.0, c.round(load_double(element(scales, k), scales.dtype)));
    zp[k] = c.round(load_double(element(zps, k), zps.dtype));
  }
  const double lo = c.round(static_cast<double>(qmin)), hi = c.round(static_cast<double>(qmax));
  const bool broadcast = scales.numel == 1;
  if (x.dense && out.dense && x.dtype == kFloat32 && c.dtype == kFloat32 &&
      (out.dtype == kInt8 || out.dtype == kUInt8)) {  // the common case, in float32
    int64_t outer = 1, inner = 1, channels = x.sizes[dim];
    for (int k = 0; k < dim; ++k) outer *= x.sizes[k];
    for (int k = dim + 1; k < x.rank; ++k) inner *= x.sizes[k];
    const float* px = x.ptr<float>();
    const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
    auto run = [&](auto q) {
      using Q = decltype(q);
      Q* po = out.ptr<Q>();
      for (int64_t o = 0, e = 0; o < outer; ++o)
        for (int64_t ch = 0; ch < channels; ++ch) {
          int64_t k = broadcast ? 0 : ch;
          quantize_run(px + e, po + e, inner, static_cast<float>(inverse[k]), static_cast<float>(zp[k]), flo, fhi);
          e += inner;
        }
    };
    if (out.dtype == kInt8) run(int8_t{});
    else run(uint8_t{});
    return;
  }
  for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
    int64_t k = broadcast ? 0 : idx[dim];
    double t = c.mul(c.round(load_double(px, x.dtype)), inverse[k]);
    t = c.round(rint_in(c, t) + zp[k]);
    store_double(po, out.dtype, clip(t, lo, hi));
  });
}

void dequantize_per_channel_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::dequantize_per_channel.out";
  OPF_TENSOR(0, "input", q);
  OPF_TENSOR(1, "scales", scales);
  View zps;
  bool has_zp;
  if (!optional_tensor_arg(ctx, args, n, 2, kOp, "zero_points", &zps, &has_zp)) return;
  OPF_INT(3, "axis", axis);
  OPF_TENSOR(8, "out", out);
  int64_t dim;
  if (!check_shape(ctx, kOp, out, q.sizes, q.rank) || !float_out(ctx, kOp, out) ||
      !channel_params(ctx, kOp, q, axis, scales, &dim) || !convertible_in(ctx, kOp, "input", q))
    return;
  if ((has_zp && (zps.numel != scales.numel || !convertible_in(ctx, kOp, "zero_points", zps))) ||
      !is_floating(scales.dtype)) {
    if (ctx->status == 0)
      fail(ctx, "%s: scales and zero_points — found %lld scales (%s) and %lld zero points — "
           "valid: float scales, one zero point per scale — re-export the program", kOp,
           (long long)scales.numel, dtype_name(scales.dtype), (long long)zps.numel);
    return;
  }
  Precision c{with_float32(scales.dtype)};
  const bool broadcast = scales.numel == 1;
  if (q.dense && out.dense && (q.dtype == kInt8 || q.dtype == kUInt8) && out.dtype == kFloat32 &&
      c.dtype == kFloat32) {  // the common case, in float32
    int64_t outer = 1, inner = 1, channels = q.sizes[dim];
    for (int k = 0; k < dim; ++k) outer *= q.sizes[k];
    for (int k = dim + 1; k < q.rank; ++k) inner *= q.sizes[k];
    float* po = out.ptr<float>();
    auto run = [&](auto t) {
      using Q = decltype(t);
      const Q* pq = q.ptr<Q>();
      for (int64_t o = 0, e = 0; o < outer; ++o)
        for (int64_t ch = 0; ch < channels; ++ch) {
          int64_t k = broadcast ? 0 : ch;
          const float s = static_cast<float>(load_double(element(scales, k), scales.dtype));
          const int64_t z = has_zp ? static_cast<int64_t>(std::trunc(load_double(element(zps, k), zps.dtype))) : 0;
          if (z > -(int64_t(1) << 30) && z < (int64_t(1) << 30)) {  // q - z exact in int32: vectorizes
            const int32_t z32 = static_cast<int32_t>(z);
            for (int64_t i = 0; i < inner; ++i) po[e + i] = static_cast<float>(static_cast<int32_t>(pq[e + i]) - z32) * s;
            e += inner;
          } else {
            for (int64_t i = 0; i < inner; ++i, ++e)
              po[e] = static_cast<float>(static_cast<int64_t>(pq[e]) - z) * s;
          }
        }
    };
    if (q.dtype == kInt8) run(int8_t{});
    else run(uint8_t{});
    return;
  }
  for_each_element(q, out, [&](char* pq, char* po, const int64_t* idx) {
    int64_t k = broadcast ? 0 : idx[dim];
    double s = c.round(load_double(element(scales, k), scales.dtype)), t;
    if (has_zp) {
      // int64(q) - int64(zp), then to the compute dtype
      int64_t a = static_cast<int64_t>(load_double(pq, q.dtype));
      int64_t b = static_cast<int64_t>(std::trunc(load_double(element(zps, k), zps.dtype)));
      t = c.round(static_cast<double>(a - b));
    } else {
      t = c.round(load_double(pq, q.dtype));
    }
    store_double(po, out.dtype, c.mul(t, s));
  });
}

// torchao's block layout (quantized.py reduction_shape): per dim, the scale index of a
// coordinate is c / block (blocked), c (block 1), or 0 (one block).
struct Blocks {
  int rank = 0;
  int64_t block[kMaxRank];
  int64_t mode[kMaxRank];  // 0: one block, 1: per element, 2: blocked
  int64_t mult[kMaxRank];  // the scale tensor's row-major multipliers
  int64_t count = 1;       // scales expected
  std::vector<int64_t> table[kMaxRank];  // per dim: each coordinate's share of the index
  void tabulate(const int64_t* sizes) {
    for (int d = 0; d < rank; ++d) {
      table[d].resize(static_cast<size_t>(sizes[d]));
      for (int64_t c = 0; c < sizes[d]; ++c)
        table[d][c] = mode[d] == 0 ? 0 : (mode[d] == 2 ? c / block[d] : c) * mult[d];
    }
  }
  int64_t index(const int64_t* c) const {
    int64_t k = 0;
    for (int d = 0; d < rank; ++d) k += table[d][c[d]];
    return k;
  }
};

bool blocks_of(opforge_context* ctx, const char* op, const View& x, const int64_t* block_size,
               int64_t count, Blocks* b) {
  if (count != x.rank) {
    fail(ctx, "%s: block_size — has %lld entries — valid: one per dimension of the rank-%d "
         "input — re-export the program", op, (long long)count, x.rank);
    return false;
  }
  b->rank = x.rank;
  int64_t dims[kMaxRank];
  for (int d = 0; d < x.rank; ++d) {
    int64_t block = block_size[d], size = x.sizes[d];
    b->block[d] = block;
    if (block != size && block > 1) {
      if (size % block) {
        fail(ctx, "%s: block_size — block %lld does not divide size %lld of dim %d — "
             "re-export the program", op, (long long)block, (long long)size, d);
        return false;
      }
      b->mode[d] = 2, dims[d] = size / block;
    } else if (block == 1 && size != 1) {
      b->mode[d] = 1, dims[d] = size;
    } else {
      b->mode[d] = 0, dims[d] = 1;
    }
  }
  int64_t m = 1;
  for (int d = x.rank - 1; d >= 0; --d) b->mult[d] = m, m *= dims[d];
  b->count = m;
  b->tabulate(x.sizes);
  return true;
}

// scale / zero point tensors: row-major, as many elements as the blocks
bool block_params(opforge_context* ctx, const char* op, const char* what, const View& v,
                  const Blocks& b) {
  if (v.numel != b.count || !v.dense || !convertible(v.dtype)) {
    fail(ctx, "%s: %s — found %lld elements (%s%s) — valid: %lld, one per block, contiguous — "
         "re-export the program", op, what, (long long)v.numel, dtype_name(v.dtype),
         v.dense ? "" : ", strided", (long long)b.count);
    return false;
  }
  return true;
}

// For dense tensors: f(element offset, run length, block index) for each run of the last
// dim that shares one scale.
template <typename F>
void block_runs(const View& x, const Blocks& b, F&& f) {
  if (x.numel == 0) return;
  int last = x.rank - 1;
  int64_t len = x.rank ? x.sizes[last] : 1, idx[kMaxRank] = {};
  struct Run { int64_t start, length, k; };
  std::vector<Run> runs;  // the last dim's runs, the same in every row
  for (int64_t c = 0; c < len;) {
    int64_t k = x.rank ? b.table[last][c] : 0, end = c + 1;
    while (end < len && b.table[last][end] == k) ++end;
    runs.push_back(Run{c, end - c, k});
    c = end;
  }
  for (int64_t e = 0; e < x.numel; e += len) {
    int64_t base = 0;
    for (int d = 0; d < last; ++d) base += b.table[d][idx[d]];
    for (const Run& r : runs) f(e + r.start, r.length, base + r.k);
    for (int d = last - 1; d >= 0; --d) {
      if (++idx[d] < x.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

const char* flat(const View& v, int64_t k) { return v.data + k * itemsize(v.dtype); }

void quantize_affine_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "torchao::quantize_affine.out";
  OPF_TENSOR(0, "input", x);
  OPF_INTS(1, "block_size", block_size, count);
  OPF_TENSOR(2, "scale", scale);
  View zp;
  bool has_zp;
  if (!optional_tensor_arg(ctx, args, n, 3, kOp, "zero_point", &zp, &has_zp)) return;
  OPF_TENSOR(7, "out", out);
  Blocks b;
  if (!check_shape(ctx, kOp, out, x.sizes, x.rank) || !blocks_of(ctx, kOp, x, block_size, count, &b) ||
      !block_params(ctx, kOp, "scale", scale, b) || !convertible_in(ctx, kOp, "input", x) ||
      !convertible_in(ctx, kOp, "out", out))
    return;
  has_zp = has_zp && zp.numel > 0;
  if (has_zp && !block_params(ctx, kOp, "zero_point", zp, b)) return;
  double lo, hi;
  int64_t ilo = 0, ihi = 0;
  bool integral = true;
  if (!is_integral(out.dtype, false) && (is_none(args, n, 5) || is_none(args, n, 6))) {
    fail(ctx, "%s: quant_min / quant_max — None for a %s out — valid: given, or an integer "
         "out — re-export the program", kOp, dtype_name(out.dtype));
    return;
  }
  switch (out.dtype) {
    case kInt8: lo = INT8_MIN, hi = INT8_MAX; break;
    case kUInt8: lo = 0, hi = UINT8_MAX; break;
    case kInt16: lo = INT16_MIN, hi = INT16_MAX; break;
    case kUInt16: lo = 0, hi = UINT16_MAX; break;
    case kInt32: lo = INT32_MIN, hi = INT32_MAX; break;
    case kUInt32: lo = 0, hi = UINT32_MAX; break;
    case kUInt64: lo = 0, hi = 18446744073709551615.0; break;
    default: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;  // int64
  }
  if (!is_none(args, n, 5)) {
    if (!scalar_arg(ctx, args, n, 5, kOp, "quant_min", &lo, &ilo, &integral)) return;
  }
  if (!is_none(args, n, 6)) {
    if (!scalar_arg(ctx, args, n, 6, kOp, "quant_max", &hi, &ihi, &integral)) return;
  }
  Precision c{with_float32(is_floating(scale.dtype) ? scale.dtype : kFloat32)};
  lo = c.round(lo), hi = c.round(hi);
  std::vector<double> inverse(b.count), zero(b.count, 0.0);
  for (int64_t k = 0; k < b.count; ++k) {
    inverse[k] = c.div(1.0, c.round(load_double(flat(scale, k), scale.dtype)));
    if (has_zp) zero[k] = c.round(load_double(flat(zp, k), zp.dtype));
  }
  if (x.dtype == kFloat32 && c.dtype == kFloat32 && (out.dtype == kInt8 || out.dtype == kUInt8)) {
    std::vector<float> finv(inverse.begin(), inverse.end()), fzero(zero.begin(), zero.end());
    const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
    auto one = [&](float v, int64_t k) {
      float t = rint_float(v * finv[k]);
      if (has_zp) t = t + fzero[k];
      return std::isnan(t) ? t : t < flo ? flo : t > fhi ? fhi : t;
    };
    if (x.dense && out.dense) {  // runs of one scale through the vector loop
      const float* px = x.ptr<float>();
      block_runs(x, b, [&](int64_t at, int64_t len, int64_t k) {
        if (out.dtype == kInt8) quantize_run(px + at, out.ptr<int8_t>() + at, len, finv[k], fzero[k], flo, fhi);
        else quantize_run(px + at, out.ptr<uint8_t>() + at, len, finv[k], fzero[k], flo, fhi);
      });
      return;
    }
    if (out.dtype == kInt8)
      for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
        float v;
        std::memcpy(&v, px, 4);
        *reinterpret_cast<int8_t*>(po) = to_int<int8_t>(one(v, b.index(idx)));
      });
    else
      for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
        float v;
        std::memcpy(&v, px, 4);
        *reinterpret_cast<uint8_t*>(po) = to_int<uint8_t>(one(v, b.index(idx)));
      });
    return;
  }
  for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
    int64_t k = b.index(idx);
    double t = rint_in(c, c.mul(c.round(load_double(px, x.dtype)), inverse[k]));
    if (has_zp) t = c.round(t + zero[k]);
    store_double(po, out.dtype, clip(t, lo, hi));
  });
}

void dequantize_affine_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "torchao::dequantize_affine.out";
  OPF_TENSOR(0, "input", q);
  OPF_INTS(1, "block_size", block_size, count);
  OPF_TENSOR(2, "scale", scale);
  View zp;
  bool has_zp;
  if (!optional_tensor_arg(ctx, args, n, 3, kOp, "zero_point", &zp, &has_zp)) return;
  OPF_TENSOR(8, "out", out);
  Blocks b;
  if (!check_shape(ctx, kOp, out, q.sizes, q.rank) || !float_out(ctx, kOp, out) ||
      !blocks_of(ctx, kOp, q, block_size, count, &b) || !block_params(ctx, kOp, "scale", scale, b) ||
      !convertible_in(ctx, kOp, "input", q) || (has_zp && !block_params(ctx, kOp, "zero_point", zp, b)))
    return;
  Precision f{out.dtype};
  Precision p{promote(out.dtype, is_floating(scale.dtype) ? scale.dtype : out.dtype)};
  std::vector<double> scales(b.count), zero(b.count, 0.0);
  for (int64_t k = 0; k < b.count; ++k) {
    scales[k] = load_double(flat(scale, k), scale.dtype);
    if (has_zp) zero[k] = f.round(load_double(flat(zp, k), zp.dtype));
  }
  if ((q.dtype == kInt8 || q.dtype == kUInt8) && out.dtype == kFloat32 && p.dtype == kFloat32) {
    std::vector<float> fs(scales.begin(), scales.end()), fz(zero.begin(), zero.end());
    auto run = [&](auto t) {
      using Q = decltype(t);
      if (q.dense && out.dense) {  // runs of one scale
        const Q* pq = q.ptr<Q>();
        float* po = out.ptr<float>();
        block_runs(q, b, [&](int64_t at, int64_t len, int64_t k) {
          const float z = fz[k], sc = fs[k];
          for (int64_t i = at; i < at + len; ++i) {
            float v = static_cast<float>(pq[i]);
            if (has_zp) v = v - z;
            po[i] = v * sc;
          }
        });
        return;
      }
      for_each_element(q, out, [&](char* pq, char* po, const int64_t* idx) {
        int64_t k = b.index(idx);
        float v = static_cast<float>(*reinterpret_cast<const Q*>(pq));
        if (has_zp) v = v - fz[k];
        v = v * fs[k];
        std::memcpy(po, &v, 4);
      });
    };
    if (q.dtype == kInt8) run(int8_t{});
    else run(uint8_t{});
    return;
  }
  for_each_element(q, out, [&](char* pq, char* po, const int64_t* idx) {
    int64_t k = b.index(idx);
    double t = f.round(load_double(pq, q.dtype));
    if (has_zp) t = f.sub(t, zero[k]);
    store_double(po, out.dtype, f.round(p.mul(t, scales[k])));
  });
}

const KernelDef kQuantizedKernels[] = {
    {"quantized_decomposed::quantize_per_tensor.out", "T D I I I ST T!", quantize_per_tensor_out},
    {"quantized_decomposed::dequantize_per_tensor.out", "T D I I I ST ST? T!", dequantize_per_tensor_out},
    {"quantized_decomposed::quantize_per_channel.out", "T T T I I I ST T!", quantize_per_channel_out},
    {"quantized_decomposed::dequantize_per_channel.out", "T T T? I I I ST ST? T!", dequantize_per_channel_out},
    {"torchao::quantize_affine.out", "T IL T T? ST S? S? T!", quantize_affine_out},
    {"torchao::dequantize_affine.out", "T IL T T? ST S? S? ST T!", dequantize_affine_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(quantized, kQuantizedKernels)
