// A matmul of dynamically quantized int8 activations against int8 or int4 weights, as
// integer dot products: what llama.cpp's Q8_0 / Q4_0 matmuls compute (schemes 8da8w and
// 8da4w, opforge/quantize/dynamic.py). Each row of a is quantized per block of `group`
// along K to int8 with one float32 scale, every block's products are summed exactly in
// int32 (AVX512-VNNI vpdpbusd: 64 u8×s8 products an instruction), and the int32 block sums
// are scaled by scale_a · scale_w in float32.
//
// Contract ("int_dot_matmul"): ins [a, w, scales, (bias)], outs [d]; ia [bits, group];
// fa [eps].
//   a: f32 [M, K], columns contiguous (any row stride); d: f32 [M, N], columns contiguous,
//   rows apart by at least N, another root than a;
//   group divides K, in [1, 65536]; G = K / group blocks; L = group rounded up to 8;
//   Q = ceil(group / 4) quads of k per block (8 bits), Q2 = ceil(Q / 2) (4 bits);
//   w: uint8, dense, the weights as panels of 16 output columns, one 64-byte row per quad
//   of k (4 consecutive k of one column per 32-bit lane), panels in chunks of 4 (the last
//   chunk holds P mod 4 when 4 does not divide P), a chunk's rows ordered [G, quads,
//   panels of the chunk]: one stream per chunk, read in order (on Zen 4, 1 thread, 25 GB/s
//   where one stream per panel read 19); indexed below as [p, g, i, 64]:
//     bits 8: [P, G, Q, 64], byte [p, g, i, 4j + t] = q[16p + j, g·group + 4i + t] + 128;
//     bits 4: [P, G, Q2, 64], byte [p, g, i, 4j + t] holds q[16p + j, g·group + 8i + t] + 8
//     in its low nibble and q[16p + j, g·group + 8i + 4 + t] + 8 in its high one;
//   (P = ceil(N/16); padding columns and k past the block any value: they meet zeros);
//   scales: f32 or f16 dense [P·G, 16] (f16: 2 bytes a scale, as Q4_0/Q8_0 store theirs; the
//   lowering writes f16 when every scale is a float16 value, opforge.quantize.dynamic rounds
//   them so; read as the same float32 values), in the weights' chunk order: row (4c·G + g·n_c + t) holds
//   the weight scales of block g of panel p = 4c + t (n_c the panels of chunk c), its 16
//   columns 16p + j: a chunk's scales one stream beside its weights (a standalone copy of
//   the kernel, Zen 4, 1 thread, 768x32000 int4 from memory, loaded machine: 700-840 µs
//   where one scale stream per panel took 1,040-1,100; the weights alone 550-680);
//   bias: f32, N elements, dense. No post-ops. Work: M·K·N multiply-adds.
//
// Arithmetic, exact where the lean runtime's is (its quantize_affine of the same values):
//   per row m and block g: amax = max |a[m, k]| (k in the block), s = max(amax, eps) / 127,
//   inv = 1 / s, q[k] = clamp(round_half_even(a[m, k] · inv), -127, 127) (float32 each);
//   S[m, n, g] = Σ_k q[k] · w[n, k] in int32, exact: computed as Σ (w + off)·q - off·Σ q
//   (off 128 or 8: the weights stored unsigned, vpdpbusd's u8 operand; |Σ| < 255·127·L
//   <= 2^31 - 1 by the bound on group);
//   acc = 0; for g in order: acc = fma(float(S[m, n, g]), s[m, g] · s_w[n, g], acc);
//   d[m, n] = acc + bias[n].
// The three kernels (AVX512-VNNI, AVX2, the portable loops) compute exactly this, in this
// order: their results are equal bit for bit (AVX2's vpmaddubsw sums u8·s8 pairs in int16,
// saturating: 4 bits, 2·15·127 at most; 8 bits, it takes |w| by q with w's sign, 2·128·127,
// and Σ w·q with no correction). The lean runtime multiplies the dequantized float32 values
// (q·s rounded, q_w·s_w rounded) with NumPy's matmul in its own order: the two differ by at
// most 2·γ(K + 4)·(Σ_k |a_d·w_d| + |bias|) (tests/backends/test_cpu_int_dot.py says why).
// A NaN in a row's block makes that block's integers unspecified (not NaN as in lean).
//
// Per call: the rows are quantized (over the op's threads), then panels go in chunks of 4
// (64 columns) over the threads; within a chunk rows in blocks of up to 4, so a chunk's
// weights are read from memory once per call. OPFORGE_CPU_INT_DOT_VNNI=0 turns the VNNI
// kernel off, OPFORGE_CPU_INT_DOT_AVX2=0 the AVX2 one (taken where VNNI is not; both off:
// the portable kernel; read when the op is built).
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "int_kernels.h"

