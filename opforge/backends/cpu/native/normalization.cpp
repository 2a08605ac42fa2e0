// Normalisations: layer norm (f32, oneDNN), RMS norm and group norm (f32, loops).
//
// layer_norm contract (over the last dim): ins [src, (scale), (shift)], outs [dst];
//   ia [has_scale, has_shift]; fa [eps].
//   src, dst: f32, one shape, rank 1..8, no overlapping strides; scale and shift: f32,
//   dense, rank 1, one value per element of the last dim.
// rms_norm contract (over the last dim): ins [src, (scale)], outs [dst]; ia [has_scale];
//   fa [eps]. src, dst: f32, one shape (rows, D), row-major dense; scale: f32, dense, rank
//   1, D values. y = x * (1 / sqrt(mean(x^2) + eps)) [* scale], one pass to sum and one to
//   write per row (what RMSNorm decomposes into: pow, mean, add, rsqrt and two muls).
// group_norm contract: ins [x, (w), (b)], outs [y]; ia [groups, has_w, has_b]; fa [eps].
//   x, y: f32, row-major (N, C, *), one shape; groups >= 1 divides C; w and b: f32, dense,
//   one per channel. Work: three passes over x.
#include <omp.h>

#include <cmath>
#include <cstring>

#include "engine.h"
#include "loops.h"

namespace ofc {

void same_shape_f32(const Engine& e, const OpCall& c, bool dnnl_operands) {
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  const Tensor& dst = e.tensors[(size_t)c.outs[0]];
  need_dtype(src, F32, c.kind, "the source");
  need_dtype(dst, F32, c.kind, "the destination");
  need(src.dims == dst.dims, c.kind, "source and destination shapes differ");
  if (dnnl_operands) {
    need_dnnl_operand(e, c.ins[0], c.kind, "the source");
    need_dnnl_operand(e, c.outs[0], c.kind, "the destination");
  }
}

namespace {
void per_channel(const Engine& e, int id, int64_t n, const std::string& kind, const char* what) {
  const Tensor& t = e.tensors[(size_t)id];
  need_dtype(t, F32, kind, what);
  need(t.dims.size() == 1 && t.dims[0] == n && dense(t), kind,
       std::string(what) + " must be dense, rank 1, " + std::to_string(n) + " values");
}
}  // namespace

void contract_layer_norm(const Engine& e, const OpCall& c) {
  need(c.ia.size() == 2 && c.fa.size() == 1, c.kind, "attributes: ia [has_scale, has_shift], fa [eps]");
  need_post_ops_allowed(c, false);
  size_t n_in = 1 + (size_t)(c.ia[0] != 0) + (size_t)(c.ia[1] != 0);
  need_count(c, n_in, 1);
  same_shape_f32(e, c, true);
  const Tensor& src = e.tensors[(size_t)c.ins[0]];
  need_rank(src, 1, kMaxRank, c.kind, "the source");
  for (size_t k = 1; k < n_in; ++k) per_channel(e, c.ins[k], src.dims.back(), c.kind, "scale or shift");
}

void build_layer_norm(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  auto op = std::make_unique<DnnlOp>();
  op->name = "layer_norm";
  memory::desc src = e.tensors[(size_t)c.ins[0]].md(), dst = e.tensors[(size_t)c.outs[0]].md();
  op->arg(DNNL_ARG_SRC, c.ins[0], src);
  op->arg(DNNL_ARG_DST, c.outs[0], dst);
  dnnl::normalization_flags flags = dnnl::normalization_flags::none;
  if (c.ia[0]) flags = flags | dnnl::normalization_flags::use_scale;
  if (c.ia[1]) flags = flags | dnnl::normalization_flags::use_shift;
  size_t k = 1;
  if (c.ia[0]) { op->arg(DNNL_ARG_SCALE, c.ins[k], e.tensors[(size_t)c.ins[k]].md()); ++k; }
  if (c.ia[1]) { op->arg(DNNL_ARG_SHIFT, c.ins[k], e.tensors[(size_t)c.ins[k]].md()); ++k; }
  op->check_fits(e);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
  auto pd = dnnl::layer_normalization_forward::primitive_desc(
      e.eng, dnnl::prop_kind::forward_inference, src, dst, (float)c.fa[0], flags, attr);
  op->prim = dnnl::layer_normalization_forward(pd);
  if (pd.mean_desc().get_size() > 0) {
    op->fixed_args.emplace_back(DNNL_ARG_MEAN, new_memory(e, pd.mean_desc(), "layer norm statistics"));
    op->fixed_args.emplace_back(DNNL_ARG_VARIANCE, new_memory(e, pd.variance_desc(), "layer norm statistics"));
  }
  add_scratchpad(e, op.get(), pd.scratchpad_desc());
  op->bind(e);
  push_op(e, std::move(op), c);
}

// RMS norm on contiguous rows: the squares summed in 16 float lanes (vectorised), the lanes
// and the tail in double; the scale applied as torch's decomposition does, in float:
// (x * r) * w with r = 1 / sqrt(mean + eps). NaN and inf propagate through the sum.
struct RmsNormOp : Op {
  bool has_scale = false;
  float eps = 1e-6f;
  void run(Engine& e) override {
    const Tensor& x = e.tensors[(size_t)ins[0]];
    int64_t rows = x.dims[0], n = x.dims[1];
    const float* xp = static_cast<const float*>(e.ptr(ins[0]));
    const float* wp = has_scale ? static_cast<const float*>(e.ptr(ins[1])) : nullptr;
    float* out = static_cast<float*>(e.ptr(outs[0]));
    parallel_for(omp_get_max_threads(), rows, [&](int64_t r) {
      const float* xr = xp + r * n;
      float* yr = out + r * n;
      float lanes[16] = {0};
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; ++k) lanes[k] += xr[i + k] * xr[i + k];
      double sum = 0;
      for (int k = 0; k < 16; ++k) sum += lanes[k];
      for (; i < n; ++i) sum += (double)xr[i] * xr[i];
      float inv = 1.0f / std::sqrt((float)(sum / (double)n) + eps);
      if (wp != nullptr)
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] * inv) * wp[j];
      else
        for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * inv;
    });
  }
};

