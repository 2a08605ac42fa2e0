// libopforge_portable.so: the portable kernels as a native kernel library, so the Python
// runtime can load them (opforge.runtime.load(..., kernels=[path])) and the tests hold
// each kernel to the NumPy kernel of the same key.
#include "portable.h"

extern "C" OPFORGE_EXPORT const opforge_library* opforge_register_kernels(void) {
  return opforge::portable::portable_library();
}
