// opforge cpu backend engine: the types every op family shares.
//
// A delegate's graph is built once at init from calls that carry a hostile blob's numbers,
// and run with one call per execution. The build of every op goes through two steps, in
// this order and never the other:
//
//   1. validate (validate.cpp): the checks common to all ops (ids, operand counts, which
//      tensors may be written), then the op kind's contract (in the op family's file:
//      ranks, dtypes, shapes, layouts, storage spans with checked arithmetic, a work bound);
//   2. build (the same family file): primitives, reordered weights, loop plans.
//
// Nothing in step 2 may rely on a property step 1 did not check. Sizes, strides, offsets
// and element counts are combined only through the checked helpers below (add_c, mul_c).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ofc {

using dnnl::memory;
using tag = memory::format_tag;
using dims_t = std::vector<int64_t>;

constexpr int32_t kAbiVersion = 8;
constexpr int kMaxRank = 8;
constexpr int64_t kMaxElements = (int64_t)1 << 40;  // any tensor's span, any walk's reach

// opforge ScalarType codes
// (F16, BF16: a KV cache's storage only: state buffers, the cache write, the attention op
// reading it (half.h); validate() refuses them in every other op)
enum Dtype : int32_t { U8 = 0, I8 = 1, I16 = 2, I32 = 3, I64 = 4, F16 = 5, F32 = 6, F64 = 7,
                       BOOL = 11, BF16 = 15 };

// how a tensor gets its memory (ofc_add_tensor's `storage`). BORROWED_CONST: a constant
// whose bytes the caller keeps alive and unchanged for the engine's life (the blob's
// mapping), 64-byte aligned: read in place, never copied or written, so every engine of a
// dynamic delegate's shapes shares them. BOUND_STATE: a delegate input the blob marks as
// program state (a KV cache), bound per execute like an input and, unlike one, writable:
// the one tensor kind a delegate may write that it does not own or produce
enum Storage : int32_t { BOUND_OUTPUT = 0, OWNED = 1, BOUND_INPUT = 2, BORROWED_CONST = 3,
                         BOUND_STATE = 4 };

[[noreturn]] inline void fail(const std::string& what) { throw std::runtime_error(what); }
// `text` into a caller's buffer of `size` bytes (an error message, a description), cut to fit
void set_error(char* error, int32_t size, const std::string& text);

// checked int64 arithmetic: a hostile size never wraps
inline int64_t add_c(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(std::string(what) + ": size arithmetic overflows");
  return r;
}
inline int64_t mul_c(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(std::string(what) + ": size arithmetic overflows");
  return r;
}

size_t itemsize(int32_t dt);
memory::data_type dnnl_type(int32_t dt);

struct Tensor {
  int32_t dtype = F32;
  dims_t dims, strides;      // elements
  int64_t span = 0;          // elements from the first to one past the last reachable
  int64_t numel = 0;         // product of dims (checked)
  int base = -1;             // an alias of root tensor `base` at `offset` elements
  int64_t offset = 0;
  int32_t storage = BOUND_OUTPUT;
  std::vector<char> store;   // owned (intermediates, constants)
  void* data = nullptr;      // current pointer (set per execute for inputs/outputs)
  bool is_const = false;
  bool borrowed = false;     // a BORROWED_CONST: data is the caller's, stable for the engine's life
  // a borrowed constant that is also bytes [file_offset, + its size) of the open file
  // file_fd (ofc_tensor_file): a gather reads its rows with pread instead of through the
  // mapping, so the rows it reads never become this process's resident pages
  int file_fd = -1;
  int64_t file_offset = 0;
  // its pages (of a read-only file mapping) may be dropped once copied at init: a large
  // weight is reordered in chunks, each chunk's source pages dropped after it (reorder_const)
  bool drop_after_copy = false;
  memory::desc md() const {  // a 0-d tensor is one element to oneDNN
    if (dims.empty()) return memory::desc({1}, dnnl_type(dtype), memory::dims{1});
    // a size-1 dim addresses nothing, but oneDNN orders dims by stride when it matches a
    // layout: a small stride there (a deconvolution's [1,4,8,8] with strides [4,32,1,256])
    // made it pick a kernel that wrote outside the destination. Give each size-1 dim the
    // stride a dense layout would (what the lowering writes), as its reach is unchanged.
    dims_t tidy = strides;
    for (size_t k = 0; k < dims.size(); ++k) {
      if (dims[k] != 1) continue;
      int64_t s = 1;
      for (size_t j = k + 1; j < dims.size(); ++j)
        if (dims[j] != 1) s = std::max(s, strides[j] * dims[j]);  // <= span + stride < 2^41
      tidy[k] = s;
    }
    return memory::desc(dims, dnnl_type(dtype), tidy);
  }
};

