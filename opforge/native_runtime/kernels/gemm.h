// The portable kernels' matrix product: a blocked GEMM of our own (no BLAS), and the
// per-thread scratch buffers the GEMM-based kernels (convolution's columns) fill.
//
// Why our own: the runtime stays dependency-free and cross-compiles (aarch64), and the
// products the zoo and the decoders run are small enough (4x64x128 ... 128x768x768,
// 1x768x3072) that a compact BLIS-style kernel reaches OpenBLAS's single-thread speed.
// gemm.cpp explains the blocking and the microkernels.
#pragma once

#include <cstdint>

#include "opforge/kernel_abi.h"

namespace opforge::portable {

// C = A·B, or C += A·B with `accumulate`; A is m×k, B k×n, C m×n, element (i, j) of a
// matrix X at x[i * rsx + j * csx] (any strides: a transposed view costs nothing). C must
// not overlap A or B. Without `accumulate` C is only written (NaN in it does not leak).
// A large product is split over blocks of rows or columns on the threads ctx lends
// (kernel_services.h), never over k: the bits do not depend on the thread count. Returns
// false, with ctx failed naming `op`, when the packing buffers would exceed the memory the
// kernel may use (workspace_limit(ctx), all threads together: C is then untouched) or
// cannot be allocated (C may then be partly written).
bool gemm(opforge_context* ctx, const char* op, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t rsa, int64_t csa, const float* b, int64_t rsb, int64_t csb, float* c, int64_t rsc,
          int64_t csc, bool accumulate);
bool gemm(opforge_context* ctx, const char* op, int64_t m, int64_t n, int64_t k, const double* a,
          int64_t rsa, int64_t csa, const double* b, int64_t rsb, int64_t csb, double* c, int64_t rsc,
          int64_t csc, bool accumulate);

// Which microkernel gemm runs on this machine: "avx512f", "avx2" or "generic" (the widest
// the CPU has; OPFORGE_CPU_CAPABILITY=avx2 or =default caps it, read once per process).
const char* gemm_isa();

// A per-thread buffer of at least `bytes` bytes, 64-byte aligned, for slot 0..5 (one
// kernel's distinct workspaces; gemm itself packs into slots 6 and 7). It grows and is
// never shrunk, so a kernel called again at the same shape allocates nothing; nullptr when
// the allocation fails or `bytes` exceeds workspace_limit(ctx).
void* scratch(const opforge_context* ctx, int slot, int64_t bytes);
constexpr int kScratchSlots = 8, kGemmSlotB = 6, kGemmSlotA = 7;

// The most bytes a kernel's workspace may take in one call, all its threads together: in
// the native runtime, the instance's memory limit (opf_load_options.max_memory /
// OPFORGE_MAX_MEMORY) less what the method's memory plan already holds (kernel_services.h);
// without the runtime's services (the Python runtime loading libopforge_portable.so),
// OPFORGE_MAX_MEMORY if set, else 8 GiB — the lean runtime's limit
// (opforge.runtime.limits). A hostile program's padding or dilation is refused rather
// than allocated.
int64_t workspace_limit(const opforge_context* ctx);

}  // namespace opforge::portable
