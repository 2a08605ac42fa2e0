// opforge's ExecuTorch compatibility headers: dtype traits and the ET_SWITCH_* dtype
// switches.
//
// ET_SWITCH_<SET>_TYPES(dtype, ctx, name, CTYPE, [&]() { ... }) calls the lambda with CTYPE
// bound to the C++ type of `dtype`, as in ExecuTorch; a dtype outside the set fails the
// context with Error::InvalidArgument and "<name>: unsupported dtype <dtype>" (the text
// `opforge check` recognises to leave that dtype out). The sets are ExecuTorch's, as far
// as opforge's dtypes go: no quantized, complex or bit types (their switches are absent).
#pragma once

#include <cstdint>
#include <type_traits>

#include "executorch/runtime/core/exec_aten/exec_aten.h"

namespace executorch {
namespace runtime {

using ::executorch::aten::ScalarType;

template <ScalarType N>
struct ScalarTypeToCppType;
template <class T>
struct CppTypeToScalarType;

#define OPFORGE_ET_DTYPE(ctype, name)                                      \
  template <>                                                              \
  struct ScalarTypeToCppType<ScalarType::name> { using type = ctype; };    \
  template <>                                                              \
  struct CppTypeToScalarType<ctype> {                                      \
    static constexpr ScalarType value = ScalarType::name;                  \
  };
OPFORGE_ET_DTYPE(uint8_t, Byte)
OPFORGE_ET_DTYPE(int8_t, Char)
OPFORGE_ET_DTYPE(int16_t, Short)
OPFORGE_ET_DTYPE(int32_t, Int)
OPFORGE_ET_DTYPE(int64_t, Long)
OPFORGE_ET_DTYPE(::executorch::aten::Half, Half)
OPFORGE_ET_DTYPE(float, Float)
OPFORGE_ET_DTYPE(double, Double)
OPFORGE_ET_DTYPE(bool, Bool)
OPFORGE_ET_DTYPE(::executorch::aten::BFloat16, BFloat16)
OPFORGE_ET_DTYPE(uint16_t, UInt16)
OPFORGE_ET_DTYPE(uint32_t, UInt32)
OPFORGE_ET_DTYPE(uint64_t, UInt64)
#undef OPFORGE_ET_DTYPE

inline const char* toString(ScalarType t) { return ::opforge::to_string(t); }
inline size_t elementSize(ScalarType t) { return ::opforge::element_size(t); }

inline bool isFloatingType(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half ||
         t == ScalarType::BFloat16;
}
inline bool isIntegralType(ScalarType t, bool include_bool) {
  return t == ScalarType::Byte || t == ScalarType::Char || t == ScalarType::Short ||
         t == ScalarType::Int || t == ScalarType::Long || t == ScalarType::UInt16 ||
         t == ScalarType::UInt32 || t == ScalarType::UInt64 ||
         (include_bool && t == ScalarType::Bool);
}
inline bool isComplexType(ScalarType t) {
  return t == ScalarType::ComplexHalf || t == ScalarType::ComplexFloat ||
         t == ScalarType::ComplexDouble;
}
inline bool isRealType(ScalarType t) { return isIntegralType(t, false) || t == ScalarType::Float || t == ScalarType::Double; }
inline bool isRealHType(ScalarType t) { return isRealType(t) || t == ScalarType::Half; }
inline bool isRealHBF16Type(ScalarType t) { return isRealHType(t) || t == ScalarType::BFloat16; }
inline bool isRealHBBF16Type(ScalarType t) { return isRealHBF16Type(t) || t == ScalarType::Bool; }

namespace internal {
// Fails `ctx` for a dtype a switch does not handle (ET_INTERNAL_SWITCH's default case).
template <class Context>
inline void unhandled_dtype(Context& ctx, const char* name, ScalarType t) {
  ctx.fail("%s: unsupported dtype %s (not in this ET_SWITCH's set)", name, toString(t));
  ctx.fail(::executorch::runtime::Error::InvalidArgument);
}
}  // namespace internal

}  // namespace runtime
}  // namespace executorch

namespace torch {
namespace executor {
using ::executorch::runtime::CppTypeToScalarType;
using ::executorch::runtime::elementSize;
using ::executorch::runtime::isComplexType;
using ::executorch::runtime::isFloatingType;
using ::executorch::runtime::isIntegralType;
using ::executorch::runtime::ScalarTypeToCppType;
using ::executorch::runtime::toString;
}  // namespace executor
}  // namespace torch

#define ET_INTERNAL_SWITCH_CASE(enum_type, CTYPE_ALIAS, ...)                             \
  case enum_type: {                                                                      \
    using CTYPE_ALIAS [[maybe_unused]] =                                                 \
        ::executorch::runtime::ScalarTypeToCppType<enum_type>::type;                     \
    return __VA_ARGS__();                                                                \
  }

