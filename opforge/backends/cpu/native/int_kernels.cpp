// The checks and the setup int_matmul and int_dot_matmul share (int_kernels.h).
#include "int_kernels.h"

namespace ofc {

void need_int_weights_operands(const Engine& e, const OpCall& c, int64_t& M, int64_t& K,
                               int64_t& N) {
  const std::string& kind = c.kind;
  need(c.ins.size() == 3 || c.ins.size() == 4, kind, "takes [a, w, scales] or [a, w, scales, bias]");
  need_count(c, c.ins.size(), 1);
  need_post_ops_allowed(c, false);
  const Tensor& a = e.tensors[(size_t)c.ins[0]];
  const Tensor& d = e.tensors[(size_t)c.outs[0]];
  need_rank(a, 2, 2, kind, "a");
  need_rank(d, 2, 2, kind, "the output");
  need_dtype(a, F32, kind, "a");
  need_dtype(d, F32, kind, "the output");
  M = a.dims[0];
  K = a.dims[1];
  N = d.dims[1];
  need(d.dims[0] == M, kind, "a and the output have different row counts");
  need(K >= 1 && N >= 1 && K <= ((int64_t)1 << 31) && N <= ((int64_t)1 << 31), kind,
       "K and N must be in [1, 2^31]");
  need(a.strides[1] == 1 || K == 1, kind, "a's columns must be contiguous");
  need(d.strides[1] == 1 || N == 1, kind, "the output's columns must be contiguous");
  need(M <= 1 || d.strides[0] >= N, kind, "the output's rows overlap");
  need(e.root(c.ins[0]) != e.root(c.outs[0]), kind, "the output shares a's storage");
  need(e.tensors[(size_t)e.root(c.ins[1])].is_const && e.tensors[(size_t)e.root(c.ins[2])].is_const,
       kind, "w and scales must be constants");
  if (c.ins.size() == 4) {
    const Tensor& b = e.tensors[(size_t)c.ins[3]];
    need(b.dtype == F32 && b.numel == N && dense(b) && row_major(b) &&
             e.tensors[(size_t)e.root(c.ins[3])].is_const,
         kind, "the bias must be a dense f32 constant of N elements");
  }
  // the work bound: M·K·N multiply-adds (each factor < 2^41 by the tensor checks)
  int64_t work = 0;
  need(!__builtin_mul_overflow(M, K, &work) && !__builtin_mul_overflow(work, N, &work), kind,
       "M·K·N overflows");
}

void int_weights_setup(Engine& e, const OpCall& c, IntWeightsOp& op, int64_t groups, const char* what) {
  const Tensor& a = e.tensors[(size_t)c.ins[0]];
  const Tensor& d = e.tensors[(size_t)c.outs[0]];
  op.bits = (int)c.ia[0];
  op.m = a.dims[0];
  op.k = a.dims[1];
  op.n = d.dims[1];
  op.group = c.ia[1];
  op.groups = groups;
  op.panels = (op.n + kIntLanes - 1) / kIntLanes;
  op.sa = a.strides[0];
  op.sd = d.strides[0];
  op.w = static_cast<const uint8_t*>(e.ptr(c.ins[1]));
  op.s = static_cast<const float*>(e.ptr(c.ins[2]));
  if (op.w == nullptr || op.s == nullptr) fail(std::string(what) + ": weights or scales without data at init");
  const int64_t cols = mul_c(op.panels, kIntLanes, what);
  e.reserve(mul_c(cols, 4, what), (std::string(what) + " bias").c_str());
  op.bias.assign((size_t)cols, 0.f);
  if (c.ins.size() == 4) {
    const float* b = static_cast<const float*>(e.ptr(c.ins[3]));
    for (int64_t j = 0; j < op.n; ++j) op.bias[(size_t)j] = b[j];
  }
  op.team = op_threads(e, c);
}

}  // namespace ofc
