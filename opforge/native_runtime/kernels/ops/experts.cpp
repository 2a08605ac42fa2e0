// Mixture-of-experts routing and the experts' grouped matmul: transformers'
// grouped_mm_fallback, histc (tokens per expert), index_add (each token's experts summed)
// and empty_permuted. The NumPy kernels of the same keys are the specification
// (opforge/kernels/portable/experts.py, indexing.py, factory.py); topk, sort and cumsum are
// sorting.cpp's.
#include <cmath>
#include <cstring>

#include "copy.h"
#include "gemm.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

// Python's slice bound: a negative one counts from the end, both clamp to [0, size].
int64_t slice_bound(int64_t v, int64_t size) {
  if (v < 0) v = v < -size ? 0 : v + size;
  return v > size ? size : v;
}

// out[start:end] = input[start:end] @ weight[e] for each expert e, start the previous end
// (0 first), Python's slice rules; every other row of out is zero.
void grouped_mm_fallback_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "transformers::grouped_mm_fallback.out";
  OPF_TENSOR(0, "input", input);
  OPF_TENSOR(1, "weight", weight);
  OPF_TENSOR(2, "offs", offs);
  OPF_TENSOR(3, "out", out);
  if (input.rank != 2 || weight.rank != 3 || offs.rank != 1) {
    fail(ctx, "%s: ranks — found input %d-d, weight %d-d, offs %d-d — valid: input (S, K), "
         "weight (E, K, N), offs (E,) — pass transformers' grouped layout", kOp, input.rank,
         weight.rank, offs.rank);
    return;
  }
  if (offs.sizes[0] != weight.sizes[0] || input.sizes[1] != weight.sizes[1]) {
    fail(ctx, "%s: shapes — found input (%lld, %lld), weight (%lld, %lld, %lld), offs (%lld) — "
         "valid: one offset per expert, input's columns are weight's rows — check the grouped "
         "operands", kOp, (long long)input.sizes[0], (long long)input.sizes[1],
         (long long)weight.sizes[0], (long long)weight.sizes[1], (long long)weight.sizes[2],
         (long long)offs.sizes[0]);
    return;
  }
  const int64_t shape[2] = {input.sizes[0], weight.sizes[2]};
  if (!check_shape(ctx, kOp, out, shape, 2)) return;
  if (!index_dtype(offs.dtype) || (offs.dtype != kInt32 && offs.dtype != kInt64)) {
    fail(ctx, "%s: offs — found dtype %s — valid: int32 or int64 — pass the cumulative counts "
         "as integers", kOp, dtype_name(offs.dtype));
    return;
  }
  if ((input.dtype != kFloat32 && input.dtype != kFloat64) || weight.dtype != input.dtype ||
      out.dtype != input.dtype) {
    fail(ctx, "%s: dtypes — found input %s, weight %s, out %s — valid: all float32 or all "
         "float64 in the native runtime (the lean runtime also runs float16) — export the "
         "experts in float32", kOp, dtype_name(input.dtype), dtype_name(weight.dtype),
         dtype_name(out.dtype));
    return;
  }
  if (out.numel == 0) return;
  if (!fill_scalar(ctx, kOp, out, 0.0, 0, false)) return;
  const int64_t rows = input.sizes[0], k = input.sizes[1], cols = weight.sizes[2];
  const int64_t item = itemsize(input.dtype), offs_item = itemsize(offs.dtype);
  int64_t start = 0;
  for (int64_t e = 0; e < offs.sizes[0]; ++e) {
    int64_t end = read_index(offs.data + e * offs.strides[0] * offs_item, offs.dtype);
    if (start == end) continue;
    int64_t lo = slice_bound(start, rows), hi = slice_bound(end, rows);
    start = end;
    if (hi <= lo || cols == 0 || k == 0) continue;  // out's rows stay zero
    // every offset below is within its tensor: lo < hi <= rows, e < E (sizes checked above)
    const char* a = input.data + lo * input.strides[0] * item;
    const char* b = weight.data + e * weight.strides[0] * item;
    char* c = out.data + lo * out.strides[0] * item;
    bool ok = input.dtype == kFloat32
        ? gemm(ctx, kOp, hi - lo, cols, k, reinterpret_cast<const float*>(a), input.strides[0],
               input.strides[1], reinterpret_cast<const float*>(b), weight.strides[1],
               weight.strides[2], reinterpret_cast<float*>(c), out.strides[0], out.strides[1],
               false)
        : gemm(ctx, kOp, hi - lo, cols, k, reinterpret_cast<const double*>(a), input.strides[0],
               input.strides[1], reinterpret_cast<const double*>(b), weight.strides[1],
               weight.strides[2], reinterpret_cast<double*>(c), out.strides[0], out.strides[1],
               false);
    if (!ok) return;
  }
}

