// The copy forms of view ops (view_copy, permute_copy, expand_copy, slice_copy, ...),
// clone and dtype conversion: each is one strided copy (copy.h) from the input, read
// through the view's sizes and strides, into out. The NumPy kernels of the same keys
// (opforge/kernels/portable/view_copy.py) are the specification.
#include <cstring>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

// Copy self's elements in row-major order into out's row-major order (a reshape):
// whichever side is contiguous is viewed with the other's shape.
bool reshape_copy(opforge_context* ctx, const char* op, const View& self, const View& out) {
  if (self.numel != out.numel) {
    fail(ctx, "%s: out — found %lld elements for an input of %lld — valid: the same element "
         "count — re-export the program", op, (long long)out.numel, (long long)self.numel);
    return false;
  }
  int64_t strides[kMaxRank];
  if (out.dense) {
    contiguous_strides(self.sizes, self.rank, strides);
    View dst = self;
    dst.data = out.data, dst.dtype = out.dtype, dst.strides = strides;
    return copy_view(ctx, op, dst, self);
  }
  if (self.dense) {
    contiguous_strides(out.sizes, out.rank, strides);
    View src = out;
    src.data = self.data, src.dtype = self.dtype, src.strides = strides;
    return copy_view(ctx, op, out, src);
  }
  fail(ctx, "%s: out — found a strided out and a strided input — valid: one of them "
       "contiguous — pass a contiguous out", op);
  return false;
}

// Copy `src` (sizes = out's) into out.
bool copy_into(opforge_context* ctx, const char* op, const View& out, char* data,
               int32_t dtype, const int64_t* strides) {
  View src = out;
  src.data = data, src.dtype = dtype, src.strides = strides;
  return copy_view(ctx, op, out, src);
}

void view_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::view_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "size", size, count);
  OPF_TENSOR(2, "out", out);
  bool ok = count == out.rank;
  for (int64_t d = 0; ok && d < count; ++d) ok = size[d] == -1 || size[d] == out.sizes[d];
  if (!ok) {
    fail(ctx, "%s: out — its shape does not match size (%lld entries) — valid: out planned "
         "with the view's shape — re-export the program", kOp, (long long)count);
    return;
  }
  reshape_copy(ctx, kOp, self, out);
}

void view_copy_dtype_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::view_copy.dtype_out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(2, "out", out);
  int64_t in_bytes = self.numel * itemsize(self.dtype), out_bytes = out.numel * itemsize(out.dtype);
  if (in_bytes != out_bytes || !out.dense) {
    fail(ctx, "%s: out — found %lld bytes%s for an input of %lld bytes — valid: a contiguous "
         "out of the same byte size — re-export the program", kOp, (long long)out_bytes,
         out.dense ? "" : " (strided)", (long long)in_bytes);
    return;
  }
  int64_t strides[kMaxRank];
  contiguous_strides(self.sizes, self.rank, strides);
  copy_strided(out.data, strides, self.data, self.strides, self.sizes, self.rank, itemsize(self.dtype));
}

void permute_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::permute_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "dims", dims, count);
  OPF_TENSOR(2, "out", out);
  if (count != self.rank) {
    fail(ctx, "%s: dims — found %lld entries for a rank-%d input — valid: one per dimension — "
         "re-export the program", kOp, (long long)count, self.rank);
    return;
  }
  int64_t sizes[kMaxRank], strides[kMaxRank];
  bool seen[kMaxRank] = {};
  for (int d = 0; d < self.rank; ++d) {
    int64_t k;
    if (!wrap_dim(ctx, kOp, dims[d], self.rank, &k)) return;
    if (seen[k]) {
      fail(ctx, "%s: dims — dim %lld appears twice — valid: a permutation of 0..%d — "
           "re-export the program", kOp, (long long)dims[d], self.rank - 1);
      return;
    }
    seen[k] = true;
    sizes[d] = self.sizes[k];
    strides[d] = self.strides[k];
  }
  if (!check_shape(ctx, kOp, out, sizes, self.rank)) return;
  copy_into(ctx, kOp, out, self.data, self.dtype, strides);
}

