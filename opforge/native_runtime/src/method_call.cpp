// A method instance's calls (method.h): inputs, the call loop, shapes, outputs.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "errors.h"
#include "method.h"

namespace opforge::rt {
namespace {

constexpr size_t kShapeCacheSize = 16;  // as opforge/runtime/method.py SHAPE_CACHE_SIZE

std::string shape_text(const int64_t* sizes, int32_t rank) {
  std::string text = "(";
  for (int32_t d = 0; d < rank; ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + (rank == 1 ? ",)" : ")");
}

}  // namespace

// --- inputs ---------------------------------------------------------------------------

void MethodInstance::set_input(int64_t index, const void* data, int32_t dtype, int32_t rank, const int64_t* sizes,
                               bool zero_copy) {
  // messages are made only when refusing: the accepted path allocates nothing
  auto where = [&]() { return api("opf_method_set_input"); };
  if (index < 0 || index >= int64_t(method_.inputs.size()))
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + where() + "`: input " + std::to_string(index) + " — out of range — valid: 0.." +
                                        std::to_string(int64_t(method_.inputs.size()) - 1) +
                                        " — fix: pass an input position below opf_program_method_io's count");
  const uint32_t value = method_.inputs[index];
  ValueRt& r = values_[value];
  auto subject = [&]() { return "`" + where() + "`: input " + std::to_string(index); };
  auto describe = [&]() {
    if (binder_) return std::string(dtype_name(r.dtype)) + " of shape " + binder_->describe_input(size_t(index));
    return std::string(dtype_name(r.dtype)) + " of shape " + shape_text(method_.values[value].tensor.sizes.data(), r.rank);
  };
  if (r.tag != ValueTag::Tensor)
    raise(OPF_ERR_INPUT, subject() + " — found a tensor — valid: " + tag_name_of(r.tag) +
                             " — fix: pass it with opf_method_set_input_int / _double / _bool");
  if (dtype != r.dtype)
    raise(OPF_ERR_INPUT, subject() + " — found dtype " + dtype_name(dtype) + " (" + std::to_string(dtype) +
                             ") — valid: " + describe() + " — fix: convert it to " + dtype_name(r.dtype));
  if (rank != r.rank || (rank > 0 && sizes == nullptr))
    raise(OPF_ERR_INPUT, subject() + " — found rank " + std::to_string(rank) + " — valid: " + describe() +
                             " — fix: pass a tensor of rank " + std::to_string(r.rank));
  const std::vector<int64_t>& upper = method_.values[value].tensor.sizes;
  for (int32_t d = 0; d < rank; ++d) {
    int64_t lo = binder_ ? binder_->min_size(size_t(index), size_t(d)) : upper[d];
    int64_t hi = binder_ ? binder_->max_size(size_t(index), size_t(d)) : upper[d];
    if (sizes[d] < lo || sizes[d] > hi)
      raise(OPF_ERR_INPUT, subject() + " — found shape " + shape_text(sizes, rank) + " (dimension " + std::to_string(d) +
                               " of size " + std::to_string(sizes[d]) + ") — valid: " + describe() +
                               (binder_ ? std::string("") : " (the program was exported with static shapes)") +
                               " — fix: " + (binder_ ? "pass sizes in range, or re-export with a larger max" :
                                                       "reshape the input, or re-export with the shape you need"));
  }
  int64_t numel = 1, nbytes = 0;
  bool overflow = false;
  for (int32_t d = 0; d < rank; ++d) overflow = overflow || __builtin_mul_overflow(numel, sizes[d], &numel);
  if (overflow || __builtin_mul_overflow(numel, itemsize_of(dtype), &nbytes) || nbytes > kMaxTensorBytes)
    raise(OPF_ERR_INPUT, subject() + " — found shape " + shape_text(sizes, rank) + ", more than 2**48 bytes — valid: "
                             "a tensor a program can hold — fix: pass smaller sizes");
  if (nbytes > 0 && data == nullptr)
    raise(OPF_ERR_INVALID_ARGUMENT, subject() + " — found data NULL — valid: " + std::to_string(nbytes) +
                                        " bytes — fix: pass the tensor's data");
  if (zero_copy) {
    if (reinterpret_cast<uintptr_t>(data) % kAlignment)
      raise(OPF_ERR_INPUT, subject() + " — found data at an address not 64-byte aligned — valid: zero-copy data "
                               "64-byte aligned — fix: allocate it with aligned_alloc(64, n), or pass zero_copy = 0");
    point(r, static_cast<uint8_t*>(const_cast<void*>(data)));
  } else {
    if (r.growing && nbytes > r.capacity)
      ensure_capacity(value, nbytes, "input " + std::to_string(index) + " at shape " + shape_text(sizes, rank),
                      "opf_method_set_input");
    if (nbytes > r.capacity)
      raise(OPF_ERR_INTERNAL, subject() + " — " + std::to_string(nbytes) + " bytes over its slot's " +
                                  std::to_string(r.capacity) + " — a bug in opforge: please report it");
    if (nbytes) std::memcpy(r.home, data, static_cast<size_t>(nbytes));
    if (r.data != r.home) point(r, r.home);
  }
  if (binder_) {
    std::copy(sizes, sizes + rank, r.sizes.begin());
    dense_strides(r.sizes.data(), r.dim_order, r.rank, r.strides.data());
  }
  input_set_[index] = true;
}

void MethodInstance::set_input_scalar(int64_t index, ValueTag tag, int64_t i, double d) {
  auto where = [&]() { return api("opf_method_set_input"); };
  if (index < 0 || index >= int64_t(method_.inputs.size()))
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + where() + "`: input " + std::to_string(index) + " — out of range — valid: 0.." +
                                        std::to_string(int64_t(method_.inputs.size()) - 1) +
                                        " — fix: pass an input position below opf_program_method_io's count");
  ValueRt& r = values_[method_.inputs[index]];
  bool ok = r.tag == tag || (r.tag == ValueTag::Double && tag == ValueTag::Int);
  if (!ok)
    raise(OPF_ERR_INPUT, "`" + where() + "`: input " + std::to_string(index) + " — found " + tag_name_of(tag) +
                             " — valid: " + tag_name_of(r.tag) + " — fix: use the setter of that kind "
                             "(opf_method_set_input for a tensor)");
  if (r.tag == ValueTag::Double) r.d = tag == ValueTag::Int ? double(i) : d;
  else r.i = tag == ValueTag::Bool ? (i != 0) : i;
  write_scalar(r);  // the kernels reading it see the new value: no rebinding needed
  input_set_[index] = true;
}

