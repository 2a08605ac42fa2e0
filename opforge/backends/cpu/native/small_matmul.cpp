// A matmul of a few rows against constant weights (a linear layer at batch 1-8: online
// inference, a decoder's step on small layers), on the engine's own AVX-512 kernel; every
// other matmul stays on oneDNN (matmul.cpp). On a CPU with AVX2 and FMA but no AVX-512 the
// same op takes every matmul against constant weights, any number of rows and any size,
// on its AVX2 kernels (small_matmul_avx2.cpp: why, and how they block); with
// OPFORGE_CPU_CAPABILITY=default, or OPFORGE_CPU_MATMUL_AVX2=0 there, all stay on oneDNN.
// OPFORGE_CPU_SMALL_MATMUL_AVX512=0 turns the AVX-512 kernel off (and the AVX2 one on).
//
// Taken when: a [.., M, K] x b [.., K, N] with every batch dim 1, M <= 8, K·N <= 2^16 (so
// M·K·N < 2^20: ops the engine runs on one thread, threads.cpp), b a constant (any
// strides), bias absent or a constant broadcast along the rows, dst's rows contiguous, and
// no binary post-op. Eltwise linear, clip and relu without slope (a linear layer's relu, relu6,
// hardtanh, folded scales) run in the kernel's registers; from the first other one (a
// GELU) the chain runs in place after it (the Epilogue of nan.cpp, NaN-exact).
//
// Arithmetic: each output is Σ_k a[m, k]·b[k, n] in float32, k in order, one fused
// multiply-add per term, then + bias, then the post-ops. NaN-exact without the NaN guard:
// relu and clip are max(lo, v) and min(hi, v) with v the operand the instructions return
// when either is NaN, so a NaN stays NaN as in torch (oneDNN's relu maps it to 0).
//
// The kernel: b reordered at build into panels of 16 columns ([panel][K][16], the last
// padded; through the weight cache like oneDNN's layouts, so a weight it shares with a
// oneDNN matmul is held in both layouts: at most 256 KB, see build_small_matmul); per block
// of up to 4 rows and 4 panels (64 columns), 16 accumulators, each step of k one broadcast
// of a per row and one load per panel. Why: oneDNN's matmul spends ~1 µs a call on these
// (the zoo's mlp: [4, 64] x [64, 128] + relu 1.17 µs, [4, 128] x [128, 10] 0.72 µs, one
// thread, Zen 5), mostly outside the arithmetic; this takes 0.34 and 0.17 µs, and 1.08 for
// the GELU one (1.27 on oneDNN): the mlp call 4.6 → 3.3 µs. (Reading b in place instead,
// row-major or as dot products over a linear layer's [N, K] rows, ran 1.5-2× slower than
// this: strided rows and the sums across lanes.)
//
// Decode-shaped: the same kernel takes at most 8 rows against larger constant weights (a
// decoder's one-token step: every weight read once per call, from memory), reading b in
// the layout oneDNN's own matmul of that shape reorders it into, when that layout is
// BA16a64b ([N/64][K/16][16 k][64 n]: 64 columns as 4 panels, a row of k 64 floats apart):
// the same reordered weights through the weight cache, so nothing is held twice, and a
// 64-column block streams its K rows in order. Measured on an AMD EPYC (Zen 4, 1 thread,
// weights far past the caches; bench/decode_matmul.py): oneDNN's brgemm reads 13-14 GB/s
// at one row, this 18-23 GB/s; 1-8 rows 1.2-1.8× faster on every decoder shape tried;
// OPFORGE_CPU_DECODE_MATMUL=0 keeps oneDNN's. Post-ops: the register ones in the kernel,
// the rest (binary ones, a layer scale and a residual add, included) in place after it,
// their operands late_reads: live through this op in the memory plan so the output never
// takes their bytes (it did: a SwiGLU's product read back as up·up), and a constant one
// kept at finalize (it was freed as if read only at init: cait's x + gamma * fc2(h) read
// gamma through a null pointer, core.cpp). Blocks of 64 columns are split over the op's
// threads.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstdlib>
#include <cstring>

#include "small_matmul.h"

