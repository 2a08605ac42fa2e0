/* C++ helpers for op-package authors over the C ABI in oppackage.h: Tensor views, Status,
 * parameter reading. The generated glue (<Package>Interface.cpp) uses them; an op's body
 * (src/ops/<Op>.cpp) sees only Tensor, TensorList, Status and plain C++ types. */
#ifndef OPFORGE_OPPACKAGE_HPP_
#define OPFORGE_OPPACKAGE_HPP_

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "opforge/oppackage.h"

#if defined(__x86_64__) || defined(_M_X64)
#define OPFORGE_PKG_PLATFORM "x86_64"
#elif defined(__aarch64__) && defined(__ANDROID__)
#define OPFORGE_PKG_PLATFORM "aarch64_android"
#elif defined(__aarch64__)
#define OPFORGE_PKG_PLATFORM "aarch64"
#else
#define OPFORGE_PKG_PLATFORM "unknown"
#endif
#ifndef OPFORGE_PKG_TARGET
#define OPFORGE_PKG_TARGET "cpu"
#endif

namespace opforge {
namespace pkg {

/* A view of one tensor (the data belongs to the backend). */
class Tensor {
 public:
  explicit Tensor(const opforge_pkg_tensor* t) : t_(t) {}
  int32_t dtype() const { return t_->dtype; }
  int32_t dim() const { return t_->ndim; }
  int64_t size(int32_t i) const { return t_->sizes[i < 0 ? i + t_->ndim : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t i = 0; i < t_->ndim; ++i) n *= t_->sizes[i];
    return n;
  }
  template <class T> T* data() const { return static_cast<T*>(t_->data); }
  const opforge_pkg_tensor* raw() const { return t_; }

 private:
  const opforge_pkg_tensor* t_;
};

using TensorList = std::vector<Tensor>;

/* What an op returns: ok, or a message. */
struct Status {
  std::string message;
  bool ok() const { return message.empty(); }
  static Status Ok() { return Status{}; }
};

inline Status error(std::string message) { return Status{message.empty() ? "error" : message}; }

inline Status not_implemented(const char* package, const char* op) {
  return error(std::string(package) + "::" + op +
               ": not implemented yet — write its body in src/ops/" + op +
               ".cpp, then rebuild with `opforge oppackage build`");
}

inline int32_t report(const Status& s, char* buf, int32_t size) {
  if (s.ok()) return 0;
  if (buf != nullptr && size > 0) std::snprintf(buf, static_cast<size_t>(size), "%s", s.message.c_str());
  return 1;
}

/* The parameters create() was given, read by name into typed values. */
class Params {
 public:
  Params(const opforge_pkg_param* p, int32_t n, const char* op) : p_(p), n_(n), op_(op) {}

  const opforge_pkg_param* find(const char* name) const {
    for (int32_t i = 0; i < n_; ++i)
      if (p_[i].name != nullptr && std::strcmp(p_[i].name, name) == 0) return &p_[i];
    return nullptr;
  }

  /* A scalar; absent: keeps `out` (its default) unless the parameter is mandatory. */
  template <class T> Status scalar(const char* name, T& out, bool mandatory) const {
    const opforge_pkg_param* p = find(name);
    if (p == nullptr) return mandatory ? missing(name) : Status::Ok();
    if (p->is_list || p->count != 1) return wrong(name, "a scalar", "a list");
    return value(*p, 0, name, out);
  }
  template <class T> Status scalar(const char* name, std::optional<T>& out, bool) const {
    const opforge_pkg_param* p = find(name);
    if (p == nullptr) return Status::Ok();
    T v{};
    Status s = scalar(name, v, true);
    if (s.ok()) out = v;
    return s;
  }
  /* A 1-D list (a scalar is read as a list of one). */
  template <class T> Status list(const char* name, std::vector<T>& out, bool mandatory) const {
    const opforge_pkg_param* p = find(name);
    if (p == nullptr) return mandatory ? missing(name) : Status::Ok();
    if (p->count < 0 || p->count > (int64_t(1) << 31)) return wrong(name, "a list", "a bad count");
    std::vector<T> values(static_cast<size_t>(p->count));
    for (int64_t i = 0; i < p->count; ++i) {
      Status s = value(*p, i, name, values[static_cast<size_t>(i)]);
      if (!s.ok()) return s;
    }
    out.swap(values);
    return Status::Ok();
  }
  /* Every parameter given must be one the OpDef declares. */
  Status only(const std::vector<const char*>& known) const {
    for (int32_t i = 0; i < n_; ++i) {
      bool found = false;
      for (const char* k : known) found = found || (p_[i].name && std::strcmp(p_[i].name, k) == 0);
      if (!found)
        return error(std::string(op_) + ": unknown parameter '" + (p_[i].name ? p_[i].name : "") +
                     "' — the OpDef declares no such <Parameter>");
    }
    return Status::Ok();
  }

