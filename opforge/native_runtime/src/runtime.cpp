// The C API (opforge/runtime.h): every entry point runs its body through guarded(), which
// turns an Error into its status, a ProgramError into OPF_ERR_PROGRAM, std::bad_alloc into
// OPF_ERR_MEMORY and anything else into OPF_ERR_INTERNAL, with the thread's last message.
// No exception crosses the API.
#include <cstring>
#include <new>
#include <string>

#include "errors.h"
#include "portable.h"
#include "loaded.h"
#include "loader.h"
#include "method.h"
#include "registry.h"

using namespace opforge::rt;

namespace {

template <typename Body>
opf_status guarded(Body&& body) {
  try {
    body();
    return OPF_OK;
  } catch (const Error& e) {
    set_last_error(e.message);
    return e.status;
  } catch (const ProgramError& e) {
    set_last_error(e.message);
    return OPF_ERR_PROGRAM;
  } catch (const std::bad_alloc&) {
    set_last_error("opforge runtime: an allocation failed — the system is out of memory — fix: free memory, or "
                   "lower the memory limit (opf_load_options.max_memory / OPFORGE_MAX_MEMORY)");
    return OPF_ERR_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("opforge runtime: internal error (") + e.what() + ") — a bug in opforge: please report it");
    return OPF_ERR_INTERNAL;
  } catch (...) {
    set_last_error("opforge runtime: internal error — a bug in opforge: please report it");
    return OPF_ERR_INTERNAL;
  }
}

void require(const void* pointer, const char* api, const char* what) {
  if (pointer == nullptr)
    raise(OPF_ERR_INVALID_ARGUMENT, std::string("`") + api + "`: " + what + " — found NULL — valid: " +
                                        (std::strcmp(what, "out") == 0 ? "a place for the result" : "a handle made by opforge") +
                                        " — fix: pass it");
}

// Holds a method instance for one call; OPF_ERR_BUSY when another thread holds it.
class Entered {
 public:
  Entered(opf_method* method, const char* api) : instance_(method->instance.get()) {
    if (instance_->busy.exchange(true, std::memory_order_acquire))
      raise(OPF_ERR_BUSY, std::string("`") + api + "`: method instance — entered by a second thread while another "
                                                  "call of it is running — valid: one call at a time per instance (its "
                                                  "arenas hold the call's tensors) — fix: make one instance per thread "
                                                  "with opf_method_new, or guard the instance with a lock");
  }
  ~Entered() { instance_->busy.store(false, std::memory_order_release); }

 private:
  MethodInstance* instance_;
};

const IoInfo& io(const opf_program* program, const char* method, int64_t index, bool input, const char* api) {
  require(program, api, "program");
  const MethodInfo& m = program->method(method, api);
  const auto& list = input ? m.inputs : m.outputs;
  if (index < 0 || index >= int64_t(list.size()))
    raise(OPF_ERR_INVALID_ARGUMENT, std::string("`") + api + "`: " + (input ? "input " : "output ") +
                                        std::to_string(index) + " — out of range — valid: 0.." +
                                        std::to_string(int64_t(list.size()) - 1) + " — fix: pass an index below "
                                        "opf_program_method_io's count");
  return list[index];
}

StateTensor& state_of(const opf_program* program, const char* name, const char* api) {
  require(program, api, "program");
  require(name, api, "name");
  StateTensor* state = program->state->find(name);
  if (state == nullptr) program->state->unknown(api, name);
  return *state;
}

}  // namespace