struct Engine;

// Constants in the layouts primitives want, shared by every engine of one loaded program
// (a dynamic delegate's engine per call shape; a prefill and a decode delegate reading the
// same named weights, stored once in the program): keyed by the borrowed source bytes'
// address and both memory descriptors, so each weight is reordered once, not once per shape
// or delegate. Owned by the caller (ofc_weight_cache_new/free), which frees it after every
// engine that uses it; engines of different delegates may be built at once (one method
// calling a dynamic delegate while another loads), so lookups and inserts hold the mutex.
struct WeightCache {
  struct Entry {
    const void* src;
    memory::desc have, want;
    memory mem;
    std::shared_ptr<void> owner;  // mem's bytes where constants.cpp mapped them, else null
  };
  std::mutex mu;
  std::vector<Entry> entries;
  int64_t bytes = 0;
  std::shared_ptr<void> slab;  // where constants.cpp places its smaller entries, bytes used
  size_t slab_used = 0;
};

struct KernelTail;

struct Op {
  std::vector<int> ins, outs;
  std::string name;
  int threads = 0;  // its OpenMP threads (core.cpp's op_threads); 0: the engine's
  // this call's bound on |every value of its output| when known, else inf, so readers that
  // would scan their input for NaN or a bound need not (link_guards). `bounded`: the op sets
  // it on every call: a DnnlOp while it has its guard (guard.cpp), the engine's own
  // convolution kernels from the values they store (KernelTail)
  double out_bound = INFINITY;
  bool bounded = false;
  virtual ~Op() = default;
  virtual void run(Engine& e) = 0;
  // an own kernel's post-ops and output peaks (KernelTail), else null
  virtual KernelTail* kernel_tail() { return nullptr; }
  // the tensors it reads besides `ins` after writing its output (the binary operands of an
  // own kernel's in-place post-ops); part of run_reads
  virtual void late_reads(std::vector<int>&) const {}
  // What run() reads and writes, by tensor id (an alias stands for its root's bytes): the
  // one declaration every pass that needs it reads. The memory plan keeps each intermediate
  // live from its first to its last op here, so no op's output takes bytes another still
  // reads (memory_plan.cpp); finalize checks each has memory and frees the constants no op
  // reads at run time (core.cpp). A tensor run() reads but this omits is a use of freed or
  // reused bytes: timm cait's layer scale, read only by the few-row matmul's in-place
  // post-op (late_reads), was freed by a pass that did not look there. With
  // OPFORGE_CPU_CHECK_READS=1 such a read fails (core.cpp's poison_dead). Default: ins and
  // late_reads; outs.
  virtual void run_reads(std::vector<int>& ids) const {
    ids.insert(ids.end(), ins.begin(), ins.end());
    late_reads(ids);
  }
  virtual void run_writes(std::vector<int>& ids) const { ids.insert(ids.end(), outs.begin(), outs.end()); }
};