void transpose_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::transpose_copy.int_out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim0", dim0);
  OPF_INT(2, "dim1", dim1);
  OPF_TENSOR(3, "out", out);
  int64_t a, b;
  if (!wrap_dim(ctx, kOp, dim0, self.rank, &a) || !wrap_dim(ctx, kOp, dim1, self.rank, &b)) return;
  int64_t sizes[kMaxRank], strides[kMaxRank];
  for (int d = 0; d < self.rank; ++d) sizes[d] = self.sizes[d], strides[d] = self.strides[d];
  if (self.rank > 0) {
    sizes[a] = self.sizes[b], strides[a] = self.strides[b];
    sizes[b] = self.sizes[a], strides[b] = self.strides[a];
  }
  if (!check_shape(ctx, kOp, out, sizes, self.rank)) return;
  copy_into(ctx, kOp, out, self.data, self.dtype, strides);
}

void t_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::t_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "out", out);
  if (self.rank > 2) {
    fail(ctx, "%s: self — found rank %d — valid: rank 0, 1 or 2 — use permute_copy", kOp, self.rank);
    return;
  }
  int64_t sizes[2], strides[2];
  for (int d = 0; d < self.rank; ++d) {
    sizes[d] = self.sizes[self.rank - 1 - d];
    strides[d] = self.strides[self.rank - 1 - d];
  }
  if (!check_shape(ctx, kOp, out, sizes, self.rank)) return;
  copy_into(ctx, kOp, out, self.data, self.dtype, strides);
}

void expand_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::expand_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "size", size, count);
  OPF_TENSOR(3, "out", out);
  bool ok = count == out.rank;
  for (int64_t d = 0; ok && d < count; ++d) ok = size[d] == -1 || size[d] == out.sizes[d];
  if (!ok) {
    fail(ctx, "%s: out — its shape does not match size (%lld entries) — valid: out planned "
         "with the expanded shape — re-export the program", kOp, (long long)count);
    return;
  }
  int64_t strides[kMaxRank];
  if (!broadcast_strides(ctx, kOp, "self", self, out.sizes, out.rank, strides)) return;
  copy_into(ctx, kOp, out, self.data, self.dtype, strides);
}

void slice_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::slice_copy.Tensor_out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_INT(4, "step", step);
  OPF_TENSOR(5, "out", out);
  if (self.rank == 0) {
    fail(ctx, "%s: self — found a 0-d tensor — valid: rank >= 1 — re-export the program", kOp);
    return;
  }
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  if (step <= 0) {
    fail(ctx, "%s: step — found %lld — valid: step >= 1 — re-export the program", kOp, (long long)step);
    return;
  }
  int64_t size = self.sizes[d], start = 0, end = size;
  if (!is_none(args, n, 2) && !int_arg(ctx, args, n, 2, kOp, "start", &start)) return;
  if (!is_none(args, n, 3) && !int_arg(ctx, args, n, 3, kOp, "end", &end)) return;
  // Python's (and ATen's) clamping of out-of-range bounds
  if (start < 0) start = start < -size ? 0 : start + size;
  if (end < 0) end = end < -size ? 0 : end + size;
  if (start > size) start = size;
  if (end > size) end = size;
  int64_t len = end > start ? (end - start - 1) / step + 1 : 0;
  int64_t sizes[kMaxRank], strides[kMaxRank];
  for (int k = 0; k < self.rank; ++k) sizes[k] = self.sizes[k], strides[k] = self.strides[k];
  sizes[d] = len;
  if (!check_shape(ctx, kOp, out, sizes, self.rank)) return;
  if (out.numel == 0) return;
  strides[d] = self.strides[d] * step;
  copy_into(ctx, kOp, out, self.data + start * self.strides[d] * itemsize(self.dtype), self.dtype, strides);
}

