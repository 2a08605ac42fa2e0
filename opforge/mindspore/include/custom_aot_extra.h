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
// This header needs no MindSpore. It declares TypeId (MindSpore's numbers), AotKernelData
// and AotExtra. AotExtra has the object layout of MindSpore's own AotExtra (a vtable
// pointer, then the workspace sizes as a std::vector<size_t>, then the kernel data
// pointer) and the same virtual functions in the same order, so one `extra` object serves
// a library built against this header or against MindSpore's; docs/mindspore.md gives the
// layout. The opforge runtime builds that object; kernels only call it.
//
// Unlike MindSpore's header, Attr<T> for a type it cannot read does not compile (MindSpore
// returns T() for, e.g., Attr<int>); int and double are read as int64_t and float.
//
// OPFORGE_MS_OP_PROTO(Name, json) optionally exports the operator's prototype from the
// library (input/output names and dtype/format rows, the JSON of RegInfo); opforge then
// checks every reg_info against it when the op is defined.
#ifndef OPFORGE_MINDSPORE_CUSTOM_AOT_EXTRA_H_
#define OPFORGE_MINDSPORE_CUSTOM_AOT_EXTRA_H_

#include <stddef.h>
#include <stdint.h>

#include <string>
#include <type_traits>
#include <vector>

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
  kNumberTypeBFloat16 = 45,
  kNumberTypeComplex64 = 51,
  kNumberTypeComplex128 = 52,
};

// Which std::string ABI this library was compiled with (the runtime returns string
// attributes in it). Weak: every translation unit may define it.
extern "C" __attribute__((weak, visibility("default"))) const int opforge_ms_string_abi =
    _GLIBCXX_USE_CXX11_ABI;

class AotKernelData {
 public:
  AotKernelData() = default;
  virtual ~AotKernelData() = default;
};

template <typename T>
struct OpforgeMsUnsupportedAttr : std::false_type {};

class AotExtra {
 public:
  AotExtra() = default;
  virtual ~AotExtra() = default;
  virtual bool HasAttr(std::string name) = 0;

  // An attribute of the registration info (or add_prim_attr), read by its declared type.
  // A missing attribute makes the call fail: opforge raises a KernelError naming it.
  template <typename T>
  T Attr(std::string name) {
    static_assert(OpforgeMsUnsupportedAttr<T>::value,
                  "Attr<T>: T must be bool, int, int64_t, float, double, std::string, "
                  "std::vector<int64_t>, std::vector<float> or a vector of those vectors");
    (void)name;
    return T();
  }

  void SetWorkSpace(const std::vector<size_t>& workspace) { workspace_ = workspace; }
  const std::vector<size_t>& WorkSpace() const { return workspace_; }

  void SetKernelData(AotKernelData* kernel_data) { kernel_data_ = kernel_data; }
  AotKernelData* KernelData() const { return kernel_data_; }

  void DestructKernelData() {
    delete kernel_data_;
    kernel_data_ = nullptr;
  }

 private:
  virtual bool GetAttrBool(std::string name) = 0;
  virtual int64_t GetAttrInt(std::string name) = 0;
  virtual float GetAttrFloat(std::string name) = 0;
  virtual std::string GetAttrStr(std::string name) = 0;
  virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;
  virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;
  virtual std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) = 0;
  virtual std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) = 0;

  std::vector<size_t> workspace_;
  AotKernelData* kernel_data_{nullptr};
};

template <>
inline bool AotExtra::Attr<bool>(std::string name) { return GetAttrBool(name); }
template <>
inline int64_t AotExtra::Attr<int64_t>(std::string name) { return GetAttrInt(name); }
template <>
inline int AotExtra::Attr<int>(std::string name) { return static_cast<int>(GetAttrInt(name)); }
template <>
inline float AotExtra::Attr<float>(std::string name) { return GetAttrFloat(name); }
template <>
inline double AotExtra::Attr<double>(std::string name) { return GetAttrFloat(name); }
template <>
inline std::string AotExtra::Attr<std::string>(std::string name) { return GetAttrStr(name); }
template <>
inline std::vector<int64_t> AotExtra::Attr<std::vector<int64_t>>(std::string name) {
  return GetAttrIntVec(name);
}
template <>
inline std::vector<float> AotExtra::Attr<std::vector<float>>(std::string name) {
  return GetAttrFloatVec(name);
}
template <>
inline std::vector<std::vector<int64_t>> AotExtra::Attr<std::vector<std::vector<int64_t>>>(
    std::string name) {
  return GetAttrInt2DVec(name);
}
template <>
inline std::vector<std::vector<float>> AotExtra::Attr<std::vector<std::vector<float>>>(
    std::string name) {
  return GetAttrFloat2DVec(name);
}

// The header in MindSpore's wheel declares these in namespace mindspore: a kernel written
// against it (mindspore::AotExtra, mindspore::kNumberTypeFloat32) compiles with this one.
namespace mindspore {
using ::AotExtra;
using ::AotKernelData;
using ::TypeId;
using ::kTypeUnknown;
using ::kNumberTypeBool;
using ::kNumberTypeInt8;
using ::kNumberTypeInt16;
using ::kNumberTypeInt32;
using ::kNumberTypeInt64;
using ::kNumberTypeUInt8;
using ::kNumberTypeUInt16;
using ::kNumberTypeUInt32;
using ::kNumberTypeUInt64;
using ::kNumberTypeFloat16;
using ::kNumberTypeFloat32;
using ::kNumberTypeFloat64;
using ::kNumberTypeBFloat16;
using ::kNumberTypeComplex64;
using ::kNumberTypeComplex128;
}  // namespace mindspore

#define OPFORGE_MS_OP_PROTO(Name, json) \
  extern "C" __attribute__((visibility("default"))) const char* Name##OpProto(void) { return json; }

#endif  // OPFORGE_MINDSPORE_CUSTOM_AOT_EXTRA_H_
