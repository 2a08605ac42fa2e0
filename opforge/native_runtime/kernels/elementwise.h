// The elementwise kernels' shared machinery: ATen type promotion (with wrapped-number
// scalars), conversions between dtypes as NumPy's unsafe casts do them, and one
// broadcasting loop that every elementwise family runs its per-element functor through.
//
// # Design
//
// A kernel computes in one compute type CT (the promoted dtype; float16 computes in float
// and rounds once into its out, as NumPy's float16 loops do) and writes an element type
// OT (CT, or bool for comparisons). `Loop` is built once per call: the out's shape,
// each operand's byte strides (0 along broadcast dimensions), with size-1 dimensions
// dropped and adjacent dimensions merged wherever every operand allows it, so dense
// same-shape operands become one flat row. `run` walks the rows; within a row an operand
// that already has type CT and unit stride is read in place, a broadcast one (stride 0)
// is converted once, and any other (another dtype, a strided view) is converted through a
// small stack buffer in blocks of kBlock elements; the out likewise. The row functor
// therefore only ever sees contiguous CT arrays or single CT values: simple loops the
// compiler vectorizes (`OPFORGE_HOT` adds AVX2/AVX-512 clones on x86-64, with the
// portable default kept for every other target).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "parallel.h"
#include "tensor.h"

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(OPFORGE_NO_TARGET_CLONES) && !defined(__SANITIZE_ADDRESS__)
#define OPFORGE_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OPFORGE_HOT
#endif

namespace opforge::portable {

// ---- float16 -----------------------------------------------------------------------

struct Half {
  uint16_t bits;
};

inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, NaN (payload kept)
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | ((man & 0x3ffu) << 13);
    }
  } else {
    bits = sign | (exp + 112) << 23 | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as NumPy's float -> float16 cast.
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf or NaN (a quiet NaN keeps the top payload bits)
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                         // below 2^-14: float16 subnormal or 0
    if (abs < 0x33000000u) return sign;            // below half the smallest subnormal
    uint32_t e = abs >> 23, man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24: value = man * 2^(e-150), unit 2^-24
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t q = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3ffu), rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // may carry into the exponent
  return sign | static_cast<uint16_t>(q);
}

// ---- conversions (NumPy's unsafe casts, made defined) -------------------------------

template <typename T> struct is_float_t : std::is_floating_point<T> {};

// A floating value into an integer type: in range truncates (C's rule); NaN and values
// out of range give the type's minimum through int64 (x86's conversion result), where C
// leaves them undefined.
template <typename To, typename From>
inline To float_to_int(From v) {
  if (std::is_same<To, uint64_t>::value) {
    if (v >= From(0) && v < From(18446744073709551616.0)) return static_cast<To>(v);
    if (v < From(0) && v > From(-9223372036854775808.0)) return static_cast<To>(static_cast<int64_t>(v));
    return static_cast<To>(uint64_t(1) << 63);
  }
  if (!(v >= From(-9223372036854775808.0) && v < From(9223372036854775808.0)))
    return static_cast<To>(std::numeric_limits<int64_t>::min());
  return static_cast<To>(static_cast<int64_t>(v));
}