struct Engine {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<int> inputs, outputs;
  int threads = 1;
  bool finalized = false;
  int64_t max_bytes = 0, used_bytes = 0;
  // the intermediates' arena (memory_plan.cpp): its bytes, the sum of the intermediates it
  // holds (what one buffer each would take), and intermediates read before written (alone)
  std::vector<char> arena;
  int64_t arena_bytes = 0, intermediate_bytes = 0, unplanned_bytes = 0;
  bool profile = false;               // OPFORGE_CPU_PROFILE=1: per-op times on stderr at destroy
  // OPFORGE_CPU_CHECK_READS=1 (read at finalize, for tests): no constant or intermediate
  // outlives the last op whose run_reads declares it (core.cpp's poison_dead); dead[i]: the
  // intermediates whose last declared use is op i (memory_plan.cpp), poisoned after it
  bool check_reads = false;
  std::vector<std::vector<int>> dead;
  std::vector<double> op_seconds;
  int64_t runs = 0;
  WeightCache* weights = nullptr;     // shared reordered constants (ofc_use_weight_cache)
  std::vector<std::shared_ptr<void>> owned;  // constants' bytes mapped by constants.cpp
  // the own kernels' working memory (the Winograd convolution's transformed blocks), one
  // buffer for all of them as ops run one at a time: sized at build (grow_scratch, counted)
  std::vector<char> scratch;
  ~Engine();

  void* ptr(int id) {                 // aliases name their root directly (ofc_add_tensor)
    Tensor& t = tensors[(size_t)id];
    if (t.base >= 0)
      return static_cast<char*>(tensors[(size_t)t.base].data) + t.offset * (int64_t)itemsize(t.dtype);
    return t.data;
  }
  int root(int id) const { return tensors[(size_t)id].base >= 0 ? tensors[(size_t)id].base : id; }
  // elements from tensor id's first element to the end of its root's storage
  int64_t avail(int id) const {
    const Tensor& t = tensors[(size_t)id];
    return t.base >= 0 ? tensors[(size_t)t.base].span - t.offset : t.span;
  }
  // every allocation the engine makes at init is counted here before it happens
  void reserve(int64_t bytes, const std::string& what);
};

// post-ops: eltwise (alg, alpha, beta) or binary (alg, tensor id)
struct PostOp {
  bool binary = false;
  int code = 0;
  dnnl::algorithm alg = dnnl::algorithm::undef;
  float alpha = 0, beta = 0;
  int tensor = -1;
};

// one op as the blob states it; what validate() checks and a builder builds
struct OpCall {
  std::string kind;
  std::vector<int> ins, outs;
  std::vector<int64_t> ia;
  std::vector<double> fa;
  std::vector<PostOp> post;
};

struct Handle {
  Engine e;
  std::vector<PostOp> pending_post;   // post-ops for the next op added
};

// --- memory planning (memory_plan.cpp): at finalize, before any op runs
void plan_intermediates(Engine& e);

// --- the validation layer (validate.cpp) --------------------------------------------------
void validate(const Engine& e, const OpCall& call);
// the common checks of a call-out (external/kernel) op: contiguous, within storage, not
// writing anything read-only
void validate_callout(const Engine& e, const std::vector<int>& ins, const std::vector<int>& outs,
                      const char* what);

// helpers the contracts share
bool read_only(const Engine& e, int id);            // a constant or a delegate input (not state)
bool row_major(const Tensor& t);
bool dense(const Tensor& t);                        // elements fill [0, span) exactly
dims_t dnnl_dims(const Tensor& t);                  // as oneDNN sees it: 0-d is {1}
bool injective(const dims_t& dims, const dims_t& strides);  // no element reached twice
void check_reach(const dims_t& dims, const dims_t& strides, int64_t off, int64_t span,
                 const char* what);
