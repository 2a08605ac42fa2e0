// A small float32 convolution (at most 2^21 multiply-adds, at least 8 input channels: the
// zoo CNN's second layer, a ResNet block's strided 3×3 one), direct on the engine's own
// AVX-512 kernel; larger ones, grouped ones, and CPUs without AVX-512 (or with
// OPFORGE_CPU_CAPABILITY=default or OPFORGE_CPU_SMALL_CONV=0) stay on oneDNN
// (convolution.cpp). A 3×3 stride-1 one that Winograd takes (winograd.cpp) goes there.
//
// Taken when: 2-d, one group, no dilation, any kernel size, stride and padding, source and
// destination channels contiguous, the destination not over the source, constant weights
// (finite, where there is padding) and bias, no binary post-op, at most 2^21 multiply-adds
// and a padded copy of the input of at most 1 MiB. Eltwise linear, clip and relu without
// slope run in the kernel's registers; from the first other one (a GELU) the chain runs in
// place after it (the Epilogue of nan.cpp). Each call's output bound (the largest |value| it
// stored, inf with a NaN or a later post-op) lets its readers skip their scans for NaN, as
// a guarded oneDNN op's does (guard.cpp): without it the zoo CNN's max pooling after this
// kernel scanned its input, 0.57 → 1.06 µs.
//
// Arithmetic: each output is Σ w·x over the kernel's rows, columns, then input channels,
// one fused multiply-add per term in float32, then + bias, then the post-ops. A padded
// input is copied per call into the engine's scratch with zeros around it, so a padding tap
// adds 0·w = ±0 (the weights are finite) and leaves the sum as it is. NaN-exact without the
// NaN guard: relu and clip are max(lo, v) and min(hi, v) with v the operand the instructions
// return when either is NaN, so a NaN stays NaN as in torch.
//
// The kernel: the weights packed at build as [panel of 16 output channels][kh][kw][C][16];
// per output row, blocks of 6 pixels × 4 panels (64 output channels) of accumulators (16 × 1
// and 8 × 2 where there are fewer panels, so at least 16 sums are in flight), each term one
// broadcast of an input per pixel and one load of 16 weights per panel; a kernel row's
// KW·C terms in one run where the pixels' channels follow each other. Why: oneDNN spends
// ~1 µs a call on these beyond their arithmetic (one thread, Zen 5): the zoo CNN's 8 → 16
// channel 3×3 layer 4.7 → 3.9 µs, resnet_block's stride-2 3×3 one 3.9-4.4 → 2.9-3.2 µs
// (the whole calls 13.0 → 12.4 and 10.6 → 9.8 µs). Below 8 input channels a kernel row has
// too few terms for its set-up: the CNN's 3 → 8 channel layer took 8.7 µs, 5.4 on oneDNN.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cmath>
#include <cstring>

#include "engine.h"

