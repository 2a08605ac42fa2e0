// float16 / bfloat16 rows to and from float32 (half.h): the vector paths and the scalar
// loops they must equal bit for bit (tests/backends/test_cpu_half_cache.py runs both).
#include "half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "engine.h"

namespace ofc {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bw,avx512vl"))) void f16_to_f32_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void f32_to_f16_avx512(const float* src, uint16_t* dst,
                                                                 int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
#define OFC_HALF_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#else
#define OFC_HALF_CLONES
#endif

// bfloat16: shifts and adds the compiler vectorizes (one clone per CPU level)
OFC_HALF_CLONES void bf16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

OFC_HALF_CLONES void f32_to_bf16_row(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

enum Level { SCALAR, F16C, AVX512 };

Level level() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const Level found = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                     __builtin_cpu_supports("avx512vl")
                                 ? AVX512
                             : __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx") ? F16C
                                                                                                : SCALAR;
  return found;
#else
  return SCALAR;
#endif
}

}  // namespace

bool half_vector_allowed() { return own_kernels_allowed() && level() != SCALAR; }

void half_to_f32(const uint16_t* src, float* dst, int64_t n, int32_t dtype, bool vector) {
  if (dtype == BF16) {
    if (vector) return bf16_to_f32_row(src, dst, n);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
    return;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  if (vector && level() == AVX512) return f16_to_f32_avx512(src, dst, n);
  if (vector && level() == F16C) return f16_to_f32_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void f32_to_half(const float* src, uint16_t* dst, int64_t n, int32_t dtype, bool vector) {
  if (dtype == BF16) {
    if (vector) return f32_to_bf16_row(src, dst, n);
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    return;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  if (vector && level() == AVX512) return f32_to_f16_avx512(src, dst, n);
  if (vector && level() == F16C) return f32_to_f16_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

}  // namespace ofc
