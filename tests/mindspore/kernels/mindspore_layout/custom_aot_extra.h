// A stand-in for MindSpore's own custom_aot_extra.h, written for opforge's tests: the same
// object layout and virtual functions in the same order as the header MindSpore ships
// (a polymorphic AotExtra: vtable pointer, std::vector<size_t> workspace, kernel data
// pointer), with no namespace, as MindSpore projects keep it beside their kernels. It
// deliberately differs from opforge's header in everything else.
#ifndef TEST_MINDSPORE_LAYOUT_AOT_EXTRA_H
#define TEST_MINDSPORE_LAYOUT_AOT_EXTRA_H
#include <string>
#include <vector>

class AotKernelData {
 public:
  virtual ~AotKernelData() {}
};

class AotExtra {
 public:
  virtual ~AotExtra() {}
  virtual bool HasAttr(std::string name) = 0;
  template <typename T>
  T Attr(std::string name) { return T(); }
  void SetWorkSpace(const std::vector<size_t> &sizes) { workspace_ = sizes; }
  const std::vector<size_t> &WorkSpace() const { return workspace_; }
  void SetKernelData(AotKernelData *data) { kernel_data_ = data; }
  AotKernelData *KernelData() const { return kernel_data_; }

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
  AotKernelData *kernel_data_{nullptr};
};

template <> inline bool AotExtra::Attr(std::string n) { return GetAttrBool(n); }
template <> inline int64_t AotExtra::Attr(std::string n) { return GetAttrInt(n); }
template <> inline float AotExtra::Attr(std::string n) { return GetAttrFloat(n); }
template <> inline std::string AotExtra::Attr(std::string n) { return GetAttrStr(n); }
template <> inline std::vector<int64_t> AotExtra::Attr(std::string n) { return GetAttrIntVec(n); }
template <> inline std::vector<float> AotExtra::Attr(std::string n) { return GetAttrFloatVec(n); }
template <> inline std::vector<std::vector<int64_t>> AotExtra::Attr(std::string n) {
  return GetAttrInt2DVec(n);
}
template <> inline std::vector<std::vector<float>> AotExtra::Attr(std::string n) {
  return GetAttrFloat2DVec(n);
}
#endif