// histc: ATen's linear rule without an edge search, each step in the input's dtype.
template <typename T>
void histogram(opforge_context* ctx, const char* kOp, const View& self, int64_t bins, double min,
               double max, const View& out) {
  T lo = static_cast<T>(min), hi = static_cast<T>(max);
  if (lo > hi) {
    fail(ctx, "%s: range — found min %g > max %g — valid: min <= max — swap them", kOp,
         (double)lo, (double)hi);
    return;
  }
  const T* x = self.ptr<T>();
  if (lo == hi && self.numel) {
    lo = hi = x[0];
    for (int64_t i = 0; i < self.numel; ++i) {
      T v = x[i];
      if (std::isnan(v) || std::isnan(lo)) { lo = hi = v; continue; }
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    fail(ctx, "%s: range — found [%g, %g] — valid: finite bounds — pass min and max, or "
         "remove inf/NaN from the input", kOp, (double)lo, (double)hi);
    return;
  }
  if (lo == hi) lo -= T(1), hi += T(1);
  if (!fill_scalar(ctx, kOp, out, 0.0, 0, false)) return;
  const int64_t item = itemsize(out.dtype);
  for (int64_t i = 0; i < self.numel; ++i) {
    T v = x[i];
    if (!(v >= lo && v <= hi)) continue;  // NaN too
    T scaled = (v - lo) * static_cast<T>(bins);
    scaled = scaled / (hi - lo);
    int64_t bin = static_cast<int64_t>(scaled);
    if (bin < 0) bin = 0;
    if (bin > bins - 1) bin = bins - 1;
    char* p = out.data + bin * out.strides[0] * item;
    store_double(p, out.dtype, load_double(p, out.dtype) + 1.0);
  }
}

void histc_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::histc.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "bins", bins);
  double min = 0, max = 0;
  int64_t unused = 0;
  bool integral = false;
  if (!scalar_arg(ctx, args, n, 2, kOp, "min", &min, &unused, &integral) ||
      !scalar_arg(ctx, args, n, 3, kOp, "max", &max, &unused, &integral))
    return;
  OPF_TENSOR(4, "out", out);
  if (bins <= 0) {
    fail(ctx, "%s: bins — found %lld — valid: at least 1 — pass a positive bin count", kOp,
         (long long)bins);
    return;
  }
  const int64_t shape[1] = {bins};
  if (!check_shape(ctx, kOp, out, shape, 1)) return;
  if ((self.dtype != kFloat32 && self.dtype != kFloat64) || !self.dense || !convertible(out.dtype)) {
    fail(ctx, "%s: self — found %s%s — valid: a dense float32 or float64 tensor in the native "
         "runtime — cast the input to float32", kOp, dtype_name(self.dtype),
         self.dense ? "" : " (not dense)");
    return;
  }
  if (self.dtype == kFloat32) histogram<float>(ctx, kOp, self, bins, min, max, out);
  else histogram<double>(ctx, kOp, self, bins, min, max, out);
}

// index_add: out = self, then alpha * source's slices added at index along dim, in order
// (repeated indices accumulate, each addition rounded to out's dtype as NumPy's add.at).
template <typename T>
void add_slices(const View& index, const View& source, double alpha, const View& out,
                int64_t outer, int64_t count, int64_t inner, int64_t size) {
  T* o = out.ptr<T>();
  const T* s = source.ptr<T>();
  const int64_t step = (index.rank ? index.strides[0] : 0) * itemsize(index.dtype);
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t i = 0; i < count; ++i) {
      int64_t j = read_index(index.data + i * step, index.dtype);
      if (j < 0 || j >= size) continue;  // checked before; only an out aliasing index changes it
      T* dst = o + (a * size + j) * inner;
      const T* src = s + (a * count + i) * inner;
      for (int64_t b = 0; b < inner; ++b) {
        if constexpr (std::is_floating_point_v<T>) {
          T v = alpha == 1.0 ? src[b] : static_cast<T>(src[b] * static_cast<T>(alpha));
          dst[b] = static_cast<T>(dst[b] + v);
        } else {  // integers wrap, as NumPy's
          using U = std::make_unsigned_t<T>;
          U v = static_cast<U>(src[b]) * static_cast<U>(static_cast<T>(alpha));
          dst[b] = static_cast<T>(static_cast<U>(dst[b]) + v);
        }
      }
    }
}

