// Kernels that write the wrong amount: OverCustom writes 8 elements past its output (a
// kernel sized by something other than out_shape), UnderCustom writes only the first half.
#include <stdint.h>

static int64_t Numel(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

extern "C" int OverCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                          const char** dtypes, void* stream, void* extra) {
  int64_t n = Numel(ndims[1], shapes[1]) + 8;
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f;
  return 0;
}

extern "C" int UnderCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                           const char** dtypes, void* stream, void* extra) {
  int64_t n = Numel(ndims[1], shapes[1]) / 2;
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  return 0;
}