void select_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::select_copy.int_out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_INT(2, "index", index);
  OPF_TENSOR(3, "out", out);
  if (self.rank == 0) {
    fail(ctx, "%s: self — found a 0-d tensor — valid: rank >= 1 — re-export the program", kOp);
    return;
  }
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  int64_t size = self.sizes[d];
  if (index < -size || index >= size) {
    fail(ctx, "%s: index — found %lld — valid: [%lld, %lld] for dim %lld of size %lld — check "
         "the index against the tensor's shape", kOp, (long long)index, (long long)-size,
         (long long)(size - 1), (long long)d, (long long)size);
    return;
  }
  if (index < 0) index += size;
  int64_t sizes[kMaxRank], strides[kMaxRank];
  int r = 0;
  for (int k = 0; k < self.rank; ++k)
    if (k != d) sizes[r] = self.sizes[k], strides[r++] = self.strides[k];
  if (!check_shape(ctx, kOp, out, sizes, r)) return;
  copy_into(ctx, kOp, out, self.data + index * self.strides[d] * itemsize(self.dtype), self.dtype, strides);
}

// squeeze (all), alias, lift_fresh, detach: out has self's shape (less its 1s for squeeze)
template <bool kSqueeze>
void same_shape_copy(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp) {
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "out", out);
  int64_t sizes[kMaxRank];
  int r = 0;
  for (int k = 0; k < self.rank; ++k)
    if (!kSqueeze || self.sizes[k] != 1) sizes[r++] = self.sizes[k];
  if (!check_shape(ctx, kOp, out, sizes, r)) return;
  reshape_copy(ctx, kOp, self, out);
}
void squeeze_copy_out(opforge_context* c, opforge_arg* a, int64_t n) { same_shape_copy<true>(c, a, n, "aten::squeeze_copy.out"); }
void alias_copy_out(opforge_context* c, opforge_arg* a, int64_t n) { same_shape_copy<false>(c, a, n, "aten::alias_copy.out"); }
void lift_fresh_copy_out(opforge_context* c, opforge_arg* a, int64_t n) { same_shape_copy<false>(c, a, n, "aten::lift_fresh_copy.out"); }
void detach_copy_out(opforge_context* c, opforge_arg* a, int64_t n) { same_shape_copy<false>(c, a, n, "aten::detach_copy.out"); }

// squeeze_copy.dim_out / dims_out: the listed dims of size 1 dropped
void squeeze_dims(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp,
                  const int64_t* dims, int64_t count) {
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(2, "out", out);
  bool drop[kMaxRank] = {};
  for (int64_t i = 0; i < count; ++i) {
    int64_t d;
    if (!wrap_dim(ctx, kOp, dims[i], self.rank, &d)) return;
    if (self.rank > 0 && self.sizes[d] == 1) drop[d] = true;
  }
  int64_t sizes[kMaxRank];
  int r = 0;
  for (int k = 0; k < self.rank; ++k)
    if (!drop[k]) sizes[r++] = self.sizes[k];
  if (!check_shape(ctx, kOp, out, sizes, r)) return;
  reshape_copy(ctx, kOp, self, out);
}

void squeeze_copy_dim_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::squeeze_copy.dim_out";
  OPF_INT(1, "dim", dim);
  squeeze_dims(ctx, args, n, kOp, &dim, 1);
}

void squeeze_copy_dims_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::squeeze_copy.dims_out";
  OPF_INTS(1, "dim", dims, count);
  if (count < 0) count = 0;
  squeeze_dims(ctx, args, n, kOp, dims, count);
}

