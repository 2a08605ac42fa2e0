// NaN semantics: where oneDNN's kernels lose a NaN that PyTorch keeps, the engine computes
// the result itself. Measured against torch eager on NaN and ±inf inputs
// (tests/backends/test_cpu_nan.py): oneDNN's relu (alpha 0), clip, hardsigmoid map NaN to
// a number, its exp maps NaN to inf, binary max/min return the other operand, max pooling
// and max/min reductions skip a NaN. Every other eltwise algorithm the lowering uses
// propagates NaN as torch does.
//
// Post-ops: a chain runs in oneDNN up to its first unsafe post-op (make_attr); from there
// the Epilogue runs each post-op in place on the output: unsafe ones as the loops below,
// the others as in-place oneDNN primitives. Standalone eltwise/binary ops with an unsafe
// algorithm are loops (eltwise.cpp); max pooling and max/min reductions check their input
// for a NaN after the primitive and recompute only then (pooling.cpp, reduction.cpp).
#include <cmath>

#include "engine.h"
#include "loops.h"

namespace ofc {

namespace {
constexpr int kRelu = 0, kExp = 9, kClip = 13, kHardsigmoid = 19, kMax = 104, kMin = 105;

dims_t walk_dims(const Tensor& t) { return t.dims.empty() ? dims_t{1} : t.dims; }
dims_t walk_strides(const Tensor& t) { return t.dims.empty() ? dims_t{1} : t.strides; }
}  // namespace

bool nan_unsafe_eltwise(int code, float alpha) {
  return (code == kRelu && alpha == 0.f) || code == kClip || code == kHardsigmoid || code == kExp;
}

bool nan_unsafe(const PostOp& p) {
  return p.binary ? (p.code == kMax || p.code == kMin) : nan_unsafe_eltwise(p.code, p.alpha);
}

float eltwise_exact(int code, float alpha, float beta, float x) {
  switch (code) {
    case kRelu: return x < 0.f ? 0.f : x;  // alpha 0 only; NaN < 0 is false: NaN stays
    case kClip: return x != x ? x : (x < alpha ? alpha : (x > beta ? beta : x));
    case kHardsigmoid: {
      float v = alpha * x + beta;
      return v != v ? v : (v < 0.f ? 0.f : (v > 1.f ? 1.f : v));
    }
    case kExp: return std::exp(x);
  }
  fail("no NaN-exact loop for eltwise code " + std::to_string(code));
}

// n dense elements, in → out (in place when equal): the switch taken once, outside loops
// the compiler vectorizes. Calling eltwise_exact per element kept every clip a call and a
// branch: 2-3 ns an element, 30 µs of a 38 µs depthwise-separable block whose ReLU6s run
// here, and most of MobileNetV2's time on this backend.
void eltwise_exact_flat(int code, float alpha, float beta, const float* in, float* out, int64_t n) {
  switch (code) {
    case kRelu:  // NaN < 0 is false: NaN stays
      for (int64_t j = 0; j < n; ++j) out[j] = in[j] < 0.f ? 0.f : in[j];
      return;
    case kClip:  // both comparisons are false for NaN: NaN stays
      for (int64_t j = 0; j < n; ++j) {
        float x = in[j];
        out[j] = x < alpha ? alpha : (x > beta ? beta : x);
      }
      return;
    case kHardsigmoid:
      for (int64_t j = 0; j < n; ++j) {
        float v = alpha * in[j] + beta;
        out[j] = v < 0.f ? 0.f : (v > 1.f ? 1.f : v);
      }
      return;
    default:
      for (int64_t j = 0; j < n; ++j) out[j] = eltwise_exact(code, alpha, beta, in[j]);
  }
}

float binary_exact(int code, float a, float b) {
  if (a != a || b != b) return a + b;  // NaN
  return code == kMax ? (a > b ? a : b) : (a < b ? a : b);
}

bool has_nan(Engine& e, int id) { return has_special(e, id, false); }

namespace {
// a flat run of n floats, as their bits: a magnitude above the infinity pattern is a NaN,
// at it an infinity. A count of those is a loop the compiler vectorizes with SSE2 (about
// 0.1 ns an element here); a max of the magnitudes is not (no unsigned max before SSE4.1)
bool special_run(const float* p, int64_t n, bool nonfinite) {
  const int32_t* bits = reinterpret_cast<const int32_t*>(p);
  const int32_t limit = nonfinite ? 0x7f7fffff : 0x7f800000;
  for (int64_t i = 0; i < n; i += 4096) {
    int64_t m = n - i < 4096 ? n - i : 4096;
    int32_t count = 0;
    for (int64_t j = 0; j < m; ++j) count += (bits[i + j] & 0x7fffffff) > limit;
    if (count) return true;
  }
  return false;
}
}  // namespace

bool has_special(Engine& e, int id, bool nonfinite) {
  const Tensor& t = e.tensors[(size_t)id];
  if (t.dtype != F32) return false;
  const float* p = static_cast<const float*>(e.ptr(id));
  if (t.span == t.numel) return special_run(p, t.span, nonfinite);  // dense: any order
  dims_t dims = walk_dims(t), strides = walk_strides(t);
  int r = (int)dims.size();
  dims_t outer(strides.begin(), strides.end() - 1);
  int64_t inner = strides[(size_t)r - 1];
  bool found = false;
  for_each_row(dims, [&](const int64_t* idx, int64_t n) {
    const float* row = p + dot(idx, outer);
    int nan = 0;
    if (nonfinite)  // x - x is NaN exactly for NaN and ±inf
      for (int64_t j = 0; j < n; ++j) nan |= (row[j * inner] - row[j * inner]) != 0.f || row[j * inner] != row[j * inner];
    else
      for (int64_t j = 0; j < n; ++j) nan |= row[j * inner] != row[j * inner];
    found = found || nan;
  });
  return found;
}

int register_post_ops(const std::vector<PostOp>& post, std::vector<RegisterPostOp>& out) {
  size_t first_rest = 0;
  for (; first_rest < post.size(); ++first_rest) {
    const PostOp& p = post[first_rest];
    if (p.binary) break;
    if (p.alg == dnnl::algorithm::eltwise_linear) out.push_back({0, p.alpha, p.beta});
    else if ((p.alg == dnnl::algorithm::eltwise_clip || p.alg == dnnl::algorithm::eltwise_clip_v2) &&
             p.alpha <= p.beta)
      out.push_back({1, p.alpha, p.beta});
    else if (p.alg == dnnl::algorithm::eltwise_relu && p.alpha == 0) out.push_back({1, 0, INFINITY});
    else break;
  }
  for (size_t k = first_rest; k < post.size(); ++k)
    if (post[k].binary) return -1;
  return (int)first_rest;
}

ClampStep ClampStep::of(const RegisterPostOp& p) {
  return p.kind == 0 ? ClampStep{p.a, p.b, -INFINITY, INFINITY} : ClampStep{1.f, 0.f, p.a, p.b};
}

int KernelTail::prepare(Engine& e, Op& op, const OpCall& c, const std::vector<RegisterPostOp>& post,
                        int first_rest, int64_t rows) {
  nsteps = std::min(first_rest, kMaxSteps);
  for (int q = 0; q < nsteps; ++q) steps[q] = ClampStep::of(post[(size_t)q]);
  e.reserve(mul_c(rows, 4, "row peaks"), "an own kernel's row peaks");
  peaks.assign((size_t)rows, 0.f);
  op.bounded = true;
  rest.pending.assign(c.post.begin() + nsteps, c.post.end());
  rest.prepare(e, c.outs[0]);
  return nsteps;
}

void KernelTail::finish(Engine& e, Op& op) {
  double top = rest.steps.empty() && track ? 0 : INFINITY;
  for (size_t i = 0; i < peaks.size() && top < INFINITY; ++i)
    top = peaks[i] == peaks[i] ? std::max(top, (double)peaks[i]) : INFINITY;
  op.out_bound = top;
  if (!rest.steps.empty()) rest.run(e, op.outs[0]);
}

double KernelTail::input_bound() const {
  return in_from != nullptr && in_from->bounded && in_from->out_bound <= 1e30 ? in_from->out_bound : INFINITY;
}

double KernelTail::through_steps(double pre) const {
  if (!rest.steps.empty() || !(pre <= 1e30)) return INFINITY;
  double lo = -pre, hi = pre;  // the values' interval, widened for each step's rounding
  for (int q = 0; q < nsteps; ++q) {
    const ClampStep& s = steps[q];
    double a = (double)s.a * lo + s.b, b = (double)s.a * hi + s.b;
    if (a > b) std::swap(a, b);
    const double slack = 1e-6 * std::max(std::fabs(a), std::fabs(b));  // the multiply-add's rounding
    lo = std::min((double)s.hi, std::max((double)s.lo, a - slack));
    hi = std::min((double)s.hi, std::max((double)s.lo, b + slack));
    if (!(std::fabs(lo) <= 1e30 && std::fabs(hi) <= 1e30)) return INFINITY;
  }
  return std::max(std::fabs(lo), std::fabs(hi));
}

void KernelTail::finish_proven(Engine& e, Op& op, double bound) {
  op.out_bound = rest.steps.empty() ? bound : INFINITY;
  if (!rest.steps.empty()) rest.run(e, op.outs[0]);
}

void Epilogue::prepare(Engine& e, int dst) {
  const Tensor& d = e.tensors[(size_t)dst];
  memory::desc dmd = d.md();
  for (const PostOp& p : pending) {
    Step s;
    s.p = p;
    s.own = nan_unsafe(p);
    if (s.own && p.binary) {
      const Tensor& b = e.tensors[(size_t)p.tensor];
      dims_t bd = walk_dims(b), bs = walk_strides(b);
      s.b_strides.assign(bd.size(), 0);
      for (size_t k = 0; k < bd.size(); ++k) s.b_strides[k] = bd[k] == 1 ? 0 : bs[k];
    } else if (!s.own && !p.binary) {
      auto pd = dnnl::eltwise_forward::primitive_desc(e.eng, dnnl::prop_kind::forward_inference, p.alg,
                                                      dmd, dmd, p.alpha, p.beta);
      s.prim = dnnl::eltwise_forward(pd);
      s.dst_mem = memory(dmd, e.eng, DNNL_MEMORY_NONE);
    } else if (!s.own) {
      memory::desc bmd = e.tensors[(size_t)p.tensor].md();
      auto pd = dnnl::binary::primitive_desc(e.eng, p.alg, dmd, bmd, dmd);
      s.prim = dnnl::binary(pd);
      s.dst_mem = memory(dmd, e.eng, DNNL_MEMORY_NONE);
      s.src1_mem = memory(bmd, e.eng, DNNL_MEMORY_NONE);
    }
    steps.push_back(std::move(s));
  }
  pending.clear();
}

void Epilogue::run(Engine& e, int dst) {
  const Tensor& d = e.tensors[(size_t)dst];
  float* out = static_cast<float*>(e.ptr(dst));
  dims_t dims = walk_dims(d), strides = walk_strides(d);
  int r = (int)dims.size();
  dims_t outer(strides.begin(), strides.end() - 1);
  int64_t inner = strides[(size_t)r - 1];
  for (Step& s : steps) {
    if (!s.own) {
      s.dst_mem.set_data_handle(out);
      if (s.p.binary) {
        s.src1_mem.set_data_handle(e.ptr(s.p.tensor));
        s.prim.execute(e.strm, {{DNNL_ARG_SRC_0, s.dst_mem}, {DNNL_ARG_SRC_1, s.src1_mem}, {DNNL_ARG_DST, s.dst_mem}});
      } else {
        s.prim.execute(e.strm, {{DNNL_ARG_SRC, s.dst_mem}, {DNNL_ARG_DST, s.dst_mem}});
      }
      e.strm.wait();
      continue;
    }
    if (s.p.binary) {
      const float* b = static_cast<const float*>(e.ptr(s.p.tensor));
      dims_t b_outer(s.b_strides.begin(), s.b_strides.end() - 1);
      int64_t b_inner = s.b_strides[(size_t)r - 1];
      for_each_row(dims, [&](const int64_t* idx, int64_t n) {
        float* row = out + dot(idx, outer);
        const float* brow = b + dot(idx, b_outer);
        for (int64_t j = 0; j < n; ++j) row[j * inner] = binary_exact(s.p.code, row[j * inner], brow[j * b_inner]);
      });
    } else if (d.span == d.numel) {  // the common case: one flat pass
      eltwise_exact_flat(s.p.code, s.p.alpha, s.p.beta, out, out, d.span);
    } else if (s.p.code == kRelu) {
      for_each_row(dims, [&](const int64_t* idx, int64_t n) {
        float* row = out + dot(idx, outer);
        if (inner == 1)
          for (int64_t j = 0; j < n; ++j) row[j] = row[j] < 0.f ? 0.f : row[j];
        else
          for (int64_t j = 0; j < n; ++j) row[j * inner] = row[j * inner] < 0.f ? 0.f : row[j * inner];
      });
    } else {
      for_each_row(dims, [&](const int64_t* idx, int64_t n) {
        float* row = out + dot(idx, outer);
        for (int64_t j = 0; j < n; ++j) row[j * inner] = eltwise_exact(s.p.code, s.p.alpha, s.p.beta, row[j * inner]);
      });
    }
  }
}

}  // namespace ofc
