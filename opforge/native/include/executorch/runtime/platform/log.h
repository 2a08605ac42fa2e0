// opforge's ExecuTorch compatibility headers: ET_LOG and the per-thread failure detail.
//
// ET_LOG(Level, fmt, ...) prints "[executorch kernel] Level file:line: message" to stderr,
// as ExecuTorch's default log sink does. The helpers that cannot reach the kernel's
// context (resize_tensor, ET_LOG_MSG_AND_RETURN_IF_FALSE, ...) record why they failed in
// a per-thread detail instead; the next ET_KERNEL_CHECK that fails adds it to the kernel's
// failure message, so the runtime's KernelError says what went wrong.
#pragma once

#include <cinttypes>  // PRId64 and friends, which kernels use in their messages
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "executorch/runtime/platform/compiler.h"

namespace opforge {
namespace et {

enum class LogLevel { Debug, Info, Error, Fatal };

inline const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// Why the last compatibility helper on this thread failed ("" when nothing failed since
// the last ET_KERNEL_CHECK read it).
inline char* failure_detail() {
  static thread_local char detail[512];
  return detail;
}

inline void set_failure_detail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void set_failure_detail(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(failure_detail(), 512, fmt, args);
  va_end(args);
}

inline void log(LogLevel level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
inline void log(LogLevel level, const char* file, int line, const char* fmt, ...) {
  static const char* const names[] = {"Debug", "Info", "Error", "Fatal"};
  std::fprintf(stderr, "[executorch kernel] %s %s:%d: ", names[static_cast<int>(level)],
               basename_of(file), line);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
}

}  // namespace et
}  // namespace opforge

#define ET_LOG(_level, _format, ...) \
  ::opforge::et::log(::opforge::et::LogLevel::_level, __FILE__, __LINE__, _format, ##__VA_ARGS__)
