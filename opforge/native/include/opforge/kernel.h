// opforge kernel authoring API (C++17), a thin typed layer over opforge/kernel_abi.h.
//
// A kernel is a plain function in the `native` sub-namespace of the manifest's
// kernel_name, taking the out overload's arguments in schema order, with or without a
// leading KernelContext&:
//
//   namespace custom { namespace native {
//   opforge::Tensor& mul3_out_impl(opforge::KernelContext& ctx,
//                                  const opforge::Tensor& input, opforge::Tensor& output);
//   }}
//
// Everything here is a non-owning view: no allocation, no exceptions thrown by opforge,
// no abort. Report failure with ctx.fail("...") and return.
#ifndef OPFORGE_KERNEL_H
#define OPFORGE_KERNEL_H

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string_view>
#include <tuple>

#include "opforge/kernel_abi.h"

namespace opforge {

// c10::ScalarType numbering (the same numbers the program file and the runtime use).
enum class ScalarType : int32_t {
  Byte = 0, Char = 1, Short = 2, Int = 3, Long = 4, Half = 5, Float = 6, Double = 7,
  ComplexHalf = 8, ComplexFloat = 9, ComplexDouble = 10, Bool = 11, BFloat16 = 15,
  UInt16 = 27, UInt32 = 28, UInt64 = 29,
};

// Why a kernel failed (ExecuTorch's error codes and numbering, so that an ExecuTorch
// kernel's ctx.fail(Error::InvalidArgument) works unchanged). The code becomes the call's
// status; fail(const char*, ...) reports Internal.
enum class Error : uint32_t {
  Ok = 0x00, Internal = 0x01, InvalidState = 0x02, EndOfMethod = 0x03, AlreadyLoaded = 0x04,
  NotSupported = 0x10, NotImplemented = 0x11, InvalidArgument = 0x12, InvalidType = 0x13,
  OperatorMissing = 0x14, NotFound = 0x20, MemoryAllocationFailed = 0x21, AccessFailed = 0x22,
  InvalidProgram = 0x23, OutOfResources = 0x25,
};

inline const char* to_string(Error e) {
  switch (e) {
    case Error::Ok: return "Error::Ok";
    case Error::Internal: return "Error::Internal";
    case Error::InvalidState: return "Error::InvalidState";
    case Error::EndOfMethod: return "Error::EndOfMethod";
    case Error::AlreadyLoaded: return "Error::AlreadyLoaded";
    case Error::NotSupported: return "Error::NotSupported";
    case Error::NotImplemented: return "Error::NotImplemented";
    case Error::InvalidArgument: return "Error::InvalidArgument";
    case Error::InvalidType: return "Error::InvalidType";
    case Error::OperatorMissing: return "Error::OperatorMissing";
    case Error::NotFound: return "Error::NotFound";
    case Error::MemoryAllocationFailed: return "Error::MemoryAllocationFailed";
    case Error::AccessFailed: return "Error::AccessFailed";
    case Error::InvalidProgram: return "Error::InvalidProgram";
    case Error::OutOfResources: return "Error::OutOfResources";
  }
  return "Error::<unknown>";
}

template <class T>
using optional = std::optional<T>;
using std::nullopt;
using string_view = std::string_view;

// A read-only view of `size` contiguous T (torch's c10::ArrayRef).
template <class T>
class ArrayRef {
 public:
  constexpr ArrayRef() = default;
  constexpr ArrayRef(const T* data, size_t size) : data_(data), size_(size) {}
  constexpr const T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr const T* begin() const { return data_; }
  constexpr const T* end() const { return data_ + size_; }
  constexpr const T& operator[](size_t i) const { return data_[i]; }
  constexpr const T& front() const { return data_[0]; }
  constexpr const T& back() const { return data_[size_ - 1]; }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};
using IntArrayRef = ArrayRef<int64_t>;

// A tensor view: the runtime's opforge_tensor, wrapped (same layout, so an array of
// opforge_tensor is an array of Tensor). Like at::Tensor, a const Tensor& still gives
// mutable data: constness is the view's, not the elements'.
class Tensor {
 public:
  using SizesType = int64_t;  // ExecuTorch's names for the element types of the views
  using StridesType = int64_t;
  using DimOrderType = uint8_t;

