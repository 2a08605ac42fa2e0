// int_matmul's AVX2 + FMA kernels (the contract and the arithmetic: int_matmul.cpp), for
// x86-64 CPUs without AVX-512 (AMD Zen 2/3, Intel client cores): a panel of 16 columns is
// two ymm registers. They compute what the AVX-512 and portable kernels compute, bit for
// bit: every weight dequantized as float32(q) · scale (a multiply, its own rounding, never
// fused into the sum's multiply-add), each output's sum one chain of fused multiply-adds,
// k in order, the bias added after the last.
//
// Register path: R rows × P panels (1 × 4, 2 × 2, 3 × 1, 4 × 1: at most 8 accumulators,
// with a panel's two dequantized registers, the broadcasts and the scales within 16 ymm).
// 8 bits: vpmovsxbd, vcvtdq2ps, × scale. 4 bits: a byte holds k and k + 1 of a column:
// vpmovzxbd, then (b & 15) - 8 and (b >> 4) - 8 as int32, vcvtdq2ps, × scale (as fast as
// float(2^23 + nibble) - (2^23 + 8), the conversion by a float subtraction: 119 µs both,
// 768×2048 from cache, one row, AMD EPYC Zen 3). Decode, the weights from memory
// (bench/decode_matmul.py, the same machine, 1 thread, µs for 1 and 4 rows): 768×2048 int8
// per channel 115 and 182, int4 blocks of 32 139 and 234; 2048×768 115 and 206, 129 and
// 222; oneDNN's float32 matmul 235 and 566, 371 and 795; the portable loop (before these
// kernels) 5,475 and 19,178 (int8), 6,207 and 13,721 (int4) at 768×2048.
//
// Wide path (a prompt's rows, int_matmul.cpp's wide_chunk): a chunk's block of k
// dequantized once into the thread's buffer, then 6 rows × 1 panel (12 accumulators) a
// block of the float microkernel; partial sums stored in d and reloaded unchanged.
#include "int_kernels.h"

#include <algorithm>
#include <cstring>

namespace ofc {

bool int_matmul_avx2_allowed() {
  return avx2_kernel_allowed("OPFORGE_CPU_INT_MATMUL_AVX2");
}

#if defined(__x86_64__)
#define OFC_AVX2 __attribute__((target("avx2,fma")))
// the loops over rows, panels and halves unrolled early: GCC then keeps every accumulator
// in a register (left to its later unrolling it kept them in a stack array as well, one
// store each per k)
#define OFC_UNROLL _Pragma("GCC unroll 16")

namespace {

constexpr int kLanes = kIntLanes;
constexpr int64_t kRowFloats = kIntChunk * kIntLanes;  // the wide buffer's floats per k

OFC_AVX2 inline __m128i load8(const uint8_t* p) {
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}

// the 16 weights of one k of a panel (q: their 16 bytes; 4 bits: the high nibbles when
// `high`), × the scale: float32(q) · scale, one rounding each
template <int BITS>
OFC_AVX2 inline void dequantize16(const uint8_t* q, bool high, const __m256* sc, __m256* w) {
  OFC_UNROLL
  for (int h = 0; h < 2; ++h) {
    __m256i v;
    if (BITS == 8) {
      v = _mm256_cvtepi8_epi32(load8(q + 8 * h));
    } else {
      const __m256i b = _mm256_cvtepu8_epi32(load8(q + 8 * h));
      v = _mm256_sub_epi32(high ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15)),
                           _mm256_set1_epi32(8));
    }
    w[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(v), sc[h]);
  }
}

// rows r of panel p's sums (+ bias) into d, the columns past N left out (inlined: a call
// would take the accumulators' address, and GCC then stores them to the stack every k)
template <int R>
OFC_AVX2 __attribute__((always_inline)) inline void store_sums(const IntMatmulOp& op, float* d, int64_t m0, int64_t p, const __m256 (*acc)[2]) {
  const int64_t col = p * kLanes;
  if (op.n - col >= kLanes) {
    const __m256 b0 = _mm256_loadu_ps(op.bias.data() + col), b1 = _mm256_loadu_ps(op.bias.data() + col + 8);
    OFC_UNROLL
    for (int r = 0; r < R; ++r) {
      float* to = d + (m0 + r) * op.sd + col;
      _mm256_storeu_ps(to, _mm256_add_ps(acc[r][0], b0));
      _mm256_storeu_ps(to + 8, _mm256_add_ps(acc[r][1], b1));
    }
    return;
  }
  float out[R][kLanes];
  OFC_UNROLL
  for (int r = 0; r < R; ++r)
    OFC_UNROLL
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out[r] + 8 * h, acc[r][h]);
  store_panel(op, d, m0, R, p, out);
}