namespace ofc {

namespace {

constexpr int kLanes = kIntLanes;
constexpr int kChunk = kIntChunk;
constexpr int64_t kMaxGroup = 65536;

struct IntDotOp : IntWeightsOp {
  int64_t padded = 0;           // L: a block's quantized activations, zero padded
  int64_t quads = 0;            // 64-byte weight rows per panel and block: Q or Q2
  float eps = 0.f;
  std::vector<int8_t> aq;       // [M, G, L] this call's quantized rows
  std::vector<float> as;        // [M, G] their scales
  std::vector<int32_t> corr;    // [M, G] off · Σ q
  bool vnni = false;
  bool avx2 = false;             // the AVX2 kernel (and quantize_row_avx2)
  bool vector_quantize = false;  // quantize_row_avx512 (with the VNNI kernel: the same CPUs)
  const uint16_t* s16 = nullptr; // the scales when they are f16 (else s, f32)
  memory wmem;                   // the weights' copy (w points into it)
  void run(Engine& e) override;
};

// the weights of panel p: chunks of kChunk panels (the last one may hold fewer), each one
// stream in which block g's quad i of every panel of the chunk follow each other; returns
// block g's first quad of panel p and sets `step`, the bytes from one quad to the next
inline const uint8_t* panel_block(const IntDotOp& op, int64_t p, int64_t g, int64_t& step) {
  const int64_t c = p / kChunk, np = std::min<int64_t>(kChunk, op.panels - c * kChunk);
  step = np * 64;
  return op.w + (c * kChunk * op.groups + g * np) * op.quads * 64 + (p - c * kChunk) * 64;
}

// the index of the 16 weight scales of panel p in block g (the chunk order of the weights)
inline int64_t panel_scales(const IntDotOp& op, int64_t p, int64_t g) {
  const int64_t c = p / kChunk, np = std::min<int64_t>(kChunk, op.panels - c * kChunk);
  return (c * kChunk * op.groups + g * np + (p - c * kChunk)) * kLanes;
}

// an IEEE binary16 value as float32 (exact: every float16 value is a float32 value)
inline float half_to_float(uint16_t h) {
  const uint32_t exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) {
    v = std::ldexp((float)man, -24);  // zero or subnormal
  } else if (exp == 31) {
    v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    const uint32_t bits = ((exp + 112) << 23) | (man << 13);
    std::memcpy(&v, &bits, 4);
  }
  return (h & 0x8000) ? -v : v;
}

// one value quantized: round half to even (the default mode), clamped (NaN to -127)
inline __attribute__((always_inline)) int quantize_value(float x, float inv) {
  return (int)std::min(127.0f, std::max(-127.0f, std::nearbyint(x * inv)));
}

// one row of a, quantized per block (the contract's arithmetic; shared by the kernels;
// compiled for AVX2 too, where nearbyint is one vroundss instead of a libm call)
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
void quantize_row_scalar(IntDotOp& op, const float* x, int64_t row) {
  const int off = op.bits == 8 ? 128 : 8;
  for (int64_t g = 0; g < op.groups; ++g) {
    const float* xb = x + g * op.group;
    float amax = 0.f;
    for (int64_t i = 0; i < op.group; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float scale = std::max(amax, op.eps) / 127.0f;
    const float inv = 1.0f / scale;
    int8_t* q = op.aq.data() + (row * op.groups + g) * op.padded;
    int32_t sum = 0;
    for (int64_t i = 0; i < op.group; ++i) sum += q[i] = (int8_t)quantize_value(xb[i], inv);
    for (int64_t i = op.group; i < op.padded; ++i) q[i] = 0;
    op.as[(size_t)(row * op.groups + g)] = scale;
    op.corr[(size_t)(row * op.groups + g)] = off * sum;
  }
}

#if defined(__x86_64__)
// the same, 16 values a register: the same float32 operations on each value, so the same
// bits (a max over |x| and an int32 sum are exact in any order; vrndscaleps with
// round-to-nearest-even is nearbyint's default mode). NaN is kept out as the scalar loop's
// std::max keeps it out: vmaxps returns its second operand when either is NaN, so the amax
// ignores a NaN and a NaN product clamps to -127. The scalar loop called libm's nearbyintf
// per value (baseline x86-64 has no vector rounding): 128x768 took 370 µs, this 28
// (Zen 4, 1 thread, a standalone copy), a fifth of a prompt's int4 matmul time.
__attribute__((target("avx512f"))) void quantize_row_avx512(IntDotOp& op, const float* x, int64_t row) {
  const int off = op.bits == 8 ? 128 : 8;
  const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
  const __m512 top = _mm512_set1_ps(127.0f), bottom = _mm512_set1_ps(-127.0f);
  for (int64_t g = 0; g < op.groups; ++g) {
    const float* xb = x + g * op.group;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t i = 0; i < op.group; i += 16) {
      const __mmask16 m = op.group - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (op.group - i)) - 1);
      const __m512i v = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, xb + i));
      amax = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(v, abs_bits)), amax);
    }
    const float scale = std::max(_mm512_reduce_max_ps(amax), op.eps) / 127.0f;
    const __m512 inv = _mm512_set1_ps(1.0f / scale);
    int8_t* q = op.aq.data() + (row * op.groups + g) * op.padded;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = 0; i < op.group; i += 16) {
      const __mmask16 m = op.group - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (op.group - i)) - 1);
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xb + i), inv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i v = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, bottom), top));
      _mm512_mask_cvtepi32_storeu_epi8(q + i, m, v);
      sum = _mm512_mask_add_epi32(sum, m, sum, v);
    }
    for (int64_t i = op.group; i < op.padded; ++i) q[i] = 0;
    op.as[(size_t)(row * op.groups + g)] = scale;
    op.corr[(size_t)(row * op.groups + g)] = off * _mm512_reduce_add_epi32(sum);
  }
}

