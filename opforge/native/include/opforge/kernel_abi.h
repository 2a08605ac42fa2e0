/*
 * opforge native kernel ABI — plain C, versioned.
 *
 * A kernel library exports exactly one symbol, opforge_register_kernels(), returning a
 * table of kernels. The runtime checks OPFORGE_ABI_VERSION (the table's first field)
 * before it reads anything else, and refuses a library built for another version.
 * Nothing here allocates, throws or aborts: kernels report failure through
 * opforge_context (status + message) and return.
 *
 * Every struct is plain data with fixed-width fields and natural alignment, so it can be
 * mirrored by ctypes (opforge/runtime/native.py) and by a C runtime. Field order and sizes
 * are part of the ABI: changing any of them means bumping OPFORGE_ABI_VERSION.
 * docs/kernel-abi.md documents each field and walks through a complete example.
 */
#ifndef OPFORGE_KERNEL_ABI_H
#define OPFORGE_KERNEL_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPFORGE_ABI_VERSION 1

#if defined(_WIN32)
#define OPFORGE_EXPORT __declspec(dllexport)
#else
#define OPFORGE_EXPORT __attribute__((visibility("default")))
#endif

/* A tensor view: nothing is owned. dtype uses ATen's c10::ScalarType numbering
 * (6 = float32, 7 = float64, 3 = int32, 4 = int64, 11 = bool, ...). sizes and strides
 * point to `rank` int64 values each; strides are in elements, not bytes. */
typedef struct opforge_tensor {
  void* data;
  const int64_t* sizes;
  const int64_t* strides;
  int32_t dtype;
  int32_t rank;
} opforge_tensor;

/* What one argument value holds (opforge_arg.tag). */
typedef enum opforge_arg_tag {
  OPFORGE_ARG_NONE = 0,              /* None: an absent optional, or Layout/Device/... */
  OPFORGE_ARG_TENSOR = 1,            /* v.tensor */
  OPFORGE_ARG_TENSOR_LIST = 2,       /* v.list: `size` opforge_tensor */
  OPFORGE_ARG_OPT_TENSOR_LIST = 3,   /* v.list: `size` opforge_tensor, dtype -1 = None */
  OPFORGE_ARG_INT = 4,               /* v.i */
  OPFORGE_ARG_DOUBLE = 5,            /* v.d */
  OPFORGE_ARG_BOOL = 6,              /* v.i (0 or 1) */
  OPFORGE_ARG_SCALAR_TYPE = 8,       /* v.i: a c10::ScalarType number */
  OPFORGE_ARG_INT_LIST = 9,          /* v.list: `size` int64_t */
  OPFORGE_ARG_DOUBLE_LIST = 10,      /* v.list: `size` double */
  OPFORGE_ARG_BOOL_LIST = 11,        /* v.list: `size` uint8_t (0 or 1) */
  OPFORGE_ARG_STRING = 12            /* v.list: `size` bytes of UTF-8, not NUL-terminated */
} opforge_arg_tag;

/* One argument value: a tag and its payload. A schema `Scalar` arrives as INT, DOUBLE
 * or BOOL. */
typedef struct opforge_arg {
  int32_t tag;
  int32_t reserved;
  union {
    int64_t i;
    double d;
    opforge_tensor tensor;
    struct {
      const void* data;
      int64_t size;
    } list;
  } v;
} opforge_arg;

/* What a kernel parameter expects (opforge_kernel_entry.arg_kinds): a base kind, with
 * OPFORGE_KIND_OPTIONAL set for `T?` (then NONE is accepted too) and OPFORGE_KIND_OUT for
 * `Tensor(a!)` out arguments. Base kinds reuse the tag numbers; SCALAR is 7. */
#define OPFORGE_KIND_SCALAR 7
#define OPFORGE_KIND_OPTIONAL 0x100
#define OPFORGE_KIND_OUT 0x200

/* The kernel's window to its caller: set status nonzero and a NUL-terminated message to
 * report failure (opforge::KernelContext::fail does this). */
#define OPFORGE_MESSAGE_SIZE 1024
typedef struct opforge_context {
  int32_t status; /* 0 = ok */
  int32_t reserved;
  void* runtime;  /* reserved for the runtime (an allocator, a tracer); may be NULL */
  char message[OPFORGE_MESSAGE_SIZE];
} opforge_context;

/* A boxed kernel: `num_args` values in the out overload's schema order, outs included. */
typedef void (*opforge_kernel_fn)(opforge_context* ctx, opforge_arg* args, int64_t num_args);

/* One kernel of one operator overload. */
typedef struct opforge_kernel_entry {
  const char* op;           /* "my_ops::mul3" (ATen ops: "aten::add") */
  const char* overload;     /* "out" */
  const char* schema;       /* the out overload's schema, for messages */
  const char* kernel_name;  /* "custom::native::mul3_out_impl" */
  const char* dtype_key;    /* "default" (the fallback), or "v1/6|6" as ExecuTorch spells it */
  const char* source;       /* the manifest entry, "my_ops.yaml:8" */
  opforge_kernel_fn fn;     /* NULL when the library does not define the kernel */
  const int32_t* arg_kinds; /* num_args kinds (see OPFORGE_KIND_*) */
  const int32_t* meta_args; /* for a dtype-specific kernel: the argument index of each
                               dtype in dtype_key, in order; num_meta of them */
  int32_t num_args;
  int32_t num_meta;
} opforge_kernel_entry;

/* The table a library returns. abi_version is the first field in every version. */
typedef struct opforge_library {
  uint32_t abi_version;     /* OPFORGE_ABI_VERSION the library was built with */
  uint32_t entry_size;      /* sizeof(opforge_kernel_entry) */
  const char* name;         /* the library's name, e.g. "my_ops" */
  const char* built_by;     /* "opforge 0.1.0" */
  int64_t num_kernels;
  const opforge_kernel_entry* kernels;
} opforge_library;

/* The one exported symbol. It runs no code at load time (no static initialisers): the
 * table is filled when this is called. */
typedef const opforge_library* (*opforge_register_kernels_fn)(void);
#define OPFORGE_REGISTER_SYMBOL "opforge_register_kernels"

#ifdef __cplusplus
}
#endif

#endif /* OPFORGE_KERNEL_ABI_H */
