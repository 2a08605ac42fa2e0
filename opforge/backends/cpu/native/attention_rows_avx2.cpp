// attention_rows.h on AVX2 + FMA (+ F16C for a float16 cache), for CPUs without AVX-512
// (AMD Zen 2/3, Intel client cores): the AVX-512 kernel's structure (attention_rows.cpp) in
// 8-lane vectors. Per block of 16 slots and per head g:
//   scores: two halves of 8 slots, each 8 accumulators (one per slot) of q_g . k_j over D in
//     chunks of 8 lanes, then a transposing add tree gives the 8 sums in one vector;
//   online softmax: m = max(m, block max); the running sums and the output row are scaled by
//     exp(m_old - m) when m grows; p_j = exp(s_j - m) (exp_nonpositive8, vector_exp.h);
//   values: o_g += p_j v_j, the output row held in registers a segment of 8 chunks (64
//     floats) at a time.
// AVX2 has 16 vector registers, not 32: a head's 8 score accumulators take half of them, so q
// is read from L1 a chunk at a time (not held), and the value sums hold one segment of 64
// floats (8 independent chains, as many as two FMA units of latency 4 need).
// Blocks of 16 slots, not 8: the per-block work besides the multiply-adds (the max, two exp
// calls, the output row's loads and stores) is then spread over twice the slots; measured in
// a stand-alone harness (AMD EPYC Zen 3, 1 thread; the decoder below's layer: 4 KV heads of 3
// query heads, D 64, 128 causal rows; best of 150) 16 slots took 660 µs a layer (float32) and
// 627 (float16), 8 slots 715 and 711.
// Tails: the slots of a block past n are never read (their scores are -inf, their loads
// skipped); a chunk of the head dim past D is read with an int-masked load (float32) or copied
// into a zeroed 8-element buffer (float16/bfloat16: AVX2 has no masked 16-bit load).
// Measured in the 125M decoder (bench/work/llm/base-opforge-cpu.opf: 12 layers, 12 heads, 4 KV
// heads, D 64, causal) on an AMD EPYC Zen 3, OMP_NUM_THREADS=1, OPFORGE_CPU_PROFILE=1, 15
// runs of each beside the plain loops (OPFORGE_CPU_ATTENTION_AVX2=0) in turn, a shared
// machine at load ~1.3, medians: the 128-row prompt's attention 3,352 -> 884 µs a layer (3.8x;
// 40.2 -> 10.6 ms of the prefill), a decode step's 8.9 -> 4.7 µs a layer; the prompt 404 ->
// 443 tokens/s.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_rows.h"
#include "engine.h"
#include "vector_exp.h"

#if OFC_ATTENTION_ROWS
#include <immintrin.h>

