// Attention over the filled part of a KV cache (f32, a loop): for each query head h and row i,
//   s_j = (q[h,i] . k[h/G, j]) / f   (or * f),   j = 0 .. n_i - 1,   n_i = min(pos[i] + 1, S)
//   o[h,i] = sum_j softmax(s)_j v[h/G, j]
// which is what `softmax(masked_fill(q @ K^T / f, slots > pos[:, None], -inf)) @ V` gives
// over the whole cache of S slots (a masked slot's weight is exactly 0), without reading the
// slots after pos[i]: a decode step at position 10 of a 2,048-slot cache reads 11 of them.
// The lowering (lowering/attention.py) emits it where that pattern's mask is `slots >
// positions` with `slots` 0..S-1 and its K/V operands are views of the cache.
//
// Contract: ins [q, k, v, pos], outs [o]; ia [mode] or [mode, empty, bias] (mode 0:
// divide the scores by fa[0], 1: multiply; empty: what a row with no slot to attend to
// gives, 0 NaN (softmax of a row of -inf), 1 zeros (the safe softmax), 2 the mean of all
// S value rows (a finite mask value: every score of such a row is that value); bias: row i
// reads n_i = clamp(pos[i] + bias, 0, S) slots, 1 for a mask `j <= pos`, 0 for `j < pos`;
// [mode] means empty 0, bias 1), or [mode, empty, bias, source], fa [factor]. source 0:
// ins[3] is the positions, i64 [M]; else ins[3] is a mask [M, S] (any strides, a row
// stride of 0 for one mask row for all) read at run time: 1 bool, True = attend; 2 bool,
// True = masked; 3 f32, added to the scores. Row i then reads n_i = 1 + the last slot
// not masked (-inf for 3) and nothing after it; a masked slot before it scores -inf (3:
// its mask value is added). Where the mask says nothing is attended, n_i = 0 (see empty).
//   q, o: f32 [H, M, D]; k, v: [Hkv, S, D] of one dtype, f32, f16 or bf16 (a half-precision
//   cache: its slots converted to f32 as they are read, exactly; half.h), with H a multiple
//   of Hkv (head h reads KV
//   head h / (H / Hkv), as repeat_interleave does); pos: i64 [M]. Any strides, the last dim
//   of q, k, v and o dense (stride 1). D >= 1, S >= 1.
// Run time: a row whose pos + bias is 0 or less has no slot to attend to (see empty);
// pos + bias >= S reads all S slots (nothing masked). A row whose attended scores are all
// -inf gives zeros where empty is 1 (the safe softmax), NaN otherwise; NaN or +inf, NaN.
// Two implementations, the result of each within float rounding of torch's, not bitwise:
// - the one-pass kernels (attention_rows.h): one pass over the slots per KV head and row,
//   its G query heads sharing each block of 16 K/V rows, online softmax (running max and
//   sum, the value sum normalised at the end), a vector exp; a half cache converted in
//   registers. AVX-512 where the CPU has AVX-512F/BW/VL (OPFORGE_CPU_ATTENTION_AVX512=0 turns
//   it off), else AVX2 + FMA + F16C (Zen 2/3, Intel client cores; OPFORGE_CPU_ATTENTION_AVX2
//   =0 turns it off); the op's name says which ("attention (filled slots, AVX2)");
// - the plain loops (other CPUs, OPFORGE_CPU_CAPABILITY=default, both switches 0): a row's
//   scores stored, softmax's exp in float, the weights normalised before the value sum
//   (torch's two steps); a half cache converted 64 slots at a time.
// A call with few multiply-adds (a decode step over a few dozen slots) runs on one thread.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_rows.h"
#include "engine.h"
#include "half.h"

