// What every kernel family needs to read its arguments: a tensor view with checked sizes,
// dtype dispatch, checked int64 arithmetic and broadcasting. Argument access validates
// the tag (a program's arguments are untrusted until the kernel has checked them).
#pragma once

#include <cstdint>
#include <cstring>

#include "portable.h"

namespace opforge::portable {

constexpr int kMaxRank = 64;

// c10::ScalarType numbers the kernels use by name.
enum Dtype : int32_t {
  kUInt8 = 0, kInt8 = 1, kInt16 = 2, kInt32 = 3, kInt64 = 4, kFloat16 = 5, kFloat32 = 6,
  kFloat64 = 7, kBool = 11, kBFloat16 = 15, kUInt16 = 27, kUInt32 = 28, kUInt64 = 29,
};

inline bool is_floating(int32_t d) { return d == kFloat16 || d == kFloat32 || d == kFloat64 || d == kBFloat16; }
inline bool is_integral(int32_t d, bool include_bool) {
  return d == kUInt8 || d == kInt8 || d == kInt16 || d == kInt32 || d == kInt64 ||
         d == kUInt16 || d == kUInt32 || d == kUInt64 || (include_bool && d == kBool);
}
const char* dtype_name(int32_t d);  // "float32", ... ("dtype 99" for an unknown one)

// Checked arithmetic: false on overflow (the kernel then refuses its arguments).
inline bool mul_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool add_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

// A tensor argument, checked: rank in [0, 64], sizes >= 0, numel and its byte span fit
// int64, strides in elements. `dense` says whether it is contiguous in row-major order
// (the runtime hands kernels dense tensors in their dim order; a kernel that needs
// row-major checks `dense`).
struct View {
  const opforge_tensor* t = nullptr;
  char* data = nullptr;
  int32_t dtype = -1;
  int rank = 0;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;
  int64_t numel = 1;
  bool dense = true;

  int64_t size(int d) const { return sizes[d]; }
  template <typename T> T* ptr() const { return reinterpret_cast<T*>(data); }
};

// Read argument `i` as a tensor into `v`; false (ctx failed with a message naming `op`
// and `what`) when it is not a well-formed tensor. Optional tensors: `present` gets
// whether one was given (a NONE tag), and a missing one is not an error.
bool tensor_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, View* v);
bool optional_tensor_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                         const char* op, const char* what, View* v, bool* present);
// Scalars: an INT, DOUBLE or BOOL argument as double / int64 (a Scalar's value).
bool scalar_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, double* d, int64_t* iv, bool* is_integral_value);
bool int_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
             const char* op, const char* what, int64_t* out);
bool double_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, double* out);
bool bool_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
              const char* op, const char* what, bool* out);
// An int list (IL) as pointer + count; IL? may be NONE (count -1).
bool int_list_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                  const char* op, const char* what, const int64_t** data, int64_t* count);
bool is_none(const opforge_arg* args, int64_t n, int64_t i);

// The broadcast shape of a and b (ATen's rules) into out/out_rank; false if they do not
// broadcast (ctx failed, naming op).
bool broadcast_shape(opforge_context* ctx, const char* op, const View& a, const View& b,
                     int64_t* out, int* out_rank);
// Does `out` have exactly these sizes? (else ctx failed naming op and both shapes)
bool check_shape(opforge_context* ctx, const char* op, const View& out, const int64_t* sizes, int rank);
// Normalise dim into [0, rank) as ATen does (rank 0 accepts -1 and 0); false if out of range.
bool wrap_dim(opforge_context* ctx, const char* op, int64_t dim, int rank, int64_t* out);

// Call f(T{}) with T the C++ type of dtype (bool, uint8_t, ..., float, double; float16
// and bfloat16 are not dispatched here: kernels that take them convert explicitly).
// Returns false for a dtype outside the list.
template <typename F>
bool dispatch_real(int32_t dtype, F&& f) {
  switch (dtype) {
    case kBool: f(bool{}); return true;
    case kUInt8: f(uint8_t{}); return true;
    case kInt8: f(int8_t{}); return true;
    case kInt16: f(int16_t{}); return true;
    case kInt32: f(int32_t{}); return true;
    case kInt64: f(int64_t{}); return true;
    case kUInt16: f(uint16_t{}); return true;
    case kUInt32: f(uint32_t{}); return true;
    case kUInt64: f(uint64_t{}); return true;
    case kFloat32: f(float{}); return true;
    case kFloat64: f(double{}); return true;
    default: return false;
  }
}

}  // namespace opforge::portable