extern "C" {

// ---- registry ----------------------------------------------------------------------

OPF_API opf_status opf_registry_new(opf_registry** out) {
  return guarded([&] {
    require(out, "opf_registry_new", "out");
    *out = nullptr;
    auto registry = std::make_unique<opf_registry>();
    registry->add(opforge::portable::portable_library(), "opforge portable kernels", false);
    *out = registry.release();
  });
}

OPF_API void opf_registry_free(opf_registry* registry) {
  if (registry == nullptr) return;
  delete registry;  // closes its libraries after dropping their kernels
}

OPF_API opf_status opf_registry_load_library(opf_registry* registry, const char* path, int32_t override_existing) {
  return guarded([&] {
    require(registry, "opf_registry_load_library", "registry");
    require(path, "opf_registry_load_library", "path");
    load_library(registry, path, override_existing != 0);
  });
}

OPF_API opf_status opf_registry_add_library(opf_registry* registry, const opforge_library* library,
                                            int32_t override_existing) {
  return guarded([&] {
    require(registry, "opf_registry_add_library", "registry");
    require(library, "opf_registry_add_library", "library");
    registry->add(library, library->abi_version == OPFORGE_ABI_VERSION && library->name ? library->name : "(linked library)",
                  override_existing != 0);
  });
}

OPF_API int64_t opf_registry_num_operators(const opf_registry* registry) {
  return registry ? static_cast<int64_t>(registry->keys.size()) : 0;
}

OPF_API const char* opf_registry_operator(const opf_registry* registry, int64_t index) {
  if (registry == nullptr || index < 0 || index >= int64_t(registry->keys.size())) return nullptr;
  return registry->keys[index].c_str();
}

// ---- programs ----------------------------------------------------------------------

OPF_API opf_status opf_program_load_path(const char* path, const opf_registry* registry,
                                         const opf_load_options* options, opf_program** out) {
  return guarded([&] {
    require(path, "opf_program_load_path", "path");
    require(registry, "opf_program_load_path", "registry");
    require(out, "opf_program_load_path", "out");
    *out = nullptr;
    *out = load_program(FileBytes::map_path(path), std::string("opf_program_load_path('") + path + "')", registry,
                        options);
  });
}

OPF_API opf_status opf_program_load_fd(int fd, const opf_registry* registry, const opf_load_options* options,
                                       opf_program** out) {
  return guarded([&] {
    require(registry, "opf_program_load_fd", "registry");
    require(out, "opf_program_load_fd", "out");
    *out = nullptr;
    std::string label = "fd " + std::to_string(fd);
    *out = load_program(FileBytes::map_fd(fd, label), "opf_program_load_fd(" + label + ")", registry, options);
  });
}

OPF_API opf_status opf_program_load_buffer(const void* data, size_t size, int32_t copy, const opf_registry* registry,
                                           const opf_load_options* options, opf_program** out) {
  return guarded([&] {
    require(registry, "opf_program_load_buffer", "registry");
    require(out, "opf_program_load_buffer", "out");
    *out = nullptr;
    if (data == nullptr && size > 0) require(data, "opf_program_load_buffer", "data");
    auto bytes = copy ? FileBytes::copy(data, size) : FileBytes::borrow(data, size);
    *out = load_program(std::move(bytes), "opf_program_load_buffer(<" + std::to_string(size) + " bytes>)", registry,
                        options);
  });
}

OPF_API void opf_program_free(opf_program* program) { delete program; }

OPF_API int64_t opf_program_num_methods(const opf_program* program) {
  return program ? static_cast<int64_t>(program->methods.size()) : 0;
}

OPF_API const char* opf_program_method_name(const opf_program* program, int64_t index) {
  if (program == nullptr || index < 0 || index >= int64_t(program->methods.size())) return nullptr;
  return program->methods[index].method->name.c_str();
}

OPF_API const char* opf_program_metadata(const opf_program* program, const char* key) {
  if (program == nullptr || key == nullptr) return nullptr;
  for (const auto& [k, v] : program->program.user_metadata)
    if (k == key) return v.c_str();
  return nullptr;
}

OPF_API opf_status opf_program_method_io(const opf_program* program, const char* method, int64_t* num_inputs,
                                         int64_t* num_outputs) {
  return guarded([&] {
    require(program, "opf_program_method_io", "program");
    const MethodInfo& m = program->method(method, "opf_program_method_io");
    if (num_inputs) *num_inputs = static_cast<int64_t>(m.inputs.size());
    if (num_outputs) *num_outputs = static_cast<int64_t>(m.outputs.size());
  });
}

static void fill_info(const IoInfo& io, opf_io_info* out) {
  out->kind = io.kind;
  out->dtype = io.kind == OPF_VALUE_TENSOR ? io.dtype : -1;
  out->rank = static_cast<int32_t>(io.sizes.size());
  out->reserved = 0;
  out->sizes = io.sizes.data();
  out->min_sizes = io.min_sizes.data();
  out->max_sizes = io.max_sizes.data();
  out->dim_order = io.dim_order.data();
}

OPF_API opf_status opf_program_input_info(const opf_program* program, const char* method, int64_t index,
                                          opf_io_info* out) {
  return guarded([&] {
    require(out, "opf_program_input_info", "out");
    fill_info(io(program, method, index, true, "opf_program_input_info"), out);
  });
}

OPF_API opf_status opf_program_output_info(const opf_program* program, const char* method, int64_t index,
                                           opf_io_info* out) {
  return guarded([&] {
    require(out, "opf_program_output_info", "out");
    fill_info(io(program, method, index, false, "opf_program_output_info"), out);
  });
}

// ---- state -------------------------------------------------------------------------

OPF_API int64_t opf_program_num_states(const opf_program* program) {
  return program ? static_cast<int64_t>(program->state->tensors().size()) : 0;
}

OPF_API const char* opf_program_state_name(const opf_program* program, int64_t index) {
  if (program == nullptr || index < 0 || index >= int64_t(program->state->tensors().size())) return nullptr;
  return program->state->tensors()[index]->name.c_str();
}

OPF_API opf_status opf_program_state_info(const opf_program* program, const char* name, int32_t* dtype,
                                          int32_t* rank, const int64_t** sizes, int64_t* nbytes) {
  return guarded([&] {
    const StateTensor& s = state_of(program, name, "opf_program_state_info");
    if (dtype) *dtype = s.def.dtype;
    if (rank) *rank = static_cast<int32_t>(s.sizes.size());
    if (sizes) *sizes = s.sizes.data();
    if (nbytes) *nbytes = s.nbytes;
  });
}

static void check_state_bytes(const StateTensor& s, int64_t nbytes, const void* p, const char* api) {
  if (nbytes != s.nbytes)
    raise(OPF_ERR_STATE, std::string("`") + api + "('" + s.name + "')`: nbytes — found " + std::to_string(nbytes) +
                             " — valid: " + std::to_string(s.nbytes) + " (" + dtype_name(s.def.dtype) +
                             ", the state's whole size, dense in its dim order) — fix: size the buffer with "
                             "opf_program_state_info");
  if (p == nullptr && nbytes > 0) require(p, api, "buffer");
}

OPF_API opf_status opf_program_state_read(const opf_program* program, const char* name, void* dst, int64_t nbytes) {
  return guarded([&] {
    const StateTensor& s = state_of(program, name, "opf_program_state_read");
    check_state_bytes(s, nbytes, dst, "opf_program_state_read");
    if (nbytes) std::memcpy(dst, s.data, static_cast<size_t>(nbytes));
  });
}

OPF_API opf_status opf_program_state_write(opf_program* program, const char* name, const void* src, int64_t nbytes) {
  return guarded([&] {
    StateTensor& s = state_of(program, name, "opf_program_state_write");
    check_state_bytes(s, nbytes, src, "opf_program_state_write");
    if (nbytes) std::memcpy(s.data, src, static_cast<size_t>(nbytes));
  });
}

OPF_API opf_status opf_program_state_reset(opf_program* program, const char* name) {
  return guarded([&] {
    require(program, "opf_program_state_reset", "program");
    if (name == nullptr) {
      for (auto& s : program->state->tensors()) program->state->reset(*s);
      return;
    }
    program->state->reset(state_of(program, name, "opf_program_state_reset"));
  });
}

// ---- method instances --------------------------------------------------------------

OPF_API opf_status opf_program_arena_sizes(const opf_program* program, const char* method, int64_t* sizes,
                                           int64_t capacity, int64_t* count) {
  return guarded([&] {
    require(program, "opf_program_arena_sizes", "program");
    const MethodInfo& m = program->method(method, "opf_program_arena_sizes");
    const auto& arenas = m.method->arena_sizes;
    if (count) *count = static_cast<int64_t>(arenas.size());
    for (int64_t k = 0; sizes != nullptr && k < capacity && k < int64_t(arenas.size()); ++k) sizes[k] = arenas[k];
  });
}

OPF_API opf_status opf_method_new(opf_program* program, const char* method, const opf_method_options* options,
                                  opf_method** out) {
  return guarded([&] {
    require(program, "opf_method_new", "program");
    require(out, "opf_method_new", "out");
    *out = nullptr;
    const MethodInfo& m = program->method(method, "opf_method_new");
    auto handle = std::make_unique<opf_method>();
    handle->instance = std::make_unique<MethodInstance>(program, m, options);
    *out = handle.release();
  });
}

OPF_API void opf_method_free(opf_method* method) { delete method; }

OPF_API opf_status opf_method_set_input(opf_method* method, int64_t index, const void* data, int32_t dtype,
                                        int32_t rank, const int64_t* sizes, int32_t zero_copy) {
  return guarded([&] {
    require(method, "opf_method_set_input", "method");
    Entered entered(method, "opf_method_set_input");
    method->instance->set_input(index, data, dtype, rank, sizes, zero_copy != 0);
  });
}

static opf_status set_scalar(opf_method* method, int64_t index, ValueTag tag, int64_t i, double d) {
  return guarded([&] {
    require(method, "opf_method_set_input", "method");
    Entered entered(method, "opf_method_set_input");
    method->instance->set_input_scalar(index, tag, i, d);
  });
}

OPF_API opf_status opf_method_set_input_int(opf_method* method, int64_t index, int64_t value) {
  return set_scalar(method, index, ValueTag::Int, value, 0.0);
}

OPF_API opf_status opf_method_set_input_double(opf_method* method, int64_t index, double value) {
  return set_scalar(method, index, ValueTag::Double, 0, value);
}

OPF_API opf_status opf_method_set_input_bool(opf_method* method, int64_t index, int32_t value) {
  return set_scalar(method, index, ValueTag::Bool, value != 0, 0.0);
}

OPF_API opf_status opf_method_execute(opf_method* method) {
  return guarded([&] {
    require(method, "opf_method_execute", "method");
    Entered entered(method, "opf_method_execute");
    method->instance->execute();
  });
}

OPF_API opf_status opf_method_output(const opf_method* method, int64_t index, opf_tensor_view* out) {
  return guarded([&] {
    require(method, "opf_method_output", "method");
    require(out, "opf_method_output", "out");
    method->instance->output(index, out);
  });
}

OPF_API opf_status opf_method_output_scalar(const opf_method* method, int64_t index, int32_t* kind,
                                            int64_t* int_value, double* double_value) {
  return guarded([&] {
    require(method, "opf_method_output_scalar", "method");
    method->instance->output_scalar(index, kind, int_value, double_value);
  });
}

// ---- profiling ---------------------------------------------------------------------

OPF_API opf_status opf_method_set_profiling(opf_method* method, int32_t on) {
  return guarded([&] {
    require(method, "opf_method_set_profiling", "method");
    Entered entered(method, "opf_method_set_profiling");
    method->instance->set_profiling(on != 0);
  });
}

OPF_API int64_t opf_method_num_instructions(const opf_method* method) {
  return method ? method->instance->num_instructions() : 0;
}

OPF_API opf_status opf_method_instruction_profile(const opf_method* method, int64_t index, const char** label,
                                                  const char** node, int64_t* last_ns) {
  return guarded([&] {
    require(method, "opf_method_instruction_profile", "method");
    if (index < 0 || index >= method->instance->num_instructions())
      raise(OPF_ERR_INVALID_ARGUMENT, "`opf_method_instruction_profile`: instruction " + std::to_string(index) +
                                          " — out of range — valid: 0.." +
                                          std::to_string(method->instance->num_instructions() - 1) +
                                          " — fix: pass an index below opf_method_num_instructions");
    method->instance->profile(index, label, node, last_ns);
  });
}

}  // extern "C"
