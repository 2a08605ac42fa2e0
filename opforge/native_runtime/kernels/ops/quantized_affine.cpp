// torchao's quantize_affine / dequantize_affine (a scale and zero point per block of the
// input): the NumPy kernels of the same keys bit for bit, in the arithmetic stated at the
// top of quantized.cpp (quantized_common.h holds what the two files share).
#include <vector>

#include "copy.h"
#include "portable.h"
#include "quantized_common.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

using namespace quantized;

// torchao's block layout (quantized.py reduction_shape): per dim, the scale index of a
// coordinate is c / block (blocked), c (block 1), or 0 (one block).
struct Blocks {
  int rank = 0;
  int64_t block[kMaxRank];
  int64_t mode[kMaxRank];  // 0: one block, 1: per element, 2: blocked
  int64_t mult[kMaxRank];  // the scale tensor's row-major multipliers
  int64_t count = 1;       // scales expected
  std::vector<int64_t> table[kMaxRank];  // per dim: each coordinate's share of the index
  void tabulate(const int64_t* sizes) {
    for (int d = 0; d < rank; ++d) {
      table[d].resize(static_cast<size_t>(sizes[d]));
      for (int64_t c = 0; c < sizes[d]; ++c)
        table[d][c] = mode[d] == 0 ? 0 : (mode[d] == 2 ? c / block[d] : c) * mult[d];
    }
  }
  int64_t index(const int64_t* c) const {
    int64_t k = 0;
    for (int d = 0; d < rank; ++d) k += table[d][c[d]];
    return k;
  }
};

bool blocks_of(opforge_context* ctx, const char* op, const View& x, const int64_t* block_size,
               int64_t count, Blocks* b) {
  if (count != x.rank) {
    fail(ctx, "%s: block_size — has %lld entries — valid: one per dimension of the rank-%d "
         "input — re-export the program", op, (long long)count, x.rank);
    return false;
  }
  b->rank = x.rank;
  int64_t dims[kMaxRank];
  for (int d = 0; d < x.rank; ++d) {
    int64_t block = block_size[d], size = x.sizes[d];
    b->block[d] = block;
    if (block != size && block > 1) {
      if (size % block) {
        fail(ctx, "%s: block_size — block %lld does not divide size %lld of dim %d — "
             "re-export the program", op, (long long)block, (long long)size, d);
        return false;
      }
      b->mode[d] = 2, dims[d] = size / block;
    } else if (block == 1 && size != 1) {
      b->mode[d] = 1, dims[d] = size;
    } else {
      b->mode[d] = 0, dims[d] = 1;
    }
  }
  int64_t m = 1;
  for (int d = x.rank - 1; d >= 0; --d) b->mult[d] = m, m *= dims[d];
  b->count = m;
  b->tabulate(x.sizes);
  return true;
}

// scale / zero point tensors: row-major, as many elements as the blocks
bool block_params(opforge_context* ctx, const char* op, const char* what, const View& v,
                  const Blocks& b) {
  if (v.numel != b.count || !v.dense || !convertible(v.dtype)) {
    fail(ctx, "%s: %s — found %lld elements (%s%s) — valid: %lld, one per block, contiguous — "
         "re-export the program", op, what, (long long)v.numel, dtype_name(v.dtype),
         v.dense ? "" : ", strided", (long long)b.count);
    return false;
  }
  return true;
}

