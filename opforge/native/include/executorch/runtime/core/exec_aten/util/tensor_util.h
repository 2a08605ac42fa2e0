// opforge's ExecuTorch compatibility headers: ET_KERNEL_CHECK, tensor checks, resize_tensor.
//
// ET_KERNEL_CHECK(_MSG) fail the context (the message names the file, line and condition,
// plus why a helper the condition called failed, e.g. resize_tensor's shapes) and return.
// Tensors are static in opforge (shapes are planned ahead of time), as ExecuTorch's
// TensorShapeDynamism::STATIC: resize_tensor to a tensor's current shape is Error::Ok,
// to any other shape Error::NotSupported.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "executorch/runtime/core/error.h"
#include "executorch/runtime/core/exec_aten/exec_aten.h"
#include "executorch/runtime/core/exec_aten/util/scalar_type_util.h"
#include "executorch/runtime/platform/assert.h"
#include "executorch/runtime/platform/log.h"

namespace opforge {
namespace et {

inline void append(char* buffer, size_t size, int& used, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
inline void append(char* buffer, size_t size, int& used, const char* fmt, ...) {
  if (used < 0 || static_cast<size_t>(used) >= size) return;
  va_list args;
  va_start(args, fmt);
  int n = std::vsnprintf(buffer + used, size - used, fmt, args);
  va_end(args);
  if (n > 0) used += n;
}

// "(2, 3)", "(3,)", "()" into buffer.
template <class T>
inline void format_shape(char* buffer, size_t size, const T* sizes, size_t rank) {
  int used = 0;
  append(buffer, size, used, "(");
  for (size_t i = 0; i < rank; ++i)
    append(buffer, size, used, i ? ", %lld" : "%lld", static_cast<long long>(sizes[i]));
  append(buffer, size, used, rank == 1 ? ",)" : ")");
}

// Fails ctx with "file:line: check failed (cond)[: message][ — detail]" and `error`.
inline void kernel_check_failed_v(::opforge::KernelContext& ctx, const char* file, int line,
                                  const char* cond, Error error, const char* fmt,
                                  va_list* args) {
  char text[OPFORGE_MESSAGE_SIZE];
  int used = 0;
  append(text, sizeof text, used, "%s:%d: check failed (%s)", basename_of(file), line, cond);
  if (fmt != nullptr && static_cast<size_t>(used) + 2 < sizeof text) {
    append(text, sizeof text, used, ": ");
    int n = std::vsnprintf(text + used, sizeof text - used, fmt, *args);
    if (n > 0) used += n;
  }
  if (failure_detail()[0] != '\0') append(text, sizeof text, used, " — %s", failure_detail());
  failure_detail()[0] = '\0';
  ctx.fail("%s", text);
  ctx.fail(error);
}

inline void kernel_check_failed(::opforge::KernelContext& ctx, const char* file, int line,
                                const char* cond, Error error, const char* fmt, ...)
    __attribute__((format(printf, 6, 7)));
inline void kernel_check_failed(::opforge::KernelContext& ctx, const char* file, int line,
                                const char* cond, Error error, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  kernel_check_failed_v(ctx, file, line, cond, error, fmt, &args);
  va_end(args);
}

inline void kernel_check_failed(::opforge::KernelContext& ctx, const char* file, int line,
                                const char* cond, Error error) {
  kernel_check_failed_v(ctx, file, line, cond, error, nullptr, nullptr);
}

}  // namespace et
}  // namespace opforge

namespace executorch {
namespace runtime {

using ::executorch::aten::ArrayRef;
using ::executorch::aten::SizesType;
using ::executorch::aten::Tensor;

constexpr size_t kTensorDimensionLimit = 16;

// Tensors are static: resizing to the current shape succeeds, anything else is refused
// (the reason goes to the next failing ET_KERNEL_CHECK's message).
ET_NODISCARD inline Error resize_tensor(const Tensor& t, ArrayRef<SizesType> new_sizes) {
  bool same = new_sizes.size() == static_cast<size_t>(t.dim());
  for (size_t i = 0; same && i < new_sizes.size(); ++i) same = new_sizes[i] == t.size(i);
  if (same) return Error::Ok;
  char planned[256], wanted[256];
  ::opforge::et::format_shape(planned, sizeof planned, t.sizes().data(), t.sizes().size());
  ::opforge::et::format_shape(wanted, sizeof wanted, new_sizes.data(), new_sizes.size());
  ::opforge::et::set_failure_detail(
      "resize_tensor: the kernel resizes a tensor of planned shape %s to %s; opforge's tensors "
      "have static shapes, planned ahead of time from the op's fake (shape) function: give "
      "the op's manifest entry a `fake:` that computes this shape, or pass an out of it",
      planned, wanted);
  return Error::NotSupported;
}

template <class T, class = std::enable_if_t<std::is_integral<T>::value &&
                                            !std::is_same<T, SizesType>::value>>
ET_NODISCARD inline Error resize_tensor(const Tensor& t, ArrayRef<T> new_sizes) {
  SizesType sizes[kTensorDimensionLimit];
  ET_CHECK_OR_RETURN_ERROR(new_sizes.size() <= kTensorDimensionLimit, InvalidArgument,
                           "resize_tensor: rank %zu over the limit %zu", new_sizes.size(),
                           kTensorDimensionLimit);
  for (size_t i = 0; i < new_sizes.size(); ++i) sizes[i] = static_cast<SizesType>(new_sizes[i]);
  return resize_tensor(t, ArrayRef<SizesType>(sizes, new_sizes.size()));
}

ET_NODISCARD inline Error resize_tensor(const Tensor& t, std::initializer_list<SizesType> new_sizes) {
  return resize_tensor(t, ArrayRef<SizesType>(new_sizes.begin(), new_sizes.size()));
}

inline bool tensors_have_same_dtype(const Tensor& a, const Tensor& b) {
  if (a.scalar_type() == b.scalar_type()) return true;
  ::opforge::et::set_failure_detail("dtypes differ: %s and %s", toString(a.scalar_type()),
                                    toString(b.scalar_type()));
  return false;
}
inline bool tensors_have_same_dtype(const Tensor& a, const Tensor& b, const Tensor& c) {
  return tensors_have_same_dtype(a, b) && tensors_have_same_dtype(b, c);
}
inline bool tensors_have_same_shape(const Tensor& a, const Tensor& b) {
  if (::opforge::same_sizes(a, b)) return true;
  char sa[256], sb[256];
  ::opforge::et::format_shape(sa, sizeof sa, a.sizes().data(), a.sizes().size());
  ::opforge::et::format_shape(sb, sizeof sb, b.sizes().data(), b.sizes().size());
  ::opforge::et::set_failure_detail("shapes differ: %s and %s", sa, sb);
  return false;
}
inline bool tensors_have_same_shape(const Tensor& a, const Tensor& b, const Tensor& c) {
  return tensors_have_same_shape(a, b) && tensors_have_same_shape(b, c);
}
inline bool tensors_have_same_shape_and_dtype(const Tensor& a, const Tensor& b) {
  return tensors_have_same_shape(a, b) && tensors_have_same_dtype(a, b);
}
inline bool tensors_have_same_shape_and_dtype(const Tensor& a, const Tensor& b, const Tensor& c) {
  return tensors_have_same_shape_and_dtype(a, b) && tensors_have_same_shape_and_dtype(b, c);
}
inline bool tensor_is_scalar(const Tensor& t) { return t.dim() == 0 && t.numel() == 1; }

namespace internal {
template <typename T>
constexpr long double largest() {
  return std::is_same<T, ::executorch::aten::Half>::value       ? 65504.0L
         : std::is_same<T, ::executorch::aten::BFloat16>::value ? 3.3895313892515355e38L
                                                                 : static_cast<long double>(std::numeric_limits<T>::max());
}
template <typename T>
constexpr long double smallest() {
  return std::is_integral<T>::value ? static_cast<long double>(std::numeric_limits<T>::lowest())
                                    : -largest<T>();
}
// *out = value when T holds it (infinities and NaN pass to a floating T).
template <typename T, typename V>
bool store_in_range(V value, T* out) {
  const long double v = static_cast<long double>(static_cast<double>(value));
  const long double exact = std::is_integral<V>::value ? static_cast<long double>(value) : v;
  const bool finite = exact - exact == 0;
  if ((std::is_integral<T>::value || finite) && (exact < smallest<T>() || exact > largest<T>()))
    return false;
  if constexpr (std::is_integral<T>::value && std::is_integral<V>::value) {
    *out = static_cast<T>(value);
  } else {
    *out = static_cast<T>(static_cast<double>(value));
  }
  return true;
}
}  // namespace internal

// The one element of a tensor as T: false when the tensor has another number of elements,
// a dtype T does not take (an integral T takes integer tensors, a floating T real ones,
// bool only Bool) or a value out of T's range.
template <typename T>
bool extract_scalar_tensor(const Tensor& tensor, T* out_val) {
  if (tensor.numel() != 1) return false;
  const ScalarType t = tensor.scalar_type();
  if (std::is_same<T, bool>::value) {
    if (t != ScalarType::Bool) return false;
    *out_val = static_cast<T>(tensor.const_data_ptr<bool>()[0]);
    return true;
  }
  if (!(isIntegralType(t, false) || (!std::is_integral<T>::value && isFloatingType(t))))
    return false;
  switch (t) {
#define OPFORGE_ET_EXTRACT(ctype, name) \
    case ScalarType::name: return internal::store_in_range(tensor.const_data_ptr<ctype>()[0], out_val);
    OPFORGE_ET_EXTRACT(uint8_t, Byte)
    OPFORGE_ET_EXTRACT(int8_t, Char)
    OPFORGE_ET_EXTRACT(int16_t, Short)
    OPFORGE_ET_EXTRACT(int32_t, Int)
    OPFORGE_ET_EXTRACT(int64_t, Long)
    OPFORGE_ET_EXTRACT(uint16_t, UInt16)
    OPFORGE_ET_EXTRACT(uint32_t, UInt32)
    OPFORGE_ET_EXTRACT(uint64_t, UInt64)
    OPFORGE_ET_EXTRACT(float, Float)
    OPFORGE_ET_EXTRACT(double, Double)
    OPFORGE_ET_EXTRACT(::executorch::aten::Half, Half)
    OPFORGE_ET_EXTRACT(::executorch::aten::BFloat16, BFloat16)
#undef OPFORGE_ET_EXTRACT
    default: return false;
  }
}

inline bool tensor_is_real_type(const Tensor& t) { return isRealType(t.scalar_type()); }
inline bool tensor_is_realh_type(const Tensor& t) { return isRealHType(t.scalar_type()); }
inline bool tensor_is_realhbf16_type(const Tensor& t) { return isRealHBF16Type(t.scalar_type()); }
inline bool tensor_is_realhbbf16_type(const Tensor& t) { return isRealHBBF16Type(t.scalar_type()); }
inline bool tensor_is_floating_type(const Tensor& t) { return isFloatingType(t.scalar_type()); }
inline bool tensor_is_integral_type(const Tensor& t, bool include_bool = false) {
  return isIntegralType(t.scalar_type(), include_bool);
}
inline bool tensor_is_contiguous(const Tensor& t) { return t.is_contiguous(); }

// ExecuTorch's tensors are always dense, in a dim order (row-major, or channels-last for
// 4-d); its kernels check tensors_have_same_dim_order and then walk memory linearly.
// opforge's views carry strides and may be sliced, expanded or transposed, so here a dim
// order exists only for a dense view: a view in neither order fails these checks, and a
// kernel that makes them refuses it instead of reading the wrong elements.
inline bool tensor_is_default_dim_order(const Tensor& t) { return t.is_contiguous(); }
inline bool tensor_is_channels_last_dim_order(const Tensor& t) {
  if (t.dim() != 4) return false;
  if (t.numel() == 0) return true;
  static const int order[4] = {0, 2, 3, 1};  // outermost first
  int64_t expected = 1;
  for (int k = 3; k >= 0; --k) {
    const int d = order[k];
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}
inline bool tensors_have_same_dim_order(const Tensor& a, const Tensor& b) {
  return (tensor_is_default_dim_order(a) && tensor_is_default_dim_order(b)) ||
         (tensor_is_channels_last_dim_order(a) && tensor_is_channels_last_dim_order(b));
}
inline bool tensors_have_same_dim_order(const Tensor& a, const Tensor& b, const Tensor& c) {
  return (tensor_is_default_dim_order(a) && tensor_is_default_dim_order(b) &&
          tensor_is_default_dim_order(c)) ||
         (tensor_is_channels_last_dim_order(a) && tensor_is_channels_last_dim_order(b) &&
          tensor_is_channels_last_dim_order(c));
}
inline bool tensor_has_dim(const Tensor& t, int64_t d) {
  const int64_t rank = t.dim() > 0 ? t.dim() : 1;
  return d >= -rank && d < rank;
}
inline int64_t nonzero_dim(const Tensor& t) { return t.dim() == 0 ? 1 : t.dim(); }
inline int64_t nonempty_size(const Tensor& t, int64_t d) { return t.dim() == 0 ? 1 : t.size(d); }
inline size_t getLeadingDims(const Tensor& t, int64_t d) {
  size_t n = 1;
  for (int64_t i = 0; i < d; ++i) n *= static_cast<size_t>(t.size(i));
  return n;
}
inline size_t getTrailingDims(const Tensor& t, int64_t d) {
  size_t n = 1;
  for (int64_t i = d + 1; i < t.dim(); ++i) n *= static_cast<size_t>(t.size(i));
  return n;
}

}  // namespace runtime
}  // namespace executorch

namespace torch {
namespace executor {
using ::executorch::runtime::extract_scalar_tensor;
using ::executorch::runtime::getLeadingDims;
using ::executorch::runtime::getTrailingDims;
using ::executorch::runtime::kTensorDimensionLimit;
using ::executorch::runtime::nonempty_size;
using ::executorch::runtime::nonzero_dim;
using ::executorch::runtime::resize_tensor;
using ::executorch::runtime::tensor_has_dim;
using ::executorch::runtime::tensor_is_channels_last_dim_order;
using ::executorch::runtime::tensor_is_contiguous;
using ::executorch::runtime::tensor_is_default_dim_order;
using ::executorch::runtime::tensor_is_floating_type;
using ::executorch::runtime::tensor_is_integral_type;
using ::executorch::runtime::tensor_is_real_type;
using ::executorch::runtime::tensor_is_realh_type;
using ::executorch::runtime::tensor_is_realhbbf16_type;
using ::executorch::runtime::tensor_is_realhbf16_type;
using ::executorch::runtime::tensor_is_scalar;
using ::executorch::runtime::tensors_have_same_dim_order;
using ::executorch::runtime::tensors_have_same_dtype;
using ::executorch::runtime::tensors_have_same_shape;
using ::executorch::runtime::tensors_have_same_shape_and_dtype;
}  // namespace executor
}  // namespace torch

// Fails the kernel with Error::<error> and returns `retval` when `cond` is false. The
// failure detail is cleared first, so the message only names helpers `cond` called.
#define ET_KERNEL_CHECK(context, cond, error, retval)                                     \
  do {                                                                                    \
    ::opforge::et::failure_detail()[0] = '\0';                                            \
    if (!(cond)) {                                                                        \
      ::opforge::et::kernel_check_failed(context, __FILE__, __LINE__, #cond,              \
                                         ::executorch::runtime::Error::error);            \
      return retval;                                                                      \
    }                                                                                     \
  } while (false)

#define ET_KERNEL_CHECK_MSG(context, cond, error, retval, message, ...)                   \
  do {                                                                                    \
    ::opforge::et::failure_detail()[0] = '\0';                                            \
    if (!(cond)) {                                                                        \
      ::opforge::et::kernel_check_failed(context, __FILE__, __LINE__, #cond,              \
                                         ::executorch::runtime::Error::error, message,    \
                                         ##__VA_ARGS__);                                  \
      return retval;                                                                      \
    }                                                                                     \
  } while (false)

// In helpers returning bool: record why (for the next failing ET_KERNEL_CHECK) and
// return false.
#define ET_LOG_AND_RETURN_IF_FALSE(cond)                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      if (::opforge::et::failure_detail()[0] == '\0')                                     \
        ::opforge::et::set_failure_detail("%s:%d: (%s) is false",                         \
                                          ::opforge::et::basename_of(__FILE__), __LINE__, \
                                          #cond);                                         \
      return false;                                                                       \
    }                                                                                     \
  } while (false)

#define ET_LOG_MSG_AND_RETURN_IF_FALSE(cond, message, ...)                                \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::opforge::et::set_failure_detail("%s:%d: (%s) is false: " message,                 \
                                        ::opforge::et::basename_of(__FILE__), __LINE__,   \
                                        #cond, ##__VA_ARGS__);                            \
      return false;                                                                       \
    }                                                                                     \
  } while (false)

// The one element of `scalar_tensor` into out_val, or an ET_CHECK failure.
#define ET_EXTRACT_SCALAR_TENSOR(scalar_tensor, out_val)                 \
  ET_CHECK_MSG(::executorch::runtime::extract_scalar_tensor(scalar_tensor, &out_val), \
               #scalar_tensor " could not be extracted: wrong type or out of range")