void contract_rms_norm(const Engine& e, const OpCall& c) {
  need(c.ia.size() == 1 && (c.ia[0] == 0 || c.ia[0] == 1) && c.fa.size() == 1, c.kind,
       "attributes: ia [has_scale (0/1)], fa [eps]");
  need_post_ops_allowed(c, false);
  need_count(c, 1 + (size_t)c.ia[0], 1);
  same_shape_f32(e, c, false);
  const Tensor& x = e.tensors[(size_t)c.ins[0]];
  const Tensor& y = e.tensors[(size_t)c.outs[0]];
  need_rank(x, 2, 2, c.kind, "the source (rows, D)");
  need(row_major(x) && dense(x) && row_major(y) && dense(y), c.kind,
       "source and destination must be contiguous");
  if (c.ia[0]) per_channel(e, c.ins[1], x.dims[1], c.kind, "the scale");
}

void build_rms_norm(Handle& h, const OpCall& c) {
  auto op = std::make_unique<RmsNormOp>();
  op->has_scale = c.ia[0] != 0;
  op->eps = (float)c.fa[0];
  op->name = "rms_norm";
  push_op(h.e, std::move(op), c);
}

// group norm on contiguous (N, C, *)
struct GroupNormOp : Op {
  int64_t groups = 1;
  bool has_w = false, has_b = false;
  double eps = 1e-5;
  void run(Engine& e) override {
    const Tensor& x = e.tensors[(size_t)ins[0]];
    int64_t N = x.dims[0], C = x.dims[1], HW = 1;
    for (size_t k = 2; k < x.dims.size(); ++k) HW *= x.dims[k];
    const float* xp = static_cast<const float*>(e.ptr(ins[0]));
    const float* wp = has_w ? static_cast<const float*>(e.ptr(ins[1])) : nullptr;
    const float* bp = has_b ? static_cast<const float*>(e.ptr(ins[1 + (has_w ? 1 : 0)])) : nullptr;
    float* out = static_cast<float*>(e.ptr(outs[0]));
    int64_t cg = C / groups;
    // (N·groups: at most the tensor's elements)
    parallel_for(omp_get_max_threads(), N * groups, [&](int64_t ng) {
      const int64_t n = ng / groups, g = ng % groups;
      const float* base = xp + (n * C + g * cg) * HW;
      int64_t m = cg * HW;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < m; ++i) mean += base[i];
      mean /= (double)m;
      for (int64_t i = 0; i < m; ++i) { double d = base[i] - mean; var += d * d; }
      var /= (double)m;
      double rstd = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < cg; ++c) {
        int64_t ch = g * cg + c;
        double scale = rstd * (wp ? wp[ch] : 1.0), shift = bp ? bp[ch] : 0.0;
        const float* xi = base + c * HW;
        float* oi = out + (n * C + ch) * HW;
        for (int64_t i = 0; i < HW; ++i) oi[i] = (float)((xi[i] - mean) * scale + shift);
      }
    });
  }
};

void contract_group_norm(const Engine& e, const OpCall& c) {
  need(c.ia.size() == 3 && c.fa.size() == 1, c.kind, "attributes: ia [groups, has_w, has_b], fa [eps]");
  need_post_ops_allowed(c, false);
  size_t n_in = 1 + (size_t)(c.ia[1] != 0) + (size_t)(c.ia[2] != 0);
  need_count(c, n_in, 1);
  same_shape_f32(e, c, false);
  const Tensor& x = e.tensors[(size_t)c.ins[0]];
  need_rank(x, 2, kMaxRank, c.kind, "the input");
  need(c.ia[0] >= 1 && x.dims[1] % c.ia[0] == 0, c.kind, "groups must be >= 1 and divide the channels");
  need(row_major(x) && dense(x) && row_major(e.tensors[(size_t)c.outs[0]]) && dense(e.tensors[(size_t)c.outs[0]]),
       c.kind, "input and output must be contiguous");
  for (size_t k = 1; k < n_in; ++k) per_channel(e, c.ins[k], x.dims[1], c.kind, "weight or bias");
}

void build_group_norm(Handle& h, const OpCall& c) {
  auto op = std::make_unique<GroupNormOp>();
  op->groups = c.ia[0]; op->has_w = c.ia[1] != 0; op->has_b = c.ia[2] != 0; op->eps = c.fa[0];
  op->name = "group_norm";
  push_op(h.e, std::move(op), c);
}

}  // namespace ofc
