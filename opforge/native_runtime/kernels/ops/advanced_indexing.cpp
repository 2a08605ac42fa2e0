// Advanced indexing: index.Tensor and index_put, NumPy's and ATen's rules (they agree):
// None keeps a dimension, integer index tensors broadcast together, bool (and legacy
// uint8) masks select by position (their nonzero coordinates), and when the indexed
// dimensions are not adjacent their result dimensions move to the front. Indices may be
// negative (from the end); every one is checked before anything is written
// (opforge/kernels/portable/indexing.py is the specification).
#include <cstring>
#include <vector>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

struct IndexPlan {
  int rank = 0;                       // self's
  bool advanced[kMaxRank] = {};       // self dim indexed by a tensor
  const char* data[kMaxRank] = {};    // per advanced self dim: its index values
  int32_t dtype[kMaxRank] = {};
  int64_t strides[kMaxRank][kMaxRank];  // ... read broadcast to the index shape B
  int brank = 0;
  int64_t bsizes[kMaxRank];
  int64_t bnumel = 1;
  bool adjacent = true;
  int first = 0;                      // first advanced self dim
  std::vector<int64_t> positions;     // nonzero coordinates of masks
  // the result: its rank and sizes; B starts at result dim `bpos`; self dim k (not
  // advanced) is result dim `where[k]`
  int out_rank = 0;
  int64_t out_sizes[kMaxRank];
  int bpos = 0;
  int where[kMaxRank];
};

struct Source {
  int rank;
  const int64_t* sizes;
  const int64_t* strides;
  const char* data;
  int32_t dtype;
};

bool plan_index(opforge_context* ctx, const char* op, const View& self, const opforge_tensor* items,
                int64_t count, IndexPlan* p) {
  p->rank = self.rank;
  if (count > self.rank) {
    fail(ctx, "%s: indices — found %lld for a rank-%d tensor — valid: at most one per dimension — "
         "re-export the program", op, (long long)count, self.rank);
    return false;
  }
  Source sources[kMaxRank];
  int64_t mask_offset[kMaxRank];
  int d = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (items[i].dtype == -1) { ++d; continue; }
    View v;
    if (!list_item(ctx, items[i], op, "indices[i]", &v)) return false;
    if (v.dtype == kBool || v.dtype == kUInt8) {
      bool fits = v.rank >= 1 && d + v.rank <= self.rank;
      for (int k = 0; fits && k < v.rank; ++k) fits = v.sizes[k] == self.sizes[d + k];
      if (!fits) {
        fail(ctx, "%s: indices[%lld] — a mask of rank %d does not match the indexed dims at %d — "
             "valid: a mask of the shape of the dims it indexes — re-export the program", op,
             (long long)i, v.rank, d);
        return false;
      }
      // the mask's nonzero coordinates, one 1-d index per dim it covers
      int64_t hits = 0;
      for_each_element(v, v, [&](char* e, char*, const int64_t*) { hits += *e != 0; });
      size_t base = p->positions.size();
      p->positions.resize(base + static_cast<size_t>(hits * v.rank));
      int64_t h = 0;
      for_each_element(v, v, [&](char* e, char*, const int64_t* idx) {
        if (!*e) return;
        for (int k = 0; k < v.rank; ++k) p->positions[base + k * hits + h] = idx[k];
        ++h;
      });
      for (int k = 0; k < v.rank; ++k) {
        p->advanced[d + k] = true;
        mask_offset[d + k] = static_cast<int64_t>(base) + k * hits;
        sources[d + k] = Source{1, nullptr, nullptr, nullptr, kInt64};
        p->strides[d + k][0] = hits;  // the length, kept until the broadcast
      }
      d += v.rank;
      continue;
    }
    if (!index_dtype(v.dtype)) {
      fail(ctx, "%s: indices[%lld] — found dtype %s — valid: integer, bool or uint8 index "
           "tensors — re-export the program", op, (long long)i, dtype_name(v.dtype));
      return false;
    }
    p->advanced[d] = true;
    mask_offset[d] = -1;
    sources[d] = Source{v.rank, v.sizes, v.strides, v.data, v.dtype};
    ++d;
  }
  // broadcast the index shapes into B
  int64_t one_size[kMaxRank];
  int64_t one_stride[kMaxRank] = {1};
  p->brank = 0;
  for (int k = 0; k < self.rank; ++k) {
    if (!p->advanced[k]) continue;
    if (mask_offset[k] >= 0) {
      one_size[k] = p->strides[k][0];
      sources[k].sizes = &one_size[k];
      sources[k].strides = one_stride;
      sources[k].data = reinterpret_cast<const char*>(p->positions.data() + mask_offset[k]);
    }
    if (sources[k].rank > p->brank) {
      int shift = sources[k].rank - p->brank;
      for (int j = p->brank - 1; j >= 0; --j) p->bsizes[j + shift] = p->bsizes[j];
      for (int j = 0; j < shift; ++j) p->bsizes[j] = 1;
      p->brank = sources[k].rank;
    }
  }
  for (int k = 0; k < self.rank; ++k) {
    if (!p->advanced[k]) continue;
    const Source& s = sources[k];
    for (int j = 0; j < s.rank; ++j) {
      int b = p->brank - s.rank + j;
      if (s.sizes[j] != 1) {
        if (p->bsizes[b] != 1 && p->bsizes[b] != s.sizes[j]) {
          fail(ctx, "%s: indices — shapes do not broadcast (size %lld against %lld) — valid: "
               "index tensors that broadcast together — re-export the program", op,
               (long long)s.sizes[j], (long long)p->bsizes[b]);
          return false;
        }
        p->bsizes[b] = s.sizes[j];
      }
    }
  }
  p->bnumel = 1;
  for (int j = 0; j < p->brank; ++j) p->bnumel *= p->bsizes[j];
  for (int k = 0; k < self.rank; ++k) {
    if (!p->advanced[k]) continue;
    const Source& s = sources[k];
    for (int j = 0; j < p->brank; ++j) {
      int sj = j - (p->brank - s.rank);
      p->strides[k][j] = sj < 0 || s.sizes[sj] == 1 ? 0 : s.strides[sj];
    }
    p->data[k] = s.data;
    p->dtype[k] = s.dtype;
  }
  // adjacency and the result's layout
  int firstk = -1, lastk = -1, nadv = 0;
  for (int k = 0; k < self.rank; ++k)
    if (p->advanced[k]) { if (firstk < 0) firstk = k; lastk = k; ++nadv; }
  p->adjacent = nadv == 0 || lastk - firstk + 1 == nadv;
  p->first = firstk < 0 ? 0 : firstk;
  p->bpos = p->adjacent ? p->first : 0;
  int r = 0;
  if (p->adjacent) {
    for (int k = 0; k < p->first; ++k) p->where[k] = r, p->out_sizes[r++] = self.sizes[k];
    for (int j = 0; j < p->brank; ++j) p->out_sizes[r++] = p->bsizes[j];
    for (int k = p->first; k < self.rank; ++k)
      if (!p->advanced[k]) p->where[k] = r, p->out_sizes[r++] = self.sizes[k];
  } else {
    for (int j = 0; j < p->brank; ++j) p->out_sizes[r++] = p->bsizes[j];
    for (int k = 0; k < self.rank; ++k)
      if (!p->advanced[k]) p->where[k] = r, p->out_sizes[r++] = self.sizes[k];
  }
  if (r > kMaxRank) {
    fail(ctx, "%s: the result's rank %d exceeds %d", op, r, kMaxRank);
    return false;
  }
  p->out_rank = r;
  return true;
}

