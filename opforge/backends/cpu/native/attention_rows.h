// One query row of attention for the G query heads that share one KV head, in one pass
// over the filled cache slots (attention_rows.cpp, attention_rows_avx2.cpp; the op around
// it: attention.cpp).
//   s_gj = (q_g . k_j) / factor (or * factor) + terms[j],   j < n
//   o_g  = sum_j softmax_j(s_g) v_j
// Each block of 16 slots is read once from memory and used by the G heads while it is in
// L1; the scores of a head are summed in registers (a transposing add tree) and folded into
// a running max, sum and output row (online softmax), so no score row is stored; a
// float16/bfloat16 cache is converted in registers. Two kernels: AVX-512 (16-lane vectors,
// attention_rows.cpp) and AVX2 + FMA + F16C (8-lane, attention_rows_avx2.cpp, for CPUs
// without AVX-512); the op keeps its plain loops for other CPUs, OPFORGE_CPU_CAPABILITY=
// default, and both switches below "0".
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OFC_ATTENTION_ROWS 1
#endif

namespace ofc {

struct AttentionRows {
  const float* const* q = nullptr;  // G query rows of D floats
  float* const* o = nullptr;        // G output rows of D floats (dense), written
  int64_t G = 0, D = 0, n = 0;      // n >= 1 slots read: 0 .. n - 1
  const void* k = nullptr;          // slot 0 of the KV head's keys, values (dtype below)
  const void* v = nullptr;
  int64_t ks = 0, vs = 0;           // their slot strides, in elements
  int32_t dtype = 0;                // F32, F16 or BF16 (engine.h)
  const float* terms = nullptr;     // n terms added to the scores (a mask), or none
  bool multiply = false;            // scores * factor, else / factor
  float factor = 1.0f;
  bool empty_zero = false;          // a head whose n scores are all -inf: zeros, else NaN
};

enum class RowsKernel : int32_t { loops, avx2, avx512 };

// the kernel this CPU and the switches allow, read when the op is built, where the engine's
// own kernels are allowed (not OPFORGE_CPU_CAPABILITY=default): avx512 where the CPU has
// AVX-512F/BW/VL and OPFORGE_CPU_ATTENTION_AVX512 is not "0"; else avx2 where it has AVX2,
// FMA and F16C and OPFORGE_CPU_ATTENTION_AVX2 is not "0" (so an AVX-512 CPU runs the AVX2
// kernel with the first switch "0"); else loops (none: the op's plain loops)
RowsKernel attention_rows_kernel();

// o_g for g < G; a head with a NaN or +inf score gives NaN (as torch's softmax), with all
// scores -inf zeros or NaN (empty_zero). `kernel`: avx2 or avx512, as attention_rows_kernel()
// allowed.
void attention_rows(const AttentionRows& a, RowsKernel kernel);

// the AVX2 kernel itself (attention_rows_avx2.cpp)
void attention_rows_avx2(const AttentionRows& a);

}  // namespace ofc
