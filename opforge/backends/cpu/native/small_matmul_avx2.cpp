// small_matmul's AVX2 + FMA kernels (the op and its arithmetic: small_matmul.cpp), for
// x86-64 CPUs without AVX-512 (AMD Zen 2/3, Intel client cores), on any number of rows:
// b packed at build as [panel][K][16] (a panel of 16 columns is two ymm registers).
//
// Why any number of rows: oneDNN's matmul runs its jit gemm on these CPUs, with the
// weights it asks for in plain [K, N] order, and that gemm's speed swings with the shape:
// on an AMD EPYC Zen 3 (1 thread, bench/decode_matmul.py --rows 128) a 128-row prompt
// through 768×2048 took 8.8 ms (42 GFLOP/s) where 2048×768 took 5.0 (78 GFLOP/s), and
// the same calls with [N, K] weights the other way round; a decoder's prompt spent 87% of
// its time there. This kernel: 4.70 and 4.66 ms (NumPy's OpenBLAS 4.67 and 4.60), best of
// 30 calls; decode-shaped (1-4 rows, weights from memory) within a few % of oneDNN's.
//
// Blocking: each task a block of 64 columns (4 panels). Up to 8 rows (a decode step) the
// block's weights stream from memory once, k over all of K, R rows × P panels a register
// block (1 × 4, 2 × 2, 3 × 2, 4-6 × 1: at most 12 accumulators with the panel's two
// weight registers and a broadcast in 16 ymm). More rows: chunks of up to kChunkRows rows,
// each over K in slices of kSliceK (a panel's slice, 16 KB, stays in L1 while the chunk's
// 6-row blocks read it; the chunk's slice, at most 192 KB, in L2), 6 rows × 1 panel a
// block, the partial sums stored in d and reloaded unchanged, so each output is still one
// chain of fused multiply-adds, k in order.
#include "small_matmul.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ofc {

bool small_matmul_avx2_allowed() {
#if defined(__x86_64__)
  // (OPFORGE_CPU_SMALL_MATMUL_AVX512=0 runs these on an AVX-512 CPU too: how its tests reach them)
  return avx2_kernel_allowed("OPFORGE_CPU_MATMUL_AVX2") &&
         (!__builtin_cpu_supports("avx512f") || !switched_on("OPFORGE_CPU_SMALL_MATMUL_AVX512"));
#else
  return false;
#endif
}

#if defined(__x86_64__)
#define OFC_AVX2 __attribute__((target("avx2,fma")))
// unrolled early: GCC then keeps every accumulator in a register (int_matmul_avx2.cpp)
#define OFC_UNROLL _Pragma("GCC unroll 16")

namespace {

constexpr int kPanel = SmallMatmulOp::kPanel;
constexpr int64_t kFewRows = 8;     // up to here: K in one pass, the weights read once
constexpr int64_t kSliceK = 256;    // past it: K in slices of this many
constexpr int kRowBlock = 6;        // rows per register block past kFewRows
constexpr int64_t kChunkRows = 192; // rows a slice of K serves at a time (their slice in L2)

// R rows from m0 × P panels from p over k in [k0, k0 + kn): from zero (first) or the
// partial sums in d, stored back; after the last slice + bias, then the register post-ops
template <int R, int P>
OFC_AVX2 void block(const SmallMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p,
                    int64_t k0, int64_t kn, bool first, bool last) {
  __m256 acc[R][P][2];
  OFC_UNROLL
  for (int r = 0; r < R; ++r)
    OFC_UNROLL
    for (int q = 0; q < P; ++q) {
      const int64_t col = (p + q) * kPanel;
      const float* from = d + (m0 + r) * op.sd_m + col;
      if (first) {
        acc[r][q][0] = acc[r][q][1] = _mm256_setzero_ps();
      } else if (op.n - col >= kPanel) {
        acc[r][q][0] = _mm256_loadu_ps(from);
        acc[r][q][1] = _mm256_loadu_ps(from + 8);
      } else {  // the last panel's columns past N are not in d
        float part[kPanel] = {};
        std::memcpy(part, from, (size_t)(op.n - col) * 4);
        acc[r][q][0] = _mm256_loadu_ps(part);
        acc[r][q][1] = _mm256_loadu_ps(part + 8);
      }
    }
  const float* ar[R];
  OFC_UNROLL
  for (int r = 0; r < R; ++r) ar[r] = a + (m0 + r) * op.sa_m + k0 * op.sa_k;
  const float* w = op.bp + p * op.step_p + k0 * kPanel;
  for (int64_t kk = 0; kk < kn; ++kk, w += kPanel) {
    __m256 wv[P][2];
    OFC_UNROLL
    for (int q = 0; q < P; ++q) {
      wv[q][0] = _mm256_loadu_ps(w + q * op.step_p);
      wv[q][1] = _mm256_loadu_ps(w + q * op.step_p + 8);
    }
    OFC_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ar[r] + kk * op.sa_k);
      OFC_UNROLL
      for (int q = 0; q < P; ++q) {
        acc[r][q][0] = _mm256_fmadd_ps(av, wv[q][0], acc[r][q][0]);
        acc[r][q][1] = _mm256_fmadd_ps(av, wv[q][1], acc[r][q][1]);
      }
    }
  }
  OFC_UNROLL
  for (int q = 0; q < P; ++q) {
    const int64_t col = (p + q) * kPanel;
    const __m256 b0 = _mm256_loadu_ps(op.bias.data() + col), b1 = _mm256_loadu_ps(op.bias.data() + col + 8);
    OFC_UNROLL
    for (int r = 0; r < R; ++r) {
      __m256 v[2] = {acc[r][q][0], acc[r][q][1]};
      if (last) {
        v[0] = _mm256_add_ps(v[0], b0);
        v[1] = _mm256_add_ps(v[1], b1);
        for (const RegisterPostOp& s : op.post)
          OFC_UNROLL
          for (int h = 0; h < 2; ++h) {
            if (s.kind == 0) v[h] = _mm256_fmadd_ps(v[h], _mm256_set1_ps(s.a), _mm256_set1_ps(s.b));
            else v[h] = _mm256_min_ps(_mm256_set1_ps(s.b), _mm256_max_ps(_mm256_set1_ps(s.a), v[h]));
          }
      }
      float* to = d + (m0 + r) * op.sd_m + col;
      if (op.n - col >= kPanel) {
        _mm256_storeu_ps(to, v[0]);
        _mm256_storeu_ps(to + 8, v[1]);
      } else {
        float part[kPanel];
        _mm256_storeu_ps(part, v[0]);
        _mm256_storeu_ps(part + 8, v[1]);
        std::memcpy(to, part, (size_t)(op.n - col) * 4);
      }
    }
  }
}

