// nonzero and masked_select: results whose leading size depends on the inputs' values
// (a data-dependent size, opforge/program/produced.py), as the NumPy kernels of the same
// keys (opforge/kernels/portable/selection.py).
//
// The runtime passes the out at its upper bound (the slot the program planned: its
// leading size is the most the result may hold). The kernel counts the result first,
// refuses one larger than that before writing anything, writes it densely from the
// slot's start, and then sets the out's leading size to the result's: the one case where a
// kernel writes its out's sizes (the runtime gives such an out sizes of its own and binds
// the size's symbol from them after the call; docs/native-runtime.md).
#include <cstring>

#include "copy.h"
#include "gemm.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

bool truthy(const char* p, int32_t dtype) {
  const int64_t size = itemsize(dtype);
  if (dtype == kFloat32) { float v; std::memcpy(&v, p, 4); return v != 0.0f; }
  if (dtype == kFloat64) { double v; std::memcpy(&v, p, 8); return v != 0.0; }
  if (dtype == kFloat16 || dtype == kBFloat16) {  // +-0 is the only zero
    uint16_t h; std::memcpy(&h, p, 2); return (h & 0x7FFF) != 0;
  }
  for (int64_t b = 0; b < size; ++b)
    if (p[b] != 0) return true;
  return false;
}

// The result's size against the out's capacity (its leading size at the upper bound).
bool fits(opforge_context* ctx, const char* op, const View& out, int64_t count) {
  const int64_t capacity = out.rank ? out.sizes[0] : 0;
  if (count <= capacity) return true;
  fail(ctx, "%s: result size — found %lld — valid: at most %lld, the upper bound the program's memory was "
       "planned at — re-export with a larger bound (torch._check(n <= K) where the size is made)",
       op, (long long)count, (long long)capacity);
  return false;
}

void set_leading_size(const View& out, int64_t count) {
  const_cast<int64_t*>(out.t->sizes)[0] = count;  // runtime-owned sizes (see the file comment)
}

// Row-major coordinates of `sizes` (rank dims), one step; false after the last.
bool next(int64_t* idx, const int64_t* sizes, int rank) {
  for (int k = rank - 1; k >= 0; --k) {
    if (++idx[k] < sizes[k]) return true;
    idx[k] = 0;
  }
  return false;
}

int64_t offset(const int64_t* idx, const int64_t* strides, int rank) {
  int64_t off = 0;
  for (int k = 0; k < rank; ++k) off += idx[k] * strides[k];
  return off;
}

void nonzero_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::nonzero.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "out", out);
  if (out.dtype != kInt64 || out.rank != 2 || out.sizes[1] != self.rank || (!out.dense && out.numel > 0)) {
    fail(ctx, "%s: out — found %s of rank %d — valid: a dense int64 (n, %d) tensor — re-export the program",
         kOp, dtype_name(out.dtype), out.rank, self.rank);
    return;
  }
  if (itemsize(self.dtype) == 0) {
    fail(ctx, "%s: self — found dtype %s — valid: a known dtype", kOp, dtype_name(self.dtype));
    return;
  }
  const int64_t item = itemsize(self.dtype);
  int64_t idx[kMaxRank] = {};
  int64_t count = 0;
  if (self.numel > 0) {
    do count += truthy(self.data + offset(idx, self.strides, self.rank) * item, self.dtype);
    while (next(idx, self.sizes, self.rank));
  }
  if (!fits(ctx, kOp, out, count)) return;
  int64_t* dst = out.ptr<int64_t>();
  if (self.numel > 0 && count > 0) {
    std::memset(idx, 0, sizeof(int64_t) * size_t(self.rank));
    do {
      if (!truthy(self.data + offset(idx, self.strides, self.rank) * item, self.dtype)) continue;
      std::memcpy(dst, idx, sizeof(int64_t) * size_t(self.rank));
      dst += self.rank;
    } while (next(idx, self.sizes, self.rank));
  }
  set_leading_size(out, count);
}

void masked_select_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::masked_select.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "mask", mask);
  OPF_TENSOR(2, "out", out);
  if (mask.dtype != kBool && mask.dtype != kUInt8) {
    fail(ctx, "%s: mask — found dtype %s — valid: bool", kOp, dtype_name(mask.dtype));
    return;
  }
  if (out.dtype != self.dtype || out.rank != 1 || (!out.dense && out.numel > 0) || itemsize(self.dtype) == 0) {
    fail(ctx, "%s: out — found %s of rank %d — valid: a dense 1-d tensor of self's dtype %s — re-export the "
         "program", kOp, dtype_name(out.dtype), out.rank, dtype_name(self.dtype));
    return;
  }
  int64_t sizes[kMaxRank];
  int rank = 0;
  if (!broadcast_shape(ctx, kOp, self, mask, sizes, &rank)) return;
  // each operand's strides over the broadcast shape (0 where it is broadcast)
  int64_t sstrides[kMaxRank], mstrides[kMaxRank];
  int64_t total = 1;
  for (int k = 0; k < rank; ++k) {
    int ks = k - (rank - self.rank), km = k - (rank - mask.rank);
    sstrides[k] = ks >= 0 && self.sizes[ks] != 1 ? self.strides[ks] : 0;
    mstrides[k] = km >= 0 && mask.sizes[km] != 1 ? mask.strides[km] : 0;
    total *= sizes[k];  // bounded: broadcast_shape checked the span
  }
  const int64_t item = itemsize(self.dtype);
  int64_t idx[kMaxRank] = {};
  int64_t count = 0;
  if (total > 0) {
    do count += mask.data[offset(idx, mstrides, rank)] != 0;
    while (next(idx, sizes, rank));
  }
  if (!fits(ctx, kOp, out, count)) return;
  char* dst = out.data;
  if (total > 0 && count > 0) {
    std::memset(idx, 0, sizeof(int64_t) * size_t(rank));
    do {
      if (mask.data[offset(idx, mstrides, rank)] == 0) continue;
      std::memcpy(dst, self.data + offset(idx, sstrides, rank) * item, size_t(item));
      dst += item;
    } while (next(idx, sizes, rank));
  }
  set_leading_size(out, count);
}

