// A dynamic method's cpu delegate (cpu/dynamic.py DynamicHandle, natively): the blob's
// size expressions made concrete per call shape, one engine per shape in a cache of
// kMaxShapes, the least recently used destroyed first.
//
// A call binds the symbols from its inputs' dimensions (Blob::steps: size = a * s + b),
// refuses values outside the blob's bounds before anything is built or touched, and takes
// that shape's engine, made on a miss from Blob::plan_at (checked as a static plan) by
// make_engine. Every engine borrows the blob's constants in place and shares the
// program's weight cache (the reordered weights); each holds its own intermediates.
//
// Simpler than dynamic.py: each engine is built within the whole memory limit (dynamic.py
// splits it between the cached engines and evicts to make room).
#include <algorithm>
#include <utility>

#include "backend.h"
#include "backend_cpu_blob.h"
#include "backend_cpu_engine.h"
#include "errors.h"
#include "symbolic.h"

namespace opforge::rt::cpu {
namespace {

constexpr size_t kMaxShapes = 8;  // dynamic.py MAX_SHAPES

class DynamicHandle final : public DelegateHandle {
 public:
  DynamicHandle(std::unique_ptr<Blob> blob, const EngineApi& api, const DelegateInit& init)
      : blob_(std::move(blob)), api_(api), init_(init), env_(blob_->symbols().size(), 0) {
    std::vector<int64_t> mins;
    for (const Symbol& s : blob_->symbols()) mins.push_back(s.min);
    Plan at_min = blob_->plan_at(mins);
    bool callouts = std::any_of(at_min.ops.begin(), at_min.ops.end(),
                                [](const PlanOp& op) { return op.kind == "kernel" || op.kind == "package"; });
    if (at_min.num_debug > 0 || callouts)
      raise(OPF_ERR_PROGRAM, "cpu backend blob: a dynamic plan with debug outputs, kernels or package ops — "
                             "valid: a blob written by this opforge's cpu backend — fix: re-export the "
                             "program; this one was altered, corrupted, or written by an incompatible version");
  }

  void execute(const opforge_tensor* inputs, int64_t n_in, const opforge_tensor* outputs, int64_t n_out) override {
    for (const Blob::Step& step : blob_->steps()) {
      const Symbol& sym = blob_->symbols()[(size_t)step.symbol];
      if (step.input >= n_in || step.dim >= inputs[step.input].rank || inputs[step.input].sizes == nullptr)
        raise(OPF_ERR_INPUT, "cpu backend: delegate input " + std::to_string(step.input) + " has no dimension " +
                                 std::to_string(step.dim));
      const int64_t size = inputs[step.input].sizes[step.dim];
      int64_t value = 0, rest = 0;
      bool ok = floor_div(size - step.b, step.a, &value) && floor_mod(size - step.b, step.a, &rest) &&
                rest == 0 && value >= sym.min && value <= sym.max;
      if (!ok)
        raise(OPF_ERR_INPUT, "cpu backend: delegate input " + std::to_string(step.input) + " dimension " +
                                 std::to_string(step.dim) + " — found size " + std::to_string(size) + " — valid: " +
                                 std::to_string(step.a) + " * " + sym.name + " + " + std::to_string(step.b) +
                                 " with " + sym.name + " in [" + std::to_string(sym.min) + ", " +
                                 std::to_string(sym.max) + "] (the delegate's bounds) — fix: call the method "
                                 "with sizes in range");
      env_[(size_t)step.symbol] = value;
    }
    engine()->execute(inputs, n_in, outputs, n_out);
  }

 private:
  DelegateHandle* engine() {
    for (size_t k = 0; k < engines_.size(); ++k) {
      if (engines_[k].first != env_) continue;
      if (k + 1 != engines_.size()) std::rotate(engines_.begin() + (long)k, engines_.begin() + (long)k + 1, engines_.end());
      return engines_.back().second.get();
    }
    Plan plan = blob_->plan_at(env_);  // checked like a static blob, then by the engine
    if (engines_.size() >= kMaxShapes) engines_.erase(engines_.begin());
    engines_.emplace_back(env_, make_engine(std::move(plan), api_, init_));
    return engines_.back().second.get();
  }

  std::unique_ptr<Blob> blob_;
  const EngineApi& api_;
  DelegateInit init_;
  std::vector<int64_t> env_;
  std::vector<std::pair<std::vector<int64_t>, std::unique_ptr<DelegateHandle>>> engines_;  // LRU last
};

}  // namespace

std::unique_ptr<DelegateHandle> make_dynamic(std::unique_ptr<Blob> blob, const EngineApi& api,
                                             const DelegateInit& init) {
  return std::make_unique<DynamicHandle>(std::move(blob), api, init);
}

}  // namespace opforge::rt::cpu
