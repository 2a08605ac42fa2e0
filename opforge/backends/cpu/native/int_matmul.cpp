// A matmul against integer weights (8-bit or 4-bit, one scale per output column and per
// block of K): the weights stay packed in the program and are dequantized in registers,
// so a decode step reads 1 (int8) or 1/2 (int4) byte per weight instead of 4.
//
// Contract ("int_matmul"): ins [a, w, scales, (bias)], outs [d]; ia [bits, group]; fa [] or
// [s] (the int16 mode, int_matmul16.cpp: bits 4, group <= 4096, s a finite float32 > 0 with
// a finite inverse, and a's values said to lie on the grid fl(i·s), |i| <= 65535).
//   a: f32 [M, K], columns contiguous (any row stride); d: f32 [M, N], columns contiguous,
//   rows apart by at least N, another root than a;
//   w: the weights as panels of 16 columns, dense: int8 [P, K, 16] (bits 8: w[p, k, j] is
//   q[k, 16p + j]) or uint8 [P, ceil(K/2), 16] (bits 4: byte [p, i, j] holds q[2i, 16p + j]
//   + 8 in its low nibble and q[2i + 1, 16p + j] + 8 in its high one), P = ceil(N/16), the
//   padding columns (and a 4-bit odd K's last high nibbles) any value;
//   scales: f32 dense [P, G, 16], G = ceil(K/group): the scale of columns 16p + j for
//   k in [g·group, (g+1)·group); group in [1, K], even for 4 bits unless it is K;
//   bias: f32, N elements, dense. No post-ops (the lowering fuses none into this op).
//   Work: M·K·N multiply-adds.
// The weights and scales are copied at build into transparent huge pages (the file's pages
// given back); the int16 mode copies them into its own layout instead.
//
// Arithmetic without fa, or with it where the int16 mode does not run (a CPU without AVX2,
// OPFORGE_CPU_INT_MATMUL_INT16=0, M >= kWideRows, a row off its grid; int_matmul16.cpp says
// its own arithmetic and bound), what the lean runtime computes up to the order of the
// sums: every weight is dequantized as float32(q) · scale, one rounding, the product quantized_decomposed's
// dequantize_per_channel and torchao's dequantize_affine compute with a zero zero point,
// then d[m, n] = Σ_k a[m, k] · w[k, n] in float32, one fused multiply-add per term, k in
// order, then + bias. Lean multiplies the same float32 weights with NumPy's matmul, whose
// order of summation is its own: the two differ by at most 2·γ(K)·Σ_k |a[m,k]·w[k,n]|
// (γ(K) = K·2^-24 / (1 - K·2^-24), Higham's bound for a sum of K products each way).
//
// Kernels: AVX-512 (16 columns a register; a 4-bit pair of k read as one byte per column,
// each nibble made a float by one vpermps from a 16-entry table, no integer conversion),
// else AVX2 + FMA (int_matmul_avx2.cpp: 16 columns two registers, 8-bit weights by
// vpmovsxbd, 4-bit by (b & 15) - 8 and (b >> 4) - 8 in int32, then vcvtdq2ps; switched off
// by OPFORGE_CPU_INT_MATMUL_AVX2=0), else a portable one (plain loops over 16 columns,
// compiled for AVX2 and baseline x86-64 by target_clones, or the compiler's default
// elsewhere). All give the same sums bit for bit: the same products added in the same
// order, each one fused multiply-add, one rounding (the portable one calls __builtin_fmaf:
// libm's fmaf, its clones compiled without -mfma).
// Per call: panels in chunks of 4 (64 columns) over the op's threads; within a chunk,
// rows in blocks of up to 4, so a chunk's weights (at most 64·K bytes) are read from
// memory once per call and from cache by the other row blocks.
//
// Many rows (M ≥ kWideRows, a prompt; AVX-512 or AVX2): dequantizing in registers again for
// every block of 4 rows costs ~15% more than the multiply-adds alone (128 rows, Zen 4:
// the float32 matmul runs at the FMA units' peak), so instead each chunk's
// weights are dequantized ONCE per call, kWideK rows of k at a time, into a per-thread
// float32 buffer (the engine's scratch, 64 KiB a thread; no float copy of the whole weight
// is kept), and a float microkernel runs every row over it, 6 rows × 64 columns a block
// (AVX2: 6 rows × 16 columns).
// The buffer holds the same float32(q) · scale products, and each output's sum is the same
// chain of fused multiply-adds, k in order: a block of k starts from the partial sums the
// previous block stored in d (float32 stored and reloaded unchanged), the bias added after
// the last. So the wide path's results equal the register path's bit for bit, and the
// bound against lean above holds unchanged (tests/backends/test_cpu_int_weights.py checks
// both: equal to M=1 calls of the same weights, and within the bound of lean).
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <omp.h>

