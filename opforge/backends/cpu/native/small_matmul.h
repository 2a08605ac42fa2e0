// The engine's own float32 matmul against constant weights (small_matmul.cpp: the op, when
// it is taken, the AVX-512 kernels; small_matmul_avx2.cpp: the AVX2 + FMA ones).
#pragma once

#include <vector>

#include "engine.h"

namespace ofc {

struct SmallMatmulOp : Op {
  static constexpr int kPanel = 16;       // columns per panel
  static constexpr int kBlockPanels = 4;  // panels a block of columns reads (64 columns)
  int64_t m = 0, k = 0, n = 0, panels = 0;
  int64_t sa_m = 0, sa_k = 0, sd_m = 0;  // a's and dst's strides (dst's columns contiguous)
  memory packed;              // b as [panel][K][16] (or BA16a64b), through the weight cache
  const float* bp = nullptr;  // its data
  // element (k, column 16p + j) of the panels from p0 (a multiple of 4) at
  // base(p0) + k·step_k + (p - p0)·step_p + j
  int64_t step_k = kPanel, step_p = 0, block_stride = 0;  // block_stride: BA16a64b's N-block
  int team = 1;
  bool avx2 = false;          // the AVX2 kernels (any number of rows), else the AVX-512 ones
  const float* base(int64_t p0) const {
    return block_stride ? bp + (p0 / kBlockPanels) * block_stride : bp + p0 * step_p;
  }
  std::vector<float> bias;    // panels·16 (zeros where there is none)
  std::vector<RegisterPostOp> post;
  Epilogue rest;  // the post-ops after the ones above: elementwise, in place (nan.cpp)
  void late_reads(std::vector<int>& ids) const override { rest.reads(ids); }
  void run(Engine& e) override;
};

// the CPU has AVX2 and FMA but not AVX-512F (or OPFORGE_CPU_SMALL_MATMUL_AVX512 is "0"),
// the engine's own kernels are allowed and OPFORGE_CPU_MATMUL_AVX2 is not "0" (read when an
// op is built)
bool small_matmul_avx2_allowed();
// the op's sums for the 64-column block from panel p0 (a multiple of 4), every row
// (small_matmul_avx2.cpp; needs small_matmul_avx2_allowed())
void small_matmul_avx2_block(const SmallMatmulOp& op, const float* a, float* d, int64_t p0);

}  // namespace ofc