namespace ofc {

#if defined(__x86_64__)
namespace {

constexpr int kPanel = SmallMatmulOp::kPanel;
constexpr int64_t kMaxRows = 8;
constexpr int64_t kMaxWeights = (int64_t)1 << 16;  // K·N: 256 KB (build_small_matmul)
constexpr int kBlockPanels = SmallMatmulOp::kBlockPanels;

#define OFC_AVX512 __attribute__((target("avx512f")))

// R rows × P panels from panel p0: each step of k one broadcast of a per row and one load
// per panel (the packed panels are whole: the last one's padding columns are computed and
// never stored)
template <int R, int P>
OFC_AVX512 void block(const SmallMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p0) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const int64_t K = op.k;
  const float* panel = op.base(p0);
  for (int64_t kk = 0; kk < K; ++kk) {
    __m512 bv[P];
    for (int p = 0; p < P; ++p) bv[p] = _mm512_loadu_ps(panel + kk * op.step_k + p * op.step_p);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[(m0 + r) * op.sa_m + kk * op.sa_k]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(av, bv[p], acc[r][p]);
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t col = (p0 + p) * kPanel;
    const int64_t left = op.n - col;
    const __mmask16 mask = left >= kPanel ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const __m512 bias = _mm512_loadu_ps(op.bias.data() + col);
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_add_ps(acc[r][p], bias);
      for (const RegisterPostOp& q : op.post) {
        if (q.kind == 0) v = _mm512_fmadd_ps(v, _mm512_set1_ps(q.a), _mm512_set1_ps(q.b));
        else v = _mm512_min_ps(_mm512_set1_ps(q.b), _mm512_max_ps(_mm512_set1_ps(q.a), v));
      }
      _mm512_mask_storeu_ps(d + (m0 + r) * op.sd_m + col, mask, v);
    }
  }
}

// R rows × the np (1-4) panels from p0
template <int R>
OFC_AVX512 void rows(const SmallMatmulOp& op, const float* a, float* d, int64_t m0, int64_t p0, int64_t np) {
  switch (np) {
    case 4: block<R, 4>(op, a, d, m0, p0); break;
    case 3: block<R, 3>(op, a, d, m0, p0); break;
    case 2: block<R, 2>(op, a, d, m0, p0); break;
    default: block<R, 1>(op, a, d, m0, p0); break;
  }
}

// the weights' layout for oneDNN's matmul of this call (what build_matmul would reorder
// them into), when it is BA16a64b over b's last two dims: its N-block stride, else 0
int64_t decode_layout(Engine& e, const OpCall& c, memory::desc& want) {
  if (!switched_on("OPFORGE_CPU_DECODE_MATMUL")) return 0;
  const Tensor& b = e.tensors[(size_t)c.ins[1]];
  const int r = (int)b.dims.size();
  try {
    memory::desc any(b.dims, memory::data_type::f32, tag::any);
    dnnl::matmul::primitive_desc pd(e.eng, e.tensors[(size_t)c.ins[0]].md(), any,
                                    e.tensors[(size_t)c.outs[0]].md());
    want = pd.weights_desc();
  } catch (const dnnl::error&) {
    return 0;
  }
  if (want.get_format_kind() != memory::format_kind::blocked) return 0;
  const memory::dims blks = want.get_inner_blks(), idxs = want.get_inner_idxs(), st = want.get_strides();
  if (blks != memory::dims{16, 64} || idxs != memory::dims{r - 2, r - 1} || st[(size_t)r - 2] != 16 * 64)
    return 0;
  return st[(size_t)r - 1];
}

}  // namespace
#endif

void SmallMatmulOp::run(Engine& e) {
#if defined(__x86_64__)
  const float* a = static_cast<const float*>(e.ptr(ins[0]));
  float* d = static_cast<float*>(e.ptr(outs[0]));
  // per block of 4 panels, every row: a block's weights are read from memory once a call
  parallel_for(team, (panels + kBlockPanels - 1) / kBlockPanels, [&](int64_t i) {
    const int64_t p0 = i * kBlockPanels, np = std::min<int64_t>(kBlockPanels, panels - p0);
    if (avx2) {
      small_matmul_avx2_block(*this, a, d, p0);
      return;
    }
    int64_t m0 = 0;
    for (; m0 + 4 <= m; m0 += 4) rows<4>(*this, a, d, m0, p0, np);
    switch (m - m0) {
      case 3: rows<3>(*this, a, d, m0, p0, np); break;
      case 2: rows<2>(*this, a, d, m0, p0, np); break;
      case 1: rows<1>(*this, a, d, m0, p0, np); break;
      default: break;
    }
  });
#endif
  if (!rest.steps.empty()) rest.run(e, outs[0]);
}

