// The arithmetic the quantize / dequantize kernels share (quantized.cpp: per tensor and per
// channel; quantized_affine.cpp: torchao's blocks), as the NumPy kernels of the same keys
// compute it (opforge/kernels/portable/quantized.py): NumPy's float precisions, its rounding
// and clipping, and its float -> integer cast on x86.
#pragma once

#include <cmath>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstring>

#include "portable.h"
#include "tensor.h"

namespace opforge::portable::quantized {

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
inline int32_t with_float32(int32_t d) { return d == kFloat64 ? kFloat64 : kFloat32; }
// np.result_type of two float dtypes.
inline int32_t promote(int32_t a, int32_t b) {
  if (a == kFloat64 || b == kFloat64) return kFloat64;
  if (a == kFloat32 || b == kFloat32) return kFloat32;
  if (a == b) return a;
  return kFloat32;  // float16 with bfloat16
}

inline bool float_out(opforge_context* ctx, const char* op, const View& out) {
  if (out.dtype == kFloat16 || out.dtype == kFloat32 || out.dtype == kFloat64) return true;
  fail(ctx, "%s: out — found dtype %s — valid: a float dtype — re-export the program", op,
       dtype_name(out.dtype));
  return false;
}

inline bool convertible_in(opforge_context* ctx, const char* op, const char* what, const View& v) {
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
inline double clip(double t, double lo, double hi) {
  if (std::isnan(t)) return t;
  return t < lo ? lo : t > hi ? hi : t;
}

// round half to even in precision p (np.rint)
inline double rint_in(const Precision& p, double t) { return p.round(rint_double(t)); }

// element i of a 1-d tensor
inline const char* element(const View& v, int64_t i) { return v.data + i * v.strides[0] * itemsize(v.dtype); }

}  // namespace opforge::portable::quantized
