// The backend interface: how the runtime runs a DelegateCall (ExecuTorch's
// backend_interface.h; opforge/backends/base.py and runtime/delegates.py on the Python side).
//
//   load     → DelegateSet::create: for each delegate some DelegateCall uses, find its
//              backend by id (BackendDef), check the runtime's compile specs
//              ("opforge.inputs" / "opforge.outputs": the call's argument counts) and
//              init the backend with its blob, its own compile specs, the program's named
//              data and file → a DelegateHandle (one per delegate, shared by every method
//              instance of the program)
//   execute  → DelegateSet::call: the DelegateCall's inputs and outputs as opforge_tensor
//              views (dense, row-major), serialised per handle (a backend keeps per-handle
//              scratch memory), like delegates.py's lock per handle
//   destroy  → the DelegateSet's destructor: every handle, then what they shared
//              (DelegateShared: a cpu engine's cache of reordered weights)
//
// A backend is a BackendDef in the table of backend.cpp: nothing registers itself at
// static-initialisation time. Errors are Error (errors.h): a malformed blob is
// OPF_ERR_PROGRAM, a backend this process cannot run (its library missing) is
// OPF_ERR_UNSUPPORTED, a failed call OPF_ERR_KERNEL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "opforge/kernel_abi.h"
#include "program.h"

namespace opforge::rt {

// A custom op's native kernel for a delegate that calls it (a cpu "kernel" op): the
// registry's kernel for `key` ("my_ops::mul3.out") whose binding serves these arguments
// (tensor arguments carry their dtype and rank, no data), or nullptr when there is none.
using KernelResolver =
    std::function<opforge_kernel_fn(const std::string& key, const opforge_arg* args, int64_t num_args)>;

// What the delegates of one program share, freed after every handle: objects made once by
// the first delegate that asks (the cpu engine's weight cache), and the layout each named
// data key is read with (its first reader's: a key read as two layouts is refused, as
// named_data.NamedDataMap.get does).
class DelegateShared {
 public:
  DelegateShared() = default;
  ~DelegateShared();
  DelegateShared(const DelegateShared&) = delete;
  DelegateShared& operator=(const DelegateShared&) = delete;

  // The object stored under `key`, made by make() on first use; free(object) runs when
  // the program's delegates are gone (in the reverse order of making).
  void* get(const std::string& key, const std::function<void*()>& make, void (*free)(void*));
  // Record `layout` as how `reader` reads named data `key`; Error OPF_ERR_PROGRAM when an
  // earlier reader read it as another layout.
  void check_layout(const std::string& key, const std::string& layout, const std::string& reader);

 private:
  std::mutex mu_;
  std::vector<std::pair<std::string, std::pair<void*, void (*)(void*)>>> items_;
  std::map<std::string, std::pair<std::string, std::string>> layouts_;  // key → (layout, reader)
};

// Everything a backend's init gets besides its blob.
struct DelegateInit {
  const Program* program = nullptr;  // segments and named data (spans of the file's bytes)
  size_t index = 0;                  // delegates[index]
  std::string where;                 // "opf_program_load — delegates[2] ('cpu')" for messages
  std::vector<std::pair<std::string, std::string>> specs;  // its own compile specs (raw)
  int64_t num_inputs = 0;            // the DelegateCall's argument counts
  int64_t num_outputs = 0;
  int file_fd = -1;                  // the program file, open (or -1: a buffer)
  const uint8_t* file_data = nullptr;  // its bytes (segments point into them)
  size_t file_size = 0;
  bool file_mapped = false;          // file_data is a read-only mapping of the file (FileBytes::mapped)
  int64_t max_memory = 0;            // bytes one method instance may allocate
  KernelResolver kernels;            // may be empty: no custom-op kernels
  DelegateShared* shared = nullptr;  // the program's (outlives the handle)
};

// One initialised delegate.
class DelegateHandle {
 public:
  virtual ~DelegateHandle() = default;
  // One call: inputs then outputs as the DelegateCall lists them, each a dense row-major
  // view (strides may be nullptr). Throws Error. Never called by two threads at once.
  virtual void execute(const opforge_tensor* inputs, int64_t num_inputs,
                       const opforge_tensor* outputs, int64_t num_outputs) = 0;
};

// A backend: its id in the program ("cpu") and its init.
struct BackendDef {
  const char* id;
  std::unique_ptr<DelegateHandle> (*init)(const uint8_t* blob, size_t size, const DelegateInit& init);
};

// The backend for `id`, or nullptr (backend.cpp's table).
const BackendDef* find_backend(const std::string& id);
// Every backend id this runtime knows, ", "-joined (for messages).
std::string backend_ids();

// The delegates of one loaded program: made at load, used by every method instance.
class DelegateSet {
 public:
  struct Options {
    std::string api = "opf_program_load";
    int file_fd = -1;
    const uint8_t* file_data = nullptr;
    size_t file_size = 0;
    bool file_mapped = false;
    int64_t max_memory = 0;
    KernelResolver kernels;
  };
  // Init every delegate a DelegateCall of `program` uses (others are left alone, as the
  // Python runtime does). Throws Error naming the delegate on the first that fails.
  DelegateSet(const Program& program, const Options& options);
  ~DelegateSet();
  DelegateSet(const DelegateSet&) = delete;
  DelegateSet& operator=(const DelegateSet&) = delete;

  size_t size() const { return slots_.size(); }
  bool ready(uint32_t delegate) const { return delegate < slots_.size() && slots_[delegate].handle; }
  int64_t num_inputs(uint32_t delegate) const { return slots_.at(delegate).num_inputs; }
  int64_t num_outputs(uint32_t delegate) const { return slots_.at(delegate).num_outputs; }
  const std::string& id(uint32_t delegate) const { return slots_.at(delegate).id; }
  // One DelegateCall: args are the call's inputs then outputs (num_inputs + num_outputs).
  // Throws Error naming the delegate.
  void call(uint32_t delegate, const opforge_tensor* args, int64_t num_args);
  // The same with the tensors inside kernel-ABI arguments (the executor's bound form).
  void call(uint32_t delegate, const opforge_arg* args, int64_t num_args);

 private:
  struct Slot {
    std::string id;
    int64_t num_inputs = 0, num_outputs = 0;
    std::unique_ptr<DelegateHandle> handle;
    std::unique_ptr<std::mutex> mu;
    std::vector<opforge_tensor> views;  // call(opforge_arg*)'s gathered views (under mu)
  };
  Slot& checked(uint32_t delegate, int64_t num_args);  // Error unless ready and num_args fit
  DelegateShared shared_;     // destroyed after the slots (declared first)
  std::vector<Slot> slots_;
};

// A DelegateCall bound like a KernelCall (method.cpp): delegate_call_kernel is its
// kernel-ABI function, args[0] (delegate_call_arg) names the program's DelegateSet and the
// delegate, args[1...] are the call's tensors, inputs then outputs. A failure sets ctx's
// status and message as a kernel's does.
void delegate_call_kernel(opforge_context* ctx, opforge_arg* args, int64_t num_args);
opforge_arg delegate_call_arg(DelegateSet* set, uint32_t delegate);

// The shared library a backend runs on (the cpu engine), set by
// opf_backend_set_library or the backend's environment variable: the path given for
// `backend`, or "" when none was set.
std::string backend_library_path(const std::string& backend);

}  // namespace opforge::rt
