// Ops that join, split or rearrange whole tensors: cat, stack, split, unbind, constant
// padding, repeat, flip, roll, pixel_shuffle. Each is a few strided copies (copy.h); the
// NumPy kernels of the same keys (opforge/kernels/portable/shape.py) are the specification.
#include <algorithm>
#include <cstring>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

bool same_except(const View& a, const View& b, int64_t dim) {
  if (a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (d != dim && a.sizes[d] != b.sizes[d]) return false;
  return true;
}

void cat_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::cat.out";
  const opforge_tensor* items;
  int64_t count;
  if (!tensor_list_arg(ctx, args, n, 0, kOp, "tensors", &items, &count)) return;
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "out", out);
  if (count == 0 || out.rank == 0) {
    fail(ctx, "%s: tensors — found %s — valid: one or more tensors of rank >= 1 — re-export "
         "the program", kOp, count == 0 ? "an empty list" : "0-d tensors");
    return;
  }
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, out.rank, &d)) return;
  // ATen's legacy rule: 1-d empty tensors are skipped whatever the other ranks are
  bool all_skipped = true;
  for (int64_t i = 0; i < count; ++i)
    if (!(items[i].rank == 1 && items[i].sizes && items[i].sizes[0] == 0)) all_skipped = false;
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    View v;
    if (!list_item(ctx, items[i], kOp, "tensors[i]", &v)) return;
    if (!all_skipped && v.rank == 1 && v.sizes[0] == 0) continue;
    if (!same_except(v, out, d)) {
      fail(ctx, "%s: tensors[%lld] — its shape does not match out's outside dim %lld — valid: "
           "equal sizes in every other dim — re-export the program", kOp, (long long)i, (long long)d);
      return;
    }
    total += v.sizes[d];
  }
  if (total != out.sizes[d]) {
    fail(ctx, "%s: out — found size %lld in dim %lld, the tensors add up to %lld — valid: out "
         "planned with the result's shape — re-export the program", kOp,
         (long long)out.sizes[d], (long long)d, (long long)total);
    return;
  }
  int64_t offset = 0, item = itemsize(out.dtype);
  for (int64_t i = 0; i < count; ++i) {
    View v;
    list_item(ctx, items[i], kOp, "tensors[i]", &v);
    if (!all_skipped && v.rank == 1 && v.sizes[0] == 0) continue;
    if (v.numel && !copy_checked(ctx, kOp, out.data + offset * out.strides[d] * item, out.dtype,
                                 out.strides, v.data, v.dtype, v.strides, v.sizes, v.rank))
      return;
    offset += v.sizes[d];
  }
}

void stack_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::stack.out";
  const opforge_tensor* items;
  int64_t count;
  if (!tensor_list_arg(ctx, args, n, 0, kOp, "tensors", &items, &count)) return;
  OPF_INT(1, "dim", dim);
  OPF_TENSOR(2, "out", out);
  if (count == 0) {
    fail(ctx, "%s: tensors — found an empty list — valid: one or more tensors — re-export the "
         "program", kOp);
    return;
  }
  View first;
  if (!list_item(ctx, items[0], kOp, "tensors[0]", &first)) return;
  if (first.rank >= kMaxRank) {
    fail(ctx, "%s: tensors — found rank %d — valid: rank < %d", kOp, first.rank, kMaxRank);
    return;
  }
  int64_t d;
  if (!wrap_dim(ctx, kOp, dim, first.rank + 1, &d)) return;
  int64_t sizes[kMaxRank], strides[kMaxRank];
  for (int k = 0, r = 0; k <= first.rank; ++k) sizes[k] = k == d ? count : first.sizes[r++];
  if (!check_shape(ctx, kOp, out, sizes, first.rank + 1)) return;
  for (int64_t i = 0; i < count; ++i) {
    View v;
    if (!list_item(ctx, items[i], kOp, "tensors[i]", &v)) return;
    if (!same_except(v, first, -1)) {
      fail(ctx, "%s: tensors[%lld] — its shape differs from tensors[0]'s — valid: tensors of "
           "one shape — re-export the program", kOp, (long long)i);
      return;
    }
  }
  for (int k = 0, r = 0; k <= first.rank; ++k)
    if (k != d) strides[r++] = out.strides[k];
  int64_t item = itemsize(out.dtype);
  for (int64_t i = 0; i < count; ++i) {
    View v;
    list_item(ctx, items[i], kOp, "tensors[i]", &v);
    if (v.numel && !copy_checked(ctx, kOp, out.data + i * out.strides[d] * item, out.dtype,
                                 strides, v.data, v.dtype, v.strides, v.sizes, v.rank))
      return;
  }
}