// R rows from m0 × the np panels from p0, P at a time (the rest one by one)
template <int R, int P>
OFC_AVX2 void panels(const SmallMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p0, int64_t np,
                     int64_t k0, int64_t kn, bool first, bool last) {
  int64_t p = p0;
  for (; p + P <= p0 + np; p += P) block<R, P>(op, a, d, m0, p, k0, kn, first, last);
  for (; p < p0 + np; ++p) block<R, 1>(op, a, d, m0, p, k0, kn, first, last);
}

// R (1-6) rows from m0 over the np panels from p0, in the register block R allows
OFC_AVX2 void rows(const SmallMatmulOp& op, const float* a, float* d, int64_t m0, int R, int64_t p0,
                   int64_t np, int64_t k0, int64_t kn, bool first, bool last) {
  switch (R) {
    case 1:
      if (np == 4) panels<1, 4>(op, a, d, m0, p0, np, k0, kn, first, last);
      else panels<1, 2>(op, a, d, m0, p0, np, k0, kn, first, last);
      break;
    case 2: panels<2, 2>(op, a, d, m0, p0, np, k0, kn, first, last); break;
    case 3: panels<3, 2>(op, a, d, m0, p0, np, k0, kn, first, last); break;
    case 4: panels<4, 1>(op, a, d, m0, p0, np, k0, kn, first, last); break;
    case 5: panels<5, 1>(op, a, d, m0, p0, np, k0, kn, first, last); break;
    default: panels<6, 1>(op, a, d, m0, p0, np, k0, kn, first, last); break;
  }
}

// the rows in blocks of at most kRowBlock, as even as that allows (8 rows: 4 + 4)
template <typename F>
void row_blocks(int64_t m, F&& body) {
  const int64_t blocks = (m + kRowBlock - 1) / kRowBlock;
  for (int64_t b = 0, m0 = 0; b < blocks; ++b) {
    const int64_t r = m / blocks + (b < m % blocks ? 1 : 0);
    body(m0, (int)r);
    m0 += r;
  }
}

}  // namespace

void small_matmul_avx2_block(const SmallMatmulOp& op, const float* a, float* d, int64_t p0) {
  const int64_t np = std::min<int64_t>(SmallMatmulOp::kBlockPanels, op.panels - p0);
  if (op.m <= kFewRows) {
    row_blocks(op.m, [&](int64_t m0, int r) { rows(op, a, d, m0, r, p0, np, 0, op.k, true, true); });
    return;
  }
  for (int64_t r0 = 0; r0 < op.m; r0 += kChunkRows) {
    const int64_t rn = std::min(kChunkRows, op.m - r0);
    for (int64_t k0 = 0; k0 < op.k; k0 += kSliceK) {
      const int64_t kn = std::min(kSliceK, op.k - k0);
      const bool first = k0 == 0, last = k0 + kn == op.k;
      for (int64_t p = p0; p < p0 + np; ++p)
        row_blocks(rn, [&](int64_t m0, int r) { rows(op, a, d, r0 + m0, r, p, 1, k0, kn, first, last); });
    }
  }
}
#else
void small_matmul_avx2_block(const SmallMatmulOp&, const float*, float*, int64_t) {}
#endif

}  // namespace ofc
