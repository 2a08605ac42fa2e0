// Vectorizable float32 math for the elementwise kernels' hot loops (exp, sigmoid, silu,
// GELU), with the C library's functions for everything else.
//
// # Design
//
// glibc's expf and erf are scalar calls the compiler cannot vectorize, and NumPy's own
// float32 exp is SIMD, so an exp-bound kernel on libm would be several times slower than
// the NumPy kernel it replaces. These are branch-free formulas in plain C++ (selects,
// integer bit operations on the exponent, no intrinsics) that GCC and Clang vectorize for
// any target; elementwise_math.cpp compiles their row loops with AVX2/AVX-512 clones on
// x86-64 and the baseline everywhere else.
//
// exp_f32: x = n ln2 + r by Cody-Waite (ln2 in two parts, the first with 9 significant
// bits so n * ln2_hi is exact for |n| <= 150), e^r on |r| <= ln2/2 as 1 + r + r^2 q(r)
// with q of degree 4 (least squares on Chebyshev points, like the GELU polynomials; one
// operation pair fewer than the degree-7 Taylor form, 10% faster), 2^n applied as two
// normal factors so that subnormal results round once. Measured against the correctly
// rounded exp on 3e6 points of [-104, 89]: <= 1 ulp (NumPy's SIMD expf: <= 2 ulp).
//
// gelu_erf_f32 computes x Phi(x) = x erfc(-t) / 2, t = x / sqrt(2) rounded to float32
// as the NumPy kernel rounds it, in float64 inside, rounding once: erfc(a) = 1 - a P(a^2)
// for |a| < 3/4 (P: degree 6, relative error 3e-11), else exp(-a^2) R(a) (R: degree 12 in
// u = 1 / (1 + a/2) rescaled to [-1, 1], relative error 2e-11; a^2 is exact in float64
// for a float32 a) and 2 - erfc(-a) for a < 0, 0 beyond |a| > 10.5 (erfc(10.5) < 1e-49).
// The coefficients were fitted by least squares to the standard library's erf / erfc at
// Chebyshev points (a one-off numpy.polynomial fit, not copied). Measured: <= 1 ulp from
// the exactly rounded x Phi(x) on 5e6 points of [-20, 20].
#pragma once

#include <cstdint>
#include <cstring>

