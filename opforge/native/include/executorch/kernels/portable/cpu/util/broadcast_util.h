// opforge's ExecuTorch compatibility headers: the broadcasting helpers of ExecuTorch's
// portable kernels (shape checks, the broadcast target shape, resize to it, and the
// element-wise loop), over opforge's strided views.
#pragma once

#include <cstddef>
#include <cstdint>

#include "executorch/kernels/portable/cpu/util/functional_util.h"
#include "executorch/runtime/kernel/kernel_includes.h"

namespace torch {
namespace executor {

using ::executorch::aten::ArrayRef;
using ::executorch::runtime::Error;

inline bool tensor_is_broadcastable_to(ArrayRef<Tensor::SizesType> from,
                                       ArrayRef<Tensor::SizesType> to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    const auto f = from[from.size() - i], t = to[to.size() - i];
    if (f != t && f != 1) return false;
  }
  return true;
}
inline bool tensor_is_broadcastable_to(const Tensor& from, const Tensor& to) {
  return tensor_is_broadcastable_to(from.sizes(), to.sizes());
}
inline bool tensors_are_broadcastable_between(ArrayRef<Tensor::SizesType> a,
                                              ArrayRef<Tensor::SizesType> b) {
  for (size_t i = 1; i <= a.size() && i <= b.size(); ++i) {
    const auto x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}
inline bool tensors_are_broadcastable_between(const Tensor& a, const Tensor& b) {
  return tensors_are_broadcastable_between(a.sizes(), b.sizes());
}

// The broadcast shape of a and b into out_sizes[0 .. *out_dim).
ET_NODISCARD inline Error get_broadcast_target_size(ArrayRef<Tensor::SizesType> a,
                                                    ArrayRef<Tensor::SizesType> b,
                                                    Tensor::SizesType* out_sizes,
                                                    const size_t out_sizes_len, size_t* out_dim) {
  ET_CHECK_OR_RETURN_ERROR(tensors_are_broadcastable_between(a, b), InvalidArgument,
                           "shapes of %zu and %zu dims are not broadcastable", a.size(), b.size());
  const size_t rank = a.size() > b.size() ? a.size() : b.size();
  ET_CHECK_OR_RETURN_ERROR(rank <= out_sizes_len, InvalidArgument,
                           "broadcast rank %zu over the limit %zu", rank, out_sizes_len);
  for (size_t i = 1; i <= rank; ++i) {
    const Tensor::SizesType x = i <= a.size() ? a[a.size() - i] : 1;
    const Tensor::SizesType y = i <= b.size() ? b[b.size() - i] : 1;
    out_sizes[rank - i] = x == 1 ? y : x;
  }
  *out_dim = rank;
  return Error::Ok;
}
ET_NODISCARD inline Error get_broadcast_target_size(const Tensor& a, const Tensor& b,
                                                    Tensor::SizesType* out_sizes,
                                                    const size_t out_sizes_len, size_t* out_dim) {
  return get_broadcast_target_size(a.sizes(), b.sizes(), out_sizes, out_sizes_len, out_dim);
}

// Resize `out` to the broadcast shape of a and b (static tensors: out must have it).
ET_NODISCARD inline Error resize_to_broadcast_target_size(const Tensor& a, const Tensor& b,
                                                          Tensor& out) {
  Tensor::SizesType sizes[kTensorDimensionLimit];
  size_t rank = 0;
  ET_CHECK_OK_OR_RETURN_ERROR(
      get_broadcast_target_size(a, b, sizes, kTensorDimensionLimit, &rank));
  return resize_tensor(out, ArrayRef<Tensor::SizesType>(sizes, rank));
}

namespace internal {
// The element offset in `from` (broadcast to out's shape) of out's multi-index.
inline int64_t broadcast_offset(const Tensor& from, const int64_t* out_index, int64_t out_rank) {
  int64_t offset = 0;
  const int64_t lead = out_rank - from.dim();
  for (int64_t d = 0; d < from.dim(); ++d)
    if (from.size(d) != 1) offset += out_index[d + lead] * from.stride(d);
  return offset;
}
}  // namespace internal

// out[i] = compute_fun(a[i], b[i]) with a and b broadcast to out's shape; any strides.
template <typename CTYPE_A, typename CTYPE_B, typename CTYPE_OUT, typename Op>
inline void apply_binary_elementwise_fn(const Op& compute_fun, const Tensor& a, const Tensor& b,
                                        const Tensor& out) {
  const CTYPE_A* data_a = a.const_data_ptr<CTYPE_A>();
  const CTYPE_B* data_b = b.const_data_ptr<CTYPE_B>();
  CTYPE_OUT* data_out = out.mutable_data_ptr<CTYPE_OUT>();
  ::opforge::for_each_index(out.sizes(), [&](const int64_t* index) {
    data_out[::opforge::offset_of(out, index)] = compute_fun(
        data_a[internal::broadcast_offset(a, index, out.dim())],
        data_b[internal::broadcast_offset(b, index, out.dim())]);
  });
}

}  // namespace executor
}  // namespace torch
