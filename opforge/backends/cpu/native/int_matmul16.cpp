// int_matmul's int16 mode: 4-bit weights against activations that lie on a 16-bit
// quantized grid (fa [s]: every value of a is fl(i·s) for an integer i, |i| <= 65535, what a
// 16-bit scheme's dequantize writes; lowering/int_weights.py passes s only when the graph
// says so). Each row of a is made integers once a call, i = round(a · fl(1/s)) (exact:
// fl(fl(i·s) · fl(1/s)) lies within 0.012 of i for |i| <= 2^16, lowering/quantized.py's
// _on_grid), stored as int16 v = i - shift (shift 0 where every i of the row fits int16,
// else min(i) + 32768: an asymmetric grid's row, a SwiGLU product's, spans at most 65535
// steps), and each block's products are summed exactly in int32 by AVX512-VNNI vpdpwssd (32
// int16 products an instruction, a pair of k per 32-bit lane): where int_matmul's float
// path spends ~4 vector instructions per k and 16 columns (unpack, scale, multiply-add),
// this one spends ~0.75 (a shift, an and and a vpdpwssd per 2 k; 1.25 for a shifted row).
// A CPU without AVX512-VNNI runs int_matmul16_avx2.cpp's kernel instead: the same int32
// sums by AVX2's vpmaddwd and vpaddd, the same results bit for bit.
//
// Arithmetic: per row m and block g, S = Σ_k i[k]·q[k, n] in int32, exact: computed as
// Σ v·(q + 8) - 8·Σ v + shift·(Σ (q + 8) - 8·l8) (the weights' nibbles stored + 8, a
// block's pads v = 0 and q + 8 = 8), modulo 2^32, and |S| <= 65535·8·group < 2^31 for group
// <= 4096; acc = fma(float(S), scale_w[n, g], acc) for g in order; d[m, n] = fma(acc, s,
// bias[n]). Against the lean runtime (the float32 values fl(i·s) and fl(q·scale) multiplied
// in float32, any order): each side lies within γ(K+1) resp. γ(G+5) times (Σ|a·w| + |bias|)
// of the exact sum of lean's operands (the int sum is exact; the conversion, G fused
// multiply-adds and the final fma are G+2 roundings, and fl(i·s), fl(q·scale) are i·s,
// q·scale within a relative 2^-24 each), so they differ by at most (γ(K+1) + γ(G+5))·(Σ_k
// |a·w| + |bias|) (tests/backends/test_cpu_int_matmul16.py holds each side to its own).
// A row past that (an i past ±65535, a span past 65535, a NaN or an infinity) makes the
// whole call take int_matmul's float path (the dequantize-once one, from this layout): its
// arithmetic, its bound; so do M >= kWideRows (a prompt), on this layout.
//
// Layout (made at build from the contract's [P, ceil(K/2), 16] bytes; the file keeps the
// contract's): a block's activations padded with zeros to l8 = group rounded up to 8, each
// 8 of k one "row" of 64 bytes per panel: lane j's 32-bit word holds column 16p + j's
// (q + 8) of k = 8o + t at bits 16·(t mod 2) + 4·(t div 2) (so `(word >> 4u) & 0x000F000F`
// is the int16 pair of k 2u, 2u + 1); rows ordered [chunk of 4 panels][block][row][panel],
// one stream per chunk (int_dot_matmul.cpp's order); the scales likewise [chunk][block]
// [panel][16]. The copies are in transparent huge pages (constants.cpp).
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "int_kernels.h"