int64_t count_of(const dims_t& dims, const char* what);
void need(bool ok, const std::string& kind, const std::string& what);
void need_rank(const Tensor& t, size_t lo, size_t hi, const std::string& kind, const char* what);
void need_dtype(const Tensor& t, int32_t dt, const std::string& kind, const char* what);
void need_count(const OpCall& c, size_t n_in, size_t n_out);
void need_dnnl_operand(const Engine& e, int id, const std::string& kind, const char* what);
void need_post_ops_allowed(const OpCall& c, bool allowed);
// f32 source and destination of one shape (and oneDNN-shaped when dnnl_operands)
void same_shape_f32(const Engine& e, const OpCall& c, bool dnnl_operands);
dims_t take(const std::vector<int64_t>& ia, size_t& k, size_t n);

// --- oneDNN glue (core.cpp) ----------------------------------------------------------------
// PyTorch's NaN semantics where oneDNN's kernels lose a NaN (nan.cpp): relu, clamp,
// hardsigmoid and exp eltwise, binary max/min. A post-op chain runs in oneDNN up to its
// first such post-op; that one and the rest run after the primitive, in place on the
// output (own NaN-exact loops, or oneDNN in-place primitives for the others).
bool nan_unsafe(const PostOp& p);
bool nan_unsafe_eltwise(int code, float alpha);
float eltwise_exact(int code, float alpha, float beta, float x);
void eltwise_exact_flat(int code, float alpha, float beta, const float* in, float* out, int64_t n);
float binary_exact(int code, float a, float b);
bool has_nan(Engine& e, int id);  // any NaN in tensor id's elements (a strided walk)
bool has_special(Engine& e, int id, bool nonfinite);  // NaN, or (nonfinite) also ±inf

struct Epilogue {
  struct Step {
    PostOp p;
    bool own = false;              // a NaN-exact loop, else an in-place oneDNN primitive
    dnnl::primitive prim;
    memory dst_mem, src1_mem;
    dims_t b_strides;              // own binary: the operand's strides over dst dims (0: broadcast)
  };
  std::vector<Step> steps;
  std::vector<PostOp> pending;     // set by make_attr, prepared by push_op
  void prepare(Engine& e, int dst);
  void run(Engine& e, int dst);
  void reads(std::vector<int>& ids) const { for (auto& s : steps) if (s.p.binary) ids.push_back(s.p.tensor); }
};

// a post-op an own kernel runs in its registers: 0 linear (a·x + b), 1 clip [a, b] (relu:
// [0, inf]), NaN-exact as max(a, v) then min(b, v) with v the operand a NaN passes through
struct RegisterPostOp {
  int kind;
  float a, b;
};
// the leading post-ops of the kinds above (eltwise linear, clip, relu without slope) into
// `out`; returns the index of the first other one (the rest, for an Epilogue), or -1 when a
// binary post-op comes anywhere (nan.cpp)
int register_post_ops(const std::vector<PostOp>& post, std::vector<RegisterPostOp>& out);
// a register post-op as one clamped multiply-add, v = min(hi, max(lo, v·a + b)): linear has
// lo = -inf, hi = inf; clip has a = 1, b = 0 (exact, but -0 becomes +0). max(lo, v) and
// min(hi, v) return v when either is NaN, so a NaN stays NaN as in torch (the engine's own
// convolution kernels, depthwise.cpp and smallconv.cpp; nan.cpp)
struct ClampStep {
  float a, b, lo, hi;
  static ClampStep of(const RegisterPostOp& p);
};
// what the engine's own convolution kernels share after their sums (depthwise.cpp,
// smallconv.cpp; nan.cpp): up to three register post-ops as clamped multiply-adds, the
// largest |value| stored per output row (NaN: a NaN there) for the op's output bound, and
// the post-ops that run in place after the kernel
struct KernelTail {
  static constexpr int kMaxSteps = 3;
  ClampStep steps[kMaxSteps] = {};
  int nsteps = 0;
  std::vector<float> peaks;
  // the kernel tracks the peaks: false when no reader uses the op's bound (link_guards),
  // which saves the kernel an |abs|, a max and a NaN test per vector it stores
  bool track = true;
  // the op can prove its bound from its input's instead (wants_input: link_guards finds
  // in_from, the earlier op whose bound covers the input)
  bool wants_input = false;
  const Op* in_from = nullptr;
  Epilogue rest;
  // c's post-ops from `post` (register_post_ops's, its first other one at first_rest): the
  // first ones in registers, the others after; `rows` peaks (counted); op becomes bounded.
  // Returns the number in registers.
  int prepare(Engine& e, Op& op, const OpCall& c, const std::vector<RegisterPostOp>& post, int first_rest,
              int64_t rows);
  // after a call's sums: op's out_bound (the largest peak; inf where one is NaN or post-ops
  // run after the kernel), then those post-ops
  void finish(Engine& e, Op& op);
  // this call's input bound from in_from: inf when there is none or it proves nothing
  double input_bound() const;
  // a bound on |every output| from a bound `pre` on |every sum + bias| (finite inputs and
  // weights, so no NaN): through the register post-ops; inf with post-ops after the kernel
  double through_steps(double pre) const;
  // finish() for a call whose sums were bounded by through_steps' `bound` (no peaks)
  void finish_proven(Engine& e, Op& op, double bound);
};
#if defined(__x86_64__)
// the largest |value| an own kernel stored in a row, and the lanes that were NaN
struct Peak {
  __m512 top;
  __mmask16 nan;
};
#endif
// a [N, C, ...] tensor's channels one element apart
inline bool channels_contiguous(const Tensor& t) { return t.dims[1] == 1 || t.strides[1] == 1; }