// --- dynamic shapes -------------------------------------------------------------------

void MethodInstance::select_shape() {
  key_.clear();
  std::vector<const int64_t*>& sizes = input_sizes_;  // sized once: a call allocates nothing here
  sizes.assign(method_.inputs.size(), nullptr);
  for (size_t p = 0; p < method_.inputs.size(); ++p) {
    const ValueRt& r = values_[method_.inputs[p]];
    if (r.tag != ValueTag::Tensor) continue;
    key_.insert(key_.end(), r.sizes.begin(), r.sizes.end());
    sizes[p] = r.sizes.data();
  }
  // the current shape, fully applied (a growth refused last time is tried again): nothing to do
  if (shape_ready_ && shapes_.back().key == key_) return;
  shape_ready_ = false;
  auto hit = std::find_if(shapes_.begin(), shapes_.end(), [&](const ShapeEntry& e) { return e.key == key_; });
  if (hit != shapes_.end()) {
    std::rotate(hit, hit + 1, shapes_.end());  // most recently used last
  } else {
    ShapeEntry entry;
    entry.key = key_;
    binder_->bind(api("opf_method_execute"), sizes, entry.env);
    binder_->evaluate(api("opf_method_execute"), entry.env, entry.sizes);
    if (shapes_.size() >= kShapeCacheSize) shapes_.erase(shapes_.begin());
    shapes_.push_back(std::move(entry));
  }
  apply_sizes(shapes_.back().sizes);
  grow(shapes_.back().env);
  shape_ready_ = true;
}

