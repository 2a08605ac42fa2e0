// ExampleOpPackage::ExampleCustomOp: multiplies every element of the input by 3
// (the bundled torch op my_ops::mul3, as Qualcomm's ExampleCustomOp does).
#include "ExampleOpPackageOps.h"

namespace ExampleOpPackage {

opforge::pkg::Status ExampleCustomOp(const opforge::pkg::Tensor& input, opforge::pkg::Tensor& output) {
  if (input.dtype() != OPFORGE_PKG_FLOAT32 || output.dtype() != OPFORGE_PKG_FLOAT32)
    return opforge::pkg::error("ExampleCustomOp: float32 tensors only");
  if (input.numel() != output.numel())
    return opforge::pkg::error("ExampleCustomOp: input and output sizes differ");
  const float* in = input.data<float>();
  float* out = output.data<float>();
  for (int64_t i = 0, n = input.numel(); i < n; ++i) out[i] = in[i] * 3.0f;
  return opforge::pkg::Status::Ok();
}

}  // namespace ExampleOpPackage
