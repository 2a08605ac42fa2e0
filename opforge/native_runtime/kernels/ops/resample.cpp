// Resampling: nearest, nearest-exact and (bi/tri)linear upsampling of 1-, 2- and 3-d
// signals, with the index arithmetic and rounding of the NumPy kernels of the same keys
// (opforge/kernels/portable/resample.py, which reproduces ATen's CPU kernels): the same
// source indices, the same weights, the same products and sums in the same dtype, so the
// results are those kernels' bits.
#include <cmath>
#include <vector>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

struct Scale {
  bool given;
  double value;
};

// ATen's opmath: float32 and float64 stay, the rest compute in float32.
bool opmath_double(int32_t dtype) { return dtype == kFloat64; }

template <typename CT>
CT axis_scale(int64_t in, int64_t out, bool align_corners, Scale scale) {
  if (align_corners) return out > 1 ? static_cast<CT>(in - 1) / static_cast<CT>(out - 1) : CT(0);
  if (scale.given && scale.value > 0) return static_cast<CT>(1.0 / scale.value);
  return out ? static_cast<CT>(in) / static_cast<CT>(out) : CT(0);
}

// s * v - 0.5 rounded once for float32 (the fused multiply-add ATen is compiled to)
template <typename CT>
CT fma_shift(CT s, CT v) {
  if constexpr (std::is_same_v<CT, float>)
    return static_cast<float>(static_cast<double>(s) * static_cast<double>(v) - 0.5);
  else
    return s * v - CT(0.5);
}

int64_t floor_index(double real, int64_t in) {
  int64_t i = static_cast<int64_t>(std::floor(static_cast<float>(real)));  // floorf, as ATen
  return i < in - 1 ? i : in - 1;
}

template <typename CT>
void nearest_indices(int64_t in, int64_t out, Scale scale, bool exact, int spatial, int64_t* idx) {
  if (spatial == 2) {
    if (!exact && out == in) { for (int64_t j = 0; j < out; ++j) idx[j] = j; return; }
    if (!exact && out == 2 * in) { for (int64_t j = 0; j < out; ++j) idx[j] = j >> 1; return; }
    float s = axis_scale<float>(in, out, false, scale);
    for (int64_t j = 0; j < out; ++j) {
      float real = exact ? static_cast<float>((static_cast<double>(j) + 0.5) * static_cast<double>(s))
                         : static_cast<float>(j) * s;
      idx[j] = floor_index(real, in);
    }
    return;
  }
  CT s = axis_scale<CT>(in, out, false, scale);
  for (int64_t j = 0; j < out; ++j) {
    CT dst = static_cast<CT>(j);
    double real;
    if (exact) {
      CT shifted = fma_shift<CT>(s, dst + CT(0.5));
      if (shifted < CT(0)) shifted = CT(0);
      real = static_cast<double>(shifted) + 0.5;
    } else {
      real = static_cast<double>(static_cast<CT>(dst * s));
    }
    idx[j] = floor_index(real, in);
  }
}

bool check_layout(opforge_context* ctx, const char* op, const View& in, const View& out) {
  int spatial = out.rank - 2;
  bool ok = spatial >= 1 && spatial <= 3 && in.rank == out.rank && in.sizes[0] == out.sizes[0] &&
            in.sizes[1] == out.sizes[1];
  if (!ok) {
    fail(ctx, "%s: input — found rank %d with a rank-%d out — valid: (N, C) followed by 1 to 3 "
         "spatial dims, out sharing N and C — check the exported shapes", op, in.rank, out.rank);
    return false;
  }
  for (int k = 2; k < in.rank; ++k)
    if (in.sizes[k] == 0 && out.numel) {
      fail(ctx, "%s: input — found an empty spatial dim — valid: non-empty spatial dims (ATen "
           "refuses them too) — check the input shape", op);
      return false;
    }
  return true;
}

// The scales of the spatial dims: `count` optional doubles from args[first...], or a DL?
// list at args[first] (list == true).
bool scales_arg(opforge_context* ctx, opforge_arg* args, int64_t n, int64_t first, int spatial,
                bool list, const char* op, Scale* scales) {
  for (int k = 0; k < spatial; ++k) scales[k] = Scale{false, 0};
  if (list) {
    if (is_none(args, n, first)) return true;
    if (first >= n || args[first].tag != OPFORGE_ARG_DOUBLE_LIST || args[first].v.list.size != spatial ||
        !args[first].v.list.data) {
      fail(ctx, "%s: scale_factors — valid: None or one float per spatial dim (%d)", op, spatial);
      return false;
    }
    const double* v = static_cast<const double*>(args[first].v.list.data);
    for (int k = 0; k < spatial; ++k) scales[k] = Scale{true, v[k]};
    return true;
  }
  for (int k = 0; k < spatial; ++k) {
    if (is_none(args, n, first + k)) continue;
    double v;
    if (!double_arg(ctx, args, n, first + k, op, "scale", &v)) return false;
    scales[k] = Scale{true, v};
  }
  return true;
}

