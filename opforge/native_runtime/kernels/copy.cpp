// The strided copy, dtype conversion and float16 / bfloat16 conversions (copy.h).
#include "copy.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <type_traits>

namespace opforge::portable {

// --- float16 and bfloat16 ------------------------------------------------------------------

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf, or NaN keeping the top of its payload (as NumPy)
    if (a == 0x7f800000u) return sign | 0x7c00u;
    uint16_t r = static_cast<uint16_t>(0x7c00u + ((a & 0x7fffffu) >> 13));
    return sign | (r == 0x7c00u ? 0x7c01u : r);
  }
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                        // below 2^-14: a subnormal half (or 0)
    float v;
    std::memcpy(&v, &a, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(v * 16777216.0f));  // exact scaling
  }
  uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);  // to nearest, ties to even
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

uint16_t double_to_half(double d) {
  // Round to odd into float (24 bits >= 11 + 2), then to nearest even into half: one
  // correct rounding of d.
  float f = static_cast<float>(d);
  if (std::isnan(d)) return float_to_half(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  if (static_cast<double>(f) != d) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= 1u;
    std::memcpy(&f, &bits, 4);
  }
  return float_to_half(f);
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
    return sign ? -v : v;
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

// --- preparing a copy: drop, order and merge dimensions ------------------------------------

struct Plan {
  int rank = 0;
  int64_t n[kMaxCopyRank];
  int64_t d[kMaxCopyRank];  // destination strides, bytes
  int64_t s[kMaxCopyRank];  // source strides, bytes
};

// False when there is nothing to copy (a size 0).
bool plan_copy(Plan* p, const int64_t* sizes, const int64_t* ds, const int64_t* ss, int rank,
               int64_t dsize, int64_t ssize) {
  int m = 0;
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] == 0) return false;
    if (sizes[i] == 1) continue;
    // insertion by |destination stride|, largest first (stable)
    int64_t key = ds[i] < 0 ? -ds[i] : ds[i];
    int at = m;
    while (at > 0 && (p->d[at - 1] < 0 ? -p->d[at - 1] : p->d[at - 1]) < key) {
      p->n[at] = p->n[at - 1], p->d[at] = p->d[at - 1], p->s[at] = p->s[at - 1];
      --at;
    }
    p->n[at] = sizes[i], p->d[at] = ds[i], p->s[at] = ss[i];
    ++m;
  }
  // merge a dimension into the one outside it where both operands step evenly across
  int r = 0;
  for (int i = 0; i < m; ++i) {
    if (r > 0 && p->d[r - 1] == p->d[i] * p->n[i] && p->s[r - 1] == p->s[i] * p->n[i]) {
      p->n[r - 1] *= p->n[i];
      p->d[r - 1] = p->d[i];
      p->s[r - 1] = p->s[i];
      continue;
    }
    p->n[r] = p->n[i], p->d[r] = p->d[i], p->s[r] = p->s[i];
    ++r;
  }
  for (int i = 0; i < r; ++i) p->d[i] *= dsize, p->s[i] *= ssize;
  p->rank = r;
  return true;
}

