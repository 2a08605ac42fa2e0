// A 3×3 convolution with stride 1 as Winograd's F(4×4, 3×3) on the engine's own AVX-512
// kernel: each 4×4 block of outputs from a 6×6 block of inputs with 36 products per input
// and output channel pair instead of 144, a quarter of the multiply-adds. Every other
// convolution, and CPUs without AVX-512 (or with OPFORGE_CPU_CAPABILITY=default, or
// OPFORGE_CPU_WINOGRAD=0), stay on oneDNN's direct kernels (convolution.cpp).
//
// Taken when: conv with 2 spatial dims, a constant [K, C, 3, 3] weight (one group), stride
// and dilation 1, paddings 0-2 that give the output's size, C and K at least 16, the
// channels of source and destination contiguous, the destination not over the source, and
// the transformed weights worth their reads: at most 16 MiB, at most 2 MiB per tile (a 7×7
// map of 512 channels has 4 tiles for 38 MB of them and runs 1.7× slower than direct).
//
// The transform, per tile and channel (d: the 6×6 input block, g: the 3×3 filter):
//   y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A, with the interpolation points 0, ±1, ±2 and ∞
// (Lavin and Gray, "Fast algorithms for convolutional neural networks", 2016). G g Gᵀ is
// computed at build in double precision and held as U [36][K/16][C][16] (four times the
// weights; through the program's weight cache); per block of tiles, V = Bᵀ d B for every
// channel, then 36 products V_ξ [tiles × C] · U_ξ [C × K] on a register-blocked kernel (6
// tiles × 64 output channels, 24 accumulators), then Aᵀ M A + bias and the post-ops in
// registers (eltwise linear, clip, relu without slope, a residual add of a tensor of the
// output's shape), the others in place after it (the Epilogue of nan.cpp, NaN-exact).
//
// Arithmetic: float32 throughout except the weight transform. The result is the
// convolution's up to rounding in other places: on N(0,1) data the largest error against
// float64 is 6-8× that of oneDNN's direct kernel (3.6e-5 against 4.2e-6 for 64 channels at
// 56×56, outputs up to 5.8; tests/backends/test_cpu_winograd.py bounds it by the sum of
// |x|·|w| over the window).
//
// NaN, inf and overflow: the transforms mix neighbouring inputs, so one inf input would
// make NaN (inf - inf) in outputs direct convolution gives as ±inf, and a large finite input
// could overflow in Bᵀ d B where the direct sum does not. So a call runs Winograd only when
// its input's bound B (the producer's guard bound, else a scan of the input: NaN or inf gives
// no bound) proves nothing overflows: |V| ≤ 100·B (each row of Bᵀ sums to at most 10 in
// magnitude), each product sum ≤ 100·B·max Σ_c |U|, and Aᵀ·A grows it at most 361×; with
// that ≤ 1e37 (float32 reaches 3.4e38) every value is finite. Other calls run the direct
// oneDNN convolution with the NaN guard (its DnnlOp part), exactly as without this kernel.
//
// Why: ResNet-18 at 224 ran its 3×3 convolutions at oneDNN's peak (~260 GFLOP/s, one Zen 5
// core), level with ONNX Runtime (14.4 against 15.3 ms). Measured here per convolution, one
// thread: 56×56×64 878 → 361 µs, 28×28×128 818 → 335 µs, 14×14×256 801 → 412 µs, the anchor
// CNN's 64×64 16→32 144 → 110 µs, 8×8×32 4.6 → 3.2 µs.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cstring>

#include "engine.h"