  Tensor() : raw_{nullptr, nullptr, nullptr, 0, 0} {}
  explicit Tensor(const opforge_tensor& raw) : raw_(raw) {}
  IntArrayRef sizes() const { return IntArrayRef(raw_.sizes, static_cast<size_t>(raw_.rank)); }
  IntArrayRef strides() const { return IntArrayRef(raw_.strides, static_cast<size_t>(raw_.rank)); }
  int64_t dim() const { return raw_.rank; }
  // size(i) and stride(i) accept negative dims like PyTorch (-1 is the last one).
  int64_t size(int64_t i) const { return raw_.sizes[i < 0 ? i + raw_.rank : i]; }
  int64_t stride(int64_t i) const { return raw_.strides[i < 0 ? i + raw_.rank : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t i = 0; i < raw_.rank; ++i) n *= raw_.sizes[i];
    return n;
  }
  ScalarType scalar_type() const { return static_cast<ScalarType>(raw_.dtype); }
  ScalarType dtype() const { return scalar_type(); }
  size_t element_size() const;  // bytes per element (below, after element_size(ScalarType))
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const {  // as PyTorch: an empty tensor is contiguous
    if (numel() == 0) return true;
    int64_t expected = 1;
    for (int32_t i = raw_.rank - 1; i >= 0; --i) {
      if (raw_.sizes[i] != 1 && raw_.strides[i] != expected) return false;
      expected *= raw_.sizes[i];
    }
    return true;
  }
  template <class T> T* data_ptr() const { return static_cast<T*>(raw_.data); }
  template <class T> T* mutable_data_ptr() const { return static_cast<T*>(raw_.data); }
  template <class T> const T* const_data_ptr() const { return static_cast<const T*>(raw_.data); }
  void* mutable_data_ptr() const { return raw_.data; }
  const void* const_data_ptr() const { return raw_.data; }
  const opforge_tensor& raw() const { return raw_; }

  // A view of an argument's tensor, without copying it.
  static const Tensor& wrap(const opforge_tensor& raw) { return reinterpret_cast<const Tensor&>(raw); }
  static Tensor& wrap(opforge_tensor& raw) { return reinterpret_cast<Tensor&>(raw); }

 private:
  opforge_tensor raw_;
};
static_assert(sizeof(Tensor) == sizeof(opforge_tensor), "Tensor must wrap opforge_tensor exactly");
using TensorList = ArrayRef<Tensor>;

// A schema `Scalar`: an int64, a double or a bool.
class Scalar {
 public:
  enum class Kind { Int, Double, Bool };
  Scalar() = default;
  explicit Scalar(int64_t v) : kind_(Kind::Int), i_(v) {}
  explicit Scalar(double v) : kind_(Kind::Double), d_(v) {}
  explicit Scalar(bool v) : kind_(Kind::Bool), i_(v ? 1 : 0) {}
  Kind kind() const { return kind_; }
  bool isIntegral() const { return kind_ == Kind::Int; }
  bool isIntegral(bool include_bool) const { return isIntegral() || (include_bool && isBoolean()); }
  bool isFloatingPoint() const { return kind_ == Kind::Double; }
  bool isBoolean() const { return kind_ == Kind::Bool; }
  template <class T> T to() const {
    return kind_ == Kind::Double ? static_cast<T>(d_) : static_cast<T>(i_);
  }

 private:
  Kind kind_ = Kind::Int;
  int64_t i_ = 0;
  double d_ = 0.0;
};

// How a kernel reports failure. fail() records a printf-style message and marks the call
// failed; it never aborts or throws. The kernel should return right after it.
// fail(Error) and failure_state() are ExecuTorch's KernelRuntimeContext interface (which
// is this class in opforge's ExecuTorch headers): fail(Error::X) keeps a message already
// recorded in this call, else records "kernel failed with Error::X".
class KernelContext {
 public:
  explicit KernelContext(opforge_context* raw) : raw_(raw) {}
  void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    raw_->status = 1;
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(raw_->message, OPFORGE_MESSAGE_SIZE, fmt, args);
    va_end(args);
  }
  void fail(Error error) {
    if (error == Error::Ok) {
      raw_->status = 0;
      return;
    }
    if (raw_->status == 0) std::snprintf(raw_->message, OPFORGE_MESSAGE_SIZE, "kernel failed with %s", to_string(error));
    raw_->status = static_cast<int32_t>(error);
  }
  bool failed() const { return raw_->status != 0; }
  Error failure_state() const { return static_cast<Error>(raw_->status); }
  opforge_context* raw() const { return raw_; }

