// The copy op's own vector kernels (copy.cpp picks them at prepare): 8×8 transposes of
// 4-byte elements, and the interleaves that turn a few planes into one channels-last row
// (an image's NCHW → NHWC at a convolution delegate's input, 3 channels). The callers pass
// walks the copy contract checked: every index below lies inside them.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstdint>

#include "engine.h"

namespace ofc {

#if defined(__x86_64__)
// out[j·so + i] = in[j + i·si] for j < nj, i < ni (4-byte elements): 8×8 tiles through
// AVX2 registers (eight rows of eight read along j, unpacked and permuted into eight rows
// along i), the edges one element at a time. The NCHW↔NHWC copies at a convolution
// delegate's boundary, before → after: [1, 16, 16, 16] in 1.36 → 0.31 µs and
// [1, 32, 16, 16] out 2.36 → 0.62 µs (oneDNN's reorder), [1, 32, 8, 8] out 1.5 → 0.17 µs
// (the loop); depthwise_separable 10.4 → 7.9 µs a call, resnet_block 15.5 → 13.6 µs.
__attribute__((target("avx2"))) void transpose32(const uint32_t* in, int64_t si, uint32_t* out,
                                                 int64_t so, int64_t nj, int64_t ni) {
  const int64_t j8 = nj & ~(int64_t)7, i8 = ni & ~(int64_t)7;
  for (int64_t i0 = 0; i0 < i8; i0 += 8) {
    for (int64_t j0 = 0; j0 < j8; j0 += 8) {
      __m256 r[8];
      for (int k = 0; k < 8; ++k)  // row k: in[j0.. + (i0 + k)·si], eight j's
        r[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(in + j0 + (i0 + k) * si));
      __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      __m256 c[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                     _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                     _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                     _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      for (int k = 0; k < 8; ++k)  // row j0 + k of the output: its i0..i0+7
        _mm256_storeu_ps(reinterpret_cast<float*>(out + (j0 + k) * so + i0), c[k]);
    }
    for (int64_t j = j8; j < nj; ++j)
      for (int64_t i = i0; i < i0 + 8; ++i) out[j * so + i] = in[j + i * si];
  }
  for (int64_t i = i8; i < ni; ++i)
    for (int64_t j = 0; j < nj; ++j) out[j * so + i] = in[j + i * si];
}

// out[p·c + ch] = in[ch·si + p] for p < n, ch < c (2 <= c <= 4): the c planes of 8 (4-byte)
// or 16 (1-byte) elements each become c output vectors. Output vector k's lane s holds
// element g = k·W + s of the row: pixel g / c of plane g % c. Each plane is permuted so its
// pixels land on their lanes, and the planes are merged lane by lane (4 bytes: blends;
// 1 byte: byte shuffles that zero the other planes' lanes, then ORs). The rest one element
// at a time. A 3 × 64 × 64 image: 3.5 → 0.4 µs (float, the loop); 3 × 224 × 224 bytes
// (an 8a8w model's quantized input): 37 → 4 µs.
__attribute__((target("avx2"))) void interleave32(const uint32_t* in, int64_t si, uint32_t* out,
                                                  int64_t c, int64_t n) {
  __m256i idx[4][4], take[4][4];  // [output vector k][plane ch]
  for (int64_t k = 0; k < c; ++k)
    for (int64_t ch = 0; ch < c; ++ch) {
      alignas(32) int32_t ix[8], mk[8];
      for (int s = 0; s < 8; ++s) {
        int64_t g = k * 8 + s;
        ix[s] = (int32_t)(g / c);
        mk[s] = g % c == ch ? -1 : 0;
      }
      idx[k][ch] = _mm256_load_si256(reinterpret_cast<const __m256i*>(ix));
      take[k][ch] = _mm256_load_si256(reinterpret_cast<const __m256i*>(mk));
    }
  const int64_t n8 = n & ~(int64_t)7;
  for (int64_t p = 0; p < n8; p += 8) {
    __m256 plane[4];
    for (int64_t ch = 0; ch < c; ++ch)
      plane[ch] = _mm256_loadu_ps(reinterpret_cast<const float*>(in + ch * si + p));
    for (int64_t k = 0; k < c; ++k) {
      __m256 v = _mm256_permutevar8x32_ps(plane[0], idx[k][0]);
      for (int64_t ch = 1; ch < c; ++ch)
        v = _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(plane[ch], idx[k][ch]),
                             _mm256_castsi256_ps(take[k][ch]));
      _mm256_storeu_ps(reinterpret_cast<float*>(out + p * c + k * 8), v);
    }
  }
  for (int64_t p = n8; p < n; ++p)
    for (int64_t ch = 0; ch < c; ++ch) out[p * c + ch] = in[ch * si + p];
}

__attribute__((target("ssse3"))) void interleave8(const uint8_t* in, int64_t si, uint8_t* out,
                                                  int64_t c, int64_t n) {
  __m128i shuffle[4][4];  // [output vector k][plane ch]: the plane's byte, or 0x80 (zero)
  for (int64_t k = 0; k < c; ++k)
    for (int64_t ch = 0; ch < c; ++ch) {
      alignas(16) int8_t ix[16];
      for (int s = 0; s < 16; ++s) {
        int64_t g = k * 16 + s;
        ix[s] = g % c == ch ? (int8_t)(g / c) : (int8_t)-128;
      }
      shuffle[k][ch] = _mm_load_si128(reinterpret_cast<const __m128i*>(ix));
    }
  const int64_t n16 = n & ~(int64_t)15;
  for (int64_t p = 0; p < n16; p += 16) {
    __m128i plane[4];
    for (int64_t ch = 0; ch < c; ++ch)
      plane[ch] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + ch * si + p));
    for (int64_t k = 0; k < c; ++k) {
      __m128i v = _mm_shuffle_epi8(plane[0], shuffle[k][0]);
      for (int64_t ch = 1; ch < c; ++ch) v = _mm_or_si128(v, _mm_shuffle_epi8(plane[ch], shuffle[k][ch]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + p * c + k * 16), v);
    }
  }
  for (int64_t p = n16; p < n; ++p)
    for (int64_t ch = 0; ch < c; ++ch) out[p * c + ch] = in[ch * si + p];
}
#endif

}  // namespace ofc