namespace ofc {

#if defined(__x86_64__)
namespace {

constexpr int64_t kTileBlock = 12;               // tiles per block (two row blocks of the kernel)
constexpr int64_t kLargeBlock = 64;              // ... where U is past kFitsL2
constexpr int64_t kFitsL2 = 1 << 20;
constexpr int64_t kMaxScratch = 4 << 20;         // bytes of V and M per thread
constexpr int64_t kPoints = 36;                  // 6×6 transformed positions ξ
constexpr int64_t kMaxTransformed = 16 << 20;    // bytes of U
constexpr int64_t kMaxPerTile = 2 << 20;         // bytes of U per tile
constexpr double kGrowth = 100.0 * 361.0;        // Bᵀ·B times Aᵀ·A, in magnitude
constexpr double kLimit = 1e37;
constexpr int kMaxSteps = 4;                     // post-ops in registers; the others after

#define OFC_AVX512 __attribute__((target("avx512f")))

// a post-op the output transform runs in registers: 0 linear a·v + b, 1 clip [a, b], 2 add
// tensor `tensor` (the output's dims, channels contiguous) at strides sn, sy, sx
struct Step {
  int kind = 0;
  float a = 0, b = 0;
  int tensor = -1;
  int64_t sn = 0, sy = 0, sx = 0;
};

struct WinogradOp : DnnlOp {
  int64_t n = 0, c = 0, k = 0, h = 0, w = 0, oh = 0, ow = 0, pt = 0, pl = 0;
  int64_t tw = 0, per_image = 0, tiles = 0, tb = 0, kp = 0, cs = 0, ks = 0;
  int64_t xn = 0, xy = 0, xx = 0, yn = 0, yy = 0, yx = 0;  // source and destination strides
  memory u;                    // U, through the weight cache
  const float* up = nullptr;
  double gain = INFINITY;      // max over ξ and k of Σ_c |U|: inf when a weight is not finite
  double offset = INFINITY;    // max |bias|
  std::vector<float> bias;     // ks, zeros past K
  std::vector<Step> steps;
  std::vector<const float*> operands;  // this call's residual operands, one per step
  Epilogue rest;               // the post-ops after the steps, in place (nan.cpp)
  void late_reads(std::vector<int>& ids) const override { rest.reads(ids); }
  int64_t per_thread = 0;      // floats of scratch: V then M
  int threads_built = 1;       // the team its blocks and scratch were sized for
  bool large = false;          // U past L2: a team shares each block (one read of U a block)
  int64_t winograd_calls = 0, direct_calls = 0;
  void run(Engine& e) override;
};

// the six rows of Bᵀ d (d: one column of the input block, 16 channels a register)
OFC_AVX512 inline void input_rows(const __m512* d, __m512* o) {
  const __m512 f2 = _mm512_set1_ps(2.f), f4 = _mm512_set1_ps(4.f), f5 = _mm512_set1_ps(5.f);
  o[0] = _mm512_fmadd_ps(f4, d[0], _mm512_fnmadd_ps(f5, d[2], d[4]));  // 4d0 - 5d2 + d4
  const __m512 a = _mm512_fnmadd_ps(f4, d[2], d[4]);                   // d4 - 4d2
  const __m512 b = _mm512_fnmadd_ps(f4, d[1], d[3]);                   // d3 - 4d1
  o[1] = _mm512_add_ps(a, b);
  o[2] = _mm512_sub_ps(a, b);
  const __m512 s = _mm512_sub_ps(d[4], d[2]);                          // d4 - d2
  const __m512 t = _mm512_mul_ps(f2, _mm512_sub_ps(d[3], d[1]));       // 2(d3 - d1)
  o[3] = _mm512_add_ps(s, t);
  o[4] = _mm512_sub_ps(s, t);
  o[5] = _mm512_fmadd_ps(f4, d[1], _mm512_fnmadd_ps(f5, d[3], d[5]));  // 4d1 - 5d3 + d5
}

// the four rows of Aᵀ m
OFC_AVX512 inline void output_rows(const __m512* m, __m512* o) {
  const __m512 f2 = _mm512_set1_ps(2.f), f4 = _mm512_set1_ps(4.f), f8 = _mm512_set1_ps(8.f);
  const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
  const __m512 s34 = _mm512_add_ps(m[3], m[4]), d34 = _mm512_sub_ps(m[3], m[4]);
  o[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34);
  o[1] = _mm512_fmadd_ps(f2, d34, d12);
  o[2] = _mm512_fmadd_ps(f4, s34, s12);
  o[3] = _mm512_add_ps(_mm512_fmadd_ps(f8, d34, d12), m[5]);
}

inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

// V [36][tb][cs] rows [r0, r0 + nt) of tiles [t0, t0 + nt); inputs outside the source are
// the padding's zeros
OFC_AVX512 void transform_input(const WinogradOp& op, const float* x, float* v, int64_t t0, int64_t nt,
                                int64_t r0) {
  for (int64_t i = r0; i < r0 + nt; ++i) {
    const int64_t t = t0 + i - r0, img = t / op.per_image, r = t % op.per_image;
    const int64_t y0 = (r / op.tw) * 4 - op.pt, x0 = (r % op.tw) * 4 - op.pl;
    const float* base = x + img * op.xn;
    for (int64_t ch = 0; ch < op.c; ch += 16) {
      const __mmask16 m = lanes(op.c - ch);
      __m512 rows[6][6];  // Bᵀ d, by input column
      for (int col = 0; col < 6; ++col) {
        const int64_t xc = x0 + col;
        const bool in_x = xc >= 0 && xc < op.w;
        __m512 d[6];
        for (int row = 0; row < 6; ++row) {
          const int64_t yr = y0 + row;
          d[row] = in_x && yr >= 0 && yr < op.h
                       ? _mm512_maskz_loadu_ps(m, base + yr * op.xy + xc * op.xx + ch)
                       : _mm512_setzero_ps();
        }
        __m512 o[6];
        input_rows(d, o);
        for (int row = 0; row < 6; ++row) rows[row][col] = o[row];
      }
      for (int row = 0; row < 6; ++row) {
        __m512 o[6];
        input_rows(rows[row], o);
        for (int col = 0; col < 6; ++col)
          _mm512_storeu_ps(v + ((row * 6 + col) * op.tb + i) * op.cs + ch, o[col]);
      }
    }
  }
}

// the next point's U fetched into L2 while this one's products run, two lines a step: a
// 14×14 map of 256 channels reads 9.4 MB of U a call, from memory in a whole network
struct Prefetch {
  const char* at = nullptr;
  const char* end = nullptr;
  void step() {
    if (at < end) {
      _mm_prefetch(at, _MM_HINT_T1);
      _mm_prefetch(at + 64, _MM_HINT_T1);
      at += 128;
    }
  }
};

// R tiles × P panels of 16 output channels: m[r][p·16 ..] = Σ_c a[r][c] · u[p][c][..]
template <int R, int P>
OFC_AVX512 void product_block(const float* a, int64_t sa, const float* u, int64_t c, float* m, int64_t sm,
                              Prefetch& pf) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t ch = 0; ch < c; ++ch) {
    pf.step();
    __m512 b[P];
    for (int p = 0; p < P; ++p) b[p] = _mm512_loadu_ps(u + (p * c + ch) * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * sa + ch]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(av, b[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(m + r * sm + p * 16, acc[r][p]);
}

template <int R>
OFC_AVX512 void product_rows(const WinogradOp& op, const float* a, const float* u, float* m, Prefetch& pf) {
  int64_t p = 0;
  for (; p + 4 <= op.kp; p += 4) product_block<R, 4>(a, op.cs, u + p * op.c * 16, op.c, m + p * 16, op.ks, pf);
  const float* up = u + p * op.c * 16;
  switch (op.kp - p) {
    case 3: product_block<R, 3>(a, op.cs, up, op.c, m + p * 16, op.ks, pf); break;
    case 2: product_block<R, 2>(a, op.cs, up, op.c, m + p * 16, op.ks, pf); break;
    case 1: product_block<R, 1>(a, op.cs, up, op.c, m + p * 16, op.ks, pf); break;
    default: break;
  }
}

// M [36][tb][ks]: M_ξ = V_ξ · U_ξ for nt tiles, points [x0, x1)
OFC_AVX512 void products(const WinogradOp& op, const float* v, float* mm, int64_t nt, int64_t x0, int64_t x1) {
  for (int64_t xi = x0; xi < x1; ++xi) {
    const float* a = v + xi * op.tb * op.cs;
    const int64_t size = op.kp * op.c * 16;  // one point's U
    const float* u = op.up + xi * size;
    float* m = mm + xi * op.tb * op.ks;
    Prefetch pf;
    if (xi + 1 < x1) {
      pf.at = reinterpret_cast<const char*>(u + size);
      pf.end = pf.at + size * (int64_t)sizeof(float);
    }
    int64_t t = 0;
    for (; t + 6 <= nt; t += 6) product_rows<6>(op, a + t * op.cs, u, m + t * op.ks, pf);
    const float* at = a + t * op.cs;
    float* mt = m + t * op.ks;
    switch (nt - t) {
      case 5: product_rows<5>(op, at, u, mt, pf); break;
      case 4: product_rows<4>(op, at, u, mt, pf); break;
      case 3: product_rows<3>(op, at, u, mt, pf); break;
      case 2: product_rows<2>(op, at, u, mt, pf); break;
      case 1: product_rows<1>(op, at, u, mt, pf); break;
      default: break;
    }
  }
}

// a register step with its constants broadcast and its operand's address, held in locals
// for the whole output transform (op's fields are floats a store through y may alias, so
// the compiler would reload them for every pixel)
struct LiveStep {
  int kind;
  __m512 a, b;
  const float* operand;
  int64_t sn, sy, sx;
};

// bias, the register steps, stored: one output pixel of 16 channels under mask m
OFC_AVX512 inline void emit(__m512 v, __m512 bias, const LiveStep* st, int ns, int64_t at, int64_t img, int64_t oy,
                            int64_t ox, int64_t ch, __mmask16 m, float* y) {
  v = _mm512_add_ps(v, bias);
  for (int s = 0; s < ns; ++s) {
    const LiveStep& q = st[s];
    if (q.kind == 0) {
      v = _mm512_fmadd_ps(v, q.a, q.b);
    } else if (q.kind == 1) {
      v = _mm512_min_ps(q.b, _mm512_max_ps(q.a, v));
    } else {
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, q.operand + img * q.sn + oy * q.sy + ox * q.sx + ch));
    }
  }
  _mm512_mask_storeu_ps(y + at, m, v);
}

// Aᵀ M A + bias, the register steps, stored (the outputs of the tile inside the destination)
// for M's rows [r0, r0 + nt), tiles [t0, t0 + nt)
OFC_AVX512 void transform_output(const WinogradOp& op, const float* const* operands, const float* mm,
                                 float* y, int64_t t0, int64_t nt, int64_t r0) {
  const int ns = (int)op.steps.size();  // at most kMaxSteps (winograd_shell)
  LiveStep st[kMaxSteps];
  for (int s = 0; s < ns; ++s) {
    const Step& q = op.steps[(size_t)s];
    st[s] = {q.kind, _mm512_set1_ps(q.a), _mm512_set1_ps(q.b), operands[s], q.sn, q.sy, q.sx};
  }
  const int64_t per_image = op.per_image, tw = op.tw, oh = op.oh, ow = op.ow, k = op.k, tb = op.tb, ks = op.ks;
  const int64_t yn = op.yn, yy = op.yy, yx = op.yx;
  const float* bias_at = op.bias.data();
  for (int64_t i = r0; i < r0 + nt; ++i) {
    const int64_t t = t0 + i - r0, img = t / per_image, r = t % per_image;
    const int64_t oy0 = (r / tw) * 4, ox0 = (r % tw) * 4;
    const int64_t rows = std::min<int64_t>(4, oh - oy0), cols = std::min<int64_t>(4, ow - ox0);
    const int64_t base = img * yn + oy0 * yy + ox0 * yx;
    for (int64_t ch = 0; ch < k; ch += 16) {
      const __mmask16 m = lanes(k - ch);
      __m512 half[4][6];  // Aᵀ M, by column
      for (int col = 0; col < 6; ++col) {
        __m512 s[6], o[4];
        for (int row = 0; row < 6; ++row) s[row] = _mm512_loadu_ps(mm + ((row * 6 + col) * tb + i) * ks + ch);
        output_rows(s, o);
        for (int row = 0; row < 4; ++row) half[row][col] = o[row];
      }
      const __m512 bias = _mm512_loadu_ps(bias_at + ch);
      if (rows == 4 && cols == 4) {  // a whole tile: every loop bound a constant
        for (int row = 0; row < 4; ++row) {
          __m512 o[4];
          output_rows(half[row], o);
          for (int col = 0; col < 4; ++col)
            emit(o[col], bias, st, ns, base + row * yy + col * yx + ch, img, oy0 + row, ox0 + col, ch, m, y);
        }
        continue;
      }
      for (int64_t row = 0; row < rows; ++row) {
        __m512 o[4];
        output_rows(half[row], o);
        for (int64_t col = 0; col < cols; ++col)
          emit(o[col], bias, st, ns, base + row * yy + col * yx + ch, img, oy0 + row, ox0 + col, ch, m, y);
      }
    }
  }
}

void WinogradOp::run(Engine& e) {
  const double b = input_bound(e, *this);
  const double top = b * kGrowth * gain + offset;
  if (!(top <= kLimit)) {  // a NaN, an inf or a bound too large to prove: direct, exact
    ++direct_calls;
    DnnlOp::run(e);
    return;
  }
  ++winograd_calls;
  const float* x = static_cast<const float*>(e.ptr(ins[0]));
  float* y = static_cast<float*>(e.ptr(outs[0]));
  for (size_t s = 0; s < steps.size(); ++s)
    if (steps[s].kind == 2) operands[s] = static_cast<const float*>(e.ptr(steps[s].tensor));
  float* scratch = reinterpret_cast<float*>(e.scratch.data());
  const int64_t blocks = (tiles + tb - 1) / tb;
  const int team = std::max(1, std::min(omp_get_max_threads(), threads_built));  // op_threads
  if (team > 1 && large) {  // the team on each block: tiles, then points, then tiles
    float* v = scratch;
    float* m = v + kPoints * tb * cs;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t t0 = blk * tb, nt = std::min(tb, tiles - t0);
#pragma omp parallel num_threads(team)
      {
        const int64_t me = omp_get_thread_num(), all = omp_get_num_threads();
        const int64_t lo = nt * me / all, hi = nt * (me + 1) / all;
        transform_input(*this, x, v, t0 + lo, hi - lo, lo);
#pragma omp barrier
        products(*this, v, m, nt, kPoints * me / all, kPoints * (me + 1) / all);
#pragma omp barrier
        transform_output(*this, operands.data(), m, y, t0 + lo, hi - lo, lo);
      }
    }
  } else {  // a block per thread
    parallel_for(team, blocks, [&](int64_t blk) {
      float* v = scratch + (int64_t)omp_get_thread_num() * per_thread;
      float* m = v + kPoints * tb * cs;
      const int64_t t0 = blk * tb, nt = std::min(tb, tiles - t0);
      transform_input(*this, x, v, t0, nt, 0);
      products(*this, v, m, nt, 0, kPoints);
      transform_output(*this, operands.data(), m, y, t0, nt, 0);
    });
  }
  guard_note(e, *this, top);
  if (!rest.steps.empty()) rest.run(e, outs[0]);
}

