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
// The summation order differs from OpenBLAS's (blocks of KC, vector lanes), so results
// agree to rounding, not bit for bit: |error| <= ~K * eps * sum|a||b| as for any
// ordinary float sum.
#include "gemm.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

namespace opforge::portable {

namespace {

struct ScratchSlot {
  void* data = nullptr;
  int64_t bytes = 0;
  ~ScratchSlot() { std::free(data); }
};

thread_local ScratchSlot tls_scratch[kScratchSlots];

}  // namespace

// OPFORGE_MAX_MEMORY as opforge.runtime.limits.parse_size reads it: bytes, or a number
// with a binary suffix K, M, G or T (optionally followed by B or iB); -1 if malformed.
static int64_t parse_size(const char* s) {
  while (*s == ' ' || *s == '\t') ++s;
  if (*s < '0' || *s > '9') return -1;
  int64_t v = 0;
  for (; *s >= '0' && *s <= '9'; ++s)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *s - '0', &v)) return -1;
  while (*s == ' ' || *s == '\t') ++s;
  int shift = 0;
  switch (*s | 0x20) {
    case 'k': shift = 10; ++s; break;
    case 'm': shift = 20; ++s; break;
    case 'g': shift = 30; ++s; break;
    case 't': shift = 40; ++s; break;
    default: break;
  }
  if (shift && (*s | 0x20) == 'i') ++s;
  if ((*s | 0x20) == 'b') ++s;
  while (*s == ' ' || *s == '\t') ++s;
  if (*s != '\0' || (shift && v > (INT64_MAX >> shift))) return -1;
  return v << shift;
}

int64_t workspace_limit() {
  static const int64_t limit = [] {
    const char* env = std::getenv("OPFORGE_MAX_MEMORY");
    int64_t v = env && *env ? parse_size(env) : -1;
    return v > 0 ? v : static_cast<int64_t>(8) << 30;
  }();
  return limit;
}

void* scratch(int slot, int64_t bytes) {
  if (slot < 0 || slot >= kScratchSlots || bytes < 0 || bytes > workspace_limit()) return nullptr;
  ScratchSlot& s = tls_scratch[slot];
  if (bytes <= s.bytes && s.data) return s.data;
  int64_t size = (bytes + 63) / 64 * 64;
  if (size == 0) size = 64;
  void* p = std::aligned_alloc(64, static_cast<size_t>(size));
  if (!p) return nullptr;
  std::free(s.data);
  s.data = p;
  s.bytes = size;
  return p;
}

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
bool run(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b,
         int64_t rsb, int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {  // an empty sum: zeros (or C unchanged)
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * rsc + j * csc] = T(0);
    return true;
  }
  switch (isa()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Isa::kAvx512:
      return avx512::gemm<T>(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate, scratch);
    case Isa::kAvx2:
      return avx2::gemm<T>(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate, scratch);
#endif
    default:
      return generic::gemm<T>(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate, scratch);
  }
}

}  // namespace

bool gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, int64_t csa,
          const float* b, int64_t rsb, int64_t csb, float* c, int64_t rsc, int64_t csc,
          bool accumulate) {
  return run<float>(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate);
}

bool gemm(int64_t m, int64_t n, int64_t k, const double* a, int64_t rsa, int64_t csa,
          const double* b, int64_t rsb, int64_t csb, double* c, int64_t rsc, int64_t csc,
          bool accumulate) {
  return run<double>(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate);
}

const char* gemm_isa() {
  switch (isa()) {
    case Isa::kAvx512: return "avx512f";
    case Isa::kAvx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace opforge::portable