#include <cmath>
#include <cstring>

#include "int_kernels.h"

namespace ofc {

namespace {

constexpr int kLanes = kIntLanes;
constexpr int kChunk = kIntChunk;
// rows from which the AVX-512 kernel dequantizes once a call: measured on Zen 4 (768×2048,
// 1 thread), the register path is faster at 8 rows (330 vs 390 µs), even at 16, and slower
// from 32 (1,260 vs 1,170 µs; 128 rows: 5,040 vs 4,270, oneDNN's float32 matmul 4,170)
constexpr int64_t kWideRows = 24;
// the same for the AVX2 kernels: measured on an AMD EPYC Zen 3 (768×2048, 1 thread, µs,
// register path vs dequantized once; a shared machine, ±10%): int8 16 rows 724 vs 854,
// 24 rows 1,091 vs 1,092, 32 rows 1,506 vs 1,449, 128 rows 5,662 vs 4,731; int4 blocks of
// 32: 16 rows 887 vs 798, 24 rows 1,326 vs 1,041, 128 rows 7,358 vs 4,862 (oneDNN's float32
// matmul 8,907 at 128 rows: its jit gemm on AVX2)
constexpr int64_t kWideRowsAvx2 = 24;
constexpr int64_t kWideK = 256;   // k per dequantized block: 256 × 64 floats, 64 KiB (128: slower)
constexpr int kWideBlock = 6;     // rows per block of the wide microkernel (24 accumulators)
constexpr int64_t kWideBytes = kWideK * kChunk * kLanes * 4 + 64;  // a thread's buffer, aligned

// ---- portable kernel: R rows × one panel, 16 accumulators per row --------------------------
template <int BITS>
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
void portable_panel(const IntMatmulOp& op, const float* a, float* d, int64_t m0, int rows,
                    int64_t p) {
  float acc[kIntRowBlock][kLanes] = {};
  const float* sp = op.s + p * op.groups * kLanes;
  const uint8_t* wp = op.w + p * op.kr * kLanes;
  for (int64_t g = 0; g < op.groups; ++g) {
    const int64_t k0 = g * op.group, k1 = std::min(op.k, k0 + op.group);
    const float* sc = sp + g * kLanes;
    for (int64_t kk = k0; kk < k1; ++kk) {
      float wv[kLanes];
      if (BITS == 8) {
        const int8_t* q = reinterpret_cast<const int8_t*>(wp) + kk * kLanes;
        for (int j = 0; j < kLanes; ++j) wv[j] = (float)q[j] * sc[j];
      } else {
        const uint8_t* q = wp + (kk >> 1) * kLanes;
        const int shift = (int)(kk & 1) * 4;
        for (int j = 0; j < kLanes; ++j) wv[j] = (float)((int)((q[j] >> shift) & 15) - 8) * sc[j];
      }
      for (int r = 0; r < rows; ++r) {
        const float av = a[(m0 + r) * op.sa + kk];
        for (int j = 0; j < kLanes; ++j) acc[r][j] = __builtin_fmaf(av, wv[j], acc[r][j]);
      }
    }
  }
  store_panel(op, d, m0, rows, p, acc);
}

#if defined(__x86_64__)
#define OFC_AVX512 __attribute__((target("avx512f")))

// R rows × P panels from panel p0: per step of k one dequantized register per panel (read
// once, used by every row), one broadcast of a per row
template <int BITS, int R, int P>
OFC_AVX512 void block(const IntMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p0) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const uint8_t* wp[P];
  const float* sp[P];
  for (int p = 0; p < P; ++p) {
    wp[p] = op.w + (p0 + p) * op.kr * kLanes;
    sp[p] = op.s + (p0 + p) * op.groups * kLanes;
  }
  const float* ar[R];
  for (int r = 0; r < R; ++r) ar[r] = a + (m0 + r) * op.sa;
  for (int64_t g = 0; g < op.groups; ++g) {
    const int64_t k0 = g * op.group, k1 = std::min(op.k, k0 + op.group);
    __m512 sc[P];
    for (int p = 0; p < P; ++p) sc[p] = _mm512_loadu_ps(sp[p] + g * kLanes);
    if (BITS == 8) {
      for (int64_t kk = k0; kk < k1; ++kk) {
        __m512 wv[P];
        for (int p = 0; p < P; ++p) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[p] + kk * kLanes));
          wv[p] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), sc[p]);
        }
        for (int r = 0; r < R; ++r) {
          const __m512 av = _mm512_set1_ps(ar[r][kk]);
          for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(av, wv[p], acc[r][p]);
        }
      }
    } else {
      // k0 is even (group even, or one group); a pair's second k may be past k1 only at K
      int64_t kk = k0;
      for (; kk + 1 < k1; kk += 2) {
        __m512 lo[P], hi[P];
        for (int p = 0; p < P; ++p) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[p] + (kk >> 1) * kLanes));
          const __m512i v = _mm512_cvtepu8_epi32(q);
          lo[p] = _mm512_mul_ps(_mm512_permutexvar_ps(v, table), sc[p]);
          hi[p] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table), sc[p]);
        }
        for (int r = 0; r < R; ++r) {
          const __m512 a0 = _mm512_set1_ps(ar[r][kk]);
          for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(a0, lo[p], acc[r][p]);
          const __m512 a1 = _mm512_set1_ps(ar[r][kk + 1]);
          for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(a1, hi[p], acc[r][p]);
        }
      }
      if (kk < k1) {  // K odd: the last k, a low nibble alone
        for (int p = 0; p < P; ++p) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[p] + (kk >> 1) * kLanes));
          const __m512 lo = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(q), table), sc[p]);
          for (int r = 0; r < R; ++r) acc[r][p] = _mm512_fmadd_ps(_mm512_set1_ps(ar[r][kk]), lo, acc[r][p]);
        }
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t col = (p0 + p) * kLanes;
    const __mmask16 mask = panel_mask(op, col);
    const __m512 bias = _mm512_loadu_ps(op.bias.data() + col);
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(d + (m0 + r) * op.sd + col, mask, _mm512_add_ps(acc[r][p], bias));
  }
}