namespace ofc {

namespace {

constexpr int kLanes = kIntLanes;
constexpr int kChunk = kIntChunk;
constexpr int kPairRows = 2;  // rows per block of the VNNI kernel (2 × 4 panels: 16 sums, 16 accumulators)

// the contract's weights (`from`: [P, ceil(K/2), 16]) in this mode's layout
void repack_weights(const IntMatmulOp& op, const uint8_t* from, uint32_t* to) {
  for (int64_t p = 0; p < op.panels; ++p)
    for (int64_t g = 0; g < op.groups; ++g)
      for (int64_t o = 0; o < op.octs; ++o) {
        uint32_t* row = to + int16_row(op, p, g, o) * kLanes;
        for (int j = 0; j < kLanes; ++j) {
          uint32_t word = 0;
          for (int t = 0; t < 8; ++t) {
            const int64_t r = 8 * o + t, k = g * op.group + r;
            uint32_t u = 8;  // q = 0 past the block (its activations are zeros)
            if (r < op.group && k < op.k) u = (from[(p * op.kr + k / 2) * kLanes + j] >> (4 * (k & 1))) & 15;
            word |= u << (16 * (t & 1) + 4 * (t >> 1));
          }
          row[j] = word;
        }
      }
}

// the contract's scales (`from`: [P, G, 16]) in this mode's order
void repack_scales(const IntMatmulOp& op, const float* from, float* to) {
  for (int64_t p = 0; p < op.panels; ++p)
    for (int64_t g = 0; g < op.groups; ++g)
      std::memcpy(to + int16_scales(op, p, g), from + (p * op.groups + g) * kLanes, kLanes * sizeof(float));
}

#if defined(__x86_64__)
#define OFC_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// row m of a as integers v = i - shift[m] (aq, corr, shift): shift 0 where every i fits
// int16, else min(i) + 32768; false where one is past ±65535 or they span more than 65535
// steps (or one is not a number: cvtps2dq gives INT_MIN)
OFC_VNNI bool quantize_row(IntMatmulOp& op, const float* x, int64_t m) {
  const __m512 inv = _mm512_set1_ps(op.act_inv);
  __m512i lo = _mm512_set1_epi32(INT32_MAX), hi = _mm512_set1_epi32(INT32_MIN);
  for (int64_t k = 0; k < op.k; k += kLanes) {
    const int64_t left = op.k - k;
    const __mmask16 in = left >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    // round to nearest even (the default MXCSR)
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k), inv));
    lo = _mm512_mask_min_epi32(lo, in, lo, v);
    hi = _mm512_mask_max_epi32(hi, in, hi, v);
  }
  const int64_t low = _mm512_reduce_min_epi32(lo), high = _mm512_reduce_max_epi32(hi);
  int32_t shift = 0;
  if (!int16_row_shift(low, high, shift)) return false;
  op.shift[(size_t)m] = shift;
  const __m512i by = _mm512_set1_epi32(shift);
  for (int64_t g = 0; g < op.groups; ++g) {
    const int64_t k0 = g * op.group, n = std::min(op.group, op.k - k0);
    int16_t* q = op.aq.data() + (m * op.groups + g) * op.l8;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = 0; i < op.l8; i += kLanes) {
      const int64_t left = n - i, room = op.l8 - i;
      const __mmask16 in = left >= kLanes ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
      const __mmask16 out = room >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << room) - 1);
      const __m512i v = _mm512_maskz_sub_epi32(
          in, _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k0 + i), inv)), by);
      sum = _mm512_add_epi32(sum, v);
      _mm512_mask_cvtepi32_storeu_epi16(q + i, out, v);  // pads 0
    }
    op.corr[(size_t)(m * op.groups + g)] = 8 * _mm512_reduce_add_epi32(sum);
  }
  return true;
}