struct Guard;  // guard.cpp

struct DnnlOp : Op {
  dnnl::primitive prim;
  Epilogue epilogue;
  std::shared_ptr<Guard> guard;    // bounds, and the fused op a NaN-free call runs (guard.cpp)
  // an op that scans its input for NaN (max pooling, max/min reductions, oneDNN's softmax)
  // sets scans_input; link_guards then finds in_from, the guarded or bounded op whose bound
  // covers that input, and a call whose bound proves it finite skips the scan (special_input)
  bool scans_input = false;
  const Op* in_from = nullptr;
  std::vector<std::pair<int, int>> tensor_args;        // (DNNL_ARG_*, tensor id)
  std::vector<std::pair<int, memory>> fixed_args;      // weights, scratchpad
  std::vector<std::pair<int, memory>> bound;           // memories bound to tensors
  std::vector<memory::desc> mds;                       // one per tensor_args entry
  std::unordered_map<int, memory> args;                 // bound + fixed, made at the first run
  void arg(int dnnl_arg, int id, const memory::desc& md) {
    tensor_args.emplace_back(dnnl_arg, id);
    mds.push_back(md);
  }
  // every memory descriptor's bytes fit its tensor's storage: called before any primitive
  void check_fits(const Engine& e) const;
  void bind(Engine& e);
  void run(Engine& e) override;
  // its primitive's operands (tensor_args, its destination too), its Epilogue's and
  // late_reads. Not `ins`: they also name the constants its build copied (reorder_const,
  // derived_const) and run() reads only through those copies, which finalize may free.
  // Every other tensor its run() reads (a NaN scan's input, an own kernel's) is one of
  // these; a guard's fused op reads a subset of them (guard.cpp).
  void run_reads(std::vector<int>& ids) const override;
};

int64_t md_reach_bytes(const memory::desc& md, int64_t item);
dnnl::algorithm alg_of(int code);
bool is_eltwise_code(int code);
bool is_binary_code(int code);
// the post-ops up to the first NaN-unsafe one (all of them when !nan_exact: integer
// outputs hold no NaN); the rest go to op->epilogue
dnnl::primitive_attr make_attr(Engine& e, const std::vector<PostOp>& post, DnnlOp* op,
                               bool nan_exact = true);
