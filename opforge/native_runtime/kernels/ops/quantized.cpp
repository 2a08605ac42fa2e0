// Quantize / dequantize (quantized_decomposed, torchao): the NumPy kernels of the same keys
// (opforge/kernels/portable/quantized.py) bit for bit, in their arithmetic order and float
// precision:
//   quantize    clamp(rint(C(x) * C(1 / scale)) + C(zero_point), qmin, qmax) cast to out,
//               C = float32 per tensor (1 / scale in double, rounded to float32), per
//               channel / block the promotion of float32 and the scales' dtype;
//   dequantize  per tensor (F(q) - F(zp)) * F(scale), F = out's float dtype; per channel
//               C(int64(q) - int64(zp)) * C(scale); per block P(F(q) - F(zp)) * P(scale),
//               P = the promotion of F and the scales' dtype.
// float16 arithmetic is NumPy's: each operation in float32, rounded to float16.
// Per tensor and per channel here; torchao's per-block keys in quantized_affine.cpp, the
// arithmetic both share in quantized_common.h.
#include <vector>

#include "copy.h"
#include "portable.h"
#include "quantized_common.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

using namespace quantized;

void quantize_per_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::quantize_per_tensor.out";
  OPF_TENSOR(0, "input", x);
  double scale;
  if (!double_arg(ctx, args, n, 1, kOp, "scale", &scale)) return;
  OPF_INT(2, "zero_point", zero_point);
  OPF_INT(3, "quant_min", qmin);
  OPF_INT(4, "quant_max", qmax);
  OPF_TENSOR(6, "out", out);
  if (!check_shape(ctx, kOp, out, x.sizes, x.rank) || !convertible_in(ctx, kOp, "input", x) ||
      !convertible_in(ctx, kOp, "out", out))
    return;
  const float inverse = static_cast<float>(1.0 / scale), zp = static_cast<float>(zero_point);
  const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
  auto one = [&](float v) {
    float t = rint_float(v * inverse) + zp;
    t = t < lo ? lo : t;  // np.clip's order (a NaN stays)
    return t > hi ? hi : t;
  };
  if (x.dense && out.dense && x.dtype == kFloat32) {  // the common cases
    const float* px = x.ptr<float>();
    switch (out.dtype) {
      case kInt8: quantize_run(px, out.ptr<int8_t>(), x.numel, inverse, zp, lo, hi); return;
      case kUInt8: quantize_run(px, out.ptr<uint8_t>(), x.numel, inverse, zp, lo, hi); return;
      case kInt16: quantize_run(px, out.ptr<int16_t>(), x.numel, inverse, zp, lo, hi); return;
      case kInt32: quantize_run(px, out.ptr<int32_t>(), x.numel, inverse, zp, lo, hi); return;
      default: break;
    }
  }
  for_each_element(x, out, [&](char* px, char* po, const int64_t*) {
    store_double(po, out.dtype, one(static_cast<float>(load_double(px, x.dtype))));
  });
}

void dequantize_per_tensor_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::dequantize_per_tensor.out";
  OPF_TENSOR(0, "input", q);
  double scale;
  if (!double_arg(ctx, args, n, 1, kOp, "scale", &scale)) return;
  OPF_INT(2, "zero_point", zero_point);
  OPF_TENSOR(7, "out", out);
  if (!check_shape(ctx, kOp, out, q.sizes, q.rank) || !float_out(ctx, kOp, out) ||
      !convertible_in(ctx, kOp, "input", q))
    return;
  if (q.dense && out.dense && out.dtype == kFloat32) {  // the common cases, in float32
    // the generic loop's bits: its doubles are float32 values (float(q) rounds an int32 once,
    // directly or through double), and a float32 - or * done in double and rounded is float32's
    const float zp = static_cast<float>(static_cast<double>(zero_point)), s = static_cast<float>(scale);
    float* po = out.ptr<float>();
    auto run = [&](auto t) {
      using Q = decltype(t);
      const Q* pq = q.ptr<Q>();
      for (int64_t i = 0; i < q.numel; ++i) po[i] = (static_cast<float>(pq[i]) - zp) * s;
    };
    switch (q.dtype) {
      case kInt8: run(int8_t{}); return;
      case kUInt8: run(uint8_t{}); return;
      case kInt16: run(int16_t{}); return;
      case kUInt16: run(uint16_t{}); return;
      case kInt32: run(int32_t{}); return;
      default: break;
    }
  }
  Precision p{out.dtype};
  const double zp = p.round(static_cast<double>(zero_point)), s = p.round(scale);
  for_each_element(q, out, [&](char* pq, char* po, const int64_t*) {
    double t = p.round(load_double(pq, q.dtype));  // q.astype(out dtype)
    store_double(po, out.dtype, p.mul(p.sub(t, zp), s));
  });
}