template <typename To, typename From>
inline To cast(From v) {
  if constexpr (std::is_same<To, From>::value) {
    return v;
  } else if constexpr (std::is_same<To, bool>::value) {
    return v != From(0);
  } else if constexpr (is_float_t<From>::value && std::is_integral<To>::value) {
    return float_to_int<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// ---- scalars ------------------------------------------------------------------------

// A Scalar argument as the kernel received it (a Python bool, int or float).
struct Scalar {
  enum Kind { kBoolean, kInteger, kFloating } kind = kInteger;
  int64_t i = 0;
  double d = 0;
  int32_t dtype() const { return kind == kBoolean ? kBool : kind == kInteger ? kInt64 : kFloat32; }
  // The value converted to T as `np.asarray(value).astype(T)` does it (ints wrap).
  template <typename T> T as() const {
    if (kind == kFloating) return cast<T>(d);
    if (kind == kBoolean) return cast<T>(i != 0);
    return cast<T>(i);
  }
};

bool scalar_value(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                  const char* op, const char* what, Scalar* out);

// ---- promotion ----------------------------------------------------------------------

// One operand of ATen's result_type: a tensor with dimensions, a zero-dim tensor, or a
// wrapped scalar, each with its dtype.
enum Tier { kDimTensor = 0, kZeroDim = 1, kWrapped = 2 };
struct Operand {
  int32_t dtype;
  Tier tier;
};
inline Operand operand(const View& v) { return {v.dtype, v.rank ? kDimTensor : kZeroDim}; }
inline Operand operand(const Scalar& s) { return {s.dtype(), kWrapped}; }

// torch.promote_types for bool, integer and floating dtypes; -1 where ATen has no answer
// (a uint16/32/64 with another integer type, or a dtype the kernels do not compute in).
int32_t promote_types(int32_t a, int32_t b);
// torch.result_type over the operands; -1 (and ctx failed, naming op) when it has none.
int32_t result_type(opforge_context* ctx, const char* op, const Operand* ops, int n);

// Can the elementwise loop read or write this dtype? (bool, integers, float16/32/64)
inline bool loop_dtype(int32_t d) {
  return d == kBool || d == kUInt8 || d == kInt8 || d == kInt16 || d == kInt32 || d == kInt64 ||
         d == kUInt16 || d == kUInt32 || d == kUInt64 || d == kFloat16 || d == kFloat32 ||
         d == kFloat64;
}

// f(T{}) with T the type a dtype computes in (float16 computes in float).
template <typename F>
bool dispatch_compute(int32_t dtype, F&& f) {
  if (dtype == kFloat16) { f(float{}); return true; }
  return dispatch_real(dtype, f);
}

// ---- the broadcasting loop ----------------------------------------------------------

constexpr int kMaxOperands = 4;  // the out and up to three inputs
constexpr int64_t kBlock = 512;  // elements converted per block through a stack buffer

struct Loop {
  int rank = 0;  // after merging; the last dimension is the row
  int64_t sizes[kMaxRank];
  int64_t strides[kMaxOperands][kMaxRank];  // bytes
  char* data[kMaxOperands];
  int32_t dtype[kMaxOperands];
  int nops = 0;  // out first
  int64_t numel = 0;
  const opforge_context* ctx = nullptr;  // make_loop's: run() may use the threads it lends
};

// Build the loop over `out` (operand 0) and `inputs`, each of which must broadcast to
// out's shape; false (ctx failed) when one does not, or when a byte offset could overflow.
bool make_loop(opforge_context* ctx, const char* op, const View& out, const View* const* inputs,
               int ninputs, Loop* loop);

// Convert n elements of dtype `from` (byte stride `stride`) into T.
template <typename T>
void load_row(const char* src, int32_t from, int64_t stride, T* dst, int64_t n) {
  if (from == kBool) {  // read as bytes: a hostile file's bool may hold any byte (nonzero: true)
    for (int64_t i = 0; i < n; ++i) {
      uint8_t b;
      std::memcpy(&b, src + i * stride, 1);
      dst[i] = cast<T>(b != 0);
    }
    return;
  }
  if (from == kFloat16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + i * stride, 2);
      dst[i] = cast<T>(half_to_float(h));
    }
    return;
  }
  dispatch_real(from, [&](auto tag) {
    using S = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      S s;
      std::memcpy(&s, src + i * stride, sizeof(S));
      dst[i] = cast<T>(s);
    }
  });
}

// Convert n elements of T into dtype `to` at byte stride `stride`.
template <typename T>
void store_row(const T* src, char* dst, int32_t to, int64_t stride, int64_t n) {
  if (to == kFloat16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = float_to_half(cast<float>(src[i]));
      std::memcpy(dst + i * stride, &h, 2);
    }
    return;
  }
  dispatch_real(to, [&](auto tag) {
    using D = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      D d = cast<D>(src[i]);
      std::memcpy(dst + i * stride, &d, sizeof(D));
    }
  });
}

template <typename T> inline int32_t dtype_of();
template <> inline int32_t dtype_of<bool>() { return kBool; }
template <> inline int32_t dtype_of<uint8_t>() { return kUInt8; }
template <> inline int32_t dtype_of<int8_t>() { return kInt8; }
template <> inline int32_t dtype_of<int16_t>() { return kInt16; }
template <> inline int32_t dtype_of<int32_t>() { return kInt32; }
template <> inline int32_t dtype_of<int64_t>() { return kInt64; }
template <> inline int32_t dtype_of<uint16_t>() { return kUInt16; }
template <> inline int32_t dtype_of<uint32_t>() { return kUInt32; }
template <> inline int32_t dtype_of<uint64_t>() { return kUInt64; }
template <> inline int32_t dtype_of<float>() { return kFloat32; }
template <> inline int32_t dtype_of<double>() { return kFloat64; }