memory new_memory(Engine& e, const memory::desc& md, const char* what);  // counted
memory reorder_const(Engine& e, int id, const memory::desc& want);
// a constant's transform made once at init by `fill` into `want`'s bytes (the Winograd
// weights), shared through the weight cache like reorder_const; `want`'s dims must differ
// from the constant's (the cache key: no reorder of it has them)
memory derived_const(Engine& e, int id, const memory::desc& want, const std::function<void(float*)>& fill);
void grow_scratch(Engine& e, int64_t bytes);  // Engine::scratch to at least `bytes`, counted
void add_scratchpad(Engine& e, DnnlOp* op, const memory::desc& md);
void push_op(Engine& e, std::unique_ptr<Op> op, const OpCall& c);

// --- the NaN guard (guard.cpp) ------------------------------------------------------------
// attach to a convolution or matmul with constant weights (and bias): `reduced` marks the
// weight dims one output sums over; `fused` builds the same op with every post-op in
// oneDNN (weights shared with `op`), or returns null. A binary op passes weights -1.
void attach_guard(Engine& e, DnnlOp& op, const OpCall& c, int weights, int bias,
                  const std::vector<bool>& reduced,
                  const std::function<std::unique_ptr<DnnlOp>(const DnnlOp&)>& fused);
bool guard_run(Engine& e, DnnlOp& op);  // true: the fused op ran this call
void link_guards(Engine& e);            // at finalize: producers, and the used guards' weight bounds
// op's input may hold a NaN (or with nonfinite, an inf) this call: false when its
// producer's bound proves every value finite, else the scan (has_special)
bool special_input(Engine& e, const DnnlOp& op, bool nonfinite);
// an op's guard calls: [fused, exact]; false when it has no fused op
bool guard_counts(const Op& op, int64_t* counts);
// the bound on |op's input| this call: its producer's (link_guards, scans_input) when that
// proves it finite, else the input's largest magnitude (a scan; inf for a NaN or inf)
double input_bound(Engine& e, const DnnlOp& op);
// an op that computed its output another way (the Winograd kernel) on a call its own check
// proved finite, every value before its post-ops at most `base`: its out_bound through its
// guard's chain (inf without a guard), and the call counted as a fused one
void guard_note(Engine& e, DnnlOp& op, double base);

// the OpenMP threads op `c` runs with: one for a small op, else the engine's (threads.cpp)
int op_threads(const Engine& e, const OpCall& c);

