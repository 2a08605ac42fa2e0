// The blocked GEMM behind mm, bmm, addmm, linear, matmul and convolution (gemm.h).
//
// # Design
//
// No BLAS: the runtime is dependency-free and must cross-compile (aarch64), so the product
// is our own, in the classic BLIS shape (gemm_arch.h): B packed in KC x NC panels of
// NR-column strips, A in MC x KC blocks of MR-row strips, and a register-blocked
// microkernel computing an MR x NR tile of C as 2*MR vector accumulators, one broadcast
// of A and two vector loads of B per step. Packing makes every operand layout the same
// to the microkernel (a transposed weight view, a channels-last image's columns) and keeps
// its loads contiguous and cache-resident.
//
// The microkernel is written with GCC vector extensions (vector_size), not intrinsics, so
// the one source compiles for any target: gemm_arch.h is compiled three times, under
// `#pragma GCC target("avx512f,fma")` (64-byte vectors, 8x32 float tiles), under
// `target("avx2,fma")` (32-byte vectors, 6x16) and for the build's own target (16-byte
// vectors, 6x8: SSE2 on any x86-64, NEON on aarch64), and the first call picks the widest
// one the CPU supports (__builtin_cpu_supports). Non-x86 builds compile only the generic
// copy. (target_clones would clone whole functions but cannot give each clone its own
// vector width and tile shape, which is what the speed comes from.)
//
// Few rows (m <= 4: a decoder's one-token step, a small batch through a linear) take
// unpacked paths: packing B would copy all of it to use it once. Row-major B streams its
// rows against broadcast A; a transposed B (linear's W^T) makes each output a dot product
// of two contiguous rows.
//
// The kernels' build turns floating-point contraction off (CMakeLists.txt: elementwise
// kernels round as NumPy does); the microkernels turn it back on (`optimize
// ("fp-contract=fast")` in each target region), so that acc += a * b is one FMA, as in
// every BLAS: an FMA rounds once where a multiply and an add round twice, inside the
// summation bound below either way, and it doubles the peak rate.
//
// Threads: a product of at least 2^19 multiply-adds is cut into blocks of columns (or of
// rows, when m > n), a few per thread the runtime lends (kernel_services.h, parallel.h),
// each block packing its own panels into its thread's scratch. Every element of C is summed in the same order
// whatever block holds it, so the result does not depend on the thread count; the
// summation (k) is never split. The few-rows paths cut columns at multiples of 64, so each
// column takes the same vector or tail path as without threads. The packing buffers of all
// the threads together are held to workspace_limit(ctx): fewer threads when they do not
// fit, a refusal naming the product when one thread's do not.
//
// The summation order differs from OpenBLAS's (blocks of KC, vector lanes), so results
// agree to rounding, not bit for bit: |error| <= ~K * eps * sum|a||b| as for any
// ordinary float sum.
#include "gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "parallel.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {

// One instruction set's entry points (gemm_arch.h kernels()).
template <typename T>
struct GemmKernels {
  void (*few_rows)(int64_t, int64_t, int64_t, const T*, int64_t, int64_t, const T*, int64_t, int64_t,
                   T*, int64_t, int64_t, bool);
  void (*blocked)(int64_t, int64_t, int64_t, const T*, int64_t, int64_t, const T*, int64_t, int64_t,
                  T*, int64_t, int64_t, bool, T*, T*);
  void (*workspace)(int64_t, int64_t, int64_t, int64_t*, int64_t*);
  int mr, nr;
};

}  // namespace opforge::portable

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
#pragma GCC optimize("fp-contract=fast")
#define GEMM_NS avx512
#define GEMM_VBYTES 64
#define GEMM_MR_F 8
#define GEMM_MR_D 8
namespace opforge::portable {
#include "gemm_arch.h"
}
#undef GEMM_NS
#undef GEMM_VBYTES
#undef GEMM_MR_F
#undef GEMM_MR_D
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("fp-contract=fast")
#define GEMM_NS avx2
#define GEMM_VBYTES 32
#define GEMM_MR_F 6
#define GEMM_MR_D 6
namespace opforge::portable {
#include "gemm_arch.h"
}
#undef GEMM_NS
#undef GEMM_VBYTES
#undef GEMM_MR_F
#undef GEMM_MR_D
#pragma GCC pop_options
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
#define GEMM_NS generic
#define GEMM_VBYTES 16
#define GEMM_MR_F 6
#define GEMM_MR_D 6
namespace opforge::portable {
#include "gemm_arch.h"
}
#undef GEMM_NS
#undef GEMM_VBYTES
#undef GEMM_MR_F
#undef GEMM_MR_D
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

