// The runtime's own kernel for a Move instruction: copy tensor args[0] into args[1]
// (same dtype; the source broadcast to the destination's sizes, as NumPy's copyto).
#pragma once

#include "opforge/kernel_abi.h"

namespace opforge::rt {
void move_kernel(opforge_context* ctx, opforge_arg* args, int64_t num_args);
// Copy `src` into the dense layout given by `dst` (used for inputs and state).
}  // namespace opforge::rt