// Run `row(out, in, step, n)` over rows [row_begin, row_end) of the loop, columns
// [col_begin, col_end) of each: `in[k]` points at n values of CT
// (step[k] == 1) or at one value used for all n (step[k] == 0); `out` receives n values of
// OT. NIN inputs (operands 1..NIN of the loop); the first one is read as C0 (where's and
// masked_fill's bool condition), the others as CT.
template <typename CT, typename OT, int NIN, typename C0 = CT, typename Row>
void run_part(const Loop& L, const Row& row, int64_t row_begin, int64_t row_end, int64_t col_begin,
              int64_t col_end) {
  const int r = L.rank;
  const int64_t n = col_end - col_begin;
  int64_t inner[kMaxOperands];
  for (int k = 0; k < L.nops; ++k) inner[k] = r ? L.strides[k][r - 1] : 0;
  bool out_direct = L.dtype[0] == dtype_of<OT>() && inner[0] == int64_t(sizeof(OT));
  bool direct[kMaxOperands] = {};
  bool stage = !out_direct;
  for (int k = 1; k <= NIN; ++k) {
    // bool inputs go through load_row, which reads bytes: a byte other than 0 or 1 (a
    // hostile constant, or bytes another dtype left) is no valid bool to read in place
    direct[k] = L.dtype[k] != kBool &&
                (k == 1 ? L.dtype[k] == dtype_of<C0>() && inner[k] == int64_t(sizeof(C0))
                        : L.dtype[k] == dtype_of<CT>() && inner[k] == int64_t(sizeof(CT)));
    if (!direct[k] && inner[k] != 0) stage = true;
  }
  const int64_t block = stage ? kBlock : n;
  alignas(64) CT buf[NIN > 0 ? NIN : 1][kBlock];
  alignas(64) C0 buf0[kBlock];
  alignas(64) OT obuf[kBlock];
  // the odometer at row_begin, column col_begin
  int64_t index[kMaxRank] = {};
  char* base[kMaxOperands];
  for (int k = 0; k < L.nops; ++k) base[k] = L.data[k] + col_begin * inner[k];
  for (int64_t d = r - 2, rest = row_begin; d >= 0 && rest > 0; --d) {
    index[d] = rest % L.sizes[d];
    rest /= L.sizes[d];
    for (int k = 0; k < L.nops; ++k) base[k] += index[d] * L.strides[k][d];
  }
  for (int64_t row_i = row_begin; row_i < row_end; ++row_i) {
    for (int64_t lo = 0; lo < n; lo += block) {
      const int64_t m = n - lo < block ? n - lo : block;
      const void* in[NIN > 0 ? NIN : 1];
      int64_t step[NIN > 0 ? NIN : 1];
      CT single[NIN > 0 ? NIN : 1];
      C0 single0;
      for (int k = 1; k <= NIN; ++k) {
        const char* p = base[k] + lo * inner[k];
        const size_t align = k == 1 ? alignof(C0) : alignof(CT);
        if (inner[k] == 0) {
          if (k == 1) load_row<C0>(p, L.dtype[k], 0, &single0, 1);
          else load_row<CT>(p, L.dtype[k], 0, &single[k - 1], 1);
          in[k - 1] = k == 1 ? static_cast<const void*>(&single0) : &single[k - 1];
          step[k - 1] = 0;
        } else if (direct[k] && reinterpret_cast<uintptr_t>(p) % align == 0) {
          in[k - 1] = p;
          step[k - 1] = 1;
        } else {
          if (k == 1) load_row<C0>(p, L.dtype[k], inner[k], buf0, m);
          else load_row<CT>(p, L.dtype[k], inner[k], buf[k - 1], m);
          in[k - 1] = k == 1 ? static_cast<const void*>(buf0) : buf[k - 1];
          step[k - 1] = 1;
        }
      }
      char* po = base[0] + lo * inner[0];
      if (out_direct && reinterpret_cast<uintptr_t>(po) % alignof(OT) == 0) {
        row(reinterpret_cast<OT*>(po), in, step, m);
      } else {
        row(obuf, in, step, m);
        store_row<OT>(obuf, po, L.dtype[0], inner[0], m);
      }
    }
    // next row: odometer over the outer dimensions
    for (int d = r - 2; d >= 0; --d) {
      for (int k = 0; k < L.nops; ++k) base[k] += L.strides[k][d];
      if (++index[d] < L.sizes[d]) break;
      for (int k = 0; k < L.nops; ++k) base[k] -= L.strides[k][d] * L.sizes[d];
      index[d] = 0;
    }
  }
}