void index_add_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::index_add.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "index", index);
  OPF_TENSOR(3, "source", source);
  double alpha = 1;
  int64_t ialpha = 1;
  bool integral = false;
  if (!scalar_arg(ctx, args, n, 4, kOp, "alpha", &alpha, &ialpha, &integral)) return;
  OPF_TENSOR(5, "out", out);
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  int64_t d = 0;
  if (self.rank && !wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  const int64_t count = index.numel;
  if (index.rank > 1 || !index_dtype(index.dtype) || (index.dtype != kInt32 && index.dtype != kInt64)) {
    fail(ctx, "%s: index — found a %d-d %s tensor — valid: a 1-d int32 or int64 tensor — pass "
         "the indices as a vector", kOp, index.rank, dtype_name(index.dtype));
    return;
  }
  bool shapes_ok = source.rank == self.rank || (self.rank == 0 && source.rank <= 1);
  for (int k = 0; shapes_ok && k < self.rank; ++k)
    shapes_ok = source.sizes[k] == (k == d ? count : self.sizes[k]);
  if (!shapes_ok || (self.rank == 0 && source.numel != count)) {
    fail(ctx, "%s: source — its shape does not match self's with dim %lld of the index's length "
         "%lld — valid: source.shape == self.shape except along dim — check the operands", kOp,
         (long long)d, (long long)count);
    return;
  }
  if (source.dtype != out.dtype || self.dtype != out.dtype || !out.dense ||
      (source.numel && !source.dense) ||
      (out.dtype != kFloat32 && out.dtype != kFloat64 && out.dtype != kInt64 && out.dtype != kInt32)) {
    fail(ctx, "%s: dtypes — found self %s, source %s, out %s — valid: one of float32, float64, "
         "int64, int32 for all three, dense — re-export the program", kOp,
         dtype_name(self.dtype), dtype_name(source.dtype), dtype_name(out.dtype));
    return;
  }
  const int64_t size = self.rank ? self.sizes[d] : 1;
  const int64_t step = (index.rank ? index.strides[0] : 0) * itemsize(index.dtype);
  for (int64_t i = 0; i < count; ++i) {  // validated before anything is written
    int64_t j = read_index(index.data + i * step, index.dtype);
    if (j < 0 || j >= size) {
      fail(ctx, "%s: index — found %lld — valid: [0, %lld] for a dimension of size %lld — check "
           "the indices against the tensor's shape", kOp, (long long)j, (long long)(size - 1),
           (long long)size);
      return;
    }
  }
  if (out.data != self.data && !copy_view(ctx, kOp, out, self)) return;
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < d; ++k) outer *= self.sizes[k];  // products of a checked numel: no overflow
  for (int k = static_cast<int>(d) + 1; k < self.rank; ++k) inner *= self.sizes[k];
  if (out.dtype == kFloat32) add_slices<float>(index, source, alpha, out, outer, count, inner, size);
  else if (out.dtype == kFloat64) add_slices<double>(index, source, alpha, out, outer, count, inner, size);
  else if (out.dtype == kInt64) add_slices<int64_t>(index, source, (double)ialpha, out, outer, count, inner, size);
  else add_slices<int32_t>(index, source, (double)ialpha, out, outer, count, inner, size);
}

void empty_permuted_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::empty_permuted.out";
  OPF_INTS(0, "size", size, count);
  OPF_TENSOR(2, "out", out);
  check_shape(ctx, kOp, out, size, static_cast<int>(count < 0 || count > kMaxRank ? -1 : count));
}

const KernelDef kExpertsKernels[] = {
    {"transformers::grouped_mm_fallback.out", "T T T T!", grouped_mm_fallback_out},
    {"aten::histc.out", "T I S S T!", histc_out},
    {"aten::index_add.out", "T I T T S T!", index_add_out},
    {"aten::empty_permuted.out", "IL IL T!", empty_permuted_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(experts, kExpertsKernels)