void unsqueeze_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::unsqueeze_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "out", out);
  if (self.rank >= kMaxRank) {
    fail(ctx, "%s: self — found rank %d — valid: rank < %d — re-export the program", kOp, self.rank, kMaxRank);
    return;
  }
  int64_t d = dim < 0 ? dim + self.rank + 1 : dim;
  if (d < 0 || d > self.rank) {
    fail(ctx, "%s: dim %lld is out of range — valid: [%d, %d]", kOp, (long long)dim,
         -self.rank - 1, self.rank);
    return;
  }
  int64_t sizes[kMaxRank];
  for (int k = 0, r = 0; k <= self.rank; ++k) sizes[k] = k == d ? 1 : self.sizes[r++];
  if (!check_shape(ctx, kOp, out, sizes, self.rank + 1)) return;
  reshape_copy(ctx, kOp, self, out);
}

// clone, _to_copy: out has self's shape and the target dtype
void converting_copy(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp, int64_t out_index) {
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(out_index, "out", out);
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  copy_view(ctx, kOp, out, self);
}
void clone_out(opforge_context* c, opforge_arg* a, int64_t n) { converting_copy(c, a, n, "aten::clone.out", 2); }
void to_copy_out(opforge_context* c, opforge_arg* a, int64_t n) { converting_copy(c, a, n, "aten::_to_copy.out", 3); }

void copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_TENSOR(1, "src", src);
  OPF_TENSOR(3, "out", out);
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  int64_t strides[kMaxRank];
  if (!broadcast_strides(ctx, kOp, "src", src, out.sizes, out.rank, strides)) return;
  copy_into(ctx, kOp, out, src.data, src.dtype, strides);
}

void diagonal_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::diagonal_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "offset", offset);
  OPF_INT(2, "dim1", dim1);
  OPF_INT(3, "dim2", dim2);
  OPF_TENSOR(4, "out", out);
  int64_t a, b;
  if (self.rank < 2) {
    fail(ctx, "%s: self — found rank %d — valid: rank >= 2 — re-export the program", kOp, self.rank);
    return;
  }
  if (!wrap_dim(ctx, kOp, dim1, self.rank, &a) || !wrap_dim(ctx, kOp, dim2, self.rank, &b)) return;
  if (a == b) {
    fail(ctx, "%s: dim1 and dim2 — both are dim %lld — valid: two different dims — re-export "
         "the program", kOp, (long long)a);
    return;
  }
  int64_t na = self.sizes[a], nb = self.sizes[b], len, start;
  if (offset >= 0) {
    len = offset >= nb ? 0 : (na < nb - offset ? na : nb - offset);
    start = len ? offset * self.strides[b] : 0;
  } else {
    len = -offset >= na ? 0 : (na + offset < nb ? na + offset : nb);
    start = len ? -offset * self.strides[a] : 0;
  }
  int64_t sizes[kMaxRank], strides[kMaxRank];
  int r = 0;
  for (int k = 0; k < self.rank; ++k)
    if (k != a && k != b) sizes[r] = self.sizes[k], strides[r++] = self.strides[k];
  sizes[r] = len, strides[r++] = self.strides[a] + self.strides[b];
  if (!check_shape(ctx, kOp, out, sizes, r)) return;
  if (out.numel == 0) return;
  copy_into(ctx, kOp, out, self.data + start * itemsize(self.dtype), self.dtype, strides);
}