namespace ofc {

#if defined(__x86_64__)
namespace {

constexpr int kPanel = 16;              // output channels per panel (one register)
constexpr int kPanels = 4;              // panels per block
constexpr int64_t kMinChannels = 8;     // input channels
constexpr int64_t kMaxMacs = (int64_t)1 << 21;
constexpr int64_t kMaxPadded = (int64_t)1 << 20;  // bytes of the padded input copy

struct SmallConvOp : Op {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0, kh = 0, kw = 0, sh = 1, sw = 1, pt = 0, pl = 0;
  int64_t k = 0, panels = 0;
  int64_t xn = 0, xy = 0, xx = 0, yn = 0, yy = 0, yx = 0;  // strides (channels: 1)
  bool padded = false;
  int64_t hp = 0, wp = 0;   // the padded copy's rows and columns
  std::vector<float> wpk;   // [panel][kh][kw][C][16] (zeros past K)
  std::vector<float> bias;  // panels·16
  KernelTail tail;  // the post-ops; a peak per output row of each image, for the output's bound
  void run(Engine& e) override;
  KernelTail* kernel_tail() override { return &tail; }
};

#define OFC_AVX512 __attribute__((target("avx512f")))

// R output pixels from column ox0 of output row oy × P panels from p0 (x: the image, with
// its row and pixel strides xy, xx, already padded when the op is; y: the output image)
template <int R, int P, bool T>
OFC_AVX512 void block(const SmallConvOp& op, const float* x, int64_t xy, int64_t xx, float* y, int64_t oy,
                      int64_t ox0, int64_t p0, Peak& pk) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const int64_t C = op.c, KH = op.kh, KW = op.kw, step = op.sw * xx;
  const int64_t panel = KH * KW * C * kPanel;  // floats per packed panel
  const float* wq = op.wpk.data() + p0 * panel;
  // a kernel row's terms: KW·C of them at once where a pixel's channels follow the last
  // one's (the padded copy, a dense source), else KW runs of C
  const bool dense = xx == C;
  const int64_t runs = dense ? 1 : KW, terms = dense ? KW * C : C;
  for (int64_t i = 0; i < KH; ++i)
    for (int64_t j = 0; j < runs; ++j) {
      const float* xr = x + (oy * op.sh + i) * xy + (ox0 * op.sw + j) * xx;
      const float* wr = wq + (i * KW + j) * C * kPanel;
      for (int64_t t = 0; t < terms; ++t) {
        __m512 wv[P];
        for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_ps(wr + p * panel + t * kPanel);
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(xr[r * step + t]);
          for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xv, wv[p], acc[r][p]);
        }
      }
    }
  for (int p = 0; p < P; ++p) {
    const int64_t col = (p0 + p) * kPanel;
    const int64_t left = op.k - col;
    const __mmask16 m = left >= kPanel ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const __m512 b = _mm512_loadu_ps(op.bias.data() + col);
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_add_ps(acc[r][p], b);
      for (int q = 0; q < op.tail.nsteps; ++q) {
        const ClampStep& s = op.tail.steps[q];
        v = _mm512_min_ps(_mm512_set1_ps(s.hi),
                          _mm512_max_ps(_mm512_set1_ps(s.lo),
                                        _mm512_fmadd_ps(v, _mm512_set1_ps(s.a), _mm512_set1_ps(s.b))));
      }
      _mm512_mask_storeu_ps(y + oy * op.yy + (ox0 + r) * op.yx + col, m, v);
      if (!T) continue;  // no reader of the bound (KernelTail::track)
      // (the lanes past the mask: finite, from zero weights and bias)
      pk.top = _mm512_max_ps(pk.top, _mm512_abs_ps(v));
      pk.nan = (__mmask16)(pk.nan | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
    }
  }
}

// the pixels [ox, ow) of output row oy × P panels from p0: blocks of R pixels, then 4, 2, 1
template <int P, int R, bool T>
OFC_AVX512 void pixels(const SmallConvOp& op, const float* x, int64_t xy, int64_t xx, float* y, int64_t oy,
                       int64_t p0, Peak& pk) {
  int64_t ox = 0;
  const int64_t ow = op.ow;
  constexpr int R8 = R > 8 ? 8 : 1, R4 = R > 4 ? 4 : 1;  // (1: not taken)
  for (; ox + R <= ow; ox += R) block<R, P, T>(op, x, xy, xx, y, oy, ox, p0, pk);
  if (R > 8 && ox + 8 <= ow) { block<R8, P, T>(op, x, xy, xx, y, oy, ox, p0, pk); ox += R8; }
  if (R > 4 && ox + 4 <= ow) { block<R4, P, T>(op, x, xy, xx, y, oy, ox, p0, pk); ox += R4; }
  if (ox + 2 <= ow) { block<2, P, T>(op, x, xy, xx, y, oy, ox, p0, pk); ox += 2; }
  if (ox < ow) block<1, P, T>(op, x, xy, xx, y, oy, ox, p0, pk);
}