// bincount: max(self) + 1 (at least minlength) counts of non-negative integer ids, or sums
// of their weights (accumulated in double in input order, rounded once into out, as
// np.bincount with weights), the result's size the data decides (a mixture-of-experts
// layer's tokens per expert).
void bincount_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::bincount.out";
  OPF_TENSOR(0, "self", self);
  View weights;
  bool weighted = false;
  if (!optional_tensor_arg(ctx, args, n, 1, kOp, "weights", &weights, &weighted)) return;
  OPF_INT(2, "minlength", minlength);
  OPF_TENSOR(3, "out", out);
  if (!index_dtype(self.dtype) || self.rank > 1) {
    fail(ctx, "%s: self — found a %d-d %s tensor — valid: a 1-d integer tensor — pass the ids as "
         "a vector", kOp, self.rank, dtype_name(self.dtype));
    return;
  }
  if (weighted && (weights.numel != self.numel || !convertible(weights.dtype))) {
    fail(ctx, "%s: weights — found %lld %s values for %lld ids — valid: one real weight per id — "
         "check the operands", kOp, (long long)weights.numel, dtype_name(weights.dtype),
         (long long)self.numel);
    return;
  }
  const bool float_out = out.dtype == kFloat32 || out.dtype == kFloat64;
  if (out.rank != 1 || (!out.dense && out.numel > 0) || (weighted ? !float_out : out.dtype != kInt64)) {
    fail(ctx, "%s: out — found %s of rank %d — valid: a dense 1-d %s tensor — re-export the program",
         kOp, dtype_name(out.dtype), out.rank, weighted ? "float32 or float64" : "int64");
    return;
  }
  if (minlength < 0) {
    fail(ctx, "%s: minlength — found %lld — valid: >= 0 — pass a non-negative length", kOp,
         (long long)minlength);
    return;
  }
  const int64_t item = itemsize(self.dtype), step = (self.rank ? self.strides[0] : 0) * item;
  int64_t count = minlength;
  for (int64_t i = 0; i < self.numel; ++i) {
    int64_t v = read_index(self.data + i * step, self.dtype);
    if (v < 0) {
      fail(ctx, "%s: self — found the id %lld — valid: non-negative integers — pass non-negative "
           "ids", kOp, (long long)v);
      return;
    }
    if (v >= count) count = v == INT64_MAX ? v : v + 1;  // INT64_MAX: refused by fits()
  }
  if (!fits(ctx, kOp, out, count)) return;
  if (!weighted) {
    int64_t* dst = out.ptr<int64_t>();
    std::memset(dst, 0, sizeof(int64_t) * size_t(count));
    for (int64_t i = 0; i < self.numel; ++i) {
      int64_t v = read_index(self.data + i * step, self.dtype);
      if (v >= 0 && v < count) ++dst[v];  // rechecked: out may alias self
    }
  } else {
    // the sums in double, in out's own slot when out is float64, else a zeroed scratch row
    double* sums = out.dtype == kFloat64
        ? out.ptr<double>() : static_cast<double*>(scratch(ctx, 0, count * int64_t(sizeof(double))));
    if (!sums) {
      fail(ctx, "%s: a float64 row of %lld sums — could not be allocated within the memory limit",
           kOp, (long long)count);
      return;
    }
    std::memset(sums, 0, sizeof(double) * size_t(count));
    const int64_t wstep = (weights.rank ? weights.strides[0] : 0) * itemsize(weights.dtype);
    for (int64_t i = 0; i < self.numel; ++i) {
      int64_t v = read_index(self.data + i * step, self.dtype);
      if (v >= 0 && v < count) sums[v] += load_double(weights.data + i * wstep, weights.dtype);
    }
    if (out.dtype == kFloat32)
      for (int64_t i = 0; i < count; ++i) store_double(out.data + i * 4, kFloat32, sums[i]);
  }
  set_leading_size(out, count);
}

const KernelDef kSelectionKernels[] = {
    {"aten::nonzero.out", "T T!", nonzero_out},
    {"aten::masked_select.out", "T T T!", masked_select_out},
    {"aten::bincount.out", "T T? I T!", bincount_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(selection, opforge::portable::kSelectionKernels)
