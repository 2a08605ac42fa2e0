// What the two matmuls on integer weights share (int_matmul.cpp: float activations, the
// weights dequantized in registers; int_dot_matmul.cpp: int8 activations, integer dots):
// the output in panels of 16 columns, panels in chunks of 4 (64 columns) handed to the
// threads, rows within a chunk in blocks of up to 4 (so a chunk's weights are read from
// memory once per call and from cache by its other row blocks); the operand checks of
// their contracts (a, d, bias, constant weights, the work bound); the op's common fields
// and their setup at build.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <type_traits>

#include "engine.h"

namespace ofc {

constexpr int kIntLanes = 16;     // columns per panel
constexpr int kIntChunk = 4;      // panels per task (64 columns)
constexpr int kIntRowBlock = 4;   // rows per block

// the fields both kernels read (filled by int_weights_setup)
struct IntWeightsOp : Op {
  int bits = 8;
  int64_t m = 0, k = 0, n = 0, panels = 0, group = 0, groups = 0;
  int64_t sa = 0, sd = 0;       // a's and d's row strides
  const uint8_t* w = nullptr;   // borrowed: the program's bytes, read in place
  const float* s = nullptr;
  std::vector<float> bias;      // panels·16 (zeros where there is none)
  int team = 1;
};

// the int16 mode's kernels: AVX512-VNNI's vpdpwssd, or AVX2's vpmaddwd (equal bit for bit)
enum class Int16Kernel { none, vnni, avx2 };

// int_matmul's op (int_matmul.cpp; its int16 mode in int_matmul16.cpp)
struct IntMatmulOp : IntWeightsOp {
  int64_t kr = 0;               // packed rows per panel: K (8 bits) or ceil(K/2) (4 bits)
  bool vector512 = false;
  bool avx2 = false;            // the AVX2 + FMA kernels (int_matmul_avx2.cpp), where not AVX-512
  bool wide = false;            // the dequantize-once path (M >= kWideRows, AVX-512 or AVX2)
  memory wmem, smem;            // the weights' and scales' copies (w and s point into them)
  // the int16 mode (fa [s], 4 bits: int_matmul16.cpp; the AVX2 kernel int_matmul16_avx2.cpp):
  // weights and scales in its own layout (w and s then point to it), this call's activations
  // as integers
  bool act16 = false;
  Int16Kernel int16 = Int16Kernel::none;
  float act_scale = 0.f, act_inv = 0.f;
  int64_t l8 = 0, octs = 0;     // a block's activations padded to 8; its 8-k rows
  std::vector<int16_t> aq;      // [M, G, l8] v = round(a / s) - shift[m], zero padded
  std::vector<int32_t> corr;    // [M, G] 8·Σ v (the weights' nibbles stored + 8)
  std::vector<int32_t> shift;   // [M] v = i - shift: 0, or min(i) + 32768 where i passes int16
  void run(Engine& e) override;
};

// int_matmul16.cpp: which kernel the int16 mode runs on this CPU, given the op's float
// kernels (vector512, avx2: the dequantize-once path reads its layout through them): VNNI
// where the CPU has AVX512-VNNI and BW (OPFORGE_CPU_INT_MATMUL_VNNI=0 skips it), else AVX2,
// none with OPFORGE_CPU_INT_MATMUL_INT16=0 (read when the op is built); its weights and
// scales copied into its layout at build; one call (false: a row's integers do not fit
// int16, nothing written: the caller takes the float path); the wide path's dequantize from
// its layout (int_matmul.cpp's arithmetic)
Int16Kernel int16_kernel(bool vector512, bool avx2);
void int16_setup(Engine& e, const OpCall& c, IntMatmulOp& op);
bool int16_run(IntMatmulOp& op, const float* a, float* d);
void dequantize_chunk16(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf);

// a row's integers i in [low, high] as int16 v = i - shift: false where one is past ±65535
// or they span more than 65535 steps (a NaN's INT_MIN included), else the shift: 0 where
// every i fits int16, else low + 32768 (both quantize_row kernels)
inline bool int16_row_shift(int64_t low, int64_t high, int32_t& shift) {
  if (low < -65535 || high > 65535 || high - low > 65535) return false;
  shift = low >= -32768 && high <= 32767 ? 0 : (int32_t)(low + 32768);
  return true;
}

// int_matmul16_avx2.cpp (x86-64; the callers check the CPU): row m of a as this mode's
// integers (quantize_row's result, bit for bit); every row over a chunk of np panels from
// p0; the wide path's dequantize (dequantize_chunk16's products)
bool int16_avx2_quantize_row(IntMatmulOp& op, const float* x, int64_t m);
void int16_avx2_chunk(const IntMatmulOp& op, float* d, int64_t p0, int64_t np, bool shifted);
void int16_avx2_dequantize(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf);

// the int16 mode's layout (int_matmul16.cpp says it): the index of the first 64-byte row of
// block g, 8-k row o of panel p (the rows of a block's panels interleaved, np apart), and of
// panel p's 16 scales of block g
inline int64_t int16_row(const IntMatmulOp& op, int64_t p, int64_t g, int64_t o) {
  const int64_t c = p / kIntChunk, np = std::min<int64_t>(kIntChunk, op.panels - c * kIntChunk);
  return (c * kIntChunk * op.groups + g * np) * op.octs + o * np + (p - c * kIntChunk);
}

inline int64_t int16_scales(const IntMatmulOp& op, int64_t p, int64_t g) {
  const int64_t c = p / kIntChunk, np = std::min<int64_t>(kIntChunk, op.panels - c * kIntChunk);
  return (c * kIntChunk * op.groups + g * np + (p - c * kIntChunk)) * kIntLanes;
}

constexpr int64_t kInt16MaxGroup = 4096;  // int16 mode: |Σ i·q| < 2^31 over a block

// int_matmul_avx2.cpp: may its AVX2 + FMA kernels run (the CPU's avx2 and fma, the own
// kernels allowed, OPFORGE_CPU_INT_MATMUL_AVX2 not 0; read when the op is built); x86-64
// only: the register path over one chunk of np panels from p0, every row; the wide path's
// dequantize of a chunk's k in [k0, k0 + kn) into wf (floats [kn][64], 32-byte aligned)
// and its microkernel over rows [m0, m0 + rows), rows <= 6 (int_matmul.cpp's wide_chunk)
bool int_matmul_avx2_allowed();
void int_matmul_avx2_chunk(const IntMatmulOp& op, const float* a, float* d, int64_t p0, int64_t np);
void int_matmul_avx2_dequantize(const IntMatmulOp& op, int64_t p0, int np, int64_t k0, int64_t kn, float* wf);
void int_matmul_avx2_wide_rows(const IntMatmulOp& op, const float* a, float* d, const float* wf, int64_t m0,
                               int rows, int64_t p0, int np, int64_t k0, int64_t kn, bool first, bool last);

// the contract's shared checks: ins [a, w, scales, (bias)], outs [d], no post-ops; a f32
// [M, K] and d f32 [M, N], columns contiguous, d's rows apart by at least N, another root
// than a; w and scales constants; the bias a dense f32 constant of N elements; M·K·N
// without overflow. Sets M, K, N (the layout of w and scales is each kernel's own).
void need_int_weights_operands(const Engine& e, const OpCall& c, int64_t& M, int64_t& K,
                               int64_t& N);

// bits, the sizes, strides, weight and scale pointers, team and the padded bias (its bytes
// reserved); `groups`: the blocks of K (each kernel rounds its own way)
void int_weights_setup(Engine& e, const OpCall& c, IntWeightsOp& op, int64_t groups, const char* what);

// body(p0, np) for each chunk of up to kIntChunk panels from p0, over the op's threads
template <typename F>
void for_each_chunk(const IntWeightsOp& op, F&& body) {
  const int64_t chunks = (op.panels + kIntChunk - 1) / kIntChunk;
  parallel_for(op.team, chunks, [&](int64_t i) {
    const int64_t p0 = i * kIntChunk;
    body(p0, std::min<int64_t>(kIntChunk, op.panels - p0));
  });
}

// body(m0, R) for each block of up to kIntRowBlock rows, R a std::integral_constant<int, rows>
// (a kernel's template argument)
template <typename F>
void for_each_row_block(int64_t m, F&& body) {
  for (int64_t m0 = 0; m0 < m; m0 += kIntRowBlock) {
    switch (std::min<int64_t>(kIntRowBlock, m - m0)) {
      case 4: body(m0, std::integral_constant<int, 4>()); break;
      case 3: body(m0, std::integral_constant<int, 3>()); break;
      case 2: body(m0, std::integral_constant<int, 2>()); break;
      default: body(m0, std::integral_constant<int, 1>()); break;
    }
  }
}

// body(P), P a std::integral_constant<int, np> for np in [1, kIntChunk]
template <typename F>
void with_panels(int64_t np, F&& body) {
  switch (np) {
    case 4: body(std::integral_constant<int, 4>()); break;
    case 3: body(std::integral_constant<int, 3>()); break;
    case 2: body(std::integral_constant<int, 2>()); break;
    default: body(std::integral_constant<int, 1>()); break;
  }
}

// body(R), R a std::integral_constant<int, rows> for rows in [1, 6]: a block of the wide
// paths' float microkernels (int_matmul.cpp, int_matmul_avx2.cpp)
template <typename F>
void with_wide_rows(int64_t rows, F&& body) {
  switch (rows) {
    case 6: body(std::integral_constant<int, 6>()); break;
    case 5: body(std::integral_constant<int, 5>()); break;
    case 4: body(std::integral_constant<int, 4>()); break;
    case 3: body(std::integral_constant<int, 3>()); break;
    case 2: body(std::integral_constant<int, 2>()); break;
    default: body(std::integral_constant<int, 1>()); break;
  }
}

// the rows r of panel p's 16 sums acc[r] (+ bias) stored in d, the columns past N left out
// (the portable kernels' store)
inline void store_panel(const IntWeightsOp& op, float* d, int64_t m0, int rows, int64_t p,
                        const float (*acc)[kIntLanes]) {
  const int64_t col = p * kIntLanes;
  const int64_t width = std::min<int64_t>(kIntLanes, op.n - col);
  for (int r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j)
      d[(m0 + r) * op.sd + col + j] = acc[r][j] + op.bias[(size_t)(col + j)];
}

#if defined(__x86_64__)
// the lanes of the panel at column `col` that are columns of d
inline __mmask16 panel_mask(const IntWeightsOp& op, int64_t col) {
  const int64_t left = op.n - col;
  return left >= kIntLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}
#endif

}  // namespace ofc
