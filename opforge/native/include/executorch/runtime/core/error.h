// opforge's ExecuTorch compatibility headers: Error (opforge::Error, the same codes and
// numbering) and the ET_CHECK_OR_RETURN_ERROR family.
#pragma once

#include <cstdint>

#include "executorch/runtime/platform/log.h"
#include "opforge/kernel.h"

namespace executorch {
namespace runtime {
typedef uint32_t error_code_t;
using Error = ::opforge::Error;
using ::opforge::to_string;
}  // namespace runtime
}  // namespace executorch

namespace torch {
namespace executor {
using ::executorch::runtime::Error;
using ::executorch::runtime::error_code_t;
}  // namespace executor
}  // namespace torch

// Returns Error::<error> from the enclosing function when `cond` is false, recording why
// (the next failing ET_KERNEL_CHECK adds it to the kernel's failure message).
#define ET_CHECK_OR_RETURN_ERROR(cond__, error__, message__, ...)                          \
  do {                                                                                     \
    if (!(cond__)) {                                                                       \
      ::opforge::et::set_failure_detail("%s:%d: (%s): " message__,                         \
                                        ::opforge::et::basename_of(__FILE__), __LINE__,    \
                                        #cond__, ##__VA_ARGS__);                           \
      return ::executorch::runtime::Error::error__;                                        \
    }                                                                                      \
  } while (0)

#define ET_CHECK_OK_OR_RETURN_ERROR(error__, ...)                        \
  do {                                                                   \
    const ::executorch::runtime::Error et_error__ = (error__);           \
    if (et_error__ != ::executorch::runtime::Error::Ok) return et_error__; \
  } while (0)