#define OFC_AVX2 __attribute__((target("avx2,fma,f16c")))
// the same, 8 values a register (NaN as above), a block's last group mod 8 one at a time
OFC_AVX2 void quantize_row_avx2(IntDotOp& op, const float* x, int64_t row) {
  const int off = op.bits == 8 ? 128 : 8;
  const __m256 abs_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 top = _mm256_set1_ps(127.0f), bottom = _mm256_set1_ps(-127.0f);
  const int64_t whole = op.group / 8 * 8;
  for (int64_t g = 0; g < op.groups; ++g) {
    const float* xb = x + g * op.group;
    __m256 amax8 = _mm256_setzero_ps();
    for (int64_t i = 0; i < whole; i += 8)
      amax8 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), abs_bits), amax8);
    float lanes[8], amax = 0.f;  // (no lane is NaN)
    _mm256_storeu_ps(lanes, amax8);
    for (float v : lanes) amax = std::max(amax, v);
    for (int64_t i = whole; i < op.group; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float scale = std::max(amax, op.eps) / 127.0f, inv = 1.0f / scale;
    const __m256 inv8 = _mm256_set1_ps(inv);
    int8_t* q = op.aq.data() + (row * op.groups + g) * op.padded;
    __m256i sum8 = _mm256_setzero_si256();
    for (int64_t i = 0; i < whole; i += 8) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i), inv8),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i v = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, bottom), top));
      sum8 = _mm256_add_epi32(sum8, v);
      const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(w16, w16));  // exact: |v| <= 127
    }
    int32_t sums[8], sum = 0;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums), sum8);
    for (int32_t v : sums) sum += v;
    for (int64_t i = whole; i < op.group; ++i) sum += q[i] = (int8_t)quantize_value(xb[i], inv);
    for (int64_t i = op.group; i < op.padded; ++i) q[i] = 0;
    op.as[(size_t)(row * op.groups + g)] = scale;
    op.corr[(size_t)(row * op.groups + g)] = off * sum;
  }
}
#endif

