// The float32 depthwise 3×3 convolution (MobileNet's), on the engine's own AVX-512 kernel;
// every other convolution, and CPUs without AVX-512 (or with OPFORGE_CPU_CAPABILITY=default
// or OPFORGE_CPU_DEPTHWISE=0), stay on oneDNN (convolution.cpp).
//
// Taken when: 2-d, weights [C, 1, 1, 3, 3] (groups == input channels == output channels),
// stride 1 or 2 (the same both ways; 2 over an input of at most 1 MiB), no dilation,
// paddings 0-2, source and destination channels contiguous, the destination not over the
// source, constant weights and bias, and no binary post-op. Eltwise linear, clip and relu
// without slope run in the kernel's registers; from the first other one (a GELU) the chain
// runs in place after it (the Epilogue of nan.cpp). Each call's output bound lets its
// readers skip their scans for NaN, as a guarded oneDNN op's does (guard.cpp): proved from
// its input's bound when that is finite (input bound · max Σ|taps| + max |bias|, through
// the clamps: a row kernel without peaks), else the largest |value| it stored (inf with a
// NaN or a later post-op); with no reader, none (KernelTail::track).
//
// Arithmetic: each output is Σ w·x over the taps inside the image, row by row and left to
// right, one fused multiply-add per tap in float32, then + bias, then the post-ops; a tap
// in the padding is skipped (as oneDNN does), not multiplied by zero. NaN-exact without the
// NaN guard: relu and clip are max(lo, v) and min(hi, v) with v the operand the
// instructions return when either is NaN, so a NaN stays NaN as in torch.
//
// The kernel: per output row, the columns whose taps are all inside the image in runs of
// 8 output pixels (then 4, 2, 1), the others one by one over the taps inside; per run, all
// channels of a slab (inputs of a run ≤ 24 KB), 16 at a time: 8 accumulators, at stride 1
// each input loaded once per tap row and used by up to three pixels. The stride, the
// number of register post-ops and whether a block is whole are template arguments, so the
// loops hold everything in registers. Why: oneDNN 3.2's depthwise (brdgmm_dw) spends ~2 µs
// a call on small ones (the zoo's depthwise_separable: 16 channels at 16×16, 37K
// multiply-adds, 2.1-2.5 µs; this kernel 1.0-1.2, one thread, Zen 5). In MobileNetV2 at
// 224 it is level with oneDNN over the 17 layers (32 channels at 112×112: 75-80 against
// 91 µs; the 7×7 ones 14-15 against 13.4-14; 96 at stride 2 from 112×112 136-148 against
// 114-122, memory-bound where the input comes from L3: a stride-2 one over an input past
// 1 MiB stays on oneDNN).
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cmath>

#include "engine.h"

namespace ofc {

#if defined(__x86_64__)
namespace {

constexpr int kLanes = 16;  // channels per vector
constexpr int kRun = 8;     // output pixels per step of the interior
constexpr int64_t kStride2Input = (int64_t)1 << 18;  // floats (1 MiB)

struct DepthwiseOp;
using RowFn = float (*)(const DepthwiseOp&, const float*, float*, int, int, int64_t, int64_t);

struct DepthwiseOp : Op {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0, stride = 1, pt = 0, pl = 0;
  int64_t xn = 0, xy = 0, xx = 0, yn = 0, yy = 0, yx = 0;  // strides (channels: 1)
  int64_t lo = 0, hi = 0;    // output columns [lo, hi) read no padding
  int64_t slab = 0;          // channels per pass over a row (a multiple of 16)
  std::vector<float> taps;  // [block][9][16] (the last block padded with zeros)
  std::vector<float> bias;  // [block][16]
  RowFn row = nullptr;    // an output row (for this stride and number of steps): its peak
  RowFn plain = nullptr;  // the same without the peak (a call whose bound is proved, or unread)
  double gain = INFINITY, offset = INFINITY;  // max over channels of Σ|taps|, of |bias|
  KernelTail tail;      // the post-ops; a peak per output row, for the output's bound
  void run(Engine& e) override;
  KernelTail* kernel_tail() override { return &tail; }
};

#define OFC_AVX512 __attribute__((target("avx512f")))
#define OFC_INLINE __attribute__((target("avx512f"), always_inline)) inline

// the input under the mask m: every lane when Full (a load the multiply-add reads directly)
template <bool Full>
OFC_INLINE __m512 load(const float* p, __mmask16 m) {
  return Full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}

// + bias, the NP post-ops, stored (and into the row's peak when T, KernelTail::track)
template <int J, int NP, bool Full, bool T>
OFC_INLINE void finish(__m512 (&acc)[J], float* y, int64_t yx, __m512 bias, __mmask16 m, const ClampStep* st,
                       Peak& pk) {
  for (int j = 0; j < J; ++j) acc[j] = _mm512_add_ps(acc[j], bias);
  for (int q = 0; q < NP; ++q) {
    const __m512 a = _mm512_set1_ps(st[q].a), b = _mm512_set1_ps(st[q].b);
    const __m512 lo = _mm512_set1_ps(st[q].lo), hi = _mm512_set1_ps(st[q].hi);
    for (int j = 0; j < J; ++j) acc[j] = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_fmadd_ps(acc[j], a, b)));
  }
  for (int j = 0; j < J; ++j) {
    if (Full) _mm512_storeu_ps(y + j * yx, acc[j]);
    else _mm512_mask_storeu_ps(y + j * yx, m, acc[j]);
    if (!T) continue;
    // (the lanes past the mask: finite, from zero inputs and weights)
    pk.top = _mm512_max_ps(pk.top, _mm512_abs_ps(acc[j]));
    pk.nan = (__mmask16)(pk.nan | _mm512_cmp_ps_mask(acc[j], acc[j], _CMP_UNORD_Q));
  }
}

