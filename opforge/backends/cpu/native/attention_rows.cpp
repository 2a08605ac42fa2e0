// attention_rows.h: one query row of G query heads over the filled slots of one KV head,
// AVX-512. Per block of 16 slots and per head g:
//   scores: 16 accumulators (one per slot) of q_g . k_j over D in chunks of 16 lanes, then a
//     transposing add tree gives the 16 sums in one vector (45 ops for 16 dot products,
//     where one horizontal sum each costs ~8);
//   online softmax: m = max(m, block max); the running sum and output row are scaled by
//     exp(m_old - m) when m grows; p_j = exp(s_j - m) (exp_nonpositive16, vector_exp.h);
//   values: o_g += p_j v_j, the output row held in registers a segment of 8 chunks (128
//     floats) at a time.
// The K and V rows of a block (16 x D) stay in L1 while the G heads read them: the cache is
// read from memory once per KV head, not once per query head.
#include "attention_rows.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "engine.h"
#include "vector_exp.h"

#if OFC_ATTENTION_ROWS
#include <immintrin.h>
#endif

namespace ofc {

#if OFC_ATTENTION_ROWS

RowsKernel attention_rows_kernel() {
  if (avx512_kernel_allowed("OPFORGE_CPU_ATTENTION_AVX512") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return RowsKernel::avx512;
  if (avx2_kernel_allowed("OPFORGE_CPU_ATTENTION_AVX2") && __builtin_cpu_supports("f16c"))
    return RowsKernel::avx2;
  return RowsKernel::loops;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

namespace {

constexpr int kBlock = 16;  // slots per block: one score vector
constexpr int kSeg = 8;     // output chunks of 16 floats held in registers at once

inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

// 16 elements (the lanes of m, others 0) at element `at` of a row of dtype T as float32:
// 0 float32; 1 float16 (vcvtph2ps); 2 bfloat16 (its bits in the high half); all exact
template <int T>
inline __attribute__((always_inline)) __m512 load16(const void* row, int64_t at, __mmask16 m) {
  if (T == 0) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + at);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + at);
  if (T == 1) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define OFC_INLINE inline __attribute__((always_inline))

// lane j = the sum of a[j]'s 16 lanes
OFC_INLINE __m512 sum16(const __m512 (&a)[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)  // 128-bit lane L: a[2i] (L0+L2, L1+L3) beside a[2i+1]'s
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // 128-bit lane L: a[4i..4i+3]'s sums over lane L
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// a segment of NC chunks of 16 elements, from element d0 of a row of D: the lanes before D
template <int NC>
struct Segment {
  int64_t d0;
  __mmask16 m[NC];
  Segment(int64_t at, int64_t D) : d0(at) {
    for (int c = 0; c < NC; ++c) m[c] = lanes(D - at - 16 * c);
  }
};

// lane j (< 16) += q . row j of the block over the segment, j < jb (the lanes at or past jb
// untouched: no slot past the block's last is read); q's segment held in registers
template <int T, int NC>
OFC_INLINE void block_scores(__m512 (&acc)[16], const float* q, const char* rows, int64_t stride,
                             int jb, const Segment<NC>& s) {
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_maskz_loadu_ps(s.m[c], q + s.d0 + 16 * c);
#pragma GCC unroll 16
  for (int j = 0; j < kBlock; ++j) {
    if (j < jb)
      for (int c = 0; c < NC; ++c)
        acc[j] = _mm512_fmadd_ps(qv[c], load16<T>(rows, s.d0 + 16 * c, s.m[c]), acc[j]);
    rows += stride;
  }
}

// o's segment = o * alpha (where `scale`) + sum_{j < jb} p[j] v_j, in registers: two sums
// (even and odd slots) halve the chain of dependent multiply-adds
template <int T, int NC>
OFC_INLINE void block_values(float* o, const float* p, const char* rows, int64_t stride, int jb,
                             const Segment<NC>& s, bool scale, __m512 alpha) {
  __m512 even[NC], odd[NC];
  for (int c = 0; c < NC; ++c) {
    even[c] = _mm512_maskz_loadu_ps(s.m[c], o + s.d0 + 16 * c);
    if (scale) even[c] = _mm512_mul_ps(even[c], alpha);
    odd[c] = _mm512_setzero_ps();
  }
  int j = 0;
  for (; j + 2 <= jb; j += 2, rows += 2 * stride) {
    const __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
    for (int c = 0; c < NC; ++c) {
      even[c] = _mm512_fmadd_ps(p0, load16<T>(rows, s.d0 + 16 * c, s.m[c]), even[c]);
      odd[c] = _mm512_fmadd_ps(p1, load16<T>(rows + stride, s.d0 + 16 * c, s.m[c]), odd[c]);
    }
  }
  if (j < jb) {
    const __m512 p0 = _mm512_set1_ps(p[j]);
    for (int c = 0; c < NC; ++c)
      even[c] = _mm512_fmadd_ps(p0, load16<T>(rows, s.d0 + 16 * c, s.m[c]), even[c]);
  }
  for (int c = 0; c < NC; ++c)
    _mm512_mask_storeu_ps(o + s.d0 + 16 * c, s.m[c], _mm512_add_ps(even[c], odd[c]));
}

// per head: the running max, its 16 lanes of running sums, whether a score was NaN or +inf
struct HeadState {
  float max;
  bool bad, scale;               // scale: this block raised the max
  alignas(64) float sum[16];
  alignas(64) float p[16];       // this block's scores, then their exp(s - max)
  alignas(64) float alpha[16];   // exp(old max - max), where scale
};

// NC chunks a segment: the whole row where D <= 128 (NC = its chunks), else segments of 8
// (the last one's chunks past D masked off). DENSE: D = 16 NC and K, V rows D apart (a
// cache [.., S, D] in row-major order), every row's offset in a block a constant
template <int T, int NC, bool DENSE>
void rows_of(const AttentionRows& a) {
  const int64_t item = T == 0 ? 4 : 2, D = DENSE ? 16 * NC : a.D, G = a.G;
  const char* kb = static_cast<const char*>(a.k);
  const char* vb = static_cast<const char*>(a.v);
  const int64_t kstride = DENSE ? 16 * NC * item : a.ks * item;
  const int64_t vstride = DENSE ? 16 * NC * item : a.vs * item;
  thread_local std::vector<HeadState> heads;
  if ((int64_t)heads.size() < G) heads.resize((size_t)G);
  const __m512 factor = _mm512_set1_ps(a.factor), minus_inf = _mm512_set1_ps(-INFINITY);
  for (int64_t g = 0; g < G; ++g) {
    heads[(size_t)g].max = -INFINITY;
    heads[(size_t)g].bad = false;
    _mm512_store_ps(heads[(size_t)g].sum, _mm512_setzero_ps());
    std::memset(a.o[g], 0, (size_t)D * sizeof(float));
  }
  // each block in three passes over the G heads (independent chains for the CPU to overlap):
  // scores; the online softmax's max, sums and weights; the value rows
  for (int64_t j0 = 0; j0 < a.n; j0 += kBlock) {
    const int jb = (int)std::min<int64_t>(kBlock, a.n - j0);
    const __mmask16 valid = lanes(jb);
    const char* krows = kb + j0 * kstride;
    const char* vrows = vb + j0 * vstride;
    for (int64_t g = 0; g < G; ++g) {
      __m512 acc[kBlock];
      for (int j = 0; j < kBlock; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t d0 = 0; d0 < D; d0 += 16 * NC)
        block_scores<T, NC>(acc, a.q[g], krows, kstride, jb, Segment<NC>(d0, D));
      _mm512_store_ps(heads[(size_t)g].p, sum16(acc));
    }
    for (int64_t g = 0; g < G; ++g) {
      HeadState& h = heads[(size_t)g];
      __m512 s = _mm512_load_ps(h.p);
      s = a.multiply ? _mm512_mul_ps(s, factor) : _mm512_div_ps(s, factor);
      if (a.terms != nullptr) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(valid, a.terms + j0));
      s = _mm512_mask_mov_ps(minus_inf, valid, s);
      h.bad = h.bad || (_mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(s, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ)) != 0;
      const float top = _mm512_reduce_max_ps(s);
      __m512 alpha = _mm512_set1_ps(1.0f);
      h.scale = top > h.max;
      if (h.scale) {  // exp(-inf) = 0 where this is the first finite max
        alpha = exp_nonpositive16(_mm512_set1_ps(h.max - top));
        h.max = top;
      }
      const __m512 e = h.max == -INFINITY ? _mm512_setzero_ps()
                                          : exp_nonpositive16(_mm512_sub_ps(s, _mm512_set1_ps(h.max)));
      _mm512_store_ps(h.sum, _mm512_fmadd_ps(_mm512_load_ps(h.sum), alpha, e));
      _mm512_store_ps(h.p, e);
      _mm512_store_ps(h.alpha, alpha);
    }
    for (int64_t g = 0; g < G; ++g) {
      const HeadState& h = heads[(size_t)g];
      for (int64_t d0 = 0; d0 < D; d0 += 16 * NC)
        block_values<T, NC>(a.o[g], h.p, vrows, vstride, jb, Segment<NC>(d0, D), h.scale,
                            _mm512_load_ps(h.alpha));
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const HeadState& h = heads[(size_t)g];
    float* o = a.o[g];
    if (h.bad || h.max == -INFINITY) {  // torch: NaN; all -inf: NaN, or the safe softmax's 0
      const float fill = !h.bad && a.empty_zero ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      for (int64_t d = 0; d < D; ++d) o[d] = fill;
      continue;
    }
    const __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_load_ps(h.sum)));
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = lanes(D - d);
      _mm512_mask_storeu_ps(o + d, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, o + d), sum));
    }
  }
}

