/*
 * opforge native runtime — the C API (one header, no C++ types across it).
 *
 * Load an opforge program file (.opf, format versions 1 to 6), verify it with the same
 * rules as the Python reader (docs/program-format.md), and run its methods without
 * Python: kernels come from the portable C++ kernel library linked into the runtime and
 * from native kernel libraries (the kernel ABI of <opforge/kernel_abi.h>), dlopen()ed or
 * linked statically.
 *
 * Conventions (sqlite3 / ONNX Runtime style):
 *   - every handle is opaque; every call that can fail returns an opf_status
 *     (OPF_OK = 0) and leaves a message for opf_last_error() on the calling thread;
 *   - nothing here aborts the process, throws, or returns a C++ type;
 *   - the caller checks opf_api_version() == OPF_RUNTIME_API_VERSION at start up (the
 *     library refuses nothing itself: a newer library keeps every older function);
 *   - strings are UTF-8, NUL-terminated; sizes are int64_t; dtypes are c10::ScalarType
 *     numbers (6 float32, 7 float64, 4 int64, 3 int32, 11 bool, ...).
 *
 * Thread rules (as the Python runtime's): a program and a registry may be shared by any
 * number of threads once made; one method instance runs one call at a time, and a second
 * thread entering it gets OPF_ERR_BUSY at once (never undefined behaviour). State tensors
 * (a KV cache) live in the program and are shared by every instance of its methods.
 *
 * docs/native-runtime.md walks through a complete example.
 */
#ifndef OPFORGE_RUNTIME_H
#define OPFORGE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "opforge/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OPF_RUNTIME_API_VERSION 1

#if defined(_WIN32)
#define OPF_API __declspec(dllexport)
#else
#define OPF_API __attribute__((visibility("default")))
#endif

typedef int32_t opf_status;
enum {
  OPF_OK = 0,
  OPF_ERR_INVALID_ARGUMENT = 1, /* a NULL handle, an index out of range, a bad option */
  OPF_ERR_IO = 2,               /* a file could not be opened, read or mapped */
  OPF_ERR_PROGRAM = 3,          /* a malformed or invalid program file (ProgramError) */
  OPF_ERR_MISSING_KERNEL = 4,   /* operators without a kernel, all listed at once */
  OPF_ERR_LIBRARY = 5,          /* a kernel library that cannot be used (BuildError) */
  OPF_ERR_INPUT = 6,            /* an input of the wrong dtype, rank or size */
  OPF_ERR_KERNEL = 7,           /* a kernel refused its arguments (KernelError) */
  OPF_ERR_MEMORY = 8,           /* over the memory limit, or an allocation failed */
  OPF_ERR_BUSY = 9,             /* a second call entered a method instance in use */
  OPF_ERR_UNSUPPORTED = 10,     /* a feature this build does not have (a delegate) */
  OPF_ERR_STATE = 11,           /* no such state, or a state of another dtype/size */
  OPF_ERR_INTERNAL = 12         /* a bug in opforge: please report it */
};

/* Opaque handles. */
typedef struct opf_registry opf_registry; /* kernels: portable + native libraries */
typedef struct opf_program opf_program;   /* a loaded, verified program */
typedef struct opf_method opf_method;     /* one runnable instance of a method */

/* ---- version and errors ---------------------------------------------------------- */
OPF_API uint32_t opf_api_version(void);
OPF_API const char* opf_version_string(void); /* "opforge-runtime 0.1.0" */
/* The message of the last call that failed on this thread ("" if none). Valid until the
 * next opforge call on this thread. Messages follow opforge's form: api — subject —
 * found — valid — fix, and name the method, instruction, operator and node. */
OPF_API const char* opf_last_error(void);
OPF_API const char* opf_status_name(opf_status status); /* "OPF_ERR_PROGRAM" */
/* Bytes per element of a c10::ScalarType number; 0 for a number no program may use. */
OPF_API int64_t opf_dtype_itemsize(int32_t dtype);

/* ---- kernel registry ------------------------------------------------------------- */
/* A registry starts with the portable kernels linked into this library (all of them, or
 * only the selected ones in a bundle's selective build). */
OPF_API opf_status opf_registry_new(opf_registry** out);
OPF_API void opf_registry_free(opf_registry* registry);
/* dlopen() a native kernel library (one exporting opforge_register_kernels) and add its
 * kernels. override = 1 lets them replace kernels already registered for the same
 * operator; 0 refuses such a library with OPF_ERR_LIBRARY naming both. */
OPF_API opf_status opf_registry_load_library(opf_registry* registry, const char* path,
                                             int32_t override_existing);