// The pieces of self along dim into the out list, piece i of size sizes(i); every piece
// checked before anything is written.
template <typename SizeOf>
void split_into(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp,
                int64_t out_index, int64_t pieces, SizeOf size_of) {
  OPF_TENSOR(0, "self", self);
  OPF_INT(2, "dim", dim);
  const opforge_tensor* items;
  int64_t count;
  if (!tensor_list_arg(ctx, args, n, out_index, kOp, "out", &items, &count)) return;
  int64_t d;
  if (self.rank == 0) {
    fail(ctx, "%s: self — found a 0-d tensor — valid: rank >= 1 — re-export the program", kOp);
    return;
  }
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  if (pieces < 0) return;  // ctx failed by the caller's size rule
  if (count != pieces) {
    fail(ctx, "%s: out — found %lld tensors — valid: %lld, one per piece — re-export the "
         "program", kOp, (long long)count, (long long)pieces);
    return;
  }
  int64_t sizes[kMaxRank], start = 0;
  for (int k = 0; k < self.rank; ++k) sizes[k] = self.sizes[k];
  for (int64_t i = 0; i < count; ++i) {
    View v;
    if (!list_item(ctx, items[i], kOp, "out[i]", &v)) return;
    sizes[d] = size_of(i);
    if (sizes[d] < 0 || !check_shape(ctx, kOp, v, sizes, self.rank)) {
      if (sizes[d] < 0) fail(ctx, "%s: split size %lld is negative — valid: >= 0", kOp, (long long)sizes[d]);
      return;
    }
    start += sizes[d];
  }
  if (start != self.sizes[d]) {
    fail(ctx, "%s: split sizes — add up to %lld — valid: %lld, the size of dim %lld — "
         "re-export the program", kOp, (long long)start, (long long)self.sizes[d], (long long)d);
    return;
  }
  start = 0;
  int64_t item = itemsize(self.dtype);
  for (int64_t i = 0; i < count; ++i) {
    View v;
    list_item(ctx, items[i], kOp, "out[i]", &v);
    if (v.numel && !copy_checked(ctx, kOp, v.data, v.dtype, v.strides,
                                 self.data + start * self.strides[d] * item, self.dtype,
                                 self.strides, v.sizes, v.rank))
      return;
    start += v.sizes[d];
  }
}

void split_with_sizes_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::split_with_sizes_copy.out";
  OPF_INTS(1, "split_sizes", split, count);
  split_into(ctx, args, n, kOp, 3, count, [&](int64_t i) { return split[i]; });
}

void split_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::split_copy.Tensor_out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "split_size", split);
  OPF_INT(2, "dim", dim);
  int64_t d = 0;
  if (self.rank && !wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  int64_t size = self.rank ? self.sizes[d] : 0, pieces = 1;
  if (split > 0) {
    pieces = size == 0 ? 1 : (size + split - 1) / split;
  } else if (!(split == 0 && size == 0)) {
    fail(ctx, "%s: split_size — found %lld for a dim of size %lld — valid: >= 1 (0 only for "
         "an empty dim) — re-export the program", kOp, (long long)split, (long long)size);
    return;
  }
  split_into(ctx, args, n, kOp, 3, pieces, [&](int64_t i) {
    int64_t left = size - i * split;
    return left < split ? left : split;
  });
}