// R rows from m0 × P panels from p0 (a chunk's first panel): int32 block sums, then the
// float accumulation of the contract's arithmetic
template <int R, int P, bool SHIFTED>
OFC_VNNI void block16(const IntMatmulOp& op, float* d, int64_t m0, int64_t p0) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi32(0x000F000F);
  const uint8_t* w = op.w + int16_row(op, p0, 0, 0) * 64;  // the chunk's stream, read in order
  for (int64_t g = 0; g < op.groups; ++g) {
    __m512i s[R][P], u[P];  // u: Σ (q + 8) over the block, for the shifted rows
    for (int p = 0; p < P; ++p) {
      u[p] = _mm512_setzero_si512();
      for (int r = 0; r < R; ++r) s[r][p] = _mm512_setzero_si512();
    }
    const int16_t* ar[R];
    for (int r = 0; r < R; ++r) ar[r] = op.aq.data() + ((m0 + r) * op.groups + g) * op.l8;
    for (int64_t o = 0; o < op.octs; ++o, w += P * 64) {
      __m512i a[R][4];
      for (int r = 0; r < R; ++r)
        for (int u = 0; u < 4; ++u) {
          int32_t pair;
          std::memcpy(&pair, ar[r] + 8 * o + 2 * u, 4);
          a[r][u] = _mm512_set1_epi32(pair);
        }
      for (int p = 0; p < P; ++p) {
        const __m512i v = _mm512_loadu_si512(w + p * 64);
        const __m512i w0 = _mm512_and_si512(v, nib);
        const __m512i w1 = _mm512_and_si512(_mm512_srli_epi32(v, 4), nib);
        const __m512i w2 = _mm512_and_si512(_mm512_srli_epi32(v, 8), nib);
        const __m512i w3 = _mm512_and_si512(_mm512_srli_epi32(v, 12), nib);
        for (int r = 0; r < R; ++r) {
          s[r][p] = _mm512_dpwssd_epi32(s[r][p], w0, a[r][0]);
          s[r][p] = _mm512_dpwssd_epi32(s[r][p], w1, a[r][1]);
          s[r][p] = _mm512_dpwssd_epi32(s[r][p], w2, a[r][2]);
          s[r][p] = _mm512_dpwssd_epi32(s[r][p], w3, a[r][3]);
        }
        if (SHIFTED)  // (int16 sums of 4 nibbles: at most 60)
          u[p] = _mm512_dpwssd_epi32(u[p], _mm512_add_epi16(_mm512_add_epi16(w0, w1), _mm512_add_epi16(w2, w3)),
                                     _mm512_set1_epi32(0x00010001));
      }
    }
    for (int p = 0; p < P; ++p) {
      const __m512 sc = _mm512_loadu_ps(op.s + int16_scales(op, p0 + p, g));
      for (int r = 0; r < R; ++r) {
        const __m512i c = _mm512_set1_epi32(op.corr[(size_t)((m0 + r) * op.groups + g)]);
        __m512i sum = _mm512_sub_epi32(s[r][p], c);  // Σ v·q
        if (SHIFTED)  // + shift · Σ q (the pads' q + 8 = 8 and v = 0: Σ q = Σ (q + 8) - 8·l8)
          sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_set1_epi32(op.shift[(size_t)(m0 + r)]),
                                                         _mm512_sub_epi32(u[p], _mm512_set1_epi32((int)(8 * op.l8)))));
        acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, acc[r][p]);
      }
    }
  }
  const __m512 sa = _mm512_set1_ps(op.act_scale);
  for (int p = 0; p < P; ++p) {
    const int64_t col = (p0 + p) * kLanes;
    const __mmask16 mask = panel_mask(op, col);
    const __m512 bias = _mm512_loadu_ps(op.bias.data() + col);
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(d + (m0 + r) * op.sd + col, mask, _mm512_fmadd_ps(acc[r][p], sa, bias));
  }
}
#endif

}  // namespace