/* The same for a library linked into the application (its opforge_register_kernels()
 * result). The table must outlive the registry. */
OPF_API opf_status opf_registry_add_library(opf_registry* registry, const opforge_library* library,
                                            int32_t override_existing);
OPF_API int64_t opf_registry_num_operators(const opf_registry* registry);
/* The i-th registered operator key ("aten::add.out"); NULL when out of range. */
OPF_API const char* opf_registry_operator(const opf_registry* registry, int64_t index);

/* ---- delegate backends ------------------------------------------------------------- */
/* The shared library a backend's delegates run on, for this process: for "cpu", the cpu
 * backend's engine (libopforge_cpu.<hash>.so, which needs oneDNN's libdnnl.so.3
 * loadable), dlopen()ed when the first program with a cpu delegate is loaded; without
 * it, the environment variable OPFORGE_CPU_ENGINE. A program whose delegates cannot run
 * is refused at load with OPF_ERR_UNSUPPORTED naming the delegate. */
OPF_API opf_status opf_backend_set_library(const char* backend, const char* path);
/* Allow the cpu backend to load the op-package library at path (or any library under the
 * folder path) when a program's delegate names it: loading a library runs its code, and a
 * program file is untrusted. $OPFORGE_OP_PACKAGES (':'-separated) allows the same way.
 * A program naming a package not allowed is refused at load with OPF_ERR_LIBRARY. */
OPF_API opf_status opf_op_package_trust(const char* path);

/* ---- programs -------------------------------------------------------------------- */
typedef struct opf_load_options {
  uint32_t struct_size;   /* sizeof(opf_load_options): lets the struct grow */
  uint32_t flags;         /* OPF_LOAD_* below */
  int64_t max_memory;     /* bytes one method instance may allocate; 0 = OPFORGE_MAX_MEMORY
                             from the environment, else 8 GiB */
} opf_load_options;
#define OPF_LOAD_NO_KERNEL_CHECK 1u /* verify only: do not require a kernel per operator */

/* The registry must outlive the program. options may be NULL (the defaults). A path is
 * memory-mapped read-only; a buffer is used in place when copy == 0 (it must then
 * outlive the program and stay unchanged) or copied when copy == 1. An fd is mapped and
 * stays owned by the caller. Every malformed file is OPF_ERR_PROGRAM, never a crash. */
OPF_API opf_status opf_program_load_path(const char* path, const opf_registry* registry,
                                         const opf_load_options* options, opf_program** out);
OPF_API opf_status opf_program_load_fd(int fd, const opf_registry* registry,
                                       const opf_load_options* options, opf_program** out);
OPF_API opf_status opf_program_load_buffer(const void* data, size_t size, int32_t copy,
                                           const opf_registry* registry,
                                           const opf_load_options* options, opf_program** out);
OPF_API void opf_program_free(opf_program* program);
/* Verify a whole program file's bytes without loading it (no kernels needed): OPF_OK or
 * OPF_ERR_PROGRAM with the same rules and messages as opforge.program.verify. */
OPF_API opf_status opf_program_verify(const void* data, size_t size);

OPF_API int64_t opf_program_num_methods(const opf_program* program);
OPF_API const char* opf_program_method_name(const opf_program* program, int64_t index);
/* A user-metadata value ("opforge.input_names.forward"), or NULL. */
OPF_API const char* opf_program_metadata(const opf_program* program, const char* key);

/* One input or output of a method. */
typedef enum opf_value_kind {
  OPF_VALUE_TENSOR = 0,
  OPF_VALUE_INT = 1,
  OPF_VALUE_DOUBLE = 2,
  OPF_VALUE_BOOL = 3
} opf_value_kind;

typedef struct opf_io_info {
  int32_t kind;          /* opf_value_kind */
  int32_t dtype;         /* tensors: a c10::ScalarType number; else -1 */
  int32_t rank;          /* tensors: number of dims */
  int32_t reserved;
  const int64_t* sizes;  /* rank sizes at the upper bound (the export example's for a
                            growing dim); valid while the program lives */
  const int64_t* min_sizes; /* rank inclusive lower bounds (== sizes for a static dim) */
  const int64_t* max_sizes; /* rank inclusive upper bounds (INT64_MAX: grows unbounded) */
  const uint8_t* dim_order; /* rank dims, outermost first: the layout set_input reads and
                               outputs are written in ({0, 2, 3, 1} is channels-last) */
} opf_io_info;

OPF_API opf_status opf_program_method_io(const opf_program* program, const char* method,
                                         int64_t* num_inputs, int64_t* num_outputs);
