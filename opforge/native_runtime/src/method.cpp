// A method instance (method.h): making values, binding instructions, calls.
#include "method.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "backend.h"
#include "errors.h"
#include "moves.h"

namespace opforge::rt {

const char* tag_name_of(ValueTag tag) {
  switch (tag) {
    case ValueTag::None: return "None";
    case ValueTag::Int: return "an int";
    case ValueTag::Double: return "a double";
    case ValueTag::Bool: return "a bool";
    case ValueTag::String: return "a string";
    case ValueTag::IntList: return "an int list";
    case ValueTag::DoubleList: return "a double list";
    case ValueTag::BoolList: return "a bool list";
    case ValueTag::Tensor: return "a tensor";
    case ValueTag::TensorList: return "a tensor list";
    case ValueTag::OptionalTensorList: return "an optional-tensor list";
    case ValueTag::ScalarType: return "a scalar type";
  }
  return "an unknown value";
}

namespace {

const char* kind_name(int32_t base) {
  switch (base) {
    case OPFORGE_ARG_NONE: return "None (Layout, Device, MemoryFormat)";
    case OPFORGE_ARG_TENSOR: return "Tensor";
    case OPFORGE_ARG_TENSOR_LIST: return "Tensor[]";
    case OPFORGE_ARG_OPT_TENSOR_LIST: return "Tensor?[]";
    case OPFORGE_ARG_INT: return "int";
    case OPFORGE_ARG_DOUBLE: return "float";
    case OPFORGE_ARG_BOOL: return "bool";
    case OPFORGE_KIND_SCALAR: return "Scalar";
    case OPFORGE_ARG_SCALAR_TYPE: return "ScalarType";
    case OPFORGE_ARG_INT_LIST: return "int[]";
    case OPFORGE_ARG_DOUBLE_LIST: return "float[]";
    case OPFORGE_ARG_BOOL_LIST: return "bool[]";
    case OPFORGE_ARG_STRING: return "str";
    default: return "an unknown kind";
  }
}

alignas(64) uint8_t kEmpty[64];  // where zero-byte tensors point

}  // namespace

std::string MethodInstance::api(const char* function) const {
  return std::string(function) + "('" + method_.name + "')";
}

MethodInstance::MethodInstance(opf_program* program, const MethodInfo& info, const opf_method_options* options)
    : program_(program), info_(info), method_(*info.method) {
  const std::string where = api("opf_method_new");
  limit_ = program->max_memory;
  if (options != nullptr) {
    if (options->struct_size < sizeof(opf_method_options))
      raise(OPF_ERR_INVALID_ARGUMENT, "`" + where + "`: options.struct_size — found " +
                                          std::to_string(options->struct_size) +
                                          " — valid: sizeof(opf_method_options) — fix: set it so");
  }
  num_threads = resolve_num_threads(options != nullptr ? options->num_threads : 0, where);
  for (size_t i = 0; i < method_.instructions.size(); ++i)
    if (method_.instructions[i].kind == InstructionKind::KernelCall && info.kernels[i] == nullptr)
      raise(OPF_ERR_MISSING_KERNEL, "`" + where + "`: instruction " + std::to_string(i) + " (" +
                                        method_.operators[method_.instructions[i].index].key() +
                                        ") — has no kernel (the program was loaded with OPF_LOAD_NO_KERNEL_CHECK) "
                                        "— valid: a kernel for every operator — fix: load it without that flag "
                                        "to see every missing operator, and add a library that has them");
  if (!method_.symbols.empty()) binder_ = std::make_unique<ShapeBinder>(method_);
  // memory: the arenas and the first buffers of growing tensors, within the limit
  int64_t needed = arena_bytes(method_);
  if (binder_)
    for (uint32_t index : binder_->growing()) {
      const TensorDef& t = method_.values[index].tensor;
      needed = checked_add(needed, std::max<int64_t>(checked_mul(numel_of(t.sizes), itemsize_of(t.dtype), "bytes"),
                                                      kAlignment), "bytes");
    }
  bool caller_memory = options != nullptr && options->num_arenas != 0;
  check_memory(where, "method '" + method_.name + "' memory plan (" + std::to_string(method_.arena_sizes.size()) +
                          " arena(s))" + (binder_ && !binder_->growing().empty() ? " and growing tensors" : ""),
               caller_memory ? needed - arena_bytes(method_) : needed, limit_);
  if (caller_memory) {
    if (options->num_arenas != int64_t(method_.arena_sizes.size()) || options->arenas == nullptr ||
        options->arena_sizes == nullptr)
      raise(OPF_ERR_INVALID_ARGUMENT, "`" + where + "`: options.num_arenas — found " +
                                          std::to_string(options->num_arenas) + " — valid: 0, or " +
                                          std::to_string(method_.arena_sizes.size()) +
                                          " with as many arenas and sizes — fix: size them with "
                                          "opf_program_arena_sizes");
    for (size_t k = 0; k < method_.arena_sizes.size(); ++k) {
      uintptr_t address = reinterpret_cast<uintptr_t>(options->arenas[k]);
      if ((options->arenas[k] == nullptr && method_.arena_sizes[k] > 0) || address % kAlignment ||
          options->arena_sizes[k] < method_.arena_sizes[k])
        raise(OPF_ERR_INVALID_ARGUMENT,
              "`" + where + "`: arena " + std::to_string(k) + " — found " + std::to_string(options->arena_sizes[k]) +
                  " bytes at address " + std::to_string(address) + " — valid: at least " +
                  std::to_string(method_.arena_sizes[k]) + " bytes, 64-byte aligned — fix: allocate it with "
                  "aligned_alloc(64, size) and the size opf_program_arena_sizes gives");
      arenas_.push_back(static_cast<uint8_t*>(options->arenas[k]));
    }
  } else {
    for (size_t k = 0; k < method_.arena_sizes.size(); ++k) {
      own_arenas_.emplace_back(method_.arena_sizes[k], "method '" + method_.name + "' arena " + std::to_string(k));
      arenas_.push_back(own_arenas_.back().data());
    }
  }
  make_values();
  bind_instructions();
  // the kernels' services: threads, and what the limit leaves for their scratch
  if (num_threads > 1) {
    pool_ = std::make_unique<ThreadPool>(num_threads);
    services_.pool = pool_.get();
    services_.parallel_for = &ThreadPool::parallel_for;
  }
  services_.num_threads = num_threads;
  update_kernel_budget();
  ctx_.runtime = &services_;
  input_set_.assign(method_.inputs.size(), false);
  last_ns_.assign(method_.instructions.size(), -1);
}

void MethodInstance::make_values() {
  const size_t n = method_.values.size();
  values_.resize(n);  // never resized again: pointers into it stay valid
  std::vector<const StateTensor*> state(n, nullptr);
  for (const StateSlot& slot : method_.state) state[slot.value] = program_->state->find(slot.name);
  std::vector<bool> growing(n, false);
  if (binder_)
    for (uint32_t index : binder_->growing()) growing[index] = true;
  for (size_t index = 0; index < n; ++index) {
    const Value& v = method_.values[index];
    ValueRt& r = values_[index];
    r.tag = v.tag;
    switch (v.tag) {
      case ValueTag::Tensor: {
        const TensorDef& t = v.tensor;
        r.dtype = t.dtype;
        r.rank = static_cast<int32_t>(t.sizes.size());
        r.sizes = t.sizes;
        r.strides.assign(t.sizes.size(), 1);
        r.dim_order = t.dim_order.data();
        dense_strides(r.sizes.data(), r.dim_order, r.rank, r.strides.data());
        int64_t nbytes = checked_mul(numel_of(t.sizes), itemsize_of(t.dtype), "a tensor's bytes");
        if (state[index] != nullptr) {
          r.home = state[index]->data;
          r.capacity = state[index]->nbytes;
        } else if (t.storage == StorageKind::Arena) {
          r.home = arenas_.at(t.storage_index) + t.storage_offset;
          r.capacity = nbytes;
        } else if (t.storage == StorageKind::None) {
          if (growing[index]) {
            r.growing = true;
            r.grown = AlignedBuffer(std::max(nbytes, kAlignment), "method '" + method_.name + "' values[" +
                                                                  std::to_string(index) + "] (a growing tensor)");
            grown_bytes_ += r.grown.size();
            r.home = r.grown.data();
            r.capacity = r.grown.size();
          } else if (nbytes == 0) {
            r.home = kEmpty;
          } else {
            raise(OPF_ERR_PROGRAM, "`" + api("opf_method_new") + "`: values[" + std::to_string(index) +
                                       "] — a tensor of " + std::to_string(nbytes) + " bytes without storage — "
                                       "valid: every tensor with bytes planned into an arena or stored as a constant "
                                       "— fix: export with memory planning (the default)");
          }
        } else {  // read-only constants: the written-argument check at load keeps kernels off them
          r.home = const_cast<uint8_t*>(program_->forms.data(program_->program, t, limit_));
          r.capacity = nbytes;
        }
        r.data = r.home;
        break;
      }
      case ValueTag::Int: case ValueTag::Bool: case ValueTag::ScalarType: r.i = v.i; break;
      case ValueTag::Double: r.d = v.d; break;
      case ValueTag::IntList: r.ints = v.ints; break;
      case ValueTag::BoolList:
        for (int64_t b : v.ints) r.bools.push_back(b ? 1 : 0);
        break;
      case ValueTag::DoubleList: r.doubles = v.doubles; break;
      default: break;
    }
  }
  // lists refer to tensors made above
  for (size_t index = 0; index < n; ++index) {
    const Value& v = method_.values[index];
    if (v.tag != ValueTag::TensorList && v.tag != ValueTag::OptionalTensorList) continue;
    ValueRt& r = values_[index];
    r.tensors.resize(v.items.size());
    for (size_t k = 0; k < v.items.size(); ++k) {
      opforge_tensor& t = r.tensors[k];
      if (v.items[k] == kNoTensor) {
        t = opforge_tensor{nullptr, nullptr, nullptr, -1, 0};
        continue;
      }
      ValueRt& item = values_[v.items[k]];
      t = opforge_tensor{item.data, item.sizes.data(), item.strides.data(), item.dtype, item.rank};
      item.views.push_back(&t);
    }
  }
}

void MethodInstance::fill_arg(opforge_arg& arg, int32_t kind, uint32_t index, size_t instruction, int32_t position) {
  const int32_t base = kind & 0xFF;
  const bool optional = (kind & OPFORGE_KIND_OPTIONAL) != 0;
  ValueRt& r = values_[index];
  const Value& v = method_.values[index];
  arg = opforge_arg{};
  auto refuse = [&]() {
    const Kernel* kernel = info_.kernels[instruction];
    raise(OPF_ERR_PROGRAM, "`" + api("opf_method_new") + "`: instruction " + std::to_string(instruction) + " (" +
                               (kernel ? kernel->key : "move") + ") argument " + std::to_string(position) +
                               " — value " + std::to_string(index) + " is " + tag_name_of(v.tag) + " — valid: " +
                               kind_name(base) + (optional ? " or None" : "") + " as the kernel declares" +
                               (kernel && !kernel->schema.empty() ? " (" + kernel->schema + ")" : "") +
                               " — fix: re-export the program with this opforge, or rebuild the kernel library "
                               "from the op's manifest");
  };
  if (v.tag == ValueTag::None) {
    if (!optional && base != OPFORGE_ARG_NONE) refuse();
    arg.tag = OPFORGE_ARG_NONE;
    return;
  }
  switch (base) {
    case OPFORGE_ARG_TENSOR:
      // ATen's wrapped number: torch.export leaves `x * 0.5` as aten::mul.Tensor with a
      // number where the schema says Tensor; it reaches the kernel as its scalar (the
      // portable kernels take it as a 0-d tensor of ATen's wrapped-number dtype; a
      // kernel that does not refuses it with its own message)
      if ((v.tag == ValueTag::Int || v.tag == ValueTag::Double || v.tag == ValueTag::Bool) &&
          !(kind & OPFORGE_KIND_OUT)) {
        r.scalar_refs.push_back(ArgRef{&arg, OPFORGE_KIND_SCALAR});
        write_scalar(r);
        return;
      }
      if (v.tag != ValueTag::Tensor) refuse();
      arg.tag = OPFORGE_ARG_TENSOR;
      arg.v.tensor = opforge_tensor{r.data, r.sizes.data(), r.strides.data(), r.dtype, r.rank};
      r.views.push_back(&arg.v.tensor);
      return;
    case OPFORGE_ARG_TENSOR_LIST: case OPFORGE_ARG_OPT_TENSOR_LIST:
      if (v.tag != ValueTag::TensorList && v.tag != ValueTag::OptionalTensorList) refuse();
      if (v.tag == ValueTag::OptionalTensorList && base == OPFORGE_ARG_TENSOR_LIST &&
          std::find(v.items.begin(), v.items.end(), kNoTensor) != v.items.end())
        refuse();
      arg.tag = base;
      arg.v.list.data = r.tensors.data();
      arg.v.list.size = static_cast<int64_t>(r.tensors.size());
      return;
    case OPFORGE_ARG_INT: case OPFORGE_ARG_DOUBLE: case OPFORGE_ARG_BOOL: case OPFORGE_KIND_SCALAR:
    case OPFORGE_ARG_NONE:
      if (v.tag != ValueTag::Int && v.tag != ValueTag::Bool && !(v.tag == ValueTag::Double &&
                                                                 (base == OPFORGE_ARG_DOUBLE || base == OPFORGE_KIND_SCALAR)))
        refuse();
      r.scalar_refs.push_back(ArgRef{&arg, base});
      write_scalar(r);
      return;
    case OPFORGE_ARG_SCALAR_TYPE:
      if (v.tag != ValueTag::ScalarType) refuse();
      arg.tag = OPFORGE_ARG_SCALAR_TYPE;
      arg.v.i = r.i;
      return;
    case OPFORGE_ARG_INT_LIST:
      if (v.tag != ValueTag::IntList) refuse();
      arg.tag = base;
      arg.v.list.data = r.ints.data();
      arg.v.list.size = static_cast<int64_t>(r.ints.size());
      return;
    case OPFORGE_ARG_DOUBLE_LIST:
      if (v.tag != ValueTag::DoubleList) refuse();
      arg.tag = base;
      arg.v.list.data = r.doubles.data();
      arg.v.list.size = static_cast<int64_t>(r.doubles.size());
      return;
    case OPFORGE_ARG_BOOL_LIST:
      if (v.tag != ValueTag::BoolList) refuse();
      arg.tag = base;
      arg.v.list.data = r.bools.data();
      arg.v.list.size = static_cast<int64_t>(r.bools.size());
      return;
    case OPFORGE_ARG_STRING:
      if (v.tag != ValueTag::String) refuse();
      arg.tag = base;
      arg.v.list.data = v.s.data();
      arg.v.list.size = static_cast<int64_t>(v.s.size());
      return;
    default:
      refuse();
  }
}

// Write a scalar value into every argument slot that holds it, by the parameter's kind.
void MethodInstance::write_scalar(ValueRt& r) {
  const bool is_double = r.tag == ValueTag::Double;
  for (const ArgRef& ref : r.scalar_refs) {
    opforge_arg& arg = *ref.arg;
    switch (ref.kind) {
      case OPFORGE_ARG_DOUBLE:
        arg.tag = OPFORGE_ARG_DOUBLE;
        arg.v.d = is_double ? r.d : double(r.i);
        break;
      case OPFORGE_ARG_BOOL:
        arg.tag = OPFORGE_ARG_BOOL;
        arg.v.i = r.i != 0;
        break;
      case OPFORGE_KIND_SCALAR:
        if (is_double) { arg.tag = OPFORGE_ARG_DOUBLE; arg.v.d = r.d; }
        else { arg.tag = r.tag == ValueTag::Bool ? OPFORGE_ARG_BOOL : OPFORGE_ARG_INT; arg.v.i = r.i; }
        break;
      default:
        arg.tag = r.tag == ValueTag::Bool && ref.kind == OPFORGE_ARG_NONE ? OPFORGE_ARG_BOOL : OPFORGE_ARG_INT;
        arg.v.i = r.i;
    }
  }
}

int64_t instance_table_bytes(const Method& method) {
  uint64_t args = 0;
  for (const Instruction& ins : method.instructions) args += ins.args.size() + 2;
  const uint64_t per_instruction = sizeof(std::string) + sizeof(int64_t) + sizeof(BoundCall) + sizeof(uint32_t);
  // at most 2**32 of each, a few hundred bytes apiece: no overflow in 64 bits
  return static_cast<int64_t>(method.values.size() * sizeof(ValueRt) + args * sizeof(opforge_arg) +
                              method.instructions.size() * per_instruction);
}

void MethodInstance::bind_instructions() {
  size_t total = 0;
  for (const Instruction& ins : method_.instructions)
    total += ins.kind == InstructionKind::KernelCall     ? ins.args.size()
             : ins.kind == InstructionKind::DelegateCall ? ins.args.size() + 1
             : ins.kind == InstructionKind::Move         ? 2 : 0;
  args_.resize(total);  // never resized again
  labels_.resize(method_.instructions.size());
  size_t at = 0;
  for (size_t i = 0; i < method_.instructions.size(); ++i) {
    const Instruction& ins = method_.instructions[i];
    if (ins.kind == InstructionKind::Free) {
      labels_[i] = "free";  // planned arenas: nothing to release
      continue;
    }
    if (ins.kind == InstructionKind::Move) {
      labels_[i] = "move";
      if (binder_ && std::any_of(binder_->producers().begin(), binder_->producers().end(),
                                 [&](const Producer& p) { return p.instruction == i && p.dim < 0; })) {
        // item() as a size: nothing to copy, the call reads the element (run_producing)
        bound_.push_back(BoundCall{read_size_kernel, &args_[at], 0});
        bound_instruction_.push_back(static_cast<uint32_t>(i));
        at += 2;
        continue;
      }
      for (uint32_t index : {ins.index, ins.dst})
        if (method_.values[index].tag != ValueTag::Tensor)
          raise(OPF_ERR_PROGRAM, "`" + api("opf_method_new") + "`: instruction " + std::to_string(i) +
                                     " (Move) — value " + std::to_string(index) + " is " +
                                     tag_name_of(method_.values[index].tag) + " — valid: a Move between tensors — "
                                     "fix: re-export the program");
      opforge_arg* args = &args_[at];
      fill_arg(args[0], OPFORGE_ARG_TENSOR, ins.index, i, 0);
      fill_arg(args[1], OPFORGE_ARG_TENSOR | OPFORGE_KIND_OUT, ins.dst, i, 1);
      bound_.push_back(BoundCall{move_kernel, args, 2});
      bound_instruction_.push_back(static_cast<uint32_t>(i));
      at += 2;
      continue;
    }
    if (ins.kind == InstructionKind::DelegateCall) {
      // the delegate's handle (made at load) as a kernel-ABI call: args[0] names it, then
      // the call's tensors, inputs then outputs (backend.h); outputs not constants but state
      DelegateSet& set = *program_->delegates;
      labels_[i] = "delegate " + set.id(ins.index);
      const int64_t n_in = set.num_inputs(ins.index);
      if (int64_t(ins.args.size()) != n_in + set.num_outputs(ins.index))
        set.call(ins.index, static_cast<const opforge_arg*>(nullptr), int64_t(ins.args.size()));  // its message
      opforge_arg* args = &args_[at];
      args[0] = delegate_call_arg(&set, ins.index);
      for (size_t p = 0; p < ins.args.size(); ++p) {
        const Value& v = method_.values[ins.args[p]];
        bool state = std::any_of(method_.state.begin(), method_.state.end(),
                                 [&](const StateSlot& s) { return s.value == ins.args[p]; });
        bool constant = v.tensor.storage == StorageKind::Constant || v.tensor.storage == StorageKind::ConstantInt4 ||
                        v.tensor.storage == StorageKind::ConstantSplat;
        if (v.tag != ValueTag::Tensor || (int64_t(p) >= n_in && !state && constant))
          raise(OPF_ERR_PROGRAM, "`" + api("opf_method_new") + "`: instruction " + std::to_string(i) +
                                     " (DelegateCall " + std::to_string(ins.index) + ") argument " + std::to_string(p) +
                                     " — value " + std::to_string(ins.args[p]) + " is " + tag_name_of(v.tag) +
                                     (constant ? ", a constant" : "") + " — valid: tensors, the outputs in an arena "
                                     "or state — fix: re-export the program");
        fill_arg(args[p + 1], OPFORGE_ARG_TENSOR, ins.args[p], i, static_cast<int32_t>(p));
      }
      bound_.push_back(BoundCall{delegate_call_kernel, args, static_cast<int64_t>(ins.args.size()) + 1});
      bound_instruction_.push_back(static_cast<uint32_t>(i));
      at += ins.args.size() + 1;
      continue;
    }
    const Kernel* kernel = info_.kernels[i];
    labels_[i] = kernel->key;
    if (int64_t(ins.args.size()) != kernel->num_args)
      raise(OPF_ERR_KERNEL, "`" + api("opf_method_new") + "`: instruction " + std::to_string(i) + " (" +
                                kernel->key + ") — found " + std::to_string(ins.args.size()) +
                                " arguments — valid: " + std::to_string(kernel->num_args) + " as the kernel from " +
                                kernel->origin + " declares (" + kernel->schema + ") — fix: re-export the program, "
                                "or rebuild the library from the op's manifest");
    opforge_arg* args = &args_[at];
    for (size_t p = 0; p < ins.args.size(); ++p)
      fill_arg(args[p], kernel->kinds[p], ins.args[p], i, static_cast<int32_t>(p));
    const Binding* binding = kernel->select(args, static_cast<int64_t>(ins.args.size()));
    if (binding == nullptr) {
      std::string found, wanted;
      for (size_t p = 0; p < ins.args.size(); ++p)
        if (args[p].tag == OPFORGE_ARG_TENSOR)
          found += (found.empty() ? "" : ", ") + std::string(dtype_name(args[p].v.tensor.dtype));
      for (const Binding& b : kernel->specific) wanted += (wanted.empty() ? "" : "; ") + std::string(b.entry->dtype_key);
      raise(OPF_ERR_KERNEL, "`" + api("opf_method_new") + "`: instruction " + std::to_string(i) + " (" + kernel->key +
                                ", native, " + kernel->origin + ") — no kernel for these dtypes — found " + found +
                                " — valid: " + wanted + " — fix: add a fallback kernel (arg_meta: null) to the "
                                "manifest, or convert the inputs");
    }
    bound_.push_back(BoundCall{binding->entry->fn, args, static_cast<int64_t>(ins.args.size())});
    bound_instruction_.push_back(static_cast<uint32_t>(i));
    at += ins.args.size();
  }
}

// Point every view of a tensor at `data`.
void MethodInstance::point(ValueRt& r, uint8_t* data) {
  r.data = data;
  for (opforge_tensor* t : r.views) t->data = data;
}

void MethodInstance::profile(int64_t index, const char** label, const char** node, int64_t* last_ns) const {
  if (label) *label = labels_[index].c_str();
  if (node) *node = info_.nodes[index].c_str();
  if (last_ns) *last_ns = last_ns_[index];
}

}  // namespace opforge::rt
