// Stride-generic copies (any dtype, casts) and n-ary generic elementwise ops with
// broadcasting. Inputs are addressed with strides aligned to the output's dims (0 where an
// input broadcasts), given by the lowering.
//
// copy contract: ins [src], outs [dst]; ia [n, dims[n], in_strides[n], in_off,
//   out_strides[n], out_off], n <= 8. Both walks stay inside their tensors; the output walk
//   reaches no element twice (the work is bounded by the output's storage).
// ew contract: ins [0..3 tensors], outs [dst]; ia [code, integral, n, dims[n],
//   out_strides[n], in_strides[n] per input]; fa [alpha, (scalar operand)]. The operand
//   count (tensors + scalar) is exactly the code's arity (fill: the scalar alone; where:
//   3; masked_fill: 2 tensors + the scalar; logical_not/bitwise_not/neg: 1 tensor; the
//   others 2, at least one a tensor). Every walk stays inside its tensor; the output walk
//   reaches no element twice. Integer arithmetic wraps as PyTorch's does; integer division
//   by zero fails the call, as PyTorch raises.
#include <cmath>
#include <limits>

#include "engine.h"
#include "loops.h"

namespace ofc {

// copy: out[idx] = in[in_off + idx·in_strides] over out dims (any strides, same dtype or cast)
struct CopyOp : Op {
  dims_t dims, in_strides, out_strides;
  int64_t in_off = 0, out_off = 0;
  bool use_reorder = false;
  // >= 0: the walk is 8×8 transposes (transpose32) of dim tj, contiguous in the input,
  // against dim tio, contiguous in the output; or with `planes`, interleaves (interleave32,
  // interleave8) of dim tio's few planes along dim tj
  int tj = -1, tio = -1;
  bool planes = false;
  dnnl::reorder reorder;
  memory src_mem, dst_mem;
  void prepare(Engine& e) {
    const Tensor& ti = e.tensors[(size_t)ins[0]];
    const Tensor& to = e.tensors[(size_t)outs[0]];
    dims_t d = dims, a = in_strides, b = out_strides;
    collapse(d, a, b);
    // a same-dtype 4-byte copy with one dim contiguous in the input and another in the
    // output, both at least 8 long: the transposes, not oneDNN's reorder or the loop
#if defined(__x86_64__)
    if (ti.dtype == to.dtype && itemsize(ti.dtype) == 4 && d.size() >= 2 &&
        own_kernels_allowed() && __builtin_cpu_supports("avx2")) {
      for (size_t k = 0; k < d.size(); ++k) {
        if (d[k] < 8) continue;
        if (a[k] == 1 && b[k] >= 8) tj = (int)k;
        if (b[k] == 1 && a[k] >= 8) tio = (int)k;
      }
      if (tj < 0 || tio < 0) tj = tio = -1;
    }
    // a same-dtype 4- or 1-byte copy gathering 2-4 planes, each contiguous in the input,
    // into channels-last rows (an image's NCHW → NHWC): the interleaves
    size_t size = itemsize(ti.dtype);
    if (tj < 0 && ti.dtype == to.dtype && (size == 4 || size == 1) && d.size() >= 2 &&
        own_kernels_allowed() &&
        (size == 4 ? __builtin_cpu_supports("avx2") : __builtin_cpu_supports("ssse3"))) {
      for (size_t k = 0; k < d.size(); ++k)
        if (b[k] == 1 && d[k] >= 2 && d[k] <= 4) tio = (int)k;
      for (size_t k = 0; tio >= 0 && k < d.size(); ++k)
        if (a[k] == 1 && b[k] == d[(size_t)tio] && d[k] >= (size == 4 ? 8 : 16)) tj = (int)k;
      if (tj < 0 || tio < 0) tj = tio = -1;
      planes = tj >= 0;
    }
#endif
    if (tj < 0) {
      prepare_reorder(e);  // on the walk as the blob gives it
      if (use_reorder) return;
    }
    dims = d; in_strides = a; out_strides = b;
  }
  // a walk with size-1 dims dropped and each dim merged into the one outside it where both
  // walks run on contiguously (the same pairs of elements, fewer and longer rows: a
  // channels-last [1, 32, 8, 8] to row-major copy is 32 rows of 64, not 256 of 8; 2.0 →
  // 1.5 µs in the loops)
  static void collapse(dims_t& dims, dims_t& in_strides, dims_t& out_strides) {
    dims_t d, a, b;
    for (size_t k = 0; k < dims.size(); ++k) {
      if (dims[k] == 1) continue;
      int64_t ia, ob;  // (a walk the contract checked cannot overflow here; a hostile one is left as it is)
      if (!d.empty() && !__builtin_mul_overflow(in_strides[k], dims[k], &ia) &&
          !__builtin_mul_overflow(out_strides[k], dims[k], &ob) && a.back() == ia && b.back() == ob) {
        d.back() *= dims[k];  // bounded by the walk's element count (contract)
        a.back() = in_strides[k];
        b.back() = out_strides[k];
        continue;
      }
      d.push_back(dims[k]); a.push_back(in_strides[k]); b.push_back(out_strides[k]);
    }
    if (d.empty()) { d.push_back(1); a.push_back(0); b.push_back(0); }
    dims = d; in_strides = a; out_strides = b;
  }
  void prepare_reorder(Engine& e) {
    const Tensor& ti = e.tensors[(size_t)ins[0]];
    const Tensor& to = e.tensors[(size_t)outs[0]];
    bool dnnl_type_ok = (ti.dtype == F32 || ti.dtype == I32 || ti.dtype == I8 || ti.dtype == U8) &&
                        (to.dtype == F32 || to.dtype == I32 || to.dtype == I8 || to.dtype == U8);
    int64_t total = count_of(dims, "copy");
    for (size_t k = 0; k < dims.size(); ++k) {
      if (in_strides[k] <= 0 && dims[k] > 1) dnnl_type_ok = false;  // broadcast or reversed: the loop
      if (out_strides[k] <= 0 && dims[k] > 1) dnnl_type_ok = false;
    }
    if (!dnnl_type_ok || total < 4096 || dims.empty()) return;
    try {
      dims_t is = in_strides, os = out_strides;
      for (size_t k = 0; k < dims.size(); ++k) if (dims[k] == 1) { is[k] = 1; os[k] = 1; }
      memory::desc smd(dims, dnnl_type(ti.dtype), is), dmd(dims, dnnl_type(to.dtype), os);
      // the reorder reads and writes exactly the walks the contract checked
      if (md_reach_bytes(smd, (int64_t)itemsize(ti.dtype)) > (ti.span - in_off) * (int64_t)itemsize(ti.dtype) ||
          md_reach_bytes(dmd, (int64_t)itemsize(to.dtype)) > (to.span - out_off) * (int64_t)itemsize(to.dtype))
        return;
      src_mem = memory(smd, e.eng, DNNL_MEMORY_NONE);
      dst_mem = memory(dmd, e.eng, DNNL_MEMORY_NONE);
      reorder = dnnl::reorder(dnnl::reorder::primitive_desc(e.eng, smd, e.eng, dmd));
      use_reorder = true;
    } catch (const dnnl::error&) {
      use_reorder = false;  // a layout oneDNN's reorder does not take: the loop
    }
  }
  void run(Engine& e) override {
    const Tensor& ti = e.tensors[(size_t)ins[0]];
    const Tensor& to = e.tensors[(size_t)outs[0]];
    if (use_reorder) {
      src_mem.set_data_handle(static_cast<char*>(e.ptr(ins[0])) + in_off * (int64_t)itemsize(ti.dtype));
      dst_mem.set_data_handle(static_cast<char*>(e.ptr(outs[0])) + out_off * (int64_t)itemsize(to.dtype));
      reorder.execute(e.strm, src_mem, dst_mem);
      e.strm.wait();
      return;
    }
    const char* src = static_cast<const char*>(e.ptr(ins[0]));
    char* dst = static_cast<char*>(e.ptr(outs[0]));
    int64_t is = (int64_t)itemsize(ti.dtype);
#if defined(__x86_64__)
    if (tj >= 0) {  // the other dims (a batch) one transpose or interleave each
      const size_t j = (size_t)tj, i = (size_t)tio;
      dims_t outer = dims;
      outer[j] = 1;
      outer[i] = 1;
      for_each_index(outer, [&](const int64_t* idx) {
        if (planes) {
          if (is == 4)
            interleave32(reinterpret_cast<const uint32_t*>(src) + in_off + dot(idx, in_strides),
                         in_strides[i], reinterpret_cast<uint32_t*>(dst) + out_off + dot(idx, out_strides),
                         dims[i], dims[j]);
          else
            interleave8(reinterpret_cast<const uint8_t*>(src) + in_off + dot(idx, in_strides),
                        in_strides[i], reinterpret_cast<uint8_t*>(dst) + out_off + dot(idx, out_strides),
                        dims[i], dims[j]);
          return;
        }
        transpose32(reinterpret_cast<const uint32_t*>(src) + in_off + dot(idx, in_strides),
                    in_strides[i], reinterpret_cast<uint32_t*>(dst) + out_off + dot(idx, out_strides),
                    out_strides[j], dims[j], dims[i]);
      });
      return;
    }
#endif
    if (ti.dtype == to.dtype) {
      int n = (int)dims.size();
      // innermost run contiguous on both sides: memcpy rows
      if (n > 0 && in_strides[(size_t)n - 1] == 1 && out_strides[(size_t)n - 1] == 1) {
        dims_t outer(dims.begin(), dims.end() - 1);
        int64_t row = dims[(size_t)n - 1] * is;
        dims_t ins_(in_strides.begin(), in_strides.end() - 1), outs_(out_strides.begin(), out_strides.end() - 1);
        for_each_index(outer, [&](const int64_t* idx) {
          std::memcpy(dst + (out_off + dot(idx, outs_)) * is, src + (in_off + dot(idx, ins_)) * is, (size_t)row);
        });
        return;
      }
      int r = (int)dims.size();
      dims_t oi(in_strides.begin(), in_strides.end() - (r ? 1 : 0)), oo(out_strides.begin(), out_strides.end() - (r ? 1 : 0));
      int64_t si = r ? in_strides[(size_t)r - 1] : 0, so = r ? out_strides[(size_t)r - 1] : 0;
      for_each_row(dims, [&](const int64_t* idx, int64_t n) {
        const char* a = src + (in_off + dot(idx, oi)) * is;
        char* b = dst + (out_off + dot(idx, oo)) * is;
        switch (is) {
          case 4: for (int64_t j = 0; j < n; ++j) reinterpret_cast<uint32_t*>(b)[j * so] = reinterpret_cast<const uint32_t*>(a)[j * si]; break;
          case 8: for (int64_t j = 0; j < n; ++j) reinterpret_cast<uint64_t*>(b)[j * so] = reinterpret_cast<const uint64_t*>(a)[j * si]; break;
          case 1: for (int64_t j = 0; j < n; ++j) b[j * so] = a[j * si]; break;
          default: for (int64_t j = 0; j < n; ++j) std::memcpy(b + j * so * is, a + j * si * is, (size_t)is);
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

namespace {
struct CopyAttrs {
  dims_t dims, in_strides, out_strides;
  int64_t in_off = 0, out_off = 0;
};

CopyAttrs copy_attrs(const std::vector<int64_t>& ia) {
  CopyAttrs a;
  size_t p = 0;
  int64_t n = take(ia, p, 1)[0];
  if (n < 0 || n > kMaxRank) fail("copy: rank out of range");
  a.dims = take(ia, p, (size_t)n);
  a.in_strides = take(ia, p, (size_t)n);
  a.in_off = take(ia, p, 1)[0];
  a.out_strides = take(ia, p, (size_t)n);
  a.out_off = take(ia, p, 1)[0];
  if (p != ia.size()) fail("copy: attribute count");
  return a;
}
}  // namespace

void contract_copy(const Engine& e, const OpCall& c) {
  need_count(c, 1, 1);
  need_post_ops_allowed(c, false);
  CopyAttrs a = copy_attrs(c.ia);
  check_reach(a.dims, a.in_strides, a.in_off, e.tensors[(size_t)c.ins[0]].span, "copy source");
  check_reach(a.dims, a.out_strides, a.out_off, e.tensors[(size_t)c.outs[0]].span, "copy target");
  need(injective(a.dims, a.out_strides), c.kind,
       "the target walk writes an element twice (work not bounded by storage)");
}

void build_copy(Handle& h, const OpCall& c) {
  CopyAttrs a = copy_attrs(c.ia);
  auto op = std::make_unique<CopyOp>();
  op->dims = a.dims; op->in_strides = a.in_strides; op->in_off = a.in_off;
  op->out_strides = a.out_strides; op->out_off = a.out_off;
  op->name = "copy"; op->ins = c.ins; op->outs = c.outs;
  op->prepare(h.e);
  push_op(h.e, std::move(op), c);
}

enum EwCode {
  EW_ADD = 0, EW_SUB, EW_MUL, EW_DIV, EW_EQ, EW_NE, EW_LT, EW_LE, EW_GT, EW_GE, EW_WHERE,
  EW_LOGICAL_NOT, EW_BITWISE_NOT, EW_NEG, EW_LOGICAL_AND, EW_LOGICAL_OR, EW_MAX, EW_MIN,
  EW_FILL, EW_MASKED_FILL, EW_COUNT
};

namespace {
// wrapping int64 arithmetic (PyTorch's integer tensors wrap; signed overflow in C++ is UB)
inline int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
inline int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
inline int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

template <typename C> inline C ew_add(C a, C b) { return a + b; }
template <> inline int64_t ew_add(int64_t a, int64_t b) { return wrap_add(a, b); }
template <typename C> inline C ew_sub(C a, C b) { return a - b; }
template <> inline int64_t ew_sub(int64_t a, int64_t b) { return wrap_sub(a, b); }
template <typename C> inline C ew_mul(C a, C b) { return a * b; }
template <> inline int64_t ew_mul(int64_t a, int64_t b) { return wrap_mul(a, b); }
template <typename C> inline C ew_div(C a, C b) { return a / b; }
template <> inline int64_t ew_div(int64_t a, int64_t b) {
  if (b == 0) fail("elementwise: integer division by zero (PyTorch raises ZeroDivisionError)");
  if (b == -1) return wrap_sub(0, a);  // INT64_MIN / -1 wraps
  return a / b;
}
// NaN-propagating maximum/minimum (torch.maximum/minimum)
template <typename C> inline C ew_max(C a, C b) { return (a != a || a > b) ? a : b; }
template <typename C> inline C ew_min(C a, C b) { return (a != a || a < b) ? a : b; }
}  // namespace

// n-ary elementwise; scalars: fa [alpha (add/sub), scalar operand value (when fewer tensors)]
struct EwOp : Op {
  int code = 0;
  dims_t dims, out_strides;
  std::vector<dims_t> in_strides;
  double alpha = 1, scalar = 0;
  bool has_scalar = false;
  bool integral = false;
  template <typename C>
  C apply(C a, C b, C c) const {
    switch (code) {
      case EW_ADD: return ew_add<C>(a, ew_mul<C>((C)alpha, b));
      case EW_SUB: return ew_sub<C>(a, ew_mul<C>((C)alpha, b));
      case EW_MUL: return ew_mul<C>(a, b);
      case EW_DIV: return ew_div<C>(a, b);
      case EW_EQ: return a == b;
      case EW_NE: return a != b;
      case EW_LT: return a < b;
      case EW_LE: return a <= b;
      case EW_GT: return a > b;
      case EW_GE: return a >= b;
      case EW_WHERE: return a != C(0) ? b : c;
      case EW_LOGICAL_NOT: return a == C(0);
      case EW_BITWISE_NOT: return a == C(0);  // bool only (checked by the lowering)
      case EW_NEG: return ew_sub<C>(C(0), a);
      case EW_LOGICAL_AND: return a != C(0) && b != C(0);
      case EW_LOGICAL_OR: return a != C(0) || b != C(0);
      case EW_MAX: return ew_max<C>(a, b);
      case EW_MIN: return ew_min<C>(a, b);
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
    for (int k = 0; k < n_in; ++k) { src[k] = e.ptr(ins[(size_t)k]); dts[k] = e.tensors[(size_t)ins[(size_t)k]].dtype; }
    void* dst = e.ptr(outs[0]);
    int32_t odt = e.tensors[(size_t)outs[0]].dtype;
    int r = (int)dims.size();
    dims_t outer_out(out_strides.begin(), out_strides.end() - (r ? 1 : 0));
    std::vector<dims_t> outer_in;
    int64_t inner_in[3] = {0, 0, 0};
    for (int k = 0; k < n_in; ++k) {
      outer_in.emplace_back(in_strides[(size_t)k].begin(), in_strides[(size_t)k].end() - (r ? 1 : 0));
      inner_in[k] = r ? in_strides[(size_t)k][(size_t)r - 1] : 0;
    }
    int64_t inner_out = r ? out_strides[(size_t)r - 1] : 0;
    C scalar_c = (C)scalar;
    for_each_row(dims, [&](const int64_t* idx, int64_t n) {
      int64_t base_in[3] = {0, 0, 0};
      for (int k = 0; k < n_in; ++k) base_in[k] = dot(idx, outer_in[(size_t)k]);
      int64_t base_out = dot(idx, outer_out);
      for (int64_t j = 0; j < n; ++j) {
        C v[3] = {C(0), C(0), C(0)};
        for (int k = 0; k < n_in; ++k) v[k] = load_as<C>(src[k], dts[k], base_in[k] + j * inner_in[k]);
        if (has_scalar && n_in < 3) v[n_in] = scalar_c;
        store_as<C>(dst, odt, base_out + j * inner_out, apply<C>(v[0], v[1], v[2]));
      }
    });
  }
  // where / masked_fill on a bool mask and float32 values: the common attention-mask case,
  // typed loops instead of the generic dtype switch
  bool fast_select(Engine& e) {
    if (code != EW_WHERE && code != EW_MASKED_FILL) return false;
    int n_in = (int)ins.size();
    if (e.tensors[(size_t)outs[0]].dtype != F32 || e.tensors[(size_t)ins[0]].dtype != BOOL) return false;
    for (int k = 1; k < n_in; ++k) if (e.tensors[(size_t)ins[(size_t)k]].dtype != F32) return false;
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
    int64_t so = out_strides[(size_t)r - 1], sm = in_strides[0][(size_t)r - 1], sa = in_strides[1][(size_t)r - 1],
            sb = n_in > 2 ? in_strides[2][(size_t)r - 1] : 0;
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
  // a comparison of float32 operands (a tensor or the scalar; the lowering rounds a scalar
  // to float32, as torch compares in float32) into bool, and logical_not of a bool: the
  // attention mask's eq(-inf) and not, as typed row loops instead of the generic loop's
  // per-element dtype and code switches (~30x faster on a 4x128x128 score matrix)
  template <typename Cmp>
  void compare_rows(Engine& e, Cmp cmp) {
    const float* a = static_cast<const float*>(e.ptr(ins[0]));
    const float* b = ins.size() > 1 ? static_cast<const float*>(e.ptr(ins[1])) : nullptr;
    float sv = (float)scalar;
    uint8_t* o = static_cast<uint8_t*>(e.ptr(outs[0]));
    int r = (int)dims.size();
    dims_t oo(out_strides.begin(), out_strides.end() - 1), oa(in_strides[0].begin(), in_strides[0].end() - 1);
    dims_t ob = b ? dims_t(in_strides[1].begin(), in_strides[1].end() - 1) : dims_t(oo.size(), 0);
    int64_t so = out_strides[(size_t)r - 1], sa = in_strides[0][(size_t)r - 1],
            sb = b ? in_strides[1][(size_t)r - 1] : 0;
    for_each_row(dims, [&](const int64_t* idx, int64_t n) {
      const float* aa = a + dot(idx, oa);
      uint8_t* out = o + dot(idx, oo);
      if (b) {
        const float* bb = b + dot(idx, ob);
        for (int64_t j = 0; j < n; ++j) out[j * so] = cmp(aa[j * sa], bb[j * sb]);
      } else {
        for (int64_t j = 0; j < n; ++j) out[j * so] = cmp(aa[j * sa], sv);
      }
    });
  }
  bool fast_logic(Engine& e) {
    int n_in = (int)ins.size();
    if (dims.empty() || e.tensors[(size_t)outs[0]].dtype != BOOL) return false;
    if (code == EW_LOGICAL_NOT) {
      if (n_in != 1 || e.tensors[(size_t)ins[0]].dtype != BOOL) return false;
      const uint8_t* a = static_cast<const uint8_t*>(e.ptr(ins[0]));
      uint8_t* o = static_cast<uint8_t*>(e.ptr(outs[0]));
      int r = (int)dims.size();
      dims_t oo(out_strides.begin(), out_strides.end() - 1), oa(in_strides[0].begin(), in_strides[0].end() - 1);
      int64_t so = out_strides[(size_t)r - 1], sa = in_strides[0][(size_t)r - 1];
      for_each_row(dims, [&](const int64_t* idx, int64_t n) {
        const uint8_t* aa = a + dot(idx, oa);
        uint8_t* out = o + dot(idx, oo);
        for (int64_t j = 0; j < n; ++j) out[j * so] = aa[j * sa] == 0;
      });
      return true;
    }
    if (code < EW_EQ || code > EW_GE || integral) return false;
    if (!(n_in == 2 || (n_in == 1 && has_scalar))) return false;
    for (int k = 0; k < n_in; ++k) if (e.tensors[(size_t)ins[(size_t)k]].dtype != F32) return false;
    switch (code) {
      case EW_EQ: compare_rows(e, [](float x, float y) { return (uint8_t)(x == y); }); break;
      case EW_NE: compare_rows(e, [](float x, float y) { return (uint8_t)(x != y); }); break;
      case EW_LT: compare_rows(e, [](float x, float y) { return (uint8_t)(x < y); }); break;
      case EW_LE: compare_rows(e, [](float x, float y) { return (uint8_t)(x <= y); }); break;
      case EW_GT: compare_rows(e, [](float x, float y) { return (uint8_t)(x > y); }); break;
      default: compare_rows(e, [](float x, float y) { return (uint8_t)(x >= y); }); break;
    }
    return true;
  }
  // fill of a float32 destination (full_like: the zeros the safe softmax selects)
  bool fast_fill(Engine& e) {
    if (code != EW_FILL || dims.empty() || e.tensors[(size_t)outs[0]].dtype != F32) return false;
    float v = (float)scalar;
    float* o = static_cast<float*>(e.ptr(outs[0]));
    int r = (int)dims.size();
    dims_t oo(out_strides.begin(), out_strides.end() - 1);
    int64_t so = out_strides[(size_t)r - 1];
    for_each_row(dims, [&](const int64_t* idx, int64_t n) {
      float* out = o + dot(idx, oo);
      for (int64_t j = 0; j < n; ++j) out[j * so] = v;
    });
    return true;
  }
  void run(Engine& e) override {
    if (fast_select(e) || fast_logic(e) || fast_fill(e)) return;
    if (integral) loop<int64_t>(e); else loop<double>(e);
  }
};

namespace {
// the operand count of each code: tensors + the scalar
int arity(int code) {
  switch (code) {
    case EW_FILL: return 1;
    case EW_LOGICAL_NOT: case EW_BITWISE_NOT: case EW_NEG: return 1;
    case EW_WHERE: case EW_MASKED_FILL: return 3;
    default: return 2;
  }
}

bool fits_int64(double v) {
  return std::isfinite(v) && v == std::floor(v) && v >= -9.2233720368547758e18 && v < 9.2233720368547758e18;
}

std::unique_ptr<EwOp> ew_attrs(const OpCall& c) {
  auto op = std::make_unique<EwOp>();
  size_t p = 0;
  op->code = (int)take(c.ia, p, 1)[0];
  if (c.ia[0] < 0 || c.ia[0] >= EW_COUNT) fail("ew: unknown code " + std::to_string(c.ia[0]));
  op->integral = take(c.ia, p, 1)[0] != 0;
  int64_t n = take(c.ia, p, 1)[0];
  if (n < 0 || n > kMaxRank) fail("ew: rank out of range");
  op->dims = take(c.ia, p, (size_t)n);
  op->out_strides = take(c.ia, p, (size_t)n);
  for (size_t j = 0; j < c.ins.size(); ++j) op->in_strides.push_back(take(c.ia, p, (size_t)n));
  if (p != c.ia.size()) fail("ew: attribute count");
  if (c.fa.size() >= 1) op->alpha = c.fa[0];
  if (c.fa.size() >= 2) { op->scalar = c.fa[1]; op->has_scalar = true; }
  return op;
}
}  // namespace

void contract_ew(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  need(c.ins.size() <= 3 && c.outs.size() == 1, k, "at most 3 inputs and exactly 1 output");
  need_post_ops_allowed(c, false);
  need(c.fa.size() == 1 || c.fa.size() == 2, k, "fa [alpha, (scalar)]");
  auto op = ew_attrs(c);
  int n_in = (int)c.ins.size(), operands = n_in + (op->has_scalar ? 1 : 0);
  need(operands == arity(op->code), k, "code " + std::to_string(op->code) + " takes " +
       std::to_string(arity(op->code)) + " operands (tensors and the scalar), got " + std::to_string(operands));
  need(op->code == EW_FILL ? n_in == 0 : n_in >= 1, k, "operand kinds");
  if (op->code == EW_MASKED_FILL) need(op->has_scalar, k, "masked_fill takes its value as the scalar");
  if (op->integral) {
    need(fits_int64(op->alpha) && (!op->has_scalar || fits_int64(op->scalar)), k,
         "an integer op with a non-integer alpha or scalar");
  } else {
    need(!std::isnan(op->alpha) || (op->code != EW_ADD && op->code != EW_SUB), k, "alpha is NaN");
  }
  const Tensor& out = e.tensors[(size_t)c.outs[0]];
  check_reach(op->dims, op->out_strides, 0, out.span, "ew output");
  need(injective(op->dims, op->out_strides), k,
       "the output walk writes an element twice (work not bounded by storage)");
  for (size_t j = 0; j < c.ins.size(); ++j)
    check_reach(op->dims, op->in_strides[j], 0, e.tensors[(size_t)c.ins[j]].span, "ew input");
}

void build_ew(Handle& h, const OpCall& c) {
  auto op = ew_attrs(c);
  op->name = "elementwise";
  push_op(h.e, std::move(op), c);
}

}  // namespace ofc
