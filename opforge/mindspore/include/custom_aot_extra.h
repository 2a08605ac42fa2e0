// custom_aot_extra.h: what a MindSpore AOT custom operator includes, for opforge.
//
// Kernels keep MindSpore's plain C signature, unchanged:
//
//   extern "C" int Name(int nparam, void** params, int* ndims, int64_t** shapes,
//                       const char** dtypes, void* stream, void* extra);
//   extern "C" std::vector<int64_t> NameInferShape(int* ndims, int64_t** shapes, AotExtra* extra);
//   extern "C" TypeId NameInferType(std::vector<TypeId> type_ids, AotExtra* extra);
//   extern "C" int NameInit(int* ndims, int64_t** shapes, const char** dtypes, AotExtra* extra);
//
// This header needs no MindSpore: it declares TypeId (MindSpore's numbers for the number
// types), AotKernelData and AotExtra. opforge's AotExtra is a plain struct the runtime
// fills (attributes from the registration info, the workspace sizes an Init function
// sets, the kernel data it keeps); docs/mindspore.md documents its layout.
//
// OPFORGE_MS_OP_PROTO(Name, json) optionally exports the operator's prototype from the
// library (input/output names and dtype/format rows, the JSON of RegInfo); opforge then
// checks every reg_info against it when the op is defined.
#ifndef OPFORGE_MINDSPORE_CUSTOM_AOT_EXTRA_H_
#define OPFORGE_MINDSPORE_CUSTOM_AOT_EXTRA_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#define OPFORGE_MS_EXTRA_VERSION 1
#define OPFORGE_MS_MAX_WORKSPACE 16

enum TypeId : int {
  kTypeUnknown = 0,
  kNumberTypeBool = 30,
  kNumberTypeInt8 = 32,
  kNumberTypeInt16 = 33,
  kNumberTypeInt32 = 34,
  kNumberTypeInt64 = 35,
  kNumberTypeUInt8 = 37,
  kNumberTypeUInt16 = 38,
  kNumberTypeUInt32 = 39,
  kNumberTypeUInt64 = 40,
  kNumberTypeFloat16 = 42,
  kNumberTypeFloat32 = 43,
  kNumberTypeFloat64 = 44,
};

extern "C" {
// One attribute of the registration info. kind: 1 int, 2 float, 3 bool, 4 string.
typedef struct opforge_ms_attr {
  const char* name;
  int32_t kind;
  int32_t reserved;
  int64_t i;
  double d;
  const char* s;
} opforge_ms_attr;

// What `extra` points to: filled by the opforge runtime before each call of an infer,
// Init or kernel function. version is the first field in every version.
typedef struct opforge_ms_extra {
  uint32_t version;
  int32_t num_workspace;
  uint64_t workspace[OPFORGE_MS_MAX_WORKSPACE];
  void* kernel_data;
  int64_t num_attrs;
  const opforge_ms_attr* attrs;
} opforge_ms_extra;
}

class AotKernelData {
 public:
  AotKernelData() = default;
  virtual ~AotKernelData() = default;
};

// A view of opforge_ms_extra (standard layout, no virtual functions: the runtime creates
// it from plain C).
class AotExtra {
 public:
  template <typename T>
  T Attr(const std::string& name) const {
    const opforge_ms_attr* a = Find(name);
    return a == nullptr ? T() : Convert(a, static_cast<T*>(nullptr));
  }
  bool HasAttr(const std::string& name) const { return Find(name) != nullptr; }

  void SetWorkSpace(const std::vector<size_t>& workspace) {
    size_t n = workspace.size() < OPFORGE_MS_MAX_WORKSPACE ? workspace.size() : OPFORGE_MS_MAX_WORKSPACE;
    raw_.num_workspace = static_cast<int32_t>(workspace.size() > OPFORGE_MS_MAX_WORKSPACE ? -1 : n);
    for (size_t i = 0; i < n; ++i) raw_.workspace[i] = workspace[i];
  }
  std::vector<size_t> WorkSpace() const {
    std::vector<size_t> sizes;
    for (int32_t i = 0; i < raw_.num_workspace; ++i) sizes.push_back(raw_.workspace[i]);
    return sizes;
  }
  void SetKernelData(AotKernelData* kernel_data) { raw_.kernel_data = kernel_data; }
  AotKernelData* KernelData() const { return static_cast<AotKernelData*>(raw_.kernel_data); }
  void DestructKernelData() {
    delete KernelData();
    raw_.kernel_data = nullptr;
  }

 private:
  const opforge_ms_attr* Find(const std::string& name) const {
    for (int64_t i = 0; i < raw_.num_attrs; ++i)
      if (name == raw_.attrs[i].name) return &raw_.attrs[i];
    return nullptr;
  }
  static int64_t Convert(const opforge_ms_attr* a, int64_t*) { return a->kind == 2 ? (int64_t)a->d : a->i; }
  static int Convert(const opforge_ms_attr* a, int*) { return (int)Convert(a, (int64_t*)nullptr); }
  static float Convert(const opforge_ms_attr* a, float*) { return a->kind == 2 ? (float)a->d : (float)a->i; }
  static double Convert(const opforge_ms_attr* a, double*) { return a->kind == 2 ? a->d : (double)a->i; }
  static bool Convert(const opforge_ms_attr* a, bool*) { return a->i != 0; }
  static std::string Convert(const opforge_ms_attr* a, std::string*) { return a->s ? a->s : ""; }

  opforge_ms_extra raw_;
};

#define OPFORGE_MS_OP_PROTO(Name, json) \
  extern "C" __attribute__((visibility("default"))) const char* Name##OpProto(void) { return json; }

#endif  // OPFORGE_MINDSPORE_CUSTOM_AOT_EXTRA_H_
