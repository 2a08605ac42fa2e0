// sort and topk along one dim, in ATen's order: NaN greater than every number (last
// ascending, first descending), -0.0 equal to 0.0, equal elements in input order (both
// directions), as the NumPy kernels of the same keys (opforge/kernels/portable/sorting.py).
// topk takes the k first of that order (a partial sort on (value, index)).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

template <typename T>
bool less_nan_last(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) return !std::isnan(a) && (std::isnan(b) || a < b);
  else return a < b;
}

// Visit each row of `self` along dim: f(self row pointer, coordinates with dim at 0).
template <typename F>
void each_row(const View& self, int64_t dim, F&& f) {
  int64_t sizes[kMaxRank];
  for (int k = 0; k < self.rank; ++k) sizes[k] = k == dim ? 1 : self.sizes[k];
  View rows = self;
  rows.sizes = sizes;
  rows.numel = 1;
  for (int k = 0; k < self.rank; ++k) rows.numel *= sizes[k];
  for_each_element(rows, rows, [&](char* p, char*, const int64_t* idx) { f(p, idx); });
}

int64_t offset_at(const View& v, const int64_t* idx) {
  int64_t off = 0;
  for (int k = 0; k < v.rank; ++k) off += idx[k] * v.strides[k];
  return off * itemsize(v.dtype);
}

