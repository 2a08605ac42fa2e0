// Loading a program (loader.h): file bytes, then the load pipeline.
#include "loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>

#include "debug_nodes.h"
#include "errors.h"
#include "loaded.h"
#include "method.h"
#include "shapes.h"

namespace opforge::rt {

// --- bytes ---------------------------------------------------------------------------

static std::unique_ptr<FileBytes> map_open_fd(int fd, bool own, const std::string& api) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    if (own) close(fd);
    raise(OPF_ERR_IO, "`" + api + "`: file — cannot stat it (" + std::strerror(e) +
                          ") — valid: a readable program file — fix: check the path or descriptor");
  }
  if (!S_ISREG(st.st_mode)) {
    if (own) close(fd);
    raise(OPF_ERR_IO, "`" + api + "`: file — not a regular file — valid: an .opf program file — fix: pass "
                      "the program file itself");
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int e = errno;
      if (own) close(fd);
      raise(OPF_ERR_IO, "`" + api + "`: file — cannot map it (" + std::strerror(e) +
                            ") — valid: a readable, mappable program file — fix: check the file");
    }
  }
  return FileBytes::adopt_map(map, size, fd);
}

std::unique_ptr<FileBytes> FileBytes::adopt_map(void* map, size_t size, int fd) {
  std::unique_ptr<FileBytes> bytes(new FileBytes);
  bytes->map_ = map;
  bytes->map_size_ = size;
  bytes->fd_ = fd;
  bytes->data_ = static_cast<const uint8_t*>(map);
  bytes->size_ = size;
  return bytes;
}

std::unique_ptr<FileBytes> FileBytes::map_path(const std::string& path) {
  const std::string api = "opf_program_load_path(" + path + ")";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
  if (fd < 0) {
    int e = errno;
    raise(OPF_ERR_IO, "`" + api + "`: file — cannot open it (" + std::strerror(e) +
                          ") — valid: a readable program file — fix: check the path");
  }
  return map_open_fd(fd, true, api);
}

std::unique_ptr<FileBytes> FileBytes::map_fd(int fd, const std::string& label) {
  const std::string api = "opf_program_load_fd(" + label + ")";
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller keeps its fd; the mapping keeps ours
  if (own < 0) {
    int e = errno;
    raise(OPF_ERR_IO, "`" + api + "`: file descriptor — cannot use it (" + std::strerror(e) +
                          ") — valid: an open, readable descriptor of a program file — fix: pass an open fd");
  }
  return map_open_fd(own, true, api);
}

std::unique_ptr<FileBytes> FileBytes::borrow(const void* data, size_t size) {
  std::unique_ptr<FileBytes> bytes(new FileBytes);
  bytes->data_ = static_cast<const uint8_t*>(data);
  bytes->size_ = size;
  return bytes;
}

std::unique_ptr<FileBytes> FileBytes::copy(const void* data, size_t size) {
  std::unique_ptr<FileBytes> bytes(new FileBytes);
  size_t rounded = (size + 63) / 64 * 64;
  bytes->owned_ = std::aligned_alloc(64, rounded ? rounded : 64);  // segments stay 64-aligned
  if (bytes->owned_ == nullptr)
    raise(OPF_ERR_MEMORY, "`opf_program_load_buffer`: copy — " + std::to_string(size) +
                              " bytes the system could not allocate — valid: a buffer that fits in memory — "
                              "fix: pass copy = 0 to use the buffer in place");
  if (size) std::memcpy(bytes->owned_, data, size);
  bytes->data_ = static_cast<const uint8_t*>(bytes->owned_);
  bytes->size_ = size;
  return bytes;
}

FileBytes::~FileBytes() {
  if (map_ != nullptr) munmap(map_, map_size_);
  if (fd_ >= 0) close(fd_);
  std::free(owned_);
}

// --- the load pipeline ---------------------------------------------------------------

