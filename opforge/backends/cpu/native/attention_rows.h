// One query row of attention for the G query heads that share one KV head, in one pass
// over the filled cache slots (attention_rows.cpp; the op around it: attention.cpp).
//   s_gj = (q_g . k_j) / factor (or * factor) + terms[j],   j < n
//   o_g  = sum_j softmax_j(s_g) v_j
// Each block of 16 slots is read once from memory and used by the G heads while it is in
// L1; the 16 scores of a head are summed in registers (a transposing add tree) and folded
// into a running max, sum and output row (online softmax), so no score row is stored; a
// float16/bfloat16 cache is converted in registers. AVX-512 only (the op keeps its plain
// loops for other CPUs and OPFORGE_CPU_CAPABILITY=default).
#pragma once

#include <cstdint>

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

// this CPU has AVX-512F/BW/VL, the engine's own kernels are allowed and the switch
// OPFORGE_CPU_ATTENTION_AVX512 is not "0" (read when the op is built)
bool attention_rows_allowed();

// o_g for g < G; a head with a NaN or +inf score gives NaN (as torch's softmax), with all
// scores -inf zeros or NaN (empty_zero). Needs attention_rows_allowed().
void attention_rows(const AttentionRows& a);

}  // namespace ofc