// as_strided_copy: sizes, strides and offset in elements of self's row-major order (its
// "storage", see view_copy.py), every reach checked against self's element count.
void as_strided_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::as_strided_copy.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "size", size, count);
  OPF_INTS(2, "stride", stride, scount);
  OPF_TENSOR(4, "out", out);
  int64_t offset = 0;
  if (!is_none(args, n, 3) && !int_arg(ctx, args, n, 3, kOp, "storage_offset", &offset)) return;
  if (count < 0 || scount != count || count > kMaxRank) {
    fail(ctx, "%s: arguments — %lld sizes and %lld strides — valid: one stride per size — "
         "re-export the program", kOp, (long long)count, (long long)scount);
    return;
  }
  bool negative = offset < 0;
  for (int64_t d = 0; d < count; ++d) negative = negative || size[d] < 0 || stride[d] < 0;
  if (negative) {
    fail(ctx, "%s: arguments — a negative size, stride or storage_offset — valid: "
         "non-negative sizes, strides and offset — re-export the program", kOp);
    return;
  }
  if (!check_shape(ctx, kOp, out, size, static_cast<int>(count))) return;
  if (out.numel == 0) return;
  int64_t reach = offset;
  for (int64_t d = 0; d < count; ++d) {
    int64_t step;
    if (!mul_ok(size[d] - 1, stride[d], &step) || !add_ok(reach, step, &reach)) reach = INT64_MAX;
  }
  if (reach >= self.numel) {
    fail(ctx, "%s: arguments — size, stride and storage_offset=%lld reach element %lld of an "
         "input of %lld elements — valid: reads within elements 0..%lld (the input's elements "
         "in row-major order are its storage) — re-export the program", kOp, (long long)offset,
         (long long)reach, (long long)self.numel, (long long)(self.numel - 1));
    return;
  }
  int64_t strides[kMaxRank];
  for (int64_t d = 0; d < count; ++d) strides[d] = size[d] > 1 ? stride[d] : 0;
  if (self.dense) {
    copy_into(ctx, kOp, out, self.data + offset * itemsize(self.dtype), self.dtype, strides);
    return;
  }
  // a strided input: each element's storage position unravelled into self's coordinates
  if (out.dtype != self.dtype || !out.dense) {
    fail(ctx, "%s: self — a strided input with a strided or converting out — valid: a "
         "contiguous input — pass a contiguous copy", kOp);
    return;
  }
  int64_t item = itemsize(self.dtype), idx[kMaxRank] = {};
  for (int64_t e = 0; e < out.numel; ++e) {
    int64_t flat = offset, at = 0;
    for (int64_t d = 0; d < count; ++d) flat += idx[d] * strides[d];
    for (int k = self.rank - 1; k >= 0; --k) {
      at += (flat % self.sizes[k]) * self.strides[k];
      flat /= self.sizes[k];
    }
    std::memcpy(out.data + e * item, self.data + at * item, item);
    for (int64_t d = count - 1; d >= 0; --d) {
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
  }
}

const KernelDef kViewCopyKernels[] = {
    {"aten::view_copy.out", "T IL T!", view_copy_out},
    {"aten::_unsafe_view.out", "T IL T!", view_copy_out},
    {"aten::view_copy.dtype_out", "T ST T!", view_copy_dtype_out},
    {"aten::permute_copy.out", "T IL T!", permute_copy_out},
    {"aten::transpose_copy.int_out", "T I I T!", transpose_copy_out},
    {"aten::t_copy.out", "T T!", t_copy_out},
    {"aten::expand_copy.out", "T IL B T!", expand_copy_out},
    {"aten::slice_copy.Tensor_out", "T I I? I? I T!", slice_copy_out},
    {"aten::select_copy.int_out", "T I I T!", select_copy_out},
    {"aten::squeeze_copy.out", "T T!", squeeze_copy_out},
    {"aten::alias_copy.out", "T T!", alias_copy_out},
    {"aten::lift_fresh_copy.out", "T T!", lift_fresh_copy_out},
    {"aten::detach_copy.out", "T T!", detach_copy_out},
    {"aten::squeeze_copy.dim_out", "T I T!", squeeze_copy_dim_out},
    {"aten::squeeze_copy.dims_out", "T IL T!", squeeze_copy_dims_out},
    {"aten::unsqueeze_copy.out", "T I T!", unsqueeze_copy_out},
    {"aten::clone.out", "T I? T!", clone_out},
    {"aten::_to_copy.out", "T B I? T!", to_copy_out},
    {"aten::copy.out", "T T B T!", copy_out},
    {"aten::diagonal_copy.out", "T I I I T!", diagonal_copy_out},
    {"aten::as_strided_copy.out", "T IL IL I? T!", as_strided_copy_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(view_copy, kViewCopyKernels)
