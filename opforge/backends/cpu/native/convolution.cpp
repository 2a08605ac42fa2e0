// Convolution and deconvolution (f32, oneDNN), weights reordered once at init.
//
// Contract: ins [src, weights, (bias)], outs [dst]; ia [nsp, strides[nsp], pad_l[nsp],
// pad_r[nsp], dilation[nsp] (torch's: 1 = none), has_bias]; 1 <= nsp <= 3.
//   src, dst: f32, rank nsp+2 (N, C, spatial...), no overlapping strides, N equal;
//   weights: an f32 constant of rank nsp+2, or nsp+3 (groups first);
//   bias (has_bias): an f32 constant, rank 1, one per output channel (dst dims[1]);
//   strides and dilations >= 1, left paddings >= 0, each |value| at most 2^20.
// oneDNN checks that the spatial sizes agree; every memory descriptor is checked against
// its tensor's storage before the primitive is made.
#include "engine.h"

namespace ofc {

namespace {
constexpr int64_t kMaxWindow = (int64_t)1 << 20;

struct ConvAttrs {
  int64_t nsp = 0;
  memory::dims strides, pad_l, pad_r, dilation;  // dilation in oneDNN's terms (0 = none)
  bool has_bias = false;
};

ConvAttrs conv_attrs(const std::string& kind, const std::vector<int64_t>& ia, size_t first) {
  ConvAttrs a;
  need(ia.size() > first, kind, "no attributes");
  a.nsp = ia[first];
  need(a.nsp >= 1 && a.nsp <= 3, kind, "spatial rank " + std::to_string(a.nsp) + ", valid: 1..3");
  size_t p = first + 1;
  a.strides = take(ia, p, (size_t)a.nsp);
  a.pad_l = take(ia, p, (size_t)a.nsp);
  a.pad_r = take(ia, p, (size_t)a.nsp);
  a.dilation = take(ia, p, (size_t)a.nsp);
  for (int64_t k = 0; k < a.nsp; ++k) {
    need(a.strides[k] >= 1 && a.strides[k] <= kMaxWindow, kind, "stride out of range");
    need(a.dilation[k] >= 1 && a.dilation[k] <= kMaxWindow, kind, "dilation out of range");
    // a right padding may be negative (the last inputs no window reaches)
    need(a.pad_l[k] >= 0 && a.pad_l[k] <= kMaxWindow && a.pad_r[k] >= -kMaxWindow && a.pad_r[k] <= kMaxWindow,
         kind, "padding out of range");
    a.dilation[k] -= 1;
  }
  return a;
}
}  // namespace

// shared with int8 convolution (quantization.cpp): [nsp, strides, pads, dilation] at `first`
void check_conv_attrs(const std::string& kind, const std::vector<int64_t>& ia, size_t first,
                      size_t total) {
  ConvAttrs a = conv_attrs(kind, ia, first);
  need(ia.size() == total + 4 * (size_t)a.nsp, kind, "attribute count");
}

void conv_window(const std::vector<int64_t>& ia, size_t first, memory::dims& strides,
                 memory::dims& dil, memory::dims& pl, memory::dims& pr) {
  ConvAttrs a = conv_attrs("conv", ia, first);
  strides = a.strides; dil = a.dilation; pl = a.pad_l; pr = a.pad_r;
}

void contract_conv(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  ConvAttrs a = conv_attrs(k, c.ia, 0);
  need(c.ia.size() == 2 + 4 * (size_t)a.nsp, k, "attribute count");
  a.has_bias = c.ia[1 + 4 * (size_t)a.nsp] != 0;
  need_count(c, a.has_bias ? 3 : 2, 1);
  size_t rank = (size_t)a.nsp + 2;
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  const Tensor& w = e.tensors[(size_t)c.ins[1]];
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  need_rank(src, rank, rank, k, "the source");
  need_rank(dst, rank, rank, k, "the destination");
  need_rank(w, rank, rank + 1, k, "the weights");
  for (int id : {c.ins[0], c.ins[1], c.outs[0]}) {
    need_dtype(e.tensors[(size_t)id], F32, k, "an operand");
    need_dnnl_operand(e, id, k, "an operand");
  }
  need(w.is_const, k, "the weights must be a constant");
  need(src.dims[0] == dst.dims[0], k, "source and destination batch sizes differ");
  // oneDNN's (de)convolutions may write the whole of get_size() of their destination (a
  // zero fill before accumulating); for a gapped layout that is more than the tensor
  // reaches (a [1,4,8,8] destination with strides [4,32,1,256] corrupted the heap inside
  // libdnnl). The lowering writes dense destinations only (channels-last).
  need(dense(dst), k, "the destination must be dense (no gaps between its elements)");
  if (a.has_bias) {
    const Tensor& b = e.tensors[(size_t)c.ins[2]];
    need(b.is_const, k, "the bias must be a constant (it is reordered at init)");
    need_dtype(b, F32, k, "the bias");
    need(b.dims.size() == 1 && b.dims[0] == dst.dims[1] && dense(b), k,
         "the bias must be dense, rank 1, one value per output channel");
  }
}

namespace {
// the op, its post-ops cut at the first NaN-unsafe one (nan_exact) or all in oneDNN; with
// `weights_of`, its weights and bias are that op's (null when their layout differs)
// (`shell`: the op to fill, a Winograd one, else a new DnnlOp)
std::unique_ptr<DnnlOp> conv_op(Engine& e, const OpCall& c, bool nan_exact, const DnnlOp* weights_of,
                                std::unique_ptr<DnnlOp> shell = nullptr) {
  bool transposed = c.kind == "deconv";
  ConvAttrs a = conv_attrs(c.kind, c.ia, 0);
  bool has_bias = c.ins.size() == 3;
  auto op = shell ? std::move(shell) : std::make_unique<DnnlOp>();
  op->name = transposed ? "deconvolution" : "convolution";
  const Tensor& w = e.tensors[(size_t)c.ins[1]];
  memory::desc src = e.tensors[(size_t)c.ins[0]].md(), dst = e.tensors[(size_t)c.outs[0]].md();
  memory::desc wany(w.dims, memory::data_type::f32, tag::any);
  memory::desc bias = has_bias ? memory::desc(e.tensors[(size_t)c.ins[2]].dims, memory::data_type::f32, tag::x)
                               : memory::desc();
  op->arg(DNNL_ARG_SRC, c.ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get(), nan_exact);
  op->check_fits(e);
  memory::desc wmd, scratch;
  if (!transposed) {
    auto pd = dnnl::convolution_forward::primitive_desc(
        e.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wany,
        bias, dst, a.strides, a.dilation, a.pad_l, a.pad_r, attr);
    op->prim = dnnl::convolution_forward(pd);
    wmd = pd.weights_desc(); scratch = pd.scratchpad_desc();
  } else {
    auto pd = dnnl::deconvolution_forward::primitive_desc(
        e.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, src, wany,
        bias, dst, a.strides, a.dilation, a.pad_l, a.pad_r, attr);
    op->prim = dnnl::deconvolution_forward(pd);
    wmd = pd.weights_desc(); scratch = pd.scratchpad_desc();
  }
  if (weights_of != nullptr) {
    for (const auto& f : weights_of->fixed_args) {
      if (f.first == DNNL_ARG_WEIGHTS && f.second.get_desc() != wmd) return nullptr;
      if (f.first == DNNL_ARG_WEIGHTS || f.first == DNNL_ARG_BIAS) op->fixed_args.push_back(f);
    }
  } else {
    op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, c.ins[1], wmd));
    if (has_bias) op->fixed_args.emplace_back(DNNL_ARG_BIAS, reorder_const(e, c.ins[2], bias));
  }
  add_scratchpad(e, op.get(), scratch);
  op->bind(e);
  return op;
}
}  // namespace