// Call f(b coords, index values per self dim) for each position of B.
template <typename F>
void each_position(const IndexPlan& p, F&& f) {
  if (p.bnumel == 0) return;
  int64_t b[kMaxRank] = {}, value[kMaxRank] = {};
  for (int64_t e = 0; e < p.bnumel; ++e) {
    for (int k = 0; k < p.rank; ++k) {
      if (!p.advanced[k]) continue;
      int64_t off = 0;
      for (int j = 0; j < p.brank; ++j) off += b[j] * p.strides[k][j];
      value[k] = read_index(p.data[k] + off * itemsize(p.dtype[k]), p.dtype[k]);
    }
    f(static_cast<const int64_t*>(b), static_cast<const int64_t*>(value));
    for (int j = p.brank - 1; j >= 0; --j) {
      if (++b[j] < p.bsizes[j]) break;
      b[j] = 0;
    }
  }
}

bool check_positions(opforge_context* ctx, const char* op, const View& self, const IndexPlan& p) {
  bool ok = true;
  each_position(p, [&](const int64_t*, const int64_t* value) {
    for (int k = 0; ok && k < p.rank; ++k) {
      if (!p.advanced[k]) continue;
      int64_t size = self.sizes[k];
      if (value[k] < -size || value[k] >= size) {
        fail(ctx, "%s: index — found %lld for dim %d of size %lld — valid: [%lld, %lld] — check "
             "the indices against the tensor's shape", op, (long long)value[k], k, (long long)size,
             (long long)-size, (long long)(size - 1));
        ok = false;
      }
    }
  });
  return ok;
}

// The sub-block of the dims no index touches: sizes and strides of `t` at those dims
// (tstrides per self dim) and of the result (rstrides per result dim).
int block_of(const IndexPlan& p, const View& self, const int64_t* tstrides, const int64_t* rstrides,
             int64_t* sizes, int64_t* ts, int64_t* rs) {
  int m = 0;
  for (int k = 0; k < p.rank; ++k) {
    if (p.advanced[k]) continue;
    sizes[m] = self.sizes[k], ts[m] = tstrides[k], rs[m] = rstrides[p.where[k]];
    ++m;
  }
  return m;
}

