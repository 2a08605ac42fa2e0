// Eltwise (one operand) and binary (two operands, the second broadcasting), f32 on oneDNN.
//
// eltwise contract: ins [src], outs [dst]; ia [alg 0..19 (core.cpp's table)]; fa [alpha, beta].
//   src, dst: f32, one shape, no overlapping strides.
// binary contract: ins [a, b], outs [dst]; ia [alg 100..105].
//   a, b, dst: f32, one rank, no overlapping strides; dst has a's dims; each of b's dims is
//   a's or 1.
#include "engine.h"
#include "loops.h"

namespace ofc {

// NaN-exact standalone ops (nan.cpp): out = f(a) or f(a, b broadcast), then the post-ops.
// Their operands are listed in tensor_args (never bound) so finalize sees them read.
struct ExactOp : DnnlOp {
  int code = 0;
  float alpha = 0, beta = 0;
  bool binary = false;
  void run(Engine& e) override {
    const Tensor& d = e.tensors[(size_t)outs[0]];
    dims_t dims = dnnl_dims(d), os = d.dims.empty() ? dims_t{1} : d.strides;
    auto strides_of = [&](int id) {
      const Tensor& t = e.tensors[(size_t)id];
      dims_t td = dnnl_dims(t), ts = t.dims.empty() ? dims_t{1} : t.strides;
      for (size_t k = 0; k < td.size(); ++k) if (td[k] == 1) ts[k] = 0;  // broadcast
      return ts;
    };
    dims_t as = strides_of(ins[0]), bs = binary ? strides_of(ins[1]) : as;
    const float* a = static_cast<const float*>(e.ptr(ins[0]));
    const float* b = binary ? static_cast<const float*>(e.ptr(ins[1])) : a;
    float* o = static_cast<float*>(e.ptr(outs[0]));
    const Tensor& ta = e.tensors[(size_t)ins[0]];
    if (!binary && ta.strides == d.strides && ta.span == ta.numel && d.span == d.numel && ta.dims == d.dims) {
      // one dense layout on both sides: one flat pass, in any order
      eltwise_exact_flat(code, alpha, beta, a, o, d.span);
      if (!epilogue.steps.empty()) epilogue.run(e, outs[0]);
      return;
    }
    size_t r = dims.size();
    dims_t ao(as.begin(), as.end() - 1), bo(bs.begin(), bs.end() - 1), oo(os.begin(), os.end() - 1);
    int64_t ai = as[r - 1], bi = bs[r - 1], oi = os[r - 1];
    bool relu = !binary && code == 0;
    for_each_row(dims, [&](const int64_t* idx, int64_t n) {  // rows: the inner loop vectorizes
      const float* x = a + dot(idx, ao);
      const float* y = b + dot(idx, bo);
      float* z = o + dot(idx, oo);
      if (relu && ai == 1 && oi == 1)
        for (int64_t j = 0; j < n; ++j) z[j] = x[j] < 0.f ? 0.f : x[j];
      else if (binary)
        for (int64_t j = 0; j < n; ++j) z[j * oi] = binary_exact(code, x[j * ai], y[j * bi]);
      else
        for (int64_t j = 0; j < n; ++j) z[j * oi] = eltwise_exact(code, alpha, beta, x[j * ai]);
    });
    if (!epilogue.steps.empty()) epilogue.run(e, outs[0]);
  }
};

namespace {
std::unique_ptr<ExactOp> exact_op(Engine& e, const OpCall& c, int code, float alpha, float beta) {
  auto op = std::make_unique<ExactOp>();
  op->code = code; op->alpha = alpha; op->beta = beta; op->binary = c.ins.size() == 2;
  for (int id : c.ins) op->arg(DNNL_ARG_SRC, id, e.tensors[(size_t)id].md());
  op->epilogue.pending = c.post;
  return op;
}
}  // namespace

namespace {
void same_f32_operands(const Engine& e, const OpCall& c) {
  for (int id : c.ins) {
    need_dtype(e.tensors[(size_t)id], F32, c.kind, "an operand");
    need_dnnl_operand(e, id, c.kind, "an operand");
  }
  need_dtype(e.tensors[(size_t)c.outs[0]], F32, c.kind, "the output");
  need_dnnl_operand(e, c.outs[0], c.kind, "the output");
}
}  // namespace

void contract_eltwise(const Engine& e, const OpCall& c) {
  need_count(c, 1, 1);
  need(c.ia.size() == 1 && c.fa.size() == 2, c.kind, "attributes: ia [alg], fa [alpha, beta]");
  need(is_eltwise_code((int)c.ia[0]) && c.ia[0] == (int)c.ia[0], c.kind, "algorithm code out of range");
  same_f32_operands(e, c);
  need(e.tensors[(size_t)c.ins[0]].dims == e.tensors[(size_t)c.outs[0]].dims, c.kind,
       "source and destination shapes differ");
}

void build_eltwise(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  if (nan_unsafe_eltwise((int)c.ia[0], (float)c.fa[0])) {
    auto op = exact_op(e, c, (int)c.ia[0], (float)c.fa[0], (float)c.fa[1]);
    op->name = "eltwise";
    push_op(e, std::move(op), c);
    return;
  }
  auto op = std::make_unique<DnnlOp>();
  op->name = "eltwise";
  memory::desc src = e.tensors[(size_t)c.ins[0]].md(), dst = e.tensors[(size_t)c.outs[0]].md();
  op->arg(DNNL_ARG_SRC, c.ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get());
  op->check_fits(e);
  auto pd = dnnl::eltwise_forward::primitive_desc(e.eng, dnnl::prop_kind::forward_inference,
                                                  alg_of((int)c.ia[0]), src, dst, (float)c.fa[0],
                                                  (float)c.fa[1], attr);
  op->prim = dnnl::eltwise_forward(pd);
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  push_op(e, std::move(op), c);
}

void contract_binary(const Engine& e, const OpCall& c) {
  need_count(c, 2, 1);
  need(c.ia.size() == 1, c.kind, "attributes: ia [alg]");
  need(is_binary_code((int)c.ia[0]) && c.ia[0] == (int)c.ia[0], c.kind, "algorithm code out of range");
  same_f32_operands(e, c);
  // as oneDNN sees them: a 0-d tensor is one element of rank 1
  dims_t a = dnnl_dims(e.tensors[(size_t)c.ins[0]]), b = dnnl_dims(e.tensors[(size_t)c.ins[1]]),
         o = dnnl_dims(e.tensors[(size_t)c.outs[0]]);
  need(a == o, c.kind, "the first operand and the output differ in shape");
  need(b.size() == a.size(), c.kind, "operands of different ranks");
  for (size_t k = 0; k < b.size(); ++k)
    need(b[k] == a[k] || b[k] == 1, c.kind, "the second operand does not broadcast");
}

namespace {
// the op, its post-ops cut at the first NaN-unsafe one (nan_exact) or all in oneDNN
std::unique_ptr<DnnlOp> binary_op(Engine& e, const OpCall& c, bool nan_exact) {
  auto op = std::make_unique<DnnlOp>();
  op->name = "binary";
  memory::desc a = e.tensors[(size_t)c.ins[0]].md(), b = e.tensors[(size_t)c.ins[1]].md(),
               dst = e.tensors[(size_t)c.outs[0]].md();
  op->arg(DNNL_ARG_SRC_0, c.ins[0], a);
  op->arg(DNNL_ARG_SRC_1, c.ins[1], b);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get(), nan_exact);
  op->check_fits(e);
  auto pd = dnnl::binary::primitive_desc(e.eng, alg_of((int)c.ia[0]), a, b, dst, attr);
  op->prim = dnnl::binary(pd);
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  return op;
}
}  // namespace

void build_binary(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  PostOp self;
  self.binary = true;
  self.code = (int)c.ia[0];
  if (nan_unsafe(self)) {
    auto op = exact_op(e, c, self.code, 0.f, 0.f);
    op->name = "binary";
    push_op(e, std::move(op), c);
    return;
  }
  auto op = binary_op(e, c, true);
  attach_guard(e, *op, c, -1, -1, {}, [&](const DnnlOp&) { return binary_op(e, c, false); });
  push_op(e, std::move(op), c);
}

}  // namespace ofc
