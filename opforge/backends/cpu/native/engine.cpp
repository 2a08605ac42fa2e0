// opforge cpu backend engine: a delegate's graph, built once at init from validated calls,
// run with one call per execution. Heavy ops are oneDNN primitives (weights reordered once,
// post-op fusion); view, copy and small elementwise/reduction ops are stride-generic loops.
// Every tensor has explicit dims and strides (elements), chosen by the lowering in Python:
// channels-last for convolution chains, row-major elsewhere, aliases for free views.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "opforge/cpu_external.h"
#include "opforge/kernel_abi.h"

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dims_t = std::vector<int64_t>;

constexpr int32_t kAbiVersion = 1;
constexpr int kMaxRank = 8;

// opforge ScalarType codes
enum Dtype : int32_t { U8 = 0, I8 = 1, I16 = 2, I32 = 3, I64 = 4, F32 = 6, F64 = 7, BOOL = 11 };

size_t itemsize(int32_t dt) {
  switch (dt) {
    case U8: case I8: case BOOL: return 1;
    case I16: return 2;
    case I32: case F32: return 4;
    case I64: case F64: return 8;
    default: throw std::runtime_error("unsupported dtype code " + std::to_string(dt));
  }
}

memory::data_type dnnl_type(int32_t dt) {
  switch (dt) {
    case F32: return memory::data_type::f32;
    case I32: return memory::data_type::s32;
    case I8: return memory::data_type::s8;
    case U8: return memory::data_type::u8;
    default: throw std::runtime_error("dtype code " + std::to_string(dt) + " has no oneDNN type");
  }
}

struct Tensor {
  int32_t dtype = F32;
  dims_t dims, strides;      // elements
  int64_t span = 0;          // elements from the first to one past the last reachable
  int base = -1;             // an alias of tensor `base` at `offset` elements
  int64_t offset = 0;
  std::vector<char> storage; // owned (intermediates, constants)
  void* data = nullptr;      // current pointer (set per execute for inputs/outputs)
  bool is_const = false;
  memory::desc md() const {  // a 0-d tensor is one element to oneDNN
    if (dims.empty()) return memory::desc({1}, dnnl_type(dtype), memory::dims{1});
    return memory::desc(dims, dnnl_type(dtype), strides);
  }
};

struct Engine;

struct Op {
  std::vector<int> ins, outs;
  std::string name;
  virtual ~Op() = default;
  virtual void run(Engine& e) = 0;
};

struct Engine {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<int> inputs, outputs;
  int threads = 1;
  bool finalized = false;
  size_t max_bytes = 0, used_bytes = 0;
  bool profile = false;               // OPFORGE_CPU_PROFILE=1: per-op times on stderr at destroy
  std::vector<double> op_seconds;
  int64_t runs = 0;
  ~Engine() {
    if (!profile || runs == 0) return;
    for (size_t i = 0; i < ops.size(); ++i)
      std::fprintf(stderr, "opforge cpu: op %zu %-28s %9.2f us\n", i, ops[i]->name.c_str(),
                   op_seconds[i] / (double)runs * 1e6);
  }

  void* ptr(int id) {
    Tensor& t = tensors[id];
    if (t.base >= 0) return static_cast<char*>(ptr(t.base)) + t.offset * (int64_t)itemsize(t.dtype);
    return t.data;
  }
};

void fail(const std::string& what) { throw std::runtime_error(what); }

void* aligned_alloc64(std::vector<char>& store, size_t bytes) {
  store.assign(bytes + 64, 0);
  uintptr_t p = reinterpret_cast<uintptr_t>(store.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

// ---------------------------------------------------------------------------------------
// oneDNN primitives
struct DnnlOp : Op {
  dnnl::primitive prim;
  std::vector<std::pair<int, int>> tensor_args;        // (DNNL_ARG_*, tensor id)
  std::vector<std::pair<int, memory>> fixed_args;      // weights, scratchpad
  std::vector<std::pair<int, memory>> bound;           // memories bound to tensors
  void bind(Engine& e, const std::vector<memory::desc>& mds) {
    for (size_t i = 0; i < tensor_args.size(); ++i)
      bound.emplace_back(tensor_args[i].first, memory(mds[i], e.eng, DNNL_MEMORY_NONE));
  }
  void run(Engine& e) override {
    std::unordered_map<int, memory> args;
    for (size_t i = 0; i < bound.size(); ++i) {
      bound[i].second.set_data_handle(e.ptr(tensor_args[i].second));
      args.emplace(bound[i].first, bound[i].second);
    }
    for (auto& f : fixed_args) args.emplace(f.first, f.second);
    prim.execute(e.strm, args);
    e.strm.wait();
  }
};

// post-ops: eltwise (alg, alpha, beta) or binary (alg, tensor id)
struct PostOp {
  bool binary = false;
  dnnl::algorithm alg;
  float alpha = 0, beta = 0;
  int tensor = -1;
};

dnnl::primitive_attr make_attr(Engine& e, const std::vector<PostOp>& post, DnnlOp* op,
                               std::vector<memory::desc>& mds) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
  dnnl::post_ops po;
  int binary_index = 0;
  for (const auto& p : post) {
    if (p.binary) {
      memory::desc md = e.tensors[p.tensor].md();
      po.append_binary(p.alg, md);
      op->tensor_args.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(binary_index) | DNNL_ARG_SRC_1,
                                   p.tensor);
      mds.push_back(md);
    } else {
      po.append_eltwise(p.alg, p.alpha, p.beta);
    }
    ++binary_index;
  }
  attr.set_post_ops(po);
  return attr;
}

memory reorder_const(Engine& e, int id, const memory::desc& want) {
  Tensor& t = e.tensors[id];
  memory src(t.md(), e.eng, e.ptr(id));
  memory dst(want, e.eng);
  dnnl::reorder(src, dst).execute(e.strm, src, dst);
  e.strm.wait();
  return dst;
}

dnnl::algorithm alg_of(int code) {
  static const dnnl::algorithm table[] = {
      dnnl::algorithm::eltwise_relu, dnnl::algorithm::eltwise_tanh, dnnl::algorithm::eltwise_elu,
      dnnl::algorithm::eltwise_square, dnnl::algorithm::eltwise_abs, dnnl::algorithm::eltwise_sqrt,
      dnnl::algorithm::eltwise_linear, dnnl::algorithm::eltwise_soft_relu,
      dnnl::algorithm::eltwise_logistic, dnnl::algorithm::eltwise_exp,
      dnnl::algorithm::eltwise_gelu_tanh, dnnl::algorithm::eltwise_swish,
      dnnl::algorithm::eltwise_log, dnnl::algorithm::eltwise_clip_v2,
      dnnl::algorithm::eltwise_pow, dnnl::algorithm::eltwise_gelu_erf,
      dnnl::algorithm::eltwise_round, dnnl::algorithm::eltwise_mish,
      dnnl::algorithm::eltwise_hardswish, dnnl::algorithm::eltwise_hardsigmoid,
      // binary algorithms from 100
  };
  static const dnnl::algorithm bin[] = {
      dnnl::algorithm::binary_add, dnnl::algorithm::binary_sub, dnnl::algorithm::binary_mul,
      dnnl::algorithm::binary_div, dnnl::algorithm::binary_max, dnnl::algorithm::binary_min,
  };
  if (code >= 0 && code < (int)(sizeof(table) / sizeof(table[0]))) return table[code];
  if (code >= 100 && code < 100 + (int)(sizeof(bin) / sizeof(bin[0]))) return bin[code - 100];
  fail("unknown algorithm code " + std::to_string(code));
  return dnnl::algorithm::undef;
}

}  // namespace

// The builder receives plain arrays from Python (which parsed and checked the blob); every
// id and size is checked again here before use.
struct Builder;
extern "C" {

struct ofc_engine;

}  // extern "C"

