// The vector loops of vector_math.h, compiled per instruction set and dispatched once.
#include "vector_math.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f")
#define VM_NS vm_avx512
#define VM_BYTES 64
namespace opforge::portable::vec {
#include "vector_math_arch.h"
}
#undef VM_NS
#undef VM_BYTES
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
#define VM_NS vm_avx2
#define VM_BYTES 32
namespace opforge::portable::vec {
#include "vector_math_arch.h"
}
#undef VM_NS
#undef VM_BYTES
#pragma GCC pop_options
#endif

#define VM_NS vm_generic
#define VM_BYTES 16
namespace opforge::portable::vec {
#include "vector_math_arch.h"
}
#undef VM_NS
#undef VM_BYTES

namespace opforge::portable::vec {
namespace {

struct Table {
  float (*max)(const float*, int64_t);
  float (*exp_shifted)(const float*, float, float*, int64_t);
  float (*sum)(const float*, int64_t);
  float (*sum_sq_centered)(const float*, float, int64_t);
};

Table pick() {
#if defined(__x86_64__) && defined(__GNUC__)
  // OPFORGE_CPU_CAPABILITY=default / avx2 caps the choice, as gemm.cpp's
  const char* cap = std::getenv("OPFORGE_CPU_CAPABILITY");
  bool only_default = cap && std::strcmp(cap, "default") == 0;
  bool at_most_avx2 = cap && std::strcmp(cap, "avx2") == 0;
  __builtin_cpu_init();
  if (only_default)
    return {vm_generic::max, vm_generic::exp_shifted, vm_generic::sum, vm_generic::sum_sq_centered};
  if (!at_most_avx2 && __builtin_cpu_supports("avx512f"))
    return {vm_avx512::max, vm_avx512::exp_shifted, vm_avx512::sum, vm_avx512::sum_sq_centered};
  if (__builtin_cpu_supports("avx2"))
    return {vm_avx2::max, vm_avx2::exp_shifted, vm_avx2::sum, vm_avx2::sum_sq_centered};
#endif
  return {vm_generic::max, vm_generic::exp_shifted, vm_generic::sum, vm_generic::sum_sq_centered};
}

const Table& table() {
  static const Table t = pick();
  return t;
}

}  // namespace

float exp(float x) { return vm_generic::exp1(x); }
float max(const float* x, int64_t n) { return table().max(x, n); }
float exp_shifted(const float* x, float shift, float* y, int64_t n) {
  return table().exp_shifted(x, shift, y, n);
}
float sum(const float* x, int64_t n) { return table().sum(x, n); }
float sum_sq_centered(const float* x, float c, int64_t n) { return table().sum_sq_centered(x, c, n); }

}  // namespace opforge::portable::vec
