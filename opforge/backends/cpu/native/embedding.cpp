// Embedding: rows of a weight table gathered by index (the index checked per call).
//
// Contract: ins [weight, indices], outs [out]; no attributes.
//   weight: f32, rank 2 (V, D), contiguous; indices: int64 or int32, any shape, contiguous;
//   out: f32, contiguous, indices' elements × D elements. Work: one row copy per index.
// A table that is also a range of the program's file (ofc_tensor_file) is read with one
// pread per row: the kernel maps a file's pages in large folios around each fault, so rows
// read through the mapping made most of a 98 MB table resident (a decoder's whole
// vocabulary, for the 256 tokens it saw); read(2) leaves them in the page cache only.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine.h"
#include "loops.h"

namespace ofc {

struct EmbeddingOp : Op {
  void run(Engine& e) override {
    const Tensor& w = e.tensors[(size_t)ins[0]];
    const Tensor& ix = e.tensors[(size_t)ins[1]];
    int64_t V = w.dims[0], D = w.dims[1];
    int64_t n = ix.numel;
    const float* wp = static_cast<const float*>(e.ptr(ins[0]));
    const void* ip = e.ptr(ins[1]);
    float* out = static_cast<float*>(e.ptr(outs[0]));
    const Tensor& root = e.tensors[(size_t)e.root(ins[0])];
    for (int64_t i = 0; i < n; ++i) {
      int64_t r = load_as<int64_t>(ip, ix.dtype, i);
      if (r < 0 || r >= V)
        fail("embedding: index " + std::to_string(r) + " out of range for " + std::to_string(V) + " rows");
      if (root.file_fd >= 0)  // (w.offset + r * D) * 4 < the root's bytes: checked at add
        read_row(root.file_fd, root.file_offset + (w.offset + r * D) * (int64_t)sizeof(float),
                 out + i * D, D * (int64_t)sizeof(float), r);
      else
        std::memcpy(out + i * D, wp + r * D, (size_t)D * sizeof(float));
    }
  }
  static void read_row(int fd, int64_t at, float* dst, int64_t nbytes, int64_t row) {
    char* p = reinterpret_cast<char*>(dst);
    while (nbytes > 0) {
      ssize_t got = pread(fd, p, (size_t)nbytes, (off_t)at);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail("embedding: reading row " + std::to_string(row) + " from the program file: " +
             (got < 0 ? std::string(std::strerror(errno)) : std::string("the file is shorter than when loaded")));
      p += got;
      at += got;
      nbytes -= got;
    }
  }
};

void contract_embedding(const Engine& e, const OpCall& c) {
  need_count(c, 2, 1);
  need_post_ops_allowed(c, false);
  need(c.ia.empty() && c.fa.empty(), c.kind, "takes no attributes");
  const Tensor& w = e.tensors[(size_t)c.ins[0]];
  const Tensor& ix = e.tensors[(size_t)c.ins[1]];
  const Tensor& out = e.tensors[(size_t)c.outs[0]];
  need_rank(w, 2, 2, c.kind, "the weight");
  need(w.dtype == F32 && out.dtype == F32 && (ix.dtype == I64 || ix.dtype == I32), c.kind,
       "dtypes (f32 weight and output, int64 or int32 indices)");
  need(row_major(w) && dense(w) && row_major(ix) && dense(ix) && row_major(out) && dense(out), c.kind,
       "weight, indices and output must be contiguous");
  need(out.numel == mul_c(ix.numel, w.dims[1], "embedding"), c.kind, "the output must hold indices × D elements");
}

void build_embedding(Handle& h, const OpCall& c) {
  auto op = std::make_unique<EmbeddingOp>();
  op->name = "embedding";
  push_op(h.e, std::move(op), c);
}

}  // namespace ofc