namespace {

// The dtype of an instruction's first tensor argument (loader.py dtype_key).
std::string first_dtype(const Method& m, const Instruction& ins) {
  for (uint32_t a : ins.args) {
    const Value& v = m.values[a];
    if (v.tag == ValueTag::Tensor) return dtype_name(v.tensor.dtype);
    if (v.tag == ValueTag::TensorList || v.tag == ValueTag::OptionalTensorList)
      for (uint32_t item : v.items)
        if (item != kNoTensor) return dtype_name(m.values[item].tensor.dtype);
  }
  return "default";
}

struct MissingOp {
  std::string key;
  std::vector<std::pair<std::string, std::vector<size_t>>> uses;
  std::vector<std::string> dtypes;
};

[[noreturn]] void missing_error(const std::string& api, const std::vector<MissingOp>& missing,
                                const opf_registry& registry) {
  std::string text = "`" + api + "`: " + std::to_string(missing.size()) +
                     " operator(s) have no kernel in the registry — valid: a kernel for every operator "
                     "of every method — missing:";
  bool custom = false;
  for (size_t n = 0; n < missing.size(); ++n) {
    const MissingOp& op = missing[n];
    std::string where;
    for (auto& [method, ix] : op.uses) {
      where += (where.empty() ? "" : "; ") + std::string("method '") + method + "' instruction" +
               (ix.size() > 1 ? "s " : " ");
      for (size_t j = 0; j < ix.size(); ++j) where += (j ? ", " : "") + std::to_string(ix[j]);
    }
    std::string dtypes;
    for (auto& d : op.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
    text += "\n  " + std::to_string(n + 1) + ". `" + op.key + "` (" + where + "; dtype " + dtypes + ")";
    std::vector<std::string> near = near_keys(registry, op.key);
    if (!near.empty()) {
      text += " — near names in the registry:";
      for (auto& k : near) text += " `" + k + "`";
      text += " (an overload mismatch? re-export with the same kernel set)";
    }
    custom = custom || op.key.rfind("aten::", 0) != 0;
  }
  text += "\n  fixes for all of them:\n       a) load a native kernel library that has them "
          "(opf_registry_load_library; `opforge build MANIFEST.yaml` builds one from an op's manifest)";
  text += "\n       b) run the program in the Python runtime (opforge.runtime.load), whose portable and "
          "ATen-mode kernels cover more operators";
  if (custom) text += "\n       c) for a custom op, build its manifest's kernels with `opforge build`";
  raise(OPF_ERR_MISSING_KERNEL, text);
}

// A constant (not state) where a kernel writes (loader.py _check_written).
void check_written(const std::string& api, const Method& m, size_t i, const Instruction& ins,
                   const Kernel& kernel) {
  std::vector<bool> state(m.values.size(), false);
  for (const StateSlot& s : m.state) state[s.value] = true;
  for (int32_t p = 0; p < kernel.num_args && size_t(p) < ins.args.size(); ++p) {
    if (!(kernel.kinds[p] & OPFORGE_KIND_OUT)) continue;
    uint32_t index = ins.args[p];
    const Value& v = m.values[index];
    std::vector<uint32_t> items = (v.tag == ValueTag::TensorList || v.tag == ValueTag::OptionalTensorList)
                                      ? v.items : std::vector<uint32_t>{index};
    for (uint32_t item : items) {
      if (item == kNoTensor || m.values[item].tag != ValueTag::Tensor) continue;
      StorageKind k = m.values[item].tensor.storage;
      bool constant = k == StorageKind::Constant || k == StorageKind::ConstantInt4 || k == StorageKind::ConstantSplat;
      if (constant && !state[item])
        raise(OPF_ERR_PROGRAM, "`" + api + "`: method '" + m.name + "' instruction " + std::to_string(i) + " (" +
                                   kernel.key + ") argument " + std::to_string(p) + " — value " +
                                   std::to_string(item) + ", a constant tensor, where the kernel writes its "
                                   "output — valid: an arena tensor — fix: re-export the model; a program "
                                   "whose outputs are constants was altered or corrupted");
    }
  }
}

IoInfo io_of(const Method& m, uint32_t index) {
  IoInfo io;
  const Value& v = m.values[index];
  switch (v.tag) {
    case ValueTag::Tensor:
      io.kind = OPF_VALUE_TENSOR;
      io.dtype = v.tensor.dtype;
      io.sizes = v.tensor.sizes;
      io.dim_order = v.tensor.dim_order;
      io_bounds(m, index, io.min_sizes, io.max_sizes);
      break;
    case ValueTag::Double: io.kind = OPF_VALUE_DOUBLE; break;
    case ValueTag::Bool: io.kind = OPF_VALUE_BOOL; break;
    default: io.kind = OPF_VALUE_INT; break;
  }
  return io;
}

void describe_io(const Method& m, MethodInfo& info) {
  for (uint32_t i : m.inputs) info.inputs.push_back(io_of(m, i));
  for (uint32_t i : m.outputs) info.outputs.push_back(io_of(m, i));
}

}  // namespace

opf_program* load_program(std::unique_ptr<FileBytes> bytes, const std::string& label,
                          const opf_registry* registry, const opf_load_options* options) {
  const std::string api = label;
  uint32_t flags = 0;
  int64_t requested = 0;
  if (options != nullptr) {
    if (options->struct_size < sizeof(uint32_t) * 2 + sizeof(int64_t))
      raise(OPF_ERR_INVALID_ARGUMENT, "`" + api + "`: options.struct_size — found " +
                                          std::to_string(options->struct_size) + " — valid: sizeof(opf_load_options) "
                                          "— fix: set struct_size = sizeof(opf_load_options)");
    flags = options->flags;
    requested = options->max_memory;
  }
  auto program = std::make_unique<opf_program>();
  program->label = label;
  program->registry = registry;
  program->max_memory = resolve_max_memory(requested, api);
  program->program = read_program(bytes->data(), bytes->size(), program->max_memory);
  program->bytes = std::move(bytes);
  const Program& p = program->program;
  for (const Method& m : p.methods) {
    check_memory(api, "method '" + m.name + "' memory plan (" + std::to_string(m.arena_sizes.size()) + " arena(s))",
                 arena_bytes(m), program->max_memory);
    check_memory(api, "method '" + m.name + "' instance tables (" + std::to_string(m.values.size()) + " values, " +
                          std::to_string(m.instructions.size()) + " instructions)",
                 instance_table_bytes(m), program->max_memory);
  }
  std::vector<MissingOp> missing;
  std::map<std::string, size_t> missing_at;
  for (const Method& m : p.methods) {
    MethodInfo info;
    info.method = &m;
    info.kernels.assign(m.instructions.size(), nullptr);
    info.nodes = instruction_nodes(p, m);
    for (size_t i = 0; i < m.instructions.size(); ++i) {
      const Instruction& ins = m.instructions[i];
      if (ins.kind != InstructionKind::KernelCall || (flags & OPF_LOAD_NO_KERNEL_CHECK)) continue;
      std::string key = m.operators.at(ins.index).key();
      const Kernel* kernel = registry->lookup(key);
      if (kernel == nullptr) {
        auto it = missing_at.find(key);
        if (it == missing_at.end()) {
          it = missing_at.emplace(key, missing.size()).first;
          missing.push_back(MissingOp{key, {}, {}});
        }
        MissingOp& op = missing[it->second];
        if (op.uses.empty() || op.uses.back().first != m.name) op.uses.push_back({m.name, {}});
        op.uses.back().second.push_back(i);
        std::string dtype = first_dtype(m, ins);
        if (std::find(op.dtypes.begin(), op.dtypes.end(), dtype) == op.dtypes.end()) op.dtypes.push_back(dtype);
        continue;
      }
      check_written(api, m, i, ins, *kernel);
      info.kernels[i] = kernel;
    }
    describe_io(m, info);
    program->methods.push_back(std::move(info));
  }
  if (!missing.empty()) missing_error(api, missing, *registry);
  program->state = std::make_unique<LiveState>(p, program->forms, program->max_memory, api);
  // every delegate a DelegateCall uses, initialised by its backend (backend.h)
  DelegateSet::Options delegates;
  delegates.api = api;
  delegates.file_data = program->bytes->data();
  delegates.file_size = program->bytes->size();
  delegates.file_mapped = program->bytes->mapped();
  delegates.file_fd = program->bytes->fd();
  delegates.max_memory = program->max_memory;
  delegates.kernels = [registry](const std::string& key, const opforge_arg* args, int64_t n) -> opforge_kernel_fn {
    const Kernel* kernel = registry->lookup(key);
    const Binding* binding = kernel ? kernel->select(args, n) : nullptr;
    return binding ? binding->entry->fn : nullptr;
  };
  program->delegates = std::make_unique<DelegateSet>(p, delegates);
  return program.release();
}

}  // namespace opforge::rt

const opforge::rt::MethodInfo& opf_program::method(const char* name, const std::string& api) const {
  if (name != nullptr)
    for (const auto& m : methods)
      if (m.method->name == name) return m;
  std::string names;
  for (const auto& m : methods) names += (names.empty() ? "'" : ", '") + m.method->name + "'";
  opforge::rt::raise(OPF_ERR_INVALID_ARGUMENT,
                     "`" + api + "`: method '" + (name ? name : "(NULL)") + "' — not in " + label + " — valid: " +
                         (names.empty() ? std::string("(none)") : names) +
                         " — fix: pass one of those names (opf_program_method_name)");
}
