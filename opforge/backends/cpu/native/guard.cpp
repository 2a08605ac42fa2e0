// The NaN guard: a convolution or matmul whose post-op chain holds a NaN-unsafe eltwise
// (relu, clip, hardsigmoid: oneDNN maps a NaN to a number there, nan.cpp) runs with the whole
// chain fused in oneDNN on every call that provably has no NaN before that post-op, and
// the exact way (the chain cut at the unsafe post-op, the rest in the Epilogue's loops)
// on the others. The results are torch's either way: on NaN-free values the unsafe eltwise
// is exact in oneDNN too.
//
// The proof is a bound. With weights W and bias b constant, an output before its post-ops
// is sum_k x_k w_k + b, and every partial sum of it is at most B * gain + offset in
// magnitude, where B bounds |x| (no NaN, no inf), gain = the largest sum of |w| one output
// reads (precomputed over the weights) and offset = max |b|. Post-ops before the unsafe one
// transform the bound (linear: |a| B + |c|; add/sub of a tensor: + its bound; mul: times its
// bound; abs keeps it; tanh and logistic give 1); other post-ops there give no guard. When
// the bound is at most 1e37 (float32's largest is 3.4e38: rounding cannot reach it), no
// product or sum overflowed, so no inf and no NaN exists before the unsafe post-op.
//
// B comes from the input's producer when one earlier op (itself guarded) alone writes the
// input's storage: its output bound this call (clip: within max(|lo|, |hi|); hardsigmoid: 1;
// relu: the bound before it; inf after it ran the exact way or when other post-ops follow).
// Otherwise, or when that bound is too large to prove anything, the input is scanned for
// its largest magnitude (NaN and inf: no proof). A convolution reading a ReLU6's output is
// thus proved with no scan at all; the first one scans the delegate input once.
//
// Why: MobileNetV2's 35 ReLU6 ran as a second pass over their convolutions' outputs, 17% of
// its time on this backend (3.70 ms against 3.08 ms fused, one thread).
#include <sys/mman.h>
#include <unistd.h>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include <algorithm>

#include "engine.h"
#include "loops.h"

