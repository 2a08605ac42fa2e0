// The cpu backend: a delegate's blob → one engine built through the engine's C functions,
// as opforge/backends/cpu/engine.py (EngineHandle._build) and binding.py do it in Python.
//
//   init     Blob (every check of blob.py) → the engine library (dlopen, once) →
//            ofc_new → the program's weight cache (one per program, DelegateShared) →
//            per tensor ofc_add_tensor (constants borrowed in place from the blob or the
//            program's named data when 64-byte aligned, else copied) → per op its post-ops
//            and ofc_add_op, or ofc_add_kernel for a custom op's native kernel (the
//            registry's, through DelegateInit::kernels), or ofc_add_external for an op
//            package's op (backend_cpu_package.cpp) → ofc_finalize
//   execute  the call's views checked against the plan (dtype, sizes, dense), the state
//            outputs against their inputs (written in place) → ofc_execute
//
// A dynamic method's delegate (symbolic sizes) is backend_cpu_dynamic.cpp: one such engine
// per call shape. An op-package op is a call-out to the package's execute with the
// instance its create made (backend_cpu_package.cpp). After init, the file's pages under the
// weights the engine copied are given back, as file_pages.py does; not done: its file reads
// of large embedding tables (an optimisation of resident memory; the results are the same).
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "backend.h"
#include "backend_cpu_blob.h"
#include "backend_cpu_engine.h"
#include "backend_cpu_package.h"
#include "errors.h"

namespace opforge::rt {
namespace cpu {
namespace {

// 1: the engine owns it; 2: a delegate input; 3: a constant read in place; 4: a state
// input (writable); 0: an output or unbacked, bound per call (engine.py _build)
int32_t storage_of(Role role) {
  switch (role) {
    case Role::Temp: return 1;
    case Role::Input: return 2;
    case Role::State: return 4;
    default: return 0;
  }
}

// cpu/__init__.py thread_count: the spec when > 0, else OPFORGE_NUM_THREADS, else 1.
int32_t thread_count(int64_t spec) {
  if (spec > 0) return (int32_t)std::min<int64_t>(spec, 1 << 20);
  const char* raw = std::getenv("OPFORGE_NUM_THREADS");
  std::string text = raw ? raw : "";
  text.erase(0, text.find_first_not_of(" \t\n"));
  text.erase(text.find_last_not_of(" \t\n") + 1);
  if (text.empty()) return 1;
  if (text == "auto") {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
  }
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (end == nullptr || *end != '\0' || value < 1 || value > (1 << 20))
    raise(OPF_ERR_INVALID_ARGUMENT, "cpu backend: OPFORGE_NUM_THREADS='" + text.substr(0, 40) +
                                        "' — valid: a count >= 1 or 'auto' — fix: set it to the number "
                                        "of threads, or unset it for 1");
  return (int32_t)value;
}

std::string layout_of(const PlanTensor& t) {
  std::string out = std::string(dtype_name(t.dtype)) + "[";
  for (size_t k = 0; k < t.dims.size(); ++k) out += (k ? "," : "") + std::to_string(t.dims[k]);
  return out + "]";
}

class CpuHandle final : public DelegateHandle {
 public:
  CpuHandle(Plan plan, const EngineApi& api, const DelegateInit& init) : plan_(std::move(plan)), api_(api) {
    char err[kEngineError] = {0};
    engine_ = api_.create(thread_count(decode_num_threads(init.specs)), init.max_memory, err, kEngineError);
    if (engine_ == nullptr) raise(OPF_ERR_MEMORY, std::string("cpu backend: ") + err);
    try {
      build(init);
    } catch (...) {
      api_.destroy(engine_);
      throw;
    }
  }
  ~CpuHandle() override { api_.destroy(engine_); }

  void execute(const opforge_tensor* inputs, int64_t n_in, const opforge_tensor* outputs,
               int64_t n_out) override;

