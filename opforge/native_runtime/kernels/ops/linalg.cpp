// Matrix products: mm, bmm, matmul, addmm, baddbmm, linear, dot (the NumPy kernels of
// opforge/kernels/portable/linalg.py). float32 and float64 go through the blocked GEMM
// (gemm.h), integer and bool products through an exact loop that wraps as NumPy's (and
// ATen's) integer matmul does. Like ATen, the operands and out must share one dtype
// (ATen refuses mm of float and double). float16 products run the float32 GEMM on float32
// copies and round once (half_compute.h), as the NumPy kernels do; bfloat16 is not here yet.
//
// Every product is a batch of strided matrix products: a transposed weight, a broadcast
// batch dimension or a matrix-vector product is only a choice of strides. A batch whose
// right operand does not vary (linear; matmul of (..., M, K) by (K, N)) is folded into one
// taller product when the left operand and out allow it, as the NumPy kernel does.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "gemm.h"
#include "half_compute.h"
#include "parallel.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

// A product of `batch` strided matrices: c[b] (op)= a[b] · b[b] (m x k times k x n).
// Batch dims are kept as a list (sizes and per-operand strides) so that broadcasting is
// free.
struct Batched {
  int nbatch = 0;
  int64_t bsizes[kMaxRank];
  int64_t sa[kMaxRank], sb[kMaxRank], sc[kMaxRank];
  int64_t m = 0, n = 0, k = 0;
  int64_t rsa = 0, csa = 0, rsb = 0, csb = 0, rsc = 0, csc = 0;
};

// Do the element spans of two tensors overlap (then out must not be written while the
// input is read)?
bool overlaps(const View& x, const View& y) {
  if (x.numel == 0 || y.numel == 0) return false;
  auto span = [](const View& v, char** lo, char** hi) {
    int64_t low = 0, high = 0;
    for (int d = 0; d < v.rank; ++d) {
      int64_t extent = (v.sizes[d] - 1) * v.strides[d];
      if (extent < 0) low += extent; else high += extent;
    }
    int64_t item = itemsize(v.dtype);
    *lo = v.data + low * item;
    *hi = v.data + (high + 1) * item;
  };
  char *xl, *xh, *yl, *yh;
  span(x, &xl, &xh);
  span(y, &yl, &yh);
  return xl < yh && yl < xh;
}

// Fold the batch into the rows when b does not vary and a's and c's batch dims continue
// their row dim with one stride (a contiguous (..., M, K) input and out).
void fold_batch(Batched* p) {
  // (a size-1 row dim's stride is arbitrary, so only a real row stride is extended)
  if (p->nbatch == 0 || p->rsa == 0 || p->rsc == 0) return;
  int64_t ea = p->rsa * p->m, ec = p->rsc * p->m, rows = p->m;
  for (int d = p->nbatch - 1; d >= 0; --d) {
    if (p->bsizes[d] == 1) continue;
    if (p->sb[d] != 0 || p->sa[d] != ea || p->sc[d] != ec) return;
    ea *= p->bsizes[d];
    ec *= p->bsizes[d];
    rows *= p->bsizes[d];
  }
  p->m = rows;
  p->nbatch = 0;
}

template <typename T>
void int_product(const Batched& p, const char* a, const char* b, char* c, int64_t ia,
                 int64_t ib, int64_t ic) {
  // exact in uint64 (wrapping), truncated to T: the same residue as NumPy's wrapping loop
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      uint64_t acc = 0;
      bool any = false;
      for (int64_t q = 0; q < p.k; ++q) {
        T x = *reinterpret_cast<const T*>(a + (i * p.rsa + q * p.csa) * ia);
        T y = *reinterpret_cast<const T*>(b + (q * p.rsb + j * p.csb) * ib);
        if constexpr (std::is_same<T, bool>::value) {
          any = any || (x && y);
        } else {
          acc += static_cast<uint64_t>(static_cast<int64_t>(x)) *
                 static_cast<uint64_t>(static_cast<int64_t>(y));
        }
      }
      T* dst = reinterpret_cast<T*>(c + (i * p.rsc + j * p.csc) * ic);
      if constexpr (std::is_same<T, bool>::value) *dst = any;
      else *dst = static_cast<T>(acc);
    }
}

