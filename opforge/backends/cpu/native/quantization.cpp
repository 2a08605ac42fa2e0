// Quantization: per-tensor quantize/dequantize loops ("quant") and int8 convolution and
// matmul on oneDNN ("qconv", "qmatmul", 8a8w); a depthwise 3×3 qconv may run on the
// engine's own kernel instead (qdepthwise.cpp, same contract).
//
// quant contract: ins [x], outs [y]; ia [mode 0 quantize / 1 dequantize / 2 both, qmin,
//   qmax]; fa [scale, zero point]. quantize: f32 → an integer dtype, dequantize: the
//   reverse, both (a quantize read only by dequantizes of its parameters): f32 → f32, the
//   integer kept in registers; x and y of one shape and one dense layout; qmin <= qmax;
//   scale > 0 and finite, zp finite.
// qconv/qmatmul contract: ins [x u8, w s8 constant, w_scales f32 constant, (bias f32
//   constant)], outs [y u8]; fa [x_scale, y_scale] (> 0, finite); ia [x_zp, y_zp, mask,
//   has_bias, (qconv: nsp, strides, pad_l, pad_r, dilation)].
//   mask selects the weight dims the scales vary over (oneDNN's mask); w_scales is dense,
//   rank 1, with exactly the product of those dims' sizes values; bias is dense, rank 1,
//   one value per output channel; zero points in [0, 255]. qconv: x, y rank nsp+2 and w
//   rank nsp+2, or nsp+3 (groups first; oneDNN checks the channels agree); qmatmul: x, w,
//   y of one rank 2..8.
// On a CPU without int8 dot-product instructions (no VNNI: AVX2 CPUs such as AMD Zen 3,
// AVX-512 ones such as Intel Skylake), oneDNN's int8 kernels multiply u8 activations by s8
// weights with vpmaddubsw, whose pairwise int16 sums saturate (255·127·2 > 32767): an 8a8w
// MLP came out 24 output steps off on a Zen 3. There, qconv/qmatmul run as lean computes
// them instead: dequantize x ("quant" mode 1), a float32 convolution/matmul of the
// dequantized weights (float32(w)·scale, made once at init) with the same bias and
// post-ops, quantize the result ("quant" mode 0). OPFORGE_CPU_INT8_FLOAT=1 forces that
// path on any CPU, =0 forbids it (read when the op is built).
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine.h"
#include "loops.h"

namespace ofc {

void check_conv_attrs(const std::string& kind, const std::vector<int64_t>& ia, size_t first, size_t total);
void build_quant(Handle& h, const OpCall& c);
}  // namespace ofc
extern "C" int32_t ofc_add_tensor(void* handle, int32_t dtype, int32_t ndim, const int64_t* dims,
                                  const int64_t* strides, const void* data, int64_t nbytes, int32_t base,
                                  int64_t offset, int32_t storage, char* error, int32_t size);
namespace ofc {
void conv_window(const std::vector<int64_t>& ia, size_t first, memory::dims& strides,
                 memory::dims& dil, memory::dims& pl, memory::dims& pr);

#if defined(__SSE2__)
namespace {
// quantize to 8 bits, 16 floats at a time with SSE2 (every x86-64 CPU): x * inv clamped to
// ±2^24 (beyond it every result is qmin or qmax: |zp| <= 2^15), rounded half to even by
// the conversion (the default MXCSR mode, which the engine never changes), plus zp,
// clamped, NaN → qmin; then narrowed with saturating packs (exact: the values lie in
// qmin..qmax). What the scalar loop gives, element for element, at ~0.3 instead of 1-5 ns
// an element (the scalar loop's selects stay branches under trapping math: 145 µs for a
// 224×224 image). Returns how many elements it wrote (a multiple of 16).
template <bool Unsigned>
int64_t quantize8_sse(const float* x, void* out, int64_t n, float inv, float z, float lo, float hi) {
  const __m128 vinv = _mm_set1_ps(inv), vz = _mm_set1_ps(z), vlo = _mm_set1_ps(lo), vhi = _mm_set1_ps(hi);
  const __m128 big = _mm_set1_ps(16777216.f), nbig = _mm_set1_ps(-16777216.f);
  auto four = [&](const float* p) {
    __m128 xi = _mm_loadu_ps(p);
    __m128 v = _mm_min_ps(_mm_max_ps(_mm_mul_ps(xi, vinv), nbig), big);
    __m128 r = _mm_add_ps(_mm_cvtepi32_ps(_mm_cvtps_epi32(v)), vz);
    r = _mm_min_ps(_mm_max_ps(r, vlo), vhi);
    __m128 nan = _mm_cmpunord_ps(xi, xi);
    r = _mm_or_ps(_mm_and_ps(nan, vlo), _mm_andnot_ps(nan, r));
    return _mm_cvtps_epi32(r);
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i a = _mm_packs_epi32(four(x + i), four(x + i + 4));
    __m128i b = _mm_packs_epi32(four(x + i + 8), four(x + i + 12));
    __m128i q = Unsigned ? _mm_packus_epi16(a, b) : _mm_packs_epi16(a, b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<char*>(out) + i), q);
  }
  return i;
}
}  // namespace
#endif

