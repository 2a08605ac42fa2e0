// Softmax (f32) over one axis: a row kernel of the engine's own on CPUs with AVX-512F,
// oneDNN's primitive everywhere else, torch's semantics on both.
//
// Contract: ins [src], outs [dst]; ia [axis, log (0/1)] or [axis, log, safe (0/1)].
//   src, dst: f32, one shape, rank >= 1, no overlapping strides; 0 <= axis < rank.
//   safe (not with log): a row whose every element is -inf gives zeros, not NaN (torch's
//   _safe_softmax, what scaled_dot_product_attention decomposes into).
//
// The row kernel (softmax, not log, over an axis of stride 1 in src and dst; AVX-512F, not
// with OPFORGE_CPU_CAPABILITY=default): per row one pass for the max and whether a NaN is
// there, one for e = exp(x - max) kept in dst and its sum, one to scale dst by 1 / sum.
// exp reduces t = x - max (<= 0) to r = t - n ln2 with n = round(t / ln2) (ln2 in two
// parts, so r is exact to a few ulps) and evaluates a degree-6 polynomial on |r| <= ln2/2
// (Cephes' expf coefficients, about 1 ulp), scaled by 2^n (vscalefps). t below -87.34, where
// exp is under float32's smallest normal, and a masked element (-inf) give exactly 0 (torch
// gives 0 for a masked one and at most 1.2e-38 for the others, against a sum >= 1). A row
// holding a NaN or +inf, or only -inf, goes to the exact row loop below instead.
// Why: oneDNN's softmax took 27 µs on attention's 4×128×128 scores (one thread, AVX-512) and
// the special-value scan after it 7 µs more; the row kernel takes 13 µs in all, within
// oneDNN's error (both <= 1.3e-6 relative against float64 on N(0, 3) scores).
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cmath>

#include "engine.h"
#include "loops.h"
#include "vector_exp.h"

namespace ofc {

void contract_softmax(const Engine& e, const OpCall& c) {
  need_count(c, 1, 1);
  need_post_ops_allowed(c, false);
  need((c.ia.size() == 2 || c.ia.size() == 3) && (c.ia[1] == 0 || c.ia[1] == 1), c.kind,
       "attributes: ia [axis, log] or [axis, log, safe]");
  need(c.ia.size() == 2 || c.ia[2] == 0 || (c.ia[2] == 1 && c.ia[1] == 0), c.kind,
       "safe must be 0 or 1, and 0 with log");
  same_shape_f32(e, c, true);
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  need_rank(src, 1, kMaxRank, c.kind, "the source");
  need(c.ia[0] >= 0 && c.ia[0] < (int64_t)src.dims.size(), c.kind, "axis out of range");
}

// oneDNN's softmax maps a row holding NaN or +inf to numbers; torch's is NaN there. When
// the source holds a NaN or an inf (checked after each call), the rows holding NaN or +inf
// are recomputed here: m = max (NaN-propagating), e = exp(x - m), y = e / sum(e) (or x - m
// - log(sum)). A softmax row whose -inf elements are masked ones (its max finite: a causal
// mask) keeps oneDNN's result, its masked elements set to torch's 0.
// A row of only -inf is NaN there (x - m is -inf - -inf), or zeros when `safe`; it holds
// an inf, so the check above always sends it here.
namespace {
constexpr int32_t kNegInfBits = (int32_t)0xff800000;

struct RowScan {
  int64_t nonfinite = 0, masked = 0;  // NaN and ±inf; -inf
};

// integer counts only, so that the compiler vectorises a contiguous row (Unit: stride 1);
// a float max would not be (no NaN-aware max reduction without -ffast-math)
template <bool Unit>
RowScan scan_row(const float* x, int64_t n, int64_t stride) {
  const int32_t* bits = reinterpret_cast<const int32_t*>(x);
  int32_t nonfinite = 0, masked = 0;
  RowScan r;
  for (int64_t j = 0; j < n; ++j) {
    int32_t b = bits[Unit ? j : j * stride];
    nonfinite += (b & 0x7fffffff) >= 0x7f800000;
    masked += b == kNegInfBits;
  }
  r.nonfinite = nonfinite;
  r.masked = masked;
  return r;
}

// one row the exact way: x and y step by ss and ds elements
void exact_row(const float* x, float* y, int64_t n, int64_t ss, int64_t ds, bool log, bool safe) {
  // the row's max and what it holds: the count of non-finite elements less the count of
  // -inf ones is the NaN and +inf ones
  RowScan r = ss == 1 ? scan_row<true>(x, n, 1) : scan_row<false>(x, n, ss);
  if (r.nonfinite == 0 || (!log && r.nonfinite == r.masked && r.masked < n)) {
    // finite values, and for softmax masked ones (-inf): oneDNN's result, with each masked
    // element exactly torch's 0 whatever oneDNN's exp gave there (a log softmax row with an
    // inf is recomputed: oneDNN's log of a mostly masked row's sum is off by a few ulps of
    // the large magnitudes such rows hold)
    if (r.masked) {
      if (ss == 1 && ds == 1)
        for (int64_t j = 0; j < n; ++j) y[j] = x[j] == -INFINITY ? 0.f : y[j];
      else
        for (int64_t j = 0; j < n; ++j) y[j * ds] = x[j * ss] == -INFINITY ? 0.f : y[j * ds];
    }
    return;
  }
  float m = -INFINITY;  // NaN-propagating
  for (int64_t j = 0; j < n; ++j) {
    float v = x[j * ss];
    if (v != v) { m = v; break; }
    if (v > m) m = v;
  }
  if (safe && m == -INFINITY) {
    for (int64_t j = 0; j < n; ++j) y[j * ds] = 0.f;
    return;
  }
  // exp once per element (a masked one, -inf, is exp(-inf) = 0 without the call: a
  // decoding step's scores are mostly masked), kept in y until the sum is known
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    float v = x[j * ss];
    float ej = v == -INFINITY && m != -INFINITY ? 0.f : std::exp(v - m);
    sum += ej;
    if (!log) y[j * ds] = ej;
  }
  if (log) {
    float log_sum = std::log(sum);
    for (int64_t j = 0; j < n; ++j) y[j * ds] = x[j * ss] - m - log_sum;
  } else {
    for (int64_t j = 0; j < n; ++j) y[j * ds] = y[j * ds] / sum;
  }
}

#if defined(__x86_64__)
#define OFC_AVX512 __attribute__((target("avx512f")))

// one contiguous row; false (dst untouched) when it holds a NaN or +inf or is all -inf
OFC_AVX512 bool fast_row(const float* x, float* y, int64_t n) {
  const int64_t full = n & ~(int64_t)15;
  const __mmask16 tail = (__mmask16)((1u << (n - full)) - 1u);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 m = neg_inf;
  __mmask16 nan = 0;
  for (int64_t j = 0; j < full; j += 16) {
    __m512 v = _mm512_loadu_ps(x + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  if (tail) {
    __m512 v = _mm512_mask_loadu_ps(neg_inf, tail, x + full);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  float max = _mm512_reduce_max_ps(m);
  if (nan || !std::isfinite(max)) return false;
  const __m512 mv = _mm512_set1_ps(max);
  __m512 s = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
    s = _mm512_add_ps(s, e);
    _mm512_storeu_ps(y + j, e);
  }
  if (tail) {
    __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, tail, x + full), mv));
    s = _mm512_add_ps(s, e);
    _mm512_mask_storeu_ps(y + full, tail, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(s));  // sum >= 1: exp(0) is in it
  for (int64_t j = 0; j < full; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), inv));
  if (tail) _mm512_mask_storeu_ps(y + full, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, y + full), inv));
  return true;
}