// One product of the batch (flat batch index t) into (c, its strides). false: ctx failed.
bool one_product(opforge_context* ctx, const char* op, const Batched& p, int32_t dtype, const char* a,
                 const char* b, char* c, int64_t t) {
  int64_t oa = 0, ob = 0, oc = 0;
  for (int d = p.nbatch - 1; d >= 0; --d) {
    int64_t i = t % p.bsizes[d];
    t /= p.bsizes[d];
    oa += i * p.sa[d];
    ob += i * p.sb[d];
    oc += i * p.sc[d];
  }
  int64_t item = itemsize(dtype);
  const char* ap = a + oa * item;
  const char* bp = b + ob * item;
  char* cp = c + oc * item;
  if (dtype == kFloat32)
    return gemm(ctx, op, p.m, p.n, p.k, reinterpret_cast<const float*>(ap), p.rsa, p.csa,
                reinterpret_cast<const float*>(bp), p.rsb, p.csb, reinterpret_cast<float*>(cp), p.rsc, p.csc,
                false);
  if (dtype == kFloat64)
    return gemm(ctx, op, p.m, p.n, p.k, reinterpret_cast<const double*>(ap), p.rsa, p.csa,
                reinterpret_cast<const double*>(bp), p.rsb, p.csb, reinterpret_cast<double*>(cp), p.rsc, p.csc,
                false);
  dispatch_real(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral<T>::value) int_product<T>(p, ap, bp, cp, item, item, item);
  });
  return true;
}

// Run every product of the batch. A batch of products each too small to split (attention's
// heads) is split over its products instead, each on one thread with an equal share of
// the kernels' scratch budget (its own context: a failure is reported once). false: ctx failed.
bool run_batched(opforge_context* ctx, const char* op, const Batched& p, int32_t dtype,
                 const char* a, const char* b, char* c) {
  int64_t total = 1;
  for (int d = 0; d < p.nbatch; ++d) total *= p.bsizes[d];
  int64_t per = 1, work = 1;
  bool small = mul_ok(p.m, p.n, &per) && mul_ok(per, p.k, &per) && per < 2 * kParallelGrain &&
               mul_ok(per, total, &work);
  int64_t parts = small ? parallel_parts(ctx, work / kParallelGrain, 1) : 1;
  if (parts > total) parts = total;
  const KernelServices* services = kernel_services(ctx);
  if (parts <= 1 || services == nullptr) {
    for (int64_t t = 0; t < total; ++t)
      if (!one_product(ctx, op, p, dtype, a, b, c, t)) return false;
    return true;
  }
  KernelServices share = *services;
  share.num_threads = 1;
  share.parallel_for = nullptr;
  share.pool = nullptr;
  share.workspace_limit = services->workspace_limit / std::min<int64_t>(parts, services->num_threads);
  std::atomic<bool> failed{false};
  parallel_ranges(ctx, total, parts, 1, [&](int64_t t0, int64_t t1) {
    opforge_context local{};
    local.runtime = &share;
    for (int64_t t = t0; t < t1 && !failed.load(std::memory_order_relaxed); ++t)
      if (!one_product(&local, op, p, dtype, a, b, c, t)) {
        if (!failed.exchange(true)) std::memcpy(ctx->message, local.message, OPFORGE_MESSAGE_SIZE);
        return;
      }
  });
  if (failed.load()) ctx->status = 1;
  return !failed.load();
}

bool supported(opforge_context* ctx, const char* op, int32_t dtype) {
  if (dtype == kFloat32 || dtype == kFloat64 || is_integral(dtype, true)) return true;
  fail(ctx, "%s: dtype %s — valid: float16, float32, float64, integer or bool, one dtype for "
       "all (bfloat16 products are not in the C++ kernels yet) — use the lean runtime's kernel", op,
       dtype_name(dtype));
  return false;
}