void build_conv(Handle& h, const OpCall& c) {
  if (build_depthwise(h, c)) return;  // a float depthwise 3×3 (depthwise.cpp)
  Engine& e = h.e;
  // a 3×3 stride-1 one may run as Winograd (winograd.cpp), on this op's direct convolution
  // when a call's input is not proved finite
  auto shell = winograd_shell(e, c);
  const bool winograd = shell != nullptr;
  if (!winograd && build_small_conv(h, c)) return;  // a small one, direct (smallconv.cpp)
  auto op = conv_op(e, c, true, nullptr, std::move(shell));
  if (winograd) op->name += " (Winograd F(4x4 3x3))";
  if (c.kind == "conv") {  // an output channel reads every weight but its own channel's dims
    const size_t rank = e.tensors[(size_t)c.ins[1]].dims.size();
    const size_t nsp = (size_t)conv_attrs(c.kind, c.ia, 0).nsp;
    std::vector<bool> reduced(rank, false);
    for (size_t k = rank - nsp - 1; k < rank; ++k) reduced[k] = true;
    attach_guard(e, *op, c, c.ins[1], c.ins.size() == 3 ? c.ins[2] : -1, reduced,
                 [&](const DnnlOp& main) { return conv_op(e, c, false, &main); });
  }
  push_op(e, std::move(op), c);
}

}  // namespace ofc