void quantize_row(IntDotOp& op, const float* x, int64_t row) {
#if defined(__x86_64__)
  if (op.vector_quantize) {
    quantize_row_avx512(op, x, row);
    return;
  }
  if (op.avx2) {
    quantize_row_avx2(op, x, row);
    return;
  }
#endif
  quantize_row_scalar(op, x, row);
}

// ---- portable kernel: R rows × one panel, 16 int32 sums per row and block ------------------
template <int BITS>
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
void portable_panel(const IntDotOp& op, float* d, int64_t m0, int rows, int64_t p) {
  float acc[kIntRowBlock][kLanes] = {};
  for (int64_t g = 0; g < op.groups; ++g) {
    int64_t step = 0;
    const uint8_t* wp = panel_block(op, p, g, step);
    float sw[kLanes];
    const int64_t at_s = panel_scales(op, p, g);
    for (int j = 0; j < kLanes; ++j) sw[j] = op.s16 ? half_to_float(op.s16[at_s + j]) : op.s[at_s + j];
    for (int r = 0; r < rows; ++r) {
      const int64_t at = (m0 + r) * op.groups + g;
      const int8_t* q = op.aq.data() + at * op.padded;
      int32_t sum[kLanes] = {};
      for (int64_t i = 0; i < op.quads; ++i) {
        const uint8_t* row = wp + i * step;
        for (int t = 0; t < 4; ++t) {
          if (BITS == 8) {
            const int32_t av = q[4 * i + t];
            for (int j = 0; j < kLanes; ++j) sum[j] += (int32_t)row[4 * j + t] * av;
          } else {
            const int32_t lo = q[8 * i + t], hi = q[8 * i + 4 + t];
            for (int j = 0; j < kLanes; ++j)
              sum[j] += (int32_t)(row[4 * j + t] & 15) * lo + (int32_t)(row[4 * j + t] >> 4) * hi;
          }
        }
      }
      const int32_t c = op.corr[(size_t)at];
      const float sa = op.as[(size_t)at];
      for (int j = 0; j < kLanes; ++j)
        acc[r][j] = __builtin_fmaf((float)(sum[j] - c), sa * sw[j], acc[r][j]);
    }
  }
  store_panel(op, d, m0, rows, p, acc);
}