bool same_dtype(opforge_context* ctx, const char* op, const View& a, const View& b,
                const View& out) {
  if (a.dtype == b.dtype && a.dtype == out.dtype) return supported(ctx, op, out.dtype);
  fail(ctx, "%s: operands of dtypes %s and %s with out %s — valid: one dtype for all (ATen "
       "refuses mixed products) — convert the operands first", op, dtype_name(a.dtype),
       dtype_name(b.dtype), dtype_name(out.dtype));
  return false;
}

// The product of a and b with np.matmul / torch.matmul shapes: 1-d operands are a row /
// a column, batch dims broadcast. Fills p (strides for out) and the result shape.
bool matmul_plan(opforge_context* ctx, const char* op, const View& a, const View& b,
                 Batched* p, int64_t* shape, int* rank) {
  if (a.rank < 1 || b.rank < 1) {
    fail(ctx, "%s: operands of rank %d and %d — valid: rank >= 1 each — reshape the "
         "operands", op, a.rank, b.rank);
    return false;
  }
  int64_t ka = a.sizes[a.rank - 1];
  int64_t kb = b.rank == 1 ? b.sizes[0] : b.sizes[b.rank - 2];
  if (ka != kb) {
    fail(ctx, "%s: inner dimensions %lld and %lld — valid: equal (a (..., M, K) by b (..., K, "
         "N)) — check the operands' shapes", op, (long long)ka, (long long)kb);
    return false;
  }
  p->k = ka;
  p->m = a.rank >= 2 ? a.sizes[a.rank - 2] : 1;
  p->n = b.rank >= 2 ? b.sizes[b.rank - 1] : 1;
  p->csa = a.strides[a.rank - 1];
  p->rsa = a.rank >= 2 ? a.strides[a.rank - 2] : 0;
  p->rsb = b.rank >= 2 ? b.strides[b.rank - 2] : b.strides[0];
  p->csb = b.rank >= 2 ? b.strides[b.rank - 1] : 0;
  int ba = a.rank > 2 ? a.rank - 2 : 0, bb = b.rank > 2 ? b.rank - 2 : 0;
  int nb = ba > bb ? ba : bb;
  p->nbatch = nb;
  for (int d = 0; d < nb; ++d) {
    int da = d - (nb - ba), db = d - (nb - bb);
    int64_t sa = da >= 0 ? a.sizes[da] : 1, sb = db >= 0 ? b.sizes[db] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      fail(ctx, "%s: batch dims do not broadcast — found %lld against %lld in batch dim %d — "
           "valid: equal sizes or 1", op, (long long)sa, (long long)sb, d);
      return false;
    }
    p->bsizes[d] = sa == 1 ? sb : sa;
    p->sa[d] = (da >= 0 && sa != 1) ? a.strides[da] : 0;
    p->sb[d] = (db >= 0 && sb != 1) ? b.strides[db] : 0;
    shape[d] = p->bsizes[d];
  }
  int r = nb;
  if (a.rank >= 2) shape[r++] = p->m;
  if (b.rank >= 2) shape[r++] = p->n;
  *rank = r;
  return true;
}

// Out's strides for the plan (its shape checked): batch, rows (0 without an M dim), cols.
void out_strides(Batched* p, const View& out, const View& a, const View& b) {
  for (int d = 0; d < p->nbatch; ++d) p->sc[d] = out.strides[d];
  int r = p->nbatch;
  p->rsc = a.rank >= 2 ? out.strides[r++] : 0;
  p->csc = b.rank >= 2 ? out.strides[r] : 0;
  if (p->n == 1 && b.rank < 2) p->csc = 1;
  if (p->m == 1 && a.rank < 2) p->rsc = p->n * (p->csc ? p->csc : 1);
}

