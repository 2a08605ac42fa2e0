/* The cpu backend's call-out ABI: how its engine runs a node it does not implement itself
 * (a custom op's native kernel, an op-package op).
 *
 * Whoever prepares such a node (the backend's Python side, at init) hands the engine one
 * opforge_external per node: a function and an opaque state bound to that node (its
 * parameters, the kernel it wraps). The engine calls fn once per execution of the node,
 * with the node's inputs and preallocated outputs, all C-contiguous. fn returns 0 on
 * success; otherwise it writes a NUL-terminated message into error (at most error_size
 * bytes) and returns non-zero, and the engine's execute fails with that message.
 */
#ifndef OPFORGE_CPU_EXTERNAL_H_
#define OPFORGE_CPU_EXTERNAL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPFORGE_EXTERNAL_ABI_VERSION 1

typedef struct opforge_ext_tensor {
  void* data;            /* C-contiguous elements */
  int32_t dtype;         /* opforge ScalarType code (6 = float32, 1 = int8, 0 = uint8, ...) */
  int32_t ndim;
  const int64_t* sizes;  /* ndim sizes */
} opforge_ext_tensor;

typedef int32_t (*opforge_ext_fn)(void* state, const opforge_ext_tensor* inputs, int32_t n_inputs,
                                  opforge_ext_tensor* outputs, int32_t n_outputs, char* error,
                                  int32_t error_size);

typedef struct opforge_external {
  opforge_ext_fn fn;
  void* state;
} opforge_external;

#ifdef __cplusplus
}
#endif

#endif /* OPFORGE_CPU_EXTERNAL_H_ */