void unbind_copy_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::unbind_copy.int_out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "dim", dim);
  const opforge_tensor* items;
  int64_t count;
  if (!tensor_list_arg(ctx, args, n, 2, kOp, "out", &items, &count)) return;
  int64_t d;
  if (self.rank == 0) {
    fail(ctx, "%s: self — found a 0-d tensor — valid: rank >= 1 — re-export the program", kOp);
    return;
  }
  if (!wrap_dim(ctx, kOp, dim, self.rank, &d)) return;
  if (count != self.sizes[d]) {
    fail(ctx, "%s: out — found %lld tensors — valid: %lld, the size of dim %lld — re-export "
         "the program", kOp, (long long)count, (long long)self.sizes[d], (long long)d);
    return;
  }
  int64_t sizes[kMaxRank], strides[kMaxRank];
  int r = 0;
  for (int k = 0; k < self.rank; ++k)
    if (k != d) sizes[r] = self.sizes[k], strides[r++] = self.strides[k];
  for (int64_t i = 0; i < count; ++i) {
    View v;
    if (!list_item(ctx, items[i], kOp, "out[i]", &v) || !check_shape(ctx, kOp, v, sizes, r)) return;
  }
  int64_t item = itemsize(self.dtype);
  for (int64_t i = 0; i < count; ++i) {
    View v;
    list_item(ctx, items[i], kOp, "out[i]", &v);
    if (!copy_checked(ctx, kOp, v.data, v.dtype, v.strides, self.data + i * self.strides[d] * item,
                      self.dtype, strides, v.sizes, v.rank))
      return;
  }
}

void constant_pad_nd_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::constant_pad_nd.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "pad", pad, count);
  OPF_TENSOR(3, "out", out);
  double value;
  int64_t ivalue;
  bool integral;
  if (!scalar_arg(ctx, args, n, 2, kOp, "value", &value, &ivalue, &integral)) return;
  if (count % 2 || count / 2 > self.rank) {
    fail(ctx, "%s: pad — found %lld entries for a rank-%d input — valid: an even count, at most "
         "two per dimension — re-export the program", kOp, (long long)count, self.rank);
    return;
  }
  int64_t sizes[kMaxRank], src_off = 0, dst_off = 0, copy[kMaxRank];
  for (int d = 0; d < self.rank; ++d) sizes[d] = self.sizes[d], copy[d] = self.sizes[d];
  bool empty = false;
  for (int64_t i = 0; i < count / 2; ++i) {
    int axis = self.rank - 1 - static_cast<int>(i);
    int64_t lo = pad[2 * i], hi = pad[2 * i + 1], size = self.sizes[axis], total;
    if (!add_ok(size, lo, &total) || !add_ok(total, hi, &total) || total < 0) {
      fail(ctx, "%s: pad — (%lld, %lld) on dim %d of size %lld — valid: a non-negative result "
           "— re-export the program", kOp, (long long)lo, (long long)hi, axis, (long long)size);
      return;
    }
    sizes[axis] = total;
    int64_t from = lo < 0 ? -lo : 0, to = lo > 0 ? lo : 0;
    int64_t keep = size - from - (hi < 0 ? -hi : 0);
    if (keep <= 0) empty = true;
    copy[axis] = keep > 0 ? keep : 0;
    src_off += from * self.strides[axis];
    dst_off += to * out.strides[axis];
  }
  if (!check_shape(ctx, kOp, out, sizes, self.rank)) return;
  if (!fill_scalar(ctx, kOp, out, value, ivalue, integral)) return;
  if (empty || self.numel == 0) return;
  copy_checked(ctx, kOp, out.data + dst_off * itemsize(out.dtype), out.dtype, out.strides,
               self.data + src_off * itemsize(self.dtype), self.dtype, self.strides, copy, self.rank);
}

void repeat_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::repeat.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "repeats", repeats, count);
  OPF_TENSOR(2, "out", out);
  if (count < self.rank || count > kMaxRank) {
    fail(ctx, "%s: repeats — found %lld entries for a rank-%d input — valid: at least one per "
         "dimension — re-export the program", kOp, (long long)count, self.rank);
    return;
  }
  int r = static_cast<int>(count), lead = r - self.rank;
  int64_t sizes[kMaxRank], csizes[kMaxCopyRank], dst[kMaxCopyRank], src[kMaxCopyRank];
  for (int d = 0; d < r; ++d) {
    int64_t s = d < lead ? 1 : self.sizes[d - lead];
    if (repeats[d] < 0 || !mul_ok(s, repeats[d], &sizes[d])) {
      fail(ctx, "%s: repeats — found %lld for dim %d — valid: >= 0 — re-export the program",
           kOp, (long long)repeats[d], d);
      return;
    }
  }
  if (!check_shape(ctx, kOp, out, sizes, r)) return;
  if (out.numel == 0) return;
  for (int d = 0; d < r; ++d) {
    int64_t s = d < lead ? 1 : self.sizes[d - lead];
    csizes[2 * d] = repeats[d], csizes[2 * d + 1] = s;
    dst[2 * d] = s * out.strides[d], dst[2 * d + 1] = out.strides[d];
    src[2 * d] = 0, src[2 * d + 1] = d < lead ? 0 : self.strides[d - lead];
  }
  copy_checked(ctx, kOp, out.data, out.dtype, dst, self.data, self.dtype, src, csizes, 2 * r);
}