namespace ofc {

namespace {

// each row function compiled for AVX-512, AVX2+FMA and the baseline, picked at load by the
// CPU (GCC's target_clones); `omp simd` lets the sums be reassociated into vector lanes
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OFC_ROW_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#else
#define OFC_ROW_CLONES
#endif

// exp(x) for x <= 0 (a score less the row's max): x = n ln2 + r, |r| <= ln2/2, ln2 in two
// parts; Cephes' expf polynomial on r (about 1 ulp), times 2^n built in the exponent bits.
// Below -87.34 exp is under float's smallest normal: 0 (-inf, a masked score, too).
inline float exp_nonpositive(float x) {
  const bool under = !(x >= -87.33654f);
  x = under ? -87.33654f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return under ? 0.0f : p * scale;
}

// w[g * wn + j] = (q_g . k_j) / factor (or * factor), j < n, g < G; k_j = k + j * ks: the
// G query heads of one KV head together, so each key row is read once for all of them
OFC_ROW_CLONES void score_rows(const float* const* q, int64_t G, const float* k, int64_t ks,
                               int64_t n, int64_t D, bool multiply, float factor, float* w,
                               int64_t wn) {
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = k + j * ks;
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = q[g];
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qg[d] * kr[d];
      w[g * wn + j] = multiply ? s * factor : s / factor;
    }
  }
}

// the row's max, and whether it holds a NaN
OFC_ROW_CLONES float row_max(const float* w, int64_t n, bool* nan) {
  float top = -INFINITY;
  int32_t nans = 0;
#pragma omp simd reduction(max : top) reduction(+ : nans)
  for (int64_t j = 0; j < n; ++j) {
    nans += w[j] != w[j];
    top = std::max(top, w[j]);
  }
  *nan = nans != 0;
  return top;
}

// w[j] = exp(w[j] - top); returns their sum
OFC_ROW_CLONES float exp_row(float* w, int64_t n, float top) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    w[j] = exp_nonpositive(w[j] - top);
    sum += w[j];
  }
  return sum;
}

// o_g (+)= sum_j (w[g * wn + j] / sum_g) v_j over D for each g with o[g] set (the others
// skipped; o_g zeroed first where `first`), v_j = v + j * vs: each value row read once for
// the G heads
OFC_ROW_CLONES void value_rows(const float* w, const float* sums, float* const* o, int64_t G,
                               const float* v, int64_t vs, int64_t n, int64_t D, int64_t wn,
                               bool first) {
  for (int64_t g = 0; g < G && first; ++g)
    if (o[g] != nullptr)
      for (int64_t d = 0; d < D; ++d) o[g][d] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = v + j * vs;
    for (int64_t g = 0; g < G; ++g) {
      float* og = o[g];
      if (og == nullptr) continue;
      const float weight = w[g * wn + j] / sums[g];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) og[d] += weight * vr[d];
    }
  }
}

void fill_value(float* o, int64_t D, float value) {
  for (int64_t d = 0; d < D; ++d) o[d] = value;
}

// a cache's rows [j0, j0 + m) of one KV head (D elements each, `stride` elements apart) as
// float32 rows `*rs` apart: the rows themselves (f32), or converted into buf (f16, bf16)
const float* rows_f32(const void* base, int32_t dtype, int64_t stride, int64_t j0, int64_t m,
                      int64_t D, bool vector, std::vector<float>& buf, int64_t* rs) {
  if (dtype == F32) {
    *rs = stride;
    return static_cast<const float*>(base) + j0 * stride;
  }
  buf.resize((size_t)(m * D));
  for (int64_t r = 0; r < m; ++r)
    half_to_f32(static_cast<const uint16_t*>(base) + (j0 + r) * stride, buf.data() + r * D, D,
                dtype, vector);
  *rs = D;
  return buf.data();
}


// a half-precision cache's rows are converted this many at a time (16 KiB of float32 rows
// of 64 elements: in L1 while the G heads read them)
constexpr int64_t kHalfChunk = 64;

// a call's multiply-adds (heads x head size x slots read) below which it runs on one thread:
// ~10 µs of the plain loops, ~2 µs of attention_rows at one row
constexpr double kParallelWork = 131072.0;

