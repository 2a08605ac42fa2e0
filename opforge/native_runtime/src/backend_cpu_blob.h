// The cpu backend's blob, read natively: the same layout and the same checks as
// opforge/backends/cpu/blob.py (parse + check_plan), whose docstring documents every
// field. The blob is untrusted: every count, id, dtype, rank and byte range is checked
// here before the engine is built (and the engine checks ids, strides and reaches again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "program.h"
#include "symbolic.h"

namespace opforge::rt::cpu {

class Json;
struct JValue;

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
  std::string node;                    // kind "package": its PackageNode, hex (node.py)
};

struct Plan {
  uint32_t version = 0;
  std::vector<PlanTensor> tensors;
  std::vector<PlanOp> ops;
  std::vector<int32_t> inputs, outputs;
  std::vector<std::pair<int64_t, int64_t>> state;  // (input position, call output position)
  int64_t num_debug = 0;                           // trailing outputs that are node results
  const uint8_t* data = nullptr;                   // the constants' bytes (in the blob)
  int64_t data_size = 0;
};

constexpr int64_t kMaxPlan = int64_t(64) << 20;
constexpr int64_t kMaxTensors = int64_t(1) << 20;
constexpr int kMaxRank = 8;
constexpr int64_t kNamedMaxBytes = int64_t(1) << 48;

// A blob read and checked (blob.parse): the header, the CRC, the JSON plan. Throws Error
// OPF_ERR_PROGRAM with blob.py's message ("cpu backend blob: ... — valid: ... — fix: ...").
//
// A static plan: plan() is it, checked by every rule of check_plan. A dynamic method's
// plan ("symbols"; cpu/dynamic.py): its sizes, strides, alias offsets and op attributes
// may be size expressions over the symbols; the constructor checks them as
// check_symbolic does (each parses and reads declared symbols only, its bounds over the
// symbols' ranges inside the field's range, every symbol bound by an input dimension
// a * s + b, the plan made concrete at the minima and at the maxima passes check_plan),
// and plan_at(env) is the plan made concrete at one set of symbol values, checked again.
class Blob {
 public:
  struct Step {                       // symbol `symbol` = (input `input`'s dim `dim` - b) / a
    int64_t input = 0, dim = 0;
    int symbol = 0;
    int64_t a = 1, b = 0;
  };
  Blob(const uint8_t* blob, size_t size);
  ~Blob();
  Blob(const Blob&) = delete;
  Blob& operator=(const Blob&) = delete;

  bool symbolic() const { return !symbols_.empty(); }
  Plan plan() const { return plan_at({}); }
  Plan plan_at(const std::vector<int64_t>& env) const;
  const std::vector<Symbol>& symbols() const { return symbols_; }
  const std::vector<Step>& steps() const { return steps_; }

 private:
  void check_symbolic();
  struct Exprs;
  std::unique_ptr<Json> json_;
  std::unique_ptr<Exprs> exprs_;
  uint32_t version_ = 0;
  const uint8_t* data_ = nullptr;
  int64_t data_size_ = 0;
  std::vector<Symbol> symbols_;
  std::vector<Step> steps_;
};

// The delegate's own compile specs (not "opforge.*"), checked as decode_specs checks
// them (backend_cpu_specs.cpp); its num_threads (0: OPFORGE_NUM_THREADS, else 1).
int64_t decode_num_threads(const std::vector<std::pair<std::string, std::string>>& specs);

bool valid_utf8(const uint8_t* p, size_t n);  // strict, as Python's bytes.decode("utf-8")
int64_t dtype_itemsize(int32_t dtype);  // the blob's dtypes; 0 for any other
const char* dtype_name(int32_t dtype);  // "float32"

// Shared by backend_cpu_blob.cpp (the header, the CRC and the plan's parsing, the dynamic
// plan's symbols) and backend_cpu_blob_ops.cpp (the per-tensor, per-op, io, state and debug
// field checks).
namespace blob_detail {

constexpr int64_t kBig = int64_t(1) << 40;

// Throws Error OPF_ERR_PROGRAM "cpu backend blob: <what> — valid: ... — fix: ...".
[[noreturn]] void refuse(const std::string& what);

// A dynamic plan's size expressions by their text (parsed once), and the symbol values a
// plan is made concrete at.
struct ExprTable {
  std::map<std::string, SizeExpr> parsed;
  const std::vector<int64_t>* env = nullptr;
};

// check_plan over the plan document: the tensor table, the op list, the inputs and
// outputs, state and debug, into plan. exprs: a dynamic plan's (a size field may then be
// an expression, evaluated at exprs->env), else null.
void check_plan_doc(const Json& j, const JValue& doc, const ExprTable* exprs, Plan& plan);

}  // namespace blob_detail

}  // namespace opforge::rt::cpu