void MethodInstance::apply_sizes(const std::vector<int64_t>& sizes) {
  size_t at = 0;
  for (const SymbolicValue& sv : method_.symbolic_values) {
    ValueRt& r = values_[sv.value];
    const size_t n = sv.exprs.size();
    if (r.tag == ValueTag::Tensor) {
      std::copy(sizes.begin() + at, sizes.begin() + at + n, r.sizes.begin());
      dense_strides(r.sizes.data(), r.dim_order, r.rank, r.strides.data());
    } else if (r.tag == ValueTag::Int) {
      r.i = sizes[at];
      write_scalar(r);
    } else if (r.tag == ValueTag::IntList) {
      std::copy(sizes.begin() + at, sizes.begin() + at + n, r.ints.begin());
    }
    at += n;
  }
}

// Growing tensors (opforge/runtime/growth.py): a buffer that holds this call's sizes.
void MethodInstance::grow(const std::vector<int64_t>& env) {
  for (uint32_t index : binder_->growing()) {
    ValueRt& r = values_[index];
    if (r.data != r.home) continue;  // an input given zero-copy
    int64_t need = checked_mul(numel_of(r.sizes), itemsize_of(r.dtype), "a growing tensor's bytes");
    if (need <= r.capacity) continue;
    std::string bound;
    for (size_t s = 0; s < env.size(); ++s)
      bound += (s ? ", " : "") + method_.symbols[s].name + "=" + std::to_string(env[s]);
    ensure_capacity(index, need, "at " + bound, "opf_method_execute");
  }
}

void MethodInstance::ensure_capacity(uint32_t index, int64_t need, const std::string& why, const char* function) {
  ValueRt& r = values_[index];
  if (need <= r.capacity) return;
  const int64_t others = checked_add(arena_bytes(method_), grown_bytes_ - r.grown.size(), "bytes");
  const int64_t least = checked_add(others, need, "bytes");
  check_memory(api(function), "method '" + method_.name + "' growing tensor values[" +
                                              std::to_string(index) + "] " + why,
               least, limit_, "1. call with smaller sizes; 2. raise the memory limit: opf_load_options.max_memory "
                              "or OPFORGE_MAX_MEMORY=N");
  // doubling where the limit allows, the bare need where not
  int64_t extra = std::min(std::max<int64_t>(2 * r.grown.size() - need, 0), limit_ - least);
  AlignedBuffer bigger(need + extra, "method '" + method_.name + "' values[" + std::to_string(index) +
                                         "] (a growing tensor)");
  grown_bytes_ += bigger.size() - r.grown.size();
  r.grown = std::move(bigger);
  update_kernel_budget();
  r.home = r.grown.data();
  r.capacity = r.grown.size();
  point(r, r.home);
  ++growths;
}

// The kernels' scratch may take what the limit leaves after the arenas and growing
// buffers (the same sum ensure_capacity holds to the limit).
void MethodInstance::update_kernel_budget() {
  services_.workspace_limit = std::max<int64_t>(limit_ - arena_bytes(method_) - grown_bytes_, 0);
}

// --- the call -------------------------------------------------------------------------

void MethodInstance::execute() {
  for (size_t p = 0; p < input_set_.size(); ++p)
    if (!input_set_[p])
      raise(OPF_ERR_INPUT, "`" + api("opf_method_execute") + "`: input " + std::to_string(p) +
                               " — not set — valid: every input set since the instance was made (" +
                               std::to_string(input_set_.size()) + ") — fix: call opf_method_set_input for it");
  if (binder_) select_shape();
  if (binder_ && !binder_->producers().empty()) {
    run_producing();  // sizes an instruction produces: bound mid-call
    return;
  }
  if (profiling_) {
    run_profiled();
    return;
  }
  const BoundCall* bound = bound_.data();
  const size_t n = bound_.size();
  for (size_t k = 0; k < n; ++k) {
    bound[k].fn(&ctx_, bound[k].args, bound[k].n);
    if (ctx_.status) kernel_failed(k);
  }
}