namespace ofc {

namespace {
constexpr double kLimit = 1e37;
constexpr int kRelu = 0, kTanh = 1, kAbs = 4, kLinear = 6, kLogistic = 8, kClip = 13,
              kHardsigmoid = 19, kAdd = 100, kSub = 101, kMul = 102;

// the largest |x| over n floats from x, stepping by `step`; NaN when one is NaN. Four
// independent maxima per step of 16 (SSE, every x86-64): a single running max was a
// dependency chain, 72 µs on MobileNetV2's 150,528-float input against 8 µs here.
float max_abs_run(const float* x, int64_t n, int64_t step) {
  float top = 0.f;
  int64_t j = 0;
#ifdef __SSE2__
  if (step == 1) {
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0, nan = m0;
    for (; j + 16 <= n; j += 16) {
      __m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + 4);
      __m128 c = _mm_loadu_ps(x + j + 8), d = _mm_loadu_ps(x + j + 12);
      nan = _mm_or_ps(nan, _mm_or_ps(_mm_cmpunord_ps(a, b), _mm_cmpunord_ps(c, d)));
      m0 = _mm_max_ps(m0, _mm_and_ps(a, magnitude));
      m1 = _mm_max_ps(m1, _mm_and_ps(b, magnitude));
      m2 = _mm_max_ps(m2, _mm_and_ps(c, magnitude));
      m3 = _mm_max_ps(m3, _mm_and_ps(d, magnitude));
    }
    if (_mm_movemask_ps(nan)) return NAN;
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    top = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  }
#endif
  for (; j < n; ++j) {
    float v = std::fabs(x[j * step]);
    if (v != v) return NAN;
    top = v > top ? v : top;
  }
  return top;
}

// the largest |x| over tensor id's elements; inf when one is NaN or infinite
double max_magnitude(Engine& e, int id) {
  const Tensor& t = e.tensors[(size_t)id];
  if (t.dtype != F32) return INFINITY;
  const float* p = static_cast<const float*>(e.ptr(id));
  float top = 0.f;
  if (t.dims.empty()) {
    top = max_abs_run(p, 1, 1);
  } else if (t.span == t.numel) {
    top = max_abs_run(p, t.span, 1);  // dense: any order
  } else {
    dims_t outer(t.strides.begin(), t.strides.end() - 1);
    const int64_t inner = t.strides.back();
    for_each_row(t.dims, [&](const int64_t* idx, int64_t n) {
      float m = max_abs_run(p + dot(idx, outer), n, inner);
      top = m > top || m != m ? m : top;  // NaN sticks
    });
  }
  return std::isfinite(top) ? (double)top : INFINITY;
}

// max over outputs of sum |w| over the `reduced` dims of a constant's elements; inf when
// one is not finite. Rows are walked in memory order (dims by falling stride); a file-backed
// weight whose pages the chunked reorder gave back has them given back again behind the
// walk every 8 MiB (constants.cpp), so init does not make it resident a second time.
double weight_gain(Engine& e, int id, const std::vector<bool>& reduced) {
  const Tensor& w = e.tensors[(size_t)id];
  const Tensor& root = e.tensors[(size_t)e.root(id)];
  const float* p = static_cast<const float*>(e.ptr(id));
  const size_t rank = w.dims.size();
  if (rank == 0) return std::isfinite(*p) ? std::fabs((double)*p) : INFINITY;
  std::vector<size_t> order(rank);
  for (size_t k = 0; k < rank; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return w.strides[x] > w.strides[y]; });
  dims_t dims(rank), unit_step(rank, 0);  // in walk order; an output unit's stride (0: reduced)
  int64_t units = 1;
  for (size_t k = rank; k-- > 0;)
    if (!reduced[k]) { unit_step[k] = units; units *= w.dims[k]; }  // at most the elements
  dims_t strides(rank), steps(rank);
  for (size_t k = 0; k < rank; ++k) {
    dims[k] = w.dims[order[k]];
    strides[k] = w.strides[order[k]];
    steps[k] = unit_step[order[k]];
  }
  dims_t outer_strides(strides.begin(), strides.end() - 1), outer_steps(steps.begin(), steps.end() - 1);
  const int64_t inner = strides.back(), inner_step = steps.back();
  const bool drop = root.drop_after_copy && root.file_fd >= 0 && dense(w);
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = reinterpret_cast<uintptr_t>(p);
  uintptr_t dropped = (start + page - 1) / page * page;
  std::vector<double> sums((size_t)units, 0.0);
  bool finite = true;
  for_each_row(dims, [&](const int64_t* idx, int64_t n) {
    const float* row = p + dot(idx, outer_strides);
    double* sum = sums.data() + dot(idx, outer_steps);
    if (inner_step == 0) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::fabs((double)row[j * inner]);
      *sum += s;
      finite = finite && std::isfinite(s);
    } else {
      for (int64_t j = 0; j < n; ++j) sum[j * inner_step] += std::fabs((double)row[j * inner]);
    }
    uintptr_t done = reinterpret_cast<uintptr_t>(row + n * inner) / page * page;
    if (drop && done >= dropped + (8u << 20)) {
      madvise(reinterpret_cast<void*>(dropped), done - dropped, MADV_DONTNEED);
      dropped = done;
    }
  });
  double gain = 0;
  for (double s : sums) { finite = finite && std::isfinite(s); gain = std::max(gain, s); }
  uintptr_t end = (start + (uintptr_t)w.span * sizeof(float)) / page * page;
  if (drop && end > dropped) madvise(reinterpret_cast<void*>(dropped), end - dropped, MADV_DONTNEED);
  return finite ? gain : INFINITY;
}
}  // namespace

struct Guard {
  struct Term {           // one post-op, in chain order
    int code = 0;         // kUnknown: a NaN-safe post-op no bound passes (after the last unsafe one)
    double alpha = 0, beta = 0;
    int tensor = -1;      // binary: the other operand
    const Op* from = nullptr;  // its producer (link_guards)
    double fixed = INFINITY;       // a constant operand's bound
  };
  static constexpr int kUnknown = -1;
  int src = -1;
  const Op* src_from = nullptr;
  int weights = -1, bias = -1;  // constants (-1: a binary op, gain 1 / no bias)
  std::vector<bool> reduced;    // the weight dims one output sums over
  double gain = 0, offset = 0;  // computed at finalize, for the guards that are used
  std::vector<Term> chain;
  size_t proved = 0;      // the chain's terms up to and with the last unsafe one
  std::unique_ptr<DnnlOp> fused;  // when the chain holds an unsafe post-op
  int64_t fused_calls = 0, exact_calls = 0;

