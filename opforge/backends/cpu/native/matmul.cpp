// Matmul (f32, oneDNN): a [.., M, K] x b [.., K, N] (+ bias broadcast); a constant b or
// bias is reordered once at init, a computed one is read per call.
//
// Contract: ins [a, b, (bias)], outs [dst]; no attributes.
//   a, b, dst (and bias): f32, one rank in 2..8, no overlapping strides;
//   a [.., M, K], b [.., K, N], dst [.., M, N]: each batch dim of a and of b is dst's or 1
//   (broadcast: grouped-query attention reads one KV head for a group of query heads, a
//   linear on a batch reads its weights once), and dst's is 1 or one of theirs;
//   bias: broadcasts to dst (each dim equal or 1).
// The shapes are checked here, before oneDNN sees them; every memory descriptor is checked
// against its tensor's storage before the primitive is made.
#include "engine.h"

namespace ofc {

void contract_matmul(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  need(c.ins.size() == 2 || c.ins.size() == 3, k, "2 or 3 inputs (a, b, bias)");
  need_count(c, c.ins.size(), 1);
  need(c.ia.empty() && c.fa.empty(), k, "takes no attributes");
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  need_rank(dst, 2, kMaxRank, k, "the destination");
  std::vector<int> all = c.ins;
  all.push_back(c.outs[0]);
  for (int id : all) {
    need_dtype(e.tensors[(size_t)id], F32, k, "an operand");
    need_dnnl_operand(e, id, k, "an operand");
    need(e.tensors[(size_t)id].dims.size() == dst.dims.size(), k, "operands of different ranks");
  }
  const dims_t& a = e.tensors[(size_t)c.ins[0]].dims;
  const dims_t& w = e.tensors[(size_t)c.ins[1]].dims;
  const size_t r = dst.dims.size();
  need(a[r - 2] == dst.dims[r - 2] && w[r - 1] == dst.dims[r - 1] && a[r - 1] == w[r - 2], k,
       "operand shapes that do not multiply: a [.., M, K] x b [.., K, N] -> dst [.., M, N]");
  for (size_t d = 0; d + 2 < r; ++d) {
    const int64_t n = dst.dims[d];
    need((a[d] == n || a[d] == 1) && (w[d] == n || w[d] == 1) && (n == 1 || a[d] == n || w[d] == n),
         k, "batch dim " + std::to_string(d) + " of sizes " + std::to_string(a[d]) + " x " +
         std::to_string(w[d]) + " -> " + std::to_string(n) + ": each operand's is dst's or 1");
  }
  if (c.ins.size() == 3) {
    const Tensor& b = e.tensors[(size_t)c.ins[2]];
    for (size_t d = 0; d < b.dims.size(); ++d)
      need(b.dims[d] == 1 || b.dims[d] == dst.dims[d], k, "a bias that does not broadcast to the output");
  }
}

namespace {
// the op, its post-ops cut at the first NaN-unsafe one (nan_exact) or all in oneDNN; with
// `weights_of`, its constant weights and bias are that op's (null when their layout differs)
std::unique_ptr<DnnlOp> matmul_op(Engine& e, const OpCall& c, bool nan_exact, const DnnlOp* weights_of) {
  auto op = std::make_unique<DnnlOp>();
  op->name = "matmul";
  const auto& ins = c.ins;
  const Tensor& b = e.tensors[(size_t)ins[1]];
  bool b_const = e.tensors[(size_t)e.root(ins[1])].is_const;
  bool has_bias = ins.size() == 3;
  bool bias_const = has_bias && e.tensors[(size_t)e.root(ins[2])].is_const;
  memory::desc src = e.tensors[(size_t)ins[0]].md(), dst = e.tensors[(size_t)c.outs[0]].md();
  memory::desc wmd = b_const ? memory::desc(b.dims, memory::data_type::f32, tag::any) : b.md();
  memory::desc bias = has_bias ? e.tensors[(size_t)ins[2]].md() : memory::desc();
  op->arg(DNNL_ARG_SRC, ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  if (!b_const) op->arg(DNNL_ARG_WEIGHTS, ins[1], wmd);
  if (has_bias && !bias_const) op->arg(DNNL_ARG_BIAS, ins[2], bias);
  auto attr = make_attr(e, c.post, op.get(), nan_exact);
  op->check_fits(e);
  auto pd = dnnl::matmul::primitive_desc(e.eng, src, wmd, bias, dst, attr);
  op->prim = dnnl::matmul(pd);
  if (weights_of != nullptr) {
    for (const auto& f : weights_of->fixed_args) {
      if (f.first == DNNL_ARG_WEIGHTS && f.second.get_desc() != pd.weights_desc()) return nullptr;
      if (f.first == DNNL_ARG_WEIGHTS || f.first == DNNL_ARG_BIAS) op->fixed_args.push_back(f);
    }
  } else {
    if (b_const) op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, ins[1], pd.weights_desc()));
    if (bias_const) op->fixed_args.emplace_back(DNNL_ARG_BIAS, reorder_const(e, ins[2], bias));
  }
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  return op;
}
}  // namespace

void build_matmul(Handle& h, const OpCall& c) {
  if (build_small_matmul(h, c)) return;  // a few rows against constant weights: own kernel
  Engine& e = h.e;
  auto op = matmul_op(e, c, true, nullptr);
  // an output [.., m, n] reads column n of b [.., K, N]: every dim but K is its own
  std::vector<bool> reduced(e.tensors[(size_t)c.ins[1]].dims.size(), false);
  reduced[reduced.size() - 2] = true;
  attach_guard(e, *op, c, c.ins[1], c.ins.size() == 3 ? c.ins[2] : -1, reduced,
               [&](const DnnlOp& main) { return matmul_op(e, c, false, &main); });
  push_op(e, std::move(op), c);
}

}  // namespace ofc