 private:
  void check(int32_t rc, const char* err, const std::string& what) {
    if (rc != 0) raise(OPF_ERR_PROGRAM, "cpu backend: " + what + ": " + std::string(err));
  }
  const void* constant(const PlanTensor& t, size_t i, const DelegateInit& init);
  void add_kernel(const PlanOp& op, size_t i, const DelegateInit& init);
  void add_package(const PlanOp& op, size_t i, const DelegateInit& init);
  void build(const DelegateInit& init);
  // an alias's base tensor (an earlier one, checked by the blob's parse); tensors.size() if none
  size_t root(int32_t t) const {
    const size_t n = plan_.tensors.size();
    while (t >= 0 && (size_t)t < n && plan_.tensors[(size_t)t].role == Role::Alias) t = plan_.tensors[(size_t)t].base;
    return t >= 0 && (size_t)t < n ? (size_t)t : n;
  }
  using Spans = std::vector<std::pair<const uint8_t*, int64_t>>;
  std::vector<char> droppable(const Spans& spans, const DelegateInit& init) const;
  void give_back(const PlanOp& op, const Spans& spans, std::vector<char>& drop) const;
  void check_view(const opforge_tensor& v, int32_t tid, const char* kind, int64_t k) const;

  // op-package instances: destroyed after the engine (members go after ~CpuHandle's body)
  std::vector<std::unique_ptr<PackageInstance>> packages_;
  Plan plan_;
  const EngineApi& api_;
  void* engine_ = nullptr;
  std::vector<int64_t> own_outputs_;       // call output positions the engine writes, in order
  std::vector<int64_t> state_input_;       // per call output position: its state input, or -1
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> debug_;  // a debug build's node results
  std::vector<void*> in_ptrs_, out_ptrs_;
};

const void* CpuHandle::constant(const PlanTensor& t, size_t i, const DelegateInit& init) {
  if (t.data_offset >= 0) return plan_.data + t.data_offset;  // checked by Blob::plan_at
  const Program& program = *init.program;
  const NamedData* named = nullptr;
  for (const auto& nd : program.named_data)
    if (nd.key == t.named_key) named = &nd;
  const Segment* seg = named != nullptr && named->segment < program.segments.size()
                           ? &program.segments[named->segment] : nullptr;
  std::string key = t.named_key.substr(0, 80);
  if (seg == nullptr || seg->size != t.named_nbytes)
    raise(OPF_ERR_PROGRAM, "cpu backend blob: tensors[" + std::to_string(i) + "] names constant '" + key +
                               "' of " + std::to_string(t.named_nbytes) + " bytes, which " +
                               (seg == nullptr ? std::string("is missing from the program")
                                               : "holds " + std::to_string(seg->size) + " bytes") +
                               " — fix: re-export the program; this one was altered or corrupted");
  // every reader of a key reads one tensor: the first reader's dtype and dims
  init.shared->check_layout(t.named_key, layout_of(t), init.where + " (cpu blob tensors[" + std::to_string(i) + "])");
  return seg->data;
}

void CpuHandle::add_kernel(const PlanOp& op, size_t i, const DelegateInit& init) {
  // the kernel-ABI arguments as the registry's select() sees them (tensors: dtype and
  // rank, no data), then the engine's tables (engine.py _add_kernel)
  std::vector<opforge_arg> args(op.args.size());
  std::vector<int32_t> tags;
  std::vector<int64_t> values, lengths, ints;
  std::vector<double> doubles, dbls;
  const size_t n_slots = op.in.size() + op.out.size();
  for (size_t k = 0; k < op.args.size(); ++k) {
    const PlanKernelArg& a = op.args[k];
    opforge_arg& arg = args[k];
    std::memset(&arg, 0, sizeof(arg));
    arg.tag = a.tag;
    tags.push_back(a.tag);
    if (a.tag == OPFORGE_ARG_INT_LIST || a.tag == OPFORGE_ARG_DOUBLE_LIST) {
      const bool is_int = a.tag == OPFORGE_ARG_INT_LIST;
      values.push_back(is_int ? (int64_t)ints.size() : (int64_t)dbls.size());
      lengths.push_back(is_int ? (int64_t)a.ints.size() : (int64_t)a.doubles.size());
      doubles.push_back(0.0);
      if (is_int) ints.insert(ints.end(), a.ints.begin(), a.ints.end());
      else dbls.insert(dbls.end(), a.doubles.begin(), a.doubles.end());
      arg.v.list.data = is_int ? (const void*)a.ints.data() : (const void*)a.doubles.data();
      arg.v.list.size = lengths.back();
    } else if (a.tag == OPFORGE_ARG_DOUBLE) {
      values.push_back(0); lengths.push_back(0); doubles.push_back(a.d);
      arg.v.d = a.d;
    } else {
      values.push_back(a.i); lengths.push_back(0); doubles.push_back(0.0);
      arg.v.i = a.i;
      if (a.tag == OPFORGE_ARG_TENSOR) {
        std::memset(&arg.v.tensor, 0, sizeof(arg.v.tensor));
        arg.v.tensor.dtype = -1;
        if (a.i >= 0 && (size_t)a.i < n_slots) {
          int32_t tid = (size_t)a.i < op.in.size() ? op.in[(size_t)a.i] : op.out[(size_t)a.i - op.in.size()];
          arg.v.tensor.dtype = plan_.tensors[(size_t)tid].dtype;
          arg.v.tensor.rank = (int32_t)plan_.tensors[(size_t)tid].dims.size();
          arg.v.tensor.sizes = plan_.tensors[(size_t)tid].dims.data();
        }
      }
    }
  }
  opforge_kernel_fn fn = init.kernels ? init.kernels(op.name, args.data(), (int64_t)args.size()) : nullptr;
  if (fn == nullptr)
    raise(OPF_ERR_MISSING_KERNEL,
          "cpu backend: the delegate calls custom op " + op.name + " (ops[" + std::to_string(i) +
              "]) through its native kernel, and this runtime has none — fix: load the kernel "
              "library built for it into the registry (opf_registry_load_library) before loading "
              "the program");
  char err[kEngineError] = {0};
  auto ptr = [](const auto& v) { return v.empty() ? nullptr : v.data(); };
  check(api_.add_kernel(engine_, fn, op.name.c_str(), ptr(op.in), (int32_t)op.in.size(), ptr(op.out),
                        (int32_t)op.out.size(), (int32_t)tags.size(), ptr(tags), ptr(values), ptr(lengths),
                        ptr(doubles), ptr(ints), (int64_t)ints.size(), ptr(dbls), (int64_t)dbls.size(),
                        err, kEngineError),
        err, "kernel " + op.name);
}

void CpuHandle::add_package(const PlanOp& op, size_t i, const DelegateInit& init) {
  // engine.py _add_package: the op instance made now, called by the engine per execution
  packages_.push_back(prepare_package(plan_, op, init.specs));
  const PackageInstance& p = *packages_.back();
  char err[kEngineError] = {0};
  check(api_.add_external(engine_, reinterpret_cast<void*>(p.execute()), p.impl(), op.name.c_str(), op.in.data(),
                          (int32_t)op.in.size(), op.out.data(), (int32_t)op.out.size(), err, kEngineError),
        err, "ops[" + std::to_string(i) + "] package op " + op.name);
}

void CpuHandle::build(const DelegateInit& init) {
  char err[kEngineError] = {0};
  // one reordered copy of each weight for all the program's delegates
  const EngineApi* api = &api_;
  void* cache = init.shared->get("cpu.weight_cache:" + api_.path, [api]() -> void* {
    void* c = api->weight_cache_new();
    if (c == nullptr) raise(OPF_ERR_MEMORY, "cpu backend: no memory for the program's weight cache");
    return c;
  }, api_.weight_cache_free);
  check(api_.use_weight_cache(engine_, cache, err, kEngineError), err, "weight cache");

  Spans spans(plan_.tensors.size(), {nullptr, 0});  // the constants' bytes
  std::vector<char> borrowed(plan_.tensors.size(), 0);  // read in place from spans (storage 3)
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const PlanTensor& t = plan_.tensors[i];
    int32_t storage = storage_of(t.role);
    const void* data = nullptr;
    int64_t nbytes = 0;
    if (t.data_offset >= 0 || !t.named_key.empty()) {
      data = constant(t, i, init);
      nbytes = t.data_offset >= 0 ? t.data_nbytes : t.named_nbytes;
      if (reinterpret_cast<uintptr_t>(data) % 64 == 0) storage = 3;  // else the engine copies it
      borrowed[i] = storage == 3;
      spans[i] = {static_cast<const uint8_t*>(data), nbytes};
    }
    int32_t id = api_.add_tensor(engine_, t.dtype, (int32_t)t.dims.size(), t.dims.data(), t.strides.data(),
                                 data, nbytes, t.role == Role::Alias ? t.base : -1,
                                 t.role == Role::Alias ? t.offset : 0, storage, err, kEngineError);
    if (id != (int32_t)i) raise(OPF_ERR_PROGRAM, "cpu backend: tensors[" + std::to_string(i) + "]: " + err);
  }
  std::vector<char> drop = droppable(spans, init);
  // the engine is told which borrowed constants are ranges of the file whose pages may go
  // (engine.py's file sources, flag 1): what it reads of them after their op is built (a NaN
  // guard's weight gain at finalize) it gives back again, or that weight stays resident
  for (size_t t = 0; t < plan_.tensors.size() && init.file_fd >= 0; ++t) {
    if (!drop[t] || !borrowed[t]) continue;
    const int64_t offset = (int64_t)(spans[t].first - init.file_data);
    check(api_.tensor_file(engine_, (int32_t)t, init.file_fd, offset, 1, err, kEngineError), err,
          "tensors[" + std::to_string(t) + "] file source");
  }
  for (size_t i = 0; i < plan_.ops.size(); ++i) {
    const PlanOp& op = plan_.ops[i];
    std::string what = "ops[" + std::to_string(i) + "] (" + (op.name.empty() ? op.kind : op.name) + ")";
    for (const PlanPostOp& p : op.post)
      check(api_.post_op(engine_, p.kind, p.alg, p.alpha, p.beta, p.kind == 1 ? p.tensor : -1, err, kEngineError),
            err, "ops[" + std::to_string(i) + "] post-op");
    if (op.kind == "kernel") {
      add_kernel(op, i, init);
    } else if (op.kind == "package") {
      add_package(op, i, init);
    } else {
      check(api_.add_op(engine_, op.kind.c_str(), op.in.data(), (int32_t)op.in.size(), op.out.data(),
                        (int32_t)op.out.size(), op.ia.data(), (int32_t)op.ia.size(), op.fa.data(),
                        (int32_t)op.fa.size(), err, kEngineError),
            err, what);
      give_back(op, spans, drop);  // its weights are copied: the peak of init holds one in the file
    }
  }
  check(api_.finalize(engine_, plan_.inputs.data(), (int32_t)plan_.inputs.size(), plan_.outputs.data(),
                      (int32_t)plan_.outputs.size(), err, kEngineError),
        err, "finalize");

