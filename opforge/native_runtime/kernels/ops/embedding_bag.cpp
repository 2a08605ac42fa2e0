// _embedding_bag: sums, means or maxima of bags of embedding rows, with the auxiliary outs
// ATen's CPU kernel writes (embedding_bag_out in opforge/kernels/portable/indexing.py is
// the specification: bags from offsets, padding_idx rows skipped and not counted, empty
// bags zero, sums left to right in the accumulate dtype, max keeping the first maximum,
// a NaN in a bag's first row staying).
#include <cmath>
#include <vector>

#include "copy.h"
#include "portable.h"
#include "tensor.h"

namespace opforge::portable {
namespace {

constexpr int64_t kSum = 0, kMean = 1, kMax = 2;

// An auxiliary out: `values` when out holds that many, else zeros.
void fill_aux(const View& out, const std::vector<int64_t>* values) {
  int64_t k = 0;
  bool use = values && out.numel == static_cast<int64_t>(values->size());
  for_each_element(out, out, [&](char* p, char*, const int64_t*) {
    store_scalar(p, out.dtype, 0, use ? (*values)[k++] : 0, true);
  });
}

struct Bags {
  const View* weight;
  const View* indices;
  const View* psw;  // null: none
  std::vector<int64_t> starts;
  int64_t num_bags, mode, padding_idx;
};

// NumPy's pairwise sum (what np.add.reduceat adds a bag's rows after its first with):
// sequential below 8 values, 8 interleaved partial sums up to 128, halves above.
template <typename CT>
CT pairwise(const CT* a, int64_t n) {
  if (n < 8) {
    CT res = CT(0);
    for (int64_t i = 0; i < n; ++i) res = res + a[i];
    return res;
  }
  if (n <= 128) {
    CT r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j) r[j] = r[j] + a[i + j];
    CT res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res = res + a[i];
    return res;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return pairwise(a, half) + pairwise(a + half, n - half);
}

template <typename CT>
void run_bags(const Bags& g, const View& out0, std::vector<int64_t>* counts,
              std::vector<int64_t>* max_words) {
  const View& w = *g.weight;
  const View& idx = *g.indices;
  int64_t n = idx.numel, D = w.sizes[1], witem = itemsize(w.dtype);
  int64_t nstarts = static_cast<int64_t>(g.starts.size());
  std::vector<CT> acc(static_cast<size_t>(D)), first(static_cast<size_t>(D));
  std::vector<int64_t> at(static_cast<size_t>(D));
  std::vector<CT> column;  // a bag's values in one column, for the pairwise sum
  int64_t oitem = itemsize(out0.dtype);
  for (int64_t b = 0; b < g.num_bags; ++b) {
    int64_t from = b < nstarts ? g.starts[b] : n, to = b + 1 < nstarts ? g.starts[b + 1] : n;
    int64_t count = 0;
    for (int64_t i = from; i < to; ++i) {
      int64_t word = read_index(idx.data + i * idx.strides[0] * itemsize(idx.dtype), idx.dtype);
      if (g.padding_idx >= 0 && word == g.padding_idx) continue;
      for (int64_t j = 0; g.mode == kMax && j < D; ++j) {  // sums: column by column below
        CT v = static_cast<CT>(load_double(w.data + (word * w.strides[0] + j * w.strides[1]) * witem, w.dtype));
        if (count == 0) {
          acc[j] = first[j] = v, at[j] = word;
        } else if (std::isnan(acc[j]) ? !std::isnan(v) : (!std::isnan(v) && v > acc[j])) {
          acc[j] = v, at[j] = word;  // fmax; the first row reaching the peak wins
        }
      }
      ++count;
    }
    (*counts)[b] = count;
    if (g.mode != kMax && count) {
      // the first row plus the pairwise sum of the others (np.add.reduceat's order)
      for (int64_t j = 0; j < D; ++j) {
        column.clear();
        for (int64_t i = from; i < to; ++i) {
          int64_t word = read_index(idx.data + i * idx.strides[0] * itemsize(idx.dtype), idx.dtype);
          if (g.padding_idx >= 0 && word == g.padding_idx) continue;
          CT v = static_cast<CT>(load_double(w.data + (word * w.strides[0] + j * w.strides[1]) * witem, w.dtype));
          if (g.psw) v = v * static_cast<CT>(load_double(g.psw->data + i * g.psw->strides[0] * itemsize(g.psw->dtype), g.psw->dtype));
          column.push_back(v);
        }
        acc[j] = column[0] + pairwise(column.data() + 1, count - 1);
      }
    }
    char* row = out0.data + b * out0.strides[0] * oitem;
    for (int64_t j = 0; j < D; ++j) {
      CT r = CT(0);
      int64_t mw = 0;
      if (count && g.mode == kMax) {
        bool nan_first = std::isnan(first[j]);
        r = nan_first ? first[j] : acc[j];
        mw = std::isnan(r) ? -1 : at[j];
      } else if (count) {
        r = g.mode == kMean ? acc[j] / static_cast<CT>(count) : acc[j];
      }
      store_double(row + j * out0.strides[1] * oitem, out0.dtype, static_cast<double>(r));
      if (max_words) (*max_words)[b * D + j] = mw;
    }
    // a NaN peak points at the bag's first kept row
    if (max_words && count) {
      int64_t first_word = -1;
      for (int64_t i = from; i < to && first_word < 0; ++i) {
        int64_t word = read_index(idx.data + i * idx.strides[0] * itemsize(idx.dtype), idx.dtype);
        if (!(g.padding_idx >= 0 && word == g.padding_idx)) first_word = word;
      }
      for (int64_t j = 0; j < D; ++j)
        if ((*max_words)[b * D + j] == -1) (*max_words)[b * D + j] = first_word;
    }
  }
}

void embedding_bag_out(opforge_context* ctx, opforge_arg* args, int64_t n) {
  static const char kOp[] = "aten::_embedding_bag.out";
  OPF_TENSOR(0, "weight", weight);
  OPF_TENSOR(1, "indices", indices);
  OPF_TENSOR(2, "offsets", offsets);
  OPF_INT(4, "mode", mode);
  View psw;
  bool has_psw;
  if (!optional_tensor_arg(ctx, args, n, 6, kOp, "per_sample_weights", &psw, &has_psw)) return;
  OPF_INT(8, "padding_idx", padding_idx);
  OPF_TENSOR(9, "out0", out0);
  OPF_TENSOR(10, "out1", out1);
  OPF_TENSOR(11, "out2", out2);
  OPF_TENSOR(12, "out3", out3);
  if (mode != kSum && mode != kMean && mode != kMax) {
    fail(ctx, "%s: mode=%lld — is not an EmbeddingBag mode — valid: 0 (sum), 1 (mean), 2 (max) "
         "— pass one of these", kOp, (long long)mode);
    return;
  }
  if (weight.rank != 2 || indices.rank != 1 || offsets.rank != 1 || out0.rank != 2 ||
      out0.sizes[1] != weight.sizes[1] || !index_dtype(indices.dtype) || !index_dtype(offsets.dtype) ||
      (weight.dtype != kFloat32 && weight.dtype != kFloat64 && weight.dtype != kFloat16) ||
      (has_psw && (psw.rank != 1 || psw.numel != indices.numel || !convertible(psw.dtype))) ||
      !convertible(out0.dtype) || !is_integral(out1.dtype, false) || !is_integral(out2.dtype, false) ||
      !is_integral(out3.dtype, false)) {
    fail(ctx, "%s: arguments — found weight rank %d (%s), indices rank %d, offsets rank %d, out0 "
         "rank %d — valid: a 2-d float weight, 1-d integer indices and offsets (and "
         "per_sample_weights), out0 (bags, embedding dim), integer auxiliary outs — re-export the "
         "program", kOp, weight.rank, dtype_name(weight.dtype), indices.rank, offsets.rank, out0.rank);
    return;
  }
  Bags g;
  g.weight = &weight, g.indices = &indices, g.psw = has_psw ? &psw : nullptr;
  g.num_bags = out0.sizes[0], g.mode = mode, g.padding_idx = padding_idx;
  int64_t count = indices.numel, nstarts = offsets.numel < g.num_bags ? offsets.numel : g.num_bags;
  for (int64_t b = 0; b < nstarts; ++b)
    g.starts.push_back(read_index(offsets.data + b * offsets.strides[0] * itemsize(offsets.dtype), offsets.dtype));
  bool ok = nstarts == 0 || g.starts[0] == 0;
  for (int64_t b = 1; ok && b < nstarts; ++b) ok = g.starts[b] >= g.starts[b - 1];
  if (!ok || (nstarts && g.starts[nstarts - 1] > count)) {
    fail(ctx, "%s: offsets — found %lld offsets for %lld indices, not non-decreasing from 0 up to "
         "%lld — valid: non-decreasing, starting at 0, at most %lld — check the bag offsets", kOp,
         (long long)nstarts, (long long)count, (long long)count, (long long)count);
    return;
  }
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t i = 0; i < count; ++i) {
    int64_t v = read_index(indices.data + i * indices.strides[0] * itemsize(indices.dtype), indices.dtype);
    lo = v < lo ? v : lo, hi = v > hi ? v : hi;
  }
  if (count && (lo < 0 || hi >= weight.sizes[0])) {
    fail(ctx, "%s: index — found values in [%lld, %lld] — valid: [0, %lld] for a dimension of size "
         "%lld — check the indices against the tensor's shape", kOp, (long long)lo, (long long)hi,
         (long long)(weight.sizes[0] - 1), (long long)weight.sizes[0]);
    return;
  }
  std::vector<int64_t> counts(static_cast<size_t>(g.num_bags)), bag(static_cast<size_t>(count));
  std::vector<int64_t> max_words(mode == kMax ? static_cast<size_t>(out0.numel) : 0);
  for (int64_t i = 0, b = -1; i < count; ++i) {  // the last bag whose start is <= i
    while (b + 1 < nstarts && g.starts[b + 1] <= i) ++b;
    bag[i] = b;
  }
  if (weight.dtype == kFloat64) run_bags<double>(g, out0, &counts, mode == kMax ? &max_words : nullptr);
  else run_bags<float>(g, out0, &counts, mode == kMax ? &max_words : nullptr);
  fill_aux(out1, &bag);
  fill_aux(out2, mode != kSum ? &counts : nullptr);
  fill_aux(out3, mode == kMax ? &max_words : mode == kMean ? &counts : nullptr);
}

const KernelDef kEmbeddingBagKernels[] = {
    {"aten::_embedding_bag.out", "T T T B I B T? B I T! T! T! T!", embedding_bag_out},
};

}  // namespace
}  // namespace opforge::portable

OPFORGE_PORTABLE_FAMILY(embedding_bag, kEmbeddingBagKernels)