// one output row: the panels in groups of 4, then the 1-3 left; more pixels a block where
// there are fewer panels, so each block has at least 16 independent sums (one panel of 6
// pixels left the sums' chains of multiply-adds waiting on each other)
// (the largest |value| the row stored; NaN: a NaN)
template <bool T>
OFC_AVX512 float output_row(const SmallConvOp& op, const float* x, int64_t xy, int64_t xx, float* y, int64_t oy) {
  Peak pk{_mm512_setzero_ps(), 0};
  int64_t p0 = 0;
  for (; p0 + kPanels <= op.panels; p0 += kPanels) pixels<kPanels, 6, T>(op, x, xy, xx, y, oy, p0, pk);
  switch (op.panels - p0) {
    case 3: pixels<3, 6, T>(op, x, xy, xx, y, oy, p0, pk); break;
    case 2: pixels<2, 8, T>(op, x, xy, xx, y, oy, p0, pk); break;
    case 1: pixels<1, 16, T>(op, x, xy, xx, y, oy, p0, pk); break;
    default: break;
  }
  return pk.nan ? NAN : _mm512_reduce_max_ps(pk.top);
}

void SmallConvOp::run(Engine& e) {
  const float* src = static_cast<const float*>(e.ptr(ins[0]));
  float* dst = static_cast<float*>(e.ptr(outs[0]));
  const int team = omp_get_max_threads();  // this op's threads (core.cpp's op_threads)
  float* pad = reinterpret_cast<float*>(e.scratch.data());
  for (int64_t img = 0; img < n; ++img) {
    const float* x = src + img * xn;
    int64_t sy = xy, sx = xx;
    if (padded) {  // the image inside zeros: [hp][wp][C] (only the zeros are set apart)
      const size_t px = (size_t)c * sizeof(float), line = (size_t)wp * px;
      std::memset(pad, 0, (size_t)pt * line);
      std::memset(pad + (pt + h) * wp * c, 0, (size_t)(hp - pt - h) * line);
      for (int64_t r = 0; r < h; ++r) {
        float* row = pad + ((r + pt) * wp + pl) * c;
        std::memset(row - pl * c, 0, (size_t)pl * px);
        std::memset(row + w * c, 0, (size_t)(wp - pl - w) * px);
        if (xx == c) {  // the row's pixels one dense run
          std::memcpy(row, x + r * xy, (size_t)(w * c) * sizeof(float));
        } else {
          for (int64_t col = 0; col < w; ++col)
            std::memcpy(row + col * c, x + r * xy + col * xx, (size_t)c * sizeof(float));
        }
      }
      x = pad;
      sy = wp * c;
      sx = c;
    }
    float* y = dst + img * yn;
    float* peak = tail.peaks.data() + img * oh;
    if (tail.track)
      parallel_for(team, oh, [&](int64_t oy) { peak[oy] = output_row<true>(*this, x, sy, sx, y, oy); });
    else
      parallel_for(team, oh, [&](int64_t oy) { peak[oy] = output_row<false>(*this, x, sy, sx, y, oy); });
  }
  tail.finish(e, *this);
}


}  // namespace
#endif

