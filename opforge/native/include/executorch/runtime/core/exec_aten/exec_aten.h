// opforge's ExecuTorch compatibility headers: ExecuTorch's tensor-facing types (lean mode),
// mapped onto opforge's kernel API.
//
// The kernel types are opforge's own, by alias, not look-alikes: the generated glue
// declares each kernel with opforge::Tensor and opforge::KernelContext, and an ExecuTorch
// kernel `Tensor& f(KernelRuntimeContext&, const Tensor&, Tensor&)` must be that very
// function (the parameter types are part of its symbol). So
//   executorch::aten::Tensor                 = opforge::Tensor   (sizes/strides are int64)
//   executorch::runtime::KernelRuntimeContext = opforge::KernelContext
//   executorch::aten::ScalarType             = opforge::ScalarType (c10 numbering)
// and the older spellings (exec_aten::, torch::executor::) name the same types.
#pragma once

#include <cstdint>
#include <cstring>

#include "executorch/runtime/core/error.h"
#include "executorch/runtime/platform/assert.h"
#include "executorch/runtime/platform/compiler.h"
#include "opforge/kernel.h"

namespace opforge {
namespace et {

// IEEE binary16, stored as its bits; arithmetic goes through float.
struct Half {
  uint16_t x = 0;
  Half() = default;
  Half(float value) : x(from_float(value)) {}  // NOLINT: implicit, as c10::Half
  operator float() const { return to_float(x); }

  static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {
      bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
      bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static uint16_t from_float(float f) {  // round to nearest even
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // overflows to inf (or is inf)
    if (a < 0x38800000u) {  // a half subnormal (or zero): round(|f| * 2^24)
      float af;
      std::memcpy(&af, &a, sizeof af);
      float scaled = af * 16777216.0f;
      uint32_t m = static_cast<uint32_t>(scaled);
      float rest = scaled - static_cast<float>(m);
      if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
      return sign | static_cast<uint16_t>(m);
    }
    a += 0xc8000fffu + ((a >> 13) & 1u);  // rebias the exponent, round to nearest even
    return sign | static_cast<uint16_t>(a >> 13);
  }
};

// bfloat16: the upper half of a float's bits; arithmetic goes through float.
struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  BFloat16(float value) {  // NOLINT: implicit, as c10::BFloat16
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      x = 0x7fc0u;
    } else {
      x = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
  }
  operator float() const {
    uint32_t bits = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit floats must be 2 bytes");

enum class TensorShapeDynamism : uint8_t { STATIC = 0, DYNAMIC_BOUND = 1, DYNAMIC_UNBOUND = 2 };

}  // namespace et
}  // namespace opforge

namespace executorch {
namespace aten {
using Tensor = ::opforge::Tensor;
using TensorList = ::opforge::TensorList;
using ScalarType = ::opforge::ScalarType;
using Scalar = ::opforge::Scalar;
template <class T>
using ArrayRef = ::opforge::ArrayRef<T>;
using IntArrayRef = ::opforge::IntArrayRef;
template <class T>
using optional = ::opforge::optional<T>;
using ::opforge::nullopt;
using nullopt_t = std::nullopt_t;
using string_view = ::opforge::string_view;
using SizesType = Tensor::SizesType;
using StridesType = Tensor::StridesType;
using DimOrderType = Tensor::DimOrderType;
using Half = ::opforge::et::Half;
using BFloat16 = ::opforge::et::BFloat16;
using TensorShapeDynamism = ::opforge::et::TensorShapeDynamism;
}  // namespace aten
}  // namespace executorch

namespace exec_aten = ::executorch::aten;

namespace torch {
namespace executor {
using ::executorch::aten::ArrayRef;
using ::executorch::aten::BFloat16;
using ::executorch::aten::Half;
using ::executorch::aten::IntArrayRef;
using ::executorch::aten::optional;
using ::executorch::aten::Scalar;
using ::executorch::aten::ScalarType;
using ::executorch::aten::SizesType;
using ::executorch::aten::string_view;
using ::executorch::aten::Tensor;
using ::executorch::aten::TensorList;
}  // namespace executor
}  // namespace torch
