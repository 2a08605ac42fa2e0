// float16 through a kernel's float32 loops, for the families whose NumPy kernels compute
// float16 in float32 and round once into out (ATen's CPU opmath): matrix products,
// normalizations, softmax. Every float16 tensor argument is widened into a dense float32
// copy (per-thread buffers that grow and are never shrunk: a repeated shape allocates
// nothing), the float32 kernel runs on the copies, and each float16 out is rounded once
// from its float32 result.
//
// The adapter takes a call only when every floating-point tensor argument is float16 (a
// mix of float16 and float32 goes to the kernel as it is, which refuses it by name, as
// ATen refuses mixed products); the outs are the call's last `outs` arguments (the out
// overload's schema order).
#pragma once

#include "tensor.h"

namespace opforge::portable {

// Are there floating-point tensor arguments, and are they all float16?
bool all_floating_half(const opforge_arg* args, int64_t n);

// Run `kernel` on float32 copies of the float16 arguments; round the last `outs` back.
// Fails (naming op) when the copies would exceed the kernels' workspace limit.
void run_half_as_float(opforge_context* ctx, opforge_arg* args, int64_t n, int outs,
                       opforge_kernel_fn kernel, const char* op);

// A KernelDef entry point: `Kernel` itself, or through run_half_as_float for float16.
template <opforge_kernel_fn Kernel, int kOuts>
void with_half(opforge_context* ctx, opforge_arg* args, int64_t n) {
  if (all_floating_half(args, n)) run_half_as_float(ctx, args, n, kOuts, Kernel, nullptr);
  else Kernel(ctx, args, n);
}

}  // namespace opforge::portable
