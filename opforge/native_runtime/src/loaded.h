// opf_program: a loaded, verified program whose operators are resolved (loader.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "loader.h"
#include "memory.h"
#include "program.h"
#include "registry.h"
#include "state.h"

namespace opforge::rt {

// One input or output as opf_io_info describes it (arrays owned here).
struct IoInfo {
  int32_t kind = OPF_VALUE_TENSOR;
  int32_t dtype = -1;
  std::vector<int64_t> sizes, min_sizes, max_sizes;
  std::vector<uint8_t> dim_order;
};

struct MethodInfo {
  const Method* method = nullptr;
  std::vector<const Kernel*> kernels;  // per instruction; nullptr for Move, Free
  std::vector<IoInfo> inputs, outputs;
  std::vector<std::string> nodes;      // per instruction: its node name, or ""
};

}  // namespace opforge::rt

struct opf_program {
  std::unique_ptr<opforge::rt::FileBytes> bytes;
  opforge::rt::Program program;
  const opf_registry* registry = nullptr;
  int64_t max_memory = 0;
  std::string label;  // for messages: the path, "<fd N>" or "<N bytes>"
  std::vector<opforge::rt::MethodInfo> methods;
  opforge::rt::ConstantForms forms;
  std::unique_ptr<opforge::rt::LiveState> state;
  std::unique_ptr<opforge::rt::DelegateSet> delegates;  // made at load; destroyed first

  // The method called `name` (Error OPF_ERR_INVALID_ARGUMENT listing the names).
  const opforge::rt::MethodInfo& method(const char* name, const std::string& api) const;
};
