// The Move kernel (moves.h).
#include "moves.h"

#include <cstdio>
#include <cstring>

#include "opforge/runtime.h"

namespace opforge::rt {

namespace {

// Is a tensor with these sizes and strides one dense block (in some dim order)?
bool dense(const opforge_tensor& t, int64_t numel) {
  int64_t span = 1;
  for (int32_t d = 0; d < t.rank; ++d) {
    if (t.sizes[d] == 1) continue;
    if (t.strides[d] < 0) return false;
    span += (t.sizes[d] - 1) * t.strides[d];
  }
  return span == numel;
}

}  // namespace

void move_kernel(opforge_context* ctx, opforge_arg* args, int64_t num_args) {
  const opforge_tensor& s = args[0].v.tensor;
  const opforge_tensor& d = args[1].v.tensor;
  if (s.dtype != d.dtype || s.rank > d.rank) {
    ctx->status = 1;
    std::snprintf(ctx->message, OPFORGE_MESSAGE_SIZE,
                  "move: source of dtype %d and rank %d into a destination of dtype %d and rank %d — valid: the "
                  "same dtype, the source's rank at most the destination's", s.dtype, s.rank, d.dtype, d.rank);
    return;
  }
  const int64_t itemsize = opf_dtype_itemsize(d.dtype);
  int64_t numel = 1;
  int64_t sstride[64];
  const int32_t lead = d.rank - s.rank;
  bool same = lead == 0;
  for (int32_t k = 0; k < d.rank; ++k) {
    numel *= d.sizes[k];
    int64_t size = k < lead ? 1 : s.sizes[k - lead];
    if (size != d.sizes[k] && size != 1) {
      ctx->status = 1;
      std::snprintf(ctx->message, OPFORGE_MESSAGE_SIZE,
                    "move: source dimension %d of size %lld into destination size %lld — valid: equal sizes, or "
                    "1 (broadcast)", k - lead, static_cast<long long>(size), static_cast<long long>(d.sizes[k]));
      return;
    }
    sstride[k] = (k < lead || size == 1) ? 0 : s.strides[k - lead];
    same = same && sstride[k] == d.strides[k] && size == d.sizes[k];
  }
  if (numel == 0 || s.data == d.data) return;
  if (same && dense(d, numel)) {  // the common case: one block
    std::memmove(d.data, s.data, static_cast<size_t>(numel * itemsize));
    return;
  }
  int64_t index[64] = {0};
  const uint8_t* src = static_cast<const uint8_t*>(s.data);
  uint8_t* dst = static_cast<uint8_t*>(d.data);
  for (int64_t n = 0; n < numel; ++n) {
    int64_t so = 0, dof = 0;
    for (int32_t k = 0; k < d.rank; ++k) {
      so += index[k] * sstride[k];
      dof += index[k] * d.strides[k];
    }
    std::memcpy(dst + dof * itemsize, src + so * itemsize, static_cast<size_t>(itemsize));
    for (int32_t k = d.rank - 1; k >= 0; --k) {
      if (++index[k] < d.sizes[k]) break;
      index[k] = 0;
    }
  }
}

}  // namespace opforge::rt