// J output pixels of 16 channels whose taps are all inside the image's columns (x: the
// first one's tap at row k0, column 0), from the tap rows [k0, k1); stride S
template <int J, int S, int NP, bool Full, bool T>
OFC_INLINE void pixels(const float* x, float* y, const float* wb, __m512 bias, __mmask16 m, int k0, int k1,
                       int64_t xy, int64_t xx, int64_t yx, const ClampStep* st, Peak& pk) {
  __m512 acc[J];
  for (int j = 0; j < J; ++j) acc[j] = _mm512_setzero_ps();
  for (int kh = k0; kh < k1; ++kh) {
    const float* xr = x + (kh - k0) * xy;
    const __m512 w0 = _mm512_loadu_ps(wb + (kh * 3) * kLanes);
    const __m512 w1 = _mm512_loadu_ps(wb + (kh * 3 + 1) * kLanes);
    const __m512 w2 = _mm512_loadu_ps(wb + (kh * 3 + 2) * kLanes);
    if (S == 1) {  // the row's J + 2 inputs loaded once, each used by up to three pixels
      __m512 in[J + 2];
      for (int j = 0; j < J + 2; ++j) in[j] = load<Full>(xr + j * xx, m);
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(in[j], w0, acc[j]);
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(in[j + 1], w1, acc[j]);
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(in[j + 2], w2, acc[j]);
    } else {  // each input read where a tap needs it
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(load<Full>(xr + (j * S) * xx, m), w0, acc[j]);
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(load<Full>(xr + (j * S + 1) * xx, m), w1, acc[j]);
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(load<Full>(xr + (j * S + 2) * xx, m), w2, acc[j]);
    }
  }
  finish<J, NP, Full, T>(acc, y, yx, bias, m, st, pk);
}

// the output pixel at column col, whose taps may reach the padding: the tap columns inside
// the image only (x: the row's column 0 at tap row k0, y: the output row's column 0)
template <int S, int NP, bool Full, bool T>
OFC_INLINE void edge(const float* x, float* y, const float* wb, __m512 bias, __mmask16 m, int k0, int k1,
                     int64_t col, int64_t pl, int64_t w, int64_t xy, int64_t xx, int64_t yx, const ClampStep* st,
                     Peak& pk) {
  const int64_t ic0 = col * S - pl;
  const int q0 = (int)std::max<int64_t>(0, -ic0), q1 = (int)std::min<int64_t>(3, w - ic0);
  const float* xc = x + (ic0 + q0) * xx;  // tap column q0, the first one inside the image
  __m512 acc[1] = {_mm512_setzero_ps()};
  for (int kh = k0; kh < k1; ++kh)
    for (int kw = q0; kw < q1; ++kw)
      acc[0] = _mm512_fmadd_ps(load<Full>(xc + (kh - k0) * xy + (kw - q0) * xx, m),
                               _mm512_loadu_ps(wb + (kh * 3 + kw) * kLanes), acc[0]);
  finish<1, NP, Full, T>(acc, y + col * yx, 0, bias, m, st, pk);
}