// ---- the wide path: chunk p0's weights for k in [k0, k0 + kn) dequantized into wf ----------
// wf[k - k0][64]: panel p's 16 columns at 16p; the same products as block() (float32(q) ·
// scale, one rounding)
template <int BITS>
OFC_AVX512 void dequantize_chunk(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn,
                                 float* wf) {
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int p = 0; p < np; ++p) {
    const uint8_t* wp = op.w + (p0 + p) * op.kr * kLanes;
    const float* sp = op.s + (p0 + p) * op.groups * kLanes;
    int64_t g = k0 / op.group, next = std::min(op.k, (g + 1) * op.group);  // kk's group, its end
    __m512 sc = _mm512_loadu_ps(sp + g * kLanes);
    for (int64_t kk = k0; kk < k0 + kn; ++kk) {
      if (kk == next) {
        ++g;
        next = std::min(op.k, next + op.group);
        sc = _mm512_loadu_ps(sp + g * kLanes);
      }
      __m512 v;
      if (BITS == 8) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + kk * kLanes));
        v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
      } else {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + (kk >> 1) * kLanes));
        const __m512i b = _mm512_cvtepu8_epi32(q);
        v = _mm512_permutexvar_ps((kk & 1) ? _mm512_srli_epi32(b, 4) : b, table);
      }
      _mm512_store_ps(wf + (kk - k0) * (kChunk * kLanes) + p * kLanes, _mm512_mul_ps(v, sc));
    }
  }
}

