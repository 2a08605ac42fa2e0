// Live program state (state.h).
#include "state.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "errors.h"

namespace opforge::rt {

LiveState::LiveState(const Program& program, ConstantForms& forms, int64_t limit, const std::string& api) {
  std::vector<std::pair<const StateSlot*, const Method*>> slots;
  int64_t total = 0;
  for (const Method& method : program.methods)
    for (const StateSlot& slot : method.state) {
      bool seen = false;
      for (auto& s : slots) seen = seen || s.first->name == slot.name;
      if (seen) continue;
      slots.emplace_back(&slot, &method);
      const TensorDef& t = method.values.at(slot.value).tensor;
      total = checked_add(total, checked_mul(numel_of(t.sizes), itemsize_of(t.dtype), "a state's bytes"),
                          "the program's state bytes");
    }
  check_memory(api, "the program's state tensors (one live copy per loaded program)", total, limit,
               "1. check that the file is the program you exported (a corrupt or hostile file asks for absurd "
               "state); 2. if the model really needs it, raise the limit: opf_load_options.max_memory or "
               "OPFORGE_MAX_MEMORY=N");
  const int64_t page = sysconf(_SC_PAGESIZE);
  for (auto& [slot, method] : slots) {
    auto state = std::make_unique<StateTensor>();
    state->name = slot->name;
    state->def = method->values.at(slot->value).tensor;
    const TensorDef& t = state->def;
    int32_t rank = static_cast<int32_t>(t.sizes.size());
    state->sizes = t.sizes;
    state->strides.assign(static_cast<size_t>(rank), 1);
    dense_strides(t.sizes.data(), t.dim_order.data(), rank, state->strides.data());
    int64_t itemsize = itemsize_of(t.dtype);
    state->nbytes = checked_mul(numel_of(t.sizes), itemsize, "a state's bytes");
    bool splat = t.storage == StorageKind::ConstantSplat;
    state->initial = splat ? program.segments.at(t.storage_index).data + t.storage_offset
                           : forms.data(program, t, limit);
    bool zero = splat;
    for (int64_t i = 0; splat && i < itemsize; ++i) zero = zero && state->initial[i] == 0;
    if (zero && state->nbytes >= page) {
      void* pages = mmap(nullptr, static_cast<size_t>(state->nbytes), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (pages == MAP_FAILED)
        raise(OPF_ERR_MEMORY, "`" + api + "`: state '" + state->name + "' — needs " +
                                  std::to_string(state->nbytes) + " bytes and the system refused them — valid: "
                                  "state that fits this machine's memory — fix: lower the memory limit to what "
                                  "the machine has, or re-export with a smaller state");
      state->pages = pages;
      state->data = static_cast<uint8_t*>(pages);
    } else {
      state->dense = AlignedBuffer(state->nbytes, "state '" + state->name + "'");
      state->data = state->dense.data();
      reset(*state);
    }
    tensors_.push_back(std::move(state));
  }
}

LiveState::~LiveState() {
  for (auto& s : tensors_)
    if (s->pages) munmap(s->pages, static_cast<size_t>(s->nbytes));
}

StateTensor* LiveState::find(const std::string& name) {
  for (auto& s : tensors_)
    if (s->name == name) return s.get();
  return nullptr;
}

void LiveState::reset(StateTensor& state) {
  if (state.pages) {
    // private anonymous pages: zero again on the next touch, and given back now
    if (madvise(state.pages, static_cast<size_t>(state.nbytes), MADV_DONTNEED) != 0)
      std::memset(state.pages, 0, static_cast<size_t>(state.nbytes));
    return;
  }
  if (state.def.storage == StorageKind::ConstantSplat) {
    int64_t itemsize = itemsize_of(state.def.dtype);
    for (int64_t at = 0; at + itemsize <= state.nbytes; at += itemsize)
      std::memcpy(state.data + at, state.initial, static_cast<size_t>(itemsize));
  } else if (state.nbytes > 0) {
    std::memcpy(state.data, state.initial, static_cast<size_t>(state.nbytes));
  }
}

void LiveState::unknown(const std::string& api, const std::string& name) const {
  std::string names;
  for (auto& s : tensors_) names += (names.empty() ? "'" : ", '") + s->name + "'";
  raise(OPF_ERR_STATE, "`" + api + "`: state '" + name + "' — not in the program — valid: " +
                           (names.empty() ? std::string("(the program has no state)") : names) +
                           " — fix: pass one of those names (opf_program_state_name)");
}

}  // namespace opforge::rt