// J pixels of every channel: the blocks of 16, then the last ones under a mask (x: the
// first pixel's tap at row k0, column 0, channel 0; y: its output, channel 0)
template <int J, int S, int NP, bool T>
OFC_INLINE void pixels_all(const DepthwiseOp& op, const float* x, float* y, int k0, int k1, int64_t cb, int64_t C,
                           Peak& pk) {
  const int64_t xy = op.xy, xx = op.xx, yx = op.yx;
  const float* wb = op.taps.data() + cb * 9;
  const float* bias = op.bias.data();
  int64_t c0 = cb;
  for (; c0 + kLanes <= C; c0 += kLanes, wb += 9 * kLanes)
    pixels<J, S, NP, true, T>(x + c0, y + c0, wb, _mm512_loadu_ps(bias + c0), 0xFFFF, k0, k1, xy, xx, yx, op.tail.steps, pk);
  if (c0 < C)
    pixels<J, S, NP, false, T>(x + c0, y + c0, wb, _mm512_loadu_ps(bias + c0), (__mmask16)((1u << (C - c0)) - 1),
                            k0, k1, xy, xx, yx, op.tail.steps, pk);
}

// the output pixel at column col, every channel, its taps inside the image only
template <int S, int NP, bool T>
OFC_INLINE void edge_all(const DepthwiseOp& op, const float* x, float* y, int64_t col, int k0, int k1, int64_t cb,
                         int64_t C, Peak& pk) {
  const int64_t xy = op.xy, xx = op.xx, yx = op.yx, pl = op.pl, w = op.w;
  const float* wb = op.taps.data() + cb * 9;
  const float* bias = op.bias.data();
  int64_t c0 = cb;
  for (; c0 + kLanes <= C; c0 += kLanes, wb += 9 * kLanes)
    edge<S, NP, true, T>(x + c0, y + c0, wb, _mm512_loadu_ps(bias + c0), 0xFFFF, k0, k1, col, pl, w, xy, xx, yx,
                      op.tail.steps, pk);
  if (c0 < C)
    edge<S, NP, false, T>(x + c0, y + c0, wb, _mm512_loadu_ps(bias + c0), (__mmask16)((1u << (C - c0)) - 1), k0,
                       k1, col, pl, w, xy, xx, yx, op.tail.steps, pk);
}

// one output row (x: the input row of tap row k0, its column 0, channel 0; y: the output
// row, channel 0): the edge columns one by one, the columns [lo, hi) in runs of 8 pixels,
// then 4, 2, 1, each run over all channels while its inputs are in L1 (the channels
// outermost, a row of MobileNetV2's 144 channels at 56×56 came from L2 thrice: 1.7× slower)
template <int S, int NP, bool T>
OFC_AVX512 float row(const DepthwiseOp& op, const float* x, float* y, int k0, int k1, int64_t cb, int64_t ce) {
  const int64_t xx = op.xx, yx = op.yx, lo = op.lo, hi = op.hi, ow = op.ow;
  Peak pk{_mm512_setzero_ps(), 0};
  int64_t col = 0;
  for (; col < lo && col < ow; ++col) edge_all<S, NP, T>(op, x, y, col, k0, k1, cb, ce, pk);
  if (hi > lo) {
    const float* xc = x + (lo * S - op.pl) * xx;
    float* yc = y + lo * yx;
    for (; col + kRun <= hi; col += kRun, xc += kRun * S * xx, yc += kRun * yx)
      pixels_all<kRun, S, NP, T>(op, xc, yc, k0, k1, cb, ce, pk);
    if (col + 4 <= hi) {
      pixels_all<4, S, NP, T>(op, xc, yc, k0, k1, cb, ce, pk);
      col += 4; xc += 4 * S * xx; yc += 4 * yx;
    }
    if (col + 2 <= hi) {
      pixels_all<2, S, NP, T>(op, xc, yc, k0, k1, cb, ce, pk);
      col += 2; xc += 2 * S * xx; yc += 2 * yx;
    }
    if (col < hi) { pixels_all<1, S, NP, T>(op, xc, yc, k0, k1, cb, ce, pk); ++col; }
  }
  for (; col < ow; ++col) edge_all<S, NP, T>(op, x, y, col, k0, k1, cb, ce, pk);
  return pk.nan ? NAN : _mm512_reduce_max_ps(pk.top);
}

