// opforge's ExecuTorch compatibility headers: what ExecuTorch's kernel_includes.h brings
// (tensor types, dtype switches, tensor checks and resize helpers, the kernel context),
// mapped onto opforge's kernel API (opforge/kernel.h). See docs/kernel-abi.md,
// "ExecuTorch kernel sources", for what is offered and how it differs.
#pragma once

#include <cstddef>

#include "executorch/runtime/core/exec_aten/exec_aten.h"
#include "executorch/runtime/core/exec_aten/util/scalar_type_util.h"
#include "executorch/runtime/core/exec_aten/util/tensor_util.h"
#include "executorch/runtime/kernel/kernel_runtime_context.h"

// A kernel's operator name as a constant (ExecuTorch passes it to the dtype switches).
#define ET_OPERATOR_NAME_TYPE const char*
#define ET_DEFINE_OPERATOR_NAME(variable, name) static constexpr const char variable[] = name