void flip_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::flip.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "dims", dims, count);
  OPF_TENSOR(2, "out", out);
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  bool flip[kMaxRank] = {};
  for (int64_t i = 0; i < count; ++i) {
    int64_t d;
    if (!wrap_dim(ctx, kOp, dims[i], self.rank, &d)) return;
    if (flip[d]) {
      fail(ctx, "%s: dims — dim %lld appears twice — valid: distinct dims — re-export the "
           "program", kOp, (long long)d);
      return;
    }
    flip[d] = true;
  }
  if (self.numel == 0) return;
  int64_t strides[kMaxRank], offset = 0;
  for (int d = 0; d < self.rank; ++d) {
    strides[d] = flip[d] ? -self.strides[d] : self.strides[d];
    if (flip[d]) offset += (self.sizes[d] - 1) * self.strides[d];
  }
  copy_checked(ctx, kOp, out.data, out.dtype, out.strides, self.data + offset * itemsize(self.dtype),
               self.dtype, strides, self.sizes, self.rank);
}

template <typename T>
void rotate_elements(char* data, int64_t count, int64_t shift) {
  T* p = reinterpret_cast<T*>(data);
  std::rotate(p, p + (count - shift), p + count);  // element i moves to i + shift
}

void roll_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::roll.out";
  OPF_TENSOR(0, "self", self);
  OPF_INTS(1, "shifts", shifts, scount);
  OPF_INTS(2, "dims", dims, dcount);
  OPF_TENSOR(3, "out", out);
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank)) return;
  if (dcount == 0 ? scount != 1 : scount != dcount) {
    fail(ctx, "%s: shifts — found %lld shifts for %lld dims — valid: one shift per dim (one "
         "shift with no dims) — re-export the program", kOp, (long long)scount, (long long)dcount);
    return;
  }
  if (self.numel == 0) return;
  int64_t item = itemsize(self.dtype);
  if (dcount == 0) {  // roll the flattened tensor
    if (!out.dense || out.dtype != self.dtype) {
      fail(ctx, "%s: out — a strided or converting out for a flattened roll — valid: a "
           "contiguous out of self's dtype — re-export the program", kOp);
      return;
    }
    int64_t strides[kMaxRank], N = self.numel, s = shifts[0] % N;
    if (s < 0) s += N;
    contiguous_strides(self.sizes, self.rank, strides);
    copy_strided(out.data, strides, self.data, self.strides, self.sizes, self.rank, item);
    if (s == 0) return;
    switch (item) {
      case 1: rotate_elements<uint8_t>(out.data, N, s); break;
      case 2: rotate_elements<uint16_t>(out.data, N, s); break;
      case 4: rotate_elements<uint32_t>(out.data, N, s); break;
      default: rotate_elements<uint64_t>(out.data, N, s); break;
    }
    return;
  }
  int64_t shift[kMaxRank] = {};
  for (int64_t i = 0; i < dcount; ++i) {
    int64_t d;
    if (!wrap_dim(ctx, kOp, dims[i], self.rank, &d)) return;
    if (self.rank == 0) continue;
    int64_t size = self.sizes[d];
    shift[d] = ((shift[d] + shifts[i] % size) % size + size) % size;
  }
  int rolled[kMaxRank], k = 0;
  for (int d = 0; d < self.rank; ++d)
    if (shift[d]) rolled[k++] = d;
  // 2^k blocks: along each rolled dim, out[s:] <- self[:n-s] and out[:s] <- self[n-s:]
  int64_t sizes[kMaxRank];
  for (uint64_t mask = 0; mask < (uint64_t{1} << k); ++mask) {
    int64_t src_off = 0, dst_off = 0;
    for (int d = 0; d < self.rank; ++d) sizes[d] = self.sizes[d];
    for (int j = 0; j < k; ++j) {
      int d = rolled[j];
      int64_t size = self.sizes[d], s = shift[d];
      if (mask >> j & 1) {  // the tail of self to the head of out
        sizes[d] = s;
        src_off += (size - s) * self.strides[d];
      } else {
        sizes[d] = size - s;
        dst_off += s * out.strides[d];
      }
    }
    if (!copy_checked(ctx, kOp, out.data + dst_off * itemsize(out.dtype), out.dtype, out.strides,
                      self.data + src_off * item, self.dtype, self.strides, sizes, self.rank))
      return;
  }
}