// The product into out, through a dense scratch copy when out overlaps an input.
bool product_into(opforge_context* ctx, const char* op, Batched p, const View& a,
                  const View& b, const View& out) {
  if (out.numel == 0) return true;
  if (!overlaps(out, a) && !overlaps(out, b)) {
    fold_batch(&p);
    return run_batched(ctx, op, p, out.dtype, a.data, b.data, out.data);
  }
  int64_t item = itemsize(out.dtype), bytes;
  if (!mul_ok(out.numel, item, &bytes)) return false;
  char* tmp = static_cast<char*>(scratch(ctx, 0, bytes));
  if (!tmp) {
    fail(ctx, "%s: a scratch copy of out (%lld bytes) — could not be allocated — valid: "
         "out not overlapping the operands — check the memory plan", op, (long long)bytes);
    return false;
  }
  Batched q = p;
  // dense layout of the result: batch..., m, n
  int64_t s = p.m * p.n;
  for (int d = q.nbatch - 1; d >= 0; --d) { q.sc[d] = s; s *= q.bsizes[d]; }
  q.rsc = p.n;
  q.csc = 1;
  if (!run_batched(ctx, op, q, out.dtype, a.data, b.data, tmp)) return false;
  // copy back in the same index order
  int64_t idx[kMaxRank + 2] = {0};
  int64_t total = out.numel;
  int64_t batchsz = 1;
  for (int d = 0; d < q.nbatch; ++d) batchsz *= q.bsizes[d];
  (void)total;
  for (int64_t t = 0; t < batchsz; ++t) {
    int64_t oc = 0, od = 0;
    for (int d = 0; d < q.nbatch; ++d) { oc += idx[d] * p.sc[d]; od += idx[d] * q.sc[d]; }
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j)
        std::memcpy(out.data + (oc + i * p.rsc + j * p.csc) * item,
                    tmp + (od + i * q.rsc + j) * item, item);
    for (int d = q.nbatch - 1; d >= 0; --d) {
      if (++idx[d] < q.bsizes[d]) break;
      idx[d] = 0;
    }
  }
  return true;
}

// Strides of `self` broadcast against a shape of `rank` dims (0 where broadcast); false
// when it does not broadcast to exactly that shape.
bool broadcast_to(opforge_context* ctx, const char* op, const char* what, const View& v,
                  const int64_t* shape, int rank, int64_t* strides) {
  if (v.rank > rank) {
    fail(ctx, "%s: %s of rank %d — valid: broadcastable to the result's rank %d", op, what,
         v.rank, rank);
    return false;
  }
  for (int d = 0; d < rank; ++d) {
    int dv = d - (rank - v.rank);
    if (dv < 0) { strides[d] = 0; continue; }
    if (v.sizes[dv] == shape[d]) strides[d] = shape[d] == 1 ? 0 : v.strides[dv];
    else if (v.sizes[dv] == 1) strides[d] = 0;
    else {
      fail(ctx, "%s: %s has size %lld in dim %d — valid: %lld or 1 (broadcast to the "
           "result) — check the operand's shape", op, what, (long long)v.sizes[dv], dv,
           (long long)shape[d]);
      return false;
    }
  }
  return true;
}

// out = beta * self + alpha * out (out holds the product), as the NumPy kernel: out scaled
// by alpha first, then self added (times beta; beta == 0 ignores self, even its NaNs).
template <typename T>
inline T scaled_one(T v, const T* s, T beta, T alpha, bool add_self) {
  if constexpr (std::is_floating_point<T>::value) {
    if (alpha != T(1)) v = v * alpha;
    if (add_self) v = beta == T(1) ? v + *s : v + *s * beta;
  } else if constexpr (std::is_same<T, bool>::value) {
    v = (v && alpha) || (add_self && *s && beta);
  } else {  // wrapping integer arithmetic
    using U = typename std::make_unsigned<T>::type;
    if (alpha != T(1)) v = static_cast<T>(static_cast<U>(v) * static_cast<U>(alpha));
    if (add_self)
      v = static_cast<T>(static_cast<U>(v) + static_cast<U>(static_cast<U>(*s) * static_cast<U>(beta)));
  }
  return v;
}