 private:
  opforge_context* raw_;
};

// Calls f(index) for every multi-index of `sizes` in row-major order (index points to
// sizes.size() int64 values). Nothing is called for a zero-size shape; a 0-d shape gets
// one call. Rank is limited to 64.
template <class F>
inline void for_each_index(IntArrayRef sizes, F&& f) {
  int64_t index[64] = {0};
  const int64_t rank = static_cast<int64_t>(sizes.size());
  for (int64_t d = 0; d < rank; ++d)
    if (sizes[d] == 0) return;
  while (true) {
    f(static_cast<const int64_t*>(index));
    int64_t d = rank - 1;
    for (; d >= 0; --d) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// The element offset of a multi-index in a strided tensor.
inline int64_t offset_of(const Tensor& t, const int64_t* index) {
  int64_t offset = 0;
  for (int64_t d = 0; d < t.dim(); ++d) offset += index[d] * t.stride(d);
  return offset;
}

// Both tensors have the same sizes (dims compared one by one).
inline bool same_sizes(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != b.size(d)) return false;
  return true;
}

// Bytes per element of a dtype (0 for dtypes the ABI does not name).
inline size_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::Byte: case ScalarType::Char: case ScalarType::Bool: return 1;
    case ScalarType::Short: case ScalarType::Half: case ScalarType::BFloat16:
    case ScalarType::UInt16: return 2;
    case ScalarType::Int: case ScalarType::Float: case ScalarType::UInt32: return 4;
    case ScalarType::Long: case ScalarType::Double: case ScalarType::UInt64:
    case ScalarType::ComplexFloat: return 8;
    case ScalarType::ComplexHalf: return 4;
    case ScalarType::ComplexDouble: return 16;
  }
  return 0;
}
inline size_t Tensor::element_size() const { return ::opforge::element_size(scalar_type()); }

// The name of a dtype, for messages ("Float", "Long", ...).
inline const char* to_string(ScalarType t) {
  switch (t) {
    case ScalarType::Byte: return "Byte";
    case ScalarType::Char: return "Char";
    case ScalarType::Short: return "Short";
    case ScalarType::Int: return "Int";
    case ScalarType::Long: return "Long";
    case ScalarType::Half: return "Half";
    case ScalarType::Float: return "Float";
    case ScalarType::Double: return "Double";
    case ScalarType::Bool: return "Bool";
    case ScalarType::BFloat16: return "BFloat16";
    default: return "other";
  }
}

}  // namespace opforge

// Fails the kernel with a message and returns `ret` when `cond` is false:
//   OPFORGE_CHECK(ctx, in.numel() == out.numel(), out, "size mismatch: %lld", (long long)n);
#define OPFORGE_CHECK(ctx, cond, ret, ...) \
  do {                                     \
    if (!(cond)) {                         \
      (ctx).fail(__VA_ARGS__);             \
      return ret;                          \
    }                                      \
  } while (0)

// Runs `body` with `scalar_t` bound to the C++ type of `dtype` (float, double, int32_t,
// int64_t, int8_t, uint8_t, int16_t, bool); fails the kernel for any other dtype.
#define OPFORGE_SWITCH_REAL_TYPES(ctx, dtype, name, ...)                                   \
  do {                                                                                   \
    switch (dtype) {                                                                     \
      case ::opforge::ScalarType::Float: { using scalar_t = float; __VA_ARGS__; break; }  \
      case ::opforge::ScalarType::Double: { using scalar_t = double; __VA_ARGS__; break; }\
      case ::opforge::ScalarType::Int: { using scalar_t = int32_t; __VA_ARGS__; break; }  \
      case ::opforge::ScalarType::Long: { using scalar_t = int64_t; __VA_ARGS__; break; } \
      case ::opforge::ScalarType::Char: { using scalar_t = int8_t; __VA_ARGS__; break; }  \
      case ::opforge::ScalarType::Byte: { using scalar_t = uint8_t; __VA_ARGS__; break; } \
      case ::opforge::ScalarType::Short: { using scalar_t = int16_t; __VA_ARGS__; break; }\
      default:                                                                           \
        (ctx).fail("%s: unsupported dtype %s", name, ::opforge::to_string(dtype));       \
    }                                                                                    \
  } while (0)

#endif  // OPFORGE_KERNEL_H
