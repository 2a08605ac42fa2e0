// What an engine reports about itself: the per-op profile printed when it is destroyed
// (OPFORGE_CPU_PROFILE=1) and the query C API inspect and the tests read (op names, the NaN
// guard's and the Winograd kernel's calls per path, each op's threads, its memory).
#include <cstdio>

#include "engine.h"

namespace ofc {

// oneDNN's name for the implementation an op's primitive runs (e.g. brgconv_1x1:avx512_core_vnni);
// "" for the engine's own kernels
std::string impl_of(const Op& op) {
  const auto* d = dynamic_cast<const DnnlOp*>(&op);
  if (d == nullptr || d->prim.get(true) == nullptr) return "";
  const char* text = nullptr;
  if (dnnl_primitive_desc_query(d->prim.get_primitive_desc(), dnnl_query_impl_info_str, 0, &text) !=
          dnnl_success || text == nullptr)
    return "";
  return text;
}

Engine::~Engine() {
  if (!profile || runs == 0) return;
  std::fprintf(stderr, "opforge cpu: intermediates %lld bytes in a planned arena of %lld "
               "(%lld read before written, alone); engine memory %lld bytes in all\n",
               (long long)intermediate_bytes, (long long)arena_bytes, (long long)unplanned_bytes,
               (long long)used_bytes);
  for (size_t i = 0; i < ops.size(); ++i) {
    int64_t calls[2];
    std::string guard = guard_counts(*ops[i], calls)
        ? "  (fused " + std::to_string(calls[0]) + ", exact " + std::to_string(calls[1]) + ")" : "";
    if (threads > 1 && ops[i]->threads == 1) guard += "  (1 thread)";
    const std::string impl = impl_of(*ops[i]);
    if (!impl.empty()) guard += "  [" + impl + "]";
    std::fprintf(stderr, "opforge cpu: op %zu %-28s %9.2f us%s\n", i, ops[i]->name.c_str(),
                 op_seconds[i] / (double)runs * 1e6, guard.c_str());
  }
}

}  // namespace ofc

using namespace ofc;

namespace {
// op `op` of the engine behind `handle`, or null when there is no such op
const Op* op_at(void* handle, int32_t op) {
  const Engine& e = static_cast<Handle*>(handle)->e;
  return op < 0 || (size_t)op >= e.ops.size() ? nullptr : e.ops[(size_t)op].get();
}
}  // namespace

extern "C" {

// what the engine made of the graph, for inspect and tests: op names, one a line (a name may
// hold commas: "matmul on int4 weights (own kernel, AVX2)"); returns the text's length, so a
// caller whose buffer was too small asks again with a larger one
int32_t ofc_describe(void* handle, char* out, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  std::string text;
  for (size_t i = 0; i < h->e.ops.size(); ++i) text += (i ? "\n" : "") + h->e.ops[i]->name;
  set_error(out, size, text);
  return (int32_t)text.size();
}

// the NaN guard's calls of op `op`: out [fused, exact]; 0 when the op has no fused variant
int32_t ofc_guard_calls(void* handle, int32_t op, int64_t* out) {
  const Op* o = op_at(handle, op);
  return o != nullptr && guard_counts(*o, out) ? 1 : 0;
}

// the Winograd convolution's calls of op `op`: out [Winograd, direct]; 0 when it is no such op
int32_t ofc_winograd_calls(void* handle, int32_t op, int64_t* out) {
  const Op* o = op_at(handle, op);
  return o != nullptr && winograd_counts(*o, out) ? 1 : 0;
}

// op `op`'s bound on |its output| from its last call (inf when it proved none) into out;
// 0 when the op sets none (neither guarded nor `bounded`)
int32_t ofc_out_bound(void* handle, int32_t op, double* out) {
  const Op* o = op_at(handle, op);
  if (o == nullptr || !o->bounded) return 0;
  *out = o->out_bound;
  return 1;
}

// oneDNN's implementation name of op `op` (impl_of) into out; its length, -1 when there is
// no such op
int32_t ofc_op_impl(void* handle, int32_t op, char* out, int32_t size) {
  const Op* o = op_at(handle, op);
  if (o == nullptr) return -1;
  const std::string text = impl_of(*o);
  set_error(out, size, text);
  return (int32_t)text.size();
}

// the OpenMP threads op `op` runs with (op_threads); 0 when there is no such op
int32_t ofc_op_threads(void* handle, int32_t op) {
  const Op* o = op_at(handle, op);
  if (o == nullptr) return 0;
  return o->threads > 0 ? o->threads : static_cast<Handle*>(handle)->e.threads;
}

// the engine's memory (bytes): [all it holds, the intermediates' arena, the intermediates in
// it (one buffer each would take this), intermediates read before written (held alone)]
void ofc_memory(void* handle, int64_t* out) {
  const Engine& e = static_cast<Handle*>(handle)->e;
  out[0] = e.used_bytes; out[1] = e.arena_bytes; out[2] = e.intermediate_bytes;
  out[3] = e.unplanned_bytes;
}

// the number of threads the engine runs with (after clamping to this machine)
int32_t ofc_threads(void* handle) { return static_cast<Handle*>(handle)->e.threads; }

}  // extern "C"