// run_part over the whole loop. A large one (kElementGrain elements a thread at least) is
// split over the threads make_loop's context lends: by rows, or within one long row at
// multiples of 64 elements (so each block's vector body and tail fall as unsplit). Each
// element is computed alone, so the split never changes a bit.
constexpr int64_t kElementGrain = int64_t(1) << 16;

template <typename CT, typename OT, int NIN, typename C0 = CT, typename Row>
void run(const Loop& L, Row&& row) {
  if (L.numel == 0) return;
  const int64_t n = L.rank ? L.sizes[L.rank - 1] : 1, rows = L.numel / n;
  const int64_t parts = parallel_parts(L.ctx, L.numel, kElementGrain);
  if (parts <= 1)
    run_part<CT, OT, NIN, C0>(L, row, 0, rows, 0, n);
  else if (rows >= parts)
    parallel_ranges(L.ctx, rows, parts, 1, [&](int64_t r0, int64_t r1) { run_part<CT, OT, NIN, C0>(L, row, r0, r1, 0, n); });
  else
    parallel_ranges(L.ctx, n, parts, 64, [&](int64_t c0, int64_t c1) { run_part<CT, OT, NIN, C0>(L, row, 0, rows, c0, c1); });
}

// Row functors for the common arities: o[i] = op(a[i]) / op(a[i], b[i]) / op(a, b, c),
// with the broadcast (step 0) cases as their own loops so each stays vectorizable.
template <typename CT, typename OT, typename Op>
struct UnaryRow {
  Op op;
  void operator()(OT* o, const void* const* in, const int64_t* step, int64_t n) const {
    const CT* a = static_cast<const CT*>(in[0]);
    if (step[0]) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i]);
    } else {
      OT v = op(a[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    }
  }
};

template <typename CT, typename OT, typename Op>
struct BinaryRow {
  Op op;
  void operator()(OT* o, const void* const* in, const int64_t* step, int64_t n) const {
    const CT* a = static_cast<const CT*>(in[0]);
    const CT* b = static_cast<const CT*>(in[1]);
    if (step[0] && step[1]) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], b[i]);
    } else if (step[0]) {
      const CT bv = b[0];
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], bv);
    } else if (step[1]) {
      const CT av = a[0];
      for (int64_t i = 0; i < n; ++i) o[i] = op(av, b[i]);
    } else {
      OT v = op(a[0], b[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    }
  }
};

template <typename CT, typename OT, typename Op, typename C0 = CT>
struct TernaryRow {
  Op op;
  void operator()(OT* o, const void* const* in, const int64_t* step, int64_t n) const {
    const C0* a = static_cast<const C0*>(in[0]);
    const CT* b = static_cast<const CT*>(in[1]);
    const CT* c = static_cast<const CT*>(in[2]);
    const int64_t sa = step[0], sb = step[1], sc = step[2];
    if (sa && sb && sc) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], b[i], c[i]);
    } else if (sa && sb) {
      const CT cv = c[0];
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], b[i], cv);
    } else if (sa && sc) {
      const CT bv = b[0];
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], bv, c[i]);
    } else if (sa) {  // clamp / hardtanh between two Scalars
      const CT bv = b[0], cv = c[0];
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i], bv, cv);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i * sa], b[i * sb], c[i * sc]);
    }
  }
};

template <typename CT, typename OT, typename Op>
void run_unary(const Loop& L, Op op) { run<CT, OT, 1>(L, UnaryRow<CT, OT, Op>{op}); }
template <typename CT, typename OT, typename Op>
void run_binary(const Loop& L, Op op) { run<CT, OT, 2>(L, BinaryRow<CT, OT, Op>{op}); }
template <typename CT, typename OT, typename Op, typename C0 = CT>
void run_ternary(const Loop& L, Op op) { run<CT, OT, 3, C0>(L, TernaryRow<CT, OT, Op, C0>{op}); }

