// AttrsKernel(x) -> y: reads every kind of attribute through `extra`, and a workspace its
// Init asks for. y = (x * scale + bias + sum(weights) + sum(grid)) * (flip ? -1 : 1), and
// 1000 is added when mode is "a string longer than fifteen characters".
// Compiles against opforge's custom_aot_extra.h or the MindSpore-layout one beside it.
#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "custom_aot_extra.h"

extern "C" int AttrsKernelInit(int* ndims, int64_t** shapes, const char** dtypes, AotExtra* extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; ++d) n *= shapes[0][d];
  extra->SetWorkSpace({static_cast<size_t>(n) * sizeof(float), 8});
  return 0;
}

extern "C" int AttrsKernel(int nparam, void** params, int* ndims, int64_t** shapes,
                           const char** dtypes, void* stream, void* extra) {
  if (nparam != 4) return 1;  // x, y, two workspaces
  AotExtra* e = static_cast<AotExtra*>(extra);
  float scale = e->Attr<float>("scale");
  int64_t bias = e->Attr<int64_t>("bias");
  bool flip = e->Attr<bool>("flip");
  std::string mode = e->Attr<std::string>("mode");
  std::vector<float> weights = e->Attr<std::vector<float>>("weights");
  std::vector<std::vector<int64_t>> grid = e->Attr<std::vector<std::vector<int64_t>>>("grid");
  float add = static_cast<float>(bias);
  for (float w : weights) add += w;
  for (const auto& row : grid)
    for (int64_t v : row) add += static_cast<float>(v);
  if (mode == "a string longer than fifteen characters") add += 1000.0f;
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; ++d) n *= shapes[0][d];
  const float* x = static_cast<const float*>(params[0]);
  float* tmp = static_cast<float*>(params[2]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) tmp[i] = (x[i] * scale + add) * (flip ? -1.0f : 1.0f);
  memcpy(y, tmp, n * sizeof(float));
  return 0;
}
