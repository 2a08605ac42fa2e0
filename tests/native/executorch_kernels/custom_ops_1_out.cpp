// A kernel written as in ExecuTorch's examples/portable/custom_ops: its own include, its
// own type names, ET_CHECK_MSG preconditions, a context it does not use.
#include <executorch/runtime/kernel/kernel_includes.h>

namespace custom {
namespace native {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::KernelRuntimeContext;

namespace {
void check_preconditions(const Tensor& in, Tensor& out) {
  ET_CHECK_MSG(in.scalar_type() != ScalarType::Bool,
               "Expected a numeric in tensor, but got dtype %hhd (Bool)",
               static_cast<int8_t>(in.scalar_type()));
  ET_CHECK_MSG(out.scalar_type() == in.scalar_type(),
               "Expected out tensor to have dtype %hhd, but got %hhd instead",
               static_cast<int8_t>(in.scalar_type()), static_cast<int8_t>(out.scalar_type()));
  ET_CHECK_MSG(out.dim() == in.dim(), "Number of dims of out tensor is not compatible with inputs");
  ET_CHECK_MSG(out.numel() == in.numel(),
               "Number of elements of out tensor %zd is not compatible with inputs %zd",
               ssize_t(out.numel()), ssize_t(in.numel()));
}
}  // namespace

// mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
Tensor& mul3_out_impl(KernelRuntimeContext& ctx, const Tensor& in, Tensor& out) {
  check_preconditions(in, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, in.sizes()) == executorch::runtime::Error::Ok,
                  InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::tensor_is_contiguous(in), InvalidArgument, out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::tensors_have_same_dim_order(in, out),
                  InvalidArgument, out);
  ET_SWITCH_REAL_TYPES(in.scalar_type(), ctx, "mul3.out", CTYPE, [&]() {
    const CTYPE* in_data = in.const_data_ptr<CTYPE>();
    CTYPE* out_data = out.mutable_data_ptr<CTYPE>();
    for (size_t i = 0; i < static_cast<size_t>(out.numel()); ++i) {
      out_data[i] = static_cast<CTYPE>(in_data[i] * 3);
    }
  });
  return out;
}

}  // namespace native
}  // namespace custom
