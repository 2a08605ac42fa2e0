// Op-package ops inside a cpu delegate, natively: what opforge/backends/oppackage/runtime.py
// (prepare) and engine.py (_add_package) do in Python, with no Python.
//
//   load     the blob op's node (hex of a PackageNode, node.py: magic, version, JSON body,
//            every field checked as from_bytes checks it) → the package library (the
//            delegate's op_packages compile spec for this machine's platform, else the
//            path recorded at export), opened once, allowed only when trusted
//            (opf_op_package_trust or $OPFORGE_OP_PACKAGES, runtime.py's trust rules),
//            loaded once per real path and checked (ABI version, package name, target,
//            platform, op table) → the op's create with the node's parameters and tensor
//            descriptions → the engine's call-out (ofc_add_external) with the op's execute
//            and the instance create made
//   unload   destroy(instance) after the engine is gone; the library stays loaded for the
//            process (as in Python)
//
// The package C ABI is include/opforge/oppackage.h of opforge/backends/oppackage (version
// 1): the structs below mirror it (a bundle carries the runtime's sources, not that folder).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace opforge::rt::cpu {

struct Plan;
struct PlanOp;

// oppackage.h's opforge_pkg_tensor (= the engine's opforge_ext_tensor) and execute.
struct PkgTensor {
  void* data;
  int32_t dtype;
  int32_t ndim;
  const int64_t* sizes;
};
using PkgExecuteFn = int32_t (*)(void* impl, const PkgTensor* inputs, int32_t n_inputs, PkgTensor* outputs,
                                 int32_t n_outputs, char* error, int32_t error_size);
using PkgDestroyFn = void (*)(void* impl);

// One node's op instance: execute(impl, ...) per call; destroy(impl) when this goes.
class PackageInstance {
 public:
  PackageInstance(PkgExecuteFn execute, PkgDestroyFn destroy, void* impl, std::string name)
      : execute_(execute), destroy_(destroy), impl_(impl), name_(std::move(name)) {}
  ~PackageInstance() { destroy_(impl_); }
  PackageInstance(const PackageInstance&) = delete;
  PackageInstance& operator=(const PackageInstance&) = delete;

  PkgExecuteFn execute() const { return execute_; }
  void* impl() const { return impl_; }
  const std::string& name() const { return name_; }  // "package P::Op" (PackageNode.describe)

 private:
  PkgExecuteFn execute_;
  PkgDestroyFn destroy_;
  void* impl_;
  std::string name_;
};

// The instance for blob op `op` (kind "package", its node's hex in op.node) of `plan`,
// its library found through the delegate's compile specs. Throws Error: OPF_ERR_PROGRAM
// for a malformed node or one that disagrees with the plan's tensors, OPF_ERR_LIBRARY for
// a library that is not trusted, cannot be loaded or is not the package the node names,
// OPF_ERR_KERNEL when the package's create refuses the node.
std::unique_ptr<PackageInstance> prepare_package(const Plan& plan, const PlanOp& op,
                                                 const std::vector<std::pair<std::string, std::string>>& specs);

// ---- the package library (backend_cpu_package_library.cpp) ----------------------------

struct PkgParam {  // opforge_pkg_param
  const char* name;
  int32_t kind;
  int32_t is_list;
  int64_t count;
  const int64_t* ints;
  const double* floats;
};
using PkgCreateFn = int32_t (*)(const PkgParam* params, int32_t n_params, const PkgTensor* inputs,
                                const int32_t* input_slots, int32_t n_inputs, const PkgTensor* outputs,
                                int32_t n_outputs, void** impl, char* error, int32_t error_size);

struct PackageOpEntry {
  PkgCreateFn create;
  PkgExecuteFn execute;
  PkgDestroyFn destroy;
};

// The op `op_type` of the package library at `path` (registered as `package`, exporting
// `provider`), the library loaded once per real path and checked as runtime.py's _open
// checks it. `where` starts every message. Throws Error OPF_ERR_LIBRARY.
PackageOpEntry package_op(const std::string& path, const std::string& package, const std::string& provider,
                          const std::string& op_type, const std::string& where);

// This machine's platform as OpPackageInfo.platform spells it ("x86_64").
std::string host_platform();

}  // namespace opforge::rt::cpu