namespace {

struct Handle {
  Engine e;
  std::vector<PostOp> pending_post;   // post-ops for the next op added
  std::string error;
};

int check_id(Engine& e, int64_t id, const char* what) {
  if (id < 0 || id >= (int64_t)e.tensors.size()) fail(std::string(what) + ": tensor id " +
                                                      std::to_string(id) + " out of range");
  return (int)id;
}

void set_error(char* error, int32_t size, const std::string& text) {
  if (error && size > 0) {
    std::snprintf(error, (size_t)size, "%s", text.c_str());
  }
}

// --- convolution / deconvolution --------------------------------------------------------
// ia: [nsp, strides[nsp], pad_l[nsp], pad_r[nsp], dil[nsp] (torch: 1 = none), has_bias]
struct ConvOp : DnnlOp {};

void add_conv(Handle& h, bool transposed, const std::vector<int>& ins, const std::vector<int>& outs,
              const std::vector<int64_t>& ia) {
  Engine& e = h.e;
  if (ins.size() < 2 || outs.size() != 1 || ia.empty()) fail("conv: bad arity");
  int64_t nsp = ia[0];
  if (nsp < 1 || nsp > 3 || (int64_t)ia.size() != 2 + 4 * nsp) fail("conv: bad attributes");
  memory::dims strides(ia.begin() + 1, ia.begin() + 1 + nsp), pl(ia.begin() + 1 + nsp, ia.begin() + 1 + 2 * nsp),
      pr(ia.begin() + 1 + 2 * nsp, ia.begin() + 1 + 3 * nsp), dil(ia.begin() + 1 + 3 * nsp, ia.begin() + 1 + 4 * nsp);
  for (auto& d : dil) d -= 1;
  bool has_bias = ia[1 + 4 * nsp] != 0;
  if (has_bias != (ins.size() == 3)) fail("conv: bias count");
  auto op = std::make_unique<ConvOp>();
  op->name = transposed ? "deconvolution" : "convolution";
  const Tensor& w = e.tensors[ins[1]];
  if (!w.is_const) fail("conv: weights must be constant");
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  memory::desc wany(w.dims, memory::data_type::f32, tag::any);
  memory::desc bias = has_bias ? memory::desc({w.dims[transposed ? 1 : 0] * 1}, memory::data_type::f32, tag::x)
                               : memory::desc();
  if (has_bias) bias = memory::desc(e.tensors[ins[2]].dims, memory::data_type::f32, tag::x);
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  if (!transposed) {
    auto pd = dnnl::convolution_forward::primitive_desc(
        e.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wany,
        bias, dst, strides, dil, pl, pr, attr);
    op->prim = dnnl::convolution_forward(pd);
    op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, ins[1], pd.weights_desc()));
    op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  } else {
    auto pd = dnnl::deconvolution_forward::primitive_desc(
        e.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, src, wany,
        bias, dst, strides, dil, pl, pr, attr);
    op->prim = dnnl::deconvolution_forward(pd);
    op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, ins[1], pd.weights_desc()));
    op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  }
  if (has_bias) op->fixed_args.emplace_back(DNNL_ARG_BIAS, reorder_const(e, ins[2], bias));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- int8 convolution / matmul (8a8w): u8 activations with a per-tensor scale and zero
// point, s8 weights with per-output-channel scales (zero points 0), an f32 bias, u8 output.
// ins [x_u8, w_s8, w_scales f32, (bias f32)]; fa [x_scale, y_scale]; ia [x_zp, y_zp, mask,
// has_bias, (conv: nsp, strides, pad_l, pad_r, dilation)]
memory scalar_memory(Engine& e, memory::data_type dt, double value) {
  memory m(memory::desc({1}, dt, tag::x), e.eng);
  if (dt == memory::data_type::f32) *static_cast<float*>(m.get_data_handle()) = (float)value;
  else *static_cast<int32_t*>(m.get_data_handle()) = (int32_t)value;
  return m;
}

