// Test kernels of MindSpore's AOT signature: several outputs, Init with a workspace and an
// attribute, a kernel that fails, a kernel with a prototype, a C++ (mangled) name, and an
// Init asking for any workspace size.
#include <stdint.h>
#include <string.h>

#include <vector>

#include "custom_aot_extra.h"

static int64_t Numel(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// MinMaxCustom(x) -> (min over the last axis, max over the last axis), float32.
extern "C" int MinMaxCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                            const char** dtypes, void* stream, void* extra) {
  if (nparam != 3 || strcmp(dtypes[0], "float32") != 0) return 1;
  int64_t last = ndims[0] ? shapes[0][ndims[0] - 1] : 1;
  int64_t rows = Numel(ndims[0], shapes[0]) / (last ? last : 1);
  const float* x = static_cast<const float*>(params[0]);
  float* lo = static_cast<float*>(params[1]);
  float* hi = static_cast<float*>(params[2]);
  for (int64_t r = 0; r < rows; ++r) {
    lo[r] = hi[r] = x[r * last];
    for (int64_t c = 1; c < last; ++c) {
      float v = x[r * last + c];
      if (v < lo[r]) lo[r] = v;
      if (v > hi[r]) hi[r] = v;
    }
  }
  return 0;
}

extern "C" std::vector<std::vector<int64_t>> MinMaxCustomInferShape(int* ndims, int64_t** shapes,
                                                                     AotExtra* extra) {
  std::vector<int64_t> reduced(shapes[0], shapes[0] + (ndims[0] ? ndims[0] - 1 : 0));
  return {reduced, reduced};
}

extern "C" std::vector<TypeId> MinMaxCustomInferType(std::vector<TypeId> type_ids, AotExtra* extra) {
  return {type_ids[0], type_ids[0]};
}

// ScaleCustom(x) -> x * scale, with scale an attribute; its Init asks for a workspace of
// numel floats, which the kernel uses as scratch (and checks it got).
extern "C" int ScaleCustomInit(int* ndims, int64_t** shapes, const char** dtypes, AotExtra* extra) {
  extra->SetWorkSpace({static_cast<size_t>(Numel(ndims[0], shapes[0])) * sizeof(float)});
  return 0;
}

extern "C" int ScaleCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                           const char** dtypes, void* stream, void* extra) {
  if (nparam != 3) return 1;
  AotExtra* e = static_cast<AotExtra*>(extra);
  float scale = e->Attr<float>("scale");
  int64_t n = Numel(ndims[0], shapes[0]);
  if (e->WorkSpace().size() != 1 || e->WorkSpace()[0] != n * sizeof(float)) return 2;
  const float* x = static_cast<const float*>(params[0]);
  float* tmp = static_cast<float*>(params[2]);
  float* y = static_cast<float*>(params[1]);
  for (int64_t i = 0; i < n; ++i) tmp[i] = x[i] * scale;
  memcpy(y, tmp, n * sizeof(float));
  return 0;
}

// FailCustom(x) -> x, but returns 7 when x holds a negative value.
extern "C" int FailCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                          const char** dtypes, void* stream, void* extra) {
  int64_t n = Numel(ndims[0], shapes[0]);
  const float* x = static_cast<const float*>(params[0]);
  for (int64_t i = 0; i < n; ++i)
    if (x[i] < 0) return 7;
  memcpy(params[1], params[0], n * sizeof(float));
  return 0;
}

// ProtoAdd(a, b) -> c: float32 only, and it says so in its prototype.
extern "C" int ProtoAdd(int nparam, void** params, int* ndims, int64_t** shapes,
                        const char** dtypes, void* stream, void* extra) {
  int64_t n = Numel(ndims[2], shapes[2]);
  for (int64_t i = 0; i < n; ++i)
    static_cast<float*>(params[2])[i] =
        static_cast<const float*>(params[0])[i] + static_cast<const float*>(params[1])[i];
  return 0;
}
OPFORGE_MS_OP_PROTO(ProtoAdd,
    "{\"op_name\":\"ProtoAdd\",\"inputs\":[\"a\",\"b\"],\"outputs\":[\"c\"],"
    "\"dtype_format\":[[[\"float32\",\"DefaultFormat\"],[\"float32\",\"DefaultFormat\"],"
    "[\"float32\",\"DefaultFormat\"]]]}")

// Not extern "C": the name is mangled, and func="...:MangledAdd" cannot find it.
int MangledAdd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
               void* stream, void* extra) {
  return 0;
}

// BadInitCustom: its Init refuses every shape (returns 5); the kernel must never run.
extern "C" int BadInitCustomInit(int* ndims, int64_t** shapes, const char** dtypes, AotExtra* extra) {
  return 5;
}

extern "C" int BadInitCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                             const char** dtypes, void* stream, void* extra) {
  return 99;
}

// WorkspaceCustom(x) -> x: its Init asks SetWorkSpace for `bytes` bytes (an attribute), so
// a test can ask for more than the memory limit allows (or than any machine has).
extern "C" int WorkspaceCustomInit(int* ndims, int64_t** shapes, const char** dtypes, AotExtra* extra) {
  extra->SetWorkSpace({static_cast<size_t>(extra->Attr<int64_t>("bytes"))});
  return 0;
}

extern "C" int WorkspaceCustom(int nparam, void** params, int* ndims, int64_t** shapes,
                               const char** dtypes, void* stream, void* extra) {
  memcpy(params[1], params[0], Numel(ndims[0], shapes[0]) * sizeof(float));
  return 0;
}
