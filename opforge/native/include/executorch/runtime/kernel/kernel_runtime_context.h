// opforge's ExecuTorch compatibility headers: KernelRuntimeContext is opforge's
// KernelContext (the same type, so ExecuTorch kernels match the glue's declarations):
// fail(Error), failure_state() and opforge's own fail("message", ...).
// allocate_temp() is not offered: opforge gives kernels no temporary allocator.
#pragma once

#include "executorch/runtime/core/error.h"
#include "executorch/runtime/platform/compiler.h"
#include "opforge/kernel.h"

namespace executorch {
namespace runtime {
using KernelRuntimeContext = ::opforge::KernelContext;
}  // namespace runtime
namespace aten {
using RuntimeContext = ::opforge::KernelContext;
}  // namespace aten
}  // namespace executorch

namespace torch {
namespace executor {
using KernelRuntimeContext = ::opforge::KernelContext;
using RuntimeContext = ::opforge::KernelContext;
}  // namespace executor
}  // namespace torch