// R rows from m0 × P panels from p0 over k in [k0, k0 + kn) of the dequantized wf: from zero
// (first) or the partial sums in d, k in order, stored back (+ the bias after the last block)
template <int R, int P>
OFC_AVX512 void wide_block(const IntMatmulOp& op, const float* a, float* d, const float* wf,
                           int64_t m0, int64_t p0, int64_t k0, int64_t kn, bool first, bool last) {
  __m512 acc[R][P];
  __mmask16 mask[P];
  for (int p = 0; p < P; ++p) mask[p] = panel_mask(op, (p0 + p) * kLanes);
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p)
      acc[r][p] = first ? _mm512_setzero_ps()
                        : _mm512_maskz_loadu_ps(mask[p], d + (m0 + r) * op.sd + (p0 + p) * kLanes);
  const float* ar[R];
  for (int r = 0; r < R; ++r) ar[r] = a + (m0 + r) * op.sa + k0;
  for (int64_t kk = 0; kk < kn; ++kk) {
    const float* wk = wf + kk * (kChunk * kLanes);
    __m512 wv[P];
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_ps(wk + p * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ar[r][kk]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(av, wv[p], acc[r][p]);
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t col = (p0 + p) * kLanes;
    const __m512 bias = last ? _mm512_loadu_ps(op.bias.data() + col) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(d + (m0 + r) * op.sd + col, mask[p],
                            last ? _mm512_add_ps(acc[r][p], bias) : acc[r][p]);
  }
}

template <int R>
OFC_AVX512 void wide_rows(const IntMatmulOp& op, const float* a, float* d, const float* wf, int64_t m0,
                          int64_t p0, int np, int64_t k0, int64_t kn, bool first, bool last) {
  with_panels(np, [&](auto P) { wide_block<R, P.value>(op, a, d, wf, m0, p0, k0, kn, first, last); });
}

// one chunk of up to kChunk panels from p0, every row, through the thread's buffer wf (the
// AVX-512 kernels, else the AVX2 ones)
template <int BITS>
void wide_chunk(const IntMatmulOp& op, const float* a, float* d, int64_t p0, float* wf) {
  const int np = (int)std::min<int64_t>(kChunk, op.panels - p0);
  for (int64_t k0 = 0; k0 < op.k; k0 += kWideK) {
    const int64_t kn = std::min(kWideK, op.k - k0);
    if (op.act16) dequantize_chunk16(op, p0, np, k0, kn, wf);  // its layout, the same products
    else if (op.vector512) dequantize_chunk<BITS>(op, p0, np, k0, kn, wf);
    else int_matmul_avx2_dequantize(op, p0, np, k0, kn, wf);
    const bool first = k0 == 0, last = k0 + kn == op.k;
    // rows in blocks as even as kWideBlock allows (8 rows: 4 + 4, not 6 + 2)
    const int64_t blocks = (op.m + kWideBlock - 1) / kWideBlock;
    for (int64_t b = 0, m0 = 0; b < blocks; ++b) {
      const int64_t rows = op.m / blocks + (b < op.m % blocks ? 1 : 0);
      const int64_t r0 = m0;
      m0 += rows;
      if (!op.vector512) {
        int_matmul_avx2_wide_rows(op, a, d, wf, r0, (int)rows, p0, np, k0, kn, first, last);
        continue;
      }
      with_wide_rows(rows, [&](auto R) { wide_rows<R.value>(op, a, d, wf, r0, p0, np, k0, kn, first, last); });
    }
  }
}
#endif

