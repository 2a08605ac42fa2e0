// Per-call sizes of a method with symbolic sizes (opforge/runtime/shapes.py): bind the
// symbols from the tensor inputs' sizes, check every range, input dimension and guard,
// then evaluate every symbolic value's sizes.
//
// Made once per method instance: every expression parsed once, each distinct expression
// evaluated once per shape (a transformer layer's hundreds of expressions are a dozen
// distinct ones), and the binding plan (each symbol from the first input dimension
// `a * s + b` that determines it) solved ahead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "produced.h"
#include "program.h"

namespace opforge::rt {

class ShapeBinder {
 public:
  explicit ShapeBinder(const Method& method);
  ~ShapeBinder();

  // Symbol values (by symbol index) for the tensor inputs' sizes (sizes[p]: input p's, rank
  // checked by the caller; nullptr for a scalar input). Error OPF_ERR_INPUT naming the
  // input, dimension, symbol and bounds when a size or a guard is off.
  void bind(const std::string& api, const std::vector<const int64_t*>& sizes, std::vector<int64_t>& env) const;
  // Every symbolic value's sizes under `env`, concatenated in symbolic_values order.
  void evaluate(const std::string& api, const std::vector<int64_t>& env, std::vector<int64_t>& out) const;

  // Inclusive bounds of input p's dimension d (equal for a static dimension).
  int64_t min_size(size_t p, size_t d) const { return min_[p][d]; }
  int64_t max_size(size_t p, size_t d) const { return max_[p][d]; }
  // "(s0, 4) with s0 in [1, 24]" for messages.
  std::string describe_input(size_t position) const;
  // Values whose expressions read a growing symbol and that have no storage.
  const std::vector<uint32_t>& growing() const { return growing_; }
  // Data-dependent sizes (produced.h): the symbols no input binds, in instruction order.
  // bind() leaves each at its max (its producer's out is its whole slot); the call binds
  // it after its producer runs, checks its range, then the guards it completes.
  const std::vector<Producer>& producers() const { return producers_; }
  void check_produced(const std::string& api, size_t producer, int64_t value, const std::string& source,
                      std::vector<int64_t>& env) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::vector<int64_t>> min_, max_;
  std::vector<uint32_t> growing_;
  std::vector<Producer> producers_;
};

// The opf_io_info bounds of value `index` of `method` (its sizes, min and max per dim).
void io_bounds(const Method& method, uint32_t index, std::vector<int64_t>& min_sizes,
               std::vector<int64_t>& max_sizes);

}  // namespace opforge::rt