// Order the first `k` positions of every row (all of them when k == n) and write values and
// indices. Keys are read as T (float16 / bfloat16 as float: the order is the same).
template <typename T>
void order_rows(const View& self, int64_t dim, int64_t k, bool descending, const View& values,
                const View& indices) {
  int64_t n = self.sizes[dim], step = self.strides[dim] * itemsize(self.dtype);
  int64_t vstep = values.strides[dim] * itemsize(values.dtype), istep = indices.strides[dim] * itemsize(indices.dtype);
  using Key = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;  // no vector<bool>
  std::vector<Key> keys(static_cast<size_t>(n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  auto before = [&](int64_t a, int64_t b) {
    Key x = keys[a], y = keys[b];
    bool lt = descending ? less_nan_last(y, x) : less_nan_last(x, y);
    if (lt) return true;
    bool gt = descending ? less_nan_last(x, y) : less_nan_last(y, x);
    return !gt && a < b;  // equal: input order
  };
  each_row(self, dim, [&](char* row, const int64_t* idx) {
    for (int64_t i = 0; i < n; ++i) {
      const char* p = row + i * step;
      if constexpr (std::is_same_v<T, float>) {
        if (self.dtype == kFloat16) { uint16_t h; std::memcpy(&h, p, 2); keys[i] = half_to_float(h); }
        else if (self.dtype == kBFloat16) { uint16_t h; std::memcpy(&h, p, 2); keys[i] = bf16_to_float(h); }
        else std::memcpy(&keys[i], p, sizeof(T));
      } else if constexpr (std::is_same_v<T, bool>) {
        keys[i] = *p != 0;
      } else {
        std::memcpy(&keys[i], p, sizeof(T));
      }
      order[i] = i;
    }
    if (k == n) std::sort(order.begin(), order.end(), before);
    else std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    char* vrow = values.data + offset_at(values, idx);
    char* irow = indices.data + offset_at(indices, idx);
    int64_t sitem = itemsize(self.dtype);
    for (int64_t i = 0; i < k; ++i) {
      const char* from = row + order[i] * step;
      if (values.dtype == self.dtype) std::memcpy(vrow + i * vstep, from, sitem);
      else store_double(vrow + i * vstep, values.dtype, load_double(from, self.dtype));
      store_scalar(irow + i * istep, indices.dtype, 0, order[i], true);
    }
  });
}

bool order_all(opforge_context* ctx, const char* op, const View& self, int64_t dim, int64_t k,
               bool descending, const View& values, const View& indices) {
  if (!convertible(values.dtype) || !is_integral(indices.dtype, false)) {
    fail(ctx, "%s: values / indices — found %s / %s — valid: a real values dtype, integer "
         "indices — re-export the program", op, dtype_name(values.dtype), dtype_name(indices.dtype));
    return false;
  }
  if (self.dtype == kFloat16 || self.dtype == kBFloat16) {
    order_rows<float>(self, dim, k, descending, values, indices);
    return true;
  }
  bool ok = dispatch_real(self.dtype, [&](auto t) {
    order_rows<decltype(t)>(self, dim, k, descending, values, indices);
  });
  if (!ok) fail(ctx, "%s: self — found dtype %s — valid: a real dtype", op, dtype_name(self.dtype));
  return ok;
}

void sort(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp, int64_t first) {
  OPF_TENSOR(0, "self", self);
  OPF_INT(first, "dim", dim);
  OPF_BOOL(first + 1, "descending", descending);
  OPF_TENSOR(first + 2, "values", values);
  OPF_TENSOR(first + 3, "indices", indices);
  if (!check_shape(ctx, kOp, values, self.sizes, self.rank) ||
      !check_shape(ctx, kOp, indices, self.sizes, self.rank))
    return;
  if (self.rank == 0) {
    copy_view(ctx, kOp, values, self);
    store_scalar(indices.data, indices.dtype, 0, 0, true);
    return;
  }
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  if (self.numel == 0) return;
  order_all(ctx, kOp, self, d, self.sizes[d], descending, values, indices);
}

void sort_values(opforge_context* c, opforge_arg* a, int64_t n) { sort(c, a, n, "aten::sort.values", 1); }
void sort_values_stable(opforge_context* c, opforge_arg* a, int64_t n) { sort(c, a, n, "aten::sort.values_stable", 2); }

void topk_values(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::topk.values";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "k", k);
  OPF_INT(2, "dim", dim);
  OPF_BOOL(3, "largest", largest);
  OPF_TENSOR(5, "values", values);
  OPF_TENSOR(6, "indices", indices);
  int64_t d = 0;
  if (self.rank && !wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  int64_t size = self.rank ? self.sizes[d] : 1;
  if (k < 0 || k > size) {
    fail(ctx, "%s: k — found %lld — valid: 0 <= k <= %lld, the size of dim %lld — check k "
         "against the input's shape", kOp, (long long)k, (long long)size, (long long)dim);
    return;
  }
  int64_t sizes[kMaxRank];
  for (int j = 0; j < self.rank; ++j) sizes[j] = j == d ? k : self.sizes[j];
  if (!check_shape(ctx, kOp, values, sizes, self.rank) || !check_shape(ctx, kOp, indices, sizes, self.rank))
    return;
  if (self.rank == 0) {
    if (k) {
      copy_view(ctx, kOp, values, self);
      store_scalar(indices.data, indices.dtype, 0, 0, true);
    }
    return;
  }
  if (values.numel == 0) return;
  order_all(ctx, kOp, self, d, k, largest, values, indices);
}

// cumsum / cumprod: each element cast to out's dtype first, accumulated in ATen's CPU
// accumulate type (float16 in float32, float32 and float64 in float64, integers in int64
// wrapping, bool as logical or / and), each prefix cast to out.
template <bool kProduct>
void scan(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp) {
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(3, "out", out);
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  if (!convertible(out.dtype) || !convertible(self.dtype)) {
    fail(ctx, "%s: out — found dtype %s — valid: a real dtype", kOp, dtype_name(out.dtype));
    return;
  }
  if (self.rank == 0) {
    copy_view(ctx, kOp, out, self);
    return;
  }
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d) || out.numel == 0) return;
  int64_t len = self.sizes[d], sstep = self.strides[d] * itemsize(self.dtype);
  int64_t ostep = out.strides[d] * itemsize(out.dtype);
  static const int64_t kZero[1] = {0};
  const int64_t one = 1;
  bool floating = is_floating(out.dtype), boolean = out.dtype == kBool;
  each_row(self, d, [&](char* row, const int64_t* idx) {
    char* orow = out.data + offset_at(out, idx);
    double facc = 0;
    uint64_t iacc = 0;
    for (int64_t i = 0; i < len; ++i) {
      alignas(16) char cast[16];
      convert_strided(cast, out.dtype, kZero, row + i * sstep, self.dtype, kZero, &one, 1);
      char* dst = orow + i * ostep;
      if (floating) {
        double x = load_double(cast, out.dtype);
        facc = i == 0 ? x : kProduct ? facc * x : facc + x;
        if (out.dtype == kFloat16 || out.dtype == kBFloat16) facc = static_cast<float>(facc);
        store_double(dst, out.dtype, facc);
      } else if (boolean) {
        uint64_t x = *cast != 0;
        iacc = i == 0 ? x : kProduct ? (iacc & x) : (iacc | x);
        store_scalar(dst, out.dtype, 0, static_cast<int64_t>(iacc), true);
      } else {
        uint64_t x = static_cast<uint64_t>(load_int64(cast, out.dtype));
        iacc = i == 0 ? x : kProduct ? iacc * x : iacc + x;
        store_scalar(dst, out.dtype, 0, static_cast<int64_t>(iacc), true);
      }
    }
  });
}
void cumsum_out(opforge_context* c, opforge_arg* a, int64_t n) { scan<false>(c, a, n, "aten::cumsum.out"); }
void cumprod_out(opforge_context* c, opforge_arg* a, int64_t n) { scan<true>(c, a, n, "aten::cumprod.out"); }

const KernelDef kSortingKernels[] = {
    {"aten::cumsum.out", "T I ST? T!", cumsum_out},
    {"aten::cumprod.out", "T I ST? T!", cumprod_out},
    {"aten::sort.values", "T I B T! T!", sort_values},
    {"aten::sort.values_stable", "T B? I B T! T!", sort_values_stable},
    {"aten::topk.values", "T I I B B T! T!", topk_values},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(sorting, kSortingKernels)
