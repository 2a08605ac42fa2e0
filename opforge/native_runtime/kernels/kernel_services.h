// What the native runtime lends the portable kernels for one call: a thread pool and the
// memory a kernel's scratch may take. Handed over in opforge_context::runtime, the field
// the kernel ABI reserves for the runtime.
//
// # Design
//
// The kernel ABI stays as it is: a kernel library built for it is never given anything it
// must read, and the Python runtime (which loads these same kernels from
// libopforge_portable.so) passes runtime = NULL. Only a portable kernel looks inside, and
// only after checking the magic and the size, so a pointer from another runtime is never
// read as ours: without services a kernel runs on its calling thread and its scratch is
// bounded by OPFORGE_MAX_MEMORY (else 8 GiB), as before.
//
// The pool is reached through a function pointer, not a C++ type, so a copy of the
// portable kernels in another shared object (libopforge_portable.so dlopen()ed into an
// app that uses libopforge_runtime) uses the runtime's pool safely.
//
// Determinism: a kernel splits its work only where every element is computed the same way
// whichever task computes it (GEMM over blocks of rows or columns, never over the sum;
// elementwise work over ranges of elements), so any thread count gives the bits of one.
#pragma once

#include <cstdint>

#include "opforge/kernel_abi.h"

namespace opforge {

// task(closure, i) for one i; must not throw (kernels report through their context).
typedef void (*kernel_task_fn)(void* closure, int64_t task);

struct KernelServices {
  static constexpr uint32_t kMagic = 0x4f50534bu;  // "KSPO"
  uint32_t magic = kMagic;
  uint32_t size = sizeof(KernelServices);
  int32_t num_threads = 1;        // threads a kernel may use, the caller's included (>= 1)
  int32_t reserved = 0;
  int64_t workspace_limit = 0;    // bytes one kernel call's scratch may take, all threads
  void* pool = nullptr;           // passed back to parallel_for
  // Run task(closure, i) for every i in [0, n) on up to num_threads threads (the calling
  // one among them) and return when all are done. NULL: run them on the caller.
  void (*parallel_for)(void* pool, int64_t n, kernel_task_fn task, void* closure) = nullptr;
};

// The services in ctx, or nullptr when the caller lent none (or is not this runtime).
inline const KernelServices* kernel_services(const opforge_context* ctx) {
  const auto* s = static_cast<const KernelServices*>(ctx ? ctx->runtime : nullptr);
  return s && s->magic == KernelServices::kMagic && s->size == sizeof(KernelServices) ? s : nullptr;
}

}  // namespace opforge