bool build_small_conv(Handle& h, const OpCall& c) {
#if defined(__x86_64__)
  Engine& e = h.e;
  if (c.kind != "conv" || !avx512_kernel_allowed("OPFORGE_CPU_SMALL_CONV")) return false;
  // [nsp, strides, pad_l, pad_r, dilation (torch's), has_bias] (contract_conv checked them)
  if (c.ia.size() != 10 || c.ia[0] != 2 || c.ia[7] != 1 || c.ia[8] != 1) return false;
  const int64_t sh = c.ia[1], sw = c.ia[2], pt = c.ia[3], pl = c.ia[4], pb = c.ia[5], pr = c.ia[6];
  if (pb < 0 || pr < 0) return false;  // (a negative right padding: oneDNN's)
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  const Tensor& wt = e.tensors[(size_t)c.ins[1]];
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  const size_t wr = wt.dims.size();
  if (wr == 5 && wt.dims[0] != 1) return false;  // groups
  const int64_t K = wt.dims[wr - 4], C = wt.dims[wr - 3], KH = wt.dims[wr - 2], KW = wt.dims[wr - 1];
  const int64_t N = src.dims[0], H = src.dims[2], W = src.dims[3], OH = dst.dims[2], OW = dst.dims[3];
  if (src.dims[1] != C || dst.dims[1] != K || dst.dims[0] != N || K < 1 || OH < 1 || OW < 1) return false;
  if (C < kMinChannels) return false;  // (see the top)
  // (the window and the output size agree: every tap of every output inside the padded image)
  if (H + pt + pb < KH || W + pl + pr < KW || OH != (H + pt + pb - KH) / sh + 1 || OW != (W + pl + pr - KW) / sw + 1)
    return false;
  int64_t macs = 0;  // each factor a dim of a validated tensor (< 2^40 elements)
  if (__builtin_mul_overflow(dst.numel, C * KH * KW, &macs) || macs > kMaxMacs) return false;
  if (!channels_contiguous(src) || !channels_contiguous(dst) || e.root(c.ins[0]) == e.root(c.outs[0]))
    return false;
  const float* g = static_cast<const float*>(e.ptr(c.ins[1]));
  if (!e.tensors[(size_t)e.root(c.ins[1])].is_const || g == nullptr) return false;
  const float* bp = nullptr;
  if (c.ins.size() == 3) {
    bp = static_cast<const float*>(e.ptr(c.ins[2]));
    if (!e.tensors[(size_t)e.root(c.ins[2])].is_const || bp == nullptr) return false;
  }
  const bool padded = pt > 0 || pl > 0 || pb > 0 || pr > 0;
  const int64_t hp = H + pt + pb, wp = W + pl + pr;
  int64_t pad_bytes = 0;
  if (padded && (__builtin_mul_overflow(hp * wp, C * 4, &pad_bytes) || pad_bytes > kMaxPadded)) return false;
  std::vector<RegisterPostOp> post;
  const int first_rest = register_post_ops(c.post, post);
  if (first_rest < 0) return false;  // a binary one reads another tensor: oneDNN's, as before
  auto op = std::make_unique<SmallConvOp>();
  op->name = "convolution (own small kernel)";
  op->n = N; op->c = C; op->h = H; op->w = W; op->oh = OH; op->ow = OW;
  op->kh = KH; op->kw = KW; op->sh = sh; op->sw = sw; op->pt = pt; op->pl = pl; op->k = K;
  op->panels = (K + kPanel - 1) / kPanel;
  op->xn = src.strides[0]; op->xy = src.strides[2]; op->xx = src.strides[3];
  op->yn = dst.strides[0]; op->yy = dst.strides[2]; op->yx = dst.strides[3];
  op->padded = padded; op->hp = hp; op->wp = wp;
  const int64_t cols = mul_c(op->panels, kPanel, "small conv");
  const int64_t floats = mul_c(mul_c(cols, KH * KW, "small conv"), C, "small conv");
  e.reserve(mul_c(add_c(floats, cols, "small conv"), 4, "small conv"), "small convolution weights");
  op->wpk.assign((size_t)floats, 0.f);
  op->bias.assign((size_t)cols, 0.f);
  const int64_t o = wr == 5 ? 1 : 0;  // the weights' K, C, KH, KW strides
  const int64_t s0 = wt.strides[o], s1 = wt.strides[o + 1], s2 = wt.strides[o + 2], s3 = wt.strides[o + 3];
  for (int64_t kk = 0; kk < K; ++kk)
    for (int64_t i = 0; i < KH; ++i)
      for (int64_t j = 0; j < KW; ++j)
        for (int64_t ch = 0; ch < C; ++ch) {
          const float v = g[kk * s0 + ch * s1 + i * s2 + j * s3];
          if (padded && !std::isfinite(v)) return false;  // 0·inf: NaN where torch skips the tap
          op->wpk[(size_t)((((kk / kPanel) * KH + i) * KW + j) * C + ch) * kPanel + kk % kPanel] = v;
        }
  if (bp != nullptr)
    for (int64_t kk = 0; kk < K; ++kk) op->bias[(size_t)kk] = bp[kk * e.tensors[(size_t)c.ins[2]].strides[0]];
  if (padded) grow_scratch(e, pad_bytes);
  op->tail.prepare(e, *op, c, post, first_rest, mul_c(N, OH, "small conv"));
  push_op(e, std::move(op), c);
  return true;
#else
  (void)h; (void)c;
  return false;
#endif
}

}  // namespace ofc
