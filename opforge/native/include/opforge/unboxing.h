// Helpers for the generated glue (opforge_register.cpp): checking boxed arguments
// against a kernel's parameter kinds and turning them into typed values. Kernel authors
// do not need this header.
#ifndef OPFORGE_UNBOXING_H
#define OPFORGE_UNBOXING_H

#include <vector>

#include "opforge/kernel.h"

namespace opforge {
namespace detail {

inline const char* tag_name(int32_t tag) {
  switch (tag) {
    case OPFORGE_ARG_NONE: return "None";
    case OPFORGE_ARG_TENSOR: return "Tensor";
    case OPFORGE_ARG_TENSOR_LIST: return "Tensor[]";
    case OPFORGE_ARG_OPT_TENSOR_LIST: return "Tensor?[]";
    case OPFORGE_ARG_INT: return "int";
    case OPFORGE_ARG_DOUBLE: return "float";
    case OPFORGE_ARG_BOOL: return "bool";
    case OPFORGE_KIND_SCALAR: return "Scalar";
    case OPFORGE_ARG_SCALAR_TYPE: return "ScalarType";
    case OPFORGE_ARG_INT_LIST: return "int[]";
    case OPFORGE_ARG_DOUBLE_LIST: return "float[]";
    case OPFORGE_ARG_BOOL_LIST: return "bool[]";
    case OPFORGE_ARG_STRING: return "str";
    default: return "unknown";
  }
}

inline bool tag_fits(int32_t kind, int32_t tag) {
  const int32_t base = kind & 0xff;
  if (tag == OPFORGE_ARG_NONE) return (kind & OPFORGE_KIND_OPTIONAL) != 0;
  if (base == OPFORGE_KIND_SCALAR)
    return tag == OPFORGE_ARG_INT || tag == OPFORGE_ARG_DOUBLE || tag == OPFORGE_ARG_BOOL;
  return tag == base;
}

// True when `n` arguments of the right kinds were passed; else fails the context.
inline bool check_args(KernelContext& ctx, const char* op, const opforge_arg* args, int64_t n,
                       const int32_t* kinds, const char* const* names, int64_t expected) {
  if (n != expected) {
    ctx.fail("%s: expected %lld arguments, got %lld", op, static_cast<long long>(expected),
             static_cast<long long>(n));
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!tag_fits(kinds[i], args[i].tag)) {
      ctx.fail("%s: argument %lld '%s' expects %s%s, got %s", op, static_cast<long long>(i),
               names[i], tag_name(kinds[i] & 0xff),
               (kinds[i] & OPFORGE_KIND_OPTIONAL) ? "?" : "", tag_name(args[i].tag));
      return false;
    }
  }
  return true;
}

// An op without a fake function is elementwise-shaped: each out has the sizes and dtype
// of its first tensor input (the default fake). The glue checks it before the author's
// function runs, so a program cannot hand a kernel an out smaller than its input.
inline bool check_shaped_like(KernelContext& ctx, const char* op, const Tensor& input,
                              const char* input_name, const Tensor& out, const char* out_name) {
  if (out.scalar_type() != input.scalar_type()) {
    ctx.fail("%s: '%s' has dtype %s, '%s' has %s (an op without a fake function writes "
             "outputs of its first input's dtype)", op, out_name, to_string(out.scalar_type()),
             input_name, to_string(input.scalar_type()));
    return false;
  }
  if (!same_sizes(input, out)) {
    ctx.fail("%s: '%s' has %lld elements in %lld dims, '%s' %lld in %lld dims (an op without "
             "a fake function writes outputs of its first input's shape)", op, out_name,
             static_cast<long long>(out.numel()), static_cast<long long>(out.dim()), input_name,
             static_cast<long long>(input.numel()), static_cast<long long>(input.dim()));
    return false;
  }
  return true;
}

inline Scalar to_scalar(const opforge_arg& a) {
  if (a.tag == OPFORGE_ARG_DOUBLE) return Scalar(a.v.d);
  if (a.tag == OPFORGE_ARG_BOOL) return Scalar(a.v.i != 0);
  return Scalar(a.v.i);
}

template <class T>
inline ArrayRef<T> to_list(const opforge_arg& a) {
  return ArrayRef<T>(static_cast<const T*>(a.v.list.data), static_cast<size_t>(a.v.list.size));
}

inline TensorList to_tensor_list(const opforge_arg& a) {
  return TensorList(static_cast<const Tensor*>(a.v.list.data), static_cast<size_t>(a.v.list.size));
}

// Tensor?[] is the one argument that needs storage of its own (optional<Tensor> has no
// opforge_tensor layout); it is rare (index.Tensor_out) and filled per call.
inline std::vector<optional<Tensor>> to_optional_tensor_list(const opforge_arg& a) {
  std::vector<optional<Tensor>> out;
  const auto* items = static_cast<const opforge_tensor*>(a.v.list.data);
  out.reserve(static_cast<size_t>(a.v.list.size));
  for (int64_t i = 0; i < a.v.list.size; ++i) {
    if (items[i].dtype < 0) out.emplace_back(nullopt);
    else out.emplace_back(Tensor(items[i]));
  }
  return out;
}

template <class T>
inline optional<T> none_or(const opforge_arg& a, T value) {
  return a.tag == OPFORGE_ARG_NONE ? optional<T>() : optional<T>(value);
}

}  // namespace detail
}  // namespace opforge

#endif  // OPFORGE_UNBOXING_H