#if defined(__x86_64__)
namespace {
// what the AVX-512 block loop stores: the 8-bit integers (s8 or u8, narrowed by truncation,
// vpmovdb: exact, the values lie in qmin..qmax), the int32 ones, or mode 2's dequantized floats
enum class QuantStore { Int8, Int32, Dequant };

// the SSE2 loop's 16 floats at a time in one AVX-512 register each, four times its rate: an
// 8a8w model's 3 × 224 × 224 input 44 → 13 µs.
// Int32 (a 16-bit scheme's activations, qmin..qmax within ±2^16 and an integral |zp| <=
// 2^16): stored as converted. The scalar loop leaves |x·inv| >= 2^22 unrounded where this
// rounds it, but such a value plus zp lies past qmin..qmax either way and is clamped to the
// same bound. A 16a4w_block decoder quantizes ~130 activations a token (the scalar loop:
// 1-5 ns an element).
// Dequant (mode 2, the integers kept in registers): (q - zp) · scale with q the value Int32
// stores, under its conditions (exact: q is an integer within ±2^17, a float holds it).
template <QuantStore Store>
__attribute__((target("avx512f"))) int64_t quantize_avx512(const float* x, void* out, int64_t n, float inv,
                                                           float z, float lo, float hi, float sc = 1.f) {
  const __m512 vinv = _mm512_set1_ps(inv), vz = _mm512_set1_ps(z), vlo = _mm512_set1_ps(lo),
               vhi = _mm512_set1_ps(hi), big = _mm512_set1_ps(16777216.f), nbig = _mm512_set1_ps(-16777216.f),
               vsc = _mm512_set1_ps(sc);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 xi = _mm512_loadu_ps(x + i);
    __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(xi, vinv), nbig), big);
    __m512 r = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_cvtps_epi32(v)), vz);
    r = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(xi, xi, _CMP_UNORD_Q), vlo);  // NaN → qmin
    if constexpr (Store == QuantStore::Int8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<char*>(out) + i),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
    else if constexpr (Store == QuantStore::Int32)
      _mm512_storeu_si512(static_cast<int32_t*>(out) + i, _mm512_cvtps_epi32(r));
    else
      _mm512_storeu_ps(static_cast<float*>(out) + i, _mm512_mul_ps(_mm512_sub_ps(r, vz), vsc));
  }
  return i;
}
}  // namespace
#endif

