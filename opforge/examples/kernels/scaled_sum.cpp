// my_ops::scaled_sum(Tensor input, Scalar scale, int[] dims, bool keepdim=False) -> Tensor:
// scale * sum of `input` over `dims` (all dims when empty). Scalar and int-list arguments.
// Floating-point inputs only: the example's fake keeps the input dtype, and an integer sum
// scaled by a float has no exact integer result.
#include "opforge/kernel.h"

namespace {

template <class T>
void scaled_sum(const opforge::Tensor& in, const bool* reduced, double scale, opforge::Tensor& out) {
  const T* src = in.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  const int64_t n = out.numel();
  // Accumulate in double into the (contiguous) output, then scale.
  double acc_small[64];
  double* acc = n <= 64 ? acc_small : new double[static_cast<size_t>(n)];
  for (int64_t i = 0; i < n; ++i) acc[i] = 0.0;
  const int64_t rank = in.dim();
  opforge::for_each_index(in.sizes(), [&](const int64_t* index) {
    int64_t linear = 0;  // row-major index into the kept dims
    for (int64_t d = 0; d < rank; ++d)
      if (!reduced[d]) linear = linear * in.size(d) + index[d];
    acc[linear] += static_cast<double>(src[opforge::offset_of(in, index)]);
  });
  int64_t i = 0;
  opforge::for_each_index(out.sizes(), [&](const int64_t* index) {
    dst[opforge::offset_of(out, index)] = static_cast<T>(acc[i++] * scale);
  });
  if (acc != acc_small) delete[] acc;
}

}  // namespace

namespace custom {
namespace native {

opforge::Tensor& scaled_sum_out_impl(opforge::KernelContext& ctx, const opforge::Tensor& input,
                                     const opforge::Scalar& scale, opforge::IntArrayRef dims,
                                     bool keepdim, opforge::Tensor& out) {
  const int64_t rank = input.dim();
  const int64_t bound = rank == 0 ? 1 : rank;
  bool reduced[64] = {false};
  OPFORGE_CHECK(ctx, rank <= 64, out, "my_ops::scaled_sum.out: rank %lld > 64", static_cast<long long>(rank));
  for (int64_t d : dims) {
    OPFORGE_CHECK(ctx, d >= -bound && d < bound, out,
                  "my_ops::scaled_sum.out: dim %lld is out of range for a %lld-d input",
                  static_cast<long long>(d), static_cast<long long>(rank));
    if (rank > 0) reduced[d < 0 ? d + rank : d] = true;
  }
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d) reduced[d] = true;
  int64_t expected_rank = 0, expected_numel = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d]) { ++expected_rank; expected_numel *= input.size(d); }
    else if (keepdim) ++expected_rank;
  }
  OPFORGE_CHECK(ctx, out.dim() == expected_rank && out.numel() == expected_numel, out,
                "my_ops::scaled_sum.out: out has %lld dims and %lld elements, expected %lld and %lld",
                static_cast<long long>(out.dim()), static_cast<long long>(out.numel()),
                static_cast<long long>(expected_rank), static_cast<long long>(expected_numel));
  OPFORGE_CHECK(ctx, out.scalar_type() == input.scalar_type(), out,
                "my_ops::scaled_sum.out: out dtype %s differs from input dtype %s",
                opforge::to_string(out.scalar_type()), opforge::to_string(input.scalar_type()));
  const double s = scale.to<double>();
  switch (input.scalar_type()) {
    case opforge::ScalarType::Float: scaled_sum<float>(input, reduced, s, out); break;
    case opforge::ScalarType::Double: scaled_sum<double>(input, reduced, s, out); break;
    default:
      ctx.fail("my_ops::scaled_sum.out: unsupported dtype %s (float32 and float64 only)",
               opforge::to_string(input.scalar_type()));
  }
  return out;
}

}  // namespace native
}  // namespace custom
