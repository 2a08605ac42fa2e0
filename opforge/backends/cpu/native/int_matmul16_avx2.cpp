// int_matmul's int16 mode on AVX2 (int_matmul16.cpp says the arithmetic, the bound and the
// layout), for x86-64 CPUs without AVX512-VNNI: AMD Zen 2/3, Intel client cores, AVX-512
// CPUs before Cascade Lake. Where VNNI's vpdpwssd multiplies int16 pairs and adds each
// pair's sum to an int32 lane, AVX2's vpmaddwd multiplies the same pairs and sums them (a
// pair's sum never wraps: the weights are nibbles, |v·q| < 2^20) and a vpaddd adds that to
// the block's sum: the same int32 sums modulo 2^32, then the same float arithmetic in the
// same order, so the results equal the VNNI kernel's bit for bit. A panel's 16 columns are
// two ymm halves (bytes 0-31 and 32-63 of each of its 64-byte rows).
//
// Per 8 columns and 8 k of one row: a load, 3 shifts and 4 ands to unpack the nibbles,
// 4 vpmaddwd and 4 vpaddd (~2 instructions per 8 weights, where int_matmul_avx2.cpp's float
// path spends ~6: an unpack, a subtraction, a conversion, a multiply by the scale and the
// multiply-add).
//
// Blocks: one row × the chunk's panels (up to 4: 8 int32 sums in registers), or 2 rows × 2
// panels (8 sums) for calls of several rows; the float accumulators are touched once a
// block of k. A prompt's rows (M >= 24) take the dequantize-once path instead, whose
// dequantize from this layout is int16_avx2_dequantize.
#include "int_kernels.h"

#include <algorithm>
#include <climits>
#include <cstring>

