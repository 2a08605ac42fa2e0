// AddCustom: z = x + y, a MindSpore AOT custom operator (two inputs, one output).
//
// The kernel keeps MindSpore's C signature; the C++ inference beside it is used when
// Custom(...) is given out_shape=None / out_dtype=None. It is written against opforge's
// custom_aot_extra.h (unqualified AotExtra and TypeId, as MindSpore's own examples keep a
// copy of the header beside the kernel); the header in MindSpore's wheel declares them in
// namespace mindspore, so with that one write mindspore::AotExtra (opforge's header
// accepts both). Built as MindSpore builds it:
//   g++ -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=0
//       -I<opforge/mindspore/include> -o libadd_custom.so add_custom.cc
#include <stdint.h>
#include <string.h>

#include <vector>

#include "custom_aot_extra.h"

template <typename T>
static void Add(const void* x, const void* y, void* z, int64_t n) {
  const T* a = static_cast<const T*>(x);
  const T* b = static_cast<const T*>(y);
  T* out = static_cast<T*>(z);
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

extern "C" int AddCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                         const char** dtypes, void* stream, void* extra) {
  if (nparam != 3) return 1;
  for (int p = 0; p < 2; ++p) {  // x and y have z's shape: no broadcasting
    if (ndims[p] != ndims[2]) return 2;
    for (int d = 0; d < ndims[2]; ++d)
      if (shapes[p][d] != shapes[2][d]) return 2;
    if (strcmp(dtypes[p], dtypes[2]) != 0) return 3;
  }
  int64_t n = 1;
  for (int d = 0; d < ndims[2]; ++d) n *= shapes[2][d];
  if (strcmp(dtypes[2], "float32") == 0) {
    Add<float>(params[0], params[1], params[2], n);
  } else if (strcmp(dtypes[2], "float64") == 0) {
    Add<double>(params[0], params[1], params[2], n);
  } else if (strcmp(dtypes[2], "int32") == 0) {
    Add<int32_t>(params[0], params[1], params[2], n);
  } else if (strcmp(dtypes[2], "int64") == 0) {
    Add<int64_t>(params[0], params[1], params[2], n);
  } else {
    return 3;
  }
  return 0;
}

extern "C" std::vector<int64_t> AddCustomInferShape(int* ndims, int64_t** shapes, AotExtra* extra) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}

extern "C" TypeId AddCustomInferType(std::vector<TypeId> type_ids, AotExtra* extra) {
  return type_ids[0];
}
