// The cpu backend's blob, read natively: the same layout and the same checks as
// opforge/backends/cpu/blob.py (parse + check_plan), whose docstring documents every
// field. The blob is untrusted: every count, id, dtype, rank and byte range is checked
// here before the engine is built (and the engine checks ids, strides and reaches again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace opforge::rt::cpu {

enum class Role : uint8_t { Input, Output, Const, Temp, Alias, Dead, State };

struct PlanTensor {
  int32_t dtype = 0;
  std::vector<int64_t> dims, strides;  // elements
  Role role = Role::Temp;
  int32_t base = -1;                   // an alias: an earlier tensor
  int64_t offset = 0;                  // an alias: elements into its base
  int64_t data_offset = -1;            // a constant in the blob: [offset, +nbytes) of its data
  int64_t data_nbytes = 0;
  std::string named_key;               // a constant in the program's named data (version 2)
  int64_t named_nbytes = -1;
};

struct PlanPostOp {
  int32_t kind = 0;                    // 0 eltwise, 1 binary
  int32_t alg = 0;
  double alpha = 0, beta = 0;
  int32_t tensor = -1;                 // binary: the operand
};

struct PlanKernelArg {                 // a "kernel" op's argument: [tag, value]
  int32_t tag = 0;                     // OPFORGE_ARG_* (engine.py KERNEL_TAGS)
  int64_t i = 0;                       // int, bool, tensor (slot in in+out), none
  double d = 0;
  std::vector<int64_t> ints;
  std::vector<double> doubles;
};

struct PlanOp {
  std::string kind, name;
  std::vector<int32_t> in, out;
  std::vector<int64_t> ia;
  std::vector<double> fa;
  std::vector<PlanPostOp> post;
  std::vector<PlanKernelArg> args;     // kind "kernel"
  bool has_node = false;               // kind "package"
};

struct Plan {
  uint32_t version = 0;
  std::vector<PlanTensor> tensors;
  std::vector<PlanOp> ops;
  std::vector<int32_t> inputs, outputs;
  std::vector<std::pair<int64_t, int64_t>> state;  // (input position, call output position)
  int64_t num_debug = 0;                           // trailing outputs that are node results
  bool symbolic = false;                           // "symbols": a dynamic method's delegate
  const uint8_t* data = nullptr;                   // the constants' bytes (in the blob)
  int64_t data_size = 0;
};

constexpr int64_t kMaxPlan = int64_t(64) << 20;
constexpr int64_t kMaxTensors = int64_t(1) << 20;
constexpr int kMaxRank = 8;
constexpr int64_t kNamedMaxBytes = int64_t(1) << 48;

// Parse and check a blob (blob.parse then check_plan); throws Error OPF_ERR_PROGRAM with
// blob.py's message ("cpu backend blob: ... — valid: ... — fix: ..."). A symbolic plan
// comes back with `symbolic` set and only its header checked.
Plan parse_blob(const uint8_t* blob, size_t size);

// The delegate's own compile specs (not "opforge.*"), checked as decode_specs checks
// them (backend_cpu_specs.cpp); its num_threads (0: OPFORGE_NUM_THREADS, else 1).
int64_t decode_num_threads(const std::vector<std::pair<std::string, std::string>>& specs);

bool valid_utf8(const uint8_t* p, size_t n);  // strict, as Python's bytes.decode("utf-8")
int64_t dtype_itemsize(int32_t dtype);  // the blob's dtypes; 0 for any other
const char* dtype_name(int32_t dtype);  // "float32"

}  // namespace opforge::rt::cpu