namespace ofc {

#if defined(__x86_64__)
#define OFC_AVX2 __attribute__((target("avx2,fma")))
// the loops over rows, panels, halves and k unrolled early so every sum stays in a register
#define OFC_UNROLL _Pragma("GCC unroll 16")

namespace {

constexpr int kLanes = kIntLanes;

OFC_AVX2 inline int32_t reduce_min(__m256i v) {
  __m128i x = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_min_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  return _mm_cvtsi128_si32(_mm_min_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}

OFC_AVX2 inline int32_t reduce_max(__m256i v) {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  return _mm_cvtsi128_si32(_mm_max_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}

OFC_AVX2 inline int32_t reduce_add(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}

// round(x · inv) as vcvtps2dq does it (to nearest even under the default MXCSR; INT_MIN for
// a NaN or a value past int32): the vector loop's conversion, for the tails
OFC_AVX2 inline int32_t to_int(float x, float inv) {
  return _mm_cvtss_si32(_mm_set_ss(x * inv));
}

// R rows from m0 × P panels from q0 of the chunk of np panels at p0: the block sums in
// int32, then the contract's float accumulation, as int_matmul16.cpp's block16
template <int R, int P, bool SHIFTED>
OFC_AVX2 void block(const IntMatmulOp& op, float* d, int64_t m0, int64_t p0, int64_t np, int64_t q0) {
  __m256 acc[R][P][2];
  OFC_UNROLL
  for (int r = 0; r < R; ++r)
    OFC_UNROLL
    for (int p = 0; p < P; ++p) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi32(0x000F000F);
  for (int64_t g = 0; g < op.groups; ++g) {
    __m256i s[R][P][2], u[P][2];  // u: Σ (q + 8) over the block, for the shifted rows
    OFC_UNROLL
    for (int p = 0; p < P; ++p) {
      u[p][0] = u[p][1] = _mm256_setzero_si256();
      OFC_UNROLL
      for (int r = 0; r < R; ++r) s[r][p][0] = s[r][p][1] = _mm256_setzero_si256();
    }
    const int16_t* ar[R];
    OFC_UNROLL
    for (int r = 0; r < R; ++r) ar[r] = op.aq.data() + ((m0 + r) * op.groups + g) * op.l8;
    // the block's 64-byte rows: row o of panel q0 + p at (o·np + p)·64
    const uint8_t* w = op.w + int16_row(op, p0 + q0, g, 0) * 64;
    for (int64_t o = 0; o < op.octs; ++o, w += np * 64) {
      __m256i a[R][4];
      OFC_UNROLL
      for (int r = 0; r < R; ++r)
        OFC_UNROLL
        for (int t = 0; t < 4; ++t) {
          int32_t pair;  // v of k 8o + 2t and 8o + 2t + 1
          std::memcpy(&pair, ar[r] + 8 * o + 2 * t, 4);
          a[r][t] = _mm256_set1_epi32(pair);
        }
      OFC_UNROLL
      for (int p = 0; p < P; ++p)
        OFC_UNROLL
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * 64 + 32 * h));
          __m256i qsum = _mm256_setzero_si256();
          OFC_UNROLL
          for (int t = 0; t < 4; ++t) {  // k 8o + 2t, 8o + 2t + 1: bits 4t.. of each int16 half
            const __m256i q = _mm256_and_si256(t == 0 ? v : _mm256_srli_epi32(v, 4 * t), nib);
            OFC_UNROLL
            for (int r = 0; r < R; ++r) s[r][p][h] = _mm256_add_epi32(s[r][p][h], _mm256_madd_epi16(q, a[r][t]));
            if (SHIFTED) qsum = _mm256_add_epi16(qsum, q);  // (int16 sums of 4 nibbles: at most 60)
          }
          if (SHIFTED) u[p][h] = _mm256_add_epi32(u[p][h], _mm256_madd_epi16(qsum, _mm256_set1_epi32(0x00010001)));
        }
    }
    OFC_UNROLL
    for (int p = 0; p < P; ++p)
      OFC_UNROLL
      for (int h = 0; h < 2; ++h) {
        const __m256 sc = _mm256_loadu_ps(op.s + int16_scales(op, p0 + q0 + p, g) + 8 * h);
        OFC_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256i c = _mm256_set1_epi32(op.corr[(size_t)((m0 + r) * op.groups + g)]);
          __m256i sum = _mm256_sub_epi32(s[r][p][h], c);  // Σ v·q
          if (SHIFTED)  // + shift · Σ q (the pads' q + 8 = 8 and v = 0: Σ q = Σ (q + 8) - 8·l8)
            sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(_mm256_set1_epi32(op.shift[(size_t)(m0 + r)]),
                                                           _mm256_sub_epi32(u[p][h], _mm256_set1_epi32((int)(8 * op.l8)))));
          acc[r][p][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sc, acc[r][p][h]);
        }
      }
  }
  const __m256 sa = _mm256_set1_ps(op.act_scale);
  OFC_UNROLL
  for (int p = 0; p < P; ++p)
    OFC_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int64_t col = (p0 + q0 + p) * kLanes + 8 * h, left = op.n - col;
      if (left <= 0) continue;
      const __m256 bias = _mm256_loadu_ps(op.bias.data() + col);  // (padded to the panels)
      OFC_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 y = _mm256_fmadd_ps(acc[r][p][h], sa, bias);
        float* to = d + (m0 + r) * op.sd + col;
        if (left >= 8) {
          _mm256_storeu_ps(to, y);
        } else {
          float part[8];
          _mm256_storeu_ps(part, y);
          std::memcpy(to, part, (size_t)left * sizeof(float));
        }
      }
    }
}

template <int R, bool SHIFTED>
OFC_AVX2 void panels(const IntMatmulOp& op, float* d, int64_t m0, int64_t p0, int64_t np, int64_t q0, int64_t n) {
  switch (n) {
    case 4: block<R, (R == 1 ? 4 : 1), SHIFTED>(op, d, m0, p0, np, q0); break;
    case 3: block<R, (R == 1 ? 3 : 1), SHIFTED>(op, d, m0, p0, np, q0); break;
    case 2: block<R, 2, SHIFTED>(op, d, m0, p0, np, q0); break;
    default: block<R, 1, SHIFTED>(op, d, m0, p0, np, q0); break;
  }
}

template <bool SHIFTED>
OFC_AVX2 void chunk(const IntMatmulOp& op, float* d, int64_t p0, int64_t np) {
  int64_t m0 = 0;
  for (; m0 + 2 <= op.m; m0 += 2)  // 2 rows × 2 panels a block
    for (int64_t q0 = 0; q0 < np; q0 += 2) panels<2, SHIFTED>(op, d, m0, p0, np, q0, std::min<int64_t>(2, np - q0));
  if (m0 < op.m) panels<1, SHIFTED>(op, d, m0, p0, np, 0, np);  // one row × every panel
}

}  // namespace