  // the DelegateCall's outputs: the engine's own, and at each state position the state
  // input itself (written in place; blob.py)
  const int64_t own = (int64_t)plan_.outputs.size() - plan_.num_debug;
  const int64_t calls = own + (int64_t)plan_.state.size();
  state_input_.assign((size_t)calls, -1);
  for (const auto& s : plan_.state) {
    if (s.second >= calls) raise(OPF_ERR_PROGRAM, "cpu backend blob: a state output position past the call's outputs");
    state_input_[(size_t)s.second] = s.first;
  }
  for (int64_t p = 0; p < calls; ++p)
    if (state_input_[(size_t)p] < 0) own_outputs_.push_back(p);
  if ((int64_t)own_outputs_.size() != own)
    raise(OPF_ERR_PROGRAM, "cpu backend blob: state positions that leave " + std::to_string(own_outputs_.size()) +
                               " outputs for the engine's " + std::to_string(own));
  // a debug build: node results the engine writes every call (sizes from the untrusted
  // blob, bounded by the memory limit before allocation)
  int64_t total = 0;
  for (int64_t k = own; k < (int64_t)plan_.outputs.size(); ++k) {
    const PlanTensor& t = plan_.tensors[(size_t)plan_.outputs[(size_t)k]];
    int64_t bytes = dtype_itemsize(t.dtype);
    for (int64_t d : t.dims) bytes = d != 0 && bytes > (int64_t(1) << 50) / d ? int64_t(1) << 50 : bytes * d;
    total = std::min(total + bytes, int64_t(1) << 50);
    if (total > init.max_memory)
      raise(OPF_ERR_MEMORY, "cpu backend: the debug build's node results take more than the memory "
                            "limit of " + std::to_string(init.max_memory) + " bytes — fix: raise the "
                            "limit (OPFORGE_MAX_MEMORY) or compare a smaller input");
    void* block = std::aligned_alloc(64, (size_t)std::max<int64_t>(64, (bytes + 63) / 64 * 64));
    if (block == nullptr) throw std::bad_alloc();
    debug_.emplace_back(static_cast<uint8_t*>(block), &std::free);
  }
  in_ptrs_.assign(std::max<size_t>(plan_.inputs.size(), 1), nullptr);
  out_ptrs_.assign(std::max<size_t>(plan_.outputs.size(), 1), nullptr);
  for (size_t k = 0; k < debug_.size(); ++k) out_ptrs_[(size_t)own + k] = debug_[k].get();
}

namespace {
const char* const kCopiedAtInit[] = {"conv", "deconv", "matmul", "qconv", "qmatmul",
                                     "int_dot_matmul", "int_matmul"};
bool copied_at_init(const std::string& kind) {
  for (const char* k : kCopiedAtInit)
    if (kind == k) return true;
  return false;
}
}  // namespace

// The program file's pages under the constants the engine copies at init (weights reordered
// into its layouts, a quantized op's scales) that no op reads in place are given back as each
// op is built, or those weights are resident twice (file_pages.py COPIED_AT_INIT, the Python
// runtime's rule). Only on a read-only mapping of the file, whose clean pages a later read
// (another call shape's engine, a crash report) faults in again unchanged; whole pages inside
// each constant. droppable: per tensor, 1 where its root's pages may go.
std::vector<char> CpuHandle::droppable(const Spans& spans, const DelegateInit& init) const {
  const size_t n = plan_.tensors.size();
  std::vector<char> copied(n + 1, 0), in_place(n + 1, 0);
  if (!init.file_mapped || init.file_data == nullptr) return copied;
  for (const PlanOp& op : plan_.ops) {
    const bool at_init = copied_at_init(op.kind);
    for (size_t k = 0; k < op.in.size(); ++k) (at_init && k > 0 ? copied : in_place)[root(op.in[k])] = 1;
    for (const PlanPostOp& p : op.post)
      if (p.kind == 1) in_place[root(p.tensor)] = 1;
  }
  for (int32_t t : plan_.outputs) in_place[root(t)] = 1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(init.file_data), hi = lo + init.file_size;
  for (size_t t = 0; t < n; ++t) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(spans[t].first);
    copied[t] = copied[t] && !in_place[t] && at != 0 && spans[t].second > 0 && at >= lo && at <= hi &&
                (uintptr_t)spans[t].second <= hi - at;
  }
  return copied;
}

void CpuHandle::give_back(const PlanOp& op, const Spans& spans, std::vector<char>& drop) const {
  if (!copied_at_init(op.kind)) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  for (size_t k = 1; k < op.in.size(); ++k) {
    const size_t t = root(op.in[k]);
    if (!drop[t]) continue;
    drop[t] = 0;  // once
    const uintptr_t at = reinterpret_cast<uintptr_t>(spans[t].first);
    const uintptr_t first = (at + page - 1) / page * page, end = (at + (uintptr_t)spans[t].second) / page * page;
    if (end > first) madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);  // a hint: errors change nothing
  }
}