// A row (the last dim) at a time: a contiguous out row with a contiguous or broadcast self
// row (addmm's bias) in loops that vectorize, any other strides element by element.
template <typename T>
void scaled_sum(const View& out, const View& self, const int64_t* sstrides, T beta, T alpha,
                bool add_self) {
  if (out.numel == 0) return;
  const int rank = out.rank;
  const int64_t n = rank ? out.sizes[rank - 1] : 1;
  const int64_t ost = rank ? out.strides[rank - 1] : 1, sst = rank && add_self ? sstrides[rank - 1] : 0;
  int64_t idx[kMaxRank] = {0};
  for (int64_t t = 0; t < out.numel; t += n) {
    int64_t oo = 0, os = 0;
    for (int d = 0; d + 1 < rank; ++d) { oo += idx[d] * out.strides[d]; os += idx[d] * sstrides[d]; }
    T* o = out.ptr<T>() + oo;
    const T* s = add_self ? self.ptr<T>() + os : nullptr;
    if (ost == 1 && sst == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = scaled_one<T>(o[i], s + i, beta, alpha, add_self);
    } else if (ost == 1) {  // self broadcast along the row (or not added)
      for (int64_t i = 0; i < n; ++i) o[i] = scaled_one<T>(o[i], s, beta, alpha, add_self);
    } else {
      for (int64_t i = 0; i < n; ++i)
        o[i * ost] = scaled_one<T>(o[i * ost], add_self ? s + i * sst : s, beta, alpha, add_self);
    }
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < out.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

// addmm / baddbmm's scalars: integer outs take them truncated (ATen converts them to the
// integer dtype: beta=0.2 is 0), bool outs as bools.
bool addmm_epilogue(opforge_context* ctx, const char* op, const View& out, const View& self,
                    const int64_t* sstrides, double beta, int64_t ibeta, bool beta_int,
                    double alpha, int64_t ialpha, bool alpha_int) {
  dispatch_real(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    T b, a;
    if constexpr (std::is_floating_point<T>::value) {
      b = static_cast<T>(beta);
      a = static_cast<T>(alpha);
    } else {
      // truncated toward zero as ATen converts them; a NaN, inf or out-of-range scalar
      // (a hostile program's) is 0 rather than undefined behaviour
      auto truncate = [](double v) {
        return std::isfinite(v) && std::fabs(v) < 9.2e18 ? static_cast<int64_t>(v) : int64_t{0};
      };
      int64_t bi = beta_int ? ibeta : truncate(beta);
      int64_t ai = alpha_int ? ialpha : truncate(alpha);
      b = static_cast<T>(bi);
      a = static_cast<T>(ai);
    }
    bool add = beta_int ? ibeta != 0 : beta != 0.0;
    if (!std::is_floating_point<T>::value) add = b != T(0);
    bool scale = std::is_floating_point<T>::value ? alpha != 1.0 : a != T(1);
    if (add || scale) scaled_sum<T>(out, self, sstrides, b, a, add);
  });
  return ctx->status == 0;
}

// --- the kernels ---------------------------------------------------------------------------

void mm_like(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, int rank_a,
             int rank_b) {
  View a, b, out;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &a) ||
      !tensor_arg(ctx, args, n, 1, op, rank_a == 1 ? "tensor" : "mat2", &b) ||
      !tensor_arg(ctx, args, n, 2, op, "out", &out))
    return;
  if ((rank_a && a.rank != rank_a) || (rank_b && b.rank != rank_b)) {
    fail(ctx, "%s: operands of rank %d and %d — valid: rank %d and %d — reshape the operands",
         op, a.rank, b.rank, rank_a, rank_b);
    return;
  }
  if (rank_a == 3 && a.sizes[0] != b.sizes[0]) {
    fail(ctx, "%s: batch sizes %lld and %lld — valid: equal (bmm does not broadcast)", op,
         (long long)a.sizes[0], (long long)b.sizes[0]);
    return;
  }
  if (!same_dtype(ctx, op, a, b, out)) return;
  Batched p;
  int64_t shape[kMaxRank];
  int rank;
  if (!matmul_plan(ctx, op, a, b, &p, shape, &rank) || !check_shape(ctx, op, out, shape, rank))
    return;
  out_strides(&p, out, a, b);
  product_into(ctx, op, p, a, b, out);
}

