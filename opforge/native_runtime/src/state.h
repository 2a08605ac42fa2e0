// Program state at run time (opforge/runtime/state.py): one live, writable copy of each
// state tensor per loaded program, shared by name by every method and every instance.
//
// The initial value is a constant of the file. A zero splat (a KV cache of zeros) gets an
// anonymous private mapping: the system hands out zero pages as calls first write them,
// so resident memory follows the positions written, and a reset gives the pages back
// (madvise(MADV_DONTNEED)). Any other initial value is copied once, dense in the tensor's
// dim order (the file's layout). All state's logical bytes count against the memory limit
// at load.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory.h"
#include "program.h"

namespace opforge::rt {

struct StateTensor {
  std::string name;
  TensorDef def;                  // the initial value's constant
  std::vector<int64_t> sizes, strides;
  int64_t nbytes = 0;
  uint8_t* data = nullptr;        // the live copy
  AlignedBuffer dense;            // owns data, or
  void* pages = nullptr;          // an anonymous mapping of `nbytes`
  const uint8_t* initial = nullptr;  // the initial bytes (one element for a splat)
};

class LiveState {
 public:
  LiveState(const Program& program, ConstantForms& forms, int64_t limit, const std::string& api);
  ~LiveState();
  LiveState(const LiveState&) = delete;
  LiveState& operator=(const LiveState&) = delete;

  StateTensor* find(const std::string& name);
  const std::vector<std::unique_ptr<StateTensor>>& tensors() const { return tensors_; }
  void reset(StateTensor& state);
  // Error OPF_ERR_STATE naming the known states.
  [[noreturn]] void unknown(const std::string& api, const std::string& name) const;

 private:
  std::vector<std::unique_ptr<StateTensor>> tensors_;
};

}  // namespace opforge::rt