template <int T, int NC>
void rows_with(const AttentionRows& a) {
  if (a.D == 16 * NC && a.ks == a.D && a.vs == a.D) return rows_of<T, NC, true>(a);
  rows_of<T, NC, false>(a);
}

template <int T>
void rows_for(const AttentionRows& a) {
  switch ((a.D + 15) / 16) {
    case 1: return rows_with<T, 1>(a);
    case 2: return rows_with<T, 2>(a);
    case 3: return rows_with<T, 3>(a);
    case 4: return rows_with<T, 4>(a);
    case 5: return rows_with<T, 5>(a);
    case 6: return rows_with<T, 6>(a);
    case 7: return rows_with<T, 7>(a);
    default: return rows_with<T, 8>(a);
  }
}

}  // namespace

static void attention_rows_avx512(const AttentionRows& a) {
  if (a.dtype == F16) return rows_for<1>(a);
  if (a.dtype == BF16) return rows_for<2>(a);
  rows_for<0>(a);
}

#pragma GCC pop_options

// outside the AVX-512 target: an AVX2 CPU runs this dispatch too
void attention_rows(const AttentionRows& a, RowsKernel kernel) {
  if (kernel == RowsKernel::avx2) return attention_rows_avx2(a);
  attention_rows_avx512(a);
}

#else  // not GCC on x86-64: the op keeps its plain loops

RowsKernel attention_rows_kernel() { return RowsKernel::loops; }
void attention_rows(const AttentionRows&, RowsKernel) { std::abort(); }

#endif

}  // namespace ofc
