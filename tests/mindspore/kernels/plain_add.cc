// A kernel as MindSpore's CPU AOT tutorials write them: no header at all, its own integer
// aliases, float32 only, reg_info optional.
#include <string.h>
using size_t = decltype(sizeof(int));
using int64_t = decltype(sizeof(long));

extern "C" int PlainAdd(int nparam, void **params, int *ndims, int64_t **shapes,
                        const char **dtypes, void *stream, void *extra) {
  if (nparam != 3) return 1;
  for (int i = 0; i < nparam; i++)
    if (strcmp(dtypes[i], "float32") != 0) return 2;
  const float *a = static_cast<const float *>(params[0]);
  const float *b = static_cast<const float *>(params[1]);
  float *out = static_cast<float *>(params[2]);
  size_t n = 1;
  for (int i = 0; i < ndims[2]; i++) n *= shapes[2][i];
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  return 0;
}
