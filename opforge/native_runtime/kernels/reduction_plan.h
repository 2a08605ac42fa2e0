// The plan every reduction of kernels/ops/reduction*.cpp runs on (sum/mean/prod/amax/amin/
// any/all/logsumexp in reduction.cpp, argmax/argmin/max.dim/min.dim in reduction_index.cpp,
// var/std/var_mean/linalg_vector_norm in reduction_stats.cpp): the input's dims split into
// kept and reduced ones (ATen's `int[1]? dim`: None or [] reduces every dim; negatives wrap),
// adjacent dims merged where their strides allow, then for each output element (kept dims in
// row-major order) a loop over its reduced elements. out may have the keepdim shape or the
// reduced one (the NumPy kernel reshapes: any shape with the right number of elements is
// written in row-major order).
//
// float16: NumPy's float16 reductions compute in float32 (accumulate_dtype, ATen's CPU
// opmath), so a float16 self is widened once into a dense float32 copy (widen_half, in
// per-thread scratch) and the float32 loops run on it; a float16 out is written by store()
// from the float32 result, one rounding as NumPy's cast.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "copy.h"
#include "gemm.h"
#include "parallel.h"
#include "tensor.h"

namespace opforge::portable::reduction_plan {

// kept dims (outer loop) and reduced dims (inner loop), merged where contiguous
struct Plan {
  int nk = 0, nr = 0;
  int64_t ks[kMaxRank], kx[kMaxRank];  // kept sizes, input strides
  int64_t rs[kMaxRank], rx[kMaxRank];  // reduced sizes, input strides
  int64_t outputs = 1, count = 1;      // output elements, elements reduced into each
  int64_t reduced_at[kMaxRank];        // for arg reductions: the reduced dim's own size
  const opforge_context* ctx = nullptr;  // make_plan's: each_output may use its threads
};

// Append a dim to a (sizes, strides) list, merging it into the previous one when the
// previous continues it (row-major order kept).
inline void push(int* n, int64_t* sizes, int64_t* strides, int64_t size, int64_t stride) {
  if (size == 1) return;
  if (*n > 0 && strides[*n - 1] == size * stride) {
    sizes[*n - 1] *= size;
    strides[*n - 1] = stride;
    return;
  }
  sizes[*n] = size;
  strides[*n] = stride;
  ++*n;
}

// dims: nullptr/count <= 0 (count -1: None, 0: []) reduces all.
inline bool make_plan(opforge_context* ctx, const char* op, const View& x, const int64_t* dims,
                      int64_t count, Plan* p, bool* reduce) {
  p->ctx = ctx;
  for (int d = 0; d < kMaxRank; ++d) reduce[d] = count <= 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t d;
    if (!wrap_dim(ctx, op, dims[i], x.rank, &d)) return false;
    if (x.rank == 0) continue;
    if (reduce[d]) {
      fail(ctx, "%s: dim %lld appears twice in the dim list — valid: distinct dims", op,
           (long long)dims[i]);
      return false;
    }
    reduce[d] = true;
  }
  for (int d = 0; d < x.rank; ++d) {
    if (reduce[d]) {
      push(&p->nr, p->rs, p->rx, x.sizes[d], x.strides[d]);
      p->count *= x.sizes[d];
    } else {
      push(&p->nk, p->ks, p->kx, x.sizes[d], x.strides[d]);
      p->outputs *= x.sizes[d];
    }
  }
  return true;
}

// The out's element offset for row-major flat index f (out dense: f).
inline int64_t out_offset(const View& out, int64_t f) {
  if (out.dense) return f;
  int64_t off = 0;
  for (int d = out.rank - 1; d >= 0; --d) {
    off += (f % out.sizes[d]) * out.strides[d];
    f /= out.sizes[d];
  }
  return off;
}

inline bool out_count(opforge_context* ctx, const char* op, const View& out, int64_t expect) {
  if (out.numel == expect) return true;
  fail(ctx, "%s: out of %lld elements — valid: %lld, the reduced shape (with or without keepdim)",
       op, (long long)out.numel, (long long)expect);
  return false;
}

// Visit every input offset of one output element's reduced block.
template <typename F>
inline void each_reduced(const Plan& p, int64_t base, F&& f) {
  if (p.nr == 0) { f(base); return; }
  if (p.nr == 1) {
    for (int64_t i = 0; i < p.rs[0]; ++i) f(base + i * p.rx[0]);
    return;
  }
  int64_t idx[kMaxRank] = {0};
  int64_t off = base;
  for (int64_t t = 0; t < p.count; ++t) {
    f(off);
    for (int d = p.nr - 1; d >= 0; --d) {
      off += p.rx[d];
      if (++idx[d] < p.rs[d]) break;
      off -= p.rx[d] * p.rs[d];
      idx[d] = 0;
    }
  }
}

