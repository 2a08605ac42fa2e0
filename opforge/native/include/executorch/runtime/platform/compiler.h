// opforge's ExecuTorch compatibility headers: compiler attribute macros ExecuTorch kernel
// sources use. See docs/kernel-abi.md, "ExecuTorch kernel sources".
#pragma once

// The namespace of ExecuTorch's runtime types (executorch::ET_RUNTIME_NAMESPACE::...).
#ifndef ET_RUNTIME_NAMESPACE
#define ET_RUNTIME_NAMESPACE runtime
#endif

#define ET_UNUSED __attribute__((unused))
#define ET_NODISCARD [[nodiscard]]
#define ET_INLINE __attribute__((always_inline)) inline
#define ET_NOINLINE __attribute__((noinline))
#define ET_LIKELY(expr) (__builtin_expect(static_cast<bool>(expr), 1))
#define ET_UNLIKELY(expr) (__builtin_expect(static_cast<bool>(expr), 0))
#define ET_FALLTHROUGH [[fallthrough]]
#define ET_DEPRECATED [[deprecated]]
#define ET_EXPERIMENTAL
#define ET_FUNCTION __func__

#ifndef C10_DIAGNOSTIC_PUSH_AND_IGNORED_IF_DEFINED
#define C10_DIAGNOSTIC_PUSH_AND_IGNORED_IF_DEFINED(warning)
#define C10_DIAGNOSTIC_POP()
#endif