// quantize (f32 → int: clamp(round_half_even(x * (float)(1/scale)) + zp)) or dequantize
// (int → f32: ((float)q - (float)zp) * (float)scale), as quantized_decomposed computes them
struct QuantOp : Op {
  int mode = 0;
  int64_t qmin = 0, qmax = 255;
  double scale = 1, zp = 0;
  bool wide = false;  // quantize_avx512 (the CPU has AVX-512 and own kernels are allowed)
  void run(Engine& e) override {
    const Tensor& ti = e.tensors[(size_t)ins[0]];
    const Tensor& to = e.tensors[(size_t)outs[0]];
    int64_t n = ti.span;
    const void* src = e.ptr(ins[0]);
    void* dst = e.ptr(outs[0]);
    if (mode == 2) {  // quantize then dequantize: lean's two ops, the integer never stored
      const float* x = static_cast<const float*>(src);
      float* y = static_cast<float*>(dst);
      float inv = (float)(1.0 / scale), z = (float)zp, lo = (float)qmin, hi = (float)qmax, sc = (float)scale;
      int64_t done = 0;
#if defined(__x86_64__)
      if (wide && z == std::floor(z) && std::fabs(z) <= 65536.f && qmin >= -65536 && qmax <= 65536)
        done = quantize_avx512<QuantStore::Dequant>(x, y, n, inv, z, lo, hi, sc);
#endif
      for (int64_t i = done; i < n; ++i) {
        float v = x[i] * inv;
        float r = std::fabs(v) < 4194304.f ? (v + 12582912.f) - 12582912.f : v;
        r += z;
        r = r < lo ? lo : (r > hi ? hi : r);
        r = x[i] != x[i] ? lo : r;
        y[i] = ((float)(int64_t)r - z) * sc;  // the integer quantize stores, dequantized
      }
      return;
    }
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
      // the 8-bit outputs' bulk (an integral zero point and a range the packs keep exact)
      bool packed = z == std::floor(z) && std::fabs(z) <= 32768.f &&
                    (to.dtype == U8 ? qmin >= 0 && qmax <= 255 : qmin >= -128 && qmax <= 127);
      int64_t done = 0;  // the blocks of 16 one of the vector loops wrote; the rest below
#if defined(__x86_64__)
      if (packed && wide) {
        if (to.dtype == U8 || to.dtype == I8) done = quantize_avx512<QuantStore::Int8>(x, dst, n, inv, z, lo, hi);
        packed = false;
      }
      if (wide && to.dtype == I32 && z == std::floor(z) && std::fabs(z) <= 65536.f && qmin >= -65536 &&
          qmax <= 65536)
        done = quantize_avx512<QuantStore::Int32>(x, dst, n, inv, z, lo, hi);
#endif
#if defined(__SSE2__)
      if (packed && to.dtype == U8) done = quantize8_sse<true>(x, dst, n, inv, z, lo, hi);
      if (packed && to.dtype == I8) done = quantize8_sse<false>(x, dst, n, inv, z, lo, hi);
#else
      (void)packed;
#endif
      switch (to.dtype) {
        case U8: { auto* y = static_cast<uint8_t*>(dst); for (int64_t i = done; i < n; ++i) y[i] = (uint8_t)quant(x[i]); break; }
        case I8: { auto* y = static_cast<int8_t*>(dst); for (int64_t i = done; i < n; ++i) y[i] = (int8_t)quant(x[i]); break; }
        case I32: { auto* y = static_cast<int32_t*>(dst); for (int64_t i = done; i < n; ++i) y[i] = (int32_t)quant(x[i]); break; }
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

void contract_quant(const Engine& e, const OpCall& c) {
  need_count(c, 1, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.size() == 3 && c.fa.size() == 2, c.kind, "attributes: ia [mode, qmin, qmax], fa [scale, zp]");
  int64_t mode = c.ia[0];
  const Tensor& ti = e.tensors[(size_t)c.ins[0]];
  const Tensor& to = e.tensors[(size_t)c.outs[0]];
  need(mode == 0 || mode == 1 || mode == 2, c.kind,
       "mode must be 0 (quantize), 1 (dequantize) or 2 (quantize then dequantize)");
  int32_t q = mode == 0 ? to.dtype : ti.dtype, f = mode == 0 ? ti.dtype : to.dtype;
  // quantized values fit qmin..qmax, which fit int32 and a float exactly enough
  if (mode == 2) need(ti.dtype == F32 && to.dtype == F32, c.kind, "mode 2 dtypes (f32 to f32)");
  else need(q != F32 && q != F64 && f == F32, c.kind, "dtypes (f32 and an integer dtype)");
  need(ti.dims == to.dims && ti.strides == to.strides && dense(ti), c.kind, "x and y: one dense layout");
  need(c.ia[1] <= c.ia[2] && c.ia[1] >= -((int64_t)1 << 31) && c.ia[2] < ((int64_t)1 << 31), c.kind,
       "qmin..qmax");
  need(c.fa[0] > 0 && std::isfinite(c.fa[0]) && std::isfinite(1.0 / c.fa[0]) && std::isfinite(c.fa[1]) &&
       std::fabs(c.fa[1]) < 2147483648.0, c.kind, "scale and zero point");
}

void build_quant(Handle& h, const OpCall& c) {
  auto op = std::make_unique<QuantOp>();
  op->mode = (int)c.ia[0]; op->qmin = c.ia[1]; op->qmax = c.ia[2]; op->scale = c.fa[0]; op->zp = c.fa[1];
#if defined(__x86_64__)
  op->wide = own_kernels_allowed() && __builtin_cpu_supports("avx512f");
#endif
  op->name = op->mode == 0 ? "quantize" : op->mode == 1 ? "dequantize" : "quantize-dequantize";
  push_op(h.e, std::move(op), c);
}

namespace {
memory scalar_memory(Engine& e, memory::data_type dt, double value) {
  memory m = new_memory(e, memory::desc({1}, dt, tag::x), "a scale");
  if (dt == memory::data_type::f32) *static_cast<float*>(m.get_data_handle()) = (float)value;
  else *static_cast<int32_t*>(m.get_data_handle()) = (int32_t)value;
  return m;
}
}  // namespace

void contract_int8(const Engine& e, const OpCall& c) {
  const std::string& k = c.kind;
  bool conv = k == "qconv";
  need(c.ia.size() >= 4 && c.fa.size() == 2, k, "attributes too short");
  bool has_bias = c.ia[3] != 0;
  need_count(c, has_bias ? 4 : 3, 1);
  const Tensor& x = e.tensors[(size_t)c.ins[0]];
  const Tensor& w = e.tensors[(size_t)c.ins[1]];
  const Tensor& ws = e.tensors[(size_t)c.ins[2]];
  const Tensor& y = e.tensors[(size_t)c.outs[0]];
  need(x.dtype == U8 && w.dtype == I8 && ws.dtype == F32 && y.dtype == U8, k,
       "dtypes (u8 activations, s8 weights, f32 scales)");
  need(w.is_const && ws.is_const, k, "weights and their scales must be constants");
  // as for float convolutions (convolution.cpp): a destination with gaps is more than
  // oneDNN may write; the lowering writes dense ones
  need(dense(y), k, "the destination must be dense (no gaps between its elements)");
  for (int id : {c.ins[0], c.ins[1], c.outs[0]}) need_dnnl_operand(e, id, k, "an operand");
  need(c.fa[0] > 0 && c.fa[1] > 0 && std::isfinite(c.fa[0]) && std::isfinite(c.fa[1]), k, "scales");
  need(c.ia[0] >= 0 && c.ia[0] <= 255 && c.ia[1] >= 0 && c.ia[1] <= 255, k, "zero points out of range");
  if (conv) {
    need(c.ia.size() > 4, k, "attributes too short");
    check_conv_attrs(k, c.ia, 4, 5);
    size_t rank = (size_t)c.ia[4] + 2;
    need_rank(x, rank, rank, k, "the source");
    need_rank(y, rank, rank, k, "the destination");
    need_rank(w, rank, rank + 1, k, "the weights");
  } else {
    need(c.ia.size() == 4, k, "attribute count");
    need_rank(y, 2, kMaxRank, k, "the destination");
    need(x.dims.size() == y.dims.size() && w.dims.size() == y.dims.size(), k, "operands of different ranks");
  }
  // the scales: one per weight element along the dims the mask selects
  int64_t mask = c.ia[2];
  need(mask >= 0 && mask < ((int64_t)1 << w.dims.size()), k, "scale mask selects dims the weights lack");
  int64_t want = 1;
  for (size_t d = 0; d < w.dims.size(); ++d)
    if (mask & ((int64_t)1 << d)) want = mul_c(want, w.dims[d], "scales");
  need(ws.dims.size() == 1 && ws.dims[0] == want && dense(ws), k,
       "weight scales: dense, rank 1, " + std::to_string(want) + " values (the mask's channels)");
  if (has_bias) {
    const Tensor& b = e.tensors[(size_t)c.ins[3]];
    need(b.is_const && b.dtype == F32, k, "the bias must be an f32 constant (it is reordered at init)");
    need_dnnl_operand(e, c.ins[3], k, "the bias");
    int64_t channels = conv ? y.dims[1] : y.dims.back();
    need(b.numel == channels && dense(b), k, "the bias must be dense, one value per output channel");
    if (!conv) need(b.dims.size() == y.dims.size(), k, "the bias must have the output's rank");
    else need(b.dims.size() == 1, k, "the bias must have rank 1");
  }
}

namespace {
// oneDNN's AMX int8 kernel for 1×1 convolutions (jit_1x1:avx512_core_amx) lost to its
// AVX512-VNNI brgemm one on every MobileNetV2 8a8w layer with at most 64 input channels per
// group, one thread, Intel Xeon with AMX: 16→96 at 112×112 468 against 250 µs, 24→144 at
// 56×56 171 against 106, 32→192 at 28×28 66 against 38, 64→384 at 14×14 32 against 27. A
// tile row holds 64 bytes of the reduction, so a short one leaves the tiles mostly idle
// while their loads and stores still run; from 96 channels on the two were level or AMX
// won (96→24: 36 against 47), and AMX won every ResNet-18 layer, 3×3 and strided 1×1 ones
// (another kernel, jit:avx512_core_amx) included. So such a convolution steps to oneDNN's
// next implementation without AMX, unless that is a reference kernel (then, or when there
// is none, oneDNN's first choice stays). make() gives the convolution's descriptor.
template <class Make>
dnnl::convolution_forward::primitive_desc short_1x1_without_amx(const Make& make, int64_t in_channels) {
  auto pd = make();
  const char* first = pd.impl_info_str();
  if (in_channels > 64 || std::strncmp(first, "jit_1x1:", 8) != 0 || std::strstr(first, "amx") == nullptr)
    return pd;
  while (pd.next_impl()) {
    const char* impl = pd.impl_info_str();
    if (std::strstr(impl, "amx") == nullptr) return std::strstr(impl, "ref") == nullptr ? pd : make();
  }
  return make();
}
}  // namespace

namespace {
// whether oneDNN's int8 kernels on this CPU sum u8·s8 pairs in int16 and may saturate
// (no VNNI or AMX at the ISA oneDNN runs; the file's opening comment)
bool int8_saturates() {
#if defined(__x86_64__)
  using isa = dnnl::cpu_isa;
  const isa got = dnnl::get_effective_cpu_isa();
  return got == isa::sse41 || got == isa::avx || got == isa::avx2 || got == isa::avx512_core;
#else
  return false;
#endif
}

bool int8_via_float() {
  const char* v = std::getenv("OPFORGE_CPU_INT8_FLOAT");
  if (v != nullptr && std::strcmp(v, "1") == 0) return true;
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  static const bool saturates = int8_saturates();
  return saturates;
}

// a new tensor of the engine: an intermediate (data null) or a constant (data copied)
int add_tensor(Handle& h, int32_t dtype, const dims_t& dims, const dims_t& strides, const void* data,
               int64_t nbytes) {
  char error[512] = {0};
  int32_t id = ofc_add_tensor(&h, dtype, (int32_t)dims.size(), dims.data(), strides.data(), data, nbytes,
                              -1, 0, OWNED, error, (int32_t)sizeof(error));
  if (id < 0) fail(std::string("int8 via float32: ") + error);
  return id;
}

dims_t dense_strides(const dims_t& dims) {
  dims_t s(dims.size(), 1);
  for (size_t k = dims.size(); k-- > 1;) s[k - 1] = mul_c(s[k], std::max<int64_t>(dims[k], 1), "strides");
  return s;
}

// the weights as lean dequantizes them: float32(w) · its scale (the mask's dims select it),
// one rounding each, dense
std::vector<float> dequantized_weights(Engine& e, int wid, int sid, int mask) {
  const Tensor& w = e.tensors[(size_t)wid];
  const float* scales = static_cast<const float*>(e.ptr(sid));
  const int8_t* q = static_cast<const int8_t*>(e.ptr(wid));
  const size_t r = w.dims.size();
  std::vector<float> out((size_t)w.numel);
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < w.numel; ++i) {
    int64_t at = 0, s = 0;
    for (size_t d = 0; d < r; ++d) {
      at += idx[d] * w.strides[d];
      if (mask & (1 << d)) s = s * w.dims[d] + idx[d];
    }
    out[(size_t)i] = (float)q[at] * scales[s];
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < w.dims[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}
}  // namespace

void build_int8(Handle& h, const OpCall& c) {
  Engine& e = h.e;
  bool conv = c.kind == "qconv";
  if (conv && build_qdepthwise(h, c)) return;
  const bool via_float = int8_via_float();
  const auto& ins = c.ins;
  const auto& ia = c.ia;
  const auto& fa = c.fa;
  bool has_bias = ia[3] != 0;
  int mask = (int)ia[2];
  int src_id = ins[0], dst_id = c.outs[0], wf_id = -1;
  if (via_float) {
    need(dense(e.tensors[(size_t)src_id]), c.kind, "a dense source (int8 via float32 on this CPU)");
    const dims_t xdims = e.tensors[(size_t)src_id].dims, xstrides = e.tensors[(size_t)src_id].strides;
    const dims_t ydims = e.tensors[(size_t)dst_id].dims, ystrides = e.tensors[(size_t)dst_id].strides;
    const dims_t wdims = e.tensors[(size_t)ins[1]].dims;
    std::vector<float> wf = dequantized_weights(e, ins[1], ins[2], mask);
    src_id = add_tensor(h, F32, xdims, xstrides, nullptr, 0);
    dst_id = add_tensor(h, F32, ydims, ystrides, nullptr, 0);
    wf_id = add_tensor(h, F32, wdims, dense_strides(wdims), wf.data(), (int64_t)(wf.size() * sizeof(float)));
    OpCall deq{"quant", {ins[0]}, {src_id}, {1, 0, 255}, {fa[0], (double)ia[0]}, {}};
    validate(e, deq);
    build_quant(h, deq);
  }
  const Tensor& w = e.tensors[(size_t)ins[1]];
  const Tensor& ws = e.tensors[(size_t)ins[2]];
  auto op = std::make_unique<DnnlOp>();
  op->name = std::string(conv ? "int8 convolution" : "int8 matmul") + (via_float ? " (via float32)" : "");
  memory::desc src = e.tensors[(size_t)src_id].md(), dst = e.tensors[(size_t)dst_id].md();
  memory::desc wany(w.dims, via_float ? memory::data_type::f32 : memory::data_type::s8, tag::any);
  memory::desc bias = has_bias ? e.tensors[(size_t)ins[3]].md() : memory::desc();
  op->arg(DNNL_ARG_SRC, src_id, src);
  op->arg(DNNL_ARG_DST, dst_id, dst);
  // post-ops act on the f32 accumulator of integer inputs, which holds no NaN: all of
  // them stay in oneDNN (an epilogue would see the u8 output)
  auto attr = make_attr(e, c.post, op.get(), /*nan_exact=*/false);
  if (!via_float) {
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, mask);
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
    attr.set_zero_points_mask(DNNL_ARG_DST, 0);
  }
  op->check_fits(e);
  memory::desc wmd, scratch;
  if (conv) {
    memory::dims strides, dil, pl, pr;
    conv_window(ia, 4, strides, dil, pl, pr);
    auto make = [&] {
      return dnnl::convolution_forward::primitive_desc(
          e.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wany,
          bias, dst, strides, dil, pl, pr, attr);
    };
    auto pd = short_1x1_without_amx(make, w.dims[w.dims.size() - 3]);  // (input channels per group)
    op->prim = dnnl::convolution_forward(pd);
    wmd = pd.weights_desc(); scratch = pd.scratchpad_desc();
  } else {
    auto pd = dnnl::matmul::primitive_desc(e.eng, src, wany, bias, dst, attr);
    op->prim = dnnl::matmul(pd);
    wmd = pd.weights_desc(); scratch = pd.scratchpad_desc();
  }
  add_scratchpad(e, op.get(), scratch);
  op->fixed_args.emplace_back(DNNL_ARG_WEIGHTS, reorder_const(e, via_float ? wf_id : ins[1], wmd));
  if (has_bias) op->fixed_args.emplace_back(DNNL_ARG_BIAS, reorder_const(e, ins[3], bias));
  if (via_float) {
    op->bind(e);
    OpCall mid{c.kind, {src_id, wf_id}, {dst_id}, {}, {}, {}};
    push_op(e, std::move(op), mid);
    OpCall q{"quant", {dst_id}, {c.outs[0]}, {0, 0, 255}, {fa[1], (double)ia[1]}, {}};
    validate(e, q);
    build_quant(h, q);
    return;
  }
  memory wscale = new_memory(e, memory::desc({ws.span}, memory::data_type::f32, tag::x), "weight scales");
  std::memcpy(wscale.get_data_handle(), e.ptr(ins[2]), (size_t)ws.span * sizeof(float));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, wscale);
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, scalar_memory(e, memory::data_type::f32, fa[0]));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, scalar_memory(e, memory::data_type::f32, fa[1]));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, scalar_memory(e, memory::data_type::s32, (double)ia[0]));
  op->fixed_args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, scalar_memory(e, memory::data_type::s32, (double)ia[1]));
  op->bind(e);
  push_op(e, std::move(op), c);
}

}  // namespace ofc
