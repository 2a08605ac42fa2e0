// my_ops::mul3 and my_ops::mul4: multiply every element by 3 (ExecuTorch's custom-op
// example) or by 4. Kernel names in my_ops.yaml: custom::mul3_out_impl and
// custom::mul4_out_impl, so the functions live in custom::native.
//
// mul3 takes the KernelContext and reports bad arguments through it; mul4 shows the other
// accepted form, without a context (it cannot report errors, so it trusts its caller).
#include "opforge/kernel.h"

namespace {

template <class T>
void scale_into(const opforge::Tensor& in, opforge::Tensor& out, T factor) {
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  if (in.is_contiguous() && out.is_contiguous()) {
    const int64_t n = in.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i] * factor);
    return;
  }
  opforge::for_each_index(in.sizes(), [&](const int64_t* index) {
    dst[opforge::offset_of(out, index)] = static_cast<T>(src[opforge::offset_of(in, index)] * factor);
  });
}

template <class Ctx>
void scale(Ctx* ctx, const char* op, const opforge::Tensor& in, opforge::Tensor& out, int factor) {
  switch (in.scalar_type()) {
    case opforge::ScalarType::Float: scale_into<float>(in, out, static_cast<float>(factor)); break;
    case opforge::ScalarType::Double: scale_into<double>(in, out, static_cast<double>(factor)); break;
    case opforge::ScalarType::Int: scale_into<int32_t>(in, out, factor); break;
    case opforge::ScalarType::Long: scale_into<int64_t>(in, out, factor); break;
    case opforge::ScalarType::Short: scale_into<int16_t>(in, out, static_cast<int16_t>(factor)); break;
    case opforge::ScalarType::Char: scale_into<int8_t>(in, out, static_cast<int8_t>(factor)); break;
    case opforge::ScalarType::Byte: scale_into<uint8_t>(in, out, static_cast<uint8_t>(factor)); break;
    default:
      if (ctx) ctx->fail("%s: unsupported dtype %s", op, opforge::to_string(in.scalar_type()));
  }
}

}  // namespace

namespace custom {
namespace native {

opforge::Tensor& mul3_out_impl(opforge::KernelContext& ctx, const opforge::Tensor& input,
                               opforge::Tensor& output) {
  OPFORGE_CHECK(ctx, input.scalar_type() == output.scalar_type(), output,
                "my_ops::mul3.out: output dtype %s differs from input dtype %s",
                opforge::to_string(output.scalar_type()), opforge::to_string(input.scalar_type()));
  OPFORGE_CHECK(ctx, opforge::same_sizes(input, output), output,
                "my_ops::mul3.out: output has %lld elements in %lld dims, input %lld in %lld dims "
                "(shapes must match)", static_cast<long long>(output.numel()),
                static_cast<long long>(output.dim()), static_cast<long long>(input.numel()),
                static_cast<long long>(input.dim()));
  scale(&ctx, "my_ops::mul3.out", input, output, 3);
  return output;
}

opforge::Tensor& mul4_out_impl(const opforge::Tensor& input, opforge::Tensor& output) {
  scale<opforge::KernelContext>(nullptr, "my_ops::mul4.out", input, output, 4);
  return output;
}

}  // namespace native
}  // namespace custom