#if defined(__x86_64__)
#define OFC_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// R rows × P panels from panel p0: per quad of k one weight register per panel (read once,
// used by every row), one broadcast of 4 activation bytes per row. A independent int32
// sums per row and panel (quads alternate between them: vpdpbusd's latency, not its
// throughput, bounds one chain); QN: the block's 64-byte rows when fixed (0: op.quads),
// so a block of 32 is one unrolled run
template <int BITS, int R, int P, int A, int QN>
OFC_VNNI void block(const IntDotOp& op, float* d, int64_t m0, int64_t p0) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(15);
  const int64_t nq = QN ? QN : op.quads;
  for (int64_t g = 0; g < op.groups; ++g) {
    __m512i sum[R][P][A];
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p)
        for (int h = 0; h < A; ++h) sum[r][p][h] = _mm512_setzero_si512();
    const uint8_t* wp[P];
    int64_t step = 0;
    for (int p = 0; p < P; ++p) wp[p] = panel_block(op, p0 + p, g, step);
    const int8_t* q[R];
    for (int r = 0; r < R; ++r) q[r] = op.aq.data() + ((m0 + r) * op.groups + g) * op.padded;
    for (int64_t i = 0; i < nq; ++i) {
      const int h = A == 1 ? 0 : (int)(i & 1);
      if (BITS == 8) {
        __m512i wv[P];
        for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_si512(wp[p] + i * step);
        for (int r = 0; r < R; ++r) {
          const __m512i av = _mm512_set1_epi32(load4(q[r] + 4 * i));
          for (int p = 0; p < P; ++p) sum[r][p][h] = _mm512_dpbusd_epi32(sum[r][p][h], wv[p], av);
        }
      } else {
        __m512i lo[P], hi[P];
        for (int p = 0; p < P; ++p) {
          const __m512i raw = _mm512_loadu_si512(wp[p] + i * step);
          lo[p] = _mm512_and_si512(raw, nib);
          hi[p] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
        }
        for (int r = 0; r < R; ++r) {
          const __m512i a0 = _mm512_set1_epi32(load4(q[r] + 8 * i));
          const __m512i a1 = _mm512_set1_epi32(load4(q[r] + 8 * i + 4));
          for (int p = 0; p < P; ++p) {
            sum[r][p][0] = _mm512_dpbusd_epi32(sum[r][p][0], lo[p], a0);
            sum[r][p][A - 1] = _mm512_dpbusd_epi32(sum[r][p][A - 1], hi[p], a1);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * op.groups + g;
      const __m512i c = _mm512_set1_epi32(op.corr[(size_t)at]);
      const __m512 sa = _mm512_set1_ps(op.as[(size_t)at]);
      for (int p = 0; p < P; ++p) {
        __m512i total = sum[r][p][0];
        if (A == 2) total = _mm512_add_epi32(total, sum[r][p][A - 1]);  // exact: int32
        const int64_t at_s = panel_scales(op, p0 + p, g);
        const __m512 sw = op.s16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(op.s16 + at_s)))
                                 : _mm512_loadu_ps(op.s + at_s);
        const __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(total, c));
        acc[r][p] = _mm512_fmadd_ps(t, _mm512_mul_ps(sa, sw), acc[r][p]);
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

// a block of 32 (the schemes' block): its quads as a fixed, unrolled count
template <int BITS, int R, int P>
OFC_VNNI void block_any(const IntDotOp& op, float* d, int64_t m0, int64_t p0) {
  constexpr int A = R <= 2 ? 2 : 1;
  if (op.group == 32) block<BITS, R, P, A, BITS == 8 ? 8 : 4>(op, d, m0, p0);
  else block<BITS, R, P, A, 0>(op, d, m0, p0);
}

// up to 2 rows: every panel of the chunk at once; 3-4 rows: two panels at a time (the
// int32 sums, float accumulators and weights then fill at most 20 of the 32 registers)
template <int BITS, int R>
OFC_VNNI void vnni_rows(const IntDotOp& op, float* d, int64_t m0, int64_t p0, int64_t np) {
  if (R <= 2) {
    with_panels(np, [&](auto P) { block_any<BITS, R, P.value>(op, d, m0, p0); });
    return;
  }
  int64_t p = 0;
  for (; p + 2 <= np; p += 2) block_any<BITS, R, 2>(op, d, m0, p0 + p);
  if (p < np) block_any<BITS, R, 1>(op, d, m0, p0 + p);
}

// ---- AVX2 kernel: R rows × P panels, a panel's 64-byte quad row two registers -------------
// 4 bits: vpmaddubsw(nibbles, q) summed in int16 over up to 4 quad rows (4·2·2·15·127 < 2^15),
// then vpmaddwd to int32; 8 bits: vpmaddubsw(|w|, q with w's sign), vpmaddwd every quad row.
// The int32 sums are S (+ corr, 4 bits); the epilogue is portable_panel's.
OFC_AVX2 inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
template <int BITS, int R, int P, int QN>
OFC_AVX2 void avx2_block(const IntDotOp& op, float* d, int64_t m0, int64_t p0) {
  __m256 acc[R][P][2] = {};
  const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
  const int64_t nq = QN ? QN : op.quads;
  for (int64_t g = 0; g < op.groups; ++g) {
    __m256i sum[R][P][2] = {};
    const uint8_t* wp[P];
    int64_t step = 0;
    for (int p = 0; p < P; ++p) wp[p] = panel_block(op, p0 + p, g, step);
    const int8_t* q[R];
    for (int r = 0; r < R; ++r) q[r] = op.aq.data() + ((m0 + r) * op.groups + g) * op.padded;
    if (BITS == 8) {
      for (int64_t i = 0; i < nq; ++i) {
        __m256i ws[P][2], wa[P][2];  // w as int8; |w| as uint8 (128 for -128)
        for (int p = 0; p < P; ++p)
          for (int h = 0; h < 2; ++h)
            wa[p][h] = _mm256_abs_epi8(ws[p][h] = _mm256_xor_si256(load32(wp[p] + i * step + 32 * h), flip));
        for (int r = 0; r < R; ++r) {
          const __m256i av = _mm256_set1_epi32(load4(q[r] + 4 * i));
          for (int p = 0; p < P; ++p)
            for (int h = 0; h < 2; ++h)
              sum[r][p][h] = _mm256_add_epi32(
                  sum[r][p][h],
                  _mm256_madd_epi16(_mm256_maddubs_epi16(wa[p][h], _mm256_sign_epi8(av, ws[p][h])), ones));
        }
      }
    } else {
      __m256i part[R][P][2] = {};
      for (int64_t i = 0; i < nq; ++i) {
        __m256i lo[P][2], hi[P][2];
        for (int p = 0; p < P; ++p)
          for (int h = 0; h < 2; ++h) {
            const __m256i raw = load32(wp[p] + i * step + 32 * h);
            lo[p][h] = _mm256_and_si256(raw, nib);
            hi[p][h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
          }
        for (int r = 0; r < R; ++r) {
          const __m256i a0 = _mm256_set1_epi32(load4(q[r] + 8 * i));
          const __m256i a1 = _mm256_set1_epi32(load4(q[r] + 8 * i + 4));
          for (int p = 0; p < P; ++p)
            for (int h = 0; h < 2; ++h)
              part[r][p][h] = _mm256_add_epi16(
                  part[r][p][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[p][h], a0),
                                                  _mm256_maddubs_epi16(hi[p][h], a1)));
        }
        if ((i & 3) == 3 || i + 1 == nq)  // widened to int32 every 4 quad rows
          for (int t = 0; t < R * P * 2; ++t) {
            __m256i& to = (&sum[0][0][0])[t];
            to = _mm256_add_epi32(to, _mm256_madd_epi16((&part[0][0][0])[t], ones));
            (&part[0][0][0])[t] = _mm256_setzero_si256();
          }
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * op.groups + g;
      const __m256i c = _mm256_set1_epi32(BITS == 8 ? 0 : op.corr[(size_t)at]);
      const __m256 sa = _mm256_set1_ps(op.as[(size_t)at]);
      for (int p = 0; p < P; ++p) {
        const int64_t at_s = panel_scales(op, p0 + p, g);
        for (int h = 0; h < 2; ++h) {
          const __m256 sw = op.s16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(op.s16 + at_s + 8 * h)))
                                   : _mm256_loadu_ps(op.s + at_s + 8 * h);
          const __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[r][p][h], c));
          acc[r][p][h] = _mm256_fmadd_ps(t, _mm256_mul_ps(sa, sw), acc[r][p][h]);
        }
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    float out[kIntRowBlock][kLanes];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out[r] + 8 * h, acc[r][p][h]);
    store_panel(op, d, m0, R, p0 + p, out);
  }
}