OPF_API opf_status opf_program_input_info(const opf_program* program, const char* method,
                                          int64_t index, opf_io_info* out);
OPF_API opf_status opf_program_output_info(const opf_program* program, const char* method,
                                           int64_t index, opf_io_info* out);

/* ---- state (shared by name across the program's methods) ------------------------- */
OPF_API int64_t opf_program_num_states(const opf_program* program);
OPF_API const char* opf_program_state_name(const opf_program* program, int64_t index);
/* The live copy: dtype, rank, sizes (valid while the program lives) and its bytes. */
OPF_API opf_status opf_program_state_info(const opf_program* program, const char* name,
                                          int32_t* dtype, int32_t* rank, const int64_t** sizes,
                                          int64_t* nbytes);
OPF_API opf_status opf_program_state_read(const opf_program* program, const char* name,
                                          void* dst, int64_t nbytes);
OPF_API opf_status opf_program_state_write(opf_program* program, const char* name,
                                           const void* src, int64_t nbytes);
/* Back to the initial values in the file: one name, or every state when name is NULL. */
OPF_API opf_status opf_program_state_reset(opf_program* program, const char* name);

/* ---- method instances ------------------------------------------------------------- */
typedef struct opf_method_options {
  uint32_t struct_size;       /* sizeof(opf_method_options) */
  int32_t num_threads;        /* the portable kernels' threads (a pool per instance; any
                                 count gives the same bits); 0 = OPFORGE_NUM_THREADS (a
                                 count or "auto": the usable cores, at most 4), else 1 */
  int64_t num_arenas;         /* caller memory: 0, or the method's arena count */
  void* const* arenas;        /* num_arenas pointers, each 64-byte aligned */
  const int64_t* arena_sizes; /* their sizes: at least opf_program_arena_sizes' */
} opf_method_options;

/* The planned arenas of a method (bytes per memory id): *count gets their number; up to
 * capacity sizes are written. */
OPF_API opf_status opf_program_arena_sizes(const opf_program* program, const char* method,
                                           int64_t* sizes, int64_t capacity, int64_t* count);

OPF_API opf_status opf_method_new(opf_program* program, const char* method,
                                  const opf_method_options* options, opf_method** out);
OPF_API void opf_method_free(opf_method* method);

/* Inputs, by position. A tensor is copied into its arena slot (zero_copy == 0), or used
 * in place until the next set_input of that position (zero_copy == 1: data must be
 * 64-byte aligned, dense in the input's dim order, and outlive the execute). sizes may
 * differ from the upper bound within the method's symbolic bounds. */
OPF_API opf_status opf_method_set_input(opf_method* method, int64_t index, const void* data,
                                        int32_t dtype, int32_t rank, const int64_t* sizes,
                                        int32_t zero_copy);
OPF_API opf_status opf_method_set_input_int(opf_method* method, int64_t index, int64_t value);
OPF_API opf_status opf_method_set_input_double(opf_method* method, int64_t index, double value);
OPF_API opf_status opf_method_set_input_bool(opf_method* method, int64_t index, int32_t value);

/* Run every instruction. Inputs not set since the instance was made are refused. */
OPF_API opf_status opf_method_execute(opf_method* method);

/* An output after execute: a view of the instance's memory, valid until the next
 * execute or set_input of this instance (copy it to keep it). sizes are the actual
 * sizes of this call. Scalars come through opf_method_output_scalar. */
typedef struct opf_tensor_view {
  const void* data;
  int32_t dtype;
  int32_t rank;
  const int64_t* sizes;
  int64_t nbytes;
} opf_tensor_view;
OPF_API opf_status opf_method_output(const opf_method* method, int64_t index, opf_tensor_view* out);
/* kind gets an opf_value_kind; *int_value (int and bool) or *double_value is written. */
OPF_API opf_status opf_method_output_scalar(const opf_method* method, int64_t index, int32_t* kind,
                                            int64_t* int_value, double* double_value);

/* ---- profiling -------------------------------------------------------------------- */
/* When on, execute records the time of every instruction (steady clock, ns). */
OPF_API opf_status opf_method_set_profiling(opf_method* method, int32_t on);
OPF_API int64_t opf_method_num_instructions(const opf_method* method);
/* Instruction index's label ("aten::add.out", "delegate cpu", "move", "free"), its node
 * name from the debug table (or ""), and its last recorded duration in ns (-1: none). */
OPF_API opf_status opf_method_instruction_profile(const opf_method* method, int64_t index,
                                                  const char** label, const char** node,
                                                  int64_t* last_ns);

#ifdef __cplusplus
}
#endif

#endif /* OPFORGE_RUNTIME_H */
