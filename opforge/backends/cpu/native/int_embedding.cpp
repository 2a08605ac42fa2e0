// Embedding on integer weights: rows of an int8 (or int4, two a byte) table gathered by
// index and dequantized as they are copied, so the table stays 1 (or 1/2) byte a weight.
//
// Contract ("int_embedding"): ins [q, scales, indices], outs [out]; ia [bits, group, D].
//   q: int8 [V, D] (bits 8) or uint8 [V, ceil(D/2)] (bits 4: byte [v, i] holds
//   q[v, 2i] + 8 in its low nibble, q[v, 2i + 1] + 8 in its high one), dense;
//   scales: f32 dense [V, ceil(D/group)], group in [1, D]; indices: int64 or int32, dense;
//   out: f32 dense, indices' elements × D. Work: one row per index, checked in [0, V).
//
// Arithmetic: out[i, d] = float32(q[r, d]) · scales[r, d / group] with r = indices[i]: one
// rounding, the product quantized_decomposed's dequantize_per_channel (axis 0) and
// torchao's dequantize_affine (block (1, group)) compute with a zero zero point, so the
// rows are the lean runtime's (which dequantizes the table, then gathers), bit for bit.
#include "engine.h"
#include "loops.h"

namespace ofc {

namespace {

struct IntEmbeddingOp : Op {
  int bits = 8;
  int64_t v = 0, d = 0, group = 0, groups = 0, row_bytes = 0;
  void run(Engine& e) override {
    const uint8_t* q = static_cast<const uint8_t*>(e.ptr(ins[0]));
    const float* s = static_cast<const float*>(e.ptr(ins[1]));
    const Tensor& ix = e.tensors[(size_t)ins[2]];
    const void* ip = e.ptr(ins[2]);
    float* out = static_cast<float*>(e.ptr(outs[0]));
    for (int64_t i = 0; i < ix.numel; ++i) {
      const int64_t r = load_as<int64_t>(ip, ix.dtype, i);
      if (r < 0 || r >= v)
        fail("int_embedding: index " + std::to_string(r) + " out of range for " + std::to_string(v) + " rows");
      const uint8_t* row = q + r * row_bytes;
      const float* sr = s + r * groups;
      float* o = out + i * d;
      for (int64_t g = 0; g < groups; ++g) {
        const float sc = sr[g];
        const int64_t k1 = std::min(d, (g + 1) * group);
        if (bits == 8) {
          const int8_t* qr = reinterpret_cast<const int8_t*>(row);
          for (int64_t k = g * group; k < k1; ++k) o[k] = (float)qr[k] * sc;
        } else {
          for (int64_t k = g * group; k < k1; ++k)
            o[k] = (float)((int)((row[k >> 1] >> ((k & 1) * 4)) & 15) - 8) * sc;
        }
      }
    }
  }
};

}  // namespace

void contract_int_embedding(const Engine& e, const OpCall& c) {
  const std::string& kind = c.kind;
  need_count(c, 3, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.size() == 3 && c.fa.empty(), kind, "takes ia [bits, group, D] and no fa");
  const int64_t bits = c.ia[0], group = c.ia[1], D = c.ia[2];
  need(bits == 4 || bits == 8, kind, "bits must be 4 or 8");
  need(D >= 1 && D <= ((int64_t)1 << 31) && group >= 1 && group <= D, kind,
       "D must be in [1, 2^31] and group in [1, D]");
  const Tensor& q = e.tensors[(size_t)c.ins[0]];
  const Tensor& s = e.tensors[(size_t)c.ins[1]];
  const Tensor& ix = e.tensors[(size_t)c.ins[2]];
  const Tensor& out = e.tensors[(size_t)c.outs[0]];
  need_rank(q, 2, 2, kind, "the table");
  const int64_t V = q.dims[0];
  need(q.dtype == (bits == 8 ? I8 : U8) && q.dims[1] == (bits == 8 ? D : (D + 1) / 2), kind,
       "the table must be int8 [V, D] (8 bits) or uint8 [V, ceil(D/2)] (4 bits)");
  need(s.dtype == F32 && s.dims == dims_t({V, (D + group - 1) / group}), kind,
       "scales must be f32 [V, ceil(D/group)]");
  need(ix.dtype == I64 || ix.dtype == I32, kind, "indices must be int64 or int32");
  need_dtype(out, F32, kind, "the output");
  for (int id : {c.ins[0], c.ins[1], c.ins[2], c.outs[0]}) {
    const Tensor& t = e.tensors[(size_t)id];
    need(row_major(t) && dense(t), kind, "every operand must be contiguous");
  }
  need(out.numel == mul_c(ix.numel, D, "int_embedding"), kind, "the output must hold indices × D elements");
}

void build_int_embedding(Handle& h, const OpCall& c) {
  const Tensor& q = h.e.tensors[(size_t)c.ins[0]];
  auto op = std::make_unique<IntEmbeddingOp>();
  op->bits = (int)c.ia[0];
  op->group = c.ia[1];
  op->d = c.ia[2];
  op->v = q.dims[0];
  op->row_bytes = q.dims[1];
  op->groups = (op->d + op->group - 1) / op->group;
  op->name = std::string("embedding on int") + (op->bits == 8 ? "8" : "4") + " weights";
  push_op(h.e, std::move(op), c);
}

}  // namespace ofc