void CpuHandle::check_view(const opforge_tensor& v, int32_t tid, const char* kind, int64_t k) const {
  const PlanTensor& t = plan_.tensors[(size_t)tid];
  bool ok = v.dtype == t.dtype && v.rank == (int32_t)t.dims.size() && (v.rank == 0 || v.sizes != nullptr);
  for (int32_t d = 0; ok && d < v.rank; ++d) ok = v.sizes[d] == t.dims[(size_t)d];
  // dense row-major: the strides of every dim of size > 1 (NumPy's C-contiguous rule)
  for (int32_t d = 0; ok && v.strides != nullptr && d < v.rank; ++d)
    ok = t.dims[(size_t)d] <= 1 || v.strides[d] == t.strides[(size_t)d];
  bool empty = false;
  for (int64_t d : t.dims) empty = empty || d == 0;
  if (ok && v.data == nullptr && !empty) ok = false;
  if (ok) return;
  std::string found = std::to_string(v.dtype) + "[";
  for (int32_t d = 0; v.sizes != nullptr && d < v.rank && d < 8; ++d) found += (d ? "," : "") + std::to_string(v.sizes[d]);
  std::string want = std::string(dtype_name(t.dtype)) + "[";
  for (size_t d = 0; d < t.dims.size(); ++d) want += (d ? "," : "") + std::to_string(t.dims[d]);
  raise(OPF_ERR_INPUT, std::string("cpu backend: ") + kind + " " + std::to_string(k) + " is dtype " + found +
                           "], the delegate was compiled for " + want + "] (dense, row-major" +
                           (v.data == nullptr ? ", with data" : "") + ")");
}