// Call inner(dst, src) once per position of the dims [0, outer), pointers advanced.
template <typename F>
void walk(const Plan& p, int outer, char* dst, const char* src, F&& inner) {
  int64_t idx[kMaxCopyRank];
  for (int k = 0; k < outer; ++k) idx[k] = 0;
  for (;;) {
    inner(dst, src);
    int k = outer - 1;
    for (; k >= 0; --k) {
      if (++idx[k] < p.n[k]) {
        dst += p.d[k];
        src += p.s[k];
        break;
      }
      dst -= p.d[k] * (p.n[k] - 1);
      src -= p.s[k] * (p.n[k] - 1);
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

template <typename T>
void run_typed(char* d, int64_t dstep, const char* s, int64_t sstep, int64_t n) {
  for (int64_t i = 0; i < n; ++i, d += dstep, s += sstep) {
    T v;
    std::memcpy(&v, s, sizeof(T));
    std::memcpy(d, &v, sizeof(T));
  }
}

struct Bytes16 { char b[16]; };

void run_bytes(char* d, int64_t dstep, const char* s, int64_t sstep, int64_t n, int64_t item) {
  switch (item) {
    case 1: run_typed<uint8_t>(d, dstep, s, sstep, n); return;
    case 2: run_typed<uint16_t>(d, dstep, s, sstep, n); return;
    case 4: run_typed<uint32_t>(d, dstep, s, sstep, n); return;
    case 8: run_typed<uint64_t>(d, dstep, s, sstep, n); return;
    case 16: run_typed<Bytes16>(d, dstep, s, sstep, n); return;
    default:
      for (int64_t i = 0; i < n; ++i, d += dstep, s += sstep) std::memmove(d, s, item);
  }
}

// A 2-d block: rows along which the source is contiguous, columns along which the
// destination is; copied in tiles so that both sides stay in cache (16 x 16: 32 source
// lines 16 KB apart would share one L1 set), 4-byte elements as 4 x 4 SSE transposes.
template <typename T>
void copy_element(char* d, const char* s) {
  T v;
  std::memcpy(&v, s, sizeof(T));
  std::memcpy(d, &v, sizeof(T));
}

template <typename T>
void transpose_tiles(char* dst, int64_t drow, const char* src, int64_t scol, int64_t rows,
                     int64_t cols) {
  constexpr int64_t kTile = 16, kItem = static_cast<int64_t>(sizeof(T));
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    int64_t r1 = r0 + kTile < rows ? r0 + kTile : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      int64_t c1 = c0 + kTile < cols ? c0 + kTile : cols;
      int64_t r = r0;
#if defined(__SSE2__)
      if (kItem == 4) {
        for (; r + 4 <= r1; r += 4) {
          int64_t c = c0;
          for (; c + 4 <= c1; c += 4) {
            const char* s = src + r * kItem + c * scol;
            __m128 a = _mm_loadu_ps(reinterpret_cast<const float*>(s));
            __m128 b = _mm_loadu_ps(reinterpret_cast<const float*>(s + scol));
            __m128 e = _mm_loadu_ps(reinterpret_cast<const float*>(s + 2 * scol));
            __m128 f = _mm_loadu_ps(reinterpret_cast<const float*>(s + 3 * scol));
            _MM_TRANSPOSE4_PS(a, b, e, f);  // shuffles: the bits move unchanged
            char* d = dst + r * drow + c * kItem;
            _mm_storeu_ps(reinterpret_cast<float*>(d), a);
            _mm_storeu_ps(reinterpret_cast<float*>(d + drow), b);
            _mm_storeu_ps(reinterpret_cast<float*>(d + 2 * drow), e);
            _mm_storeu_ps(reinterpret_cast<float*>(d + 3 * drow), f);
          }
          for (int64_t i = r; i < r + 4; ++i)
            for (int64_t k = c; k < c1; ++k)
              copy_element<T>(dst + i * drow + k * kItem, src + i * kItem + k * scol);
        }
      }
#endif
      for (; r < r1; ++r) {
        char* d = dst + r * drow + c0 * kItem;
        const char* s = src + r * kItem + c0 * scol;
        for (int64_t c = c0; c < c1; ++c, d += kItem, s += scol) copy_element<T>(d, s);
      }
    }
  }
}

// --- conversions ----------------------------------------------------------------------------

struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };

template <typename T> constexpr bool kFloatLike =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, F16> ||
    std::is_same_v<T, BF16>;

template <typename S> double as_double(S v) {
  if constexpr (std::is_same_v<S, F16>) return half_to_float(v.bits);
  else if constexpr (std::is_same_v<S, BF16>) return bf16_to_float(v.bits);
  else return static_cast<double>(v);
}