Int16Kernel int16_kernel(bool vector512, bool avx2) {
#if defined(__x86_64__)
  if (!switched_on("OPFORGE_CPU_INT_MATMUL_INT16")) return Int16Kernel::none;
  if (vector512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni") &&
      switched_on("OPFORGE_CPU_INT_MATMUL_VNNI"))
    return Int16Kernel::vnni;
  // vpmaddwd: every CPU with AVX2; the dequantize-once path (a prompt, a row off its grid)
  // needs the op's AVX-512 or AVX2 float kernels
  if ((vector512 || avx2) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return Int16Kernel::avx2;
#else
  (void)vector512, (void)avx2;
#endif
  return Int16Kernel::none;
}

void int16_setup(Engine& e, const OpCall& c, IntMatmulOp& op) {
  const char* what = "int_matmul";
  op.act16 = true;
  op.act_scale = (float)c.fa[0];
  op.act_inv = 1.f / op.act_scale;
  op.l8 = (op.group + 7) / 8 * 8;
  op.octs = op.l8 / 8;
  const int64_t rows = mul_c(mul_c(op.panels, op.groups, what), op.octs, what);  // 64-byte rows
  if (!op.wide) {  // (the wide path never makes them: a prompt's M is not kept)
    const int64_t blocks = mul_c(op.m, op.groups, what);
    const int64_t values = mul_c(blocks, op.l8, what);
    e.reserve(add_c(mul_c(values, 2, what), mul_c(add_c(blocks, op.m, what), 4, what), what),
              "int_matmul int16 activations");
    op.aq.assign((size_t)values, 0);
    op.corr.assign((size_t)blocks, 0);
    op.shift.assign((size_t)op.m, 0);
  }
  const uint8_t* wfrom = op.w;
  const float* sfrom = op.s;
  // 2-d descriptors: another key in the weight cache than the float path's 1-d copies
  op.wmem = derived_const(e, c.ins[1], memory::desc({rows, kLanes}, memory::data_type::f32, memory::format_tag::ab),
                          [&](float* to) { repack_weights(op, wfrom, reinterpret_cast<uint32_t*>(to)); });
  op.w = static_cast<const uint8_t*>(op.wmem.get_data_handle());
  op.smem = derived_const(e, c.ins[2],
                          memory::desc({op.panels * op.groups, kLanes}, memory::data_type::f32, memory::format_tag::ab),
                          [&](float* to) { repack_scales(op, sfrom, to); });
  op.s = static_cast<const float*>(op.smem.get_data_handle());
}

bool int16_run(IntMatmulOp& op, const float* a, float* d) {
#if defined(__x86_64__)
  const bool vnni = op.int16 == Int16Kernel::vnni;
  bool shifted = false;
  for (int64_t m = 0; m < op.m; ++m) {
    const float* x = a + m * op.sa;
    if (!(vnni ? quantize_row(op, x, m) : int16_avx2_quantize_row(op, x, m))) return false;
    shifted = shifted || op.shift[(size_t)m] != 0;
  }
  for_each_chunk(op, [&](int64_t p0, int64_t np) {
    if (!vnni) {
      int16_avx2_chunk(op, d, p0, np, shifted);
      return;
    }
    for (int64_t m0 = 0; m0 < op.m; m0 += kPairRows) {
      with_panels(np, [&](auto P) {
        if (op.m - m0 >= 2) {
          if (shifted) block16<2, P.value, true>(op, d, m0, p0);
          else block16<2, P.value, false>(op, d, m0, p0);
        } else {
          if (shifted) block16<1, P.value, true>(op, d, m0, p0);
          else block16<1, P.value, false>(op, d, m0, p0);
        }
      });
    }
  });
  return true;
#else
  (void)op, (void)a, (void)d;
  return false;
#endif
}

#if defined(__x86_64__)
// chunk p0's weights for k in [k0, k0 + kn) as float32(q) · scale into wf[k - k0][64] (the
// products int_matmul.cpp's dequantize_chunk makes from the contract's layout)
__attribute__((target("avx512f"))) static void dequantize_chunk16_avx512(const IntMatmulOp& op, int64_t p0, int np,
                                                            int64_t k0, int64_t kn, float* wf) {
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int p = 0; p < np; ++p) {
    int64_t g = k0 / op.group, r = k0 - g * op.group;  // kk's block and its place in it
    __m512 sc = _mm512_loadu_ps(op.s + int16_scales(op, p0 + p, g));
    for (int64_t kk = k0; kk < k0 + kn; ++kk, ++r) {
      if (r == op.group) {
        ++g, r = 0;
        sc = _mm512_loadu_ps(op.s + int16_scales(op, p0 + p, g));
      }
      const int64_t t = r & 7;
      const __m512i v = _mm512_loadu_si512(op.w + int16_row(op, p0 + p, g, r >> 3) * 64);
      const __m128i shift = _mm_cvtsi32_si128((int)(16 * (t & 1) + 4 * (t >> 1)));
      const __m512 q = _mm512_permutexvar_ps(_mm512_srl_epi32(v, shift), table);  // low 4 bits
      _mm512_store_ps(wf + (kk - k0) * (kChunk * kLanes) + p * kLanes, _mm512_mul_ps(q, sc));
    }
  }
}

void dequantize_chunk16(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf) {
  if (op.vector512) dequantize_chunk16_avx512(op, p0, np, k0, kn, wf);
  else int16_avx2_dequantize(op, p0, np, k0, kn, wf);
}
#else
void dequantize_chunk16(const IntMatmulOp&, int64_t, int, int64_t, int64_t, float*) {}
#endif

}  // namespace ofc
