// opforge cpu backend engine: the C API (ofc_*) that builds and runs an engine, tensors,
// the memory limit, threads, and the oneDNN glue every primitive family shares (what an
// engine reports about itself, its profile and queries, is inspect.cpp). Op kinds live one family per file
// (convolution.cpp, matmul.cpp, ...), each with its contract; validate.cpp checks every op
// against its contract before its family's builder runs.
//
// Every tensor has explicit dims and strides (elements), chosen by the lowering in Python:
// channels-last for convolution chains, row-major elsewhere, aliases for free views.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include <sys/stat.h>

#include "engine.h"
#include "opforge/cpu_external.h"
#include "opforge/kernel_abi.h"

namespace ofc {

size_t itemsize(int32_t dt) {
  switch (dt) {
    case U8: case I8: case BOOL: return 1;
    case I16: case F16: case BF16: return 2;
    case I32: case F32: return 4;
    case I64: case F64: return 8;
    default: fail("unsupported dtype code " + std::to_string(dt));
  }
}

memory::data_type dnnl_type(int32_t dt) {
  switch (dt) {
    case F32: return memory::data_type::f32;
    case I32: return memory::data_type::s32;
    case I8: return memory::data_type::s8;
    case U8: return memory::data_type::u8;
    default: fail("dtype code " + std::to_string(dt) + " has no oneDNN type");
  }
}

void set_error(char* error, int32_t size, const std::string& text) {
  if (error && size > 0) std::snprintf(error, (size_t)size, "%s", text.c_str());
}

void Engine::reserve(int64_t bytes, const std::string& what) {
  if (bytes < 0) fail(what + ": negative size");
  int64_t total = add_c(used_bytes, bytes, what.c_str());
  if (total > max_bytes)
    fail(what + " needs " + std::to_string(bytes) + " bytes, over the delegate's memory limit (" +
         std::to_string(used_bytes) + " of " + std::to_string(max_bytes) + " bytes in use)");
  used_bytes = total;
}

namespace {

void* aligned_alloc64(Engine& e, std::vector<char>& store, int64_t bytes, const std::string& what) {
  e.reserve(add_c(bytes, 64, what.c_str()), what);
  store.assign((size_t)bytes + 64, 0);
  uintptr_t p = reinterpret_cast<uintptr_t>(store.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

// the thread count the engine was given, for the calling thread, for the span of one call
// (oneDNN sizes its kernels' thread teams from omp_get_max_threads() when a primitive is
// made and runs them with that many; OpenMP's default is one per core)
struct ThreadScope {
  int saved;
  explicit ThreadScope(int threads) : saved(omp_get_max_threads()) {
    if (saved != threads) omp_set_num_threads(threads);
  }
  ~ThreadScope() {
    if (omp_get_max_threads() != saved) omp_set_num_threads(saved);
  }
};

int check_id(const Engine& e, int64_t id, const char* what) {
  if (id < 0 || id >= (int64_t)e.tensors.size())
    fail(std::string(what) + ": tensor id " + std::to_string(id) + " out of range");
  return (int)id;
}

std::vector<int> ids(const Engine& e, const int32_t* p, int32_t n, const char* what) {
  if (n < 0 || n > 64 || (n > 0 && p == nullptr)) fail(std::string(what) + ": bad count");
  std::vector<int> out;
  for (int32_t i = 0; i < n; ++i) out.push_back(check_id(e, p[i], what));
  return out;
}

using Builder = void (*)(Handle&, const OpCall&);

const std::unordered_map<std::string, Builder>& builders() {
  static const std::unordered_map<std::string, Builder> table = {
      {"conv", build_conv},           {"deconv", build_conv},       {"matmul", build_matmul},
      {"pool", build_pool},           {"eltwise", build_eltwise},   {"binary", build_binary},
      {"softmax", build_softmax},     {"layer_norm", build_layer_norm}, {"rms_norm", build_rms_norm}, {"rope", build_rope},
      {"attention", build_attention},
      {"group_norm", build_group_norm}, {"reduction", build_reduction}, {"reduce", build_reduce},
      {"copy", build_copy},           {"ew", build_ew},             {"qconv", build_int8},
      {"qmatmul", build_int8},        {"quant", build_quant},       {"embedding", build_embedding},
      {"index", build_indexing},      {"index_put", build_indexing}, {"index_copy", build_indexing},
      {"int_matmul", build_int_matmul}, {"int_embedding", build_int_embedding},
      {"int_dot_matmul", build_int_dot_matmul},
  };
  return table;
}

// OPFORGE_CPU_CHECK_READS=1: the intermediates whose last declared use was op i (each in
// its own bytes, memory_plan.cpp) filled with 0xff bytes (float NaN, integer -1), so an op
// that reads one later than its run_reads says computes from NaN; finalize withdrew the
// constants no op declares, borrowed ones too, so a read of one faults
void poison_dead(Engine& e, size_t i) {
  for (int r : e.dead[i]) {
    const Tensor& t = e.tensors[(size_t)r];
    std::memset(t.data, 0xff, (size_t)t.span * itemsize(t.dtype));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// oneDNN glue
// the bytes a memory descriptor addresses from its start: for a plain strided layout, one
// past its farthest element (get_size() rounds a slice's strides up to whole rows); for a
// blocked layout, get_size()
int64_t md_reach_bytes(const memory::desc& md, int64_t item) {
  if (md.get_format_kind() != memory::format_kind::blocked || md.get_inner_nblks() != 0)
    return (int64_t)md.get_size();
  memory::dims dims = md.get_padded_dims(), strides = md.get_strides();
  int64_t reach = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0) return 0;
    reach = add_c(reach, mul_c(dims[k] - 1, strides[k], "memory descriptor"), "memory descriptor");
  }
  return mul_c(reach, item, "memory descriptor");
}

void DnnlOp::check_fits(const Engine& e) const {
  for (size_t i = 0; i < tensor_args.size(); ++i) {
    int id = tensor_args[i].second;
    int64_t item = (int64_t)itemsize(e.tensors[(size_t)id].dtype);
    int64_t have = mul_c(e.avail(id), item, "storage");
    int64_t want = md_reach_bytes(mds[i], item);
    if (want > have || (int64_t)mds[i].get_size() < 0)
      fail(name + ": oneDNN would address " + std::to_string(want) + " bytes of tensor " +
           std::to_string(id) + ", which has " + std::to_string(have));
  }
}

void DnnlOp::bind(Engine& e) {
  for (size_t i = 0; i < tensor_args.size(); ++i)
    bound.emplace_back(tensor_args[i].first, memory(mds[i], e.eng, DNNL_MEMORY_NONE));
}

void DnnlOp::run_reads(std::vector<int>& ids) const {
  for (auto& a : tensor_args) ids.push_back(a.second);
  epilogue.reads(ids);
  late_reads(ids);
}

void DnnlOp::run(Engine& e) {
  if (guard && guard_run(e, *this)) return;  // ran fused
  // the argument map is made at the first call and kept: its memories are handles shared
  // with ``bound``, so pointing those at this call's tensors updates it (no allocation per
  // call; a decoder step runs hundreds of ops)
  if (args.empty()) {
    for (auto& b : bound) args.emplace(b.first, b.second);
    for (auto& f : fixed_args) args.emplace(f.first, f.second);
  }
  for (size_t i = 0; i < bound.size(); ++i)
    bound[i].second.set_data_handle(e.ptr(tensor_args[i].second));
  prim.execute(e.strm, args);
  e.strm.wait();
  if (!epilogue.steps.empty()) epilogue.run(e, outs[0]);
}

namespace {
const dnnl::algorithm kEltwise[] = {
    dnnl::algorithm::eltwise_relu, dnnl::algorithm::eltwise_tanh, dnnl::algorithm::eltwise_elu,
    dnnl::algorithm::eltwise_square, dnnl::algorithm::eltwise_abs, dnnl::algorithm::eltwise_sqrt,
    dnnl::algorithm::eltwise_linear, dnnl::algorithm::eltwise_soft_relu,
    dnnl::algorithm::eltwise_logistic, dnnl::algorithm::eltwise_exp,
    dnnl::algorithm::eltwise_gelu_tanh, dnnl::algorithm::eltwise_swish,
    dnnl::algorithm::eltwise_log, dnnl::algorithm::eltwise_clip_v2,
    dnnl::algorithm::eltwise_pow, dnnl::algorithm::eltwise_gelu_erf,
    dnnl::algorithm::eltwise_round, dnnl::algorithm::eltwise_mish,
    dnnl::algorithm::eltwise_hardswish, dnnl::algorithm::eltwise_hardsigmoid,
};
// binary algorithms from code 100
const dnnl::algorithm kBinary[] = {
    dnnl::algorithm::binary_add, dnnl::algorithm::binary_sub, dnnl::algorithm::binary_mul,
    dnnl::algorithm::binary_div, dnnl::algorithm::binary_max, dnnl::algorithm::binary_min,
};
constexpr int kNumEltwise = (int)(sizeof(kEltwise) / sizeof(kEltwise[0]));
constexpr int kNumBinary = (int)(sizeof(kBinary) / sizeof(kBinary[0]));
}  // namespace

bool is_eltwise_code(int code) { return code >= 0 && code < kNumEltwise; }
bool is_binary_code(int code) { return code >= 100 && code < 100 + kNumBinary; }

dnnl::algorithm alg_of(int code) {
  if (is_eltwise_code(code)) return kEltwise[code];
  if (is_binary_code(code)) return kBinary[code - 100];
  fail("unknown algorithm code " + std::to_string(code));
}

dnnl::primitive_attr make_attr(Engine& e, const std::vector<PostOp>& post, DnnlOp* op, bool nan_exact) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
  dnnl::post_ops po;
  int index = 0;
  size_t first_unsafe = post.size();
  for (size_t i = 0; nan_exact && i < post.size(); ++i)
    if (nan_unsafe(post[i])) { first_unsafe = i; break; }
  op->epilogue.pending.assign(post.begin() + (long)first_unsafe, post.end());
  for (size_t i = 0; i < first_unsafe; ++i) {
    const PostOp& p = post[i];
    if (p.binary) {
      memory::desc md = e.tensors[(size_t)p.tensor].md();
      po.append_binary(p.alg, md);
      op->arg(DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1, p.tensor, md);
    } else {
      po.append_eltwise(p.alg, p.alpha, p.beta);
    }
    ++index;
  }
  attr.set_post_ops(po);
  return attr;
}

memory new_memory(Engine& e, const memory::desc& md, const char* what) {
  e.reserve((int64_t)md.get_size(), what);
  return memory(md, e.eng);
}

void grow_scratch(Engine& e, int64_t bytes) {
  const int64_t have = (int64_t)e.scratch.size();
  if (bytes <= have) return;
  e.reserve(bytes - have, "the own kernels' scratch");
  e.scratch.resize((size_t)bytes);
}

void add_scratchpad(Engine& e, DnnlOp* op, const memory::desc& md) {
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, new_memory(e, md, "a scratchpad"));
}

void push_op(Engine& e, std::unique_ptr<Op> op, const OpCall& c) {
  op->ins = c.ins;
  op->outs = c.outs;
  if (auto* d = dynamic_cast<DnnlOp*>(op.get())) d->epilogue.prepare(e, c.outs[0]);
  e.ops.push_back(std::move(op));
}

}  // namespace ofc

using namespace ofc;

extern "C" {

int32_t ofc_abi_version() { return kAbiVersion; }

void* ofc_new(int32_t threads, int64_t max_bytes, char* error, int32_t size) {
  try {
    auto h = new Handle();
    // more threads than this machine's processors only oversubscribe it (and a hostile
    // count would exhaust the process): at most omp_get_num_procs(), at least 1
    h->e.threads = std::max(1, std::min<int>(threads, omp_get_num_procs()));
    h->e.max_bytes = max_bytes > 0 ? max_bytes : (int64_t)1 << 33;
    return h;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return nullptr;
  }
}

void ofc_destroy(void* handle) { delete static_cast<Handle*>(handle); }

void* ofc_weight_cache_new() {
  try {
    return new WeightCache();
  } catch (const std::exception&) {
    return nullptr;
  }
}

void ofc_weight_cache_free(void* cache) { delete static_cast<WeightCache*>(cache); }

// what the engine allocated at init (counted against its memory limit)
int64_t ofc_used_bytes(void* handle) { return handle ? static_cast<Handle*>(handle)->e.used_bytes : 0; }

int64_t ofc_weight_cache_bytes(void* cache) {
  if (!cache) return 0;
  auto* c = static_cast<WeightCache*>(cache);
  std::lock_guard<std::mutex> lock(c->mu);
  return c->bytes;
}

// before any op is added: reordered borrowed constants come from (and go to) ``cache``
int32_t ofc_use_weight_cache(void* handle, void* cache, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  if (h->e.finalized || !h->e.ops.empty() || cache == nullptr) {
    set_error(error, size, "a weight cache given after ops were added, or none");
    return 1;
  }
  h->e.weights = static_cast<WeightCache*>(cache);
  return 0;
}

// a tensor: dims/strides in elements; data: constant bytes (copied) or null; base >= 0:
// alias; storage: 1 owned intermediate (memory planned at finalize), 0 an output and 2 an
// input bound per execute, 3 a constant borrowed (data read in place, never copied: the
// caller keeps it alive and unchanged until ofc_destroy), 4 a state input (bound per
// execute like an input, and writable)
int32_t ofc_add_tensor(void* handle, int32_t dtype, int32_t ndim, const int64_t* dims,
                       const int64_t* strides, const void* data, int64_t nbytes, int32_t base,
                       int64_t offset, int32_t storage, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (e.finalized) fail("tensor added after finalize");
    if (ndim < 0 || ndim > kMaxRank) fail("rank out of range");
    if (storage != BOUND_OUTPUT && storage != OWNED && storage != BOUND_INPUT &&
        storage != BORROWED_CONST && storage != BOUND_STATE)
      fail("storage kind");
    if (storage == BORROWED_CONST && (data == nullptr || base >= 0 ||
                                      reinterpret_cast<uintptr_t>(data) % 64 != 0))
      fail("a borrowed constant without 64-byte-aligned data");
    Tensor t;
    t.dtype = dtype;
    t.storage = storage == BORROWED_CONST ? BOUND_OUTPUT : storage;  // as a copied constant
    int64_t is = (int64_t)itemsize(dtype);
    t.dims.assign(dims, dims + ndim);
    t.strides.assign(strides, strides + ndim);
    int64_t span = 1;
    for (int k = 0; k < ndim; ++k)
      if (t.dims[(size_t)k] < 0 || t.dims[(size_t)k] > kMaxElements || t.strides[(size_t)k] < 0 ||
          t.strides[(size_t)k] > kMaxElements)
        fail("bad dims or strides");
    t.numel = count_of(t.dims, "tensor");
    if (t.numel == 0) span = 0;
    for (int k = 0; k < ndim && span > 0; ++k)
      span = add_c(span, mul_c(t.dims[(size_t)k] - 1, t.strides[(size_t)k], "tensor"), "tensor");
    if (span > kMaxElements) fail("tensor too large");
    t.span = span;
    if (base >= 0) {
      check_id(e, base, "alias base");
      const Tensor& b = e.tensors[(size_t)base];
      if (b.dtype != dtype || offset < 0 || offset > kMaxElements ||
          (span > 0 && add_c(offset, span, "alias") > b.span))
        fail("alias outside its base");
      // name the root directly: one level to follow at run time, whatever the chain
      t.base = b.base >= 0 ? b.base : base;
      t.offset = add_c(offset, b.base >= 0 ? b.offset : 0, "alias");
      t.is_const = b.is_const;
      t.storage = b.storage;
    } else if (data != nullptr) {
      if (nbytes != mul_c(span, is, "constant")) fail("constant byte count does not match its shape");
      if (storage == BORROWED_CONST) {
        t.data = const_cast<void*>(data);  // never written: validate.cpp refuses writes to constants
        t.borrowed = true;
      } else {
        t.data = aligned_alloc64(e, t.store, nbytes, "a constant");
        std::memcpy(t.data, data, (size_t)nbytes);
      }
      t.is_const = true;
    } else if (storage == OWNED) {
      mul_c(span, is, "intermediate");  // its memory comes at finalize (memory_plan.cpp)
    }  // an input or output, bound per execute
    e.tensors.push_back(std::move(t));
    return (int32_t)e.tensors.size() - 1;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return -1;
  }
}

// constant `id` (a borrowed one, not an alias) is also bytes [offset, offset + its size) of
// the open, regular file `fd`, which the caller keeps open and unchanged until ofc_destroy
// (as it keeps the borrowed bytes), mapped read-only and shared where it is borrowed from:
// gathers read its rows from the file (EmbeddingOp); flags bit 0: its pages may be dropped
// once an op has copied it at init (reorder_const)
int32_t ofc_tensor_file(void* handle, int32_t id, int32_t fd, int64_t offset, int32_t flags,
                        char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (e.finalized) fail("file source set after finalize");
    check_id(e, id, "file source");
    Tensor& t = e.tensors[(size_t)id];
    if (!t.borrowed || t.base >= 0) fail("a file source for a tensor that is not a borrowed constant");
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail("a file source that is not an open regular file");
    int64_t nbytes = mul_c(t.span, (int64_t)itemsize(t.dtype), "file source");
    if (offset < 0 || add_c(offset, nbytes, "file source") > (int64_t)st.st_size)
      fail("a file source outside its file (offset " + std::to_string(offset) + ", " +
           std::to_string(nbytes) + " bytes, file of " + std::to_string((int64_t)st.st_size) + ")");
    if (flags & ~1) fail("file source flags " + std::to_string(flags));
    t.file_fd = fd;
    t.file_offset = offset;
    t.drop_after_copy = (flags & 1) != 0;
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

// post-ops for the next op: kind 0 eltwise (alg, alpha, beta), 1 binary (alg, tensor)
int32_t ofc_post_op(void* handle, int32_t kind, int32_t alg, double alpha, double beta, int32_t tensor,
                    char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    PostOp p;
    p.binary = kind == 1;
    if (kind != 0 && kind != 1) fail("post-op kind");
    if (p.binary ? !is_binary_code(alg) : !is_eltwise_code(alg))
      fail("post-op algorithm code " + std::to_string(alg));
    p.code = alg;
    p.alg = alg_of(alg);
    p.alpha = (float)alpha; p.beta = (float)beta;
    if (p.binary) p.tensor = check_id(h->e, tensor, "post-op");
    if (h->pending_post.size() >= 32) fail("too many post-ops");
    h->pending_post.push_back(p);
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

int32_t ofc_add_op(void* handle, const char* kind, const int32_t* ins, int32_t n_in,
                   const int32_t* outs, int32_t n_out, const int64_t* iattr, int32_t n_iattr,
                   const double* fattr, int32_t n_fattr, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (e.finalized) fail("op added after finalize");
    if (kind == nullptr) fail("no op kind");
    if (n_iattr < 0 || n_iattr > 4096 || n_fattr < 0 || n_fattr > 64) fail("bad attribute count");
    OpCall c;
    c.kind = kind;
    c.ins = ids(e, ins, n_in, kind);
    c.outs = ids(e, outs, n_out, kind);
    c.ia.assign(iattr, iattr + n_iattr);
    c.fa.assign(fattr, fattr + n_fattr);
    c.post = std::move(h->pending_post);
    h->pending_post.clear();
    validate(e, c);
    const int threads = op_threads(e, c);
    const size_t first = e.ops.size();
    ThreadScope scope(threads);  // primitives size their thread teams now
    builders().at(c.kind)(*h, c);
    for (size_t i = first; i < e.ops.size(); ++i) e.ops[i]->threads = threads;
    return 0;
  } catch (const dnnl::error& ex) {
    h->pending_post.clear();
    set_error(error, size, std::string(kind ? kind : "?") + ": oneDNN: " + ex.what() +
                               " (status " + std::to_string((int)ex.status) + ")");
    return 1;
  } catch (const std::exception& ex) {
    h->pending_post.clear();
    set_error(error, size, ex.what());  // the validation layer names the kind
    return 1;
  }
}

int32_t ofc_finalize(void* handle, const int32_t* inputs, int32_t n_in, const int32_t* outputs,
                     int32_t n_out, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (e.finalized) fail("finalized twice");
    if (!h->pending_post.empty()) fail("post-ops without an op");
    e.inputs = ids(e, inputs, n_in, "inputs");
    e.outputs = ids(e, outputs, n_out, "outputs");
    // every tensor an op touches must have memory: its own, its root's, or a bound input or
    // output (a hostile blob could name a tensor it gave no storage)
    std::vector<char> io(e.tensors.size(), 0);
    for (int id : e.inputs) {
      const Tensor& t = e.tensors[(size_t)id];
      if (t.base >= 0 || (t.storage != BOUND_INPUT && t.storage != BOUND_STATE) || io[(size_t)id] ||
          t.span != t.numel)
        fail("input tensor " + std::to_string(id) + " is not a dense, unaliased input");
      io[(size_t)id] = 1;
    }
    for (int id : e.outputs) {
      const Tensor& t = e.tensors[(size_t)id];
      if (t.base >= 0 || t.storage != BOUND_OUTPUT || t.data != nullptr || io[(size_t)id] || t.span != t.numel)
        fail("output tensor " + std::to_string(id) + " is not a dense, unaliased output");
      io[(size_t)id] = 1;
    }
    const char* check = std::getenv("OPFORGE_CPU_CHECK_READS");
    e.check_reads = check && check[0] == '1';
    plan_intermediates(e);
    link_guards(e);
    // every tensor an op names or touches (Op::run_reads, run_writes) has memory; the
    // constants no op reads at run time, those read only through their reordered copies
    // (the weights of convolutions and matmuls), are freed (halves the memory of
    // weight-heavy models). A read through an alias keeps the alias's root.
    auto backed = [&](int id) {
      int r = e.root(id);
      return io[(size_t)r] || e.tensors[(size_t)r].data != nullptr;
    };
    std::vector<char> read(e.tensors.size(), 0);
    std::vector<int> reads, writes;
    for (auto& op : e.ops) {
      for (int id : op->ins) if (!backed(id)) fail(op->name + ": reads tensor " + std::to_string(id) + ", which has no memory");
      for (int id : op->outs) if (!backed(id)) fail(op->name + ": writes tensor " + std::to_string(id) + ", which has no memory");
      reads.clear();
      writes.clear();
      op->run_reads(reads);
      op->run_writes(writes);
      for (const auto* list : {&reads, &writes})
        for (int id : *list) {
          if (!backed(id)) fail(op->name + ": uses a tensor without memory");
          read[(size_t)e.root(id)] = 1;
        }
    }
    for (size_t i = 0; i < e.tensors.size(); ++i) {
      Tensor& t = e.tensors[i];
      if (!t.is_const || t.base >= 0 || read[i]) continue;
      if (!t.store.empty()) {
        e.used_bytes -= (int64_t)t.store.size();
        std::vector<char>().swap(t.store);
        t.data = nullptr;
      } else if (e.check_reads) {
        t.data = nullptr;  // a borrowed one too: an undeclared read faults on every run
      }
    }
    e.finalized = true;
    const char* profile = std::getenv("OPFORGE_CPU_PROFILE");
    e.profile = profile && profile[0] == '1';
    e.op_seconds.assign(e.ops.size(), 0.0);
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

int32_t ofc_execute(void* handle, void* const* inputs, void* const* outputs, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (!e.finalized) fail("execute before finalize");
    for (size_t k = 0; k < e.inputs.size(); ++k) e.tensors[(size_t)e.inputs[k]].data = inputs[k];
    for (size_t k = 0; k < e.outputs.size(); ++k) e.tensors[(size_t)e.outputs[k]].data = outputs[k];
    ThreadScope scope(e.threads);
    int current = e.threads;
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Op& op = *e.ops[i];
      const int want = op.threads > 0 ? op.threads : e.threads;  // as its primitives were made
      if (want != current) omp_set_num_threads(current = want);
      if (!e.profile && !e.check_reads) {
        op.run(e);
        continue;
      }
      double t0 = omp_get_wtime();
      op.run(e);
      e.op_seconds[i] += omp_get_wtime() - t0;
      if (e.check_reads) poison_dead(e, i);
    }
    if (e.profile) ++e.runs;
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

}  // extern "C"
