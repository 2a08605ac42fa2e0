// opforge's ExecuTorch compatibility headers: reading a Scalar argument in a kernel, as
// ExecuTorch's portable kernels do (utils::extract_scalar, get_scalar_dtype, scalar_to).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "executorch/runtime/kernel/kernel_includes.h"

namespace torch {
namespace executor {
namespace native {
namespace utils {

using ::executorch::aten::Scalar;
using ::executorch::aten::ScalarType;

inline ScalarType get_scalar_dtype(const Scalar& scalar) {
  if (scalar.isBoolean()) return ScalarType::Bool;
  if (scalar.isIntegral()) return ScalarType::Long;
  return ScalarType::Double;
}

// Integral T: false for a floating-point scalar or a value out of T's range.
template <typename INT_T, typename std::enable_if<std::is_integral<INT_T>::value &&
                                                      !std::is_same<INT_T, bool>::value,
                                                  bool>::type = true>
bool extract_scalar(const Scalar& scalar, INT_T* out_val) {
  if (!scalar.isIntegral(/*include_bool=*/false)) return false;
  const int64_t v = scalar.to<int64_t>();
  if (v < static_cast<int64_t>(std::numeric_limits<INT_T>::lowest()) ||
      (std::is_signed<INT_T>::value && v > static_cast<int64_t>(std::numeric_limits<INT_T>::max())))
    return false;
  *out_val = static_cast<INT_T>(v);
  return true;
}

// Floating T (float, double, Half, BFloat16): any int or float scalar.
template <typename FLOAT_T,
          typename std::enable_if<std::is_floating_point<FLOAT_T>::value ||
                                      std::is_same<FLOAT_T, ::executorch::aten::Half>::value ||
                                      std::is_same<FLOAT_T, ::executorch::aten::BFloat16>::value,
                                  bool>::type = true>
bool extract_scalar(const Scalar& scalar, FLOAT_T* out_val) {
  if (scalar.isBoolean()) return false;
  *out_val = static_cast<FLOAT_T>(scalar.to<double>());
  return true;
}

template <typename BOOL_T, typename std::enable_if<std::is_same<BOOL_T, bool>::value, bool>::type = true>
bool extract_scalar(const Scalar& scalar, BOOL_T* out_val) {
  if (!scalar.isBoolean() && !scalar.isIntegral()) return false;
  *out_val = scalar.to<int64_t>() != 0;
  return true;
}

template <typename T>
T scalar_to(const Scalar& s) {
  return s.isBoolean() ? static_cast<T>(s.to<int64_t>() != 0)
                       : s.isIntegral() ? static_cast<T>(s.to<int64_t>()) : static_cast<T>(s.to<double>());
}

}  // namespace utils
}  // namespace native
}  // namespace executor
}  // namespace torch

#define ET_EXTRACT_SCALAR(scalar, out_val) \
  ET_CHECK_MSG(::torch::executor::native::utils::extract_scalar(scalar, &out_val), \
               #scalar " could not be extracted: wrong type or out of range")
