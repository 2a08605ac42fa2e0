// opforge's ExecuTorch compatibility headers: the map/reduce loops of ExecuTorch's portable
// kernels over contiguous (or evenly strided) data, single-threaded.
#pragma once

#include <cstdint>

#include "c10/util/irange.h"
#include "executorch/runtime/kernel/kernel_includes.h"

namespace torch {
namespace executor {

// The fold of data_in[0], data_in[stride], ... with reduce_fun(value, accumulator).
template <typename CTYPE, typename ReduceOp>
inline CTYPE apply_unary_reduce_fn(const ReduceOp& reduce_fun, const CTYPE* const data_in,
                                   const int64_t size, const int64_t stride = 1) {
  CTYPE acc = data_in[0];
  for (int64_t i = 1; i < size; ++i) acc = reduce_fun(data_in[i * stride], acc);
  return acc;
}

// data_out[i * stride] = map_fun(data_in[i * stride]) for i in [0, size).
template <typename CTYPE_IN, typename CTYPE_OUT, typename MapOp>
inline void apply_unary_map_fn(const MapOp& map_fun, const CTYPE_IN* const data_in,
                               CTYPE_OUT* const data_out, const int64_t size,
                               const int64_t stride = 1) {
  for (int64_t i = 0; i < size; ++i) data_out[i * stride] = map_fun(data_in[i * stride]);
}

// The fold of map_fun over data_in with reduce_fun(value, accumulator).
template <typename CTYPE_IN, typename CTYPE_OUT, typename MapOp, typename ReduceOp>
inline CTYPE_OUT apply_unary_map_reduce_fn(const MapOp& map_fun, const ReduceOp& reduce_fun,
                                           const CTYPE_IN* const data_in, const int64_t size,
                                           const int64_t stride = 1) {
  CTYPE_OUT acc = map_fun(data_in[0]);
  for (int64_t i = 1; i < size; ++i) acc = reduce_fun(map_fun(data_in[i * stride]), acc);
  return acc;
}

}  // namespace executor
}  // namespace torch
