// The backend interface (backend.h): the table of backends, the delegates of a program,
// and opf_backend_set_library.
#include "backend.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace opforge::rt {

// backend_cpu.cpp
std::unique_ptr<DelegateHandle> cpu_backend_init(const uint8_t* blob, size_t size, const DelegateInit& init);

namespace {

// The backends compiled in (CMake's OPFORGE_BACKEND_CPU; a bundle without cpu delegates
// leaves the cpu backend out). The empty entry keeps the array non-empty.
const BackendDef kBackends[] = {
#ifdef OPFORGE_WITH_CPU_BACKEND
    {"cpu", &cpu_backend_init},
#endif
    {"", nullptr},
};

std::mutex& library_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::string>& library_paths() {
  static std::map<std::string, std::string> paths;
  return paths;
}

std::string shown(const std::string& text, size_t limit = 80) {
  std::string out;
  for (char c : text.substr(0, limit)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + (text.size() > limit ? "...'" : "'");
}

// "i:<count>" as export writes it (runtime/delegates.py _io_count).
int64_t io_count(const std::string& where, const std::vector<std::pair<std::string, std::string>>& specs,
                 const char* key) {
  const std::string* raw = nullptr;
  for (const auto& kv : specs)
    if (kv.first == key) raw = &kv.second;
  bool ok = raw != nullptr && raw->size() > 2 && raw->size() <= 10 && raw->compare(0, 2, "i:") == 0;
  int64_t count = 0;
  for (size_t i = 2; ok && i < raw->size(); ++i) {
    char c = (*raw)[i];
    if (c < '0' || c > '9') ok = false;
    else count = count * 10 + (c - '0');
  }
  if (!ok || count > (int64_t(1) << 20))
    raise(OPF_ERR_PROGRAM, where + " — compile spec '" + key + "' is " +
                               (raw == nullptr ? std::string("missing") : shown(*raw, 40)) +
                               " — valid: 'i:<count>' as export writes it — fix: re-export the "
                               "program; this one was altered or corrupted");
  return count;
}

}  // namespace

const BackendDef* find_backend(const std::string& id) {
  for (const auto& b : kBackends)
    if (b.init != nullptr && id == b.id) return &b;
  return nullptr;
}

std::string backend_ids() {
  std::string out;
  for (const auto& b : kBackends)
    if (b.init != nullptr) out += (out.empty() ? "" : ", ") + std::string("'") + b.id + "'";
  if (out.empty()) out = "none (this build has no backend)";
  return out;
}

std::string backend_library_path(const std::string& backend) {
  std::lock_guard<std::mutex> lock(library_mutex());
  auto it = library_paths().find(backend);
  return it == library_paths().end() ? std::string() : it->second;
}

// ---- DelegateShared -----------------------------------------------------------------

DelegateShared::~DelegateShared() {
  for (auto it = items_.rbegin(); it != items_.rend(); ++it)
    if (it->second.second) it->second.second(it->second.first);
}

void* DelegateShared::get(const std::string& key, const std::function<void*()>& make, void (*free)(void*)) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& item : items_)
    if (item.first == key) return item.second.first;
  void* object = make();
  items_.push_back({key, {object, free}});
  return object;
}

void DelegateShared::check_layout(const std::string& key, const std::string& layout,
                                  const std::string& reader) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = layouts_.emplace(key, std::make_pair(layout, reader)).first;
  if (it->second.first != layout)
    raise(OPF_ERR_PROGRAM, "named data " + shown(key) + " — " + reader + " reads it as " + layout +
                               ", " + it->second.second + " as " + it->second.first +
                               " — valid: one dtype and shape per key (export stores a key per "
                               "layout) — fix: re-export the program; this one was altered or corrupted");
}

// ---- DelegateSet --------------------------------------------------------------------

DelegateSet::DelegateSet(const Program& program, const Options& options) {
  std::vector<char> used(program.delegates.size(), 0);
  for (const auto& m : program.methods)
    for (const auto& ins : m.instructions)
      if (ins.kind == InstructionKind::DelegateCall && ins.index < used.size()) used[ins.index] = 1;
  slots_.resize(program.delegates.size());
  for (size_t i = 0; i < program.delegates.size(); ++i) {
    const Delegate& d = program.delegates[i];
    Slot& slot = slots_[i];
    slot.id = d.id;
    slot.mu = std::make_unique<std::mutex>();
    if (!used[i]) continue;
    std::string where = "`" + options.api + "`: delegates[" + std::to_string(i) + "] (" + shown(d.id) + ")";
    const BackendDef* backend = find_backend(d.id);
    if (backend == nullptr)
      raise(OPF_ERR_UNSUPPORTED, where + " — backend " + shown(d.id) + " is not part of the "
                                 "native runtime — valid: " + backend_ids() + " — fix: export the "
                                 "program without that backend, or run it with the Python runtime "
                                 "(opforge.runtime.load)");
    if (d.segment >= program.segments.size())
      raise(OPF_ERR_PROGRAM, where + " — segment " + std::to_string(d.segment) + " out of range");
    const Segment& seg = program.segments[d.segment];
    DelegateInit init;
    init.program = &program;
    init.index = i;
    init.where = where;
    init.num_inputs = io_count(where, d.compile_specs, "opforge.inputs");
    init.num_outputs = io_count(where, d.compile_specs, "opforge.outputs");
    for (const auto& kv : d.compile_specs)
      if (kv.first.compare(0, 8, "opforge.") != 0) init.specs.push_back(kv);
    init.file_fd = options.file_fd;
    init.file_data = options.file_data;
    init.file_size = options.file_size;
    init.file_mapped = options.file_mapped;
    init.max_memory = options.max_memory;
    init.kernels = options.kernels;
    init.shared = &shared_;
    slot.num_inputs = init.num_inputs;
    slot.num_outputs = init.num_outputs;
    slot.handle = backend->init(seg.data, (size_t)seg.size, init);
  }
}

