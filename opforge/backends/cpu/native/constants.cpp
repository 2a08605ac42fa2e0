// Constants in the layouts primitives want (weights, biases), made once at init: shared
// through the program's weight cache, and a large one from a droppable file mapping
// reordered a chunk at a time (reorder_const; the C API that flags it is ofc_tensor_file).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "engine.h"

namespace ofc {

namespace {
constexpr int64_t kChunkBytes = 8 << 20;  // reordered per chunk from 2 chunks' size up

// A large constant whose pages may be dropped (drop_after_copy: a read-only file mapping),
// reordered a chunk at a time along its outermost dim, each chunk's source pages dropped
// after it (MADV_DONTNEED: a later read faults them in again from the file): the peak of
// init holds one chunk of them, not the whole weight beside its copy (a 98 MB output
// projection was 94 MB of a decoder's 542 MB peak). False where it does not apply (the
// caller reorders at once): a small, strided or gapped source, or chunks that would not
// fall on the destination's blocks along that dim.
bool reorder_in_chunks(Engine& e, int id, const memory::desc& have, memory& dst) {
  const Tensor& t = e.tensors[(size_t)id];
  const Tensor& root = e.tensors[(size_t)e.root(id)];
  if (!root.drop_after_copy || root.file_fd < 0 || t.dims.empty() || !dense(t)) return false;
  int64_t item = (int64_t)itemsize(t.dtype), total = mul_c(t.numel, item, "chunks");
  if (total < 2 * kChunkBytes) return false;
  size_t d = 0;  // the outermost dim: chunks of it are contiguous byte ranges
  for (size_t k = 1; k < t.dims.size(); ++k)
    if (t.strides[k] > t.strides[d]) d = k;
  int64_t n = t.dims[d], row = t.strides[d] * item;  // dense: row bytes per index of dim d
  const memory::desc& want = dst.get_desc();
  if (want.get_format_kind() != memory::format_kind::blocked) return false;
  int64_t block = 1;
  memory::dims blks = want.get_inner_blks(), idxs = want.get_inner_idxs();
  for (size_t k = 0; k < blks.size(); ++k)
    if (idxs[k] == (int64_t)d) block *= blks[k];
  if (want.get_padded_dims()[d] != n || n % block != 0) return false;
  int64_t per = std::max<int64_t>(block, kChunkBytes / row / block * block);
  long page = sysconf(_SC_PAGESIZE);
  char* base = static_cast<char*>(e.ptr(id));
  for (int64_t first = 0; first < n; first += per) {
    int64_t count = std::min(per, n - first);
    memory::dims sub = t.dims, at(t.dims.size(), 0);
    sub[d] = count;
    at[d] = first;
    memory src(have.submemory_desc(sub, at), e.eng, base);
    memory part(want.submemory_desc(sub, at), e.eng, dst.get_data_handle());
    dnnl::reorder(src, part).execute(e.strm, src, part);
    e.strm.wait();
    // whole pages inside the chunk's bytes only (a page it shares with the next stays)
    uintptr_t lo = reinterpret_cast<uintptr_t>(base + first * row);
    uintptr_t hi = reinterpret_cast<uintptr_t>(base + (first + count) * row);
    lo = (lo + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    hi = hi / (uintptr_t)page * (uintptr_t)page;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  }
  return true;
}
}  // namespace

namespace {
constexpr size_t kHugePage = (size_t)2 << 20;
constexpr size_t kSlabFrom = (size_t)64 << 10;  // a shared slab's constants: 64 KB to 2 MB
constexpr size_t kSlab = (size_t)32 << 20;

// a private mapping of `bytes` aligned to 2 MB, its whole 2 MB pages advised into huge pages
// (before anything writes it); null where the mapping fails. Unmapped with the last owner.
std::shared_ptr<void> huge_mapping(size_t bytes) {
#if defined(MADV_HUGEPAGE)
  size_t span = 0;
  if (__builtin_add_overflow(bytes, kHugePage, &span)) return nullptr;
  void* base = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  const uintptr_t at = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage;
  void* data = reinterpret_cast<void*>(at);
  std::shared_ptr<void> owner(data, [base, span](void*) { munmap(base, span); });
  (void)madvise(data, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // a hint
  return owner;
#else
  (void)bytes;
  return nullptr;
#endif
}

// memory for a constant's copy in `want`'s layout, in transparent huge pages where Linux
// offers them: a decoder's step streams every weight once, and on 4 KB pages each page is a
// TLB miss the hardware prefetch does not run past. From 2 MB up a mapping of its own
// (huge_mapping; the tail past its last whole 2 MB page stays on 4 KB pages, so no more
// bytes become resident than the constant's); from 64 KB, a weight the program's cache
// shares (`cache`, its lock held), a piece of the cache's current 32 MB slab (a decoder's
// 768x256 projections: 786 KB each; at most one partly used 2 MB page per slab more
// resident). `owner` holds the mapping. Measured on an AMD EPYC (Zen 4, 1 thread) in the
// decode-shaped kernel's order: 400 MB 19-20 GB/s on 4 KB pages, 29-30 on 2 MB ones; a
// 768x768 weight (2.4 MB) 17-19 GB/s from oneDNN's allocation (a 2 MB page inside it or
// none), 28 aligned; 768x256 21 from oneDNN's, 30 in a slab. Other constants, or where the
// mapping fails: oneDNN's allocation. Without THP (or with it off) the pages stay 4 KB.
memory const_memory(Engine& e, const memory::desc& want, const char* what, WeightCache* cache,
                    std::shared_ptr<void>& owner) {
  const size_t bytes = want.get_size();
  if (bytes >= kHugePage) {
    owner = huge_mapping(bytes);
  } else if (bytes >= kSlabFrom && cache != nullptr) {
    size_t at = (cache->slab_used + 63) / 64 * 64;  // < kSlab + 64
    if (cache->slab == nullptr || at + bytes > kSlab) {
      cache->slab = huge_mapping(kSlab);
      at = 0;
    }
    if (cache->slab != nullptr) {
      owner = std::shared_ptr<void>(cache->slab, static_cast<char*>(cache->slab.get()) + at);
      cache->slab_used = at + bytes;
    }
  }
  if (owner == nullptr) return new_memory(e, want, what);
  e.reserve((int64_t)bytes, what);  // (past the engine's limit it fails: owner unmaps)
  return memory(want, e.eng, owner.get());
}

// constant `id` made once into `want`'s bytes by `make`, or the copy an engine of the same
// program made already: a borrowed constant's copy (even in its own layout: the blob's
// file-backed pages made the FFN matmuls of a d=512 transformer layer 1.6x slower than an
// anonymous copy) is shared through the weight cache, keyed by its bytes and both layouts
memory cached_const(Engine& e, int id, const memory::desc& have, const memory::desc& want,
                    const char* what, const std::function<void(memory&)>& make) {
  const bool borrowed = e.tensors[(size_t)e.root(id)].borrowed;
  std::unique_lock<std::mutex> lock;
  if (borrowed && e.weights != nullptr) {
    lock = std::unique_lock<std::mutex>(e.weights->mu);  // held until the new entry is in
    for (const auto& entry : e.weights->entries)
      if (entry.src == e.ptr(id) && entry.have == have && entry.want == want) {
        if (entry.owner) e.owned.push_back(entry.owner);
        return memory(want, e.eng, entry.mem.get_data_handle());
      }
  }
  std::shared_ptr<void> owner;
  memory dst = const_memory(e, want, what, borrowed ? e.weights : nullptr, owner);
  make(dst);
  if (owner) e.owned.push_back(owner);
  if (borrowed && e.weights != nullptr) {
    e.weights->entries.push_back({e.ptr(id), have, want, dst, owner});
    e.weights->bytes = add_c(e.weights->bytes, (int64_t)want.get_size(), "weight cache");
  }
  return dst;
}

void need_constant(Engine& e, int id, const char* how) {
  if (!e.tensors[(size_t)e.root(id)].is_const || e.ptr(id) == nullptr)
    fail("tensor " + std::to_string(id) + " is " + how + " at init but is not a constant");
}
}  // namespace

// a constant in the layout a primitive wants (weights, biases), made once at init
memory reorder_const(Engine& e, int id, const memory::desc& want) {
  need_constant(e, id, "reordered");
  const Tensor& t = e.tensors[(size_t)id];
  memory::desc have = t.md();
  int64_t item = (int64_t)itemsize(t.dtype);
  int64_t bytes = mul_c(e.avail(id), item, "storage");
  if (!injective(t.dims, t.strides) || md_reach_bytes(have, item) > bytes)
    fail("constant " + std::to_string(id) + ": its layout overlaps or leaves its storage");
  return cached_const(e, id, have, want, "a reordered constant", [&](memory& dst) {
    if (reorder_in_chunks(e, id, have, dst)) return;
    memory src(have, e.eng, e.ptr(id));
    dnnl::reorder(src, dst).execute(e.strm, src, dst);
    e.strm.wait();
  });
}

memory derived_const(Engine& e, int id, const memory::desc& want, const std::function<void(float*)>& fill) {
  need_constant(e, id, "transformed");
  memory::desc have = e.tensors[(size_t)id].md();
  if (want.get_dims() == have.get_dims()) fail("a transformed constant keeps its dims");  // the key
  return cached_const(e, id, have, want, "a transformed constant",
                      [&](memory& dst) { fill(static_cast<float*>(dst.get_data_handle())); });
}

}  // namespace ofc
