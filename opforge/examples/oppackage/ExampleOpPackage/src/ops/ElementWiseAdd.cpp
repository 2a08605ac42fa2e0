// ExampleOpPackage::ElementWiseAdd: output = self + alpha * other, with NumPy/torch
// broadcasting. Registered for aten.add.Tensor, it replaces the backend's own add.
#include <vector>

#include "ExampleOpPackageOps.h"

namespace ExampleOpPackage {

namespace {
// The element strides of `t` seen with the output's rank: 0 where `t` broadcasts.
std::vector<int64_t> broadcast_strides(const opforge::pkg::Tensor& t, const opforge::pkg::Tensor& out) {
  std::vector<int64_t> strides(static_cast<size_t>(out.dim()), 0);
  int64_t stride = 1;
  for (int32_t d = t.dim() - 1, o = out.dim() - 1; d >= 0; --d, --o) {
    strides[static_cast<size_t>(o)] = t.size(d) == 1 ? 0 : stride;
    stride *= t.size(d);
  }
  return strides;
}
}  // namespace

opforge::pkg::Status ElementWiseAdd(const opforge::pkg::Tensor& self, const opforge::pkg::Tensor& other,
                                    float alpha, opforge::pkg::Tensor& output) {
  if (self.dtype() != OPFORGE_PKG_FLOAT32 || other.dtype() != OPFORGE_PKG_FLOAT32 ||
      output.dtype() != OPFORGE_PKG_FLOAT32)
    return opforge::pkg::error("ElementWiseAdd: float32 tensors only");
  if (self.dim() > output.dim() || other.dim() > output.dim())
    return opforge::pkg::error("ElementWiseAdd: an input has more dimensions than the output");
  const float* a = self.data<float>();
  const float* b = other.data<float>();
  float* out = output.data<float>();
  const int64_t n = output.numel();
  if (self.numel() == n && other.numel() == n) {  // same shape: one flat loop
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + alpha * b[i];
    return opforge::pkg::Status::Ok();
  }
  const std::vector<int64_t> sa = broadcast_strides(self, output), sb = broadcast_strides(other, output);
  const int32_t nd = output.dim();
  std::vector<int64_t> index(static_cast<size_t>(nd), 0);
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = a[ia] + alpha * b[ib];
    for (int32_t d = nd - 1; d >= 0; --d) {  // step the output index, carrying
      const size_t k = static_cast<size_t>(d);
      ia += sa[k];
      ib += sb[k];
      if (++index[k] < output.size(d)) break;
      ia -= sa[k] * index[k];
      ib -= sb[k] * index[k];
      index[k] = 0;
    }
  }
  return opforge::pkg::Status::Ok();
}

}  // namespace ExampleOpPackage