// U = G g Gᵀ per (k, c) in double, as [36][kp][c][16] (zeros past K)
void transform_weights(const Tensor& wt, const float* g, int64_t kk, int64_t cc, int64_t kp, float* u) {
  static const double G[6][3] = {{0.25, 0, 0}, {-1. / 6, -1. / 6, -1. / 6}, {-1. / 6, 1. / 6, -1. / 6},
                                 {1. / 24, 1. / 12, 1. / 6}, {1. / 24, -1. / 12, 1. / 6}, {0, 0, 1}};
  const size_t r = wt.dims.size();  // [.., K, C, 3, 3]
  const int64_t sk = wt.strides[r - 4], sc = wt.strides[r - 3], si = wt.strides[r - 2], sj = wt.strides[r - 1];
  std::memset(u, 0, (size_t)(kPoints * kp * cc * 16) * sizeof(float));
  for (int64_t k = 0; k < kk; ++k)
    for (int64_t c = 0; c < cc; ++c) {
      const float* f = g + k * sk + c * sc;
      double half[6][3];  // G g
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 3; ++j)
          half[i][j] = G[i][0] * f[0 * si + j * sj] + G[i][1] * f[1 * si + j * sj] + G[i][2] * f[2 * si + j * sj];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j) {
          double v = half[i][0] * G[j][0] + half[i][1] * G[j][1] + half[i][2] * G[j][2];
          u[(((i * 6 + j) * kp + k / 16) * cc + c) * 16 + k % 16] = (float)v;
        }
    }
}

}  // namespace
#endif