#define ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME, ...)                                     \
  [&] {                                                                                  \
    const ::executorch::aten::ScalarType et_switch_type = TYPE;                          \
    switch (et_switch_type) {                                                            \
      __VA_ARGS__                                                                        \
      default:                                                                           \
        ::executorch::runtime::internal::unhandled_dtype(CONTEXT, NAME, et_switch_type); \
    }                                                                                    \
  }()

#define OPFORGE_ET_CASE(name, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH_CASE(::executorch::aten::ScalarType::name, CTYPE_ALIAS, __VA_ARGS__)

#define ET_INTERNAL_SWITCH_CASE_INT_TYPES(CTYPE_ALIAS, ...)                         \
  OPFORGE_ET_CASE(Byte, CTYPE_ALIAS, __VA_ARGS__)                                   \
  OPFORGE_ET_CASE(Char, CTYPE_ALIAS, __VA_ARGS__)                                   \
  OPFORGE_ET_CASE(Short, CTYPE_ALIAS, __VA_ARGS__)                                  \
  OPFORGE_ET_CASE(Int, CTYPE_ALIAS, __VA_ARGS__)                                    \
  OPFORGE_ET_CASE(Long, CTYPE_ALIAS, __VA_ARGS__)
#define ET_INTERNAL_SWITCH_CASE_UINT_TYPES(CTYPE_ALIAS, ...) \
  OPFORGE_ET_CASE(UInt16, CTYPE_ALIAS, __VA_ARGS__)          \
  OPFORGE_ET_CASE(UInt32, CTYPE_ALIAS, __VA_ARGS__)          \
  OPFORGE_ET_CASE(UInt64, CTYPE_ALIAS, __VA_ARGS__)
#define ET_INTERNAL_SWITCH_CASE_FLOAT_TYPES(CTYPE_ALIAS, ...) \
  OPFORGE_ET_CASE(Float, CTYPE_ALIAS, __VA_ARGS__)            \
  OPFORGE_ET_CASE(Double, CTYPE_ALIAS, __VA_ARGS__)
#define ET_INTERNAL_SWITCH_CASE_REAL_TYPES(CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH_CASE_INT_TYPES(CTYPE_ALIAS, __VA_ARGS__) \
  ET_INTERNAL_SWITCH_CASE_FLOAT_TYPES(CTYPE_ALIAS, __VA_ARGS__)

