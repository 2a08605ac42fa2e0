// The kernel registry: out-overload keys ("aten::add.out") → the kernels that run them.
//
// It starts with the portable kernels linked into the runtime and grows by native kernel
// libraries (dlopen()ed or linked in), as opforge/runtime/registry.py + native.py:
//   - a key has at most one base kernel and one overriding kernel; lookup returns the
//     overriding one when there is one (a library loaded with override_existing = 1
//     replaces the portable kernel without anyone unregistering it);
//   - a library whose key is already served at the level it asks for is refused whole,
//     naming both libraries (never a silent last-one-wins);
//   - one key of one library may have several bindings: dtype-specific ones
//     (ExecuTorch's arg_meta, dtype_key "v1/6|6") and a fallback ("default"); select()
//     picks the first specific binding whose tensors' dtypes (and dim orders) match the
//     actual arguments, else the fallback (NativeKernel.select).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "opforge/kernel_abi.h"
#include "opforge/runtime.h"

namespace opforge::rt {

struct MetaCheck {
  int32_t arg = 0;                 // argument index
  int32_t dtype = 0;               // the dtype it must have
  std::vector<int32_t> dim_order;  // empty: any
};

struct Binding {
  const opforge_kernel_entry* entry = nullptr;
  std::vector<MetaCheck> meta;     // empty: the fallback
};

struct Kernel {
  std::string key;                 // "my_ops::mul3.out"
  std::string origin;              // the library's path or name
  bool override_level = false;
  std::vector<Binding> specific;   // in table order
  const Binding* fallback = nullptr;
  std::vector<Binding> storage;    // owns every binding (specific + fallback)
  const int32_t* kinds = nullptr;  // the first binding's parameter kinds
  int32_t num_args = 0;
  std::string schema;

  // The binding for these arguments, or nullptr (no fallback and no match).
  const Binding* select(const opforge_arg* args, int64_t n) const;
};

}  // namespace opforge::rt

struct opf_registry {
  ~opf_registry();
  std::vector<void*> handles;  // dlopen()ed libraries, closed with the registry
  std::vector<std::unique_ptr<opforge::rt::Kernel>> kernels;
  struct Slot {
    opforge::rt::Kernel* base = nullptr;
    opforge::rt::Kernel* over = nullptr;
  };
  std::map<std::string, Slot> table;
  std::vector<std::string> keys;  // insertion order (opf_registry_operator)

  // The kernel that runs `key`, or nullptr.
  const opforge::rt::Kernel* lookup(const std::string& key) const;
  // Check a library's whole table, then add every key (throws Error, adds nothing then).
  void add(const opforge_library* library, const std::string& origin, bool override_existing);
};

namespace opforge::rt {
// dlopen() `path`, check the ABI and add the library (OPF_ERR_LIBRARY when unusable).
void load_library(opf_registry* registry, const std::string& path, bool override_existing);
// Names close to `key` among the registered keys (for the missing-kernel report).
std::vector<std::string> near_keys(const opf_registry& registry, const std::string& key);
}  // namespace opforge::rt