// x86's truncating conversions (cvttsd2si): out of range and NaN give the minimum.
inline int64_t trunc64(double v) {
  return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? static_cast<int64_t>(v)
                                                                  : INT64_MIN;
}
inline int32_t trunc32(double v) {
  return v > -2147483649.0 && v < 2147483648.0 ? static_cast<int32_t>(v) : INT32_MIN;
}

template <typename D> D from_double(double v) {
  if constexpr (std::is_same_v<D, bool>) return v != 0 || std::isnan(v);
  else if constexpr (std::is_same_v<D, F16>) return F16{double_to_half(v)};
  else if constexpr (std::is_same_v<D, BF16>) return BF16{float_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_floating_point_v<D>) return static_cast<D>(v);
  else if constexpr (std::is_same_v<D, int64_t>) return trunc64(v);
  else if constexpr (std::is_same_v<D, uint64_t>)
    return v >= 9223372036854775808.0 && v < 18446744073709551616.0
               ? static_cast<uint64_t>(v)
               : static_cast<uint64_t>(trunc64(v));
  else if constexpr (std::is_same_v<D, uint32_t>) return static_cast<uint32_t>(trunc64(v));
  else return static_cast<D>(trunc32(v));
}

template <typename D, typename I> D from_integer(I v) {
  if constexpr (std::is_same_v<D, bool>) return v != 0;
  else if constexpr (std::is_same_v<D, F16>) return F16{double_to_half(static_cast<double>(v))};
  else if constexpr (std::is_same_v<D, BF16>) return BF16{float_to_bf16(static_cast<float>(v))};
  else return static_cast<D>(v);
}

template <typename D, typename S> D cast(S v) {
  if constexpr (kFloatLike<S>) return from_double<D>(as_double(v));
  else if constexpr (std::is_same_v<S, uint64_t>) return from_integer<D>(v);
  else return from_integer<D>(static_cast<int64_t>(v));
}

template <typename D, typename S>
void run_convert(char* d, int64_t dstep, const char* s, int64_t sstep, int64_t n) {
  for (int64_t i = 0; i < n; ++i, d += dstep, s += sstep) {
    S v;
    if constexpr (std::is_same<S, bool>::value) {
      v = *reinterpret_cast<const uint8_t*>(s) != 0;  // any byte a hostile file holds
    } else {
      std::memcpy(&v, s, sizeof(S));
    }
    D r = cast<D>(v);
    std::memcpy(d, &r, sizeof(D));
  }
}

template <typename F>
bool dispatch_all(int32_t dtype, F&& f) {
  if (dtype == kFloat16) { f(F16{}); return true; }
  if (dtype == kBFloat16) { f(BF16{}); return true; }
  return dispatch_real(dtype, f);
}

using RunFn = void (*)(char*, int64_t, const char*, int64_t, int64_t);

RunFn converter(int32_t dst_dtype, int32_t src_dtype) {
  RunFn fn = nullptr;
  dispatch_all(dst_dtype, [&](auto d) {
    dispatch_all(src_dtype, [&](auto s) { fn = &run_convert<decltype(d), decltype(s)>; });
  });
  return fn;
}

}  // namespace

