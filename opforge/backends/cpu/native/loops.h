// Stride-generic loop helpers (copy, generic elementwise, reduce, quantize, embedding).
// Callers run them only over walks the op's contract checked: every index·strides stays in
// its tensor's storage, and the walk's element count is bounded by storage.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine.h"

namespace ofc {

template <typename F>
void for_each_index(const dims_t& dims, F&& f) {
  int n = (int)dims.size();
  int64_t total = 1;
  for (auto d : dims) total *= d;  // bounded by the contract (count_of)
  if (total == 0) return;
  int64_t idx[kMaxRank] = {0};
  for (int64_t flat = 0; flat < total; ++flat) {
    f(idx);
    for (int k = n - 1; k >= 0; --k) {
      if (++idx[k] < dims[(size_t)k]) break;
      idx[k] = 0;
    }
  }
}

// f(idx of the outer dims, n = the innermost extent): one call per row
template <typename F>
void for_each_row(const dims_t& dims, F&& f) {
  if (dims.empty()) { int64_t none[1] = {0}; f(none, (int64_t)1); return; }
  dims_t outer(dims.begin(), dims.end() - 1);
  int64_t n = dims.back();
  if (n == 0) return;
  for_each_index(outer, [&](const int64_t* idx) { f(idx, n); });
}

inline int64_t dot(const int64_t* idx, const dims_t& strides) {
  int64_t off = 0;
  for (size_t k = 0; k < strides.size(); ++k) off += idx[k] * strides[k];
  return off;
}

template <typename T>
inline T load_as(const void* base, int32_t dt, int64_t i) {
  switch (dt) {
    case F32: return (T) static_cast<const float*>(base)[i];
    case F64: return (T) static_cast<const double*>(base)[i];
    case I64: return (T) static_cast<const int64_t*>(base)[i];
    case I32: return (T) static_cast<const int32_t*>(base)[i];
    case I16: return (T) static_cast<const int16_t*>(base)[i];
    case I8: return (T) static_cast<const int8_t*>(base)[i];
    case U8: return (T) static_cast<const uint8_t*>(base)[i];
    case BOOL: return (T)(static_cast<const uint8_t*>(base)[i] != 0);
  }
  return T(0);
}

template <typename T>
inline void store_as(void* base, int32_t dt, int64_t i, T v) {
  switch (dt) {
    case F32: static_cast<float*>(base)[i] = (float)v; return;
    case F64: static_cast<double*>(base)[i] = (double)v; return;
    case I64: static_cast<int64_t*>(base)[i] = (int64_t)v; return;
    case I32: static_cast<int32_t*>(base)[i] = (int32_t)v; return;
    case I16: static_cast<int16_t*>(base)[i] = (int16_t)v; return;
    case I8: static_cast<int8_t*>(base)[i] = (int8_t)v; return;
    case U8: static_cast<uint8_t*>(base)[i] = (uint8_t)v; return;
    case BOOL: static_cast<uint8_t*>(base)[i] = v != T(0); return;
  }
}

}  // namespace ofc
