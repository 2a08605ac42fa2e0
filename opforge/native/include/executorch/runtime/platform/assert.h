// opforge's ExecuTorch compatibility headers: ET_CHECK_MSG and friends.
//
// In ExecuTorch these abort the process. An opforge kernel must never abort, so here a
// failed check throws opforge::et::CheckFailure (a std::exception): the generated glue
// catches it and the call fails with the check's condition, message, file and line (a
// KernelError in Python). Only a library built with -fno-exceptions, which cannot throw,
// prints the message and aborts as ExecuTorch does; prefer ET_KERNEL_CHECK, which fails
// the context and returns. ET_DCHECK* check in every build (opforge does not set NDEBUG).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "executorch/runtime/platform/log.h"

namespace opforge {
namespace et {

class CheckFailure : public std::exception {
 public:
  const char* what() const noexcept override { return text; }
  char text[768] = {0};
};

[[noreturn]] inline void raise(const CheckFailure& failure) {
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  throw failure;
#else
  std::fprintf(stderr, "%s\n", failure.text);
  std::abort();
#endif
}

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond) {
  CheckFailure failure;
  std::snprintf(failure.text, sizeof failure.text, "ET_CHECK failed at %s:%d: (%s)",
                basename_of(file), line, cond);
  raise(failure);
}

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const char* fmt, ...) __attribute__((format(printf, 4, 5)));
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const char* fmt, ...) {
  CheckFailure failure;
  const int size = static_cast<int>(sizeof failure.text);
  int n = std::snprintf(failure.text, size, "ET_CHECK failed at %s:%d: (%s): ",
                        basename_of(file), line, cond);
  if (n > 0 && n < size) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(failure.text + n, size - n, fmt, args);
    va_end(args);
  }
  raise(failure);
}

}  // namespace et
}  // namespace opforge

#define ET_CHECK_MSG(_cond, _format, ...)                                                 \
  do {                                                                                    \
    if (!(_cond))                                                                         \
      ::opforge::et::check_failed(__FILE__, __LINE__, #_cond, _format, ##__VA_ARGS__);    \
  } while (0)
#define ET_CHECK(_cond)                                                          \
  do {                                                                           \
    if (!(_cond)) ::opforge::et::check_failed(__FILE__, __LINE__, #_cond);      \
  } while (0)
#define ET_DCHECK_MSG(_cond, _format, ...) ET_CHECK_MSG(_cond, _format, ##__VA_ARGS__)
#define ET_DCHECK(_cond) ET_CHECK(_cond)
#define ET_DEBUG_ONLY
#define ET_ASSERT_UNREACHABLE() \
  ::opforge::et::check_failed(__FILE__, __LINE__, "unreachable code")
#define ET_ASSERT_UNREACHABLE_MSG(_format, ...) \
  ::opforge::et::check_failed(__FILE__, __LINE__, "unreachable code", _format, ##__VA_ARGS__)