void copy_strided(char* dst, const int64_t* dst_strides, const char* src,
                  const int64_t* src_strides, const int64_t* sizes, int rank, int64_t itemsize) {
  Plan p;
  if (!plan_copy(&p, sizes, dst_strides, src_strides, rank, itemsize, itemsize)) return;
  if (p.rank == 0) {
    std::memmove(dst, src, itemsize);  // a hostile program may alias them
    return;
  }
  int last = p.rank - 1;
  int64_t n = p.n[last], dstep = p.d[last], sstep = p.s[last];
  if (dstep == itemsize && sstep == itemsize) {
    int64_t bytes = n * itemsize;
    walk(p, last, dst, src, [&](char* d, const char* s) { std::memmove(d, s, bytes); });
    return;
  }
  // a transpose: the destination contiguous innermost, the source along another dim
  if (dstep == itemsize && p.rank >= 2 && (itemsize == 4 || itemsize == 8 || itemsize == 2)) {
    int j = -1;
    for (int k = last - 1; k >= 0; --k)
      if (p.s[k] == itemsize) { j = k; break; }
    if (j >= 0) {
      // move dim j just outside the innermost one (the order of outer dims is free)
      int64_t jn = p.n[j], jd = p.d[j], js = p.s[j];
      for (int k = j; k < last - 1; ++k) p.n[k] = p.n[k + 1], p.d[k] = p.d[k + 1], p.s[k] = p.s[k + 1];
      p.n[last - 1] = jn, p.d[last - 1] = jd, p.s[last - 1] = js;
      auto tiles = [&](char* d, const char* s) {
        if (itemsize == 4) transpose_tiles<uint32_t>(d, jd, s, sstep, jn, n);
        else if (itemsize == 8) transpose_tiles<uint64_t>(d, jd, s, sstep, jn, n);
        else transpose_tiles<uint16_t>(d, jd, s, sstep, jn, n);
      };
      walk(p, last - 1, dst, src, tiles);
      return;
    }
  }
  walk(p, last, dst, src, [&](char* d, const char* s) { run_bytes(d, dstep, s, sstep, n, itemsize); });
}

bool convertible(int32_t dtype) {
  return dispatch_all(dtype, [](auto) {});
}

void convert_strided(char* dst, int32_t dst_dtype, const int64_t* dst_strides, const char* src,
                     int32_t src_dtype, const int64_t* src_strides, const int64_t* sizes, int rank) {
  if (dst_dtype == src_dtype) {
    copy_strided(dst, dst_strides, src, src_strides, sizes, rank, itemsize(dst_dtype));
    return;
  }
  RunFn fn = converter(dst_dtype, src_dtype);
  if (!fn) return;
  Plan p;
  if (!plan_copy(&p, sizes, dst_strides, src_strides, rank, itemsize(dst_dtype), itemsize(src_dtype)))
    return;
  if (p.rank == 0) {
    fn(dst, 0, src, 0, 1);
    return;
  }
  int last = p.rank - 1;
  int64_t n = p.n[last], dstep = p.d[last], sstep = p.s[last];
  walk(p, last, dst, src, [&](char* d, const char* s) { fn(d, dstep, s, sstep, n); });
}

bool copy_checked(opforge_context* ctx, const char* op, char* dst, int32_t dst_dtype,
                  const int64_t* dst_strides, const char* src, int32_t src_dtype,
                  const int64_t* src_strides, const int64_t* sizes, int rank) {
  if (dst_dtype != src_dtype && (!convertible(dst_dtype) || !convertible(src_dtype))) {
    fail(ctx, "%s: cannot convert %s to %s — valid: bool, integer and floating dtypes", op,
         dtype_name(src_dtype), dtype_name(dst_dtype));
    return false;
  }
  convert_strided(dst, dst_dtype, dst_strides, src, src_dtype, src_strides, sizes, rank);
  return true;
}

bool copy_view(opforge_context* ctx, const char* op, const View& dst, const View& src) {
  return copy_checked(ctx, op, dst.data, dst.dtype, dst.strides, src.data, src.dtype,
                      src.strides, dst.sizes, dst.rank);
}

bool fill_scalar(opforge_context* ctx, const char* op, const View& out, double d, int64_t i,
                 bool integral) {
  if (!convertible(out.dtype)) {
    fail(ctx, "%s: out has dtype %s — valid: bool, integer and floating dtypes", op,
         dtype_name(out.dtype));
    return false;
  }
  alignas(16) char value[16] = {};
  static const int64_t kNone[1] = {0};
  const int64_t one = 1;
  if (integral)
    convert_strided(value, out.dtype, kNone, reinterpret_cast<const char*>(&i), kInt64, kNone, &one, 1);
  else
    convert_strided(value, out.dtype, kNone, reinterpret_cast<const char*>(&d), kFloat64, kNone, &one, 1);
  int64_t zeros[kMaxRank] = {};
  copy_strided(out.data, out.strides, value, zeros, out.sizes, out.rank, itemsize(out.dtype));
  return true;
}

