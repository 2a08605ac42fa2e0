// The uint8 depthwise 3×3 convolution of 8a8w models (MobileNet's), with the engine's own
// AVX-512 VNNI kernel; every other qconv, and CPUs without AVX512-VNNI/BW (or with
// OPFORGE_CPU_CAPABILITY=default), stay on oneDNN (quantization.cpp).
//
// Taken when: 2-d, groups == input channels == output channels (weights [C, 1, 1, 3, 3]),
// C a multiple of 64, stride 1 or 2, no dilation, source and destination channels-last
// and dense, weight scales per channel (mask 0b11) or one, and the post-ops only eltwise
// linear, round, clip and relu without slope (what the lowering's requantization and
// relu/hardtanh give).
//
// Arithmetic, as oneDNN's int8 convolution: acc = Σ_taps x·w in int32 (a tap outside the
// image reads the source zero point, the quantized 0), f = (acc - zp_x·Σw)·(s_x·s_w[c]) +
// bias[c] in float32, the post-ops on f, then y = clamp(round_half_even(f·(1/s_y)) + zp_y,
// 0, 255). Float32 products in another order than lean's: a value on a rounding boundary
// may move one step, as with oneDNN.
//
// The kernel: per output pixel and 64 channels, the 9 taps in three groups of four (the
// last padded with zero weights); the four tap vectors are interleaved with byte and word
// unpacks into four vectors whose 32-bit lanes hold one channel's four taps, each summed by
// one vpdpbusd against weights interleaved the same way at init. The lanes' channel order
// (lane 4·l + i of vector j holds channel 16·l + 4·j + i) is undone by the saturating packs
// of the epilogue, which work per 128-bit lane the same way. Why: oneDNN 3.2's int8
// depthwise (jit_int8) took 22 µs on 384 channels at 14×14 and 31 µs on 576 (one thread,
// Zen 5, MobileNetV2 8a8w's layers); this takes 11-13 and 21. A block costs the same
// whatever part of its 64 channels is used, so C % 64 != 0 (32, 96, 144 there, where
// oneDNN was as fast or faster) stays on oneDNN.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cmath>
#include <cstring>

#include "engine.h"

namespace ofc {

void conv_window(const std::vector<int64_t>& ia, size_t first, memory::dims& strides,
                 memory::dims& dil, memory::dims& pl, memory::dims& pr);

#if defined(__x86_64__)
namespace {

constexpr int kBlock = 64;  // channels per vector of bytes

struct Epi {  // one post-op of the allowed kinds
  int kind;   // 0 linear (a·x + b), 1 round half to even, 2 clip [a, b] (relu: [0, inf])
  float a, b;
};

struct QDepthwiseOp : Op {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0, stride = 1, pad_t = 0, pad_l = 0;
  int64_t blocks = 0;
  // per block: 3 groups × 4 vectors of 64 s8 weights (interleaved), then the epilogue's
  // per-lane constants in the same lane order: comp (int32), mul and bias (float) × 4 × 16
  std::vector<int8_t> wq;
  std::vector<int32_t> comp;
  std::vector<float> mul, bias;
  std::vector<uint8_t> zp_row;  // C source zero points: the taps outside the image
  std::vector<Epi> post;
  float inv_y = 1, zp_y = 0;

