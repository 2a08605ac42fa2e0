// Reductions: "reduction" (f32 on oneDNN; shapes oneDNN has no kernel for fall back to the
// loop) and "reduce" (any dtype, a stride-generic loop).
//
// reduction contract: ins [src], outs [dst]; ia [alg: 0 sum, 1 mean, 2 max, 3 min].
//   src, dst: f32, one rank, no overlapping strides; each dst dim is src's or 1.
// reduce contract: ins [src], outs [dst]; ia [code: 0 sum 1 mean 2 max 3 min 4 any 5 all,
//   n, dims[n], in_strides[n], out_strides[n], count].
//   The walk (dims, in_strides) stays inside src and reaches no element twice (its work is
//   bounded by src's storage); (dims, out_strides) stays inside dst, which is row-major;
//   1 <= count <= the walk's elements.
#include <cmath>
#include <type_traits>

#include "engine.h"
#include "loops.h"

namespace ofc {

namespace {
void check_reduced_shape(const Tensor& ti, const Tensor& to, const std::string& kind) {
  need(ti.dims.size() == to.dims.size(), kind, "source and destination ranks differ");
  for (size_t k = 0; k < ti.dims.size(); ++k)
    need(to.dims[k] == ti.dims[k] || to.dims[k] == 1, kind, "destination dims must be the source's or 1");
}
}  // namespace

void contract_reduction(const Engine& e, const OpCall& c) {
  need_count(c, 1, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.size() == 1 && c.ia[0] >= 0 && c.ia[0] <= 3, c.kind, "attributes: ia [alg 0..3]");
  const Tensor& ti = e.tensors[(size_t)c.ins[0]];
  const Tensor& to = e.tensors[(size_t)c.outs[0]];
  need_dtype(ti, F32, c.kind, "the source");
  need_dtype(to, F32, c.kind, "the destination");
  need_dnnl_operand(e, c.ins[0], c.kind, "the source");
  need_dnnl_operand(e, c.outs[0], c.kind, "the destination");
  check_reduced_shape(ti, to, c.kind);
}

// reduce over axes (generic dtype); out strides 0 on reduced axes
struct ReduceOp : Op {
  int code = 0;
  dims_t dims, in_strides, out_strides;  // dims: the input's
  int64_t count = 1;                     // elements reduced into each output
  int64_t run_length = 0;  // > 0: output i reduces run_length elements from i * run_length
  std::vector<double> acc;               // one per output element, allocated at init
  // one accumulation step, the same for both walks (so both give the same bits)
  template <int Code>
  static void step(double& a, double v) {
    if (Code == 0 || Code == 1) a += v;
    else if (Code == 2) a = (v > a || std::isnan(v)) ? v : a;
    else if (Code == 3) a = (v < a || std::isnan(v)) ? v : a;
    else if (Code == 4) a = (a != 0 || v != 0) ? 1 : 0;
    else a = (a != 0 && v != 0) ? 1 : 0;
  }
  // output i reduces the run_length contiguous elements from i * run_length, in order: the generic
  // walk's order too, without its per-element index arithmetic and switches
  template <int Code, typename T>
  void rows_of(const T* src) {
    for (size_t i = 0; i < acc.size(); ++i) {
      const T* p = src + (int64_t)i * run_length;
      double a = acc[i];
      if constexpr (std::is_same<T, uint8_t>::value && (Code == 4 || Code == 5)) {
        // any / all of bytes: a branch-free pass the compiler vectorizes (same result)
        unsigned any = 0, all = 1;
        for (int64_t j = 0; j < run_length; ++j) { any |= p[j]; all &= p[j] != 0; }
        a = Code == 4 ? ((a != 0 || any != 0) ? 1 : 0) : ((a != 0 && all != 0) ? 1 : 0);
      } else {
        for (int64_t j = 0; j < run_length; ++j) step<Code>(a, (double)p[j]);
      }
      acc[i] = a;
    }
  }
  // whether the walk (dims, in_strides, out_strides) is a row-major input whose reduced
  // dims (output stride 0) all come after the kept ones, kept in output order: then the
  // walk is acc.size() runs of equal length end to end (size-1 dims play no part)
  void plan_rows() {
    run_length = 0;
    int64_t in_step = 1, out_step = 1, reduced = 1;
    bool kept_seen = false;
    for (int k = (int)dims.size() - 1; k >= 0; --k) {
      int64_t d = dims[(size_t)k];
      if (d == 1) continue;
      if (d <= 0 || in_strides[(size_t)k] != in_step) return;
      if (out_strides[(size_t)k] == 0) {
        if (kept_seen) return;  // a reduced dim before a kept one
        reduced = mul_c(reduced, d, "reduction");
      } else {
        if (out_strides[(size_t)k] != out_step) return;
        kept_seen = true;
        out_step = mul_c(out_step, d, "reduction");
      }
      in_step = mul_c(in_step, d, "reduction");
    }
    if ((size_t)out_step == acc.size()) run_length = reduced;
  }
  template <typename T>
  void rows_typed(const void* src) {
    const T* s = static_cast<const T*>(src);
    switch (code) {
      case 0: case 1: rows_of<0>(s); break;
      case 2: rows_of<2>(s); break;
      case 3: rows_of<3>(s); break;
      case 4: rows_of<4>(s); break;
      default: rows_of<5>(s); break;
    }
  }
  bool fast_rows(const void* src, int32_t dt) {
    if (run_length <= 0) return false;
    if (dt == F32) rows_typed<float>(src);
    else if (dt == BOOL || dt == U8) rows_typed<uint8_t>(src);
    else return false;
    return true;
  }
  void run(Engine& e) override {
    const Tensor& to = e.tensors[(size_t)outs[0]];
    double init = code == 2 ? -INFINITY : code == 3 ? INFINITY : code == 5 ? 1.0 : 0.0;
    std::fill(acc.begin(), acc.end(), init);
    const void* src = e.ptr(ins[0]);
    int32_t dt = e.tensors[(size_t)ins[0]].dtype;
    if (!fast_rows(src, dt)) for_each_index(dims, [&](const int64_t* idx) {
      double v = load_as<double>(src, dt, dot(idx, in_strides));
      double& a = acc[(size_t)dot(idx, out_strides)];
      switch (code) {
        case 0: case 1: a += v; break;
        case 2: a = (v > a || std::isnan(v)) ? v : a; break;
        case 3: a = (v < a || std::isnan(v)) ? v : a; break;
        case 4: a = (a != 0 || v != 0) ? 1 : 0; break;
        case 5: a = (a != 0 && v != 0) ? 1 : 0; break;
      }
    });
    void* dst = e.ptr(outs[0]);
    // the output is row-major contiguous (the contract)
    for (size_t i = 0; i < acc.size(); ++i) {
      double v = acc[i];
      if (code == 1) v /= (double)count;
      store_as<double>(dst, to.dtype, (int64_t)i, v);
    }
  }
};

namespace {
void push_reduce(Engine& e, std::unique_ptr<ReduceOp> op, const OpCall& c) {
  const Tensor& to = e.tensors[(size_t)c.outs[0]];
  e.reserve(mul_c(to.numel, 8, "reduce"), "a reduction's accumulators");
  op->acc.assign((size_t)to.numel, 0.0);
  op->plan_rows();
  op->name = "reduce";
  push_op(e, std::move(op), c);
}
}  // namespace

// max/min on oneDNN skip a NaN: when the source holds one (checked after each call), the
// generic loop (NaN-exact, as torch's amax/amin) recomputes the output
struct ReductionOp : DnnlOp {
  std::unique_ptr<ReduceOp> exact;
  void run(Engine& e) override {
    DnnlOp::run(e);
    if (exact && special_input(e, *this, false)) exact->run(e);
  }
};

namespace {
std::unique_ptr<ReduceOp> generic_reduce(Engine& e, int code, const OpCall& c) {
  const Tensor& ti = e.tensors[(size_t)c.ins[0]];
  const Tensor& to = e.tensors[(size_t)c.outs[0]];
  need(row_major(to) && dense(to), "reduction", "the output must be contiguous");
  auto op = std::make_unique<ReduceOp>();
  op->code = code;
  op->dims = ti.dims;
  op->in_strides = ti.strides;
  dims_t row(to.dims.size(), 0);
  int64_t step = 1, count = 1;
  for (int k = (int)to.dims.size() - 1; k >= 0; --k) {
    bool reduced = to.dims[(size_t)k] == 1 && ti.dims[(size_t)k] != 1;
    row[(size_t)k] = reduced ? 0 : step;
    if (reduced) count = mul_c(count, ti.dims[(size_t)k], "reduction");
    step = mul_c(step, to.dims[(size_t)k], "reduction");
  }
  op->out_strides = row;
  op->count = std::max<int64_t>(count, 1);

  e.reserve(mul_c(to.numel, 8, "reduce"), "a reduction's accumulators");
  op->acc.assign((size_t)to.numel, 0.0);
  op->plan_rows();
  op->ins = c.ins; op->outs = c.outs;
  op->name = "reduce";
  return op;
}
}  // namespace

void build_reduction(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  static const dnnl::algorithm algs[] = {dnnl::algorithm::reduction_sum, dnnl::algorithm::reduction_mean,
                                         dnnl::algorithm::reduction_max, dnnl::algorithm::reduction_min};
  auto op = std::make_unique<ReductionOp>();
  op->name = "reduction";
  memory::desc src = e.tensors[(size_t)c.ins[0]].md(), dst = e.tensors[(size_t)c.outs[0]].md();
  op->arg(DNNL_ARG_SRC, c.ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get());
  op->check_fits(e);
  dnnl::reduction::primitive_desc pd;
  try {
    pd = dnnl::reduction::primitive_desc(e.eng, algs[c.ia[0]], src, dst, 0.f, 0.f, attr);
  } catch (const dnnl::error&) {  // a shape oneDNN has no kernel for: the loop
    e.ops.push_back(generic_reduce(e, (int)c.ia[0], c));
    return;
  }
  op->prim = dnnl::reduction(pd);
  const Tensor& to = e.tensors[(size_t)c.outs[0]];
  if ((c.ia[0] == 2 || c.ia[0] == 3) && row_major(to) && dense(to))
    op->exact = generic_reduce(e, (int)c.ia[0], c);
  op->scans_input = op->exact != nullptr;
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  push_op(e, std::move(op), c);
}

void contract_reduce(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  need_count(c, 1, 1);
  need_post_ops_allowed(c, false);
  size_t p = 0;
  int64_t code = take(c.ia, p, 1)[0];
  need(code >= 0 && code <= 5, k, "code out of range");
  int64_t n = take(c.ia, p, 1)[0];
  need(n >= 0 && n <= kMaxRank, k, "rank out of range");
  dims_t dims = take(c.ia, p, (size_t)n), in_s = take(c.ia, p, (size_t)n), out_s = take(c.ia, p, (size_t)n);
  int64_t count = take(c.ia, p, 1)[0];
  need(p == c.ia.size(), k, "attribute count");
  const Tensor& ti = e.tensors[(size_t)c.ins[0]];
  const Tensor& to = e.tensors[(size_t)c.outs[0]];
  check_reach(dims, in_s, 0, ti.span, "reduce input");
  check_reach(dims, out_s, 0, to.span, "reduce output");
  need(injective(dims, in_s), k, "the input walk reaches an element twice (work not bounded by storage)");
  int64_t total = count_of(dims, "reduce");
  need(count >= 1 && count <= std::max<int64_t>(total, 1), k, "count out of range");
  need(row_major(to) && dense(to), k, "the output must be contiguous");
}

void build_reduce(Handle& h, const OpCall& c) {
  size_t p = 0;
  auto op = std::make_unique<ReduceOp>();
  op->code = (int)take(c.ia, p, 1)[0];
  int64_t n = take(c.ia, p, 1)[0];
  op->dims = take(c.ia, p, (size_t)n);
  op->in_strides = take(c.ia, p, (size_t)n);
  op->out_strides = take(c.ia, p, (size_t)n);
  op->count = take(c.ia, p, 1)[0];
  push_reduce(h.e, std::move(op), c);
}

}  // namespace ofc