void CpuHandle::execute(const opforge_tensor* inputs, int64_t n_in, const opforge_tensor* outputs, int64_t n_out) {
  if (n_in != (int64_t)plan_.inputs.size() || n_out != (int64_t)state_input_.size())
    raise(OPF_ERR_PROGRAM, "cpu backend: " + std::to_string(n_in) + " input(s) and " + std::to_string(n_out) +
                               " output(s), the delegate has " + std::to_string(plan_.inputs.size()) + " and " +
                               std::to_string(state_input_.size()));
  for (int64_t k = 0; k < n_in; ++k) {
    check_view(inputs[k], plan_.inputs[(size_t)k], "input", k);
    in_ptrs_[(size_t)k] = inputs[k].data;
  }
  for (int64_t p = 0; p < n_out; ++p) {
    int64_t state = state_input_[(size_t)p];
    if (state >= 0 && outputs[p].data != inputs[state].data)
      raise(OPF_ERR_PROGRAM, "cpu backend: output " + std::to_string(p) + " is the new value of state input " +
                                 std::to_string(state) + ", which the delegate writes in place: it must be "
                                 "that input's memory — fix: re-export the program; this one was altered or corrupted");
  }
  for (size_t k = 0; k < own_outputs_.size(); ++k) {
    const opforge_tensor& v = outputs[own_outputs_[k]];
    check_view(v, plan_.outputs[k], "output", own_outputs_[k]);
    out_ptrs_[k] = v.data;
  }
  char err[kEngineError];
  err[0] = 0;
  if (api_.execute(engine_, in_ptrs_.data(), out_ptrs_.data(), err, kEngineError) != 0)
    raise(OPF_ERR_KERNEL, std::string("cpu backend: ") + err);
}

}  // namespace
}  // namespace cpu

namespace cpu {
std::unique_ptr<DelegateHandle> make_engine(Plan plan, const EngineApi& api, const DelegateInit& init) {
  return std::make_unique<CpuHandle>(std::move(plan), api, init);
}
}  // namespace cpu

std::unique_ptr<DelegateHandle> cpu_backend_init(const uint8_t* blob, size_t size, const DelegateInit& init) {
  try {
    auto checked = std::make_unique<cpu::Blob>(blob, size);
    cpu::decode_num_threads(init.specs);  // the specs checked now, whether or not an engine is made now
    const cpu::EngineApi& api = cpu::engine_api();
    if (checked->symbolic()) return cpu::make_dynamic(std::move(checked), api, init);
    return cpu::make_engine(checked->plan(), api, init);
  } catch (const Error& e) {
    raise(e.status, init.where + " (" + std::to_string(size) + " bytes) refused: " + e.message);
  }
}

}  // namespace opforge::rt