namespace opforge::portable {

namespace {

enum class Isa { kGeneric, kAvx2, kAvx512 };

Isa detect() {
#if defined(__x86_64__) && defined(__GNUC__)
  // OPFORGE_CPU_CAPABILITY caps the choice as it does the cpu engine's: "default" (the
  // portable copy every target has), "avx2"; unset or anything else: the widest
  const char* cap = std::getenv("OPFORGE_CPU_CAPABILITY");
  bool only_default = cap && std::strcmp(cap, "default") == 0;
  bool at_most_avx2 = cap && std::strcmp(cap, "avx2") == 0;
  __builtin_cpu_init();
  if (only_default) return Isa::kGeneric;
  if (!at_most_avx2 && __builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kGeneric;
}

Isa isa() {
  static const Isa chosen = detect();
  return chosen;
}

template <typename T>
GemmKernels<T> kernels_for_isa() {
  switch (isa()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Isa::kAvx512: return avx512::kernels<T>();
    case Isa::kAvx2: return avx2::kernels<T>();
#endif
    default: return generic::kernels<T>();
  }
}

constexpr int64_t kGrain = kParallelGrain;  // parallel.h
// Column blocks of the few-rows paths start at multiples of this: a multiple of every
// copy's vector lanes, so each column takes the same path (vector or tail) as unsplit.
constexpr int64_t kFewRowsAlign = 64;

int64_t work_of(int64_t m, int64_t n, int64_t k) {
  int64_t mn, mnk;
  if (!mul_ok(m, n, &mn) || !mul_ok(mn, k, &mnk)) return INT64_MAX;
  return mnk;
}

template <typename T>
bool run(opforge_context* ctx, const char* op, int64_t m, int64_t n, int64_t k, const T* a,
         int64_t rsa, int64_t csa, const T* b, int64_t rsb, int64_t csb, T* c, int64_t rsc,
         int64_t csc, bool accumulate) {
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {  // an empty sum: zeros (or C unchanged)
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * rsc + j * csc] = T(0);
    return true;
  }
  static const GemmKernels<T> widest = kernels_for_isa<T>();
#if defined(__x86_64__) && defined(__GNUC__)
  // A product at most the AVX2 tile wide would leave AVX-512's tiles half empty (and store
  // each through the partial-tile path): the AVX2 copy computes it. Its microkernel sums
  // every element of C in the same order (one FMA chain over each KC = 256 block), so
  // the bits are the same; the few-rows paths below keep the widest copy (their tails
  // depend on the vector width).
  static const GemmKernels<T> narrow =
      isa() == Isa::kAvx512 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
          ? avx2::kernels<T>() : widest;
  const GemmKernels<T>& K = m > 4 && n <= narrow.nr ? narrow : widest;
#else
  const GemmKernels<T>& K = widest;
#endif
  const int64_t work = work_of(m, n, k);
  // Few rows, B row-contiguous or a transposed weight: unpacked, split over columns
  if (m <= 4 && (csb == 1 || (rsb == 1 && csa == 1))) {
    int64_t per_col = m * k, grain = (kGrain + per_col - 1) / per_col;
    int64_t parts = parallel_parts(ctx, n, grain < kFewRowsAlign ? kFewRowsAlign : grain);
    parallel_ranges(ctx, n, parts, kFewRowsAlign, [&](int64_t j0, int64_t j1) {
      K.few_rows(m, j1 - j0, k, a, rsa, csa, b + j0 * csb, rsb, csb, c + j0 * csc, rsc, csc, accumulate);
    });
    return true;
  }
  // Packed: split the longer of m and n (the other operand is packed again per block)
  const bool by_cols = n >= m;
  const int64_t len = by_cols ? n : m, align = by_cols ? K.nr : K.mr;
  int64_t parts = parallel_parts(ctx, work / kGrain, 1);
  if (parts > len / align) parts = len / align > 0 ? len / align : 1;
  const int64_t limit = workspace_limit(ctx);
  int64_t b_elems = 0, a_elems = 0, bytes = INT64_MAX;
  const int64_t threads = num_threads(ctx);
  for (; parts >= 1; --parts) {  // fewer threads when their buffers do not fit the limit
    int64_t part = (len / align + parts - 1) / parts * align;
    K.workspace(by_cols ? m : part, by_cols ? part : n, k, &b_elems, &a_elems);
    bytes = (b_elems + a_elems) * int64_t(sizeof(T)) * (parts < threads ? parts : threads);
    if (bytes <= limit) break;
  }
  if (parts < 1) {
    K.workspace(m, n, k, &b_elems, &a_elems);
    fail(ctx, "%s: the matrix product's packing workspace (%lld x %lld by %lld) — %lld bytes — valid: at "
         "most %lld bytes, what the memory limit leaves after the method's planned memory — fix: "
         "raise the limit (opf_load_options.max_memory / load(max_memory=...) / OPFORGE_MAX_MEMORY)",
         op, (long long)m, (long long)n, (long long)k,
         (long long)((b_elems + a_elems) * int64_t(sizeof(T))), (long long)limit);
    return false;
  }
  std::atomic<bool> no_memory{false};
  parallel_ranges(ctx, len, parts, align, [&](int64_t r0, int64_t r1) {
    int64_t rows = by_cols ? m : r1 - r0, cols = by_cols ? r1 - r0 : n;
    int64_t be, ae;
    K.workspace(rows, cols, k, &be, &ae);
    T* bpack = static_cast<T*>(scratch(ctx, kGemmSlotB, be * int64_t(sizeof(T))));
    T* apack = static_cast<T*>(scratch(ctx, kGemmSlotA, ae * int64_t(sizeof(T))));
    if (!bpack || !apack) {
      no_memory.store(true, std::memory_order_relaxed);
      return;
    }
    if (by_cols)
      K.blocked(m, cols, k, a, rsa, csa, b + r0 * csb, rsb, csb, c + r0 * csc, rsc, csc, accumulate, bpack, apack);
    else
      K.blocked(rows, n, k, a + r0 * rsa, rsa, csa, b, rsb, csb, c + r0 * rsc, rsc, csc, accumulate, bpack, apack);
  });
  if (no_memory.load()) {
    fail(ctx, "%s: the matrix product's packing buffers (%lld bytes, all threads) — could not be "
         "allocated — valid: that much free memory — fix: free memory, or run on fewer threads",
         op, (long long)bytes);
    return false;
  }
  return true;
}

}  // namespace

bool gemm(opforge_context* ctx, const char* op, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t rsa, int64_t csa, const float* b, int64_t rsb, int64_t csb, float* c, int64_t rsc,
          int64_t csc, bool accumulate) {
  return run<float>(ctx, op, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate);
}

bool gemm(opforge_context* ctx, const char* op, int64_t m, int64_t n, int64_t k, const double* a,
          int64_t rsa, int64_t csa, const double* b, int64_t rsb, int64_t csb, double* c, int64_t rsc,
          int64_t csc, bool accumulate) {
  return run<double>(ctx, op, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate);
}

const char* gemm_isa() {
  switch (isa()) {
    case Isa::kAvx512: return "avx512f";
    case Isa::kAvx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace opforge::portable