OFC_AVX2 bool int16_avx2_quantize_row(IntMatmulOp& op, const float* x, int64_t m) {
  const __m256 inv = _mm256_set1_ps(op.act_inv);
  __m256i lo = _mm256_set1_epi32(INT32_MAX), hi = _mm256_set1_epi32(INT32_MIN);
  int64_t k = 0;
  for (; k + 8 <= op.k; k += 8) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), inv));
    lo = _mm256_min_epi32(lo, v);
    hi = _mm256_max_epi32(hi, v);
  }
  int64_t low = reduce_min(lo), high = reduce_max(hi);
  for (; k < op.k; ++k) {
    const int32_t v = to_int(x[k], op.act_inv);
    low = std::min<int64_t>(low, v), high = std::max<int64_t>(high, v);
  }
  int32_t shift = 0;
  if (!int16_row_shift(low, high, shift)) return false;
  op.shift[(size_t)m] = shift;
  const __m256i by = _mm256_set1_epi32(shift);
  for (int64_t g = 0; g < op.groups; ++g) {
    const int64_t k0 = g * op.group, n = std::min(op.group, op.k - k0);
    int16_t* q = op.aq.data() + (m * op.groups + g) * op.l8;
    __m256i sum = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i v = _mm256_sub_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k0 + i), inv)), by);
      sum = _mm256_add_epi32(sum, v);
      // v fits int16 (the shift's purpose), so the saturating pack keeps it exactly
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                       _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
    }
    int32_t total = reduce_add(sum);
    for (; i < n; ++i) {
      const int32_t v = to_int(x[k0 + i], op.act_inv) - shift;
      total += v;
      q[i] = (int16_t)v;
    }
    std::fill(q + n, q + op.l8, (int16_t)0);  // the pads
    op.corr[(size_t)(m * op.groups + g)] = 8 * total;
  }
  return true;
}

void int16_avx2_chunk(const IntMatmulOp& op, float* d, int64_t p0, int64_t np, bool shifted) {
  if (shifted) chunk<true>(op, d, p0, np);
  else chunk<false>(op, d, p0, np);
}

// chunk p0's weights for k in [k0, k0 + kn) as float32(q) · scale into wf[k - k0][64]: the
// products of int_matmul16.cpp's AVX-512 dequantize (float(nibble - 8) is exact, then one
// rounding by the multiply)
OFC_AVX2 void int16_avx2_dequantize(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf) {
  const __m256i fifteen = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
  for (int p = 0; p < np; ++p) {
    int64_t g = k0 / op.group, r = k0 - g * op.group;  // kk's block and its place in it
    __m256 sc[2];
    for (int h = 0; h < 2; ++h) sc[h] = _mm256_loadu_ps(op.s + int16_scales(op, p0 + p, g) + 8 * h);
    for (int64_t kk = k0; kk < k0 + kn; ++kk, ++r) {
      if (r == op.group) {
        ++g, r = 0;
        for (int h = 0; h < 2; ++h) sc[h] = _mm256_loadu_ps(op.s + int16_scales(op, p0 + p, g) + 8 * h);
      }
      const int64_t t = r & 7;
      const __m128i shift = _mm_cvtsi32_si128((int)(16 * (t & 1) + 4 * (t >> 1)));
      const uint8_t* row = op.w + int16_row(op, p0 + p, g, r >> 3) * 64;
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * h));
        const __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_srl_epi32(v, shift), fifteen), eight);
        _mm256_storeu_ps(wf + (kk - k0) * (kIntChunk * kLanes) + p * kLanes + 8 * h,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(q), sc[h]));
      }
    }
  }
}
#else
bool int16_avx2_quantize_row(IntMatmulOp&, const float*, int64_t) { return false; }
void int16_avx2_chunk(const IntMatmulOp&, float*, int64_t, int64_t, bool) {}
void int16_avx2_dequantize(const IntMatmulOp&, int64_t, int, int64_t, int64_t, float*) {}
#endif

}  // namespace ofc
