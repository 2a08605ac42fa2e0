// The next token from a row of logits, as opforge.runtime.sampling.Sampler picks it:
// greedy (argmax, the first index on ties, the first NaN if any, as numpy.argmax), or
// temperature sampling among the top-k logits with numpy.random.default_rng(seed).
//
// Seeded sampling gives Python's tokens because the generator is NumPy's own, rebuilt
// from its published algorithms (written here from their descriptions, nothing copied):
//   - SeedSequence(seed): the seed's 32-bit words hashed into a pool of four words
//     (hashmix/mix with NumPy's constants), then generate_state(4, uint64);
//   - PCG64 (XSL-RR 128/64) seeded with state = words 0-1, increment = words 2-3;
//   - Generator.random(): (next_uint64 >> 11) * 2^-53;
//   - Generator.choice(n, p=w/sum(w)): cdf = cumsum(p); cdf /= cdf[-1]; the index is
//     searchsorted(cdf, random(), side='right').
// The weights are exp(x / T - max) in float64 as in sampling.py; NumPy's vectorized exp and
// pairwise sum may round a weight one ulp apart from libm's exp here, which changes a token
// only when the uniform draw falls within ~1e-16 of a cumulative boundary. Top-k ties at
// the k-th largest logit are broken by index here (lowest first), by numpy.argpartition's
// introselect in Python: the candidate sets differ only on such ties.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace opforge::tools {

// numpy.random.SeedSequence(seed).generate_state(n_words, uint64) for one integer seed.
inline std::vector<uint64_t> seed_sequence_state(uint64_t seed, int n_words) {
  const uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u, kInitB = 0x8b51f9ddu,
                 kMultB = 0x58f38dedu, kMixL = 0xca01f9ddu, kMixR = 0x4973f715u;
  const int kShift = 16, kPool = 4;
  std::vector<uint32_t> entropy;  // the seed's 32-bit words, least significant first
  do {
    entropy.push_back((uint32_t)(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed != 0);
  uint32_t hash_const = kInitA;
  auto hashmix = [&](uint32_t value) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    value ^= value >> kShift;
    return value;
  };
  auto mix = [&](uint32_t x, uint32_t y) {
    uint32_t result = kMixL * x - kMixR * y;
    return result ^ (result >> kShift);
  };
  uint32_t pool[kPool];
  for (int i = 0; i < kPool; ++i) pool[i] = hashmix(i < (int)entropy.size() ? entropy[(size_t)i] : 0u);
  for (int src = 0; src < kPool; ++src)
    for (int dst = 0; dst < kPool; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (size_t src = kPool; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPool; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  uint32_t out_const = kInitB;
  std::vector<uint32_t> words((size_t)n_words * 2);
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t value = pool[i % kPool];
    value ^= out_const;
    out_const *= kMultB;
    value *= out_const;
    value ^= value >> kShift;
    words[i] = value;
  }
  std::vector<uint64_t> state((size_t)n_words);  // pairs of words, little-endian
  for (size_t i = 0; i < state.size(); ++i) state[i] = (uint64_t)words[2 * i] | ((uint64_t)words[2 * i + 1] << 32);
  return state;
}

// NumPy's PCG64 bit generator (128-bit LCG, XSL-RR output).
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed) {
    std::vector<uint64_t> s = seed_sequence_state(seed, 4);
    unsigned __int128 initstate = ((unsigned __int128)s[0] << 64) | s[1];
    unsigned __int128 initseq = ((unsigned __int128)s[2] << 64) | s[3];
    state_ = 0;
    inc_ = (initseq << 1) | 1u;
    step();
    state_ += initstate;
    step();
  }
  uint64_t next_uint64() {
    step();
    uint64_t high = (uint64_t)(state_ >> 64), low = (uint64_t)state_;
    unsigned rot = (unsigned)(state_ >> 122);
    uint64_t x = high ^ low;
    return (x >> rot) | (x << ((64u - rot) & 63u));
  }
  double next_double() { return (double)(next_uint64() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  void step() {
    const unsigned __int128 kMult = ((unsigned __int128)0x2360ed051fc65da4ull << 64) | 0x4385df649fccf645ull;
    state_ = state_ * kMult + inc_;
  }
  unsigned __int128 state_ = 0, inc_ = 0;
};

// NumPy's pairwise float64 sum (blocks of 8 accumulators up to 128 values, halves above).
inline double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += a[i];
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + (size_t)j];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) s += a[i];
    return s;
  }
  size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

class Sampler {
 public:
  // top_k <= 0: the whole vocabulary. A seed < 0 is refused by the caller.
  Sampler(double temperature, int64_t top_k, uint64_t seed)
      : temperature_(temperature), top_k_(top_k), rng_(seed) {}

  bool greedy() const { return temperature_ == 0.0 || top_k_ == 1; }

  // -1: non-finite weights (NaN logits), which Python refuses with a GenerationError.
  int64_t choose(const std::vector<double>& logits) {
    int64_t n = (int64_t)logits.size();
    if (greedy()) {
      int64_t best = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(logits[(size_t)i])) return i;
        if (logits[(size_t)i] > logits[(size_t)best]) best = i;
      }
      return best;
    }
    std::vector<int64_t> candidates((size_t)n);
    std::iota(candidates.begin(), candidates.end(), 0);
    if (top_k_ > 0 && top_k_ < n) {
      std::partial_sort(candidates.begin(), candidates.begin() + top_k_, candidates.end(),
                        [&](int64_t a, int64_t b) {
                          double x = logits[(size_t)a], y = logits[(size_t)b];
                          return x != y ? x > y : a < b;
                        });
      candidates.resize((size_t)top_k_);
      std::sort(candidates.begin(), candidates.end());
    }
    size_t m = candidates.size();
    std::vector<double> w(m);
    double top = -INFINITY;
    bool nan = false;
    for (size_t i = 0; i < m; ++i) {
      w[i] = logits[(size_t)candidates[i]] / temperature_;
      nan = nan || std::isnan(w[i]);
      top = std::max(top, w[i]);
    }
    for (size_t i = 0; i < m; ++i) w[i] = std::exp(w[i] - top);
    double total = pairwise_sum(w.data(), m);
    if (nan || !std::isfinite(total) || !(total > 0.0)) return -1;
    std::vector<double> cdf(m);
    double running = 0.0;
    for (size_t i = 0; i < m; ++i) cdf[i] = running += w[i] / total;
    double last = cdf[m - 1];
    for (double& c : cdf) c /= last;
    double u = rng_.next_double();
    size_t index = (size_t)(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    return candidates[std::min(index, m - 1)];
  }

 private:
  double temperature_;
  int64_t top_k_;
  Pcg64 rng_;
};

}  // namespace opforge::tools