void add_int8(Handle& h, bool conv, const std::vector<int>& ins, const std::vector<int>& outs,
              const std::vector<int64_t>& ia, const std::vector<double>& fa) {
  Engine& e = h.e;
  if (ins.size() < 3 || ins.size() > 4 || outs.size() != 1 || fa.size() != 2 || ia.size() < 4)
    fail("int8 op: bad arity");
  const Tensor& x = e.tensors[ins[0]];
  const Tensor& w = e.tensors[ins[1]];
  const Tensor& ws = e.tensors[ins[2]];
  const Tensor& y = e.tensors[outs[0]];
  bool has_bias = ia[3] != 0;
  if (has_bias != (ins.size() == 4)) fail("int8 op: bias count");
  if (x.dtype != U8 || w.dtype != I8 || !w.is_const || ws.dtype != F32 || !ws.is_const || y.dtype != U8)
    fail("int8 op: dtypes (u8 activations, constant s8 weights, f32 scales)");
  if (!(fa[0] > 0) || !(fa[1] > 0) || !std::isfinite(fa[0]) || !std::isfinite(fa[1])) fail("int8 op: scales");
  int mask = (int)ia[2];
  auto op = std::make_unique<DnnlOp>();
  op->name = conv ? "int8 convolution" : "int8 matmul";
  memory::desc src = x.md(), dst = y.md();
  memory::desc wany(w.dims, memory::data_type::s8, tag::any);
  memory::desc bias = has_bias ? e.tensors[ins[3]].md() : memory::desc();
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  attr.set_scales_mask(DNNL_ARG_SRC, 0);
  attr.set_scales_mask(DNNL_ARG_WEIGHTS, mask);
  attr.set_scales_mask(DNNL_ARG_DST, 0);
  attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  attr.set_zero_points_mask(DNNL_ARG_DST, 0);
  memory::desc wmd;
  if (conv) {
    int64_t nsp = ia.size() > 4 ? ia[4] : 0;
    if (nsp < 1 || nsp > 3 || (int64_t)ia.size() != 5 + 4 * nsp) fail("int8 conv: attributes");
    auto at = [&](int k) { return memory::dims(ia.begin() + 5 + k * nsp, ia.begin() + 5 + (k + 1) * nsp); };
    memory::dims strides = at(0), pl = at(1), pr = at(2), dil = at(3);
    for (auto& d : dil) d -= 1;
    auto pd = dnnl::convolution_forward::primitive_desc(
        e.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wany,
        bias, dst, strides, dil, pl, pr, attr);
    op->prim = dnnl::convolution_forward(pd);
    wmd = pd.weights_desc();
    op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  } else {
    auto pd = dnnl::matmul::primitive_desc(e.eng, src, wany, bias, dst, attr);
    op->prim = dnnl::matmul(pd);
    wmd = pd.weights_desc();
    op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  }
  op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, ins[1], wmd));
  if (has_bias) op->fixed_args.emplace_back(DNNL_ARG_BIAS, reorder_const(e, ins[3], bias));
  memory wscale(memory::desc({ws.span}, memory::data_type::f32, tag::x), e.eng);
  std::memcpy(wscale.get_data_handle(), e.ptr(ins[2]), (size_t)ws.span * sizeof(float));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, wscale);
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, scalar_memory(e, memory::data_type::f32, fa[0]));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, scalar_memory(e, memory::data_type::f32, fa[1]));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, scalar_memory(e, memory::data_type::s32, (double)ia[0]));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, scalar_memory(e, memory::data_type::s32, (double)ia[1]));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- matmul: a [.., M, K] x b [.., K, N] (+ bias broadcast) -------------------------------
void add_matmul(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs) {
  Engine& e = h.e;
  if (ins.size() < 2 || ins.size() > 3 || outs.size() != 1) fail("matmul: bad arity");
  auto op = std::make_unique<DnnlOp>();
  op->name = "matmul";
  const Tensor& b = e.tensors[ins[1]];
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  memory::desc wmd = b.is_const ? memory::desc(b.dims, memory::data_type::f32, tag::any) : b.md();
  memory::desc bias = ins.size() == 3 ? e.tensors[ins[2]].md() : memory::desc();
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  if (!b.is_const) { op->tensor_args.emplace_back(DNNL_ARG_WEIGHTS, ins[1]); mds.push_back(wmd); }
  if (ins.size() == 3 && !e.tensors[ins[2]].is_const) {
    op->tensor_args.emplace_back(DNNL_ARG_BIAS, ins[2]); mds.push_back(bias);
  }
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  auto pd = dnnl::matmul::primitive_desc(e.eng, src, wmd, bias, dst, attr);
  op->prim = dnnl::matmul(pd);
  if (b.is_const) op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, ins[1], pd.weights_desc()));
  if (ins.size() == 3 && e.tensors[ins[2]].is_const)
    op->fixed_args.emplace_back(DNNL_ARG_BIAS, reorder_const(e, ins[2], bias));
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- pooling: ia [kind (0 max, 1 avg incl. pad, 2 avg excl. pad), nsp, k, s, pl, pr, dil]
void add_pool(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs,
              const std::vector<int64_t>& ia) {
  Engine& e = h.e;
  if (ins.size() != 1 || outs.size() != 1 || ia.size() < 2) fail("pool: bad arity");
  int64_t nsp = ia[1];
  if (nsp < 1 || nsp > 3 || (int64_t)ia.size() != 2 + 5 * nsp) fail("pool: bad attributes");
  auto at = [&](int k) { return memory::dims(ia.begin() + 2 + k * nsp, ia.begin() + 2 + (k + 1) * nsp); };
  memory::dims k = at(0), s = at(1), pl = at(2), pr = at(3), dil = at(4);
  for (auto& d : dil) d -= 1;
  dnnl::algorithm alg = ia[0] == 0 ? dnnl::algorithm::pooling_max
                       : ia[0] == 1 ? dnnl::algorithm::pooling_avg_include_padding
                                    : dnnl::algorithm::pooling_avg_exclude_padding;
  auto op = std::make_unique<DnnlOp>();
  op->name = "pooling";
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  const Tensor& ts = e.tensors[ins[0]];
  if (ts.dims.size() >= 3 && ts.strides[1] == 1 && ts.dims[1] > 1) {
    // channels-last source: say so for the destination too (a 1×1 output's strides fit
    // either layout, and oneDNN would pick plain and a slow mixed-layout kernel)
    static const tag cl[] = {tag::undef, tag::undef, tag::undef, tag::nwc, tag::nhwc, tag::ndhwc};
    dst = memory::desc(e.tensors[outs[0]].dims, memory::data_type::f32, cl[ts.dims.size()]);
  }
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  auto pd = dnnl::pooling_forward::primitive_desc(e.eng, dnnl::prop_kind::forward_inference, alg,
                                                  src, dst, s, k, dil, pl, pr, attr);
  op->prim = dnnl::pooling_forward(pd);
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- eltwise: ia [alg], fa [alpha, beta] ---------------------------------------------------
void add_eltwise(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs,
                 const std::vector<int64_t>& ia, const std::vector<double>& fa) {
  Engine& e = h.e;
  if (ins.size() != 1 || outs.size() != 1 || ia.size() != 1 || fa.size() != 2) fail("eltwise: bad arity");
  auto op = std::make_unique<DnnlOp>();
  op->name = "eltwise";
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  auto pd = dnnl::eltwise_forward::primitive_desc(e.eng, dnnl::prop_kind::forward_inference,
                                                  alg_of((int)ia[0]), src, dst, (float)fa[0],
                                                  (float)fa[1], attr);
  op->prim = dnnl::eltwise_forward(pd);
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- binary: ia [alg 100+] (src1 broadcasts) -----------------------------------------------
void add_binary(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs,
                const std::vector<int64_t>& ia) {
  Engine& e = h.e;
  if (ins.size() != 2 || outs.size() != 1 || ia.size() != 1) fail("binary: bad arity");
  auto op = std::make_unique<DnnlOp>();
  op->name = "binary";
  memory::desc a = e.tensors[ins[0]].md(), b = e.tensors[ins[1]].md(), dst = e.tensors[outs[0]].md();
  std::vector<memory::desc> mds = {a, b, dst};
  op->tensor_args = {{DNNL_ARG_SRC_0, ins[0]}, {DNNL_ARG_SRC_1, ins[1]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  auto pd = dnnl::binary::primitive_desc(e.eng, alg_of((int)ia[0]), a, b, dst, attr);
  op->prim = dnnl::binary(pd);
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- softmax: ia [axis, log] ---------------------------------------------------------------
void add_softmax(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs,
                 const std::vector<int64_t>& ia) {
  Engine& e = h.e;
  if (ins.size() != 1 || outs.size() != 1 || ia.size() != 2) fail("softmax: bad arity");
  auto op = std::make_unique<DnnlOp>();
  op->name = "softmax";
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  int64_t axis = ia[0];
  if (axis < 0 || axis >= (int64_t)e.tensors[ins[0]].dims.size()) fail("softmax: axis");
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  auto pd = dnnl::softmax_forward::primitive_desc(
      e.eng, dnnl::prop_kind::forward_inference,
      ia[1] ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, src, dst, (int)axis, attr);
  op->prim = dnnl::softmax_forward(pd);
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// --- layer norm over the last dim: ins [x, (scale), (shift)], fa [eps], ia [has_scale, has_shift]
void add_layer_norm(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs,
                    const std::vector<int64_t>& ia, const std::vector<double>& fa) {
  Engine& e = h.e;
  if (outs.size() != 1 || ia.size() != 2 || fa.size() != 1 || ins.size() != 1 + (size_t)(ia[0] != 0) + (size_t)(ia[1] != 0))
    fail("layer_norm: bad arity");
  auto op = std::make_unique<DnnlOp>();
  op->name = "layer_norm";
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  dnnl::normalization_flags flags = dnnl::normalization_flags::none;
  if (ia[0]) flags = flags | dnnl::normalization_flags::use_scale;
  if (ia[1]) flags = flags | dnnl::normalization_flags::use_shift;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
  auto pd = dnnl::layer_normalization_forward::primitive_desc(
      e.eng, dnnl::prop_kind::forward_inference, src, dst, (float)fa[0], flags, attr);
  op->prim = dnnl::layer_normalization_forward(pd);
  if (pd.mean_desc().get_size() > 0) {
    op->fixed_args.emplace_back(DNNL_ARG_MEAN, memory(pd.mean_desc(), e.eng));
    op->fixed_args.emplace_back(DNNL_ARG_VARIANCE, memory(pd.variance_desc(), e.eng));
  }
  size_t k = 1;
  if (ia[0]) { op->tensor_args.emplace_back(DNNL_ARG_SCALE, ins[k]); mds.push_back(e.tensors[ins[k]].md()); ++k; }
  if (ia[1]) { op->tensor_args.emplace_back(DNNL_ARG_SHIFT, ins[k]); mds.push_back(e.tensors[ins[k]].md()); ++k; }
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

void add_generic_reduce(Engine& e, int code, const std::vector<int>& ins, const std::vector<int>& outs);

// --- reduction (f32): ia [alg: 0 sum, 1 mean, 2 max, 3 min]; dst dims 1 on reduced axes.
// Shapes oneDNN has no reduction kernel for run on the generic loop.
void add_reduction(Handle& h, const std::vector<int>& ins, const std::vector<int>& outs,
                   const std::vector<int64_t>& ia) {
  Engine& e = h.e;
  if (ins.size() != 1 || outs.size() != 1 || ia.size() != 1) fail("reduction: bad arity");
  static const dnnl::algorithm algs[] = {dnnl::algorithm::reduction_sum, dnnl::algorithm::reduction_mean,
                                         dnnl::algorithm::reduction_max, dnnl::algorithm::reduction_min};
  if (ia[0] < 0 || ia[0] > 3) fail("reduction: alg");
  auto op = std::make_unique<DnnlOp>();
  op->name = "reduction";
  memory::desc src = e.tensors[ins[0]].md(), dst = e.tensors[outs[0]].md();
  std::vector<memory::desc> mds = {src, dst};
  op->tensor_args = {{DNNL_ARG_SRC, ins[0]}, {DNNL_ARG_DST, outs[0]}};
  auto attr = make_attr(e, h.pending_post, op.get(), mds);
  dnnl::reduction::primitive_desc pd;
  try {
    pd = dnnl::reduction::primitive_desc(e.eng, algs[ia[0]], src, dst, 0.f, 0.f, attr);
  } catch (const dnnl::error&) {
    if (!h.pending_post.empty()) throw;
    add_generic_reduce(e, (int)ia[0], ins, outs);
    return;
  }
  op->prim = dnnl::reduction(pd);
  op->fixed_args.emplace_back(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), e.eng));
  op->bind(e, mds);
  op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// ---------------------------------------------------------------------------------------
// Stride-generic loops (any dtype): copy/cast, n-ary elementwise with broadcasting, reduce,
// embedding, group norm. Inputs are addressed with strides aligned to the output's dims
// (0 where an input broadcasts), given by the lowering.
template <typename F>
void for_each_index(const dims_t& dims, F&& f) {
  int n = (int)dims.size();
  int64_t total = 1;
  for (auto d : dims) total *= d;
  if (total == 0) return;
  int64_t idx[kMaxRank] = {0};
  for (int64_t flat = 0; flat < total; ++flat) {
    f(idx);
    for (int k = n - 1; k >= 0; --k) {
      if (++idx[k] < dims[k]) break;
      idx[k] = 0;
    }
  }
}

// f(idx of the outer dims, n = the innermost extent): one call per row
template <typename F>
void for_each_row(const dims_t& dims, F&& f) {
  if (dims.empty()) { int64_t none[1] = {0}; f(none, (int64_t)1); return; }
  dims_t outer(dims.begin(), dims.end() - 1);
  int64_t n = dims.back();
  if (n == 0) return;
  for_each_index(outer, [&](const int64_t* idx) { f(idx, n); });
}

inline int64_t dot(const int64_t* idx, const dims_t& strides) {
  int64_t off = 0;
  for (size_t k = 0; k < strides.size(); ++k) off += idx[k] * strides[k];
  return off;
}

template <typename T>
inline T load_as(const void* base, int32_t dt, int64_t i) {
  switch (dt) {
    case F32: return (T) static_cast<const float*>(base)[i];
    case F64: return (T) static_cast<const double*>(base)[i];
    case I64: return (T) static_cast<const int64_t*>(base)[i];
    case I32: return (T) static_cast<const int32_t*>(base)[i];
    case I16: return (T) static_cast<const int16_t*>(base)[i];
    case I8: return (T) static_cast<const int8_t*>(base)[i];
    case U8: return (T) static_cast<const uint8_t*>(base)[i];
    case BOOL: return (T)(static_cast<const uint8_t*>(base)[i] != 0);
  }
  return T(0);
}

template <typename T>
inline void store_as(void* base, int32_t dt, int64_t i, T v) {
  switch (dt) {
    case F32: static_cast<float*>(base)[i] = (float)v; return;
    case F64: static_cast<double*>(base)[i] = (double)v; return;
    case I64: static_cast<int64_t*>(base)[i] = (int64_t)v; return;
    case I32: static_cast<int32_t*>(base)[i] = (int32_t)v; return;
    case I16: static_cast<int16_t*>(base)[i] = (int16_t)v; return;
    case I8: static_cast<int8_t*>(base)[i] = (int8_t)v; return;
    case U8: static_cast<uint8_t*>(base)[i] = (uint8_t)v; return;
    case BOOL: static_cast<uint8_t*>(base)[i] = v != T(0); return;
  }
}

// copy: out[idx] = in[in_off + idx·in_strides] over out dims (any strides, same dtype or cast)
struct CopyOp : Op {
  dims_t dims, in_strides, out_strides;
  int64_t in_off = 0, out_off = 0;
  bool use_reorder = false;
  dnnl::reorder reorder;
  memory src_mem, dst_mem;
  void prepare(Engine& e) {
    const Tensor& ti = e.tensors[ins[0]];
    const Tensor& to = e.tensors[outs[0]];
    bool dnnl_type_ok = (ti.dtype == F32 || ti.dtype == I32 || ti.dtype == I8 || ti.dtype == U8) &&
                        (to.dtype == F32 || to.dtype == I32 || to.dtype == I8 || to.dtype == U8);
    int64_t total = 1;
    for (size_t k = 0; k < dims.size(); ++k) {
      total *= dims[k];
      if (in_strides[k] == 0 && dims[k] > 1) dnnl_type_ok = false;  // broadcast: the loop
    }
    if (!dnnl_type_ok || total < 4096 || dims.empty()) return;
    try {
      dims_t is = in_strides, os = out_strides;
      for (size_t k = 0; k < dims.size(); ++k) if (dims[k] == 1) { is[k] = 1; os[k] = 1; }
      memory::desc smd(dims, dnnl_type(ti.dtype), is), dmd(dims, dnnl_type(to.dtype), os);
      src_mem = memory(smd, e.eng, DNNL_MEMORY_NONE);
      dst_mem = memory(dmd, e.eng, DNNL_MEMORY_NONE);
      reorder = dnnl::reorder(dnnl::reorder::primitive_desc(e.eng, smd, e.eng, dmd));
      use_reorder = true;
    } catch (const dnnl::error&) {
      use_reorder = false;  // a layout oneDNN's reorder does not take: the loop
    }
  }
  void run(Engine& e) override {
    if (use_reorder) {
      const Tensor& ti = e.tensors[ins[0]];
      const Tensor& to = e.tensors[outs[0]];
      src_mem.set_data_handle(static_cast<char*>(e.ptr(ins[0])) + in_off * (int64_t)itemsize(ti.dtype));
      dst_mem.set_data_handle(static_cast<char*>(e.ptr(outs[0])) + out_off * (int64_t)itemsize(to.dtype));
      reorder.execute(e.strm, src_mem, dst_mem);
      e.strm.wait();
      return;
    }
    const Tensor& ti = e.tensors[ins[0]];
    const Tensor& to = e.tensors[outs[0]];
    const char* src = static_cast<const char*>(e.ptr(ins[0]));
    char* dst = static_cast<char*>(e.ptr(outs[0]));
    size_t is = itemsize(ti.dtype);
    if (ti.dtype == to.dtype) {
      int n = (int)dims.size();
      // innermost run contiguous on both sides: memcpy rows
      if (n > 0 && in_strides[n - 1] == 1 && out_strides[n - 1] == 1) {
        dims_t outer(dims.begin(), dims.end() - 1);
        int64_t row = dims[n - 1] * (int64_t)is;
        dims_t ins_(in_strides.begin(), in_strides.end() - 1), outs_(out_strides.begin(), out_strides.end() - 1);
        for_each_index(outer, [&](const int64_t* idx) {
          std::memcpy(dst + (out_off + dot(idx, outs_)) * is, src + (in_off + dot(idx, ins_)) * is, row);
        });
        return;
      }
      int r = (int)dims.size();
      dims_t oi(in_strides.begin(), in_strides.end() - (r ? 1 : 0)), oo(out_strides.begin(), out_strides.end() - (r ? 1 : 0));
      int64_t si = r ? in_strides[r - 1] : 0, so = r ? out_strides[r - 1] : 0;
      for_each_row(dims, [&](const int64_t* idx, int64_t n) {
        const char* a = src + (in_off + dot(idx, oi)) * (int64_t)is;
        char* b = dst + (out_off + dot(idx, oo)) * (int64_t)is;
        switch (is) {
          case 4: for (int64_t j = 0; j < n; ++j) reinterpret_cast<uint32_t*>(b)[j * so] = reinterpret_cast<const uint32_t*>(a)[j * si]; break;
          case 8: for (int64_t j = 0; j < n; ++j) reinterpret_cast<uint64_t*>(b)[j * so] = reinterpret_cast<const uint64_t*>(a)[j * si]; break;
          case 1: for (int64_t j = 0; j < n; ++j) b[j * so] = a[j * si]; break;
          default: for (int64_t j = 0; j < n; ++j) std::memcpy(b + j * so * (int64_t)is, a + j * si * (int64_t)is, is);
        }
      });
      return;
    }
    for_each_index(dims, [&](const int64_t* idx) {
      if (to.dtype == F32 || to.dtype == F64 || ti.dtype == F32 || ti.dtype == F64)
        store_as<double>(dst, to.dtype, out_off + dot(idx, out_strides),
                         load_as<double>(src, ti.dtype, in_off + dot(idx, in_strides)));
      else
        store_as<int64_t>(dst, to.dtype, out_off + dot(idx, out_strides),
                          load_as<int64_t>(src, ti.dtype, in_off + dot(idx, in_strides)));
    });
  }
};

enum EwCode {
  EW_ADD = 0, EW_SUB, EW_MUL, EW_DIV, EW_EQ, EW_NE, EW_LT, EW_LE, EW_GT, EW_GE, EW_WHERE,
  EW_LOGICAL_NOT, EW_BITWISE_NOT, EW_NEG, EW_LOGICAL_AND, EW_LOGICAL_OR, EW_MAX, EW_MIN,
  EW_FILL, EW_MASKED_FILL, EW_COUNT
};

// n-ary elementwise; scalars: fa [alpha (add/sub), scalar operand value (when 1 tensor)]
struct EwOp : Op {
  int code = 0;
  dims_t dims, out_strides;
  std::vector<dims_t> in_strides;
  double alpha = 1, scalar = 0;
  bool has_scalar = false;
  template <typename C>
  C apply(C a, C b, C c) const {
    switch (code) {
      case EW_ADD: return a + (C)alpha * b;
      case EW_SUB: return a - (C)alpha * b;
      case EW_MUL: return a * b;
      case EW_DIV: return a / b;
      case EW_EQ: return a == b;
      case EW_NE: return a != b;
      case EW_LT: return a < b;
      case EW_LE: return a <= b;
      case EW_GT: return a > b;
      case EW_GE: return a >= b;
      case EW_WHERE: return a != C(0) ? b : c;
      case EW_LOGICAL_NOT: return a == C(0);
      case EW_BITWISE_NOT: return a == C(0);  // bool only (checked by the lowering)
      case EW_NEG: return -a;
      case EW_LOGICAL_AND: return a != C(0) && b != C(0);
      case EW_LOGICAL_OR: return a != C(0) || b != C(0);
      case EW_MAX: return a > b ? a : b;
      case EW_MIN: return a < b ? a : b;
      case EW_FILL: return (C)scalar;
      case EW_MASKED_FILL: return a != C(0) ? c : b;
    }
    return C(0);
  }
  template <typename C>
  void loop(Engine& e) {
    int n_in = (int)ins.size();
    const void* src[3] = {nullptr, nullptr, nullptr};
    int32_t dts[3] = {F32, F32, F32};
    for (int k = 0; k < n_in; ++k) { src[k] = e.ptr(ins[k]); dts[k] = e.tensors[ins[k]].dtype; }
    void* dst = e.ptr(outs[0]);
    int32_t odt = e.tensors[outs[0]].dtype;
    int r = (int)dims.size();
    dims_t outer_out(out_strides.begin(), out_strides.end() - (r ? 1 : 0));
    std::vector<dims_t> outer_in;
    int64_t inner_in[3] = {0, 0, 0};
    for (int k = 0; k < n_in; ++k) {
      outer_in.emplace_back(in_strides[k].begin(), in_strides[k].end() - (r ? 1 : 0));
      inner_in[k] = r ? in_strides[k][r - 1] : 0;
    }
    int64_t inner_out = r ? out_strides[r - 1] : 0;
    for_each_row(dims, [&](const int64_t* idx, int64_t n) {
      int64_t base_in[3] = {0, 0, 0};
      for (int k = 0; k < n_in; ++k) base_in[k] = dot(idx, outer_in[k]);
      int64_t base_out = dot(idx, outer_out);
      for (int64_t j = 0; j < n; ++j) {
        C v[3] = {C(0), C(0), C(0)};
        for (int k = 0; k < n_in; ++k) v[k] = load_as<C>(src[k], dts[k], base_in[k] + j * inner_in[k]);
        if (has_scalar) v[n_in] = (C)scalar;
        store_as<C>(dst, odt, base_out + j * inner_out, apply<C>(v[0], v[1], v[2]));
      }
    });
  }
  bool integral = false;
  // where / masked_fill on a bool mask and float32 values: the common attention-mask case,
  // typed loops instead of the generic dtype switch
  bool fast_select(Engine& e) {
    if (code != EW_WHERE && code != EW_MASKED_FILL) return false;
    int n_in = (int)ins.size();
    if (e.tensors[outs[0]].dtype != F32 || e.tensors[ins[0]].dtype != BOOL) return false;
    for (int k = 1; k < n_in; ++k) if (e.tensors[ins[k]].dtype != F32) return false;
    const uint8_t* m = static_cast<const uint8_t*>(e.ptr(ins[0]));
    const float* a = static_cast<const float*>(e.ptr(ins[1]));
    const float* b = n_in > 2 ? static_cast<const float*>(e.ptr(ins[2])) : nullptr;
    float sv = (float)scalar;
    float* o = static_cast<float*>(e.ptr(outs[0]));
    int r = (int)dims.size();
    if (r == 0) return false;
    dims_t oo(out_strides.begin(), out_strides.end() - 1), om(in_strides[0].begin(), in_strides[0].end() - 1),
        oa(in_strides[1].begin(), in_strides[1].end() - 1);
    dims_t ob = n_in > 2 ? dims_t(in_strides[2].begin(), in_strides[2].end() - 1) : dims_t(oo.size(), 0);
    int64_t so = out_strides[r - 1], sm = in_strides[0][r - 1], sa = in_strides[1][r - 1],
            sb = n_in > 2 ? in_strides[2][r - 1] : 0;
    bool masked = code == EW_MASKED_FILL;
    for_each_row(dims, [&](const int64_t* idx, int64_t n) {
      const uint8_t* mm = m + dot(idx, om);
      const float* aa = a + dot(idx, oa);
      const float* bb = b ? b + dot(idx, ob) : nullptr;
      float* out = o + dot(idx, oo);
      if (masked)  // mask ? scalar : a
        for (int64_t j = 0; j < n; ++j) out[j * so] = mm[j * sm] ? sv : aa[j * sa];
      else         // mask ? a : b (b a tensor, or the scalar)
        for (int64_t j = 0; j < n; ++j) out[j * so] = mm[j * sm] ? aa[j * sa] : (bb ? bb[j * sb] : sv);
    });
    return true;
  }
  void run(Engine& e) override {
    if (fast_select(e)) return;
    if (integral) loop<int64_t>(e); else loop<double>(e);
  }
};

// reduce over axes (generic dtype): ia [code 0 sum 1 mean 2 max 3 min 4 any 5 all]; out strides 0 on reduced axes
struct ReduceOp : Op {
  int code = 0;
  dims_t dims, in_strides, out_strides;  // dims: the input's
  int64_t count = 1;                     // elements reduced into each output
  void run(Engine& e) override {
    const Tensor& to = e.tensors[outs[0]];
    int64_t n_out = 1;
    for (auto d : to.dims) n_out *= d;
    std::vector<double> acc((size_t)n_out);
    double init = code == 2 ? -INFINITY : code == 3 ? INFINITY : code == 5 ? 1.0 : 0.0;
    std::fill(acc.begin(), acc.end(), init);
    const void* src = e.ptr(ins[0]);
    int32_t dt = e.tensors[ins[0]].dtype;
    // out_strides here address acc (row-major of the output), 0 on reduced axes
    for_each_index(dims, [&](const int64_t* idx) {
      double v = load_as<double>(src, dt, dot(idx, in_strides));
      double& a = acc[(size_t)dot(idx, out_strides)];
      switch (code) {
        case 0: case 1: a += v; break;
        case 2: a = (v > a || std::isnan(v)) ? v : a; break;
        case 3: a = (v < a || std::isnan(v)) ? v : a; break;
        case 4: a = (a != 0 || v != 0) ? 1 : 0; break;
        case 5: a = (a != 0 && v != 0) ? 1 : 0; break;
      }
    });
    void* dst = e.ptr(outs[0]);
    const Tensor& t = to;
    // the output is row-major contiguous (the lowering guarantees it)
    for (int64_t i = 0; i < n_out; ++i) {
      double v = acc[(size_t)i];
      if (code == 1) v /= (double)count;
      store_as<double>(dst, t.dtype, i, v);
    }
  }
};

bool row_major(const Tensor& t);

void add_generic_reduce(Engine& e, int code, const std::vector<int>& ins, const std::vector<int>& outs) {
  const Tensor& ti = e.tensors[ins[0]];
  const Tensor& to = e.tensors[outs[0]];
  if (ti.dims.size() != to.dims.size()) fail("reduction: ranks differ");
  if (!row_major(to)) fail("reduction: the output must be contiguous");
  auto op = std::make_unique<ReduceOp>();
  op->code = code;
  op->dims = ti.dims;
  op->in_strides = ti.strides;
  dims_t row(to.dims.size(), 0);
  int64_t step = 1, count = 1;
  for (int k = (int)to.dims.size() - 1; k >= 0; --k) {
    if (to.dims[(size_t)k] != 1 && to.dims[(size_t)k] != ti.dims[(size_t)k]) fail("reduction: shapes");
    bool reduced = to.dims[(size_t)k] == 1 && ti.dims[(size_t)k] != 1;
    row[(size_t)k] = reduced ? 0 : step;
    if (reduced) count *= ti.dims[(size_t)k];
    step *= to.dims[(size_t)k];
  }
  op->out_strides = row;
  op->count = std::max<int64_t>(count, 1);
  op->name = "reduce"; op->ins = ins; op->outs = outs;
  e.ops.push_back(std::move(op));
}

// per-tensor quantize (f32 → int: clamp(round_half_even(x * (float)(1/scale)) + zp)) or
// dequantize (int → f32: ((float)q - (float)zp) * (float)scale), as quantized_decomposed
// computes them; ia [mode 0 quantize / 1 dequantize, qmin, qmax]; fa [scale, zp]
struct QuantOp : Op {
  int mode = 0;
  int64_t qmin = 0, qmax = 255;
  double scale = 1, zp = 0;
  void run(Engine& e) override {
    const Tensor& ti = e.tensors[ins[0]];
    const Tensor& to = e.tensors[outs[0]];
    int64_t n = ti.span;
    const void* src = e.ptr(ins[0]);
    void* dst = e.ptr(outs[0]);
    if (mode == 0) {
      const float* x = static_cast<const float*>(src);
      float inv = (float)(1.0 / scale), z = (float)zp, lo = (float)qmin, hi = (float)qmax;
      // round half to even without libm: adding and removing 1.5·2^23 rounds in the FPU's
      // default mode (nearest-even) for |v| < 2^22; larger floats are already integers
      auto quant = [&](float xi) {
        float v = xi * inv;
        float r = std::fabs(v) < 4194304.f ? (v + 12582912.f) - 12582912.f : v;
        r += z;
        r = r < lo ? lo : (r > hi ? hi : r);
        return xi != xi ? lo : r;  // NaN: torch's clamp keeps NaN, whose integer cast is undefined
      };
      switch (to.dtype) {
        case U8: { auto* y = static_cast<uint8_t*>(dst); for (int64_t i = 0; i < n; ++i) y[i] = (uint8_t)quant(x[i]); break; }
        case I8: { auto* y = static_cast<int8_t*>(dst); for (int64_t i = 0; i < n; ++i) y[i] = (int8_t)quant(x[i]); break; }
        case I32: { auto* y = static_cast<int32_t*>(dst); for (int64_t i = 0; i < n; ++i) y[i] = (int32_t)quant(x[i]); break; }
        default: for (int64_t i = 0; i < n; ++i) store_as<int64_t>(dst, to.dtype, i, (int64_t)quant(x[i]));
      }
    } else {
      float* y = static_cast<float*>(dst);
      float z = (float)zp, sc = (float)scale;
      switch (ti.dtype) {
        case U8: { auto* q = static_cast<const uint8_t*>(src); for (int64_t i = 0; i < n; ++i) y[i] = ((float)q[i] - z) * sc; break; }
        case I8: { auto* q = static_cast<const int8_t*>(src); for (int64_t i = 0; i < n; ++i) y[i] = ((float)q[i] - z) * sc; break; }
        case I32: { auto* q = static_cast<const int32_t*>(src); for (int64_t i = 0; i < n; ++i) y[i] = ((float)q[i] - z) * sc; break; }
        default: for (int64_t i = 0; i < n; ++i) y[i] = ((float)load_as<int64_t>(src, ti.dtype, i) - z) * sc;
      }
    }
  }
};

// embedding: ins [weight (V, D) contiguous, indices (int64/int32, any shape, contiguous)]
struct EmbeddingOp : Op {
  void run(Engine& e) override {
    const Tensor& w = e.tensors[ins[0]];
    const Tensor& ix = e.tensors[ins[1]];
    int64_t V = w.dims[0], D = w.dims[1];
    int64_t n = 1;
    for (auto d : ix.dims) n *= d;
    const float* wp = static_cast<const float*>(e.ptr(ins[0]));
    const void* ip = e.ptr(ins[1]);
    float* out = static_cast<float*>(e.ptr(outs[0]));
    for (int64_t i = 0; i < n; ++i) {
      int64_t r = load_as<int64_t>(ip, ix.dtype, i);
      if (r < 0 || r >= V)
        fail("embedding: index " + std::to_string(r) + " out of range for " + std::to_string(V) + " rows");
      std::memcpy(out + i * D, wp + r * D, (size_t)D * sizeof(float));
    }
  }
};

// group norm on contiguous (N, C, *): ins [x, (w), (b)], ia [groups, has_w, has_b], fa [eps]
struct GroupNormOp : Op {
  int64_t groups = 1;
  bool has_w = false, has_b = false;
  double eps = 1e-5;
  void run(Engine& e) override {
    const Tensor& x = e.tensors[ins[0]];
    int64_t N = x.dims[0], C = x.dims[1], HW = 1;
    for (size_t k = 2; k < x.dims.size(); ++k) HW *= x.dims[k];
    const float* xp = static_cast<const float*>(e.ptr(ins[0]));
    const float* wp = has_w ? static_cast<const float*>(e.ptr(ins[1])) : nullptr;
    const float* bp = has_b ? static_cast<const float*>(e.ptr(ins[1 + (has_w ? 1 : 0)])) : nullptr;
    float* out = static_cast<float*>(e.ptr(outs[0]));
    int64_t cg = C / groups;
#pragma omp parallel for collapse(2)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        const float* base = xp + (n * C + g * cg) * HW;
        int64_t m = cg * HW;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < m; ++i) mean += base[i];
        mean /= (double)m;
        for (int64_t i = 0; i < m; ++i) { double d = base[i] - mean; var += d * d; }
        var /= (double)m;
        double rstd = 1.0 / std::sqrt(var + eps);
        for (int64_t c = 0; c < cg; ++c) {
          int64_t ch = g * cg + c;
          double scale = rstd * (wp ? wp[ch] : 1.0), shift = bp ? bp[ch] : 0.0;
          const float* xi = base + c * HW;
          float* oi = out + (n * C + ch) * HW;
          for (int64_t i = 0; i < HW; ++i) oi[i] = (float)((xi[i] - mean) * scale + shift);
        }
      }
  }
};

// external: a custom op's native kernel or an op-package op, through opforge_external
struct ExternalOp : Op {
  opforge_external ext{};
  std::vector<opforge_ext_tensor> tin, tout;
  void run(Engine& e) override {
    for (size_t k = 0; k < ins.size(); ++k) tin[k].data = e.ptr(ins[k]);
    for (size_t k = 0; k < outs.size(); ++k) tout[k].data = e.ptr(outs[k]);
    char error[512] = {0};
    int32_t rc = ext.fn(ext.state, tin.data(), (int32_t)tin.size(), tout.data(), (int32_t)tout.size(),
                        error, (int32_t)sizeof(error));
    if (rc != 0) fail(name + ": " + (error[0] ? error : "failed without a message"));
  }
};

// a custom op's native kernel (kernel ABI), with its non-tensor arguments bound at init
struct KernelCallOp : Op {
  opforge_kernel_fn fn = nullptr;
  std::vector<opforge_arg> args;
  std::vector<int32_t> slot;                 // per arg: -1, or the tensor's index in ins+outs
  std::vector<std::vector<int64_t>> strides; // contiguous strides of each tensor arg
  std::vector<int64_t> int_pool;
  std::vector<double> double_pool;
  void run(Engine& e) override {
    size_t n_in = ins.size();
    for (size_t k = 0; k < args.size(); ++k) {
      if (slot[k] < 0) continue;
      int id = (size_t)slot[k] < n_in ? ins[slot[k]] : outs[slot[k] - n_in];
      args[k].v.tensor.data = e.ptr(id);
    }
    opforge_context ctx;
    std::memset(&ctx, 0, sizeof(ctx));
    fn(&ctx, args.data(), (int64_t)args.size());
    if (ctx.status != 0) fail(name + ": " + std::string(ctx.message, strnlen(ctx.message, sizeof(ctx.message))));
  }
};

// the elements fill [0, span) exactly (any dim order): a flat loop covers them
bool dense(const Tensor& t) {
  int64_t n = 1;
  for (auto d : t.dims) n *= d;
  return t.span == n;
}

bool row_major(const Tensor& t) {
  int64_t step = 1;
  for (int k = (int)t.dims.size() - 1; k >= 0; --k) {
    if (t.dims[(size_t)k] != 1 && t.strides[(size_t)k] != step) return false;
    step *= std::max<int64_t>(t.dims[(size_t)k], 1);
  }
  return true;
}

std::vector<int> ids(Engine& e, const int32_t* p, int32_t n, const char* what) {
  if (n < 0 || n > 64) fail(std::string(what) + ": bad count");
  std::vector<int> out;
  for (int32_t i = 0; i < n; ++i) out.push_back(check_id(e, p[i], what));
  return out;
}

dims_t take(const std::vector<int64_t>& ia, size_t& k, size_t n) {
  if (k + n > ia.size()) fail("attributes too short");
  dims_t out(ia.begin() + k, ia.begin() + k + n);
  k += n;
  return out;
}

// check that idx·strides + off stays within a tensor of `span` elements for every idx < dims
void check_reach(const dims_t& dims, const dims_t& strides, int64_t off, int64_t span, const char* what) {
  int64_t lo = off, hi = off;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] < 0) fail(std::string(what) + ": negative size");
    if (dims[k] == 0) return;
    int64_t reach = (dims[k] - 1) * strides[k];
    if (reach < 0) lo += reach; else hi += reach;
  }
  if (lo < 0 || hi >= span) fail(std::string(what) + ": reads or writes outside its tensor");
}

}  // namespace

