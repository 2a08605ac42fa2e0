// A test harness for the native runtime's delegates (tests/native_runtime/
// test_native_cpu_delegate.py): a program holding one delegate blob and its named data is
// made in memory and given to DelegateSet (src/backend.h) as the loader gives a loaded
// one, so the cpu backend is tested without the reader and the executor. Built by the test
// against libopforge_runtime.a and called with ctypes.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include <dlfcn.h>

#include "backend.h"

using namespace opforge::rt;

namespace {
// A kernel library's table (probe_set_kernels): the probe's stand-in for the registry's
// lookup, so a delegate's custom-op kernels are found as the loader will find them.
const opforge_library* g_kernels = nullptr;

opforge_kernel_fn find_kernel(const std::string& key, const opforge_arg* args, int64_t n) {
  if (g_kernels == nullptr) return nullptr;
  opforge_kernel_fn fallback = nullptr;
  for (int64_t i = 0; i < g_kernels->num_kernels; ++i) {
    const opforge_kernel_entry& e = g_kernels->kernels[i];
    if (std::string(e.op) + "." + e.overload != key || e.fn == nullptr) continue;
    if (std::string(e.dtype_key) == "default") {
      fallback = e.fn;
      continue;
    }
    // "v1/6|6": the dtype of each meta argument, in order (dim orders not checked here)
    std::string spec = std::string(e.dtype_key).substr(3);
    bool match = true;
    for (int32_t m = 0; m < e.num_meta && match; ++m) {
      size_t bar = spec.find('|');
      std::string part = spec.substr(0, bar);
      spec = bar == std::string::npos ? "" : spec.substr(bar + 1);
      int32_t arg = e.meta_args[m];
      match = arg >= 0 && arg < n && args[arg].tag == OPFORGE_ARG_TENSOR &&
              std::to_string(args[arg].v.tensor.dtype) == part.substr(0, part.find(';'));
    }
    if (match) return e.fn;
  }
  return fallback;
}
struct Probe {
  Program program;
  std::unique_ptr<DelegateSet> set;
};

void put(char* err, int64_t size, const std::string& text) {
  if (size <= 0) return;
  size_t n = std::min<size_t>(text.size(), (size_t)size - 1);
  std::memcpy(err, text.data(), n);
  err[n] = 0;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* probe_new(
    const char* id, const uint8_t* blob, int64_t size, const char* const* spec_keys,
    const char* const* spec_values, const int64_t* spec_sizes, int64_t n_specs,
    const char* const* named_keys, const uint8_t* const* named_data, const int64_t* named_sizes,
    int64_t n_named, int64_t max_memory, int32_t* status, char* err, int64_t err_size) {
  auto probe = std::make_unique<Probe>();
  Program& p = probe->program;
  p.format_version = 6;
  p.segments.push_back(Segment{0, size, blob});
  Delegate d;
  d.id = id;
  d.segment = 0;
  for (int64_t k = 0; k < n_specs; ++k)
    d.compile_specs.push_back({spec_keys[k], std::string(spec_values[k], (size_t)spec_sizes[k])});
  p.delegates.push_back(d);
  for (int64_t k = 0; k < n_named; ++k) {
    p.segments.push_back(Segment{0, named_sizes[k], named_data[k]});
    p.named_data.push_back(NamedData{named_keys[k], (uint32_t)k + 1});
  }
  Method m;
  m.name = "forward";
  Instruction call;
  call.kind = InstructionKind::DelegateCall;
  call.index = 0;
  m.instructions.push_back(call);
  p.methods.push_back(m);
  try {
    DelegateSet::Options options;
    options.api = "probe";
    options.max_memory = max_memory;
    options.kernels = find_kernel;
    probe->set = std::make_unique<DelegateSet>(probe->program, options);
    *status = 0;
    return probe.release();
  } catch (const Error& e) {
    *status = e.status;
    put(err, err_size, e.message);
  } catch (const std::exception& e) {
    *status = OPF_ERR_INTERNAL;
    put(err, err_size, e.what());
  }
  return nullptr;
}

// Use the kernels of the library at `path` (one exporting opforge_register_kernels).
extern "C" __attribute__((visibility("default"))) int32_t probe_set_kernels(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  auto reg = lib ? reinterpret_cast<opforge_register_kernels_fn>(dlsym(lib, OPFORGE_REGISTER_SYMBOL)) : nullptr;
  g_kernels = reg ? reg() : nullptr;
  return g_kernels != nullptr ? 0 : 1;
}

extern "C" __attribute__((visibility("default"))) int32_t probe_call(void* handle, const opforge_tensor* args,
                                                                     int64_t n, char* err, int64_t err_size) {
  try {
    static_cast<Probe*>(handle)->set->call(0, args, n);
    return 0;
  } catch (const Error& e) {
    put(err, err_size, e.message);
    return e.status;
  }
}

extern "C" __attribute__((visibility("default"))) void probe_free(void* handle) {
  delete static_cast<Probe*>(handle);
}

// Nanoseconds per call of `iters` calls on the same views (the per-call cost of the
// delegate path from C: DelegateSet::call's checks, the per-handle lock, ofc_execute).
extern "C" __attribute__((visibility("default"))) double probe_bench(void* handle, const opforge_tensor* args,
                                                                     int64_t n, int64_t iters) {
  auto* set = static_cast<Probe*>(handle)->set.get();
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) set->call(0, args, n);
  auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / (double)iters;
}
