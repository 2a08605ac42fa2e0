// A call of a method with data-dependent sizes (method.h, produced.h; the Python runtime's
// opforge/runtime/produced.py). select_shape() bound the inputs' symbols and left each
// produced symbol at its max, so a producer's out is its whole slot. After each producer
// runs, its symbol is read (the out's size the kernel set, or the Move's element), checked
// against its range and the guards it completes, and every symbolic value's sizes are
// evaluated and applied again: the views the later instructions read follow it. The slots
// do not move, so what earlier instructions wrote stays where later ones read it.
#include <chrono>
#include <cstring>

#include "errors.h"
#include "method.h"

namespace opforge::rt {
namespace {

int64_t read_integer(const uint8_t* p, int32_t dtype) {
  switch (dtype) {
    case 0: return *p;
    case 1: return static_cast<int8_t>(*p);
    case 2: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case 3: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case 27: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 28: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    default: { int64_t v; std::memcpy(&v, p, 8); return v; }  // int64; uint64 past int64 reads negative: refused
  }
}

}  // namespace

void MethodInstance::run_producing() {
  using clock = std::chrono::steady_clock;
  shape_ready_ = false;  // sizes change below: the next call applies its shape again
  const std::vector<Producer>& producers = binder_->producers();
  produced_env_ = shapes_.back().env;
  if (profiling_) std::fill(last_ns_.begin(), last_ns_.end(), -1);
  size_t next = 0;
  for (size_t k = 0; k < bound_.size(); ++k) {
    auto start = profiling_ ? clock::now() : clock::time_point{};
    bound_[k].fn(&ctx_, bound_[k].args, bound_[k].n);
    if (profiling_)
      last_ns_[bound_instruction_[k]] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count();
    if (ctx_.status) kernel_failed(k);
    const uint32_t i = bound_instruction_[k];
    bool produced = false;
    for (; next < producers.size() && producers[next].instruction == i; ++next) {
      const Producer& p = producers[next];
      const ValueRt& r = values_[p.value];
      const int64_t value = p.dim < 0 ? read_integer(r.data, r.dtype) : r.sizes[size_t(p.dim)];
      const std::string source = p.dim < 0
          ? "the value of tensor " + std::to_string(p.value) + ", instruction " + std::to_string(i) + ", move"
          : "dimension " + std::to_string(p.dim) + " of its result, instruction " + std::to_string(i) + ", " + labels_[i];
      binder_->check_produced(api("opf_method_execute"), next, value, source, produced_env_);
      produced = true;
    }
    if (produced) {
      binder_->evaluate(api("opf_method_execute"), produced_env_, produced_sizes_);
      apply_sizes(produced_sizes_);
    }
  }
}

}  // namespace opforge::rt
