// Kernels in the style of ExecuTorch's portable library (kernels/portable/cpu/op_*.cpp):
// torch::executor names, Scalar arguments read with utils::extract_scalar, broadcasting
// checked and resized with resize_to_broadcast_target_size, dtype switches with lambdas.
#include <executorch/kernels/portable/cpu/scalar_utils.h>
#include <executorch/kernels/portable/cpu/util/broadcast_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>

namespace custom {
namespace native {

using executorch::aten::Scalar;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using torch::executor::KernelRuntimeContext;
using torch::executor::Error;

Tensor& add_alpha_out(KernelRuntimeContext& ctx, const Tensor& a, const Tensor& b,
                      const Scalar& alpha, Tensor& out) {
  ET_KERNEL_CHECK(ctx, torch::executor::tensors_have_same_dtype(a, b, out), InvalidArgument, out);
  ET_KERNEL_CHECK_MSG(ctx, torch::executor::resize_to_broadcast_target_size(a, b, out) == Error::Ok,
                      InvalidArgument, out, "Failed to resize output tensor.");
  // a shape probe for the fast path: false is no failure
  const bool fast = executorch::runtime::tensors_have_same_shape(a, b) &&
                    executorch::runtime::tensor_is_contiguous(a) &&
                    executorch::runtime::tensor_is_contiguous(b) &&
                    executorch::runtime::tensor_is_contiguous(out);
  ET_SWITCH_REALHBF16_TYPES(out.scalar_type(), ctx, "add_alpha.out", CTYPE, [&]() {
    CTYPE alpha_val;
    ET_KERNEL_CHECK(ctx, torch::executor::native::utils::extract_scalar(alpha, &alpha_val),
                    InvalidArgument, );
    const auto add = [alpha_val](const CTYPE val_a, const CTYPE val_b) {
      return static_cast<CTYPE>(val_a + alpha_val * val_b);
    };
    if (fast) {
      const CTYPE* pa = a.const_data_ptr<CTYPE>();
      const CTYPE* pb = b.const_data_ptr<CTYPE>();
      CTYPE* po = out.mutable_data_ptr<CTYPE>();
      for (int64_t i = 0; i < out.numel(); ++i) po[i] = add(pa[i], pb[i]);
    } else {
      torch::executor::apply_binary_elementwise_fn<CTYPE, CTYPE, CTYPE>(add, a, b, out);
    }
  });
  return out;
}

Tensor& clamp_min_out(KernelRuntimeContext& ctx, const Tensor& in, const Scalar& min, Tensor& out) {
  ET_KERNEL_CHECK(ctx, executorch::runtime::tensors_have_same_shape_and_dtype(in, out),
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::tensors_have_same_dim_order(in, out),
                  InvalidArgument, out);
  ET_SWITCH_FLOAT_TYPES(in.scalar_type(), ctx, "clamp_min.out", CTYPE, [&]() {
    const CTYPE lo = torch::executor::native::utils::scalar_to<CTYPE>(min);
    const CTYPE* in_data = in.const_data_ptr<CTYPE>();
    CTYPE* out_data = out.mutable_data_ptr<CTYPE>();
    for (int64_t i = 0; i < in.numel(); ++i) out_data[i] = in_data[i] < lo ? lo : in_data[i];
  });
  return out;
}

// Resizes `out` to the row sums' shape: in ExecuTorch a dynamic out grows to it; here the
// planned out must already have it.
Tensor& row_sum_out(KernelRuntimeContext& ctx, const Tensor& in, Tensor& out) {
  ET_KERNEL_CHECK(ctx, in.dim() == 2, InvalidArgument, out);
  ET_KERNEL_CHECK_MSG(ctx, torch::executor::resize_tensor(out, {in.size(0)}) == Error::Ok,
                      InvalidArgument, out, "Failed to resize output tensor.");
  ET_SWITCH_FLOAT_TYPES(in.scalar_type(), ctx, "row_sum.out", CTYPE, [&]() {
    const CTYPE* in_data = in.const_data_ptr<CTYPE>();
    CTYPE* out_data = out.mutable_data_ptr<CTYPE>();
    for (int64_t r = 0; r < in.size(0); ++r) {
      CTYPE total = 0;
      for (int64_t c = 0; c < in.size(1); ++c) total += in_data[r * in.size(1) + c];
      out_data[r] = total;
    }
  });
  return out;
}

}  // namespace native
}  // namespace custom
