// The cpu backend's engine library (opforge/backends/cpu/native, built at install by
// engine_build.py), dlopen()ed at first use and called through its C functions, the
// ofc_* of engine.py's _declare: no Python, no ctypes.
//
// Where it is: opf_backend_set_library("cpu", path), else the environment variable
// OPFORGE_CPU_ENGINE. The engine needs oneDNN's libdnnl.so.3 (the onednn-cpu-gomp wheel)
// loadable: on LD_LIBRARY_PATH, or loaded before (a Python process that used the cpu
// backend has it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend.h"

#include "opforge/kernel_abi.h"

namespace opforge::rt::cpu {

constexpr int32_t kEngineAbiVersion = 8;  // engine.py ABI_VERSION
constexpr int32_t kEngineError = 1024;    // engine.py _ERR: its message buffers
constexpr const char* kEngineEnv = "OPFORGE_CPU_ENGINE";

struct EngineApi {
  std::string path;
  int32_t (*abi_version)();
  void* (*create)(int32_t threads, int64_t max_bytes, char* error, int32_t size);
  void (*destroy)(void* handle);
  void* (*weight_cache_new)();
  void (*weight_cache_free)(void* cache);
  int32_t (*use_weight_cache)(void* handle, void* cache, char* error, int32_t size);
  int32_t (*add_tensor)(void* handle, int32_t dtype, int32_t ndim, const int64_t* dims,
                        const int64_t* strides, const void* data, int64_t nbytes, int32_t base,
                        int64_t offset, int32_t storage, char* error, int32_t size);
  // constant `id` (borrowed) is also bytes [offset, ...) of the open file fd; flags bit 0: its
  // pages may be dropped once copied (the engine's own reads of it at init drop them again)
  int32_t (*tensor_file)(void* handle, int32_t id, int32_t fd, int64_t offset, int32_t flags,
                         char* error, int32_t size);
  int32_t (*post_op)(void* handle, int32_t kind, int32_t alg, double alpha, double beta,
                     int32_t tensor, char* error, int32_t size);
  int32_t (*add_op)(void* handle, const char* kind, const int32_t* ins, int32_t n_in,
                    const int32_t* outs, int32_t n_out, const int64_t* iattr, int32_t n_iattr,
                    const double* fattr, int32_t n_fattr, char* error, int32_t size);
  int32_t (*add_kernel)(void* handle, opforge_kernel_fn fn, const char* name, const int32_t* ins,
                        int32_t n_in, const int32_t* outs, int32_t n_out, int32_t n_args,
                        const int32_t* tags, const int64_t* values, const int64_t* lengths,
                        const double* doubles, const int64_t* int_pool, int64_t n_int,
                        const double* double_pool, int64_t n_double, char* error, int32_t size);
  // a call-out: fn(state, inputs, n_in, outputs, n_out, error, size) per execution
  // (opforge/cpu_external.h's opforge_ext_fn; an op package's execute has its type)
  int32_t (*add_external)(void* handle, void* fn, void* state, const char* name, const int32_t* ins,
                          int32_t n_in, const int32_t* outs, int32_t n_out, char* error, int32_t size);
  int32_t (*finalize)(void* handle, const int32_t* inputs, int32_t n_in, const int32_t* outputs,
                      int32_t n_out, char* error, int32_t size);
  int32_t (*execute)(void* handle, void* const* inputs, void* const* outputs, char* error, int32_t size);
};

// The engine at the configured path, loaded once per path and kept for the process's life.
// Error OPF_ERR_UNSUPPORTED when none is configured or it cannot be
// loaded, OPF_ERR_LIBRARY when it is not an engine of this ABI.
const EngineApi& engine_api();

struct Plan;
class Blob;
// One engine built from a static plan (backend_cpu.cpp), and a dynamic delegate: engines
// per call shape over one symbolic blob (backend_cpu_dynamic.cpp).
std::unique_ptr<DelegateHandle> make_engine(Plan plan, const EngineApi& api, const DelegateInit& init);
std::unique_ptr<DelegateHandle> make_dynamic(std::unique_ptr<Blob> blob, const EngineApi& api,
                                             const DelegateInit& init);

}  // namespace opforge::rt::cpu