double load_double(const char* p, int32_t dtype) {
  double v = 0;
  dispatch_all(dtype, [&](auto t) {
    using T = decltype(t);
    T x;
    std::memcpy(&x, p, sizeof(T));
    v = as_double(x);
  });
  return v;
}

void store_double(char* p, int32_t dtype, double v) {
  dispatch_all(dtype, [&](auto t) {
    using T = decltype(t);
    T x = from_double<T>(v);
    std::memcpy(p, &x, sizeof(T));
  });
}

int64_t load_int64(const char* p, int32_t dtype) {
  switch (dtype) {
    case kBool: case kUInt8: return static_cast<uint8_t>(*p);
    case kInt8: case kInt16: case kInt32: case kInt64: return read_index(p, dtype);
    case kUInt16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case kUInt32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case kUInt64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<int64_t>(v); }
    default: return trunc64(load_double(p, dtype));
  }
}

void store_scalar(char* p, int32_t dtype, double d, int64_t i, bool integral) {
  if (!integral) {
    store_double(p, dtype, d);
    return;
  }
  dispatch_all(dtype, [&](auto t) {
    using T = decltype(t);
    T x = from_integer<T>(i);
    std::memcpy(p, &x, sizeof(T));
  });
}

bool broadcast_strides(opforge_context* ctx, const char* op, const char* what, const View& in,
                       const int64_t* sizes, int rank, int64_t* strides) {
  if (in.rank > rank) {
    fail(ctx, "%s: %s — found rank %d — valid: at most rank %d to broadcast to the result — "
         "re-export the program", op, what, in.rank, rank);
    return false;
  }
  for (int d = 0; d < rank; ++d) {
    int k = d - (rank - in.rank);
    if (k < 0) { strides[d] = 0; continue; }
    if (in.sizes[k] == sizes[d]) {
      strides[d] = sizes[d] == 1 ? 0 : in.strides[k];
    } else if (in.sizes[k] == 1) {
      strides[d] = 0;
    } else {
      fail(ctx, "%s: %s — found size %lld in dim %d against %lld — valid: equal sizes or 1 — "
           "re-export the program", op, what, (long long)in.sizes[k], k, (long long)sizes[d]);
      return false;
    }
  }
  return true;
}

void contiguous_strides(const int64_t* sizes, int rank, int64_t* strides) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = s;
    s *= sizes[d] > 0 ? sizes[d] : 1;
  }
}

bool tensor_list_arg(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                     const char* op, const char* what, const opforge_tensor** items,
                     int64_t* count) {
  if (i < 0 || i >= n) {
    fail(ctx, "%s: argument %lld (%s) is missing — found %lld arguments", op, (long long)i, what,
         (long long)n);
    return false;
  }
  const opforge_arg& a = args[i];
  if ((a.tag != OPFORGE_ARG_TENSOR_LIST && a.tag != OPFORGE_ARG_OPT_TENSOR_LIST) ||
      a.v.list.size < 0 || (a.v.list.size > 0 && !a.v.list.data)) {
    fail(ctx, "%s: %s (argument %lld) — found tag %d — valid: a tensor list", op, what,
         (long long)i, a.tag);
    return false;
  }
  *items = static_cast<const opforge_tensor*>(a.v.list.data);
  *count = a.v.list.size;
  return true;
}

bool list_item(opforge_context* ctx, const opforge_tensor& item, const char* op,
               const char* what, View* v) {
  opforge_arg a{};
  a.tag = OPFORGE_ARG_TENSOR;
  a.v.tensor = item;
  if (!tensor_arg(ctx, &a, 1, 0, op, what, v)) return false;
  v->t = &item;
  return true;
}

bool index_dtype(int32_t dtype) {
  return dtype == kInt64 || dtype == kInt32 || dtype == kInt16 || dtype == kInt8 || dtype == kUInt8;
}

}  // namespace opforge::portable