// ---- operands that may be a tensor or a Scalar --------------------------------------

struct Arg {
  bool is_scalar = false;
  View view;
  Scalar scalar;
  Operand promo() const { return is_scalar ? operand(scalar) : operand(view); }
};

// Argument i as a tensor (`scalar` false; a number there is taken as a wrapped Scalar)
// or a Scalar (`scalar` true).
bool operand_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                 const char* op, const char* what, bool scalar, Arg* a);

// What the loop reads for an operand: its tensor, or its Scalar converted to CT into
// *storage as a zero-dim view.
template <typename CT>
View loop_view(const Arg& a, CT* storage) {
  if (!a.is_scalar) return a.view;
  *storage = a.scalar.template as<CT>();
  View v;
  v.data = reinterpret_cast<char*>(storage);
  v.dtype = dtype_of<CT>();
  v.rank = 0;
  v.numel = 1;
  return v;
}

// A string argument (STR / STR?): *none set for a NONE tag.
bool string_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                const char* op, const char* what, const char** data, int64_t* size, bool* none);
inline bool string_is(const char* data, int64_t size, const char* text) {
  return static_cast<int64_t>(std::strlen(text)) == size && std::memcmp(data, text, size) == 0;
}

// Does any element of v, converted to CT, satisfy pred? (a check before the kernel writes)
template <typename CT, typename Pred>
bool any_element(const View& v, Pred pred) {
  Loop L;
  opforge_context scratch{};
  if (v.numel == 0 || !make_loop(&scratch, "any_element", v, nullptr, 0, &L)) return false;
  bool found = false;
  const int r = L.rank;
  const int64_t n = r ? L.sizes[r - 1] : 1, inner = r ? L.strides[0][r - 1] : 0;
  int64_t index[kMaxRank] = {};
  const char* base = L.data[0];
  CT buf[kBlock];
  for (int64_t row = 0; row < L.numel / n && !found; ++row) {
    for (int64_t lo = 0; lo < n && !found; lo += kBlock) {
      const int64_t m = n - lo < kBlock ? n - lo : kBlock;
      load_row<CT>(base + lo * inner, L.dtype[0], inner, buf, m);
      for (int64_t i = 0; i < m; ++i) found = found || pred(buf[i]);
    }
    for (int d = r - 2; d >= 0; --d) {
      base += L.strides[0][d];
      if (++index[d] < L.sizes[d]) break;
      base -= L.strides[0][d] * L.sizes[d];
      index[d] = 0;
    }
  }
  return found;
}

// ---- the steps every elementwise kernel takes ---------------------------------------

// Read the out argument and check that its dtype is one the loop writes.
bool out_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i, const char* op,
             View* out);
// Read an input tensor and check its dtype.
bool input_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i, const char* op,
               const char* what, View* v);
// Check that out has the broadcast shape of the inputs (ATen's out shape; NumPy would
// also accept a larger out) and build the loop.
bool broadcast_loop(opforge_context* ctx, const char* op, const View& out, const View* const* inputs,
                    int ninputs, Loop* loop);

// Integer arithmetic that wraps (two's complement) where C++ would overflow.
template <typename T> inline T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <typename T> inline T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <typename T> inline T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;  // no int promotion
  return static_cast<T>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b)));
}

// NumPy's maximum/minimum: NaN propagates (a NaN first operand wins), and between equal
// values (-0.0 and 0.0) the second operand is returned, as its SIMD loops do; on bool,
// or / and.
template <typename T> inline T numpy_maximum(T a, T b) {
  if constexpr (std::is_same<T, bool>::value) return a || b;
  else return (a > b || a != a) ? a : b;
}
template <typename T> inline T numpy_minimum(T a, T b) {
  if constexpr (std::is_same<T, bool>::value) return a && b;
  else return (a < b || a != a) ? a : b;
}

// NumPy's float16 maximum/minimum (a scalar loop, no SIMD) return the first operand
// between equal values: relu(-0.0) is -0.0 in float16 and 0.0 in float32.
template <typename T> inline T numpy_maximum_f16(T a, T b) { return (a >= b || a != a) ? a : b; }
template <typename T> inline T numpy_minimum_f16(T a, T b) { return (a <= b || a != a) ? a : b; }

}  // namespace opforge::portable