template <int S, bool T>
RowFn pick(int steps) {
  switch (steps) {
    case 0: return row<S, 0, T>;
    case 1: return row<S, 1, T>;
    case 2: return row<S, 2, T>;
    default: return row<S, 3, T>;
  }
}

// the row kernel for this op's stride, register post-ops and tracking (known at finalize)
RowFn pick(int64_t stride, int steps, bool track) {
  if (stride == 1) return track ? pick<1, true>(steps) : pick<1, false>(steps);
  return track ? pick<2, true>(steps) : pick<2, false>(steps);
}

// one output row; the largest |value| it stored (NaN: a NaN)
float output_row(const DepthwiseOp& op, RowFn fn, const float* src, float* dst, int64_t img, int64_t r) {
  const int64_t ir0 = r * op.stride - op.pt;  // the input row of tap row 0
  // the tap rows inside the image
  const int k0 = (int)std::max<int64_t>(0, -ir0), k1 = (int)std::min<int64_t>(3, op.h - ir0);
  // x: the input row of tap row k0, the first one inside the image
  const float* x = src + img * op.xn + (ir0 + k0) * op.xy;
  float* y = dst + img * op.yn + r * op.yy;
  float top = 0;
  for (int64_t cb = 0; cb < op.c; cb += op.slab) {
    const float t = fn(op, x, y, k0, k1, cb, std::min(op.c, cb + op.slab));
    top = t > top || t != t ? t : top;  // (a NaN, once there, stays: NaN > t is false)
  }
  return top;
}

}  // namespace

void DepthwiseOp::run(Engine& e) {
  const float* x = static_cast<const float*>(e.ptr(ins[0]));
  float* y = static_cast<float*>(e.ptr(outs[0]));
  const int64_t rows = n * oh;
  const int team = omp_get_max_threads();  // this op's threads (core.cpp's op_threads)
  float* peak = tail.peaks.data();
  // the bound proved from the input's (a finite input and finite weights make finite sums,
  // each at most bound·gain + offset up to rounding), else the rows' peaks
  const double proved = tail.track ? tail.through_steps((tail.input_bound() * gain + offset) * (1 + 1e-5))
                                   : INFINITY;
  const RowFn fn = tail.track && !(proved < INFINITY) ? row : plain;
  parallel_for(team, rows, [&](int64_t i) { peak[i] = output_row(*this, fn, x, y, i / oh, i % oh); });
  if (fn == row) tail.finish(e, *this);
  else tail.finish_proven(e, *this, proved);
}

#endif