// o = the mean of the S value rows (a row of only masked scores under a finite mask value)
void mean_rows(float* o, const void* v, int32_t dtype, int64_t vs, int64_t S, int64_t D,
               bool vector) {
  std::vector<double> sum((size_t)D, 0.0);
  std::vector<float> buf;
  for (int64_t j = 0; j < S; ++j) {
    int64_t rs = 0;
    const float* row = rows_f32(v, dtype, vs, j, 1, D, vector, buf, &rs);
    for (int64_t d = 0; d < D; ++d) sum[(size_t)d] += row[d];
  }
  for (int64_t d = 0; d < D; ++d) o[d] = (float)(sum[(size_t)d] / (double)S);
}

struct AttentionOp : Op {
  bool multiply = false;
  float factor = 1.0f;
  int64_t empty = 0, bias = 1, source = 0;
  int32_t kv_dtype = F32;  // the cache's: F32, or F16 / BF16 converted as read
  bool vector = false;     // half.h's vector conversions
  RowsKernel kernel = RowsKernel::loops;  // attention_rows.h's one-pass kernel, or the loops

  // the slots row i reads: from its position, or 1 + its mask's last attended slot
  int64_t row_slots(const Tensor& p, const void* pp, int64_t i, int64_t S) const {
    if (source == 0) {
      const int64_t pos = static_cast<const int64_t*>(pp)[i * p.strides[0]];
      return pos <= -bias ? 0 : pos >= S - bias ? S : pos + bias;  // (no overflow)
    }
    for (int64_t j = S - 1; j >= 0; --j)
      if (!masked(p, pp, i, j)) return j + 1;
    return 0;
  }

  bool masked(const Tensor& p, const void* pp, int64_t i, int64_t j) const {
    const int64_t at = i * p.strides[0] + j * p.strides[1];
    if (source == 3) return static_cast<const float*>(pp)[at] == -INFINITY;
    return (static_cast<const uint8_t*>(pp)[at] != 0) == (source == 2);
  }

  // the mask's term for slot j of row i (0 where the bound comes from positions)
  float mask_term(const Tensor& p, const void* pp, int64_t i, int64_t j) const {
    if (source == 0) return 0.0f;
    if (source == 3) return static_cast<const float*>(pp)[i * p.strides[0] + j * p.strides[1]];
    return masked(p, pp, i, j) ? -INFINITY : 0.0f;
  }

