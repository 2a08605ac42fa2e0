// Pooling (f32, oneDNN): max, average including padding, average excluding padding; max
// pooling of u8 too (a quantized activation, pooled as it is).
//
// Contract: ins [src], outs [dst]; ia [kind (0 max, 1 avg incl. pad, 2 avg excl. pad), nsp,
// kernel[nsp], strides[nsp], pad_l[nsp], pad_r[nsp], dilation[nsp] (1 = none)], 1 <= nsp <= 3.
//   src, dst: f32 (or both u8, for max), rank nsp+2 (N, C, spatial...), no overlapping
//   strides, N and C equal;
//   kernel, strides, dilation >= 1, left paddings >= 0, each |value| at most 2^20.
// oneDNN checks that the spatial sizes agree.
#include <cmath>

#include "engine.h"
#include "loops.h"

namespace ofc {

namespace {
constexpr int64_t kMaxWindow = (int64_t)1 << 20;
}

// max pooling that keeps NaN as torch does: oneDNN's kernel skips a NaN, so when the
// source holds one (checked after each call), the output is recomputed here
struct MaxPoolOp : DnnlOp {
  dims_t kernel, stride, pad_l, dilation;  // dilation as torch's (1 = none)
  void run(Engine& e) override {
    DnnlOp::run(e);
    if (!kernel.empty() && special_input(e, *this, false)) exact(e);
  }
  void exact(Engine& e) {
    const Tensor& ts = e.tensors[(size_t)ins[0]];
    const Tensor& td = e.tensors[(size_t)outs[0]];
    const float* src = static_cast<const float*>(e.ptr(ins[0]));
    float* dst = static_cast<float*>(e.ptr(outs[0]));
    size_t nsp = kernel.size();
    int64_t window = 1;
    for (auto k : kernel) window *= k;
    for_each_index(td.dims, [&](const int64_t* idx) {
      float m = -INFINITY;
      for (int64_t w = 0; w < window; ++w) {
        int64_t rest = w, off = idx[0] * ts.strides[0] + idx[1] * ts.strides[1];
        bool inside = true;
        for (size_t d = nsp; d-- > 0;) {
          int64_t k = rest % kernel[d];
          rest /= kernel[d];
          int64_t i = idx[2 + d] * stride[d] - pad_l[d] + k * dilation[d];
          if (i < 0 || i >= ts.dims[2 + d]) { inside = false; break; }
          off += i * ts.strides[2 + d];
        }
        if (!inside) continue;
        float v = src[off];
        if (v != v) { m = v; break; }
        if (v > m) m = v;
      }
      dst[dot(idx, td.strides)] = m;
    });
  }
};

void contract_pool(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  need_count(c, 1, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.size() >= 2, k, "attributes too short");
  need(c.ia[0] >= 0 && c.ia[0] <= 2, k, "pooling kind " + std::to_string(c.ia[0]) + ", valid: 0..2");
  int64_t nsp = c.ia[1];
  need(nsp >= 1 && nsp <= 3, k, "spatial rank " + std::to_string(nsp) + ", valid: 1..3");
  need(c.ia.size() == 2 + 5 * (size_t)nsp, k, "attribute count");
  for (int64_t j = 0; j < nsp; ++j) {
    need(c.ia[(size_t)(2 + j)] >= 1 && c.ia[(size_t)(2 + j)] <= kMaxWindow, k, "kernel size out of range");
    need(c.ia[(size_t)(2 + nsp + j)] >= 1 && c.ia[(size_t)(2 + nsp + j)] <= kMaxWindow, k, "stride out of range");
    int64_t pl = c.ia[(size_t)(2 + 2 * nsp + j)], pr = c.ia[(size_t)(2 + 3 * nsp + j)];
    // a right padding may be negative (the last inputs no window reaches)
    need(pl >= 0 && pl <= kMaxWindow && pr >= -kMaxWindow && pr <= kMaxWindow, k, "padding out of range");
    need(c.ia[(size_t)(2 + 4 * nsp + j)] >= 1 && c.ia[(size_t)(2 + 4 * nsp + j)] <= kMaxWindow, k,
         "dilation out of range");
  }
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  size_t rank = (size_t)nsp + 2;
  need_rank(src, rank, rank, k, "the source");
  need_rank(dst, rank, rank, k, "the destination");
  // f32, or u8 for max pooling (a quantized activation pooled as it is: exact)
  need(src.dtype == dst.dtype && (src.dtype == F32 || (src.dtype == U8 && c.ia[0] == 0)), k,
       "dtypes: f32 source and destination, or u8 ones for max pooling");
  for (int id : {c.ins[0], c.outs[0]}) need_dnnl_operand(e, id, k, "an operand");
  need(src.dims[0] == dst.dims[0] && src.dims[1] == dst.dims[1], k,
       "source and destination differ in batch or channels");
}

void build_pool(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  const auto& ia = c.ia;
  int64_t nsp = ia[1];
  size_t p = 2;
  memory::dims kernel = take(ia, p, (size_t)nsp), s = take(ia, p, (size_t)nsp), pl = take(ia, p, (size_t)nsp),
               pr = take(ia, p, (size_t)nsp), dil = take(ia, p, (size_t)nsp);
  for (auto& d : dil) d -= 1;
  dnnl::algorithm alg = ia[0] == 0 ? dnnl::algorithm::pooling_max
                       : ia[0] == 1 ? dnnl::algorithm::pooling_avg_include_padding
                                    : dnnl::algorithm::pooling_avg_exclude_padding;
  auto op = std::make_unique<MaxPoolOp>();  // its NaN check runs for max pooling only
  if (ia[0] == 0) {
    op->kernel = kernel; op->stride = s; op->pad_l = pl;
    op->dilation = dil;
    op->scans_input = true;
    for (auto& d : op->dilation) d += 1;
  }
  op->name = "pooling";
  const Tensor& ts = e.tensors[(size_t)c.ins[0]];
  memory::desc src = ts.md(), dst = e.tensors[(size_t)c.outs[0]].md();
  if (ts.strides[1] == 1 && ts.dims[1] > 1) {
    // channels-last source: say so for the destination too (a 1×1 output's strides fit
    // either layout, and oneDNN would pick plain and a slow mixed-layout kernel)
    static const tag cl[] = {tag::nwc, tag::nhwc, tag::ndhwc};
    dst = memory::desc(e.tensors[(size_t)c.outs[0]].dims, dnnl_type(ts.dtype), cl[nsp - 1]);
  }
  op->arg(DNNL_ARG_SRC, c.ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  auto attr = make_attr(e, c.post, op.get());
  op->check_fits(e);
  auto pd = dnnl::pooling_forward::primitive_desc(e.eng, dnnl::prop_kind::forward_inference, alg,
                                                  src, dst, s, kernel, dil, pl, pr, attr);
  op->prim = dnnl::pooling_forward(pd);
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  push_op(e, std::move(op), c);
}

}  // namespace ofc