// one chunk of np panels from p0, every row
template <int BITS>
void chunk(const IntMatmulOp& op, const float* a, float* d, int64_t p0, int64_t np) {
#if defined(__x86_64__)
  if (op.avx2) {  // its own row blocks and panels per block
    int_matmul_avx2_chunk(op, a, d, p0, np);
    return;
  }
#endif
  for_each_row_block(op.m, [&](int64_t m0, auto R) {
#if defined(__x86_64__)
    if (op.vector512) {
      with_panels(np, [&](auto P) { block<BITS, R.value, P.value>(op, a, d, m0, p0); });
      return;
    }
#endif
    for (int64_t p = p0; p < p0 + np; ++p) portable_panel<BITS>(op, a, d, m0, R.value, p);
  });
}

}  // namespace

void IntMatmulOp::run(Engine& e) {
  const float* a = static_cast<const float*>(e.ptr(ins[0]));
  float* d = static_cast<float*>(e.ptr(outs[0]));
  const int64_t chunks = (panels + kChunk - 1) / kChunk;
#if defined(__x86_64__)
  if (act16 && !wide && int16_run(*this, a, d)) return;
  if (wide || act16) {  // each thread its own 64-byte aligned buffer of the scratch (sized at build)
    const uintptr_t base = reinterpret_cast<uintptr_t>(e.scratch.data());
    auto body = [&](int64_t i, int slot) {
      float* wf = reinterpret_cast<float*>(((base + (uintptr_t)slot * kWideBytes) + 63) & ~(uintptr_t)63);
      if (bits == 8) wide_chunk<8>(*this, a, d, i * kChunk, wf);
      else wide_chunk<4>(*this, a, d, i * kChunk, wf);
    };
    if (team > 1 && chunks > 1) {
#pragma omp parallel for num_threads(team) schedule(static)
      for (int64_t i = 0; i < chunks; ++i) body(i, omp_get_thread_num());
    } else {
      for (int64_t i = 0; i < chunks; ++i) body(i, 0);
    }
    return;
  }
#endif
  for_each_chunk(*this, [&](int64_t p0, int64_t np) {
    if (bits == 8) chunk<8>(*this, a, d, p0, np);
    else chunk<4>(*this, a, d, p0, np);
  });
}


void contract_int_matmul(const Engine& e, const OpCall& c) {
  const std::string& kind = c.kind;
  int64_t M = 0, K = 0, N = 0;
  need_int_weights_operands(e, c, M, K, N);
  need(c.ia.size() == 2 && c.fa.size() <= 1, kind, "takes ia [bits, group] and fa [] or [activation scale]");
  const int64_t bits = c.ia[0], group = c.ia[1];
  if (c.fa.size() == 1) {  // the int16 mode (int_matmul16.cpp)
    const double s = c.fa[0];
    need(bits == 4 && std::isfinite(s) && s > 0 && (float)s > 0 && std::isfinite(1.f / (float)s), kind,
         "fa [activation scale]: 4-bit weights only, the scale a finite float32 > 0 whose inverse is finite");
    need(group <= kInt16MaxGroup, kind, "fa [activation scale]: the group must be at most 4096");
    int64_t values = 0;  // the activations as integers: M·G·(group rounded up to 8)
    need(!__builtin_mul_overflow(M, (K + group - 1) / group, &values) &&
             !__builtin_mul_overflow(values, (group + 7) / 8 * 8, &values) && values <= kMaxElements,
         kind, "fa [activation scale]: M·ceil(K/group)·group (rounded up to 8) exceeds 2^40");
  }
  need(bits == 4 || bits == 8, kind, "bits must be 4 or 8");
  const Tensor& w = e.tensors[(size_t)c.ins[1]];
  const Tensor& s = e.tensors[(size_t)c.ins[2]];
  need(group >= 1 && group <= K, kind, "group must be in [1, K]");
  need(bits == 8 || group % 2 == 0 || group == K, kind, "a 4-bit group must be even (or K)");
  const int64_t P = (N + kLanes - 1) / kLanes, G = (K + group - 1) / group;
  const int64_t rows = bits == 8 ? K : (K + 1) / 2;
  need(w.dtype == (bits == 8 ? I8 : U8), kind, "w must be int8 (8 bits) or uint8 (4 bits)");
  need(w.dims == dims_t({P, rows, kLanes}) && row_major(w) && dense(w), kind,
       "w must be dense [ceil(N/16), K (or ceil(K/2) for 4 bits), 16]");
  need(s.dtype == F32 && s.dims == dims_t({P, G, kLanes}) && row_major(s) && dense(s), kind,
       "scales must be f32 dense [ceil(N/16), ceil(K/group), 16]");
}