  // the plain loops (any CPU): the G heads' scores of row i in w, then softmax, then values
  void plain_rows(const float* const* qs, float* const* os_in, int64_t group, int64_t D,
                  const char* kh, int64_t ks, const char* vh, int64_t vs, int64_t n,
                  const Tensor& p, const void* pp, int64_t i) const {
    thread_local std::vector<float> w, sums, buf;
    thread_local std::vector<float*> os;
    w.resize((size_t)(group * n));
    sums.resize((size_t)group);
    os.assign(os_in, os_in + group);
    const int64_t chunk = kv_dtype == F32 ? n : kHalfChunk;
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
      const int64_t m = std::min(chunk, n - j0);
      int64_t rs = 0;
      const float* rows = rows_f32(kh, kv_dtype, ks, j0, m, D, vector, buf, &rs);
      score_rows(qs, group, rows, rs, m, D, multiply, factor, w.data() + j0, n);
    }
    if (source != 0)  // the mask's terms (-inf for a masked slot before the last attended)
      for (int64_t j = 0; j < n; ++j) {
        const float term = mask_term(p, pp, i, j);
        if (term != 0.0f)
          for (int64_t g = 0; g < group; ++g) w[(size_t)(g * n + j)] += term;
      }
    for (int64_t g = 0; g < group; ++g) {
      bool nan = false;
      const float top = row_max(w.data() + g * n, n, &nan);
      // torch: a NaN or +inf score makes the row NaN; all -inf: exp(-inf - -inf) is NaN too
      // (the safe softmax: zeros)
      if (nan || top == INFINITY || top == -INFINITY) {
        const bool zero = !nan && top == -INFINITY && empty == 1;
        fill_value(os[(size_t)g], D, zero ? 0.0f : std::numeric_limits<float>::quiet_NaN());
        os[(size_t)g] = nullptr;
        continue;
      }
      sums[(size_t)g] = exp_row(w.data() + g * n, n, top);
    }
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
      const int64_t m = std::min(chunk, n - j0);
      int64_t rs = 0;
      const float* rows = rows_f32(vh, kv_dtype, vs, j0, m, D, vector, buf, &rs);
      value_rows(w.data() + j0, sums.data(), os.data(), group, rows, rs, m, D, n, j0 == 0);
    }
  }

  void run(Engine& e) override {
    const Tensor& q = e.tensors[(size_t)ins[0]];
    const Tensor& k = e.tensors[(size_t)ins[1]];
    const Tensor& v = e.tensors[(size_t)ins[2]];
    const Tensor& p = e.tensors[(size_t)ins[3]];
    const Tensor& o = e.tensors[(size_t)outs[0]];
    const float* qp = static_cast<const float*>(e.ptr(ins[0]));
    const int64_t item = (int64_t)itemsize(kv_dtype);
    const char* kp = static_cast<const char*>(e.ptr(ins[1]));
    const char* vp = static_cast<const char*>(e.ptr(ins[2]));
    const void* pp = e.ptr(ins[3]);
    float* op = static_cast<float*>(e.ptr(outs[0]));
    const int64_t H = q.dims[0], M = q.dims[1], D = q.dims[2];
    const int64_t S = k.dims[1], group = H / k.dims[0];
    const int64_t kv_heads = k.dims[0];
    // threads only where the multiply-adds outweigh a parallel region's start (a decode
    // step's row over a few dozen slots runs on one)
    double slots = source == 0 ? 0.0 : (double)M * (double)S;  // (an estimate: no overflow)
    for (int64_t i = 0; i < M && source == 0; ++i) slots += (double)row_slots(p, pp, i, S);
    const double work = (double)H * (double)D * slots;
    const int team = work < kParallelWork ? 1 : threads > 0 ? threads : omp_get_max_threads();
    parallel_for(team, kv_heads * M, [&](int64_t ki) {  // one KV head, one query row
      const int64_t kv = ki / M, i = ki % M;
      const int64_t n = row_slots(p, pp, i, S);
      thread_local std::vector<const float*> qs;
      thread_local std::vector<float*> os;
      qs.resize((size_t)group);
      os.resize((size_t)group);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kv * group + g;
        qs[(size_t)g] = qp + h * q.strides[0] + i * q.strides[1];
        os[(size_t)g] = op + h * o.strides[0] + i * o.strides[1];
      }
      if (n == 0) {  // no slot to attend to
        for (int64_t g = 0; g < group; ++g) {
          if (empty == 2)
            mean_rows(os[(size_t)g], vp + kv * v.strides[0] * item, kv_dtype, v.strides[1], S, D,
                      vector);
          else
            fill_value(os[(size_t)g], D, empty == 1 ? 0.0f : std::numeric_limits<float>::quiet_NaN());
        }
        return;
      }
      const char* kh = kp + kv * k.strides[0] * item;
      const char* vh = vp + kv * v.strides[0] * item;
      if (kernel == RowsKernel::loops) {
        plain_rows(qs.data(), os.data(), group, D, kh, k.strides[1], vh, v.strides[1], n, p, pp, i);
        return;
      }
      AttentionRows a;
      a.q = qs.data();
      a.o = os.data();
      a.G = group;
      a.D = D;
      a.n = n;
      a.k = kh;
      a.v = vh;
      a.ks = k.strides[1];
      a.vs = v.strides[1];
      a.dtype = kv_dtype;
      a.multiply = multiply;
      a.factor = factor;
      a.empty_zero = empty == 1;
      if (source != 0) {  // the mask's terms (-inf for a masked slot before the last attended)
        thread_local std::vector<float> terms;
        terms.resize((size_t)n);
        for (int64_t j = 0; j < n; ++j) terms[(size_t)j] = mask_term(p, pp, i, j);
        a.terms = terms.data();
      }
      attention_rows(a, kernel);
    });
  }
};

}  // namespace