// scales / zero points of a per-channel op: 1-d, `channels` of them, matching axis's size
// (or 1, which broadcasts as in NumPy).
bool channel_params(opforge_context* ctx, const char* op, const View& x, int64_t axis,
                    const View& scales, int64_t* dim) {
  if (x.rank == 0 || !wrap_dim(ctx, op, axis, x.rank, dim)) {
    if (x.rank == 0) fail(ctx, "%s: input — found a 0-d tensor — valid: rank >= 1", op);
    return false;
  }
  int64_t channels = scales.numel;
  if (scales.rank != 1 || (channels != x.sizes[*dim] && channels != 1)) {
    fail(ctx, "%s: scales — found %lld of rank %d for axis %lld of size %lld — valid: one per "
         "channel, 1-d — re-export the program", op, (long long)channels, scales.rank,
         (long long)*dim, (long long)x.sizes[*dim]);
    return false;
  }
  return true;
}


void quantize_per_channel_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::quantize_per_channel.out";
  OPF_TENSOR(0, "input", x);
  OPF_TENSOR(1, "scales", scales);
  OPF_TENSOR(2, "zero_points", zps);
  OPF_INT(3, "axis", axis);
  OPF_INT(4, "quant_min", qmin);
  OPF_INT(5, "quant_max", qmax);
  OPF_TENSOR(7, "out", out);
  int64_t dim;
  if (!check_shape(ctx, kOp, out, x.sizes, x.rank) || !channel_params(ctx, kOp, x, axis, scales, &dim))
    return;
  if (zps.numel != scales.numel || !is_floating(scales.dtype) || !convertible_in(ctx, kOp, "input", x) ||
      !convertible_in(ctx, kOp, "zero_points", zps) || !convertible_in(ctx, kOp, "out", out)) {
    if (ctx->status == 0)
      fail(ctx, "%s: scales and zero_points — found %lld scales (%s) and %lld zero points — "
           "valid: float scales, one zero point per scale — re-export the program", kOp,
           (long long)scales.numel, dtype_name(scales.dtype), (long long)zps.numel);
    return;
  }
  Precision c{with_float32(scales.dtype)};
  std::vector<double> inverse(scales.numel), zp(scales.numel);
  for (int64_t k = 0; k < scales.numel; ++k) {
    inverse[k] = c.div(1.0, c.round(load_double(element(scales, k), scales.dtype)));
    zp[k] = c.round(load_double(element(zps, k), zps.dtype));
  }
  const double lo = c.round(static_cast<double>(qmin)), hi = c.round(static_cast<double>(qmax));
  const bool broadcast = scales.numel == 1;
  if (x.dense && out.dense && x.dtype == kFloat32 && c.dtype == kFloat32 &&
      (out.dtype == kInt8 || out.dtype == kUInt8)) {  // the common case, in float32
    int64_t outer = 1, inner = 1, channels = x.sizes[dim];
    for (int k = 0; k < dim; ++k) outer *= x.sizes[k];
    for (int k = dim + 1; k < x.rank; ++k) inner *= x.sizes[k];
    const float* px = x.ptr<float>();
    const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
    auto run = [&](auto q) {
      using Q = decltype(q);
      Q* po = out.ptr<Q>();
      for (int64_t o = 0, e = 0; o < outer; ++o)
        for (int64_t ch = 0; ch < channels; ++ch) {
          int64_t k = broadcast ? 0 : ch;
          quantize_run(px + e, po + e, inner, static_cast<float>(inverse[k]), static_cast<float>(zp[k]), flo, fhi);
          e += inner;
        }
    };
    if (out.dtype == kInt8) run(int8_t{});
    else run(uint8_t{});
    return;
  }
  for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
    int64_t k = broadcast ? 0 : idx[dim];
    double t = c.mul(c.round(load_double(px, x.dtype)), inverse[k]);
    t = c.round(rint_in(c, t) + zp[k]);
    store_double(po, out.dtype, clip(t, lo, hi));
  });
}

