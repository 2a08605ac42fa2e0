// Memory planning for a delegate's intermediates: one arena, each intermediate at an offset
// that no other intermediate uses while it is live.
//
// An intermediate (storage OWNED, not a constant) gets no memory when it is added; at
// finalize, every op's declared reads and writes (Op::run_reads, run_writes) are walked in
// execution order (an alias counts for its root): an intermediate is live from the first
// op that touches it to the last. Offsets come from a best-fit allocator replayed in that
// order (a tensor's block is taken at its first op and given back after its last), so two
// intermediates share bytes only when no op sees both live. Intervals are inclusive: an op's inputs and outputs never overlap.
//
// An intermediate some op reads before any op writes it (nothing in a lowered plan does;
// a hostile blob may) keeps its own zeroed memory, as before planning: it must not see a
// neighbour's bytes. Work is O(tensors + operands) plus O(log n) per allocation; the arena
// is counted against the delegate's memory limit before it is allocated.
#include <map>

#include "engine.h"

namespace ofc {

namespace {
constexpr int64_t kAlign = 64;

// best fit over free blocks: by size for the search, by offset for merging neighbours
struct FreeBlocks {
  std::map<int64_t, int64_t> by_offset;             // offset -> size
  std::multimap<int64_t, int64_t> by_size;          // size -> offset
  int64_t end = 0;                                  // the arena's size so far

  int64_t take(int64_t size) {
    auto it = by_size.lower_bound(size);
    if (it == by_size.end()) {  // grow the arena, from a free block ending at its end if any
      if (!by_offset.empty()) {
        auto last = std::prev(by_offset.end());
        if (last->first + last->second == end) {
          int64_t offset = last->first;
          drop(last->first, last->second);
          end = add_c(offset, size, "intermediates");
          return offset;
        }
      }
      int64_t offset = end;
      end = add_c(end, size, "intermediates");
      return offset;
    }
    int64_t block = it->first, offset = it->second;
    drop(offset, block);
    if (block > size) put(offset + size, block - size);
    return offset;
  }

  void give_back(int64_t offset, int64_t size) {
    auto next = by_offset.lower_bound(offset);
    if (next != by_offset.end() && offset + size == next->first) {
      int64_t n = next->second;
      drop(next->first, n);
      size += n;
    }
    auto after = by_offset.lower_bound(offset);
    if (after != by_offset.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == offset) {
        int64_t p = prev->first, n = prev->second;
        drop(p, n);
        offset = p;
        size += n;
      }
    }
    put(offset, size);
  }

  void put(int64_t offset, int64_t size) {
    by_offset.emplace(offset, size);
    by_size.emplace(size, offset);
  }
  void drop(int64_t offset, int64_t size) {
    by_offset.erase(offset);
    auto range = by_size.equal_range(size);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == offset) { by_size.erase(it); return; }
  }
};
}  // namespace

void plan_intermediates(Engine& e) {
  size_t n = e.tensors.size();
  std::vector<int64_t> first(n, -1), last(n, -1);
  std::vector<char> read_first(n, 0);
  auto planned = [&](size_t r) {
    const Tensor& t = e.tensors[r];
    return t.storage == OWNED && !t.is_const && t.base < 0 && t.data == nullptr && t.span > 0;
  };
  auto touch = [&](int id, int64_t i, bool write) {
    size_t r = (size_t)e.root(id);
    if (!planned(r)) return;
    if (first[r] < 0) {
      first[r] = i;
      read_first[r] = !write;
    }
    last[r] = i;
  };
  std::vector<int> reads, writes;
  for (size_t i = 0; i < e.ops.size(); ++i) {
    const Op& op = *e.ops[i];
    reads.clear();
    writes.clear();
    op.run_reads(reads);
    op.run_writes(writes);
    // reads first: an op that reads what it is the first to write reads unwritten bytes
    // (a read of what the op also writes, a DnnlOp's destination, counts as the write)
    for (int id : reads) {
      bool is_out = false;
      for (int o : writes) is_out = is_out || e.root(o) == e.root(id);
      if (!is_out) touch(id, (int64_t)i, false);
    }
    for (int id : writes) touch(id, (int64_t)i, true);
  }
  // replay: allocate at each tensor's first op, give back after its last
  std::vector<std::vector<size_t>> starts(e.ops.size()), ends(e.ops.size());
  std::vector<int64_t> bytes(n, 0), offset(n, -1);
  int64_t unplanned = 0, total = 0;
  for (size_t r = 0; r < n; ++r) {
    if (!planned(r)) continue;
    const Tensor& t = e.tensors[r];
    int64_t b = mul_c(t.span, (int64_t)itemsize(t.dtype), "intermediate");
    b = mul_c((add_c(b, kAlign - 1, "intermediate")) / kAlign, kAlign, "intermediate");
    if (first[r] < 0 || read_first[r]) {  // never used, or read before written: its own memory
      if (first[r] >= 0) unplanned = add_c(unplanned, b, "intermediate");
      bytes[r] = -b;
      continue;
    }
    bytes[r] = b;
    total = add_c(total, b, "intermediates");
    starts[(size_t)first[r]].push_back(r);
    ends[(size_t)last[r]].push_back(r);
  }
  // (OPFORGE_CPU_CHECK_READS=1: nothing given back, each intermediate in its own bytes,
  // noted to be poisoned after its last op: core.cpp's poison_dead)
  FreeBlocks blocks;
  if (e.check_reads) e.dead.assign(e.ops.size(), {});
  for (size_t i = 0; i < e.ops.size(); ++i) {
    for (size_t r : starts[i]) offset[r] = blocks.take(bytes[r]);
    for (size_t r : ends[i])
      if (e.check_reads) e.dead[i].push_back((int)r);
      else blocks.give_back(offset[r], bytes[r]);
  }
  e.reserve(add_c(blocks.end, kAlign, "intermediates"), "the intermediates' arena");
  e.arena.assign((size_t)blocks.end + kAlign, 0);
  uintptr_t base = (reinterpret_cast<uintptr_t>(e.arena.data()) + kAlign - 1) & ~uintptr_t(kAlign - 1);
  for (size_t r = 0; r < n; ++r) {
    Tensor& t = e.tensors[r];
    if (offset[r] >= 0) {
      t.data = reinterpret_cast<void*>(base + (uintptr_t)offset[r]);
    } else if (t.storage == OWNED && !t.is_const && t.base < 0 && t.data == nullptr && t.span == 0) {
      t.data = reinterpret_cast<void*>(base);  // no elements: any address it never reads
    } else if (bytes[r] < 0 && first[r] >= 0) {  // read before written: zeroed, alone
      e.reserve(add_c(-bytes[r], kAlign, "intermediate"), "an intermediate");
      t.store.assign((size_t)(-bytes[r] + kAlign), 0);
      t.data = reinterpret_cast<void*>(
          (reinterpret_cast<uintptr_t>(t.store.data()) + kAlign - 1) & ~uintptr_t(kAlign - 1));
    }
  }
  e.arena_bytes = blocks.end;
  e.unplanned_bytes = unplanned;
  e.intermediate_bytes = total;
}

}  // namespace ofc