void nearest(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp, int spatial_of_key,
             bool exact, bool list) {
  OPF_TENSOR(0, "self", self);
  int64_t out_index = list ? 3 : 2 + spatial_of_key;
  OPF_TENSOR(out_index, "out", out);
  if (!check_layout(ctx, kOp, self, out)) return;
  int spatial = out.rank - 2;
  Scale scales[3];
  if (!scales_arg(ctx, args, n, 2, list ? spatial : spatial_of_key, list, kOp, scales)) return;
  if (out.numel == 0) return;
  if (!convertible(out.dtype) || !convertible(self.dtype)) {
    fail(ctx, "%s: out — dtype %s", kOp, dtype_name(out.dtype));
    return;
  }
  std::vector<int64_t> index[3];
  for (int k = 0; k < spatial; ++k) {
    index[k].resize(static_cast<size_t>(out.sizes[2 + k]));
    if (opmath_double(self.dtype))
      nearest_indices<double>(self.sizes[2 + k], out.sizes[2 + k], scales[k], exact, spatial, index[k].data());
    else
      nearest_indices<float>(self.sizes[2 + k], out.sizes[2 + k], scales[k], exact, spatial, index[k].data());
  }
  int64_t item = itemsize(self.dtype);
  bool same = self.dtype == out.dtype;
  for_each_element(out, out, [&](char* po, char*, const int64_t* c) {
    int64_t off = c[0] * self.strides[0] + c[1] * self.strides[1];
    for (int k = 0; k < spatial; ++k) off += index[k][c[2 + k]] * self.strides[2 + k];
    if (same) std::memcpy(po, self.data + off * item, item);
    else store_double(po, out.dtype, load_double(self.data + off * item, self.dtype));
  });
}

// --- linear -------------------------------------------------------------------------------

template <typename CT>
struct Axis {
  std::vector<int64_t> i0, i1;
  std::vector<CT> l0, l1;
};

template <typename CT>
void linear_weights(int64_t in, int64_t out, bool align, Scale scale, int32_t dtype, Axis<CT>* a) {
  a->i0.resize(out), a->i1.resize(out), a->l0.resize(out), a->l1.resize(out);
  if (in == out) {
    for (int64_t j = 0; j < out; ++j) a->i0[j] = a->i1[j] = j, a->l0[j] = 1, a->l1[j] = 0;
    return;
  }
  CT s = axis_scale<CT>(in, out, align, scale);
  for (int64_t j = 0; j < out; ++j) {
    CT dst = static_cast<CT>(j), real;
    if (align) {
      real = dst * s;
    } else {
      real = fma_shift<CT>(s, dst + CT(0.5));
      if (real < CT(0)) real = CT(0);
    }
    int64_t i0 = floor_index(static_cast<double>(real), in);
    CT l1 = real - static_cast<CT>(i0);
    l1 = l1 < CT(0) ? CT(0) : l1 > CT(1) ? CT(1) : l1;
    CT l0;
    if (dtype == kFloat16) {  // the weights are stored in the input's dtype
      float h1 = half_to_float(float_to_half(static_cast<float>(l1)));
      l0 = half_to_float(float_to_half(1.0f - h1));
      l1 = h1;
    } else {
      l0 = CT(1) - l1;
    }
    a->i0[j] = i0, a->i1[j] = i0 + (i0 < in - 1 ? 1 : 0), a->l0[j] = l0, a->l1[j] = l1;
  }
}

template <typename CT>
void linear_run(const View& self, const View& out, bool align, const Scale* scales) {
  int rank = self.rank, spatial = rank - 2;
  int64_t shape[5];
  for (int k = 0; k < rank; ++k) shape[k] = self.sizes[k];
  // the input in opmath, contiguous
  std::vector<CT> cur(static_cast<size_t>(self.numel)), next;
  int64_t cstrides[kMaxRank];
  contiguous_strides(shape, rank, cstrides);
  convert_strided(reinterpret_cast<char*>(cur.data()), sizeof(CT) == 8 ? kFloat64 : kFloat32, cstrides,
                  self.data, self.dtype, self.strides, shape, rank);
  for (int k = spatial - 1; k >= 0; --k) {  // the last axis innermost, as ATen nests
    int axis = 2 + k;
    Axis<CT> a;
    linear_weights<CT>(shape[axis], out.sizes[axis], align, scales[k], self.dtype, &a);
    int64_t outer = 1, inner = 1, in_n = shape[axis], out_n = out.sizes[axis];
    for (int d = 0; d < axis; ++d) outer *= shape[d];
    for (int d = axis + 1; d < rank; ++d) inner *= shape[d];
    next.assign(static_cast<size_t>(outer * out_n * inner), CT(0));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < out_n; ++j) {
        const CT* p0 = cur.data() + (o * in_n + a.i0[j]) * inner;
        const CT* p1 = cur.data() + (o * in_n + a.i1[j]) * inner;
        CT* q = next.data() + (o * out_n + j) * inner;
        CT w0 = a.l0[j], w1 = a.l1[j];
        for (int64_t i = 0; i < inner; ++i) {
          CT x = p0[i] * w0, y = p1[i] * w1;
          q[i] = x + y;
        }
      }
    shape[axis] = out_n;
    cur.swap(next);
  }
  contiguous_strides(shape, rank, cstrides);
  convert_strided(out.data, out.dtype, out.strides, reinterpret_cast<const char*>(cur.data()),
                  sizeof(CT) == 8 ? kFloat64 : kFloat32, cstrides, shape, rank);
}