void pixel_shuffle_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::pixel_shuffle.out";
  OPF_TENSOR(0, "self", self);
  OPF_INT(1, "upscale_factor", r);
  OPF_TENSOR(2, "out", out);
  if (self.rank < 3 || r <= 0 || self.rank + 3 > kMaxRank) {
    fail(ctx, "%s: self — found rank %d, upscale_factor %lld — valid: rank >= 3 and a factor "
         ">= 1 — re-export the program", kOp, self.rank, (long long)r);
    return;
  }
  int lead = self.rank - 3;
  int64_t c = self.sizes[lead], h = self.sizes[lead + 1], w = self.sizes[lead + 2], rr;
  if (!mul_ok(r, r, &rr) || c % rr) {
    fail(ctx, "%s: self — found %lld channels — valid: a multiple of upscale_factor^2 = %lld — "
         "re-export the program", kOp, (long long)c, (long long)(r * r));
    return;
  }
  int64_t sizes[kMaxRank];
  for (int d = 0; d < lead; ++d) sizes[d] = self.sizes[d];
  sizes[lead] = c / rr;
  if (!mul_ok(h, r, &sizes[lead + 1]) || !mul_ok(w, r, &sizes[lead + 2])) {
    fail(ctx, "%s: out — its size overflows int64", kOp);
    return;
  }
  if (!check_shape(ctx, kOp, out, sizes, self.rank)) return;
  if (out.numel == 0) return;
  // out as (lead, oc, h, r1, w, r2); self read as (lead, oc, r1, r2, h, w)
  int64_t cs[kMaxCopyRank], dst[kMaxCopyRank], src[kMaxCopyRank];
  for (int d = 0; d < lead; ++d) cs[d] = self.sizes[d], dst[d] = out.strides[d], src[d] = self.strides[d];
  const int64_t* is = self.strides + lead;
  const int64_t* os = out.strides + lead;
  int64_t s6[5] = {c / rr, h, r, w, r};
  int64_t d6[5] = {os[0], r * os[1], os[1], r * os[2], os[2]};
  int64_t r6[5] = {rr * is[0], is[1], r * is[0], is[2], is[0]};
  for (int k = 0; k < 5; ++k) cs[lead + k] = s6[k], dst[lead + k] = d6[k], src[lead + k] = r6[k];
  copy_checked(ctx, kOp, out.data, out.dtype, dst, self.data, self.dtype, src, cs, lead + 5);
}

const KernelDef kShapeKernels[] = {
    {"aten::cat.out", "TL I T!", cat_out},
    {"aten::stack.out", "TL I T!", stack_out},
    {"aten::split_with_sizes_copy.out", "T IL I TL!", split_with_sizes_copy_out},
    {"aten::split_copy.Tensor_out", "T I I TL!", split_copy_out},
    {"aten::unbind_copy.int_out", "T I TL!", unbind_copy_out},
    {"aten::constant_pad_nd.out", "T IL S T!", constant_pad_nd_out},
    {"aten::repeat.out", "T IL T!", repeat_out},
    {"aten::flip.out", "T IL T!", flip_out},
    {"aten::roll.out", "T IL IL T!", roll_out},
    {"aten::pixel_shuffle.out", "T I T!", pixel_shuffle_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(shape, kShapeKernels)