#define ET_SWITCH_REAL_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME, ET_INTERNAL_SWITCH_CASE_REAL_TYPES(CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_REAL_TYPES_AND(ADDITIONAL, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                           \
                     ET_INTERNAL_SWITCH_CASE_REAL_TYPES(CTYPE_ALIAS, __VA_ARGS__)   \
                     OPFORGE_ET_CASE(ADDITIONAL, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_REAL_TYPES_AND2(A1, A2, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...)  \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                         \
                     ET_INTERNAL_SWITCH_CASE_REAL_TYPES(CTYPE_ALIAS, __VA_ARGS__) \
                     OPFORGE_ET_CASE(A1, CTYPE_ALIAS, __VA_ARGS__)                \
                     OPFORGE_ET_CASE(A2, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_REAL_TYPES_AND3(A1, A2, A3, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                            \
                     ET_INTERNAL_SWITCH_CASE_REAL_TYPES(CTYPE_ALIAS, __VA_ARGS__)    \
                     OPFORGE_ET_CASE(A1, CTYPE_ALIAS, __VA_ARGS__)                   \
                     OPFORGE_ET_CASE(A2, CTYPE_ALIAS, __VA_ARGS__)                   \
                     OPFORGE_ET_CASE(A3, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_REALH_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_REAL_TYPES_AND(Half, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_REALHBF16_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_REAL_TYPES_AND2(Half, BFloat16, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_REALB_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_REAL_TYPES_AND(Bool, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_REALHB_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_REAL_TYPES_AND2(Half, Bool, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_REALHBBF16_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_REAL_TYPES_AND3(Half, Bool, BFloat16, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_INT_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME, ET_INTERNAL_SWITCH_CASE_INT_TYPES(CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_INT_TYPES_AND(ADDITIONAL, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                          \
                     ET_INTERNAL_SWITCH_CASE_INT_TYPES(CTYPE_ALIAS, __VA_ARGS__)   \
                     OPFORGE_ET_CASE(ADDITIONAL, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_FLOAT_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME, ET_INTERNAL_SWITCH_CASE_FLOAT_TYPES(CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_FLOAT_TYPES_AND(ADDITIONAL, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                            \
                     ET_INTERNAL_SWITCH_CASE_FLOAT_TYPES(CTYPE_ALIAS, __VA_ARGS__)   \
                     OPFORGE_ET_CASE(ADDITIONAL, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_FLOAT_TYPES_AND2(A1, A2, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...)  \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                          \
                     ET_INTERNAL_SWITCH_CASE_FLOAT_TYPES(CTYPE_ALIAS, __VA_ARGS__) \
                     OPFORGE_ET_CASE(A1, CTYPE_ALIAS, __VA_ARGS__)                 \
                     OPFORGE_ET_CASE(A2, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_FLOATH_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_FLOAT_TYPES_AND(Half, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_FLOATHBF16_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_FLOAT_TYPES_AND2(Half, BFloat16, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_ALL_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_SWITCH_REAL_TYPES_AND3(Half, Bool, BFloat16, TYPE, CONTEXT, NAME, CTYPE_ALIAS, __VA_ARGS__)
#define ET_SWITCH_TWO_TYPES(T1, T2, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                  \
                     OPFORGE_ET_CASE(T1, CTYPE_ALIAS, __VA_ARGS__)         \
                     OPFORGE_ET_CASE(T2, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_THREE_TYPES(T1, T2, T3, TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...) \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                        \
                     OPFORGE_ET_CASE(T1, CTYPE_ALIAS, __VA_ARGS__)               \
                     OPFORGE_ET_CASE(T2, CTYPE_ALIAS, __VA_ARGS__)               \
                     OPFORGE_ET_CASE(T3, CTYPE_ALIAS, __VA_ARGS__))
#define ET_SWITCH_REALHBBF16_AND_UINT_TYPES(TYPE, CONTEXT, NAME, CTYPE_ALIAS, ...)   \
  ET_INTERNAL_SWITCH(TYPE, CONTEXT, NAME,                                         \
                     ET_INTERNAL_SWITCH_CASE_REAL_TYPES(CTYPE_ALIAS, __VA_ARGS__) \
                     OPFORGE_ET_CASE(Half, CTYPE_ALIAS, __VA_ARGS__)              \
                     OPFORGE_ET_CASE(Bool, CTYPE_ALIAS, __VA_ARGS__)              \
                     OPFORGE_ET_CASE(BFloat16, CTYPE_ALIAS, __VA_ARGS__)          \
                     ET_INTERNAL_SWITCH_CASE_UINT_TYPES(CTYPE_ALIAS, __VA_ARGS__))

// ET_FORALL_<SET>_TYPES(M) expands M(ctype, ScalarTypeName) for every dtype of the set.
#define OPFORGE_ET_CTYPE(name) ::executorch::runtime::ScalarTypeToCppType<::executorch::aten::ScalarType::name>::type
#define ET_FORALL_INT_TYPES(_) \
  _(uint8_t, Byte) _(int8_t, Char) _(int16_t, Short) _(int32_t, Int) _(int64_t, Long)
#define ET_FORALL_INT_TYPES_AND(SCALARTYPE, _) ET_FORALL_INT_TYPES(_) _(OPFORGE_ET_CTYPE(SCALARTYPE), SCALARTYPE)
#define ET_FORALL_FLOAT_TYPES(_) _(float, Float) _(double, Double)
#define ET_FORALL_FLOAT_TYPES_AND(SCALARTYPE, _) ET_FORALL_FLOAT_TYPES(_) _(OPFORGE_ET_CTYPE(SCALARTYPE), SCALARTYPE)
#define ET_FORALL_FLOAT_TYPES_AND2(S1, S2, _) \
  ET_FORALL_FLOAT_TYPES_AND(S1, _) _(OPFORGE_ET_CTYPE(S2), S2)
#define ET_FORALL_FLOATH_TYPES(_) ET_FORALL_FLOAT_TYPES_AND(Half, _)
#define ET_FORALL_FLOATHBF16_TYPES(_) ET_FORALL_FLOAT_TYPES_AND2(Half, BFloat16, _)
#define ET_FORALL_REAL_TYPES(_) ET_FORALL_INT_TYPES(_) ET_FORALL_FLOAT_TYPES(_)
#define ET_FORALL_REAL_TYPES_AND(SCALARTYPE, _) ET_FORALL_REAL_TYPES(_) _(OPFORGE_ET_CTYPE(SCALARTYPE), SCALARTYPE)
#define ET_FORALL_REAL_TYPES_AND2(S1, S2, _) ET_FORALL_REAL_TYPES_AND(S1, _) _(OPFORGE_ET_CTYPE(S2), S2)
#define ET_FORALL_REAL_TYPES_AND3(S1, S2, S3, _) ET_FORALL_REAL_TYPES_AND2(S1, S2, _) _(OPFORGE_ET_CTYPE(S3), S3)
#define ET_FORALL_REALH_TYPES(_) ET_FORALL_REAL_TYPES_AND(Half, _)
#define ET_FORALL_REALHBF16_TYPES(_) ET_FORALL_REAL_TYPES_AND2(Half, BFloat16, _)
#define ET_FORALL_REALHBBF16_TYPES(_) ET_FORALL_REAL_TYPES_AND3(Half, Bool, BFloat16, _)