void mm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  mm_like(ctx, args, n, "aten::mm.out", 2, 2);
}

void bmm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  mm_like(ctx, args, n, "aten::bmm.out", 3, 3);
}

void matmul_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  mm_like(ctx, args, n, "aten::matmul.out", 0, 0);
}

void dot_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  mm_like(ctx, args, n, "aten::dot.out", 1, 1);
}

void addmm_like(opforge_context* ctx, opforge_arg* args, int64_t n, const char* op, int rank) {
  View self, a, b, out;
  if (!tensor_arg(ctx, args, n, 0, op, "self", &self) ||
      !tensor_arg(ctx, args, n, 1, op, rank == 2 ? "mat1" : "batch1", &a) ||
      !tensor_arg(ctx, args, n, 2, op, rank == 2 ? "mat2" : "batch2", &b) ||
      !tensor_arg(ctx, args, n, 5, op, "out", &out))
    return;
  double beta, alpha;
  int64_t ibeta, ialpha;
  bool beta_int, alpha_int;
  if (!scalar_arg(ctx, args, n, 3, op, "beta", &beta, &ibeta, &beta_int) ||
      !scalar_arg(ctx, args, n, 4, op, "alpha", &alpha, &ialpha, &alpha_int))
    return;
  if (a.rank != rank || b.rank != rank) {
    fail(ctx, "%s: operands of rank %d and %d — valid: rank %d each", op, a.rank, b.rank, rank);
    return;
  }
  if (rank == 3 && a.sizes[0] != b.sizes[0]) {
    fail(ctx, "%s: batch sizes %lld and %lld — valid: equal", op, (long long)a.sizes[0],
         (long long)b.sizes[0]);
    return;
  }
  if (!same_dtype(ctx, op, a, b, out)) return;
  if (self.dtype != out.dtype) {
    fail(ctx, "%s: self of dtype %s with out %s — valid: one dtype — convert self first", op,
         dtype_name(self.dtype), dtype_name(out.dtype));
    return;
  }
  Batched p;
  int64_t shape[kMaxRank];
  int r;
  if (!matmul_plan(ctx, op, a, b, &p, shape, &r) || !check_shape(ctx, op, out, shape, r))
    return;
  int64_t sstrides[kMaxRank];
  if (!broadcast_to(ctx, op, "self", self, shape, r, sstrides)) return;
  out_strides(&p, out, a, b);
  if (out.numel == 0) return;
  // self overlapping out (an in-place addmm): self is copied first, as NumPy would read it
  opforge_tensor copy_t;
  int64_t copy_sizes[kMaxRank], copy_strides[kMaxRank];
  View src = self;
  if (overlaps(out, self)) {
    int64_t item = itemsize(self.dtype), bytes;
    char* buf = mul_ok(self.numel, item, &bytes) ? static_cast<char*>(scratch(ctx, 1, bytes)) : nullptr;
    if (!buf) {
      fail(ctx, "%s: a copy of self (which overlaps out) — could not be allocated", op);
      return;
    }
    int64_t idx[kMaxRank] = {0}, e = 1;
    for (int d = self.rank - 1; d >= 0; --d) {
      copy_sizes[d] = self.sizes[d];
      copy_strides[d] = e;
      e *= self.sizes[d];
    }
    for (int64_t t = 0; t < self.numel; ++t) {
      int64_t off = 0;
      for (int d = 0; d < self.rank; ++d) off += idx[d] * self.strides[d];
      std::memcpy(buf + t * item, self.data + off * item, item);
      for (int d = self.rank - 1; d >= 0; --d) {
        if (++idx[d] < self.sizes[d]) break;
        idx[d] = 0;
      }
    }
    copy_t = *self.t;
    copy_t.data = buf;
    copy_t.sizes = copy_sizes;
    copy_t.strides = copy_strides;
    src.t = &copy_t;
    src.data = buf;
    src.sizes = copy_sizes;
    src.strides = copy_strides;
    if (!broadcast_to(ctx, op, "self", src, shape, r, sstrides)) return;
  }
  if (!product_into(ctx, op, p, a, b, out)) return;
  addmm_epilogue(ctx, op, out, src, sstrides, beta, ibeta, beta_int, alpha, ialpha, alpha_int);
}

