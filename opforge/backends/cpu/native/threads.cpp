// How each op runs, decided when it is built: with how many OpenMP threads (core.cpp makes
// the op's primitives and runs it with them; the profile marks the small ones "(1 thread)"),
// and whether the engine's own vector kernels may be used at all.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine.h"

namespace ofc {

// One for a small op, else the engine's. A second thread
// costs its wake-up and a barrier per op (~1-2 µs), and on a shared machine a thread that
// is not scheduled stalls the whole op: the zoo's small models ran up to 2× slower with two
// threads than with one (transformer_layer 25 → 49 µs in the bench, ONNX Runtime 43 → 60).
// Work: multiply-adds of a convolution or matmul (below 2^20, ~4 µs on one core), elements
// of anything else (below 2^15). An op with fewer than 32 multiply-adds per output (a
// depthwise convolution, a product over fewer than 32 terms) moves more bytes than it
// computes: its multiply-adds count four times. MobileNetV2's depthwise layers at 14×14 and
// 7×7 (0.4-1.0 M multiply-adds) took 22-57 µs each on one thread (Intel Xeon, 2 threads
// asked); counted so, they run on two: the float model 3.00 → 2.80 ms, 8a8w 1.59 → 1.48.
int op_threads(const Engine& e, const OpCall& c) {
  if (e.threads <= 1 || c.outs.empty()) return e.threads;
  const Tensor& y = e.tensors[(size_t)c.outs[0]];
  int64_t per = 1;
  const std::string& k = c.kind;
  bool macs = k == "conv" || k == "deconv" || k == "qconv" || k == "matmul" || k == "qmatmul" ||
              k == "int_matmul" || k == "int_dot_matmul";
  if (macs && c.ins.size() > 1) {
    const Tensor& x = e.tensors[(size_t)c.ins[0]];
    const Tensor& w = e.tensors[(size_t)c.ins[1]];
    if (k == "matmul" || k == "qmatmul" || k == "int_matmul" || k == "int_dot_matmul") per = x.dims.empty() ? 1 : x.dims.back();
    else per = w.numel / std::max<int64_t>(1, y.dims.size() > 1 ? y.dims[1] : 1);
  }
  int64_t work;
  if (__builtin_mul_overflow(y.numel, std::max<int64_t>(per, 1), &work)) return e.threads;
  if (macs && per < 32 && __builtin_mul_overflow(work, (int64_t)4, &work)) return e.threads;
  return work < (macs ? ((int64_t)1 << 20) : ((int64_t)1 << 15)) ? 1 : e.threads;
}

bool own_kernels_allowed() {
  const char* cap = std::getenv("OPFORGE_CPU_CAPABILITY");
  return cap == nullptr || std::strcmp(cap, "default") != 0;
}

bool switched_on(const char* env) {
  const char* off = std::getenv(env);
  return off == nullptr || std::strcmp(off, "0") != 0;
}

bool avx2_kernel_allowed(const char* env) {
#if defined(__x86_64__)
  return own_kernels_allowed() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         switched_on(env);
#else
  (void)env;
  return false;
#endif
}

bool avx512_kernel_allowed(const char* env) {
#if defined(__x86_64__)
  return own_kernels_allowed() && __builtin_cpu_supports("avx512f") && switched_on(env);
#else
  (void)env;
  return false;
#endif
}

}  // namespace ofc