bool build_depthwise(Handle& h, const OpCall& c) {
#if defined(__x86_64__)
  Engine& e = h.e;
  if (c.kind != "conv" || !avx512_kernel_allowed("OPFORGE_CPU_DEPTHWISE")) return false;
  // [nsp, strides, pad_l, pad_r, dilation (torch's), has_bias] (contract_conv checked them)
  if (c.ia.size() != 10 || c.ia[0] != 2) return false;
  const int64_t s = c.ia[1], pt = c.ia[3], pl = c.ia[4], pb = c.ia[5], pr = c.ia[6];
  if (c.ia[2] != s || (s != 1 && s != 2) || c.ia[7] != 1 || c.ia[8] != 1) return false;
  for (int64_t p : {pt, pl, pb, pr})
    if (p < 0 || p > 2) return false;
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  const Tensor& wt = e.tensors[(size_t)c.ins[1]];
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  const int64_t C = src.dims[1];
  if (wt.dims.size() != 5 || wt.dims[0] != C || wt.dims[1] != 1 || wt.dims[2] != 1 || wt.dims[3] != 3 ||
      wt.dims[4] != 3 || dst.dims[1] != C || C < 1)
    return false;
  const int64_t hh = src.dims[2], ww = src.dims[3];
  if (hh + pt + pb < 3 || ww + pl + pr < 3 || dst.dims[2] != (hh + pt + pb - 3) / s + 1 ||
      dst.dims[3] != (ww + pl + pr - 3) / s + 1)
    return false;
  if (!channels_contiguous(src) || !channels_contiguous(dst) || e.root(c.ins[0]) == e.root(c.outs[0]))
    return false;
  // stride 2 over an input past L2 (MobileNetV2's 96 channels at 112×112, 4.8 MB): oneDNN's,
  // which streamed it from L3 faster (114-122 against 136-148 µs a call, one thread, Zen 5)
  if (s == 2 && src.numel > kStride2Input) return false;
  const float* g = static_cast<const float*>(e.ptr(c.ins[1]));
  if (!e.tensors[(size_t)e.root(c.ins[1])].is_const || g == nullptr) return false;
  const float* bp = nullptr;
  if (c.ins.size() == 3) {
    bp = static_cast<const float*>(e.ptr(c.ins[2]));
    if (!e.tensors[(size_t)e.root(c.ins[2])].is_const || bp == nullptr) return false;
  }
  std::vector<RegisterPostOp> post;
  const int first_rest = register_post_ops(c.post, post);
  if (first_rest < 0) return false;  // a binary one reads another tensor: oneDNN's, as before
  auto op = std::make_unique<DepthwiseOp>();
  op->name = "depthwise convolution 3x3 (own kernel)";
  op->n = src.dims[0]; op->c = C; op->h = hh; op->w = ww;
  op->oh = dst.dims[2]; op->ow = dst.dims[3];
  op->stride = s; op->pt = pt; op->pl = pl;
  op->xn = src.strides[0]; op->xy = src.strides[2]; op->xx = src.strides[3];
  op->yn = dst.strides[0]; op->yy = dst.strides[2]; op->yx = dst.strides[3];
  // columns whose taps [col·s - pl, col·s - pl + 2] are all inside [0, w)
  op->lo = (pl + s - 1) / s;
  op->hi = ww - 3 + pl < 0 ? op->lo : std::max(op->lo, std::min(op->ow, (ww - 3 + pl) / s + 1));
  const int64_t lanes = mul_c((C + kLanes - 1) / kLanes, kLanes, "depthwise");
  e.reserve(mul_c(lanes, 10 * 4, "depthwise"), "depthwise weights");
  op->taps.assign((size_t)(lanes * 9), 0.f);
  op->bias.assign((size_t)lanes, 0.f);
  for (int64_t ch = 0; ch < C; ++ch) {
    const int64_t b = ch / kLanes, l = ch % kLanes;
    for (int t = 0; t < 9; ++t)
      op->taps[(size_t)((b * 9 + t) * kLanes + l)] =
          g[ch * wt.strides[0] + (t / 3) * wt.strides[3] + (t % 3) * wt.strides[4]];
    if (bp != nullptr) op->bias[(size_t)ch] = bp[ch * e.tensors[(size_t)c.ins[2]].strides[0]];
  }
  const int steps = op->tail.prepare(e, *op, c, post, first_rest, mul_c(op->n, op->oh, "depthwise"));
  op->row = pick(s, steps, true);
  op->plain = pick(s, steps, false);
  op->tail.wants_input = true;
  double gain = 0, offset = 0;
  bool finite = true;  // a NaN or inf weight or bias leaves gain and offset inf: no proof
  for (int64_t ch = 0; ch < C; ++ch) {
    double sum = 0;
    for (int t = 0; t < 9; ++t) sum += std::fabs((double)op->taps[(size_t)(((ch / kLanes) * 9 + t) * kLanes + ch % kLanes)]);
    const double b = std::fabs((double)op->bias[(size_t)ch]);
    finite = finite && std::isfinite(sum) && std::isfinite(b);
    gain = std::max(gain, sum);
    offset = std::max(offset, b);
  }
  if (finite) {
    op->gain = gain;
    op->offset = offset;
  }
  // slabs of channels whose inputs for a run (3 rows of 8·s + 2 pixels) take at most 24 KB
  // of L1: MobileNetV2's 960 channels at 7×7 took 18.7 µs a call in one pass over all
  // channels, 14.8 in slabs of 192, 23 in slabs of 16 (one thread, Zen 5)
  op->slab = std::max<int64_t>(kLanes, 24 * 1024 / (3 * (kRun * s + 2) * 4) / kLanes * kLanes);
  push_op(e, std::move(op), c);
  return true;
#else
  (void)h; (void)c;
  return false;
#endif
}

}  // namespace ofc
