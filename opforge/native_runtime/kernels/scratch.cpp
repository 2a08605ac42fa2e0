// The kernels' scratch buffers and the bound on them (gemm.h): per thread, per slot,
// grown on demand and kept, so a kernel called again at the same shape allocates nothing.
#include <cstdint>
#include <cstdlib>

#include "gemm.h"
#include "kernel_services.h"

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

static int64_t environment_limit() {
  static const int64_t limit = [] {
    const char* env = std::getenv("OPFORGE_MAX_MEMORY");
    int64_t v = env && *env ? parse_size(env) : -1;
    return v > 0 ? v : static_cast<int64_t>(8) << 30;
  }();
  return limit;
}

int64_t workspace_limit(const opforge_context* ctx) {
  const KernelServices* services = kernel_services(ctx);
  return services ? services->workspace_limit : environment_limit();
}

void* scratch(const opforge_context* ctx, int slot, int64_t bytes) {
  if (slot < 0 || slot >= kScratchSlots || bytes < 0 || bytes > workspace_limit(ctx)) return nullptr;
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