void contract_attention(const Engine& e, const OpCall& c) {
  const std::string& kind = c.kind;
  need_count(c, 4, 1);
  need_post_ops_allowed(c, false);
  need((c.ia.size() == 1 || c.ia.size() == 3 || c.ia.size() == 4) && (c.ia[0] == 0 || c.ia[0] == 1),
       kind, "ia must be [mode], [mode, empty, bias] or [mode, empty, bias, source], mode 0 or 1");
  need(c.ia.size() < 4 || (c.ia[3] >= 0 && c.ia[3] <= 3), kind, "ia's source must be 0 to 3");
  const int64_t source = c.ia.size() == 4 ? c.ia[3] : 0;
  need(c.ia.size() == 1 || (c.ia[1] >= 0 && c.ia[1] <= 2 && (c.ia[2] == 0 || c.ia[2] == 1)), kind,
       "ia's empty must be 0, 1 or 2 and its bias 0 or 1");
  need(c.fa.size() == 1 && std::isfinite(c.fa[0]) && c.fa[0] != 0.0, kind,
       "fa must be [factor], finite and not 0");
  const Tensor& q = e.tensors[(size_t)c.ins[0]];
  const Tensor& k = e.tensors[(size_t)c.ins[1]];
  const Tensor& v = e.tensors[(size_t)c.ins[2]];
  const Tensor& p = e.tensors[(size_t)c.ins[3]];
  const Tensor& o = e.tensors[(size_t)c.outs[0]];
  const char* names[] = {"q", "k", "v", "the output"};
  const Tensor* floats[] = {&q, &k, &v, &o};
  need(k.dtype == v.dtype && (k.dtype == F32 || k.dtype == F16 || k.dtype == BF16), kind,
       "k and v must be of one dtype, float32, float16 or bfloat16");
  for (size_t t = 0; t < 4; ++t) {
    need_rank(*floats[t], 3, 3, kind, names[t]);
    if (t == 0 || t == 3) need_dtype(*floats[t], F32, kind, names[t]);
    need(floats[t]->dims[2] <= 1 || floats[t]->strides[2] == 1, kind,
         std::string(names[t]) + ": the last dim must be dense (stride 1)");
  }
  if (source == 0) {
    need_rank(p, 1, 1, kind, "the positions");
    need_dtype(p, I64, kind, "the positions");
    need(p.dims[0] == q.dims[1], kind, "one position per query row");
  } else {
    need_rank(p, 2, 2, kind, "the mask");
    need_dtype(p, source == 3 ? F32 : BOOL, kind, "the mask");
    need(p.dims[0] == q.dims[1] && p.dims[1] == k.dims[1], kind,
         "the mask must be [query rows, slots]");
  }
  need(q.dims == o.dims, kind, "q and the output have different shapes");
  need(k.dims == v.dims, kind, "k and v have different shapes");
  need(q.dims[2] >= 1 && k.dims[1] >= 1 && k.dims[0] >= 1, kind,
       "empty head, slot or KV-head dims");
  need(k.dims[2] == q.dims[2], kind, "q and k have different head sizes");
  need(q.dims[0] % k.dims[0] == 0, kind, "the query heads must be a multiple of the KV heads");
  need(injective(o.dims, o.strides), kind, "the output reaches an element twice");
}

void build_attention(Handle& h, const OpCall& c) {
  auto op = std::make_unique<AttentionOp>();
  op->kernel = attention_rows_kernel();
  op->name = op->kernel == RowsKernel::avx512 ? "attention (filled slots, AVX-512)"
             : op->kernel == RowsKernel::avx2 ? "attention (filled slots, AVX2)"
                                              : "attention (filled slots)";
  op->multiply = c.ia[0] == 1;
  op->factor = (float)c.fa[0];
  op->kv_dtype = h.e.tensors[(size_t)c.ins[1]].dtype;
  op->vector = half_vector_allowed();
  if (c.ia.size() == 4) op->source = c.ia[3];
  if (c.ia.size() >= 3) {
    op->empty = c.ia[1];
    op->bias = c.ia[2];
  }
  push_op(h.e, std::move(op), c);
}

}  // namespace ofc