bool build_small_matmul(Handle& h, const OpCall& c) {
#if defined(__x86_64__)
  Engine& e = h.e;
  // AVX2 + FMA without AVX-512: every row count, every weight size (small_matmul_avx2.cpp)
  const bool avx2 = small_matmul_avx2_allowed();
  if (!avx2 && !avx512_kernel_allowed("OPFORGE_CPU_SMALL_MATMUL_AVX512")) return false;
  const Tensor& a = e.tensors[(size_t)c.ins[0]];
  const Tensor& b = e.tensors[(size_t)c.ins[1]];
  const Tensor& d = e.tensors[(size_t)c.outs[0]];
  const size_t r = d.dims.size();
  for (size_t k = 0; k + 2 < r; ++k)
    if (a.dims[k] != 1 || b.dims[k] != 1 || d.dims[k] != 1) return false;
  const int64_t M = d.dims[r - 2], N = d.dims[r - 1], K = a.dims[r - 1];
  int64_t weights = 0;
  // at most 256 KB of weights: past that a few rows are memory-bound on either kernel, and
  // it bounds what a weight that oneDNN's matmul also reads in its own layout (a dynamic
  // delegate's larger shapes, a decoder's prefill beside its one-row steps) holds twice
  if (M < 1 || (M > kMaxRows && !avx2) || N < 1 || K < 1 || __builtin_mul_overflow(K, N, &weights))
    return false;
  if (!e.tensors[(size_t)e.root(c.ins[1])].is_const ||
      e.root(c.ins[0]) == e.root(c.outs[0]))  // (an output over its input: oneDNN's, as before)
    return false;
  if (N > 1 && d.strides[r - 1] != 1) return false;  // dst's rows contiguous
  const Tensor* bias = nullptr;
  if (c.ins.size() == 3) {
    bias = &e.tensors[(size_t)c.ins[2]];
    if (!e.tensors[(size_t)e.root(c.ins[2])].is_const) return false;
    for (size_t k = 0; k + 1 < r; ++k)
      if (bias->dims[k] != 1) return false;  // one value per column (or one for all)
  }
  // the post-ops the kernel runs in registers, the rest in place after it
  std::vector<RegisterPostOp> post;
  int first_rest = register_post_ops(c.post, post);
  memory::desc want;
  int64_t block_stride = 0;
  if (weights > kMaxWeights && !avx2) {  // decode-shaped: oneDNN's own layout, or oneDNN's matmul
    block_stride = decode_layout(e, c, want);
    if (block_stride == 0) return false;
  }
  if (weights > kMaxWeights || avx2) {
    if (first_rest < 0) {  // a binary one (a residual add): all of them in place after
      post.clear();
      first_rest = 0;
    }
  }
  if (first_rest < 0) return false;  // a binary one reads another tensor: oneDNN's, as before
  const float* biassrc = bias ? static_cast<const float*>(e.ptr(c.ins[2])) : nullptr;
  if (bias && biassrc == nullptr) return false;
  // the panels are a oneDNN layout of b, reordered once through the program's weight cache
  // (shared by every engine that multiplies by the weight this way)
  if (block_stride == 0) {
    try {  // [panel][K][16] is aBc16b of [1, N, K]; as [K, N], its transpose
      want = memory::desc({1, N, K}, memory::data_type::f32, tag::aBc16b).reshape({N, K}).permute_axes({1, 0});
      want = want.reshape(b.dims);
    } catch (const dnnl::error&) {
      return false;
    }
  }
  auto op = std::make_unique<SmallMatmulOp>();
  op->name = avx2           ? "matmul on AVX2 (own kernel)"
             : block_stride ? "matmul on few rows, decode-shaped (own kernel)"
                            : "matmul on few rows (own kernel)";
  op->avx2 = avx2;
  if (avx2) {
    op->step_p = K * kPanel;
    op->team = op_threads(e, c);
  } else if (block_stride) {
    op->block_stride = block_stride;
    op->step_k = kBlockPanels * kPanel;
    op->step_p = kPanel;
    op->team = op_threads(e, c);
  } else {
    op->step_p = K * kPanel;
  }
  op->m = M; op->k = K; op->n = N;
  op->panels = (N + kPanel - 1) / kPanel;
  op->sa_m = a.strides[r - 2]; op->sa_k = a.strides[r - 1];
  op->sd_m = d.strides[r - 2];
  op->post = std::move(post);
  op->packed = reorder_const(e, c.ins[1], want);
  op->bp = static_cast<const float*>(op->packed.get_data_handle());
  const int64_t cols = mul_c(op->panels, kPanel, "small matmul");
  e.reserve(mul_c(cols, 4, "small matmul"), "small matmul bias");
  op->bias.assign((size_t)cols, 0.f);
  if (bias) {
    const int64_t sn = bias->dims[r - 1] == 1 ? 0 : bias->strides[r - 1];
    for (int64_t col = 0; col < N; ++col) op->bias[(size_t)col] = biassrc[col * sn];
  }
  op->rest.pending.assign(c.post.begin() + first_rest, c.post.end());
  op->rest.prepare(e, c.outs[0]);
  push_op(e, std::move(op), c);
  return true;
#else
  (void)h; (void)c;
  return false;
#endif
}

}  // namespace ofc
