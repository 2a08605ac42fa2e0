// Half-precision storage (float16, bfloat16) converted to and from float32: a KV cache
// stored at half the bytes (the cache write converts the new rows, indexing.cpp; attention
// reads the slots back as float32, attention.cpp). Both directions as torch converts:
//   to float32: exact (every float16 and bfloat16 value is a float32 value);
//   from float32: round to nearest, ties to even (float16: overflow to ±inf, subnormals
//   rounded too; a NaN stays a NaN: float16 keeps its sign and the top payload bits, quiet,
//   as vcvtps2ph does; bfloat16 gives 0x7FC0, as c10::BFloat16 does).
// Each row function has a vector path (x86: F16C or AVX-512F for float16, the compiler's
// vectors for bfloat16) and a portable scalar one that gives the same bits; `vector` false
// (OPFORGE_CPU_CAPABILITY=default) takes the scalar one.
#pragma once

#include <cstdint>
#include <cstring>

namespace ofc {

inline float f32_of_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline uint32_t bits_of_f32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

inline float bf16_to_f32(uint16_t h) { return f32_of_bits((uint32_t)h << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of_f32(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // NaN
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // (no wrap: |f| <= inf)
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1F)  // inf; a NaN quiet (as vcvtph2ps)
    return f32_of_bits(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u));
  if (exp == 0) {  // zero or subnormal: man · 2^-24, exact
    const float v = (float)man * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return f32_of_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of_f32(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN, quiet
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520: rounds to inf
  if (a >= 0x38800000u) {  // a normal float16 (>= 2^-14): rebias, round the 13 bits dropped
    const uint32_t r = a - (112u << 23);
    return (uint16_t)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // below 2^-14: the float16 subnormal step is 2^-24, float32's ulp at 0.5; adding 0.5
  // rounds |f| to it (to nearest even, the default rounding), the low bits then count steps
  // (0x400 where it rounds up to 2^-14, which is that normal's encoding)
  const float v = f32_of_bits(a) + 0.5f;
  return (uint16_t)(sign | (bits_of_f32(v) - 0x3F000000u));
}

// dst[i] = src[i] as float32 (src: n float16 or bfloat16 values, dtype F16 or BF16)
void half_to_f32(const uint16_t* src, float* dst, int64_t n, int32_t dtype, bool vector);
// dst[i] = src[i] rounded to float16 or bfloat16 (dtype F16 or BF16)
void f32_to_half(const float* src, uint16_t* dst, int64_t n, int32_t dtype, bool vector);
// the vector paths may run on this CPU (own_kernels_allowed(), read at build)
bool half_vector_allowed();

}  // namespace ofc