// Visit every output element: (flat index, input base offset). A large reduction (outputs
// x count >= kParallelGrain) is split over blocks of output elements on the threads
// make_plan's context lends, never over the reduced elements: each output is summed the
// same way whichever thread computes it. f must only write its own output element.
template <typename F>
inline void each_output(const Plan& p, F&& f) {
  int64_t work;
  if (!mul_ok(p.outputs, p.count > 0 ? p.count : 1, &work)) work = INT64_MAX;
  int64_t parts = parallel_parts(p.ctx, work / kParallelGrain, 1);
  if (parts > p.outputs) parts = p.outputs;
  parallel_ranges(p.ctx, p.outputs, parts, 1, [&](int64_t t0, int64_t t1) {
    int64_t idx[kMaxRank] = {0};
    int64_t off = 0;
    for (int64_t d = p.nk - 1, rest = t0; d >= 0 && rest > 0; --d) {  // the odometer at t0
      idx[d] = rest % p.ks[d];
      rest /= p.ks[d];
      off += idx[d] * p.kx[d];
    }
    for (int64_t t = t0; t < t1; ++t) {
      f(t, off);
      for (int d = p.nk - 1; d >= 0; --d) {
        off += p.kx[d];
        if (++idx[d] < p.ks[d]) break;
        off -= p.kx[d] * p.ks[d];
        idx[d] = 0;
      }
    }
  });
}

// Store a double / int64 into out's element (out of any real dtype or float16; NumPy's
// unsafe cast). A value computed in float32 for a float16 out is passed as that float.
inline void store(const View& out, int64_t off, double v) {
  if (out.dtype == kFloat16) {
    out.ptr<uint16_t>()[off] = double_to_half(v);
    return;
  }
  dispatch_real(out.dtype, [&](auto tag) {
    using O = decltype(tag);
    if constexpr (std::is_same<O, bool>::value) out.ptr<O>()[off] = v != 0.0;
    else if constexpr (std::is_floating_point<O>::value) out.ptr<O>()[off] = static_cast<O>(v);
    else out.ptr<O>()[off] = std::isfinite(v) && std::fabs(v) < 9.2e18 ? static_cast<O>(static_cast<int64_t>(v)) : O(0);
  });
}
inline void store_int(const View& out, int64_t off, int64_t v) {
  if (out.dtype == kFloat16) {
    out.ptr<uint16_t>()[off] = double_to_half(static_cast<double>(v));
    return;
  }
  dispatch_real(out.dtype, [&](auto tag) {
    using O = decltype(tag);
    if constexpr (std::is_same<O, bool>::value) out.ptr<O>()[off] = v != 0;
    else out.ptr<O>()[off] = static_cast<O>(v);
  });
}

inline bool real_dtype(opforge_context* ctx, const char* op, const char* what, int32_t d) {
  if (d == kBool || is_integral(d, false) || d == kFloat16 || d == kFloat32 || d == kFloat64) return true;
  fail(ctx, "%s: %s of dtype %s — valid: bool, integer, float16, float32 or float64 (bfloat16 "
       "is not in the C++ kernels yet) — use the lean runtime's kernel", op, what, dtype_name(d));
  return false;
}

// The dtype a reduction computes in for `d`: float32 for float16 (NumPy's accumulate_dtype).
inline int32_t accumulate_dtype(int32_t d) { return d == kFloat16 ? kFloat32 : d; }

// A float16 tensor widened to a dense float32 copy (any other dtype: the tensor itself).
struct Widened {
  View view;
  opforge_tensor t;
  int64_t strides[kMaxRank];
};

inline bool widen_half(opforge_context* ctx, const char* op, const View& x, Widened* w) {
  w->view = x;
  if (x.dtype != kFloat16) return true;
  int64_t bytes;
  float* buf = mul_ok(x.numel > 0 ? x.numel : 1, 4, &bytes) ? static_cast<float*>(scratch(ctx, 0, bytes))
                                                          : nullptr;
  if (!buf) {
    fail(ctx, "%s: a float32 copy of the float16 self (%lld elements) — could not be allocated — "
         "valid: within the kernels' workspace limit (OPFORGE_MAX_MEMORY) — raise the limit or "
         "reduce a smaller tensor", op, (long long)x.numel);
    return false;
  }
  contiguous_strides(x.sizes, x.rank, w->strides);
  if (x.numel > 0)
    convert_strided(reinterpret_cast<char*>(buf), kFloat32, w->strides, x.data, kFloat16, x.strides,
                    x.sizes, x.rank);
  w->t = *x.t;
  w->t.data = buf;
  w->t.dtype = kFloat32;
  w->t.strides = w->strides;
  w->view.t = &w->t;
  w->view.data = reinterpret_cast<char*>(buf);
  w->view.dtype = kFloat32;
  w->view.strides = w->strides;
  w->view.dense = true;
  return true;
}

// Write a value of the compute type T into out's element: directly when out is T, else
// (a float16 out of a widened self) through store().
template <typename T>
inline void put(const View& out, int64_t off, T v) {
  if constexpr (std::is_floating_point<T>::value) {
    if (out.dtype == kFloat16) { store(out, off, static_cast<double>(v)); return; }
  }
  out.ptr<T>()[off] = v;
}

inline bool optional_dtype(opforge_context* ctx, const opforge_arg* args, int64_t n, int64_t i,
                           const char* op, int32_t* dtype) {
  if (is_none(args, n, i)) { *dtype = -1; return true; }
  int64_t v;
  if (i >= n || args[i].tag != OPFORGE_ARG_SCALAR_TYPE) {
    fail(ctx, "%s: dtype (argument %lld) — valid: a ScalarType or None", op, (long long)i);
    return false;
  }
  v = args[i].v.i;
  *dtype = static_cast<int32_t>(v);
  return true;
}

template <typename T>
inline double as_double(T v) { return static_cast<double>(v); }

}  // namespace opforge::portable::reduction_plan