  void run(Engine& e) override;
};

#define OFC_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// lanes [k, k + 16): (acc - zp_x·Σw)·(s_x·s_w) + bias, in float32
OFC_VNNI inline __m512 scaled(const QDepthwiseOp& op, __m512i acc, int64_t k) {
  __m512i s = _mm512_sub_epi32(acc, _mm512_loadu_si512(op.comp.data() + k));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(op.mul.data() + k),
                         _mm512_loadu_ps(op.bias.data() + k));
}

// to uint8, in int32 lanes: × 1/s_y, at most 2^24 (a larger float converts to INT_MIN; a
// NaN, an inf scale's 0·inf, becomes 2^24 too), rounded half to even by the conversion,
// + zp_y; the packs after it saturate to 0..255
OFC_VNNI inline __m512i to_u8(__m512 f, __m512 inv, __m512i zpy) {
  f = _mm512_min_ps(_mm512_mul_ps(f, inv), _mm512_set1_ps(16777216.f));
  return _mm512_add_epi32(_mm512_cvtps_epi32(f), zpy);
}

OFC_VNNI void pixel_row(const QDepthwiseOp& op, const uint8_t* x, uint8_t* y, int64_t img, int64_t r) {
  const int64_t C = op.c;
  const __m512 inv = _mm512_set1_ps(op.inv_y);
  const __m512i zpy = _mm512_set1_epi32((int)op.zp_y);
  const __m512i zero = _mm512_setzero_si512();
  const uint8_t* taps[12];
  const int64_t ir0 = r * op.stride - op.pad_t;
  const bool rows_inside = ir0 >= 0 && ir0 + 2 < op.h;
  for (int64_t col = 0; col < op.ow; ++col) {
    const int64_t ic0 = col * op.stride - op.pad_l;
    if (rows_inside && ic0 >= 0 && ic0 + 2 < op.w) {  // every tap inside: three rows of three
      const uint8_t* p = x + ((img * op.h + ir0) * op.w + ic0) * C;
      for (int t = 0; t < 9; ++t) taps[t] = p + (t / 3) * op.w * C + (t % 3) * C;
    } else {
      for (int t = 0; t < 9; ++t) {
        int64_t ih = ir0 + t / 3, iw = ic0 + t % 3;
        taps[t] = ih >= 0 && ih < op.h && iw >= 0 && iw < op.w
                      ? x + ((img * op.h + ih) * op.w + iw) * C : op.zp_row.data();
      }
    }
    taps[9] = taps[10] = taps[11] = taps[8];  // their weights are 0
    uint8_t* out = y + ((img * op.oh + r) * op.ow + col) * C;
    for (int64_t b = 0; b < op.blocks; ++b) {
      const int64_t c0 = b * kBlock;
      const int64_t left = C - c0;
      const __mmask64 m = left >= kBlock ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
      const __m512i* wv = reinterpret_cast<const __m512i*>(op.wq.data()) + b * 12;
      __m512i acc0 = zero, acc1 = zero, acc2 = zero, acc3 = zero;
      for (int g = 0; g < 3; ++g) {
        __m512i v0 = _mm512_maskz_loadu_epi8(m, taps[4 * g] + c0);
        __m512i v1 = _mm512_maskz_loadu_epi8(m, taps[4 * g + 1] + c0);
        __m512i v2 = _mm512_maskz_loadu_epi8(m, taps[4 * g + 2] + c0);
        __m512i v3 = _mm512_maskz_loadu_epi8(m, taps[4 * g + 3] + c0);
        __m512i a = _mm512_unpacklo_epi8(v0, v1), bb = _mm512_unpackhi_epi8(v0, v1);
        __m512i cc = _mm512_unpacklo_epi8(v2, v3), d = _mm512_unpackhi_epi8(v2, v3);
        acc0 = _mm512_dpbusd_epi32(acc0, _mm512_unpacklo_epi16(a, cc), _mm512_loadu_si512(wv + 4 * g));
        acc1 = _mm512_dpbusd_epi32(acc1, _mm512_unpackhi_epi16(a, cc), _mm512_loadu_si512(wv + 4 * g + 1));
        acc2 = _mm512_dpbusd_epi32(acc2, _mm512_unpacklo_epi16(bb, d), _mm512_loadu_si512(wv + 4 * g + 2));
        acc3 = _mm512_dpbusd_epi32(acc3, _mm512_unpackhi_epi16(bb, d), _mm512_loadu_si512(wv + 4 * g + 3));
      }
      const int64_t k = b * 64;
      __m512 f0 = scaled(op, acc0, k), f1 = scaled(op, acc1, k + 16);
      __m512 f2 = scaled(op, acc2, k + 32), f3 = scaled(op, acc3, k + 48);
      for (const Epi& p : op.post) {
        const __m512 pa = _mm512_set1_ps(p.a), pb = _mm512_set1_ps(p.b);
        switch (p.kind) {
          case 0:
            f0 = _mm512_fmadd_ps(f0, pa, pb); f1 = _mm512_fmadd_ps(f1, pa, pb);
            f2 = _mm512_fmadd_ps(f2, pa, pb); f3 = _mm512_fmadd_ps(f3, pa, pb);
            break;
          case 1:
            f0 = _mm512_roundscale_ps(f0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            f1 = _mm512_roundscale_ps(f1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            f2 = _mm512_roundscale_ps(f2, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            f3 = _mm512_roundscale_ps(f3, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            break;
          default:  // clip [a, b]; relu is clip [0, +inf]
            f0 = _mm512_min_ps(_mm512_max_ps(f0, pa), pb); f1 = _mm512_min_ps(_mm512_max_ps(f1, pa), pb);
            f2 = _mm512_min_ps(_mm512_max_ps(f2, pa), pb); f3 = _mm512_min_ps(_mm512_max_ps(f3, pa), pb);
            break;
        }
      }
      __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(to_u8(f0, inv, zpy), to_u8(f1, inv, zpy)),
                                          _mm512_packs_epi32(to_u8(f2, inv, zpy), to_u8(f3, inv, zpy)));
      _mm512_mask_storeu_epi8(out + c0, m, bytes);
    }
  }
}

void QDepthwiseOp::run(Engine& e) {
  const uint8_t* x = static_cast<const uint8_t*>(e.ptr(ins[0]));
  uint8_t* y = static_cast<uint8_t*>(e.ptr(outs[0]));
  const int64_t rows = n * oh;
  const int team = omp_get_max_threads();  // this op's threads (core.cpp's op_threads)
  const bool parallel = rows * ow * c >= (1 << 14);
  parallel_for(parallel ? team : 1, rows, [&](int64_t i) { pixel_row(*this, x, y, i / oh, i % oh); });
}

bool channels_last_dense(const Tensor& t) {
  const dims_t& d = t.dims;  // [N, C, H, W] with strides [H·W·C, 1, W·C, C]
  const dims_t& s = t.strides;
  auto ok = [&](size_t k, int64_t want) { return d[k] == 1 || s[k] == want; };
  return ok(1, 1) && ok(3, d[1]) && ok(2, d[3] * d[1]) && ok(0, d[2] * d[3] * d[1]) &&
         t.span == t.numel;
}

}  // namespace
#endif

bool build_qdepthwise(Handle& h, const OpCall& c) {
#if defined(__x86_64__)
  Engine& e = h.e;
  if (!own_kernels_allowed() || !__builtin_cpu_supports("avx512vnni") ||
      !__builtin_cpu_supports("avx512bw") || c.ia[4] != 2)
    return false;
  const Tensor& x = e.tensors[(size_t)c.ins[0]];
  const Tensor& w = e.tensors[(size_t)c.ins[1]];
  const Tensor& ws = e.tensors[(size_t)c.ins[2]];
  const Tensor& y = e.tensors[(size_t)c.outs[0]];
  memory::dims strides, dil, pl, pr;
  conv_window(c.ia, 4, strides, dil, pl, pr);
  const int64_t C = x.dims[1];
  if (w.dims.size() != 5 || w.dims[0] != C || w.dims[1] != 1 || w.dims[2] != 1 || w.dims[3] != 3 ||
      w.dims[4] != 3 || y.dims[1] != C || x.dims[0] != y.dims[0] || C < 1 || C % kBlock != 0)
    return false;
  if (strides[0] != strides[1] || (strides[0] != 1 && strides[0] != 2) || dil[0] != 0 || dil[1] != 0)
    return false;
  // the window: every output pixel's taps, pads included, as oneDNN counts them
  for (int k = 0; k < 2; ++k)
    if (pl[k] > 2 || pr[k] > 2 || pr[k] < 0 ||
        (x.dims[2 + k] + pl[k] + pr[k] - 3) / strides[0] + 1 != y.dims[2 + k] ||
        x.dims[2 + k] + pl[k] + pr[k] < 3)
      return false;
  if (!channels_last_dense(x) || !channels_last_dense(y) || (c.ia[2] != 3 && c.ia[2] != 0)) return false;
  std::vector<Epi> post;
  for (const PostOp& p : c.post) {
    if (p.binary) return false;
    if (p.alg == dnnl::algorithm::eltwise_linear) post.push_back({0, p.alpha, p.beta});
    else if (p.alg == dnnl::algorithm::eltwise_round) post.push_back({1, 0, 0});
    else if ((p.alg == dnnl::algorithm::eltwise_clip || p.alg == dnnl::algorithm::eltwise_clip_v2) &&
             p.alpha <= p.beta)
      post.push_back({2, p.alpha, p.beta});
    else if (p.alg == dnnl::algorithm::eltwise_relu && p.alpha == 0) post.push_back({2, 0, INFINITY});
    else return false;
  }
  const int8_t* wsrc = static_cast<const int8_t*>(e.ptr(c.ins[1]));
  const float* scales = static_cast<const float*>(e.ptr(c.ins[2]));
  const float* bias = c.ia[3] ? static_cast<const float*>(e.ptr(c.ins[3])) : nullptr;
  if (wsrc == nullptr || scales == nullptr || (c.ia[3] && bias == nullptr)) return false;
  auto op = std::make_unique<QDepthwiseOp>();
  op->name = "int8 depthwise 3x3 (own kernel)";
  op->n = x.dims[0]; op->c = C; op->h = x.dims[2]; op->w = x.dims[3];
  op->oh = y.dims[2]; op->ow = y.dims[3];
  op->stride = strides[0]; op->pad_t = pl[0]; op->pad_l = pl[1];
  op->blocks = (C + kBlock - 1) / kBlock;
  op->post = std::move(post);
  const double sx = c.fa[0];
  op->inv_y = (float)(1.0 / c.fa[1]);
  op->zp_y = (float)c.ia[1];
  const int64_t lanes = mul_c(op->blocks, kBlock, "qdepthwise");
  e.reserve(add_c(mul_c(lanes, 12 + 3 * 4, "qdepthwise"), C, "qdepthwise"), "int8 depthwise weights");
  op->wq.assign((size_t)(lanes * 12), 0);
  op->comp.assign((size_t)lanes, 0);
  op->mul.assign((size_t)lanes, 0.f);
  op->bias.assign((size_t)lanes, 0.f);
  op->zp_row.assign((size_t)C, (uint8_t)c.ia[0]);
  for (int64_t ch = 0; ch < C; ++ch) {
    // the lane of channel ch: block b, vector j, 128-bit lane l, dword i (see the top)
    int64_t b = ch / kBlock, r = ch % kBlock, l = r / 16, j = (r % 16) / 4, i = r % 4;
    int64_t lane = (b * 4 + j) * 16 + l * 4 + i;
    int32_t sum = 0;
    for (int t = 0; t < 9; ++t) {
      int8_t v = wsrc[ch * w.strides[0] + (t / 3) * w.strides[3] + (t % 3) * w.strides[4]];
      sum += v;
      // group g = t / 4, byte t % 4 of dword (l, i) of vector j
      op->wq[(size_t)(((b * 3 + t / 4) * 4 + j) * 64 + (l * 4 + i) * 4 + t % 4)] = v;
    }
    op->comp[(size_t)lane] = (int32_t)c.ia[0] * sum;
    op->mul[(size_t)lane] = (float)(sx * (double)scales[ws.numel == 1 ? 0 : ch * ws.strides[0]]);
    op->bias[(size_t)lane] = bias ? bias[ch * e.tensors[(size_t)c.ins[3]].strides[0]] : 0.f;
  }
  push_op(e, std::move(op), c);
  return true;
#else
  (void)h; (void)c;
  return false;
#endif
}

}  // namespace ofc