std::unique_ptr<DnnlOp> winograd_shell(Engine& e, const OpCall& c) {
#if defined(__x86_64__)
  if (c.kind != "conv" || !avx512_kernel_allowed("OPFORGE_CPU_WINOGRAD")) return nullptr;
  // [nsp, strides, pad_l, pad_r, dilation (torch's), has_bias] (contract_conv checked them)
  if (c.ia.size() != 10 || c.ia[0] != 2) return nullptr;
  const int64_t pt = c.ia[3], pl = c.ia[4], pb = c.ia[5], pr = c.ia[6];
  if (c.ia[1] != 1 || c.ia[2] != 1 || c.ia[7] != 1 || c.ia[8] != 1) return nullptr;
  for (int64_t p : {pt, pl, pb, pr})
    if (p < 0 || p > 2) return nullptr;
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  const Tensor& wt = e.tensors[(size_t)c.ins[1]];
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  const size_t wr = wt.dims.size();
  if (wr == 5 && wt.dims[0] != 1) return nullptr;  // groups
  const int64_t kk = wt.dims[wr - 4], cc = wt.dims[wr - 3];
  if (wt.dims[wr - 2] != 3 || wt.dims[wr - 1] != 3) return nullptr;
  const int64_t n = src.dims[0], h = src.dims[2], w = src.dims[3];
  if (src.dims[1] != cc || dst.dims[1] != kk || dst.dims[0] != n || cc < 16 || kk < 16) return nullptr;
  if (dst.dims[2] != h + pt + pb - 2 || dst.dims[3] != w + pl + pr - 2 || dst.dims[2] < 1 || dst.dims[3] < 1)
    return nullptr;
  if (!channels_contiguous(src) || !channels_contiguous(dst) || e.root(c.ins[0]) == e.root(c.outs[0]))
    return nullptr;
  if (!e.tensors[(size_t)e.root(c.ins[1])].is_const || e.ptr(c.ins[1]) == nullptr) return nullptr;
  auto op = std::make_unique<WinogradOp>();
  op->n = n; op->c = cc; op->k = kk; op->h = h; op->w = w;
  op->oh = dst.dims[2]; op->ow = dst.dims[3]; op->pt = pt; op->pl = pl;
  op->tw = (op->ow + 3) / 4;
  // sizes: each factor below 2^20 (dims of a validated tensor, at most 2^40 elements)
  op->per_image = mul_c((op->oh + 3) / 4, op->tw, "winograd");
  op->tiles = mul_c(n, op->per_image, "winograd");
  op->kp = (kk + 15) / 16;
  op->cs = (cc + 15) / 16 * 16;
  op->ks = op->kp * 16;
  const int64_t floats = mul_c(mul_c(kPoints, op->ks, "winograd"), cc, "winograd");
  const int64_t bytes = mul_c(floats, 4, "winograd");
  if (bytes > kMaxTransformed || bytes / op->tiles > kMaxPerTile) return nullptr;
  // post-ops in registers while they are linear, clip, relu or the add of a same-shaped
  // tensor that is not a part of the destination at other positions; the rest after
  size_t first_rest = 0;
  for (; first_rest < c.post.size() && op->steps.size() < (size_t)kMaxSteps; ++first_rest) {
    const PostOp& p = c.post[first_rest];
    Step s;
    if (p.binary) {
      if (p.code != 100) break;  // add
      const Tensor& o = e.tensors[(size_t)p.tensor];
      if (o.dtype != F32 || o.dims != dst.dims || !channels_contiguous(o)) break;
      if (e.root(p.tensor) == e.root(c.outs[0])) {
        const int64_t at = o.base >= 0 ? o.offset : 0, dat = dst.base >= 0 ? dst.offset : 0;
        if (at != dat || o.strides != dst.strides) break;  // read and written at one place only
      }
      s.kind = 2; s.tensor = p.tensor;
      s.sn = o.strides[0]; s.sy = o.strides[2]; s.sx = o.strides[3];
    } else if (p.alg == dnnl::algorithm::eltwise_linear) {
      s.kind = 0; s.a = p.alpha; s.b = p.beta;
    } else if ((p.alg == dnnl::algorithm::eltwise_clip || p.alg == dnnl::algorithm::eltwise_clip_v2) &&
               p.alpha <= p.beta) {
      s.kind = 1; s.a = p.alpha; s.b = p.beta;
    } else if (p.alg == dnnl::algorithm::eltwise_relu && p.alpha == 0) {
      s.kind = 1; s.a = 0; s.b = INFINITY;
    } else {
      break;
    }
    op->steps.push_back(s);
  }
  op->operands.assign(op->steps.size(), nullptr);
  op->xn = src.strides[0]; op->xy = src.strides[2]; op->xx = src.strides[3];
  op->yn = dst.strides[0]; op->yy = dst.strides[2]; op->yx = dst.strides[3];
  // U through the weight cache (keyed by these dims, which no reorder of the weight has)
  memory::desc want({kPoints, op->kp, cc, 16}, memory::data_type::f32, tag::abcd);
  const float* g = static_cast<const float*>(e.ptr(c.ins[1]));
  const int64_t kp = op->kp;
  op->u = derived_const(e, c.ins[1], want, [&](float* u) { transform_weights(wt, g, kk, cc, kp, u); });
  op->up = static_cast<const float*>(op->u.get_data_handle());
  double gain = 0;
  for (int64_t xi = 0; xi < kPoints; ++xi)
    for (int64_t k = 0; k < kk; ++k) {
      double s = 0;
      for (int64_t ch = 0; ch < cc; ++ch) s += std::fabs((double)op->up[((xi * kp + k / 16) * cc + ch) * 16 + k % 16]);
      gain = std::max(gain, s);
    }
  op->gain = std::isfinite(gain) ? gain : INFINITY;
  e.reserve(mul_c(op->ks, 4, "winograd"), "winograd bias");
  op->bias.assign((size_t)op->ks, 0.f);
  op->offset = 0;
  if (c.ins.size() == 3) {
    const Tensor& bt = e.tensors[(size_t)c.ins[2]];
    const float* bp = static_cast<const float*>(e.ptr(c.ins[2]));
    if (!e.tensors[(size_t)e.root(c.ins[2])].is_const || bp == nullptr) return nullptr;
    for (int64_t k = 0; k < kk; ++k) {
      const float v = bp[k * bt.strides[0]];
      op->bias[(size_t)k] = v;
      op->offset = std::isfinite(v) ? std::max(op->offset, (double)std::fabs(v)) : INFINITY;
    }
  }
  // Blocks of tiles: each reads all of U. Where U fits in L2 (1 MiB): 12 tiles, so V and M
  // stay there too, and a block per thread at least (each thread runs whole blocks). Past
  // it: up to 64 tiles, so U is read fewer times, and with threads the team shares each
  // block (input transform by tiles, products by points: each thread reads its part of
  // U, output transform by tiles). One thread: 28×28×128 (U 2.4 MB) 400 → 355 µs a call,
  // 14×14×256 (U 9.4 MB, from memory in a network) 720 → 580 µs; that one with two
  // threads 445 µs a block per thread, 303 µs shared.
  op->large = bytes > kFitsL2;
  const int64_t most = op->large ? kLargeBlock : kTileBlock;
  // (and V and M of a block at most 4 MiB: a few channels in, thousands out)
  const int64_t fits = kMaxScratch / (kPoints * (op->cs + op->ks) * 4);
  // (the op's team: its threads are set now, core.cpp's ThreadScope; a small op runs on one
  // thread, and blocks sized for the engine's two made an 8×8 map 3.1 → 5.1 µs)
  const int team = std::max(1, std::min(omp_get_max_threads(), e.threads));
  op->threads_built = team;  // the scratch holds blocks for this many threads at most
  const int64_t share = op->large ? op->tiles : (op->tiles + team - 1) / team;
  op->tb = std::max<int64_t>(1, std::min({most, fits, share}));
  op->per_thread = mul_c(mul_c(kPoints, op->tb, "winograd"), add_c(op->cs, op->ks, "winograd"), "winograd");
  grow_scratch(e, mul_c(mul_c(op->per_thread, op->large ? 1 : team, "winograd"), 4, "winograd"));
  op->scans_input = true;  // its input's producer's bound, found by link_guards
  op->rest.pending.assign(c.post.begin() + (std::ptrdiff_t)first_rest, c.post.end());
  op->rest.prepare(e, c.outs[0]);
  return op;
#else
  (void)e; (void)c;
  return nullptr;
#endif
}

bool winograd_counts(const Op& op, int64_t* counts) {
#if defined(__x86_64__)
  auto* w = dynamic_cast<const WinogradOp*>(&op);
  if (w == nullptr) return false;
  counts[0] = w->winograd_calls;
  counts[1] = w->direct_calls;
  return true;
#else
  (void)op; (void)counts;
  return false;
#endif
}

}  // namespace ofc