// ---- register path: R rows × P panels from p0 -------------------------------------------
template <int BITS, int R, int P>
OFC_AVX2 void block(const IntMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p0) {
  __m256 acc[P][R][2];
  OFC_UNROLL
  for (int p = 0; p < P; ++p)
    OFC_UNROLL
    for (int r = 0; r < R; ++r) acc[p][r][0] = acc[p][r][1] = _mm256_setzero_ps();
  const uint8_t* wp[P];
  const float* sp[P];
  OFC_UNROLL
  for (int p = 0; p < P; ++p) {
    wp[p] = op.w + (p0 + p) * op.kr * kLanes;
    sp[p] = op.s + (p0 + p) * op.groups * kLanes;
  }
  const float* ar[R];
  OFC_UNROLL
  for (int r = 0; r < R; ++r) ar[r] = a + (m0 + r) * op.sa;
  for (int64_t g = 0; g < op.groups; ++g) {
    const int64_t k0 = g * op.group, k1 = std::min(op.k, k0 + op.group);
    __m256 sc[P][2];
    OFC_UNROLL
    for (int p = 0; p < P; ++p)
      OFC_UNROLL
      for (int h = 0; h < 2; ++h) sc[p][h] = _mm256_loadu_ps(sp[p] + g * kLanes + 8 * h);
    if (BITS == 8) {
      for (int64_t kk = k0; kk < k1; ++kk) {
        OFC_UNROLL
        for (int p = 0; p < P; ++p) {
          __m256 w[2];
          dequantize16<8>(wp[p] + kk * kLanes, false, sc[p], w);
          OFC_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256 av = _mm256_broadcast_ss(ar[r] + kk);
            OFC_UNROLL
            for (int h = 0; h < 2; ++h) acc[p][r][h] = _mm256_fmadd_ps(av, w[h], acc[p][r][h]);
          }
        }
      }
    } else {
      // k0 is even (group even, or one group); a pair's second k may be past k1 only at K
      int64_t kk = k0;
      for (; kk + 1 < k1; kk += 2) {
        OFC_UNROLL
        for (int p = 0; p < P; ++p) {
          const uint8_t* q = wp[p] + (kk >> 1) * kLanes;
          __m256 lo[2], hi[2];
          dequantize16<4>(q, false, sc[p], lo);
          dequantize16<4>(q, true, sc[p], hi);
          OFC_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256 a0 = _mm256_broadcast_ss(ar[r] + kk), a1 = _mm256_broadcast_ss(ar[r] + kk + 1);
            OFC_UNROLL
            for (int h = 0; h < 2; ++h) acc[p][r][h] = _mm256_fmadd_ps(a0, lo[h], acc[p][r][h]);
            OFC_UNROLL
            for (int h = 0; h < 2; ++h) acc[p][r][h] = _mm256_fmadd_ps(a1, hi[h], acc[p][r][h]);
          }
        }
      }
      if (kk < k1) {  // K odd: the last k, a low nibble alone
        OFC_UNROLL
        for (int p = 0; p < P; ++p) {
          __m256 lo[2];
          dequantize16<4>(wp[p] + (kk >> 1) * kLanes, false, sc[p], lo);
          OFC_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256 a0 = _mm256_broadcast_ss(ar[r] + kk);
            OFC_UNROLL
            for (int h = 0; h < 2; ++h) acc[p][r][h] = _mm256_fmadd_ps(a0, lo[h], acc[p][r][h]);
          }
        }
      }
    }
  }
  OFC_UNROLL
  for (int p = 0; p < P; ++p) store_sums<R>(op, d, m0, p0 + p, acc[p]);
}

// 1 row: the chunk's panels at once (8 accumulators for 4); 2 rows: two panels at a time;
// 3-4 rows: one
template <int BITS, int R>
OFC_AVX2 void rows(const IntMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p0, int64_t np) {
  if (R == 1) {
    with_panels(np, [&](auto P) { block<BITS, 1, P.value>(op, a, d, m0, p0); });
    return;
  }
  constexpr int PP = R == 2 ? 2 : 1;
  int64_t p = 0;
  for (; p + PP <= np; p += PP) block<BITS, R, PP>(op, a, d, m0, p0 + p);
  if (p < np) block<BITS, R, 1>(op, a, d, m0, p0 + p);
}

template <int BITS>
OFC_AVX2 void chunk(const IntMatmulOp& op, const float* a, float* d, int64_t p0, int64_t np) {
  for_each_row_block(op.m, [&](int64_t m0, auto R) { rows<BITS, R.value>(op, a, d, m0, p0, np); });
}