void build_int_matmul(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  auto op = std::make_unique<IntMatmulOp>();
  const int64_t k = e.tensors[(size_t)c.ins[0]].dims[1];
  int_weights_setup(e, c, *op, (k + c.ia[1] - 1) / c.ia[1], "int_matmul");
  op->kr = op->bits == 8 ? op->k : (op->k + 1) / 2;
  op->vector512 = avx512_kernel_allowed("OPFORGE_CPU_INT_MATMUL_AVX512");
  op->avx2 = !op->vector512 && int_matmul_avx2_allowed();
  // OPFORGE_CPU_INT_MATMUL_WIDE=0: the register path at every M (the A/B of the bench, and
  // the tests' reference for the wide path's bits)
  op->wide = ((op->vector512 && op->m >= kWideRows) || (op->avx2 && op->m >= kWideRowsAvx2)) &&
             switched_on("OPFORGE_CPU_INT_MATMUL_WIDE");
  if (c.fa.size() == 1) op->int16 = int16_kernel(op->vector512, op->avx2);
  if (op->int16 != Int16Kernel::none) {
    int16_setup(e, c, *op);  // its own layout (w and s point to it)
  } else {
    // the weights and scales copied once at init into transparent huge pages (constants.cpp;
    // shared by the program's engines through the weight cache; the file's pages given back,
    // file_pages.py COPIED_AT_INIT): read in place from the file's 4 KB pages a decode step
    // took a TLB miss every 4 KB (bench/decode_matmul.py, Zen 4, 1 thread, int4 768x2048
    // one row: 107 µs in place, see bench/results/quantized_16a4w_block.md for the copy)
    const int64_t wbytes = e.tensors[(size_t)c.ins[1]].numel;  // P·kr·16 bytes: a multiple of 16
    const int64_t sfloats = e.tensors[(size_t)c.ins[2]].numel;
    const uint8_t* wfrom = op->w;
    const float* sfrom = op->s;
    op->wmem = derived_const(e, c.ins[1], memory::desc({wbytes / 4}, memory::data_type::f32, memory::format_tag::a),
                             [&](float* to) { std::memcpy(to, wfrom, (size_t)wbytes); });
    op->w = static_cast<const uint8_t*>(op->wmem.get_data_handle());
    op->smem = derived_const(e, c.ins[2], memory::desc({sfloats}, memory::data_type::f32, memory::format_tag::a),
                             [&](float* to) { std::memcpy(to, sfrom, (size_t)sfloats * 4); });
    op->s = static_cast<const float*>(op->smem.get_data_handle());
  }
  if (op->wide || op->act16) grow_scratch(e, mul_c(op->team, kWideBytes, "int_matmul"));
  op->name = std::string("matmul on int") + (op->bits == 8 ? "8" : "4") + " weights (own kernel" +
             (op->int16 == Int16Kernel::vnni   ? ", int16 activations, AVX512-VNNI"
              : op->int16 == Int16Kernel::avx2 ? ", int16 activations, vpmaddwd"
                                                : "") +
             (op->vector512 ? ", AVX-512" : op->avx2 ? ", AVX2" : "") +
             (op->wide ? ", dequantized once a call)" : ")");
  push_op(e, std::move(op), c);
}

}  // namespace ofc