template <int BITS, int R, int P>  // a block of 32: its quads a fixed, unrolled count
OFC_AVX2 void avx2_block_any(const IntDotOp& op, float* d, int64_t m0, int64_t p0) {
  if (op.group == 32) avx2_block<BITS, R, P, BITS == 8 ? 8 : 4>(op, d, m0, p0);
  else avx2_block<BITS, R, P, 0>(op, d, m0, p0);
}

// 1 row: every panel of the chunk at once; 2 rows: two panels at a time; 3-4 rows: one (16
// ymm registers: the int32 sums, weights and broadcasts of one quad row)
template <int BITS, int R>
OFC_AVX2 void avx2_rows(const IntDotOp& op, float* d, int64_t m0, int64_t p0, int64_t np) {
  if (R == 1) {
    with_panels(np, [&](auto P) { avx2_block_any<BITS, R, P.value>(op, d, m0, p0); });
    return;
  }
  constexpr int PP = R == 2 ? 2 : 1;
  int64_t p = 0;
  for (; p + PP <= np; p += PP) avx2_block_any<BITS, R, PP>(op, d, m0, p0 + p);
  if (p < np) avx2_block_any<BITS, R, 1>(op, d, m0, p0 + p);
}
#endif

// one chunk of np panels from p0, every row
template <int BITS>
void chunk(const IntDotOp& op, float* d, int64_t p0, int64_t np) {
  for_each_row_block(op.m, [&](int64_t m0, auto R) {
#if defined(__x86_64__)
    if (op.vnni) {
      vnni_rows<BITS, R.value>(op, d, m0, p0, np);
      return;
    }
    if (op.avx2) {
      avx2_rows<BITS, R.value>(op, d, m0, p0, np);
      return;
    }
#endif
    for (int64_t p = p0; p < p0 + np; ++p) portable_panel<BITS>(op, d, m0, R.value, p);
  });
}