// ---- wide path -----------------------------------------------------------------------------
template <int BITS>
OFC_AVX2 void dequantize(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf) {
  for (int p = 0; p < np; ++p) {
    const uint8_t* wp = op.w + (p0 + p) * op.kr * kLanes;
    const float* sp = op.s + (p0 + p) * op.groups * kLanes;
    int64_t g = k0 / op.group, next = std::min(op.k, (g + 1) * op.group);  // kk's group, its end
    __m256 sc[2] = {_mm256_loadu_ps(sp + g * kLanes), _mm256_loadu_ps(sp + g * kLanes + 8)};
    for (int64_t kk = k0; kk < k0 + kn; ++kk) {
      if (kk == next) {
        ++g;
        next = std::min(op.k, next + op.group);
        sc[0] = _mm256_loadu_ps(sp + g * kLanes);
        sc[1] = _mm256_loadu_ps(sp + g * kLanes + 8);
      }
      __m256 w[2];
      if (BITS == 8) dequantize16<8>(wp + kk * kLanes, false, sc, w);
      else dequantize16<4>(wp + (kk >> 1) * kLanes, (kk & 1) != 0, sc, w);
      float* to = wf + (kk - k0) * kRowFloats + p * kLanes;
      _mm256_store_ps(to, w[0]);
      _mm256_store_ps(to + 8, w[1]);
    }
  }
}

// R rows from m0 × panel p over k in [k0, k0 + kn) of wf: from zero (first) or the partial
// sums in d, k in order, stored back (+ the bias after the last block)
template <int R>
OFC_AVX2 void wide_block(const IntMatmulOp& op, const float* a, float* d, const float* wf, int64_t m0,
                         int64_t p, int pi, int64_t k0, int64_t kn, bool first, bool last) {
  const int64_t col = p * kLanes;
  const bool full = op.n - col >= kLanes;
  __m256 acc[R][2];
  OFC_UNROLL
  for (int r = 0; r < R; ++r) {
    const float* from = d + (m0 + r) * op.sd + col;
    float part[kLanes] = {};
    if (!first && !full) std::memcpy(part, from, (size_t)(op.n - col) * 4);
    OFC_UNROLL
    for (int h = 0; h < 2; ++h)
      acc[r][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps((full ? from : part) + 8 * h);
  }
  const float* ar[R];
  OFC_UNROLL
  for (int r = 0; r < R; ++r) ar[r] = a + (m0 + r) * op.sa + k0;
  const float* wk = wf + pi * kLanes;
  for (int64_t kk = 0; kk < kn; ++kk, wk += kRowFloats) {
    const __m256 w0 = _mm256_load_ps(wk), w1 = _mm256_load_ps(wk + 8);
    OFC_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ar[r] + kk);
      acc[r][0] = _mm256_fmadd_ps(av, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, w1, acc[r][1]);
    }
  }
  if (last) {
    store_sums<R>(op, d, m0, p, acc);
    return;
  }
  OFC_UNROLL
  for (int r = 0; r < R; ++r) {
    float* to = d + (m0 + r) * op.sd + col;
    if (full) {
      _mm256_storeu_ps(to, acc[r][0]);
      _mm256_storeu_ps(to + 8, acc[r][1]);
    } else {
      float part[kLanes];
      _mm256_storeu_ps(part, acc[r][0]);
      _mm256_storeu_ps(part + 8, acc[r][1]);
      std::memcpy(to, part, (size_t)(op.n - col) * 4);
    }
  }
}

template <int R>
OFC_AVX2 void wide_panels(const IntMatmulOp& op, const float* a, float* d, const float* wf, int64_t m0,
                          int64_t p0, int np, int64_t k0, int64_t kn, bool first, bool last) {
  for (int p = 0; p < np; ++p) wide_block<R>(op, a, d, wf, m0, p0 + p, p, k0, kn, first, last);
}

}  // namespace

void int_matmul_avx2_chunk(const IntMatmulOp& op, const float* a, float* d, int64_t p0, int64_t np) {
  if (op.bits == 8) chunk<8>(op, a, d, p0, np);
  else chunk<4>(op, a, d, p0, np);
}

void int_matmul_avx2_dequantize(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf) {
  if (op.bits == 8) dequantize<8>(op, p0, np, k0, kn, wf);
  else dequantize<4>(op, p0, np, k0, kn, wf);
}

void int_matmul_avx2_wide_rows(const IntMatmulOp& op, const float* a, float* d, const float* wf, int64_t m0,
                               int rows, int64_t p0, int np, int64_t k0, int64_t kn, bool first, bool last) {
  with_wide_rows(rows, [&](auto R) { wide_panels<R.value>(op, a, d, wf, m0, p0, np, k0, kn, first, last); });
}
#endif

}  // namespace ofc
