// Parallel loops for the portable kernels, over the pool the runtime lends them
// (kernel_services.h). Without a pool, or with one thread, the loops run inline on the
// calling thread: the same code path, in task order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel_services.h"

namespace opforge::portable {

// The least work (multiply-adds, or element operations) worth a thread: waking one costs a
// few µs, and 2^18 multiply-adds take ~5 µs on one core.
constexpr int64_t kParallelGrain = int64_t(1) << 18;

// Threads a kernel called with ctx may use (1 without the runtime's services).
inline int num_threads(const opforge_context* ctx) {
  const KernelServices* s = kernel_services(ctx);
  return s && s->parallel_for && s->num_threads > 1 ? s->num_threads : 1;
}

// f(i) for every i in [0, n), spread over the pool's threads; returns when all are done.
// f must not throw and must compute each i the same way whichever thread runs it.
template <typename F>
void parallel_for(const opforge_context* ctx, int64_t n, F&& f) {
  using Fn = std::remove_reference_t<F>;
  const KernelServices* s = kernel_services(ctx);
  if (n <= 1 || num_threads(ctx) <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  s->parallel_for(s->pool, n, [](void* closure, int64_t i) { (*static_cast<Fn*>(closure))(i); },
                  const_cast<void*>(static_cast<const void*>(&f)));
}

// How many ranges to cut `total` items into so that each has at least `grain` of them
// (the work worth a thread's wake-up): up to kTasksPerThread per thread, so that on a
// machine busier than its cores the threads that run take the share of one that does not
// (the pool hands out tasks one by one). 1: run inline.
constexpr int64_t kTasksPerThread = 4;
inline int64_t parallel_parts(const opforge_context* ctx, int64_t total, int64_t grain) {
  int64_t threads = num_threads(ctx);
  if (threads <= 1 || grain <= 0 || total < 2 * grain) return 1;
  int64_t parts = total / grain, most = threads * kTasksPerThread;
  return parts < most ? parts : most;
}

// f(begin, end) over [0, total) in `parts` ranges whose bounds are multiples of `align`
// (the last ends at total), in parallel. parts <= 1 calls f(0, total) inline.
template <typename F>
void parallel_ranges(const opforge_context* ctx, int64_t total, int64_t parts, int64_t align, F&& f) {
  if (parts <= 1) {
    f(int64_t(0), total);
    return;
  }
  int64_t units = total / align + (total % align != 0);
  int64_t chunk = units / parts, extra = units % parts;  // the first `extra` get one more
  parallel_for(ctx, parts, [&](int64_t p) {
    int64_t first = p * chunk + (p < extra ? p : extra);
    int64_t begin = first * align, end = (first + chunk + (p < extra)) * align;
    if (end > total) end = total;
    if (begin < end) f(begin, end);
  });
}

}  // namespace opforge::portable