void linear(opforge_context* ctx, opforge_arg* args, int64_t n, const char* kOp, int spatial_of_key, bool list) {
  OPF_TENSOR(0, "self", self);
  OPF_BOOL(2, "align_corners", align);
  int64_t out_index = list ? 4 : 3 + spatial_of_key;
  OPF_TENSOR(out_index, "out", out);
  if (!check_layout(ctx, kOp, self, out)) return;
  int spatial = out.rank - 2;
  Scale scales[3];
  if (!scales_arg(ctx, args, n, 3, list ? spatial : spatial_of_key, list, kOp, scales)) return;
  if (!is_floating(self.dtype) || self.dtype == kBFloat16) {
    fail(ctx, "%s: input — found dtype %s — valid: float16, float32, float64 (ATen's uint8 path is "
         "fixed-point and not reproduced here) — convert the input to float before interpolating",
         kOp, dtype_name(self.dtype));
    return;
  }
  if (out.numel == 0) return;
  if (!convertible(out.dtype)) {
    fail(ctx, "%s: out — dtype %s", kOp, dtype_name(out.dtype));
    return;
  }
  if (opmath_double(self.dtype)) linear_run<double>(self, out, align, scales);
  else linear_run<float>(self, out, align, scales);
}

void nearest1d(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::upsample_nearest1d.out", 1, false, false); }
void nearest2d(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::upsample_nearest2d.out", 2, false, false); }
void nearest3d(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::upsample_nearest3d.out", 3, false, false); }
void exact1d(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::_upsample_nearest_exact1d.out", 1, true, false); }
void exact2d(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::_upsample_nearest_exact2d.out", 2, true, false); }
void exact3d(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::_upsample_nearest_exact3d.out", 3, true, false); }
void nearest2d_vec(opforge_context* c, opforge_arg* a, int64_t n) { nearest(c, a, n, "aten::upsample_nearest2d.vec_out", 2, false, true); }
void linear1d(opforge_context* c, opforge_arg* a, int64_t n) { linear(c, a, n, "aten::upsample_linear1d.out", 1, false); }
void bilinear2d(opforge_context* c, opforge_arg* a, int64_t n) { linear(c, a, n, "aten::upsample_bilinear2d.out", 2, false); }
void trilinear3d(opforge_context* c, opforge_arg* a, int64_t n) { linear(c, a, n, "aten::upsample_trilinear3d.out", 3, false); }
void bilinear2d_vec(opforge_context* c, opforge_arg* a, int64_t n) { linear(c, a, n, "aten::upsample_bilinear2d.vec_out", 2, true); }

const KernelDef kResampleKernels[] = {
    {"aten::upsample_nearest1d.out", "T IL D? T!", nearest1d},
    {"aten::upsample_nearest2d.out", "T IL D? D? T!", nearest2d},
    {"aten::upsample_nearest3d.out", "T IL D? D? D? T!", nearest3d},
    {"aten::_upsample_nearest_exact1d.out", "T IL D? T!", exact1d},
    {"aten::_upsample_nearest_exact2d.out", "T IL D? D? T!", exact2d},
    {"aten::_upsample_nearest_exact3d.out", "T IL D? D? D? T!", exact3d},
    {"aten::upsample_nearest2d.vec_out", "T IL? DL? T!", nearest2d_vec},
    {"aten::upsample_linear1d.out", "T IL B D? T!", linear1d},
    {"aten::upsample_bilinear2d.out", "T IL B D? D? T!", bilinear2d},
    {"aten::upsample_trilinear3d.out", "T IL B D? D? D? T!", trilinear3d},
    {"aten::upsample_bilinear2d.vec_out", "T IL? B DL? T!", bilinear2d_vec},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(resample, kResampleKernels)