  // a tensor's bound: its constant bound, its producer's, or (scan) its largest magnitude,
  // each tensor scanned at most once per call (`seen`: an elementwise chain reading its
  // input three times scanned 4 MB four times)
  static double operand(Engine& e, int id, const Op* from, double fixed, bool scan,
                        std::vector<std::pair<int, double>>& seen) {
    if (fixed < INFINITY) return fixed;
    double b = from != nullptr ? from->out_bound : INFINITY;
    if (b <= kLimit || !scan) return b;
    for (const auto& s : seen)
      if (s.first == id) return s.second;
    seen.emplace_back(id, max_magnitude(e, id));
    return seen.back().second;
  }
  // the output's bound; `peak`: the largest bound up to the last unsafe post-op (at most
  // kLimit: nothing before it is NaN or inf). scan: unknown operands up to that post-op are
  // scanned (past it a bound only serves readers, which scan what they need themselves)
  // (base: the bound before the post-ops when the caller knows it, else NaN)
  double walk(Engine& e, bool scan, double* peak, double base = NAN) const {
    std::vector<std::pair<int, double>> seen;
    double b = base == base ? base : operand(e, src, src_from, INFINITY, scan, seen) * gain + offset;
    double top = b;
    for (size_t i = 0; i < chain.size(); ++i) {
      const Term& t = chain[i];
      const bool look = scan && i < proved;
      switch (t.code) {
        case kLinear: b = std::fabs(t.alpha) * b + std::fabs(t.beta); break;
        case kAbs: case kRelu: break;
        case kTanh: case kLogistic: case kHardsigmoid: b = 1.0; break;
        case kClip: {  // within [lo, hi]; within |x| too when 0 is inside
          double cap = std::max(std::fabs(t.alpha), std::fabs(t.beta));
          b = t.alpha <= 0 && t.beta >= 0 ? std::min(b, cap) : cap;
          break;
        }
        case kAdd: case kSub: b += operand(e, t.tensor, t.from, t.fixed, look, seen); break;
        case kMul: b *= operand(e, t.tensor, t.from, t.fixed, look, seen); break;
        default: b = INFINITY; break;  // kUnknown
      }
      if (i < proved) top = top > b || top != top ? top : b;  // NaN sticks
    }
    *peak = top;
    return b;
  }
};

void attach_guard(Engine& e, DnnlOp& op, const OpCall& c, int weights, int bias,
                  const std::vector<bool>& reduced,
                  const std::function<std::unique_ptr<DnnlOp>(const DnnlOp&)>& fused) {
  if (weights >= 0 && (!e.tensors[(size_t)e.root(weights)].is_const || e.ptr(weights) == nullptr)) return;
  if (bias >= 0 && (!e.tensors[(size_t)e.root(bias)].is_const || e.ptr(bias) == nullptr)) return;
  auto g = std::make_shared<Guard>();
  g->src = c.ins[0];
  std::vector<PostOp> post;
  if (weights < 0) {  // a binary op: its own operation leads the chain
    PostOp self;
    self.binary = true;
    self.code = (int)c.ia[0];
    self.tensor = c.ins[1];
    post.push_back(self);
  }
  post.insert(post.end(), c.post.begin(), c.post.end());
  for (size_t i = 0; i < post.size(); ++i) {
    const PostOp& p = post[i];
    Guard::Term t;
    t.code = p.code;
    t.alpha = p.alpha;
    t.beta = p.beta;
    bool known = p.binary ? (p.code == kAdd || p.code == kSub || p.code == kMul)
                          : (p.code == kLinear || p.code == kAbs || p.code == kTanh ||
                             p.code == kLogistic || p.code == kClip || p.code == kHardsigmoid ||
                             (p.code == kRelu && p.alpha == 0.f));
    if (nan_unsafe(p)) {
      if (!known) return;  // binary max/min, exp: no bound proves them here
      g->proved = i + 1;
    }
    if (!known) t.code = Guard::kUnknown;
    if (p.binary) {
      t.tensor = p.tensor;
      if (e.tensors[(size_t)e.root(p.tensor)].is_const && e.ptr(p.tensor) != nullptr)
        t.fixed = max_magnitude(e, p.tensor);
    }
    g->chain.push_back(t);
  }
  for (size_t i = 0; i < g->proved; ++i)
    if (g->chain[i].code == Guard::kUnknown) return;  // an unsafe post-op no bound reaches
  g->weights = weights;
  g->bias = bias;
  g->reduced = reduced;
  if (g->proved > 0) {
    g->fused = fused(op);
    if (!g->fused) return;
    g->fused->name = op.name;
    g->fused->ins = c.ins;
    g->fused->outs = c.outs;
  }
  op.guard = std::move(g);
  op.bounded = true;  // its guard sets out_bound on every call
}

bool guard_run(Engine& e, DnnlOp& op) {
  Guard& g = *op.guard;
  double peak;
  double b = g.walk(e, false, &peak);
  if (!g.fused) {  // nothing unsafe: the bound only passes on
    op.out_bound = peak <= kLimit && b <= kLimit ? b : INFINITY;
    return false;
  }
  if (!(peak <= kLimit)) b = g.walk(e, true, &peak);
  if (peak <= kLimit) {
    g.fused->run(e);
    ++g.fused_calls;
    op.out_bound = b <= kLimit ? b : INFINITY;
    return true;
  }
  ++g.exact_calls;
  op.out_bound = INFINITY;
  return false;
}

