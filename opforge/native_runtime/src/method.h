// A method instance: its arenas, every value in its run-time form, every instruction
// bound once (opforge/runtime/method.py, in C++).
//
// # Design
//
// Everything that can be decided before the first call is decided in the constructor:
// each arena is allocated (or the caller's is taken), each tensor value gets its data
// pointer (arena slot, constant segment, unpacked constant, live state, growing buffer)
// and one sizes/strides array, each list its items, each scalar its payload; each
// KernelCall becomes (kernel fn, opforge_arg array) and each Move a call of the runtime's
// own copy kernel. The args of all instructions are one array; every opforge_tensor that
// views a value points at that value's sizes and strides arrays, so a new shape writes
// each symbolic value's sizes once and every argument sees them. Whatever else changes
// after binding (a zero-copy input's pointer, a grown buffer, a scalar input, a symbolic
// int) is written through the value's list of references (the opforge_tensors and
// opforge_args that hold it). A call is then
//
//     for each bound call: fn(&ctx, args, n); if (ctx.status) → error
//
// with no allocation. Profiling is a second loop, not an `if` per instruction. One call
// at a time per instance: an atomic flag, a second thread gets OPF_ERR_BUSY at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaded.h"
#include "memory.h"
#include "opforge/kernel_abi.h"
#include "shapes.h"
#include "thread_pool.h"

namespace opforge::rt {

struct ArgRef {        // a scalar argument slot that follows its value
  opforge_arg* arg;
  int32_t kind;        // the parameter's base kind (how to write the value)
};

// One value's run-time form.
struct ValueRt {
  ValueTag tag = ValueTag::None;
  // tensors
  uint8_t* home = nullptr;          // where the tensor lives when not given zero-copy
  uint8_t* data = nullptr;          // where it is now
  int32_t dtype = 0, rank = 0;
  std::vector<int64_t> sizes, strides;
  const uint8_t* dim_order = nullptr;
  int64_t capacity = 0;             // bytes at `home`
  bool growing = false;
  AlignedBuffer grown;              // a growing tensor's own buffer
  std::vector<opforge_tensor*> views;  // every opforge_tensor of it
  // scalars (Int, Double, Bool; ints also for a symbolic Int)
  int64_t i = 0;
  double d = 0.0;
  std::vector<ArgRef> scalar_refs;
  // lists
  std::vector<int64_t> ints;        // IntList, BoolList (as 0/1 int64 for symbolic updates)
  std::vector<uint8_t> bools;
  std::vector<double> doubles;
  std::vector<opforge_tensor> tensors;  // TensorList / OptionalTensorList items
};

// "an int", "a tensor": what a value is, for messages.
const char* tag_name_of(ValueTag tag);

// The bytes a method instance's own tables take besides its arenas (a ValueRt per value,
// the bound arguments, per-instruction labels and timings): the loader holds them to the
// memory limit, so a program of very many tiny values is refused, not expanded.
int64_t instance_table_bytes(const Method& method);

struct BoundCall {
  opforge_kernel_fn fn;
  opforge_arg* args;
  int64_t n;
};

class MethodInstance {
 public:
  MethodInstance(opf_program* program, const MethodInfo& info, const opf_method_options* options);
  MethodInstance(const MethodInstance&) = delete;
  MethodInstance& operator=(const MethodInstance&) = delete;

  void set_input(int64_t index, const void* data, int32_t dtype, int32_t rank, const int64_t* sizes,
                 bool zero_copy);
  void set_input_scalar(int64_t index, ValueTag tag, int64_t i, double d);
  void execute();
  void output(int64_t index, opf_tensor_view* out) const;
  void output_scalar(int64_t index, int32_t* kind, int64_t* i, double* d) const;
  void set_profiling(bool on) { profiling_ = on; }
  int64_t num_instructions() const { return static_cast<int64_t>(method_.instructions.size()); }
  void profile(int64_t index, const char** label, const char** node, int64_t* last_ns) const;

  std::atomic<bool> busy{false};
  int64_t growths = 0;               // how often a growing tensor's buffer grew
  int32_t num_threads = 1;           // the portable kernels' threads (thread_pool.h)

 private:
  void make_values();
  void bind_instructions();
  void fill_arg(opforge_arg& arg, int32_t kind, uint32_t value, size_t instruction, int32_t position);
  void point(ValueRt& v, uint8_t* data);
  void write_scalar(ValueRt& v);
  void select_shape();
  void apply_sizes(const std::vector<int64_t>& sizes);
  void grow(const std::vector<int64_t>& env);
  void update_kernel_budget();
  void ensure_capacity(uint32_t value, int64_t nbytes, const std::string& why, const char* function);
  [[noreturn]] void kernel_failed(size_t position);
  void run_profiled();
  void run_producing();                      // method_produced.cpp: data-dependent sizes
  std::string api(const char* function) const;

  opf_program* program_;
  const MethodInfo& info_;
  const Method& method_;
  std::vector<AlignedBuffer> own_arenas_;
  std::vector<uint8_t*> arenas_;
  std::vector<ValueRt> values_;
  std::vector<opforge_arg> args_;          // every bound call's arguments, one array
  std::vector<BoundCall> bound_;
  std::vector<uint32_t> bound_instruction_;  // bound position → instruction index
  std::vector<std::string> labels_;          // per instruction
  std::vector<int64_t> last_ns_;             // per instruction
  std::vector<bool> input_set_;
  opforge_context ctx_{};
  KernelServices services_;                  // ctx_.runtime: the kernels' threads and scratch budget
  std::unique_ptr<ThreadPool> pool_;         // num_threads > 1 only
  bool profiling_ = false;
  int64_t limit_ = 0;
  int64_t grown_bytes_ = 0;
  // dynamic shapes
  std::unique_ptr<ShapeBinder> binder_;
  struct ShapeEntry {
    std::vector<int64_t> key, sizes, env;
  };
  std::vector<ShapeEntry> shapes_;           // most recently used last
  std::vector<int64_t> key_;                 // scratch: this call's input sizes
  std::vector<const int64_t*> input_sizes_;  // scratch: each input's sizes
  bool shape_ready_ = false;                 // shapes_.back() applied and its growth done
  std::vector<int64_t> produced_env_, produced_sizes_;  // scratch: sizes bound mid-call
};

}  // namespace opforge::rt

struct opf_method {
  std::unique_ptr<opforge::rt::MethodInstance> instance;
};
