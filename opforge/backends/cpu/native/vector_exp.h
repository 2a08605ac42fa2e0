// exp(x) for x <= 0 on 16 lanes (AVX-512F) and on 8 (AVX2 + FMA), shared by the softmax op
// (softmax.cpp) and the one-pass attention kernels (attention_rows.cpp, attention_rows_avx2.cpp).
// x = n ln2 + r with n = round(x / ln2) and ln2 in two parts (Cody-Waite), so |r| <= ln2/2;
// e^r by Cephes' expf polynomial; times 2^n (vscalefps; on AVX2, which has no scalef, 2^n
// built in the exponent bits: n >= -126 there, a normal float). Below -87.33654 (exp under
// float32's smallest normal) and at -inf (a masked element) exactly 0, as torch gives; NaN
// gives 0 too (the kernels flag a NaN score themselves). Relative error against float64's exp
// at most 1.2e-7 (2^-23, one float ulp at the top of a binade), measured on every 7th float of
// [-87.33, 0] for each width; tests/backends/test_cpu_attention_rows.py reads softmax weights
// through both against float64.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace ofc {

__attribute__((target("avx512f"))) inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.33654f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lowest);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2's leading bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);      // and the rest
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f);
  const __m256 keep = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lowest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2's leading bits
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);      // and the rest
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n: n + 127 (1 .. 127) in the exponent field
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

}  // namespace ofc
#endif
