// Kernels that write the wrong amount: OverCustom writes 8 elements past its output (a
// kernel sized by something other than out_shape), UnderCustom writes only the first half,
// StrayCustom one element where its input says (before its output, or past its end),
// PrefixCustom as many as its input says, OverWorkspaceCustom one float past its workspace;
// WorkspaceDtypesCustom checks the dtypes it is given, its workspace's too.
#include <stdint.h>

#include <vector>

#include "custom_aot_extra.h"

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

// StrayCustom copies its input, then writes 7 at y[x[0]]: before its output (a negative
// index), inside it, or past its end, wherever the input says.
extern "C" int StrayCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                           const char** dtypes, void* stream, void* extra) {
  int64_t n = Numel(ndims[1], shapes[1]);
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  y[static_cast<int64_t>(x[0])] = 7.0f;
  return 0;
}

// PrefixCustom writes y[i] = x[i] for i < x[0] only: how much it writes depends on its input.
extern "C" int PrefixCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                            const char** dtypes, void* stream, void* extra) {
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < static_cast<int64_t>(x[0]); ++i) y[i] = x[i];
  return 0;
}

// OverWorkspaceCustom(x) -> x, with a workspace of numel(x) floats from its Init, into which
// it writes numel(x) + 1.
extern "C" int OverWorkspaceCustomInit(int* ndims, int64_t** shapes, const char** dtypes,
                                       AotExtra* extra) {
  extra->SetWorkSpace({static_cast<size_t>(Numel(ndims[0], shapes[0])) * sizeof(float)});
  return 0;
}

extern "C" int OverWorkspaceCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                                   const char** dtypes, void* stream, void* extra) {
  int64_t n = Numel(ndims[0], shapes[0]);
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  float* tmp = static_cast<float*>(params[2]);
  for (int64_t i = 0; i <= n; ++i) tmp[i] = 1.0f;
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  return 0;
}

// WorkspaceDtypesCustom(x) -> x, with a workspace of 16 bytes: returns 3 unless it is called
// with 3 parameters whose dtypes are float32, float32 and uint8 (the workspace's).
extern "C" int WorkspaceDtypesCustomInit(int* ndims, int64_t** shapes, const char** dtypes,
                                         AotExtra* extra) {
  extra->SetWorkSpace({16});
  return 0;
}

extern "C" int WorkspaceDtypesCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                                     const char** dtypes, void* stream, void* extra) {
  const char* want[3] = {"float32", "float32", "uint8"};
  if (nparam != 3) return 3;
  for (int i = 0; i < 3; ++i) {
    const char* a = dtypes[i];
    const char* b = want[i];
    while (*a && *a == *b) ++a, ++b;
    if (*a != *b) return 3;
  }
  int64_t n = Numel(ndims[0], shapes[0]);
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  return 0;
}