extern "C" {

int32_t ofc_abi_version() { return kAbiVersion; }

void* ofc_new(int32_t threads, int64_t max_bytes, char* error, int32_t size) {
  try {
    auto h = new Handle();
    h->e.threads = threads > 0 ? threads : 1;
    h->e.max_bytes = max_bytes > 0 ? (size_t)max_bytes : (size_t)1 << 33;
    return h;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return nullptr;
  }
}

void ofc_destroy(void* handle) { delete static_cast<Handle*>(handle); }

// a tensor: dims/strides in elements; data: constant bytes (copied) or null; base >= 0: alias
int32_t ofc_add_tensor(void* handle, int32_t dtype, int32_t ndim, const int64_t* dims,
                       const int64_t* strides, const void* data, int64_t nbytes, int32_t base,
                       int64_t offset, int32_t storage, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (ndim < 0 || ndim > kMaxRank) fail("rank out of range");
    Tensor t;
    t.dtype = dtype;
    size_t is = itemsize(dtype);
    t.dims.assign(dims, dims + ndim);
    t.strides.assign(strides, strides + ndim);
    int64_t span = 1;
    for (int k = 0; k < ndim; ++k) {
      if (t.dims[k] < 0 || t.dims[k] > ((int64_t)1 << 40) || t.strides[k] < 0) fail("bad dims or strides");
      if (t.dims[k] == 0) { span = 0; break; }
      span += (t.dims[k] - 1) * t.strides[k];
      if (span > ((int64_t)1 << 40)) fail("tensor too large");
    }
    t.span = span;
    if (base >= 0) {
      check_id(e, base, "alias base");
      const Tensor& b = e.tensors[base];
      if (b.dtype != dtype || offset < 0 || (span > 0 && offset + span > b.span)) fail("alias outside its base");
      t.base = base; t.offset = offset; t.is_const = b.is_const;
    } else if (data != nullptr) {
      if (nbytes != span * (int64_t)is) fail("constant byte count does not match its shape");
      t.data = aligned_alloc64(t.storage, (size_t)nbytes);
      std::memcpy(t.data, data, (size_t)nbytes);
      t.is_const = true;
    } else if (storage == 1) {  // owned intermediate
      size_t bytes = (size_t)span * is;
      if (e.used_bytes + bytes > e.max_bytes) fail("intermediates exceed the memory limit");
      e.used_bytes += bytes;
      t.data = aligned_alloc64(t.storage, bytes);
    }  // storage == 0: an input or output, bound per execute
    e.tensors.push_back(std::move(t));
    return (int32_t)e.tensors.size() - 1;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return -1;
  }
}

