// Rotary position embedding (f32, a loop): y = x * cos + rotate_half(x) * sin over the last
// dim d (even), rotate_half(x)_j = -x_{j+d/2} for j < d/2, x_{j-d/2} after.
//
// Contract: ins [x, cos, sin], outs [y]; no attributes.
//   x, y: f32, one shape, rank 1..8, row-major dense, last dim even;
//   cos, sin: f32, x's dims (broadcasting written as stride 0), the last dim dense
//   (stride 1). Work: one pass over x, reading cos and sin rows by their strides.
#include "engine.h"
#include "loops.h"

namespace ofc {

struct RopeOp : Op {
  void run(Engine& e) override {
    const Tensor& x = e.tensors[(size_t)ins[0]];
    const Tensor& c = e.tensors[(size_t)ins[1]];
    const Tensor& s = e.tensors[(size_t)ins[2]];
    const float* xp = static_cast<const float*>(e.ptr(ins[0]));
    const float* cp = static_cast<const float*>(e.ptr(ins[1]));
    const float* sp = static_cast<const float*>(e.ptr(ins[2]));
    float* yp = static_cast<float*>(e.ptr(outs[0]));
    const int64_t rank = (int64_t)x.dims.size();
    const int64_t d = x.dims.back(), half = d / 2;
    for_each_row(x.dims, [&](const int64_t* idx, int64_t) {
      int64_t xo = 0, co = 0, so = 0;
      for (int64_t k = 0; k + 1 < rank; ++k) {
        xo += idx[k] * x.strides[(size_t)k];
        co += idx[k] * c.strides[(size_t)k];
        so += idx[k] * s.strides[(size_t)k];
      }
      const float* xr = xp + xo;
      const float* cr = cp + co;
      const float* sr = sp + so;
      float* yr = yp + xo;  // y has x's dims and row-major strides
      for (int64_t j = 0; j < half; ++j) {
        float direct = xr[j] * cr[j], rotated = -xr[j + half] * sr[j];
        yr[j] = direct + rotated;
      }
      for (int64_t j = half; j < d; ++j) {
        float direct = xr[j] * cr[j], rotated = xr[j - half] * sr[j];
        yr[j] = direct + rotated;
      }
    });
  }
};

void contract_rope(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  need_count(c, 3, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.empty() && c.fa.empty(), k, "takes no attributes");
  const Tensor& x = e.tensors[(size_t)c.ins[0]];
  const Tensor& y = e.tensors[(size_t)c.outs[0]];
  need_rank(x, 1, kMaxRank, k, "x");
  need_dtype(x, F32, k, "x");
  need_dtype(y, F32, k, "the output");
  need(x.dims == y.dims, k, "x and the output have different shapes");
  need(row_major(x) && dense(x) && row_major(y) && dense(y), k, "x and the output must be contiguous");
  need(x.dims.back() % 2 == 0, k, "the last dim must be even (two halves)");
  for (size_t i = 1; i < 3; ++i) {
    const Tensor& t = e.tensors[(size_t)c.ins[i]];
    need_dtype(t, F32, k, "cos and sin");
    need(t.dims == x.dims, k, "cos and sin must have x's dims (broadcast as stride 0)");
    need(x.dims.back() <= 1 || t.strides.back() == 1, k, "cos and sin rows must be dense");
  }
}

void build_rope(Handle& h, const OpCall& c) {
  auto op = std::make_unique<RopeOp>();
  op->name = "rope";
  push_op(h.e, std::move(op), c);
}

}  // namespace ofc
