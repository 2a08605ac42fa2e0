// The program file as plain C++ data: what reader.cpp decodes and verify.cpp checks.
//
// It mirrors opforge/program (model.py, values.py, symbolic.py) field for field, so the
// two readers can be held together by tests. Segments are spans of the loaded buffer
// (nothing is copied); everything else is owned. Every index here has been checked by
// the verifier before anything else reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace opforge::rt {

constexpr uint32_t kMinFormatVersion = 1;
constexpr uint32_t kMaxFormatVersion = 6;
constexpr int kMaxRank = 64;
constexpr int64_t kMaxTensorBytes = int64_t(1) << 48;
constexpr uint32_t kNoTensor = 0xFFFFFFFFu;  // a None item of an optional tensor list

enum class ValueTag : uint8_t {
  None = 0, Int = 1, Double = 2, Bool = 3, String = 4, IntList = 5, DoubleList = 6,
  BoolList = 7, Tensor = 8, TensorList = 9, OptionalTensorList = 10, ScalarType = 11,
};

enum class StorageKind : uint8_t { None = 0, Arena = 1, Constant = 2, ConstantInt4 = 3, ConstantSplat = 4 };

struct TensorDef {
  int32_t dtype = 0;                 // c10::ScalarType number
  StorageKind storage = StorageKind::None;
  uint32_t storage_index = 0;        // arena mem_id or segment index
  int64_t storage_offset = 0;        // bytes
  std::vector<int64_t> sizes;        // at the upper bound
  std::vector<uint8_t> dim_order;    // a permutation, outermost first
};

// One value of a method's value table. Only the fields of its tag are meaningful.
struct Value {
  ValueTag tag = ValueTag::None;
  int64_t i = 0;                     // Int, Bool (0/1), ScalarType (dtype number)
  double d = 0.0;                    // Double
  std::string s;                     // String
  std::vector<int64_t> ints;         // IntList; BoolList (0/1)
  std::vector<double> doubles;       // DoubleList
  std::vector<uint32_t> items;       // TensorList, OptionalTensorList (kNoTensor = None)
  TensorDef tensor;                  // Tensor
};

struct Operator {
  std::string name;      // "aten::add"
  std::string overload;  // "out" or ""
  std::string key() const { return overload.empty() ? name : name + "." + overload; }
};

enum class InstructionKind : uint8_t { KernelCall = 0, DelegateCall = 1, Move = 2, Free = 3 };

struct Instruction {
  InstructionKind kind = InstructionKind::KernelCall;
  uint32_t index = 0;                // KernelCall: operator; DelegateCall: delegate;
                                     // Move: src; Free: value
  uint32_t dst = 0;                  // Move only
  std::vector<uint32_t> args;        // KernelCall, DelegateCall
};

struct Symbol {
  std::string name;
  int64_t min = 0;
  int64_t max = 0;
};

struct SymbolicValue {
  uint32_t value = 0;
  std::vector<std::string> exprs;    // printed size expressions (symbolic.h parses them)
};

struct Guard {
  std::string lhs, relation, rhs;
};

struct StateSlot {
  std::string name;
  uint32_t value = 0;
};

struct Method {
  std::string name;
  std::vector<Value> values;
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> outputs;
  std::vector<Operator> operators;
  std::vector<int64_t> arena_sizes;
  std::vector<Instruction> instructions;
  std::vector<Symbol> symbols;
  std::vector<SymbolicValue> symbolic_values;
  std::vector<Guard> guards;
  std::vector<StateSlot> state;
  std::vector<uint32_t> growing;     // indices into symbols
};

struct Segment {
  int64_t offset = 0;                // relative to data_offset
  int64_t size = 0;
  const uint8_t* data = nullptr;     // into the loaded buffer, 64-byte aligned when mapped
};

struct Delegate {
  std::string id;
  uint32_t segment = 0;
  std::vector<std::pair<std::string, std::string>> compile_specs;  // value: raw bytes
};

struct NamedData {
  std::string key;
  uint32_t segment = 0;
};

struct Program {
  uint32_t format_version = 0;
  std::vector<Method> methods;
  std::vector<Segment> segments;
  std::vector<Delegate> delegates;
  std::vector<std::pair<std::string, std::string>> user_metadata;
  std::vector<NamedData> named_data;
};

// Thrown by the reader and the verifier; the C API turns it into OPF_ERR_PROGRAM with
// the message (never escapes the library).
struct ProgramError {
  std::string message;
};

// Decode and verify `size` bytes (the whole file). Segments point into `data`, which must
// outlive the Program. Throws ProgramError on any malformed input; never reads outside
// [data, data + size), never allocates more than the input's size justifies, and refuses a
// file whose decoded tables (values, instructions, lists, strings) would take more than
// `memory_limit` bytes of memory (0: no limit) before allocating them.
Program read_program(const uint8_t* data, size_t size, int64_t memory_limit = 0);

// Every cross-reference rule of docs/program-format.md (opforge/program/verify.py and
// verify_symbolic.py, the debug table of debug.py included). read_program calls it.
void verify_program(const Program& program, const uint8_t* data, size_t size);

}  // namespace opforge::rt
