/* opforge's op-package C ABI: what a compiled op package exports and what a backend calls.
 *
 * A package is one shared library (libQnn<PackageName>.so). It exports one function, its
 * interface provider (by default <PackageName>InterfaceProvider):
 *
 *   int32_t <PackageName>InterfaceProvider(uint32_t runtime_abi_version,
 *                                          const opforge_pkg_interface** out);
 *
 * which stores a pointer to a static opforge_pkg_interface (valid as long as the library
 * stays loaded) and returns 0. The loader refuses a package whose interface's abi_version
 * differs from OPFORGE_OPPACKAGE_ABI_VERSION, or whose package name, target or platform
 * is not what the registration asked for. No static initialisers are needed.
 *
 * Per node of the model an op runs, the backend calls, once at load:
 *   create(params, n_params, inputs, input_slots, n_inputs, outputs, n_outputs,
 *          &impl, error, error_size)
 * with the node's parameters (by name, as the OpDef names them), its input and output
 * tensor descriptions (data == NULL; dtype, ndim, sizes) and, for each input, the index of
 * the OpDef <Input> it fills (an optional input left out is absent; a Repeated input takes
 * several); then per execution
 *   execute(impl, inputs, n_inputs, outputs, n_outputs, error, error_size)
 * with the data (C-contiguous, outputs preallocated); and destroy(impl) when the model is
 * unloaded. execute has exactly the type of the cpu backend's opforge_ext_fn, and
 * opforge_pkg_tensor the layout of its opforge_ext_tensor, so the backend calls the
 * package with no adapter in between.
 *
 * Every function returns 0 on success; on failure it writes a NUL-terminated message
 * into error (at most error_size bytes) and returns non-zero. None may throw or abort.
 */
#ifndef OPFORGE_OPPACKAGE_H_
#define OPFORGE_OPPACKAGE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPFORGE_OPPACKAGE_ABI_VERSION 1

/* dtype codes: opforge's ScalarType numbering (torch's) */
enum {
  OPFORGE_PKG_UINT8 = 0, OPFORGE_PKG_INT8 = 1, OPFORGE_PKG_INT16 = 2, OPFORGE_PKG_INT32 = 3,
  OPFORGE_PKG_INT64 = 4, OPFORGE_PKG_FLOAT16 = 5, OPFORGE_PKG_FLOAT32 = 6,
  OPFORGE_PKG_FLOAT64 = 7, OPFORGE_PKG_BOOL = 11, OPFORGE_PKG_BFLOAT16 = 15,
  OPFORGE_PKG_UINT16 = 27, OPFORGE_PKG_UINT32 = 28, OPFORGE_PKG_UINT64 = 29
};

typedef struct opforge_pkg_tensor {
  void* data;            /* C-contiguous elements; NULL in create */
  int32_t dtype;         /* OPFORGE_PKG_* */
  int32_t ndim;
  const int64_t* sizes;  /* ndim sizes */
} opforge_pkg_tensor;

/* kind of a parameter value */
enum { OPFORGE_PKG_PARAM_INT = 1, OPFORGE_PKG_PARAM_FLOAT = 2, OPFORGE_PKG_PARAM_BOOL = 3 };

typedef struct opforge_pkg_param {
  const char* name;      /* the OpDef <Parameter> name (= the torch schema argument's) */
  int32_t kind;          /* OPFORGE_PKG_PARAM_* */
  int32_t is_list;       /* 0: a scalar (count == 1); 1: a 1-D list of count values */
  int64_t count;
  const int64_t* ints;   /* kind INT or BOOL (0/1): count values */
  const double* floats;  /* kind FLOAT: count values */
} opforge_pkg_param;

typedef int32_t (*opforge_pkg_create_fn)(const opforge_pkg_param* params, int32_t n_params,
                                         const opforge_pkg_tensor* inputs,
                                         const int32_t* input_slots, int32_t n_inputs,
                                         const opforge_pkg_tensor* outputs, int32_t n_outputs,
                                         void** impl, char* error, int32_t error_size);
typedef int32_t (*opforge_pkg_execute_fn)(void* impl, const opforge_pkg_tensor* inputs,
                                          int32_t n_inputs, opforge_pkg_tensor* outputs,
                                          int32_t n_outputs, char* error, int32_t error_size);
typedef void (*opforge_pkg_destroy_fn)(void* impl);

typedef struct opforge_pkg_op {
  const char* type_name;  /* the OpDef <Name> */
  opforge_pkg_create_fn create;
  opforge_pkg_execute_fn execute;
  opforge_pkg_destroy_fn destroy;
} opforge_pkg_op;

typedef struct opforge_pkg_interface {
  uint32_t abi_version;      /* OPFORGE_OPPACKAGE_ABI_VERSION the package was built with */
  const char* package_name;  /* the OpDefCollection PackageName */
  const char* package_version;
  const char* target;        /* "cpu" */
  const char* platform;      /* "x86_64", "aarch64", ... */
  int32_t n_ops;
  const opforge_pkg_op* ops;
  const char* opdef;         /* the package's OpDef XML, as built */
} opforge_pkg_interface;

typedef int32_t (*opforge_pkg_interface_provider_fn)(uint32_t runtime_abi_version,
                                                     const opforge_pkg_interface** out);

#ifdef __cplusplus
}
#endif

#endif /* OPFORGE_OPPACKAGE_H_ */