void dequantize_per_channel_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "quantized_decomposed::dequantize_per_channel.out";
  OPF_TENSOR(0, "input", q);
  OPF_TENSOR(1, "scales", scales);
  View zps;
  bool has_zp;
  if (!optional_tensor_arg(ctx, args, n, 2, kOp, "zero_points", &zps, &has_zp)) return;
  OPF_INT(3, "axis", axis);
  OPF_TENSOR(8, "out", out);
  int64_t dim;
  if (!check_shape(ctx, kOp, out, q.sizes, q.rank) || !float_out(ctx, kOp, out) ||
      !channel_params(ctx, kOp, q, axis, scales, &dim) || !convertible_in(ctx, kOp, "input", q))
    return;
  if ((has_zp && (zps.numel != scales.numel || !convertible_in(ctx, kOp, "zero_points", zps))) ||
      !is_floating(scales.dtype)) {
    if (ctx->status == 0)
      fail(ctx, "%s: scales and zero_points — found %lld scales (%s) and %lld zero points — "
           "valid: float scales, one zero point per scale — re-export the program", kOp,
           (long long)scales.numel, dtype_name(scales.dtype), (long long)zps.numel);
    return;
  }
  Precision c{with_float32(scales.dtype)};
  const bool broadcast = scales.numel == 1;
  if (q.dense && out.dense && (q.dtype == kInt8 || q.dtype == kUInt8) && out.dtype == kFloat32 &&
      c.dtype == kFloat32) {  // the common case, in float32
    int64_t outer = 1, inner = 1, channels = q.sizes[dim];
    for (int k = 0; k < dim; ++k) outer *= q.sizes[k];
    for (int k = dim + 1; k < q.rank; ++k) inner *= q.sizes[k];
    float* po = out.ptr<float>();
    auto run = [&](auto t) {
      using Q = decltype(t);
      const Q* pq = q.ptr<Q>();
      for (int64_t o = 0, e = 0; o < outer; ++o)
        for (int64_t ch = 0; ch < channels; ++ch) {
          int64_t k = broadcast ? 0 : ch;
          const float s = static_cast<float>(load_double(element(scales, k), scales.dtype));
          const int64_t z = has_zp ? static_cast<int64_t>(std::trunc(load_double(element(zps, k), zps.dtype))) : 0;
          if (z > -(int64_t(1) << 30) && z < (int64_t(1) << 30)) {  // q - z exact in int32: vectorizes
            const int32_t z32 = static_cast<int32_t>(z);
            for (int64_t i = 0; i < inner; ++i) po[e + i] = static_cast<float>(static_cast<int32_t>(pq[e + i]) - z32) * s;
            e += inner;
          } else {
            for (int64_t i = 0; i < inner; ++i, ++e)
              po[e] = static_cast<float>(static_cast<int64_t>(pq[e]) - z) * s;
          }
        }
    };
    if (q.dtype == kInt8) run(int8_t{});
    else run(uint8_t{});
    return;
  }
  for_each_element(q, out, [&](char* pq, char* po, const int64_t* idx) {
    int64_t k = broadcast ? 0 : idx[dim];
    double s = c.round(load_double(element(scales, k), scales.dtype)), t;
    if (has_zp) {
      // int64(q) - int64(zp), then to the compute dtype
      int64_t a = static_cast<int64_t>(load_double(pq, q.dtype));
      int64_t b = static_cast<int64_t>(std::trunc(load_double(element(zps, k), zps.dtype)));
      t = c.round(static_cast<double>(a - b));
    } else {
      t = c.round(load_double(pq, q.dtype));
    }
    store_double(po, out.dtype, c.mul(t, s));
  });
}

const KernelDef kQuantizedKernels[] = {
    {"quantized_decomposed::quantize_per_tensor.out", "T D I I I ST T!", quantize_per_tensor_out},
    {"quantized_decomposed::dequantize_per_tensor.out", "T D I I I ST ST? T!", dequantize_per_tensor_out},
    {"quantized_decomposed::quantize_per_channel.out", "T T T I I I ST T!", quantize_per_channel_out},
    {"quantized_decomposed::dequantize_per_channel.out", "T T T? I I I ST ST? T!", dequantize_per_channel_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(quantized, kQuantizedKernels)