// Each guarded input's producer; then, from the last op back, the guards a fused op needs
// (its own, and those whose bounds reach it): the others are dropped before their weights
// are read (a decoder's matmuls, with no unsafe post-op, would read every weight at load
// for nothing). A guard whose weights or bias are not finite is dropped too: its op runs
// the exact way, and its readers find no bound (they scan).
void link_guards(Engine& e) {
  // the ops writing each root, and the first of them
  std::vector<int> writers(e.tensors.size(), 0), first(e.tensors.size(), -1);
  for (size_t i = 0; i < e.ops.size(); ++i)
    for (int id : e.ops[i]->outs) {
      size_t r = (size_t)e.root(id);
      if (writers[r]++ == 0) first[r] = (int)i;
    }
  // the one earlier guarded or bounded op whose bound covers tensor id for op `reader`,
  // else -1
  auto producer = [&](int id, size_t reader) -> int {
    size_t r = (size_t)e.root(id);
    if (writers[r] != 1 || first[r] >= (int)reader) return -1;
    const Op& d = *e.ops[(size_t)first[r]];
    // its bound covers its output: the whole root, written by it alone
    return d.bounded && d.outs[0] == (int)r ? first[r] : -1;
  };
  auto guard_of = [&](size_t i) -> DnnlOp* {
    auto* d = dynamic_cast<DnnlOp*>(e.ops[i].get());
    return d != nullptr && d->guard ? d : nullptr;
  };
  std::vector<char> used(e.ops.size(), 0);
  for (size_t i = e.ops.size(); i-- > 0;) {
    if (auto* s = dynamic_cast<DnnlOp*>(e.ops[i].get()); s != nullptr && s->scans_input) {
      int j = producer(s->ins[0], i);
      if (j >= 0) {
        used[(size_t)j] = 1;
        s->in_from = e.ops[(size_t)j].get();
      }
    }
    if (KernelTail* t = e.ops[i]->kernel_tail(); t != nullptr && t->wants_input) {
      int j = producer(e.ops[i]->ins[0], i);
      if (j >= 0) {
        used[(size_t)j] = 1;
        t->in_from = e.ops[(size_t)j].get();
      }
    }
    DnnlOp* d = guard_of(i);
    if (d == nullptr) continue;
    if (!d->guard->fused && !used[i]) {  // no bound of it is needed
      d->guard.reset();
      d->bounded = false;
      continue;
    }
    Guard& g = *d->guard;
    auto link = [&](int id) -> const Op* {
      int j = producer(id, i);
      if (j < 0) return nullptr;
      used[(size_t)j] = 1;
      return e.ops[(size_t)j].get();
    };
    g.src_from = link(g.src);
    for (auto& t : g.chain)
      if (t.tensor >= 0 && t.fixed == INFINITY) t.from = link(t.tensor);
  }
  for (size_t i = 0; i < e.ops.size(); ++i) {
    DnnlOp* d = guard_of(i);
    if (d == nullptr) continue;
    Guard& g = *d->guard;
    g.gain = g.weights >= 0 ? weight_gain(e, g.weights, g.reduced) : 1.0;
    g.offset = g.bias >= 0 ? max_magnitude(e, g.bias) : 0.0;
    if (!(g.gain < INFINITY && g.offset < INFINITY)) {
      d->guard.reset();
      d->bounded = false;
    }
  }
  // an own kernel's bound that no reader uses: not tracked (KernelTail::track)
  for (size_t i = 0; i < e.ops.size(); ++i) {
    KernelTail* tail = used[i] ? nullptr : e.ops[i]->kernel_tail();
    if (tail == nullptr) continue;
    tail->track = false;
    e.ops[i]->bounded = false;
    e.ops[i]->out_bound = INFINITY;
  }
}

bool special_input(Engine& e, const DnnlOp& op, bool nonfinite) {
  // a bound at most kLimit: every value finite (its producer's guard or own kernel, this call)
  if (op.in_from != nullptr && op.in_from->bounded && op.in_from->out_bound <= kLimit) return false;
  return has_special(e, op.ins[0], nonfinite);
}

double input_bound(Engine& e, const DnnlOp& op) {
  if (op.in_from != nullptr && op.in_from->bounded && op.in_from->out_bound <= kLimit)
    return op.in_from->out_bound;
  return max_magnitude(e, op.ins[0]);
}

void guard_note(Engine& e, DnnlOp& op, double base) {
  if (!op.guard) {
    op.out_bound = INFINITY;
    return;
  }
  Guard& g = *op.guard;
  double peak;
  double b = g.walk(e, false, &peak, base);
  op.out_bound = peak <= kLimit && b <= kLimit ? b : INFINITY;
  if (g.fused) ++g.fused_calls;
}

bool guard_counts(const Op& op, int64_t* counts) {
  auto* d = dynamic_cast<const DnnlOp*>(&op);
  if (d == nullptr || !d->guard || !d->guard->fused) return false;
  counts[0] = d->guard->fused_calls;
  counts[1] = d->guard->exact_calls;
  return true;
}

}  // namespace ofc
