// A kernel written as ExecuTorch's portable library writes them (kernels/portable/cpu/):
// in torch::executor::native, ExecuTorch's names unqualified, the operator name as a
// constant, a Scalar read with utils::extract_scalar, the loop from functional_util.h.
#include <c10/util/irange.h>
#include <executorch/kernels/portable/cpu/scalar_utils.h>
#include <executorch/kernels/portable/cpu/util/functional_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/platform/assert.h>

namespace torch {
namespace executor {
namespace native {

using executorch::aten::Scalar;
using executorch::aten::Tensor;

Tensor& leaky_relu_out(KernelRuntimeContext& ctx, const Tensor& in, const Scalar& negative_slope,
                       Tensor& out) {
  (void)ctx;
  ET_KERNEL_CHECK_MSG(ctx, resize_tensor(out, in.sizes()) == Error::Ok, InvalidArgument, out,
                      "Failed to resize output tensor.");
  ET_KERNEL_CHECK(ctx, tensors_have_same_dtype(in, out), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensors_have_same_dim_order(in, out), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensor_is_contiguous(in), InvalidArgument, out);

  ET_DEFINE_OPERATOR_NAME(op_name, "leaky_relu.out");
  ET_SWITCH_FLOATHBF16_TYPES(in.scalar_type(), ctx, op_name, CTYPE, [&]() {
    CTYPE slope = 0;
    ET_KERNEL_CHECK(ctx, utils::extract_scalar(negative_slope, &slope), InvalidArgument, );
    apply_unary_map_fn(
        [slope](const CTYPE value) {
          return value > 0 ? value : static_cast<CTYPE>(value * slope);
        },
        in.const_data_ptr<CTYPE>(), out.mutable_data_ptr<CTYPE>(), in.numel());
  });
  return out;
}

// The sum of every element into out[0] (out must hold at least one element).
Tensor& sum_all_out(KernelRuntimeContext& ctx, const Tensor& in, Tensor& out) {
  ET_KERNEL_CHECK(ctx, tensors_have_same_dtype(in, out), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, in.numel() > 0 && tensor_is_contiguous(in), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensor_is_default_dim_order(out), InvalidArgument, out);
  ET_SWITCH_REAL_TYPES(in.scalar_type(), ctx, "sum_all.out", CTYPE, [&]() {
    CTYPE total = apply_unary_reduce_fn(
        [](const CTYPE value, const CTYPE acc) { return static_cast<CTYPE>(acc + value); },
        in.const_data_ptr<CTYPE>(), in.numel());
    CTYPE* out_data = out.mutable_data_ptr<CTYPE>();
    for (const auto i : c10::irange(out.numel())) out_data[i] = i == 0 ? total : CTYPE(0);
  });
  return out;
}

// out = value everywhere; an out-of-range value for out's dtype is a failed check.
Tensor& fill_value_out(KernelRuntimeContext& ctx, const Tensor& in, const Scalar& value,
                       Tensor& out) {
  ET_KERNEL_CHECK(ctx, tensors_have_same_dtype(in, out), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensors_have_same_dim_order(in, out), InvalidArgument, out);
  ET_SWITCH_REALHBBF16_TYPES(out.scalar_type(), ctx, "fill_value.out", CTYPE, [&] {
    auto casted = utils::internal::check_overflow_scalar_cast<CTYPE>(value);
    ET_KERNEL_CHECK(ctx, casted.has_value(), InvalidArgument, );
    const CTYPE v = casted.value();
    apply_unary_map_fn([v](const CTYPE) { return v; }, in.const_data_ptr<CTYPE>(),
                       out.mutable_data_ptr<CTYPE>(), out.numel());
  });
  return out;
}

// out = the one element of `value` (a 0-d tensor) everywhere.
Tensor& fill_tensor_value_out(KernelRuntimeContext& ctx, const Tensor& in, const Tensor& value,
                              Tensor& out) {
  ET_KERNEL_CHECK(ctx, tensor_is_scalar(value), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, tensor_is_default_dim_order(out), InvalidArgument, out);
  ET_SWITCH_REAL_TYPES(out.scalar_type(), ctx, "fill_tensor_value.out", CTYPE, [&] {
    CTYPE v = 0;
    ET_EXTRACT_SCALAR_TENSOR(value, v);
    for (const auto i : c10::irange(in.numel())) out.mutable_data_ptr<CTYPE>()[i] = v;
  });
  return out;
}

}  // namespace native
}  // namespace executor
}  // namespace torch