#endif

bool row_kernel_available() {
#if defined(__x86_64__)
  return own_kernels_allowed() && __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

}  // namespace


struct SoftmaxOp : DnnlOp {
  int axis = 0;
  bool log = false, safe = false;
  bool rows = false;  // the row kernel, not oneDNN
  void run(Engine& e) override {
    if (rows) return each_row(e, true);
    DnnlOp::run(e);
    if (special_input(e, *this, true)) each_row(e, false);
  }
  // every row through the row kernel (fast), or else (a row it declines, or every row after
  // oneDNN's primitive) through the exact loop
  void each_row(Engine& e, bool fast) {
    const Tensor& ts = e.tensors[(size_t)ins[0]];
    const Tensor& td = e.tensors[(size_t)outs[0]];
    const float* src = static_cast<const float*>(e.ptr(ins[0]));
    float* dst = static_cast<float*>(e.ptr(outs[0]));
    const size_t rank = ts.dims.size();
    const int64_t n = ts.dims[(size_t)axis], ss = ts.strides[(size_t)axis], ds = td.strides[(size_t)axis];
    int64_t count = 1;  // the rows: bounded by the tensor's elements (contract)
    for (size_t k = 0; k < rank; ++k) count *= k == (size_t)axis ? 1 : ts.dims[k];
    if (n == 0) return;
    const int team = omp_get_max_threads();  // this op's threads (core.cpp's op_threads)
    const bool parallel = fast && count * n >= (1 << 15);
    parallel_for(parallel ? team : 1, count, [&](int64_t row) {
      int64_t xo = 0, yo = 0, rest = row;
      for (size_t k = rank; k-- > 0;) {
        if (k == (size_t)axis) continue;
        int64_t i = rest % ts.dims[k];
        rest /= ts.dims[k];
        xo += i * ts.strides[k];
        yo += i * td.strides[k];
      }
#if defined(__x86_64__)
      if (fast && fast_row(src + xo, dst + yo, n)) return;
#endif
      exact_row(src + xo, dst + yo, n, ss, ds, log, safe);
    });
  }
};

void build_softmax(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  auto op = std::make_unique<SoftmaxOp>();
  op->axis = (int)c.ia[0];
  op->log = c.ia[1] != 0;
  op->safe = c.ia.size() == 3 && c.ia[2] != 0;
  const Tensor& ts = e.tensors[(size_t)c.ins[0]];
  const Tensor& td = e.tensors[(size_t)c.outs[0]];
  op->rows = !op->log && ts.strides[(size_t)op->axis] == 1 && td.strides[(size_t)op->axis] == 1 &&
             row_kernel_available();
  op->name = std::string(op->safe ? "safe softmax" : "softmax") + (op->rows ? " (row kernel)" : "");
  op->scans_input = !op->rows;
  memory::desc src = ts.md(), dst = td.md();
  op->arg(DNNL_ARG_SRC, c.ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get());
  op->check_fits(e);
  if (!op->rows) {
    auto pd = dnnl::softmax_forward::primitive_desc(
        e.eng, dnnl::prop_kind::forward_inference,
        c.ia[1] ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, src, dst,
        (int)c.ia[0], attr);
    op->prim = dnnl::softmax_forward(pd);
    add_scratchpad(e, op.get(), pd.scratchpad_desc());
  }
  op->bind(e);
  push_op(e, std::move(op), c);
}

}  // namespace ofc