namespace opforge::portable {

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline double bits_to_double(int64_t i) {
  double d;
  std::memcpy(&d, &i, 8);
  return d;
}
inline int64_t double_to_bits(double d) {
  int64_t i;
  std::memcpy(&i, &d, 8);
  return i;
}

inline float exp_f32(float x) {
  float xc = x < 88.8f ? x : 88.8f;  // above: inf anyway; NaN becomes 88.8 here, and
  xc = xc > -103.98f ? xc : -103.98f;  // below: 0 anyway      is put back at the end
  const float z = xc * 1.44269504088896341f;
  const float nf = (z + 12582912.0f) - 12582912.0f;  // round to nearest (|z| < 2^22)
  float r = xc - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float q = 0.001393368816934526f;  // e^r = 1 + r + r^2 q(r), q fitted (see above)
  q = q * r + 0.008363205008208752f;
  q = q * r + 0.041666463017463684f;
  q = q * r + 0.16666576266288757f;
  q = q * r + 0.5f;
  const float r2 = r * r;
  float p = r2 * q;
  p = p + r;
  p = p + 1.0f;
  const int32_t n = static_cast<int32_t>(nf);
  const int32_t n1 = n >> 1, n2 = n - n1;  // both in [-75, 64]: 2^n1, 2^n2 normal
  const float y = p * bits_to_float((n1 + 127) * (1 << 23)) * bits_to_float((n2 + 127) * (1 << 23));
  return x != x ? x : y;
}

// e^x in float64 for x in [-745, 0] to ~1e-13 relative (GELU's exp(-a^2), a <= 10.5).
inline double exp_neg_f64(double x) {
  const double z = x * 1.4426950408889634;
  const double k = z + 6755399441055744.0;  // 1.5 * 2^52: n in the low mantissa bits
  const int64_t n = double_to_bits(k) - double_to_bits(6755399441055744.0);
  const double nf = k - 6755399441055744.0;
  double r = x - nf * 0.6931471803691238;  // ln2 high part (exact products for |n| < 2^11)
  r = r - nf * 1.9082149292705877e-10;
  double p = 2.7557319223985893e-7;  // 1/10!
  p = p * r + 2.7557319223985888e-6;
  p = p * r + 2.4801587301587302e-5;
  p = p * r + 1.9841269841269841e-4;
  p = p * r + 1.3888888888888889e-3;
  p = p * r + 8.3333333333333333e-3;
  p = p * r + 4.1666666666666667e-2;
  p = p * r + 1.6666666666666667e-1;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return p * bits_to_double((n + 1023) * (int64_t(1) << 52));
}

// GELU, exact form, for one float32 (see above).
inline float gelu_erf_f32(float x) {
  const float t = x * 0.707106781186547524f;
  const double a = -static_cast<double>(t);
  const double abs_a = a < 0 ? -a : a;
  const double s = a * a;
  double P = 9.47299868542556e-05;
  P = P * s + -0.000835735651474887;
  P = P * s + 0.005216816650164866;
  P = P * s + -0.026864779737803005;
  P = P * s + 0.11283778747778365;
  P = P * s + -0.37612638451750985;
  P = P * s + 1.128379167069726;
  const double small = 1.0 - a * P;
  const double ac = abs_a < 10.5 ? abs_a : 10.5;
  const double u = (1.0 / (1.0 + 0.5 * ac) - 0.44363636363636366) * 3.5256410256410255;
  double R = -3.181022292352713e-09;
  R = R * u + 6.784647002974301e-08;
  R = R * u + -6.496793579969678e-08;
  R = R * u + -1.087512031530766e-06;
  R = R * u + 2.4553214532981643e-06;
  R = R * u + 1.6242785272673386e-05;
  R = R * u + -5.281442084304123e-05;
  R = R * u + -0.00036241893450677566;
  R = R * u + 0.0007732506149757584;
  R = R * u + 0.013953182368901201;
  R = R * u + 0.06929332097885683;
  R = R * u + 0.21311688872031292;
  R = R * u + 0.21019863067424457;
  double tail = exp_neg_f64(-(ac * ac)) * R;
  tail = abs_a > 10.5 ? 0.0 : tail;
  const double erfc = abs_a < 0.75 ? small : (a > 0 ? tail : 2.0 - tail);
  return static_cast<float>(static_cast<double>(x) * (0.5 * erfc));
}

// tanh for one float32: x + x^3 P(x^2) below |x| < 0.625 (P: degree 5, fitted like the GELU
// polynomials, relative error 6e-10), else 1 - 2 / (exp(2|x|) + 1), the sign put back.
// Measured: <= 1 ulp from the correctly rounded tanh on 2e6 points of [-12, 12] and
// 1e5 of [1e-30, 1] (glibc's tanhf is a scalar call, ~15 ns an element).
inline float tanh_f32(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, 4);
  const int32_t sign = bits & static_cast<int32_t>(0x80000000u);
  const float ax = bits_to_float(bits & 0x7fffffff);
  const float s = ax * ax;
  float P = 0.0022958414629101753f;
  P = P * s + -0.008346980437636375f;
  P = P * s + 0.021769961342215538f;
  P = P * s + -0.05395940691232681f;
  P = P * s + 0.13333304226398468f;
  P = P * s + -0.3333333432674408f;
  const float cube = ax * s;
  const float small = ax + cube * P;
  const float e = exp_f32(2.0f * ax);
  const float big = 1.0f - 2.0f / (e + 1.0f);
  const float y = ax < 0.625f ? small : big;  // NaN: big is NaN
  int32_t ybits;
  std::memcpy(&ybits, &y, 4);
  return bits_to_float(ybits | sign);
}

// Row functions over contiguous float32 (elementwise_math.cpp; vectorized, cloned).
void exp_row_f32(float* out, const float* in, int64_t n);
void tanh_row_f32(float* out, const float* in, int64_t n);
void sigmoid_row_f32(float* out, const float* in, int64_t n);
void silu_row_f32(float* out, const float* in, int64_t n);
void gelu_erf_row_f32(float* out, const float* in, int64_t n);
void gelu_tanh_row_f32(float* out, const float* in, int64_t n);

// float32 binary arithmetic and comparisons over one row: a and b contiguous (step 1) or
// one value for the whole row (step 0). The loops of elementwise.h's BinaryRow, compiled
// once here for the common float32 case.
enum class RowOp : int { kAdd, kSub, kMul, kDiv, kMax, kMin };
enum class RowCmp : int { kEq, kNe, kLt, kLe, kGt, kGe };
void binary_row_f32(RowOp op, float* out, const float* a, int64_t step_a, const float* b,
                    int64_t step_b, int64_t n);
void compare_row_f32(RowCmp op, bool* out, const float* a, int64_t step_a, const float* b,
                     int64_t step_b, int64_t n);

}  // namespace opforge::portable
