// float16 as float32 copies around a float32 kernel (half_compute.h).
#include "half_compute.h"

#include <vector>

#include "copy.h"
#include "gemm.h"

namespace opforge::portable {

bool all_floating_half(const opforge_arg* args, int64_t n) {
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (args[i].tag != OPFORGE_ARG_TENSOR || !is_floating(args[i].v.tensor.dtype)) continue;
    if (args[i].v.tensor.dtype != kFloat16) return false;
    any = true;
  }
  return any;
}

namespace {

// One thread's copies: the float32 data, their dense strides, the rewritten arguments.
struct HalfBuffers {
  std::vector<float> data;
  std::vector<int64_t> strides;
  std::vector<opforge_arg> args;
  std::vector<View> views;
};

HalfBuffers& buffers() {
  thread_local HalfBuffers b;
  return b;
}

}  // namespace

void run_half_as_float(opforge_context* ctx, opforge_arg* args, int64_t n, int outs,
                       opforge_kernel_fn kernel, const char* op) {
  const char* name = op ? op : "a float16 call";
  if (n < outs || outs < 0) {
    fail(ctx, "%s: %lld arguments — valid: at least the %d outs", name, (long long)n, outs);
    return;
  }
  HalfBuffers& b = buffers();
  b.views.assign((size_t)n, View{});
  // validate every float16 tensor first (sizes, spans) and count the floats the copies need
  int64_t floats = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (args[i].tag != OPFORGE_ARG_TENSOR || args[i].v.tensor.dtype != kFloat16) continue;
    if (!tensor_arg(ctx, args, n, i, name, "a float16 tensor", &b.views[(size_t)i])) return;
    if (!add_ok(floats, (b.views[(size_t)i].numel + 15) / 16 * 16, &floats)) floats = INT64_MAX;
  }
  int64_t bytes;
  if (!mul_ok(floats, 4, &bytes) || bytes > workspace_limit(ctx)) {
    fail(ctx, "%s: float32 copies of the float16 tensors (%lld floats) — exceed the kernels' "
         "workspace limit — valid: within OPFORGE_MAX_MEMORY — raise the limit or run smaller "
         "tensors", name, (long long)floats);
    return;
  }
  if ((int64_t)b.data.size() < floats) b.data.resize((size_t)floats);
  if ((int64_t)b.strides.size() < n * kMaxRank) b.strides.resize((size_t)(n * kMaxRank));
  b.args.assign(args, args + n);
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const View& v = b.views[(size_t)i];
    if (v.t == nullptr) continue;
    float* copy = b.data.data() + at;
    at += (v.numel + 15) / 16 * 16;
    int64_t* strides = b.strides.data() + i * kMaxRank;
    contiguous_strides(v.sizes, v.rank, strides);
    if (i < n - outs && v.numel > 0)
      convert_strided(reinterpret_cast<char*>(copy), kFloat32, strides, v.data, kFloat16, v.strides,
                      v.sizes, v.rank);
    opforge_tensor& t = b.args[(size_t)i].v.tensor;
    t.data = copy;
    t.dtype = kFloat32;
    t.strides = strides;
  }
  kernel(ctx, b.args.data(), n);
  if (ctx->status != 0) return;
  for (int64_t i = n - outs; i < n; ++i) {
    const View& v = b.views[(size_t)i];
    if (v.t == nullptr || v.numel == 0) continue;
    convert_strided(v.data, kFloat16, v.strides, static_cast<const char*>(b.args[(size_t)i].v.tensor.data),
                    kFloat32, b.strides.data() + i * kMaxRank, v.sizes, v.rank);
  }
}

}  // namespace opforge::portable