// For dense tensors: f(element offset, run length, block index) for each run of the last
// dim that shares one scale.
template <typename F>
void block_runs(const View& x, const Blocks& b, F&& f) {
  if (x.numel == 0) return;
  int last = x.rank - 1;
  int64_t len = x.rank ? x.sizes[last] : 1, idx[kMaxRank] = {};
  struct Run { int64_t start, length, k; };
  std::vector<Run> runs;  // the last dim's runs, the same in every row
  for (int64_t c = 0; c < len;) {
    int64_t k = x.rank ? b.table[last][c] : 0, end = c + 1;
    while (end < len && b.table[last][end] == k) ++end;
    runs.push_back(Run{c, end - c, k});
    c = end;
  }
  for (int64_t e = 0; e < x.numel; e += len) {
    int64_t base = 0;
    for (int d = 0; d < last; ++d) base += b.table[d][idx[d]];
    for (const Run& r : runs) f(e + r.start, r.length, base + r.k);
    for (int d = last - 1; d >= 0; --d) {
      if (++idx[d] < x.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

const char* flat(const View& v, int64_t k) { return v.data + k * itemsize(v.dtype); }

void quantize_affine_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "torchao::quantize_affine.out";
  OPF_TENSOR(0, "input", x);
  OPF_INTS(1, "block_size", block_size, count);
  OPF_TENSOR(2, "scale", scale);
  View zp;
  bool has_zp;
  if (!optional_tensor_arg(ctx, args, n, 3, kOp, "zero_point", &zp, &has_zp)) return;
  OPF_TENSOR(7, "out", out);
  Blocks b;
  if (!check_shape(ctx, kOp, out, x.sizes, x.rank) || !blocks_of(ctx, kOp, x, block_size, count, &b) ||
      !block_params(ctx, kOp, "scale", scale, b) || !convertible_in(ctx, kOp, "input", x) ||
      !convertible_in(ctx, kOp, "out", out))
    return;
  has_zp = has_zp && zp.numel > 0;
  if (has_zp && !block_params(ctx, kOp, "zero_point", zp, b)) return;
  double lo, hi;
  int64_t ilo = 0, ihi = 0;
  bool integral = true;
  if (!is_integral(out.dtype, false) && (is_none(args, n, 5) || is_none(args, n, 6))) {
    fail(ctx, "%s: quant_min / quant_max — None for a %s out — valid: given, or an integer "
         "out — re-export the program", kOp, dtype_name(out.dtype));
    return;
  }
  switch (out.dtype) {
    case kInt8: lo = INT8_MIN, hi = INT8_MAX; break;
    case kUInt8: lo = 0, hi = UINT8_MAX; break;
    case kInt16: lo = INT16_MIN, hi = INT16_MAX; break;
    case kUInt16: lo = 0, hi = UINT16_MAX; break;
    case kInt32: lo = INT32_MIN, hi = INT32_MAX; break;
    case kUInt32: lo = 0, hi = UINT32_MAX; break;
    case kUInt64: lo = 0, hi = 18446744073709551615.0; break;
    default: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;  // int64
  }
  if (!is_none(args, n, 5)) {
    if (!scalar_arg(ctx, args, n, 5, kOp, "quant_min", &lo, &ilo, &integral)) return;
  }
  if (!is_none(args, n, 6)) {
    if (!scalar_arg(ctx, args, n, 6, kOp, "quant_max", &hi, &ihi, &integral)) return;
  }
  Precision c{with_float32(is_floating(scale.dtype) ? scale.dtype : kFloat32)};
  lo = c.round(lo), hi = c.round(hi);
  std::vector<double> inverse(b.count), zero(b.count, 0.0);
  for (int64_t k = 0; k < b.count; ++k) {
    inverse[k] = c.div(1.0, c.round(load_double(flat(scale, k), scale.dtype)));
    if (has_zp) zero[k] = c.round(load_double(flat(zp, k), zp.dtype));
  }
  if (x.dtype == kFloat32 && c.dtype == kFloat32 && (out.dtype == kInt8 || out.dtype == kUInt8)) {
    std::vector<float> finv(inverse.begin(), inverse.end()), fzero(zero.begin(), zero.end());
    const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
    auto one = [&](float v, int64_t k) {
      float t = rint_float(v * finv[k]);
      if (has_zp) t = t + fzero[k];
      return std::isnan(t) ? t : t < flo ? flo : t > fhi ? fhi : t;
    };
    if (x.dense && out.dense) {  // runs of one scale through the vector loop
      const float* px = x.ptr<float>();
      block_runs(x, b, [&](int64_t at, int64_t len, int64_t k) {
        if (out.dtype == kInt8) quantize_run(px + at, out.ptr<int8_t>() + at, len, finv[k], fzero[k], flo, fhi);
        else quantize_run(px + at, out.ptr<uint8_t>() + at, len, finv[k], fzero[k], flo, fhi);
      });
      return;
    }
    if (out.dtype == kInt8)
      for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
        float v;
        std::memcpy(&v, px, 4);
        *reinterpret_cast<int8_t*>(po) = to_int<int8_t>(one(v, b.index(idx)));
      });
    else
      for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
        float v;
        std::memcpy(&v, px, 4);
        *reinterpret_cast<uint8_t*>(po) = to_int<uint8_t>(one(v, b.index(idx)));
      });
    return;
  }
  for_each_element(x, out, [&](char* px, char* po, const int64_t* idx) {
    int64_t k = b.index(idx);
    double t = rint_in(c, c.mul(c.round(load_double(px, x.dtype)), inverse[k]));
    if (has_zp) t = c.round(t + zero[k]);
    store_double(po, out.dtype, clip(t, lo, hi));
  });
}

