// The portable C++ kernel library: ATen out variants with ATen's semantics, no
// dependencies, every kernel behind the kernel ABI of <opforge/kernel_abi.h>.
//
// Each family file (elementwise.cpp, reduction.cpp, ...) defines its kernels as plain
// opforge_kernel_fn functions and lists them in one table:
//
//     const KernelDef kReductionKernels[] = {
//         {"aten::sum.IntList_out", "T IL? B ST? T!", sum_intlist_out},
//         ...
//     };
//     OPFORGE_PORTABLE_FAMILY(reduction, kReductionKernels)
//
// registry.cpp merges the families into one opforge_library (the runtime links it
// statically; libopforge_portable.so exports it as opforge_register_kernels, so the
// Python lean runtime can load the same kernels and the tests compare them with the NumPy
// kernels, the living specification). A bundle's selective build compiles the same
// families and keeps only the keys its programs call.
//
// The kinds string has one token per schema argument, outs included, in schema order:
//   T tensor · TL tensor list · TL? optional-tensor list · S scalar · I int · D double ·
//   B bool · IL int list · DL double list · BL bool list · ST scalar type · STR string
//   and a trailing '?' for an optional argument (None accepted), '!' for an out tensor.
// Layout, MemoryFormat and Device arguments are `I?`.
//
// Contract of every kernel (docs/native-runtime.md):
//   - validate every argument against the op's contract (dtypes, ranks, sizes, the out's
//     shape, parameters in ATen's ranges) BEFORE touching memory, with checked int64
//     arithmetic; refuse with ctx->status != 0 and a message (fail()), never abort;
//   - never allocate per call beyond what the arguments bound; never read or write
//     outside the tensors' spans;
//   - ATen's semantics: type promotion, broadcasting, NaN/inf, integer overflow wraps as
//     ATen's does, negative indices refused where the lean runtime refuses them.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "opforge/kernel_abi.h"

namespace opforge::portable {

struct KernelDef {
  const char* key;    // "aten::add.out"
  const char* kinds;  // "T T S T!"
  opforge_kernel_fn fn;
};

struct Family {
  const char* name;
  const KernelDef* kernels;
  size_t count;
};

// Every family compiled in, and the keys a selective build keeps (count 0: all). Both
// in the families.cpp that CMake generates from kernels/ops/*.cpp.
const Family* const* all_families(size_t* count);
const char* const* selected_keys(size_t* count);

// The merged table (kinds parsed into arg_kinds once, thread-safe). Also exported from
// libopforge_portable.so as opforge_register_kernels.
const opforge_library* portable_library();

// Report failure: status 1 and a printf-style message (truncated to the context's size).
inline void fail(opforge_context* ctx, const char* format, ...) __attribute__((format(printf, 2, 3)));
inline void fail(opforge_context* ctx, const char* format, ...) {
  ctx->status = 1;
  va_list args;
  va_start(args, format);
  std::vsnprintf(ctx->message, OPFORGE_MESSAGE_SIZE, format, args);
  va_end(args);
}

// Bytes per element of a c10::ScalarType number, 0 for an unknown one.
inline int64_t itemsize(int32_t dtype) {
  switch (dtype) {
    case 0: case 1: case 11: return 1;           // uint8, int8, bool
    case 2: case 5: case 15: case 27: return 2;  // int16, float16, bfloat16, uint16
    case 3: case 6: case 28: return 4;           // int32, float32, uint32
    case 4: case 7: case 29: case 9: return 8;   // int64, float64, uint64, complex64
    case 10: return 16;                          // complex128
    case 8: return 4;                            // complex32
    default: return 0;
  }
}

}  // namespace opforge::portable

#define OPFORGE_PORTABLE_FAMILY(family_name, table)                                   \
  namespace opforge::portable {                                                       \
  extern const Family kFamily_##family_name;                                          \
  const Family kFamily_##family_name = {#family_name, table, sizeof(table) / sizeof(table[0])}; \
  }
