// A test harness for the native runtime's delegates (tests/native_runtime/
// test_native_cpu_delegate.py): a program holding one delegate blob and its named data is
// made in memory and given to DelegateSet (src/backend.h) as the loader gives a loaded
// one, so the cpu backend is tested without the reader and the executor. Built by the test
// against libopforge_runtime.a and called with ctypes.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "backend.h"

using namespace opforge::rt;

namespace {
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
