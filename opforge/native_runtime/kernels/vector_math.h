// Vectorised loops over contiguous float32 rows shared by the softmax, normalisation and
// reduction kernels: exp, maximum, sums (vector_math.cpp). GCC does not vectorise these
// loops by itself (a float sum needs reassociation; exp's selects are control flow to its
// vectoriser), and the kernels build for the baseline ISA, so vector_math_arch.h writes
// them with GCC vector extensions and vector_math.cpp compiles it for avx512f, avx2 and
// the build's own target (SSE2 on any x86-64, NEON on aarch64), picking the widest the
// CPU has on the first call — the way gemm.cpp does.
//
// exp: Cody-Waite range reduction (x = n ln2 + r) and Cephes' degree-6 polynomial for
// e^r, scaled by 2^n in two halves (n up to 128 near the overflow bound): within 1 ulp of
// the correctly rounded value over the whole float range, subnormals included (measured
// 0.96 ulp), 0 below -104, inf above the overflow bound, NaN for NaN. The kernels build
// without floating-point contraction, so every instruction set computes the same bits.
//
// Sums keep 16 partial sums (element i in sum i mod 16, whatever the vector width)
// added pairwise at the end, so they too give the same bits on every instruction set, and
// are about as exact as NumPy's pairwise float32 sum (8 partial sums per block of 128),
// though not bit for bit the same.
#pragma once

#include <cstdint>

namespace opforge::portable::vec {

// exp(x) as the vector loops compute it (for single values and tails).
float exp(float x);
// The maximum of x[0..n) (n >= 1); NaN if any element is NaN.
float max(const float* x, int64_t n);
// y[i] = exp(x[i] - shift) for i in [0, n); returns their sum (y may be x).
float exp_shifted(const float* x, float shift, float* y, int64_t n);
// The sum of x[0..n), and of (x[i] - c)^2.
float sum(const float* x, int64_t n);
float sum_sq_centered(const float* x, float c, int64_t n);

}  // namespace opforge::portable::vec
