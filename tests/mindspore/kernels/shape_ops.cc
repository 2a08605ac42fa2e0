// Test kernels whose outputs differ from every input in shape or dtype, with MindSpore's AOT
// signature and C++ inference: a row sum ([m, n] -> [m]), a matrix product
// ([m, k] x [k, n] -> [m, n]) and a widening cast whose output dtype the C++ type inference
// picks from the input's TypeId (float16 -> float32, uint8 -> int16, int16 -> int32).
#include <stdint.h>
#include <string.h>

#include <vector>

#include "custom_aot_extra.h"

extern "C" int RowSum(int nparam, void** params, int* ndims, int64_t** shapes,
                      const char** dtypes, void* stream, void* extra) {
  if (nparam != 2 || ndims[0] != 2 || strcmp(dtypes[0], "float32") != 0) return 1;
  const int64_t m = shapes[0][0], n = shapes[0][1];
  const float* x = static_cast<const float*>(params[0]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < m; ++i) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += x[i * n + j];
    y[i] = static_cast<float>(s);
  }
  return 0;
}

extern "C" std::vector<int64_t> RowSumInferShape(int* ndims, int64_t** shapes, AotExtra* extra) {
  return {shapes[0][0]};
}

extern "C" int MatMulCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                            const char** dtypes, void* stream, void* extra) {
  if (nparam != 3 || ndims[0] != 2 || ndims[1] != 2 || shapes[0][1] != shapes[1][0]) return 1;
  const int64_t m = shapes[0][0], k = shapes[0][1], n = shapes[1][1];
  const float* x = static_cast<const float*>(params[0]);
  const float* w = static_cast<const float*>(params[1]);
  float* y = static_cast<float*>(params[2]);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(x[i * k + p]) * w[p * n + j];
      y[i * n + j] = static_cast<float>(s);
    }
  return 0;
}

extern "C" std::vector<int64_t> MatMulCustomInferShape(int* ndims, int64_t** shapes, AotExtra* extra) {
  return {shapes[0][0], shapes[1][1]};
}

// WidenCustom(x) -> x in a wider dtype: the C++ type inference decides which, from the
// TypeId numbers opforge passes (a wrong number gives kTypeUnknown and the op is refused).
extern "C" int WidenCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                           const char** dtypes, void* stream, void* extra) {
  if (nparam != 2) return 1;
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  if (strcmp(dtypes[0], "float16") == 0 && strcmp(dtypes[1], "float32") == 0) {
    const uint16_t* x = static_cast<const uint16_t*>(params[0]);
    float* y = static_cast<float*>(params[1]);
    for (int64_t i = 0; i < n; ++i) {  // IEEE half -> single, normal numbers and zero
      uint32_t h = x[i], sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
      uint32_t bits = exp == 0 ? sign : sign | ((exp + 112) << 23) | (man << 13);
      memcpy(&y[i], &bits, 4);
    }
    return 0;
  }
  if (strcmp(dtypes[0], "uint8") == 0 && strcmp(dtypes[1], "int16") == 0) {
    for (int64_t i = 0; i < n; ++i)
      static_cast<int16_t*>(params[1])[i] = static_cast<const uint8_t*>(params[0])[i];
    return 0;
  }
  if (strcmp(dtypes[0], "int16") == 0 && strcmp(dtypes[1], "int32") == 0) {
    for (int64_t i = 0; i < n; ++i)
      static_cast<int32_t*>(params[1])[i] = static_cast<const int16_t*>(params[0])[i];
    return 0;
  }
  return 2;
}

extern "C" TypeId WidenCustomInferType(std::vector<TypeId> type_ids, AotExtra* extra) {
  switch (type_ids[0]) {
    case kNumberTypeFloat16: return kNumberTypeFloat32;
    case kNumberTypeUInt8: return kNumberTypeInt16;
    case kNumberTypeInt16: return kNumberTypeInt32;
    default: return kTypeUnknown;
  }
}