// post-ops for the next op: kind 0 eltwise (alg, alpha, beta), 1 binary (alg, tensor)
int32_t ofc_post_op(void* handle, int32_t kind, int32_t alg, double alpha, double beta, int32_t tensor,
                    char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    PostOp p;
    p.binary = kind == 1;
    p.alg = alg_of(alg);
    p.alpha = (float)alpha; p.beta = (float)beta;
    if (p.binary) p.tensor = check_id(h->e, tensor, "post-op");
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
    if (n_iattr < 0 || n_iattr > 4096 || n_fattr < 0 || n_fattr > 64) fail("bad attribute count");
    std::vector<int> in = ids(e, ins, n_in, kind), out = ids(e, outs, n_out, kind);
    std::vector<int64_t> ia(iattr, iattr + n_iattr);
    std::vector<double> fa(fattr, fattr + n_fattr);
    for (int o : out)
      if (e.tensors[o].is_const) fail(std::string(kind) + ": writes a constant");
    std::string k(kind);
    if (k == "conv" || k == "deconv") add_conv(*h, k == "deconv", in, out, ia);
    else if (k == "matmul") add_matmul(*h, in, out);
    else if (k == "pool") add_pool(*h, in, out, ia);
    else if (k == "eltwise") add_eltwise(*h, in, out, ia, fa);
    else if (k == "binary") add_binary(*h, in, out, ia);
    else if (k == "softmax") add_softmax(*h, in, out, ia);
    else if (k == "layer_norm") add_layer_norm(*h, in, out, ia, fa);
    else if (k == "reduction") add_reduction(*h, in, out, ia);
    else if (k == "qconv" || k == "qmatmul") add_int8(*h, k == "qconv", in, out, ia, fa);
    else if (k == "quant") {
      if (in.size() != 1 || out.size() != 1 || ia.size() != 3 || fa.size() != 2) fail("quant: bad arity");
      auto op = std::make_unique<QuantOp>();
      op->mode = (int)ia[0]; op->qmin = ia[1]; op->qmax = ia[2]; op->scale = fa[0]; op->zp = fa[1];
      const Tensor& ti = e.tensors[in[0]];
      const Tensor& to = e.tensors[out[0]];
      bool int_ok = (op->mode == 0 ? to.dtype : ti.dtype) != F32 && (op->mode == 0 ? to.dtype : ti.dtype) != F64;
      if ((op->mode != 0 && op->mode != 1) || !int_ok || (op->mode == 0 ? ti.dtype : to.dtype) != F32 ||
          ti.dims != to.dims || ti.strides != to.strides || !dense(ti) || op->qmin > op->qmax ||
          !(op->scale > 0) || !std::isfinite(op->scale) || !std::isfinite(op->zp))
        fail("quant: dtypes, layouts or parameters");
      op->name = op->mode == 0 ? "quantize" : "dequantize"; op->ins = in; op->outs = out;
      e.ops.push_back(std::move(op));
    }
    else if (k == "copy") {
      if (in.size() != 1 || out.size() != 1 || ia.empty()) fail("copy: bad arity");
      size_t p = 0;
      int64_t n = take(ia, p, 1)[0];
      if (n < 0 || n > kMaxRank) fail("copy: rank");
      auto op = std::make_unique<CopyOp>();
      op->dims = take(ia, p, n); op->in_strides = take(ia, p, n); op->in_off = take(ia, p, 1)[0];
      op->out_strides = take(ia, p, n); op->out_off = take(ia, p, 1)[0];
      check_reach(op->dims, op->in_strides, op->in_off, e.tensors[in[0]].span, "copy source");
      check_reach(op->dims, op->out_strides, op->out_off, e.tensors[out[0]].span, "copy target");
      op->name = "copy"; op->ins = in; op->outs = out;
      op->prepare(e);
      e.ops.push_back(std::move(op));
    } else if (k == "ew") {
      if (in.size() > 3 || out.size() != 1 || ia.size() < 3) fail("ew: bad arity");
      size_t p = 0;
      auto op = std::make_unique<EwOp>();
      op->code = (int)take(ia, p, 1)[0];
      if (op->code < 0 || op->code >= EW_COUNT) fail("ew: unknown code");
      op->integral = take(ia, p, 1)[0] != 0;
      int64_t n = take(ia, p, 1)[0];
      if (n < 0 || n > kMaxRank) fail("ew: rank");
      op->dims = take(ia, p, n);
      op->out_strides = take(ia, p, n);
      check_reach(op->dims, op->out_strides, 0, e.tensors[out[0]].span, "ew output");
      for (size_t j = 0; j < in.size(); ++j) {
        op->in_strides.push_back(take(ia, p, n));
        check_reach(op->dims, op->in_strides.back(), 0, e.tensors[in[j]].span, "ew input");
      }
      if (fa.size() >= 1) op->alpha = fa[0];
      if (fa.size() >= 2) { op->scalar = fa[1]; op->has_scalar = true; }
      if (op->has_scalar && in.size() >= 3) fail("ew: too many operands");
      if (in.empty() && op->code != EW_FILL) fail("ew: no operands");
      op->name = "elementwise"; op->ins = in; op->outs = out;
      e.ops.push_back(std::move(op));
    } else if (k == "reduce") {
      if (in.size() != 1 || out.size() != 1 || ia.size() < 3) fail("reduce: bad arity");
      size_t p = 0;
      auto op = std::make_unique<ReduceOp>();
      op->code = (int)take(ia, p, 1)[0];
      if (op->code < 0 || op->code > 5) fail("reduce: code");
      int64_t n = take(ia, p, 1)[0];
      if (n < 0 || n > kMaxRank) fail("reduce: rank");
      op->dims = take(ia, p, n); op->in_strides = take(ia, p, n); op->out_strides = take(ia, p, n);
      op->count = take(ia, p, 1)[0];
      check_reach(op->dims, op->in_strides, 0, e.tensors[in[0]].span, "reduce input");
      check_reach(op->dims, op->out_strides, 0, e.tensors[out[0]].span, "reduce output");
      if (op->count < 1) fail("reduce: count");
      if (!row_major(e.tensors[out[0]])) fail("reduce: the output must be contiguous");
      op->name = "reduce"; op->ins = in; op->outs = out;
      e.ops.push_back(std::move(op));
    } else if (k == "embedding") {
      if (in.size() != 2 || out.size() != 1) fail("embedding: bad arity");
      const Tensor& w = e.tensors[in[0]];
      if (w.dims.size() != 2 || w.dtype != F32) fail("embedding: weight");
      int64_t n = 1;
      for (auto d : e.tensors[in[1]].dims) n *= d;
      if (e.tensors[out[0]].span != n * w.dims[1] || w.span != w.dims[0] * w.dims[1] ||
          e.tensors[in[1]].span != n || !row_major(w) || !row_major(e.tensors[in[1]]) ||
          !row_major(e.tensors[out[0]]) || e.tensors[out[0]].dtype != F32 ||
          (e.tensors[in[1]].dtype != I64 && e.tensors[in[1]].dtype != I32))
        fail("embedding: shapes, dtypes or layouts");
      auto op = std::make_unique<EmbeddingOp>();
      op->name = "embedding"; op->ins = in; op->outs = out;
      e.ops.push_back(std::move(op));
    } else if (k == "group_norm") {
      if (ia.size() != 3 || fa.size() != 1 || out.size() != 1) fail("group_norm: bad arity");
      auto op = std::make_unique<GroupNormOp>();
      op->groups = ia[0]; op->has_w = ia[1] != 0; op->has_b = ia[2] != 0; op->eps = fa[0];
      if (in.size() != 1 + (size_t)op->has_w + (size_t)op->has_b) fail("group_norm: inputs");
      const Tensor& x = e.tensors[in[0]];
      if (x.dims.size() < 2 || op->groups < 1 || x.dims[1] % op->groups) fail("group_norm: groups");
      if (!row_major(x) || !row_major(e.tensors[out[0]]) || e.tensors[out[0]].dims != x.dims ||
          x.dtype != F32 || e.tensors[out[0]].dtype != F32)
        fail("group_norm: input and output must be float32, contiguous and of one shape");
      for (size_t j = 1; j < in.size(); ++j)
        if (e.tensors[in[j]].span != x.dims[1] || e.tensors[in[j]].dtype != F32 || !row_major(e.tensors[in[j]]))
          fail("group_norm: weight and bias must have one float32 per channel");
      op->name = "group_norm"; op->ins = in; op->outs = out;
      e.ops.push_back(std::move(op));
    } else {
      fail("unknown op kind '" + k + "'");
    }
    h->pending_post.clear();
    return 0;
  } catch (const dnnl::error& ex) {
    h->pending_post.clear();
    set_error(error, size, std::string(kind ? kind : "?") + ": oneDNN: " + ex.what() +
                               " (status " + std::to_string((int)ex.status) + ")");
    return 1;
  } catch (const std::exception& ex) {
    h->pending_post.clear();
    set_error(error, size, std::string(kind ? kind : "?") + ": " + ex.what());
    return 1;
  }
}

