// Eltwise (one operand) and binary (two operands, the second broadcasting), f32 on oneDNN.
//
// eltwise contract: ins [src], outs [dst]; ia [alg 0..19 (core.cpp's table)]; fa [alpha, beta].
//   src, dst: f32, one shape, no overlapping strides.
// binary contract: ins [a, b], outs [dst]; ia [alg 100..105].
//   a, b, dst: f32, one rank, no overlapping strides; dst has a's dims; each of b's dims is
//   a's or 1.
#include "engine.h"

namespace ofc {

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

void build_binary(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  auto op = std::make_unique<DnnlOp>();
  op->name = "binary";
  memory::desc a = e.tensors[(size_t)c.ins[0]].md(), b = e.tensors[(size_t)c.ins[1]].md(),
               dst = e.tensors[(size_t)c.outs[0]].md();
  op->arg(DNNL_ARG_SRC_0, c.ins[0], a);
  op->arg(DNNL_ARG_SRC_1, c.ins[1], b);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get());
  op->check_fits(e);
  auto pd = dnnl::binary::primitive_desc(e.eng, alg_of((int)c.ia[0]), a, b, dst, attr);
  op->prim = dnnl::binary(pd);
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  push_op(e, std::move(op), c);
}

}  // namespace ofc
