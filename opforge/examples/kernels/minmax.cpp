// my_ops::minmax(Tensor input, int dim) -> (Tensor min, Tensor max): two out tensors.
// NaN propagates, as in torch.amin/amax; a zero-size `dim` is an error, as in PyTorch.
#include <tuple>

#include "opforge/kernel.h"

namespace {

template <class T> bool is_nan(T v) { return v != v; }

template <class T>
void minmax_along(const opforge::Tensor& in, int64_t dim, opforge::Tensor& lo, opforge::Tensor& hi) {
  const T* src = in.const_data_ptr<T>();
  T* lo_data = lo.mutable_data_ptr<T>();
  T* hi_data = hi.mutable_data_ptr<T>();
  const int64_t rank = in.dim();
  const int64_t extent = rank == 0 ? 1 : in.size(dim);
  const int64_t step = rank == 0 ? 0 : in.stride(dim);
  // Iterate over the output's multi-index; the input index has `dim` inserted.
  opforge::for_each_index(lo.sizes(), [&](const int64_t* out_index) {
    int64_t base = 0;
    for (int64_t d = 0, o = 0; d < rank; ++d) {
      if (d == dim) continue;
      base += out_index[o++] * in.stride(d);
    }
    T mn = src[base], mx = src[base];
    for (int64_t k = 1; k < extent; ++k) {
      const T v = src[base + k * step];
      if (is_nan(mn) || is_nan(v) || v < mn) mn = is_nan(mn) ? mn : v;
      if (is_nan(mx) || is_nan(v) || v > mx) mx = is_nan(mx) ? mx : v;
    }
    lo_data[opforge::offset_of(lo, out_index)] = mn;
    hi_data[opforge::offset_of(hi, out_index)] = mx;
  });
}

}  // namespace

namespace custom {
namespace native {

std::tuple<opforge::Tensor&, opforge::Tensor&> minmax_out_impl(
    opforge::KernelContext& ctx, const opforge::Tensor& input, int64_t dim, opforge::Tensor& min,
    opforge::Tensor& max) {
  std::tuple<opforge::Tensor&, opforge::Tensor&> result(min, max);
  const int64_t rank = input.dim();
  const int64_t bound = rank == 0 ? 1 : rank;
  OPFORGE_CHECK(ctx, dim >= -bound && dim < bound, result,
                "my_ops::minmax.out: dim %lld is out of range for a %lld-d input (valid: %lld..%lld)",
                static_cast<long long>(dim), static_cast<long long>(rank),
                static_cast<long long>(-bound), static_cast<long long>(bound - 1));
  if (dim < 0) dim += bound;
  OPFORGE_CHECK(ctx, rank == 0 || input.size(dim) > 0, result,
                "my_ops::minmax.out: cannot reduce over dim %lld of size 0", static_cast<long long>(dim));
  // The outs' sizes drive the loop below, so they must be exactly the input's without
  // `dim` (a larger out would read past the input).
  bool shaped = min.dim() == (rank == 0 ? 0 : rank - 1) && opforge::same_sizes(min, max);
  for (int64_t d = 0, o = 0; shaped && d < rank; ++d) {
    if (d == dim) continue;
    shaped = min.size(o++) == input.size(d);
  }
  OPFORGE_CHECK(ctx, shaped, result,
                "my_ops::minmax.out: min and max must have the input's shape without dim %lld",
                static_cast<long long>(dim));
  OPFORGE_CHECK(ctx, min.scalar_type() == input.scalar_type() && max.scalar_type() == input.scalar_type(),
                result, "my_ops::minmax.out: min and max must have the input's dtype %s",
                opforge::to_string(input.scalar_type()));
  switch (input.scalar_type()) {
    case opforge::ScalarType::Float: minmax_along<float>(input, dim, min, max); break;
    case opforge::ScalarType::Double: minmax_along<double>(input, dim, min, max); break;
    case opforge::ScalarType::Int: minmax_along<int32_t>(input, dim, min, max); break;
    case opforge::ScalarType::Long: minmax_along<int64_t>(input, dim, min, max); break;
    default:
      ctx.fail("my_ops::minmax.out: unsupported dtype %s", opforge::to_string(input.scalar_type()));
  }
  return result;
}

}  // namespace native
}  // namespace custom
