// opforge's ExecuTorch compatibility headers: reading a Scalar argument in a kernel, as
// ExecuTorch's portable kernels do (utils::extract_scalar, get_scalar_dtype, scalar_to,
// utils::internal::check_overflow_scalar_cast).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
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

namespace internal {

// Whether `value` is out of To's range (NaN too, for an integral To; a float To takes
// infinities and NaN). bool never overflows.
template <typename To, typename From>
bool overflows(From value) {
  if constexpr (std::is_same<To, bool>::value) {
    return false;
  } else if constexpr (std::is_integral<To>::value) {
    const long double v = static_cast<long double>(value);
    if (v != v) return true;
    return v < static_cast<long double>(std::numeric_limits<To>::lowest()) ||
           v > static_cast<long double>(std::numeric_limits<To>::max());
  } else {
    const double v = static_cast<double>(value);
    if (std::isinf(v) || std::isnan(v)) return false;
    double top = std::is_same<To, ::executorch::aten::Half>::value       ? 65504.0
                 : std::is_same<To, ::executorch::aten::BFloat16>::value ? 3.3895313892515355e38
                 : std::is_same<To, float>::value ? static_cast<double>(std::numeric_limits<float>::max())
                                                  : std::numeric_limits<double>::max();
    return v > top || v < -top;
  }
}

template <typename To, typename From>
std::optional<To> check_overflow_cast(From in) {
  if (overflows<To, From>(in)) return std::nullopt;
  return static_cast<To>(in);
}

// The scalar as To, or nullopt when its value does not fit.
template <typename To>
std::optional<To> check_overflow_scalar_cast(const Scalar& in) {
  if (in.isBoolean()) return check_overflow_cast<To>(in.to<int64_t>() != 0);
  if (in.isFloatingPoint()) return check_overflow_cast<To>(in.to<double>());
  return check_overflow_cast<To>(in.to<int64_t>());
}

}  // namespace internal

}  // namespace utils
}  // namespace native
}  // namespace executor
}  // namespace torch

#define ET_EXTRACT_SCALAR(scalar, out_val) \
  ET_CHECK_MSG(::torch::executor::native::utils::extract_scalar(scalar, &out_val), \
               #scalar " could not be extracted: wrong type or out of range")