void addmm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  addmm_like(ctx, args, n, "aten::addmm.out", 2);
}

void baddbmm_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  addmm_like(ctx, args, n, "aten::baddbmm.out", 3);
}

void linear_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  const char* op = "aten::linear.out";
  View x, w, bias, out;
  bool has_bias;
  if (!tensor_arg(ctx, args, n, 0, op, "input", &x) ||
      !tensor_arg(ctx, args, n, 1, op, "weight", &w) ||
      !optional_tensor_arg(ctx, args, n, 2, op, "bias", &bias, &has_bias) ||
      !tensor_arg(ctx, args, n, 3, op, "out", &out))
    return;
  if (w.rank != 2 && w.rank != 1) {
    fail(ctx, "%s: weight of rank %d — valid: (out_features, in_features) or (in_features,)",
         op, w.rank);
    return;
  }
  if (!same_dtype(ctx, op, x, w, out)) return;
  if (has_bias && bias.dtype != out.dtype) {
    fail(ctx, "%s: bias of dtype %s with out %s — valid: one dtype", op, dtype_name(bias.dtype),
         dtype_name(out.dtype));
    return;
  }
  // weight^T as a view: swap the last two sizes and strides
  opforge_tensor wt_t = *w.t;
  int64_t wt_sizes[2], wt_strides[2];
  View wt = w;
  if (w.rank == 2) {
    wt_sizes[0] = w.sizes[1]; wt_sizes[1] = w.sizes[0];
    wt_strides[0] = w.strides[1]; wt_strides[1] = w.strides[0];
    wt_t.sizes = wt_sizes;
    wt_t.strides = wt_strides;
    wt.t = &wt_t;
    wt.sizes = wt_sizes;
    wt.strides = wt_strides;
  }
  Batched p;
  int64_t shape[kMaxRank];
  int r;
  if (!matmul_plan(ctx, op, x, wt, &p, shape, &r) || !check_shape(ctx, op, out, shape, r))
    return;
  int64_t bstrides[kMaxRank];
  if (has_bias && !broadcast_to(ctx, op, "bias", bias, shape, r, bstrides)) return;
  out_strides(&p, out, x, wt);
  if (out.numel == 0) return;
  if (has_bias && overlaps(out, bias)) {
    fail(ctx, "%s: out overlaps bias — valid: separate tensors", op);
    return;
  }
  if (!product_into(ctx, op, p, x, wt, out)) return;
  if (has_bias) addmm_epilogue(ctx, op, out, bias, bstrides, 1.0, 1, true, 1.0, 1, true);
}

const KernelDef kLinalgKernels[] = {
    {"aten::mm.out", "T T T!", with_half<mm_out, 1>},
    {"aten::bmm.out", "T T T!", with_half<bmm_out, 1>},
    {"aten::matmul.out", "T T T!", with_half<matmul_out, 1>},
    {"aten::dot.out", "T T T!", with_half<dot_out, 1>},
    {"aten::addmm.out", "T T T S S T!", with_half<addmm_out, 1>},
    {"aten::baddbmm.out", "T T T S S T!", with_half<baddbmm_out, 1>},
    {"aten::linear.out", "T T T? T!", with_half<linear_out, 1>},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(linalg, kLinalgKernels)