namespace ofc {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace {

#define OFC_INLINE inline __attribute__((always_inline))

constexpr int kVecs = 2;              // score vectors a block
constexpr int kBlock = 8 * kVecs;     // slots a block
constexpr int kSeg = 8;               // output chunks of 8 floats held in registers at once

// lanes below `left` (0 .. 8) all ones: maskload's int mask
OFC_INLINE __m256i lanes(int left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 elements at element `at` of a row of dtype T as float32: 0 float32; 1 float16
// (vcvtph2ps); 2 bfloat16 (its bits in the high half); all exact
template <int T>
OFC_INLINE __m256 load8(const void* row, int64_t at) {
  if (T == 0) return _mm256_loadu_ps(static_cast<const float*>(row) + at);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + at));
  if (T == 1) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// the same for the first `left` (< 8) elements, the others 0; nothing past them is read
template <int T>
OFC_INLINE __m256 load_part(const void* row, int64_t at, int left, __m256i m) {
  if (T == 0) return _mm256_maskload_ps(static_cast<const float*>(row) + at, m);
  alignas(16) uint16_t part[8] = {};
  std::memcpy(part, static_cast<const uint16_t*>(row) + at, (size_t)left * sizeof(uint16_t));
  return load8<T>(part, 0);
}

// lane j = the sum of a[j]'s 8 lanes
OFC_INLINE __m256 sum8(const __m256 (&a)[8]) {
  __m256 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // 128-bit lane L: a[2i] (L0+L2, L1+L3) beside a[2i+1]'s
    t[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 2; ++i) {  // 128-bit lane L: a[4i..4i+3]'s sums over lane L
    const __m256d x = _mm256_castps_pd(t[2 * i]), y = _mm256_castps_pd(t[2 * i + 1]);
    u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                       _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

OFC_INLINE float max8(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

OFC_INLINE float add8(__m256 x) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

// a segment of NC chunks of 8 elements, from element d0 of a row of D. FULL: every chunk
// lies inside the row (D a multiple of 8 NC); else left[c] elements of chunk c do (0 .. 8)
template <int NC, bool FULL>
struct Segment {
  int64_t d0;
  int left[NC];
  __m256i m[NC];
  Segment(int64_t at, int64_t D) : d0(at) {
    for (int c = 0; c < NC && !FULL; ++c) {
      left[c] = (int)std::max<int64_t>(0, std::min<int64_t>(8, D - at - 8 * c));
      m[c] = lanes(left[c]);
    }
  }
  OFC_INLINE bool whole(int c) const { return FULL || left[c] == 8; }
  OFC_INLINE bool none(int c) const { return !FULL && left[c] == 0; }
  template <int T>
  OFC_INLINE __m256 load(const void* row, int c) const {
    return whole(c) ? load8<T>(row, d0 + 8 * c) : load_part<T>(row, d0 + 8 * c, left[c], m[c]);
  }
};

// lane j (< 8) += q . row j of the 8 from `rows` over the segment, j < jb (no row at or
// past jb read)
template <int T, int NC, bool FULL>
OFC_INLINE void block_scores(__m256 (&acc)[8], const float* q, const char* rows, int64_t stride,
                             int jb, const Segment<NC, FULL>& s) {
  for (int c = 0; c < NC; ++c) {
    if (s.none(c)) break;
    const __m256 qv = s.template load<0>(q, c);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      if (j < jb) acc[j] = _mm256_fmadd_ps(qv, s.template load<T>(rows + j * stride, c), acc[j]);
  }
}

// o's segment = o * alpha (where `scale`) + sum_{j < jb} p[j] v_j, in registers. Fewer than
// 5 chunks: two sums (even and odd slots), so that at least 8 chains of multiply-adds overlap
template <int T, int NC, bool FULL>
OFC_INLINE void block_values(float* o, const float* p, const char* rows, int64_t stride, int jb,
                             const Segment<NC, FULL>& s, bool scale, __m256 alpha) {
  constexpr bool kPairs = NC <= 4;
  __m256 even[NC], odd[NC];
  for (int c = 0; c < NC; ++c) {
    even[c] = s.template load<0>(o, c);
    if (scale) even[c] = _mm256_mul_ps(even[c], alpha);
    odd[c] = _mm256_setzero_ps();
  }
  int j = 0;
  for (; kPairs && j + 2 <= jb; j += 2, rows += 2 * stride) {
    const __m256 p0 = _mm256_broadcast_ss(p + j), p1 = _mm256_broadcast_ss(p + j + 1);
    for (int c = 0; c < NC; ++c) {
      if (s.none(c)) break;
      even[c] = _mm256_fmadd_ps(p0, s.template load<T>(rows, c), even[c]);
      odd[c] = _mm256_fmadd_ps(p1, s.template load<T>(rows + stride, c), odd[c]);
    }
  }
  for (; j < jb; ++j, rows += stride) {
    const __m256 p0 = _mm256_broadcast_ss(p + j);
    for (int c = 0; c < NC; ++c) {
      if (s.none(c)) break;
      even[c] = _mm256_fmadd_ps(p0, s.template load<T>(rows, c), even[c]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    const __m256 sum = kPairs ? _mm256_add_ps(even[c], odd[c]) : even[c];
    if (s.whole(c)) _mm256_storeu_ps(o + s.d0 + 8 * c, sum);
    else _mm256_maskstore_ps(o + s.d0 + 8 * c, s.m[c], sum);
  }
}

// per head: the running max, its lanes of running sums, whether a score was NaN or +inf
struct HeadState {
  float max, alpha;             // alpha: exp(old max - max), where scale
  bool bad, scale;              // scale: this block raised the max
  alignas(32) float sum[kBlock];
  alignas(32) float p[kBlock];  // this block's scores, then their exp(s - max)
};

// NC chunks a segment: the whole row where D <= 64, else segments of 8
template <int T, int NC, bool FULL>
void rows_of(const AttentionRows& a) {
  const int64_t item = T == 0 ? 4 : 2, D = a.D, G = a.G;
  const char* kb = static_cast<const char*>(a.k);
  const char* vb = static_cast<const char*>(a.v);
  const int64_t kstride = a.ks * item, vstride = a.vs * item;
  thread_local std::vector<HeadState> heads;
  if ((int64_t)heads.size() < G) heads.resize((size_t)G);
  const __m256 factor = _mm256_set1_ps(a.factor), minus_inf = _mm256_set1_ps(-INFINITY);
  const __m256 plus_inf = _mm256_set1_ps(INFINITY);
  for (int64_t g = 0; g < G; ++g) {
    heads[(size_t)g].max = -INFINITY;
    heads[(size_t)g].bad = false;
    for (int v = 0; v < kVecs; ++v) _mm256_store_ps(heads[(size_t)g].sum + 8 * v, _mm256_setzero_ps());
    std::memset(a.o[g], 0, (size_t)D * sizeof(float));
  }
  // each block in three passes over the G heads (independent chains for the CPU to overlap):
  // scores; the online softmax's max, sums and weights; the value rows
  for (int64_t j0 = 0; j0 < a.n; j0 += kBlock) {
    const int jb = (int)std::min<int64_t>(kBlock, a.n - j0);
    const char* krows = kb + j0 * kstride;
    const char* vrows = vb + j0 * vstride;
    for (int64_t g = 0; g < G; ++g) {
      for (int v = 0; v < kVecs; ++v) {
        const int vb8 = jb - 8 * v;  // this half's slots
        if (vb8 <= 0) {
          _mm256_store_ps(heads[(size_t)g].p + 8 * v, _mm256_setzero_ps());
          continue;
        }
        __m256 acc[8];
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
        for (int64_t d0 = 0; d0 < D; d0 += 8 * NC)
          block_scores<T, NC, FULL>(acc, a.q[g], krows + 8 * v * kstride, kstride, vb8,
                                    Segment<NC, FULL>(d0, D));
        _mm256_store_ps(heads[(size_t)g].p + 8 * v, sum8(acc));
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      HeadState& h = heads[(size_t)g];
      __m256 s[kVecs];
      __m256 top8 = minus_inf, flags = _mm256_setzero_ps();
      for (int v = 0; v < kVecs; ++v) {
        const int left = std::max(0, std::min(8, jb - 8 * v));
        const __m256i valid = lanes(left);
        s[v] = _mm256_load_ps(h.p + 8 * v);
        s[v] = a.multiply ? _mm256_mul_ps(s[v], factor) : _mm256_div_ps(s[v], factor);
        if (a.terms != nullptr)
          s[v] = _mm256_add_ps(s[v], _mm256_maskload_ps(a.terms + j0 + 8 * v, valid));
        s[v] = _mm256_blendv_ps(minus_inf, s[v], _mm256_castsi256_ps(valid));
        flags = _mm256_or_ps(flags, _mm256_or_ps(_mm256_cmp_ps(s[v], s[v], _CMP_UNORD_Q),
                                                 _mm256_cmp_ps(s[v], plus_inf, _CMP_EQ_OQ)));
        top8 = _mm256_max_ps(top8, s[v]);
      }
      h.bad = h.bad || _mm256_movemask_ps(flags) != 0;
      const float top = max8(top8);
      __m256 alpha = _mm256_set1_ps(1.0f);
      h.scale = top > h.max;
      if (h.scale) {  // exp(-inf) = 0 where this is the first finite max
        alpha = exp_nonpositive8(_mm256_set1_ps(h.max - top));
        h.max = top;
      }
      const __m256 m = _mm256_set1_ps(h.max);
      for (int v = 0; v < kVecs; ++v) {
        const __m256 e = h.max == -INFINITY ? _mm256_setzero_ps()
                                            : exp_nonpositive8(_mm256_sub_ps(s[v], m));
        _mm256_store_ps(h.sum + 8 * v, _mm256_fmadd_ps(_mm256_load_ps(h.sum + 8 * v), alpha, e));
        _mm256_store_ps(h.p + 8 * v, e);
      }
      h.alpha = _mm256_cvtss_f32(alpha);
    }
    for (int64_t g = 0; g < G; ++g) {
      const HeadState& h = heads[(size_t)g];
      const __m256 alpha = _mm256_set1_ps(h.alpha);
      for (int64_t d0 = 0; d0 < D; d0 += 8 * NC)
        block_values<T, NC, FULL>(a.o[g], h.p, vrows, vstride, jb, Segment<NC, FULL>(d0, D),
                                  h.scale, alpha);
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
    __m256 total = _mm256_load_ps(h.sum);
    for (int v = 1; v < kVecs; ++v) total = _mm256_add_ps(total, _mm256_load_ps(h.sum + 8 * v));
    const __m256 sum = _mm256_set1_ps(add8(total));
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), sum));
    for (; d < D; ++d) o[d] /= _mm256_cvtss_f32(sum);
  }
}

// a segment of NC chunks: FULL where D is 8 NC (or, NC 8, a multiple of 64); else the
// smallest of 1, 2, 4, 8 chunks that holds D (8: segments, the last one masked)
template <int T>
void rows_for(const AttentionRows& a) {
  const int64_t chunks = (a.D + 7) / 8;
  if (a.D % 8 == 0 && chunks <= 8) {
    switch (chunks) {
      case 1: return rows_of<T, 1, true>(a);
      case 2: return rows_of<T, 2, true>(a);
      case 3: return rows_of<T, 3, true>(a);
      case 4: return rows_of<T, 4, true>(a);
      case 5: return rows_of<T, 5, true>(a);
      case 6: return rows_of<T, 6, true>(a);
      case 7: return rows_of<T, 7, true>(a);
      default: return rows_of<T, 8, true>(a);
    }
  }
  if (a.D % 64 == 0) return rows_of<T, 8, true>(a);
  if (chunks == 1) return rows_of<T, 1, false>(a);
  if (chunks == 2) return rows_of<T, 2, false>(a);
  if (chunks <= 4) return rows_of<T, 4, false>(a);
  rows_of<T, 8, false>(a);
}

}  // namespace

void attention_rows_avx2(const AttentionRows& a) {
  if (a.dtype == F16) return rows_for<1>(a);
  if (a.dtype == BF16) return rows_for<2>(a);
  rows_for<0>(a);
}

#pragma GCC pop_options

}  // namespace ofc

#else  // not GCC on x86-64: the op keeps its plain loops

namespace ofc {
void attention_rows_avx2(const AttentionRows&) { std::abort(); }
}  // namespace ofc

#endif