int64_t offset_of(const IndexPlan& p, const View& self, const int64_t* tstrides, const int64_t* value) {
  int64_t off = 0;
  for (int k = 0; k < p.rank; ++k)
    if (p.advanced[k]) off += (value[k] < 0 ? value[k] + self.sizes[k] : value[k]) * tstrides[k];
  return off;
}

int64_t result_offset(const IndexPlan& p, const int64_t* rstrides, const int64_t* b) {
  int64_t off = 0;
  for (int j = 0; j < p.brank; ++j) off += b[j] * rstrides[p.bpos + j];
  return off;
}

void index_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::index.Tensor_out";
  OPF_TENSOR(0, "self", self);
  const opforge_tensor* items;
  int64_t count;
  if (!tensor_list_arg(ctx, args, n, 1, kOp, "indices", &items, &count)) return;
  OPF_TENSOR(2, "out", out);
  IndexPlan p;
  if (!plan_index(ctx, kOp, self, items, count, &p) ||
      !check_shape(ctx, kOp, out, p.out_sizes, p.out_rank) || !check_positions(ctx, kOp, self, p))
    return;
  if (out.numel == 0) return;
  int64_t sizes[kMaxRank], ss[kMaxRank], os[kMaxRank];
  int m = block_of(p, self, self.strides, out.strides, sizes, ss, os);
  int64_t sitem = itemsize(self.dtype), oitem = itemsize(out.dtype);
  bool ok = true;
  each_position(p, [&](const int64_t* b, const int64_t* value) {
    if (!ok) return;
    ok = copy_checked(ctx, kOp, out.data + result_offset(p, out.strides, b) * oitem, out.dtype, os,
                      self.data + offset_of(p, self, self.strides, value) * sitem, self.dtype, ss, sizes, m);
  });
}

// dst += src in dst's dtype (integers wrap; float16 rounded once, as NumPy's add.at)
void add_into(char* dst, int32_t dtype, const char* src, int32_t src_dtype) {
  if (is_integral(dtype, true)) {
    uint64_t a = static_cast<uint64_t>(load_int64(dst, dtype)), b = static_cast<uint64_t>(load_int64(src, src_dtype));
    store_scalar(dst, dtype, 0, static_cast<int64_t>(a + b), true);
    return;
  }
  double a = load_double(dst, dtype), b = load_double(src, src_dtype);
  if (dtype == kFloat32) b = static_cast<float>(b);
  if (dtype == kFloat16) b = half_to_float(double_to_half(b));
  store_double(dst, dtype, a + b);
}

void index_put_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::index_put.out";
  OPF_TENSOR(0, "self", self);
  const opforge_tensor* items;
  int64_t count;
  if (!tensor_list_arg(ctx, args, n, 1, kOp, "indices", &items, &count)) return;
  OPF_TENSOR(2, "values", values);
  OPF_BOOL(3, "accumulate", accumulate);
  OPF_TENSOR(4, "out", out);
  IndexPlan p;
  if (!check_shape(ctx, kOp, out, self.sizes, self.rank) || !plan_index(ctx, kOp, self, items, count, &p))
    return;
  int64_t vstrides[kMaxRank];
  if (!broadcast_strides(ctx, kOp, "values", values, p.out_sizes, p.out_rank, vstrides) ||
      !check_positions(ctx, kOp, self, p))
    return;
  if (!convertible(out.dtype) || !convertible(values.dtype)) {
    fail(ctx, "%s: out — dtype %s — valid: a real dtype", kOp, dtype_name(out.dtype));
    return;
  }
  // out is self: a state (KV cache) written in place
  if (out.data != self.data && self.numel &&
      !copy_checked(ctx, kOp, out.data, out.dtype, out.strides, self.data, self.dtype, self.strides,
                    self.sizes, self.rank))
    return;
  int64_t sizes[kMaxRank], os[kMaxRank], vs[kMaxRank];
  int m = block_of(p, self, out.strides, vstrides, sizes, os, vs);
  int64_t oitem = itemsize(out.dtype), vitem = itemsize(values.dtype);
  each_position(p, [&](const int64_t* b, const int64_t* value) {
    char* dst = out.data + offset_of(p, self, out.strides, value) * oitem;
    const char* src = values.data + result_offset(p, vstrides, b) * vitem;
    if (!accumulate) {
      convert_strided(dst, out.dtype, os, src, values.dtype, vs, sizes, m);
      return;
    }
    View a{}, v{};
    a.data = dst, a.dtype = out.dtype, a.rank = m, a.sizes = sizes, a.strides = os, a.numel = 1;
    for (int k = 0; k < m; ++k) a.numel *= sizes[k];
    v = a;
    v.data = const_cast<char*>(src), v.dtype = values.dtype, v.strides = vs;
    for_each_element(a, v, [&](char* pa, char* pv, const int64_t*) { add_into(pa, out.dtype, pv, values.dtype); });
  });
}

const KernelDef kAdvancedIndexingKernels[] = {
    {"aten::index.Tensor_out", "T TL? T!", index_out},
    {"aten::index_put.out", "T TL? T B T!", index_put_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(advanced_indexing, kAdvancedIndexingKernels)