 private:
  template <class T> Status value(const opforge_pkg_param& p, int64_t i, const char* name, T& out) const {
    if (p.kind == OPFORGE_PKG_PARAM_FLOAT) {
      if (!std::is_floating_point<T>::value) return wrong(name, "an integer", "a float");
      if (p.floats == nullptr) return wrong(name, "values", "none");
      out = static_cast<T>(p.floats[i]);
    } else if (p.kind == OPFORGE_PKG_PARAM_INT || p.kind == OPFORGE_PKG_PARAM_BOOL) {
      if (p.ints == nullptr) return wrong(name, "values", "none");
      out = static_cast<T>(p.ints[i]);
    } else {
      return wrong(name, "int, float or bool", "an unknown kind");
    }
    return Status::Ok();
  }
  Status missing(const char* name) const {
    return error(std::string(op_) + ": mandatory parameter '" + name + "' not given");
  }
  Status wrong(const char* name, const char* want, const char* got) const {
    return error(std::string(op_) + ": parameter '" + name + "' — " + got + " — valid: " + want);
  }
  const opforge_pkg_param* p_;
  int32_t n_;
  const char* op_;
};

/* The inputs of one execution sorted into the OpDef's input slots. */
class Slots {
 public:
  Slots(const std::vector<int32_t>& slots, const opforge_pkg_tensor* inputs, int32_t n, int32_t n_slots)
      : by_slot_(static_cast<size_t>(n_slots)) {
    for (int32_t i = 0; i < n && static_cast<size_t>(i) < slots.size(); ++i)
      by_slot_[static_cast<size_t>(slots[static_cast<size_t>(i)])].emplace_back(&inputs[i]);
  }
  const Tensor& one(int32_t slot) const { return by_slot_[static_cast<size_t>(slot)].front(); }
  const Tensor* optional(int32_t slot) const {
    const auto& s = by_slot_[static_cast<size_t>(slot)];
    return s.empty() ? nullptr : &s.front();
  }
  const TensorList& list(int32_t slot) const { return by_slot_[static_cast<size_t>(slot)]; }

 private:
  std::vector<TensorList> by_slot_;
};

/* Checks create() runs on the input slots: known slots, mandatory present, a
 * non-repeated slot at most once. */
inline Status check_slots(const char* op, const int32_t* slots, int32_t n, int32_t n_slots,
                          const std::vector<bool>& mandatory, const std::vector<bool>& repeated,
                          std::vector<int32_t>& out) {
  std::vector<int32_t> count(static_cast<size_t>(n_slots), 0);
  out.clear();
  for (int32_t i = 0; i < n; ++i) {
    int32_t s = slots == nullptr ? i : slots[i];
    if (s < 0 || s >= n_slots)
      return error(std::string(op) + ": input " + std::to_string(i) + " fills slot " +
                   std::to_string(s) + " — valid: 0.." + std::to_string(n_slots - 1));
    if (++count[static_cast<size_t>(s)] > 1 && !repeated[static_cast<size_t>(s)])
      return error(std::string(op) + ": input slot " + std::to_string(s) + " given twice (not Repeated)");
    out.push_back(s);
  }
  for (int32_t s = 0; s < n_slots; ++s)
    if (mandatory[static_cast<size_t>(s)] && count[static_cast<size_t>(s)] == 0)
      return error(std::string(op) + ": mandatory input " + std::to_string(s) + " not given");
  return Status::Ok();
}

}  // namespace pkg
}  // namespace opforge

#endif  // OPFORGE_OPPACKAGE_HPP_