DelegateSet::~DelegateSet() {
  for (auto& slot : slots_) {
    if (!slot.handle) continue;
    std::lock_guard<std::mutex> lock(*slot.mu);  // a call in flight finishes first
    slot.handle.reset();
  }
}

DelegateSet::Slot& DelegateSet::checked(uint32_t delegate, int64_t num_args) {
  if (!ready(delegate))
    raise(OPF_ERR_INTERNAL, "DelegateCall " + std::to_string(delegate) + " — a delegate that was not "
                            "initialised at load — this is a bug in opforge: please report it");
  Slot& slot = slots_[delegate];
  if (num_args != slot.num_inputs + slot.num_outputs)
    raise(OPF_ERR_PROGRAM, "DelegateCall " + std::to_string(delegate) + " (" + shown(slot.id) + ") — " +
                               std::to_string(num_args) + " arguments — valid: " +
                               std::to_string(slot.num_inputs) + " input(s) + " +
                               std::to_string(slot.num_outputs) + " output(s), as its delegate "
                               "stores — fix: re-export the program; this one was altered or corrupted");
  return slot;
}

void DelegateSet::call(uint32_t delegate, const opforge_tensor* args, int64_t num_args) {
  Slot& slot = checked(delegate, num_args);
  std::lock_guard<std::mutex> lock(*slot.mu);
  slot.handle->execute(args, slot.num_inputs, args + slot.num_inputs, slot.num_outputs);
}

void DelegateSet::call(uint32_t delegate, const opforge_arg* args, int64_t num_args) {
  Slot& slot = checked(delegate, num_args);
  std::lock_guard<std::mutex> lock(*slot.mu);
  slot.views.resize((size_t)num_args);
  for (int64_t k = 0; k < num_args; ++k) {
    if (args[k].tag != OPFORGE_ARG_TENSOR)
      raise(OPF_ERR_PROGRAM, "DelegateCall " + std::to_string(delegate) + " (" + shown(slot.id) + ") — argument " +
                                 std::to_string(k) + " is not a tensor — valid: tensors only — fix: re-export");
    slot.views[(size_t)k] = args[k].v.tensor;
  }
  slot.handle->execute(slot.views.data(), slot.num_inputs, slot.views.data() + slot.num_inputs, slot.num_outputs);
}

opforge_arg delegate_call_arg(DelegateSet* set, uint32_t delegate) {
  opforge_arg arg;
  std::memset(&arg, 0, sizeof(arg));
  arg.tag = OPFORGE_ARG_NONE;
  arg.v.list.data = set;
  arg.v.list.size = delegate;
  return arg;
}

void delegate_call_kernel(opforge_context* ctx, opforge_arg* args, int64_t num_args) {
  try {
    auto* set = static_cast<DelegateSet*>(const_cast<void*>(args[0].v.list.data));
    set->call(static_cast<uint32_t>(args[0].v.list.size), args + 1, num_args - 1);
  } catch (const Error& e) {
    ctx->status = e.status;
    std::snprintf(ctx->message, sizeof(ctx->message), "%s", e.message.c_str());
  } catch (const std::bad_alloc&) {
    ctx->status = OPF_ERR_MEMORY;
    std::snprintf(ctx->message, sizeof(ctx->message), "delegate call: out of memory");
  }
}

}  // namespace opforge::rt

using namespace opforge::rt;

extern "C" OPF_API opf_status opf_backend_set_library(const char* backend, const char* path) {
  try {
    clear_last_error();
    if (backend == nullptr || path == nullptr || path[0] == '\0' || find_backend(backend) == nullptr)
      raise(OPF_ERR_INVALID_ARGUMENT,
            std::string("`opf_backend_set_library`: backend ") + (backend ? shown(backend) : "NULL") +
                ", path " + (path ? shown(path, 200) : "NULL") + " — valid: a backend of " +
                backend_ids() + " and the path of its library — fix: pass both");
    std::lock_guard<std::mutex> lock(library_mutex());
    library_paths()[backend] = path;
    return OPF_OK;
  } catch (const Error& e) {
    set_last_error(e.message);
    return e.status;
  } catch (const std::bad_alloc&) {
    set_last_error("`opf_backend_set_library`: out of memory");
    return OPF_ERR_MEMORY;
  }
}