void IntDotOp::run(Engine& e) {
  const float* a = static_cast<const float*>(e.ptr(ins[0]));
  float* d = static_cast<float*>(e.ptr(outs[0]));
  parallel_for(m > 1 ? team : 1, m, [&](int64_t r) { quantize_row(*this, a + r * sa, r); });
  for_each_chunk(*this, [&](int64_t p0, int64_t np) {
    if (bits == 8) chunk<8>(*this, d, p0, np);
    else chunk<4>(*this, d, p0, np);
  });
}

bool vnni_allowed() {
#if defined(__x86_64__)
  return own_kernels_allowed() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && switched_on("OPFORGE_CPU_INT_DOT_VNNI");
#else
  return false;
#endif
}

bool avx2_allowed() {
#if defined(__x86_64__)
  return avx2_kernel_allowed("OPFORGE_CPU_INT_DOT_AVX2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

}  // namespace

void contract_int_dot_matmul(const Engine& e, const OpCall& c) {
  const std::string& kind = c.kind;
  int64_t M = 0, K = 0, N = 0;
  need_int_weights_operands(e, c, M, K, N);
  need(c.ia.size() == 2 && c.fa.size() == 1, kind, "takes ia [bits, group] and fa [eps]");
  const int64_t bits = c.ia[0], group = c.ia[1];
  const double eps = c.fa[0];
  need(bits == 4 || bits == 8, kind, "bits must be 4 or 8");
  need(eps > 0 && eps <= 1 && (double)(float)eps == eps, kind,
       "eps must be a float32 value in (0, 1]");
  const Tensor& w = e.tensors[(size_t)c.ins[1]];
  const Tensor& s = e.tensors[(size_t)c.ins[2]];
  need(group >= 1 && group <= kMaxGroup && K % group == 0, kind,
       "group must divide K and be in [1, 65536] (its int32 sums then cannot overflow)");
  const int64_t P = (N + kLanes - 1) / kLanes, G = K / group;
  const int64_t Q = (group + 3) / 4, rows = bits == 8 ? Q : (Q + 1) / 2;
  need(w.dtype == U8 && w.dims == dims_t({P, G, rows, 64}) && row_major(w) && dense(w), kind,
       "w must be uint8 dense [ceil(N/16), K/group, ceil(group/4) (8 bits) or "
       "ceil(group/8) (4 bits), 64]");
  need((s.dtype == F32 || s.dtype == F16) && s.dims == dims_t({P * G, kLanes}) && row_major(s) &&
           dense(s),
       kind, "scales must be f32 or f16 dense [ceil(N/16)·K/group, 16] in the weights' chunk order "
       "(a program exported before this layout: export it again)");
  // the quantized rows: M·G·L bytes
  const int64_t padded = (group + 7) / 8 * 8;
  int64_t bytes = 0;
  need(!__builtin_mul_overflow(M, G, &bytes) && !__builtin_mul_overflow(bytes, padded, &bytes) &&
           bytes <= kMaxElements,
       kind, "the quantized rows (M·(K/group)·group rounded up to 8 bytes) exceed 2^40");
}

void build_int_dot_matmul(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  const char* what = "int_dot_matmul";
  auto op = std::make_unique<IntDotOp>();
  int_weights_setup(e, c, *op, e.tensors[(size_t)c.ins[0]].dims[1] / c.ia[1], what);
  op->padded = (op->group + 7) / 8 * 8;
  const int64_t q = (op->group + 3) / 4;
  op->quads = op->bits == 8 ? q : (q + 1) / 2;
  op->eps = (float)c.fa[0];
  const int64_t blocks = mul_c(op->m, op->groups, what);
  const int64_t bytes = mul_c(blocks, op->padded, what);
  e.reserve(add_c(bytes, mul_c(blocks, 8, what), what), "int_dot_matmul quantized rows");
  op->aq.assign((size_t)bytes, 0);
  op->as.assign((size_t)blocks, 0.f);
  op->corr.assign((size_t)blocks, 0);
  op->vnni = vnni_allowed();
  op->avx2 = !op->vnni && avx2_allowed();
  op->vector_quantize = op->vnni;  // OPFORGE_CPU_INT_DOT_VNNI=0: both scalar (the tests' A/B)
  // the weights copied once at init into transparent huge pages (constants.cpp's
  // const_memory; shared by the program's engines through the weight cache; the file's pages
  // given back after init, file_pages.py): read in place from the program's 4 KB pages, a
  // TLB miss every 4 KB, one row streamed 15-19 GB/s, from 2 MB pages 29-30 (a standalone
  // copy of the kernel, 768x32000 and 768x2048 int4, Zen 4, 1 thread). The scales (1/9 of
  // the bytes) are read in place (their pages come back on the first call).
  const int64_t wbytes = e.tensors[(size_t)c.ins[1]].numel;  // uint8, a multiple of 64
  const uint8_t* wfrom = op->w;
  op->wmem = derived_const(e, c.ins[1], memory::desc({wbytes / 4}, memory::data_type::f32, memory::format_tag::a),
                           [&](float* to) { std::memcpy(to, wfrom, (size_t)wbytes); });
  op->w = static_cast<const uint8_t*>(op->wmem.get_data_handle());
  if (e.tensors[(size_t)c.ins[2]].dtype == F16) op->s16 = static_cast<const uint16_t*>(e.ptr(c.ins[2]));
  op->name = std::string("matmul of int8 activations on int") + (op->bits == 8 ? "8" : "4") +
             " weights (own kernel" + (op->vnni ? ", AVX512-VNNI)" : op->avx2 ? ", AVX2)" : ")");
  push_op(e, std::move(op), c);
}

}  // namespace ofc