void dequantize_affine_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "torchao::dequantize_affine.out";
  OPF_TENSOR(0, "input", q);
  OPF_INTS(1, "block_size", block_size, count);
  OPF_TENSOR(2, "scale", scale);
  View zp;
  bool has_zp;
  if (!optional_tensor_arg(ctx, args, n, 3, kOp, "zero_point", &zp, &has_zp)) return;
  OPF_TENSOR(8, "out", out);
  Blocks b;
  if (!check_shape(ctx, kOp, out, q.sizes, q.rank) || !float_out(ctx, kOp, out) ||
      !blocks_of(ctx, kOp, q, block_size, count, &b) || !block_params(ctx, kOp, "scale", scale, b) ||
      !convertible_in(ctx, kOp, "input", q) || (has_zp && !block_params(ctx, kOp, "zero_point", zp, b)))
    return;
  Precision f{out.dtype};
  Precision p{promote(out.dtype, is_floating(scale.dtype) ? scale.dtype : out.dtype)};
  std::vector<double> scales(b.count), zero(b.count, 0.0);
  for (int64_t k = 0; k < b.count; ++k) {
    scales[k] = load_double(flat(scale, k), scale.dtype);
    if (has_zp) zero[k] = f.round(load_double(flat(zp, k), zp.dtype));
  }
  if ((q.dtype == kInt8 || q.dtype == kUInt8) && out.dtype == kFloat32 && p.dtype == kFloat32) {
    std::vector<float> fs(scales.begin(), scales.end()), fz(zero.begin(), zero.end());
    auto run = [&](auto t) {
      using Q = decltype(t);
      if (q.dense && out.dense) {  // runs of one scale
        const Q* pq = q.ptr<Q>();
        float* po = out.ptr<float>();
        block_runs(q, b, [&](int64_t at, int64_t len, int64_t k) {
          const float z = fz[k], sc = fs[k];
          for (int64_t i = at; i < at + len; ++i) {
            float v = static_cast<float>(pq[i]);
            if (has_zp) v = v - z;
            po[i] = v * sc;
          }
        });
        return;
      }
      for_each_element(q, out, [&](char* pq, char* po, const int64_t* idx) {
        int64_t k = b.index(idx);
        float v = static_cast<float>(*reinterpret_cast<const Q*>(pq));
        if (has_zp) v = v - fz[k];
        v = v * fs[k];
        std::memcpy(po, &v, 4);
      });
    };
    if (q.dtype == kInt8) run(int8_t{});
    else run(uint8_t{});
    return;
  }
  for_each_element(q, out, [&](char* pq, char* po, const int64_t* idx) {
    int64_t k = b.index(idx);
    double t = f.round(load_double(pq, q.dtype));
    if (has_zp) t = f.sub(t, zero[k]);
    store_double(po, out.dtype, f.round(p.mul(t, scales[k])));
  });
}

const KernelDef kQuantizedAffineKernels[] = {
    {"torchao::quantize_affine.out", "T IL T T? ST S? S? T!", quantize_affine_out},
    {"torchao::dequantize_affine.out", "T IL T T? ST S? S? ST T!", dequantize_affine_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(quantized_affine, kQuantizedAffineKernels)