// body(i) for each i in [0, n): on `team` OpenMP threads (a static schedule) when team > 1
// and n > 1, else a plain loop. A parallel region costs ~0.3-1 µs to enter even with one
// thread or a false if() clause (libgomp makes a team): a third of a small op's call.
template <typename F>
void parallel_for(int team, int64_t n, F&& body) {
  if (team > 1 && n > 1) {
#pragma omp parallel for num_threads(team) schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// the engine's own vector kernels (the softmax rows, the int8 and float depthwise and the
// small and Winograd convolutions, the few-row matmul, the copy transposes and interleaves,
// the AVX-512 quantize) may be used
// (threads.cpp): false with OPFORGE_CPU_CAPABILITY=default (read when an op is built),
// which keeps oneDNN's primitives and the plain loops everywhere; each kernel also checks
// its CPU's features
bool own_kernels_allowed();
// a kernel's own switch: the environment variable `env` unset or not "0" (read when an op
// is built; threads.cpp)
bool switched_on(const char* env);
// own_kernels_allowed(), on a CPU with AVX-512F, and switched_on(env)
bool avx512_kernel_allowed(const char* env);
// own_kernels_allowed(), on a CPU with AVX2 and FMA, and switched_on(env)
bool avx2_kernel_allowed(const char* env);
#if defined(__x86_64__)
// the copy's own kernels (transpose.cpp; the caller checks the CPU's features): 8×8 tiles
// of out[j·so + i] = in[j + i·si] (avx2), and c (2-4) planes interleaved,
// out[p·c + ch] = in[ch·si + p] for p < n (4 bytes: avx2, 1 byte: ssse3)
void transpose32(const uint32_t* in, int64_t si, uint32_t* out, int64_t so, int64_t nj, int64_t ni);
void interleave32(const uint32_t* in, int64_t si, uint32_t* out, int64_t c, int64_t n);
void interleave8(const uint8_t* in, int64_t si, uint8_t* out, int64_t c, int64_t n);
#endif
// a matmul of at most 8 rows against constant weights (any number of rows on an AVX2 CPU
// without AVX-512) on the engine's own kernel (small_matmul.cpp), when the call and the CPU
// allow it; false: build it on oneDNN
bool build_small_matmul(Handle& h, const OpCall& c);
// an int8 depthwise 3×3 convolution on the engine's own kernel (qdepthwise.cpp), when the
// call and the CPU allow it; false: build it on oneDNN
bool build_qdepthwise(Handle& h, const OpCall& c);
// a float32 depthwise 3×3 convolution on the engine's own kernel (depthwise.cpp), when the
// call and the CPU allow it; false: build it on oneDNN
bool build_depthwise(Handle& h, const OpCall& c);
// a float32 convolution of at most 2^21 multiply-adds, direct on the engine's own kernel
// (smallconv.cpp), when the call and the CPU allow it; false: build it on oneDNN
bool build_small_conv(Handle& h, const OpCall& c);
// a 3×3 stride-1 convolution as Winograd F(4×4, 3×3) (winograd.cpp), when the call and the
// CPU allow it: the op with its kernel's part made (convolution.cpp adds the direct oneDNN
// convolution it runs on calls the kernel cannot prove finite); else null
std::unique_ptr<DnnlOp> winograd_shell(Engine& e, const OpCall& c);
bool winograd_counts(const Op& op, int64_t* counts);  // [Winograd calls, direct calls]

// --- op families: each a contract and a builder ------------------------------------------
#define OFC_FAMILY(name)                                 \
  void contract_##name(const Engine& e, const OpCall& c); \
  void build_##name(Handle& h, const OpCall& c);
OFC_FAMILY(conv)        // convolution.cpp: conv, deconv
OFC_FAMILY(matmul)      // matmul.cpp
OFC_FAMILY(pool)        // pooling.cpp
OFC_FAMILY(eltwise)     // eltwise.cpp: eltwise, binary
OFC_FAMILY(binary)
OFC_FAMILY(softmax)     // softmax.cpp
OFC_FAMILY(layer_norm)  // normalization.cpp: layer_norm, rms_norm, group_norm
OFC_FAMILY(rms_norm)
OFC_FAMILY(group_norm)
OFC_FAMILY(rope)        // rotary.cpp
OFC_FAMILY(attention)   // attention.cpp: over a KV cache's filled slots
OFC_FAMILY(reduction)   // reduction.cpp: reduction (oneDNN), reduce (loop)
OFC_FAMILY(reduce)
OFC_FAMILY(copy)        // copy.cpp: copy, ew (generic elementwise)
OFC_FAMILY(ew)
OFC_FAMILY(int8)        // quantization.cpp: qconv, qmatmul, quant
OFC_FAMILY(quant)
OFC_FAMILY(embedding)   // embedding.cpp
OFC_FAMILY(indexing)    // indexing.cpp: index, index_put, index_copy
OFC_FAMILY(int_matmul)  // int_matmul.cpp: integer weights dequantized in registers
OFC_FAMILY(int_embedding)  // int_embedding.cpp: rows of an integer table
OFC_FAMILY(int_dot_matmul)  // int_dot_matmul.cpp: int8 activations · int8/int4 weights, integer dots
#undef OFC_FAMILY
}  // namespace ofc
