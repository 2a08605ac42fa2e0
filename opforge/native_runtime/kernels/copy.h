// The strided copy every copy-shaped kernel is made of (view copies, cat, split, indexing,
// padding), with dtype conversion as NumPy's unsafe casting does it, and the float16 /
// bfloat16 conversions they need.
//
// A copy is described by its sizes and two stride lists in elements (any sign; a 0 stride
// on the source broadcasts). Dimensions of size 1 are dropped, dimensions are ordered by
// the destination's strides and merged wherever both operands are contiguous across them,
// and a run that is contiguous in both goes through memcpy: a contiguous source copies at
// memcpy speed, a permuted one walks its innermost dimension with a typed loop (a 2-d
// transpose in cache-sized tiles).
#pragma once

#include <cstdint>

#include "tensor.h"

namespace opforge::portable {

// Up to this many dimensions in one copy (repeat and pixel_shuffle split every dim in two).
constexpr int kMaxCopyRank = 2 * kMaxRank;

uint16_t float_to_half(float f);      // round to nearest even, as NumPy
uint16_t double_to_half(double d);    // one rounding (not through float)
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

// Copy `rank` dims of `sizes` elements of `itemsize` bytes from src to dst.
void copy_strided(char* dst, const int64_t* dst_strides, const char* src,
                  const int64_t* src_strides, const int64_t* sizes, int rank, int64_t itemsize);

// Is `dtype` one the conversions handle (every real dtype, float16 and bfloat16)?
bool convertible(int32_t dtype);

// Copy with conversion from src_dtype to dst_dtype (NumPy's casting="unsafe": floats to
// integers truncate, out-of-range and NaN give what x86's truncating conversion gives);
// equal dtypes copy bytes. Both dtypes must be convertible().
void convert_strided(char* dst, int32_t dst_dtype, const int64_t* dst_strides, const char* src,
                     int32_t src_dtype, const int64_t* src_strides, const int64_t* sizes, int rank);

// Copy `src` (any strides) into `dst` of the same sizes, converting dtypes: false (ctx
// failed naming op) for a dtype no conversion handles.
bool copy_view(opforge_context* ctx, const char* op, const View& dst, const View& src);

// convert_strided after checking both dtypes (ctx failed naming op otherwise).
bool copy_checked(opforge_context* ctx, const char* op, char* dst, int32_t dst_dtype,
                  const int64_t* dst_strides, const char* src, int32_t src_dtype,
                  const int64_t* src_strides, const int64_t* sizes, int rank);

// Fill every element of `out` with a scalar (an int64 when integral, else a double),
// cast to out's dtype as NumPy's fill does.
bool fill_scalar(opforge_context* ctx, const char* op, const View& out, double d, int64_t i,
                 bool integral);

// One element as a double (any convertible dtype), and a double stored into one element
// with NumPy's unsafe cast (what convert_strided does to a float64 source).
double load_double(const char* p, int32_t dtype);
void store_double(char* p, int32_t dtype, double v);
// One element as int64: integers exactly (uint64 wraps), floats truncated.
int64_t load_int64(const char* p, int32_t dtype);
// A scalar (int64 when integral, else double) stored into one element of dtype.
void store_scalar(char* p, int32_t dtype, double d, int64_t i, bool integral);

// Visit every element of a and b (equal sizes) in row-major order:
// f(pointer into a, pointer into b, coordinates).
template <typename F>
void for_each_element(const View& a, const View& b, F&& f) {
  if (a.numel == 0) return;
  int64_t idx[kMaxRank] = {};
  int64_t ia = itemsize(a.dtype), ib = itemsize(b.dtype);
  char* pa = a.data;
  char* pb = b.data;
  for (;;) {
    f(pa, pb, static_cast<const int64_t*>(idx));
    int k = a.rank - 1;
    for (; k >= 0; --k) {
      if (++idx[k] < a.sizes[k]) {
        pa += a.strides[k] * ia;
        pb += b.strides[k] * ib;
        break;
      }
      pa -= a.strides[k] * ia * (a.sizes[k] - 1);
      pb -= b.strides[k] * ib * (b.sizes[k] - 1);
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

// Strides reading `in` broadcast to `rank` dims of `sizes` (0 where it broadcasts); false
// (ctx failed naming op and what) when it does not broadcast.
bool broadcast_strides(opforge_context* ctx, const char* op, const char* what, const View& in,
                       const int64_t* sizes, int rank, int64_t* strides);

// Row-major (C-contiguous) strides of sizes.
void contiguous_strides(const int64_t* sizes, int rank, int64_t* strides);

// A tensor list argument (TL): its items; a TL? list marks absent items with dtype -1.
bool tensor_list_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                     const char* op, const char* what, const opforge_tensor** items,
                     int64_t* count);
// One item of a tensor list, checked as tensor_arg checks an argument.
bool list_item(opforge_context* ctx, const opforge_tensor& item, const char* op,
               const char* what, View* v);

// A read of an integer tensor element (int64, int32, int16, int8, uint8) as int64.
bool index_dtype(int32_t dtype);
inline int64_t read_index(const char* p, int32_t dtype) {
  switch (dtype) {
    case kInt64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    case kInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case kInt16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case kInt8: return static_cast<int8_t>(*p);
    default: return static_cast<uint8_t>(*p);
  }
}

}  // namespace opforge::portable

// Argument reads for a kernel body with (ctx, args, n) and a `kOp` name in scope: declare
// `view` / `value` and return from the kernel when the argument is malformed.
#define OPF_TENSOR(index, name, view)                                  \
  ::opforge::portable::View view;                                      \
  if (!::opforge::portable::tensor_arg(ctx, args, n, index, kOp, name, &view)) return
#define OPF_INT(index, name, value)                                    \
  int64_t value;                                                       \
  if (!::opforge::portable::int_arg(ctx, args, n, index, kOp, name, &value)) return
#define OPF_BOOL(index, name, value)                                   \
  bool value;                                                          \
  if (!::opforge::portable::bool_arg(ctx, args, n, index, kOp, name, &value)) return
#define OPF_INTS(index, name, data, count)                              \
  const int64_t* data;                                                 \
  int64_t count;                                                       \
  if (!::opforge::portable::int_list_arg(ctx, args, n, index, kOp, name, &data, &count)) return