void MethodInstance::run_profiled() {
  using clock = std::chrono::steady_clock;
  std::fill(last_ns_.begin(), last_ns_.end(), -1);
  for (size_t k = 0; k < bound_.size(); ++k) {
    auto start = clock::now();
    bound_[k].fn(&ctx_, bound_[k].args, bound_[k].n);
    last_ns_[bound_instruction_[k]] =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count();
    if (ctx_.status) kernel_failed(k);
  }
}

void MethodInstance::kernel_failed(size_t position) {
  ctx_.message[OPFORGE_MESSAGE_SIZE - 1] = 0;
  std::string message = ctx_.message[0] ? ctx_.message : "(no message)";
  ctx_.status = 0;
  ctx_.message[0] = 0;
  const uint32_t i = bound_instruction_[position];
  const Kernel* kernel = info_.kernels[i];
  const std::string& node = info_.nodes[i];
  std::string source = kernel ? kernel->key + ", kernel from " + kernel->origin : labels_[i];  // "move", "delegate cpu"
  std::string shapes;
  const BoundCall& b = bound_[position];
  for (int64_t p = 0; p < b.n; ++p)
    if (b.args[p].tag == OPFORGE_ARG_TENSOR)
      shapes += (shapes.empty() ? "" : ", ") + std::string(dtype_name(b.args[p].v.tensor.dtype)) +
                shape_text(b.args[p].v.tensor.sizes, b.args[p].v.tensor.rank);
  raise(OPF_ERR_KERNEL, "`" + api("opf_method_execute") + "`: instruction " + std::to_string(i) + " (" + source +
                            (node.empty() ? "" : ", node '" + node + "'") + ") — reported: " + message +
                            (shapes.empty() ? "" : " — tensor arguments: (" + shapes + ")") +
                            " — fix: check the inputs' values; if they are valid, the kernel has a bug (compare with "
                            "the Python runtime, opforge.runtime.load)");
}

// --- outputs --------------------------------------------------------------------------

void MethodInstance::output(int64_t index, opf_tensor_view* out) const {
  auto where = [&]() { return api("opf_method_output"); };
  if (index < 0 || index >= int64_t(method_.outputs.size()))
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + where() + "`: output " + std::to_string(index) + " — out of range — valid: 0.." +
                                        std::to_string(int64_t(method_.outputs.size()) - 1) + " — fix: pass a position "
                                        "below opf_program_method_io's output count");
  const ValueRt& r = values_[method_.outputs[index]];
  if (r.tag != ValueTag::Tensor)
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + where() + "`: output " + std::to_string(index) + " — is " + tag_name_of(r.tag) +
                                        " — valid: a tensor output — fix: read it with opf_method_output_scalar");
  out->data = r.data;
  out->dtype = r.dtype;
  out->rank = r.rank;
  out->sizes = r.sizes.data();
  out->nbytes = numel_of(r.sizes) * itemsize_of(r.dtype);
}

void MethodInstance::output_scalar(int64_t index, int32_t* kind, int64_t* i, double* d) const {
  auto where = [&]() { return api("opf_method_output_scalar"); };
  if (index < 0 || index >= int64_t(method_.outputs.size()))
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + where() + "`: output " + std::to_string(index) + " — out of range — valid: 0.." +
                                        std::to_string(int64_t(method_.outputs.size()) - 1) + " — fix: pass a position "
                                        "below opf_program_method_io's output count");
  const ValueRt& r = values_[method_.outputs[index]];
  int32_t k = r.tag == ValueTag::Double ? OPF_VALUE_DOUBLE : r.tag == ValueTag::Bool ? OPF_VALUE_BOOL
            : r.tag == ValueTag::Int ? OPF_VALUE_INT : -1;
  if (k < 0)
    raise(OPF_ERR_INVALID_ARGUMENT, "`" + where() + "`: output " + std::to_string(index) + " — is " + tag_name_of(r.tag) +
                                        " — valid: an int, double or bool output — fix: read a tensor with "
                                        "opf_method_output");
  if (kind) *kind = k;
  if (i) *i = r.i;
  if (d) *d = r.d;
}

}  // namespace opforge::rt