int32_t ofc_add_external(void* handle, opforge_ext_fn fn, void* state, const char* name,
                         const int32_t* ins, int32_t n_in, const int32_t* outs, int32_t n_out,
                         char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (fn == nullptr) fail("external: no function");
    auto op = std::make_unique<ExternalOp>();
    op->ext.fn = fn; op->ext.state = state;
    op->name = name ? name : "external";
    op->ins = ids(e, ins, n_in, "external"); op->outs = ids(e, outs, n_out, "external");
    for (int id : op->ins) {
      const Tensor& t = e.tensors[id];
      op->tin.push_back({nullptr, t.dtype, (int32_t)t.dims.size(), t.dims.data()});
    }
    for (int id : op->outs) {
      const Tensor& t = e.tensors[id];
      op->tout.push_back({nullptr, t.dtype, (int32_t)t.dims.size(), t.dims.data()});
    }
    e.ops.push_back(std::move(op));
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

// args: tag (OPFORGE_ARG_*), value (int / slot / list offset into the pools), list length,
// double value; tensor args name a slot in ins+outs
int32_t ofc_add_kernel(void* handle, opforge_kernel_fn fn, const char* name, const int32_t* ins,
                       int32_t n_in, const int32_t* outs, int32_t n_out, int32_t n_args,
                       const int32_t* tags, const int64_t* values, const int64_t* lengths,
                       const double* doubles, const int64_t* int_pool, int64_t n_int,
                       const double* double_pool, int64_t n_double, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    if (fn == nullptr || n_args < 0 || n_args > 256 || n_int < 0 || n_int > 65536 || n_double < 0 ||
        n_double > 65536)
      fail("kernel call: bad counts");
    auto op = std::make_unique<KernelCallOp>();
    op->fn = fn;
    op->name = name ? name : "kernel";
    op->ins = ids(e, ins, n_in, "kernel"); op->outs = ids(e, outs, n_out, "kernel");
    op->int_pool.assign(int_pool, int_pool + n_int);
    op->double_pool.assign(double_pool, double_pool + n_double);
    op->args.resize((size_t)n_args);
    op->slot.assign((size_t)n_args, -1);
    op->strides.resize((size_t)n_args);
    for (int32_t k = 0; k < n_args; ++k) {
      opforge_arg& a = op->args[(size_t)k];
      std::memset(&a, 0, sizeof(a));
      a.tag = tags[k];
      switch (tags[k]) {
        case OPFORGE_ARG_NONE: break;
        case OPFORGE_ARG_TENSOR: {
          int64_t s = values[k];
          if (s < 0 || s >= n_in + n_out) fail("kernel call: tensor slot out of range");
          op->slot[(size_t)k] = (int32_t)s;
          int id = s < n_in ? op->ins[(size_t)s] : op->outs[(size_t)(s - n_in)];
          const Tensor& t = e.tensors[id];
          auto& st = op->strides[(size_t)k];
          st.assign(t.dims.size(), 1);
          for (int j = (int)t.dims.size() - 2; j >= 0; --j) st[(size_t)j] = st[(size_t)j + 1] * t.dims[(size_t)j + 1];
          if (st != t.strides && t.span > 0) fail("kernel call: tensors must be contiguous");
          a.v.tensor.sizes = t.dims.data();
          a.v.tensor.strides = st.data();
          a.v.tensor.dtype = t.dtype;
          a.v.tensor.rank = (int32_t)t.dims.size();
          break;
        }
        case OPFORGE_ARG_INT: case OPFORGE_ARG_BOOL: case OPFORGE_ARG_SCALAR_TYPE: a.v.i = values[k]; break;
        case OPFORGE_ARG_DOUBLE: a.v.d = doubles[k]; break;
        case OPFORGE_ARG_INT_LIST: case OPFORGE_ARG_BOOL_LIST: {
          int64_t off = values[k], len = lengths[k];
          if (off < 0 || len < 0 || off + len > n_int) fail("kernel call: list out of range");
          if (tags[k] == OPFORGE_ARG_BOOL_LIST) fail("kernel call: bool lists are not supported");
          a.v.list.data = op->int_pool.data() + off; a.v.list.size = len;
          break;
        }
        case OPFORGE_ARG_DOUBLE_LIST: {
          int64_t off = values[k], len = lengths[k];
          if (off < 0 || len < 0 || off + len > n_double) fail("kernel call: list out of range");
          a.v.list.data = op->double_pool.data() + off; a.v.list.size = len;
          break;
        }
        default: fail("kernel call: argument tag " + std::to_string(tags[k]) + " not supported");
      }
    }
    e.ops.push_back(std::move(op));
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

int32_t ofc_finalize(void* handle, const int32_t* inputs, int32_t n_in, const int32_t* outputs,
                     int32_t n_out, char* error, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  try {
    Engine& e = h->e;
    e.inputs = ids(e, inputs, n_in, "inputs");
    e.outputs = ids(e, outputs, n_out, "outputs");
    // every tensor an op touches must have memory: its own, its base's, or a bound input or
    // output (a hostile blob could name a tensor it gave no storage)
    std::vector<char> io(e.tensors.size(), 0);
    for (int id : e.inputs) io[(size_t)id] = 1;
    for (int id : e.outputs) io[(size_t)id] = 1;
    auto backed = [&](int id) {
      while (e.tensors[(size_t)id].base >= 0) id = e.tensors[(size_t)id].base;
      return io[(size_t)id] || e.tensors[(size_t)id].data != nullptr;
    };
    for (auto& op : e.ops) {
      for (int id : op->ins) if (!backed(id)) fail(op->name + ": reads tensor " + std::to_string(id) + ", which has no memory");
      for (int id : op->outs) if (!backed(id)) fail(op->name + ": writes tensor " + std::to_string(id) + ", which has no memory");
    }
    for (auto& op : e.ops) {
      auto* d = dynamic_cast<DnnlOp*>(op.get());
      if (d) for (auto& a : d->tensor_args) if (!backed(a.second)) fail(op->name + ": uses a tensor without memory");
    }
    // constants read only through their reordered copies (weights of convolutions and
    // matmuls) are not needed any more: free them (halves the memory of weight-heavy models)
    std::vector<char> read(e.tensors.size(), 0);
    for (auto& op : e.ops) {
      auto* d = dynamic_cast<DnnlOp*>(op.get());
      if (d) { for (auto& a : d->tensor_args) read[(size_t)a.second] = 1; }
      else { for (int id : op->ins) read[(size_t)id] = 1; for (int id : op->outs) read[(size_t)id] = 1; }
    }
    for (size_t i = 0; i < e.tensors.size(); ++i)
      if (e.tensors[i].base >= 0 && read[i]) read[(size_t)e.tensors[i].base] = 1;
    for (size_t i = 0; i < e.tensors.size(); ++i) {
      Tensor& t = e.tensors[i];
      if (t.is_const && t.base < 0 && !read[i] && !t.storage.empty()) {
        std::vector<char>().swap(t.storage);
        t.data = nullptr;
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
    for (size_t k = 0; k < e.inputs.size(); ++k) e.tensors[e.inputs[k]].data = inputs[k];
    for (size_t k = 0; k < e.outputs.size(); ++k) e.tensors[e.outputs[k]].data = outputs[k];
    int saved = omp_get_max_threads();
    if (saved != e.threads) omp_set_num_threads(e.threads);
    if (e.profile) {
      for (size_t i = 0; i < e.ops.size(); ++i) {
        double t0 = omp_get_wtime();
        e.ops[i]->run(e);
        e.op_seconds[i] += omp_get_wtime() - t0;
      }
      ++e.runs;
    } else {
      for (auto& op : e.ops) op->run(e);
    }
    if (saved != e.threads) omp_set_num_threads(saved);
    return 0;
  } catch (const std::exception& ex) {
    set_error(error, size, ex.what());
    return 1;
  }
}

// what the engine made of the graph, for inspect and tests: op names, comma-separated
int32_t ofc_describe(void* handle, char* out, int32_t size) {
  auto* h = static_cast<Handle*>(handle);
  std::string text;
  for (auto& op : h->e.ops) { if (!text.empty()) text += ","; text += op->name; }
  set_error(out, size, text);
  return (int32_t)text.size();
}

}  // extern "C"
