// One instruction set's vector loops — no include guard: vector_math.cpp includes this
// once per target, inside a `#pragma GCC target` region, with VM_NS (the namespace) and
// VM_BYTES (the vector width: 64, 32 or 16) defined. See vector_math.h.

namespace VM_NS {

constexpr int L = VM_BYTES / 4;     // lanes
constexpr int A = 16 / L;           // accumulators: 16 partial sums in all
typedef float fv __attribute__((vector_size(VM_BYTES)));
typedef float fvu __attribute__((vector_size(VM_BYTES), aligned(4)));
typedef int32_t iv __attribute__((vector_size(VM_BYTES)));

static inline fv load(const float* p) { return *reinterpret_cast<const fvu*>(p); }
static inline void store(float* p, fv v) { *reinterpret_cast<fvu*>(p) = v; }
static inline fv splat(float s) { return fv{} + s; }

constexpr float kLow = -104.0f, kHigh = 88.72283935546875f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

static inline float exp1(float x) {
  float xc = x < kLow ? kLow : (x > kHigh ? kHigh : x);
  xc = x != x ? 0.0f : xc;  // NaN: a finite stand-in (converting NaN to int is UB); NaN returned
  float t = xc * kLog2e + 0.5f;
  int32_t ni = static_cast<int32_t>(t);  // floor(t): truncation, one less below zero
  ni -= t < static_cast<float>(ni) ? 1 : 0;
  float n = static_cast<float>(ni);
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * (r * r) + r;
  p = p + 1.0f;
  int32_t h = ni >> 1;
  int32_t b1 = (h + 127) << 23, b2 = (ni - h + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  y = x < kLow ? 0.0f : y;
  y = x > kHigh ? __builtin_inff() : y;
  return x != x ? x : y;
}

static inline fv expv(fv x) {
  fv xc = x < kLow ? splat(kLow) : x;
  xc = xc > kHigh ? splat(kHigh) : xc;
  xc = x != x ? fv{} : xc;
  fv t = xc * kLog2e + 0.5f;
  iv ni = __builtin_convertvector(t, iv);
  ni += t < __builtin_convertvector(ni, fv);  // true is -1: floor
  fv n = __builtin_convertvector(ni, fv);
  fv r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  fv p = splat(kP0);
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * (r * r) + r;
  p = p + 1.0f;
  iv h = ni >> 1;
  fv s1 = (fv)((h + 127) << 23);
  fv s2 = (fv)((ni - h + 127) << 23);
  fv y = p * s1 * s2;
  y = x < kLow ? fv{} : y;
  y = x > kHigh ? splat(__builtin_inff()) : y;
  return x != x ? x : y;
}

// The 16 partial sums (acc[j] lane l holds sum j * L + l) added pairwise, then the tail.
static inline float total(const fv* acc) {
  float s[16];
  for (int j = 0; j < A; ++j) std::memcpy(s + j * L, &acc[j], sizeof(fv));
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) s[i] = s[i] + s[i + w];
  return s[0];
}

static float max(const float* x, int64_t n) {
  int64_t i = 0;
  float m = x[0];
  bool nan = false;
  if (n >= L) {
    fv mv = load(x);
    iv bad = mv != mv;
    for (i = L; i + L <= n; i += L) {
      fv v = load(x + i);
      mv = v > mv ? v : mv;
      bad |= v != v;
    }
    float l[L];
    int32_t b[L];
    std::memcpy(l, &mv, sizeof l);
    std::memcpy(b, &bad, sizeof b);
    for (int k = 0; k < L; ++k) {
      m = l[k] > m ? l[k] : m;
      nan = nan || b[k] != 0;
    }
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan || x[i] != x[i];
  }
  return nan ? __builtin_nanf("") : m;
}

static float exp_shifted(const float* x, float shift, float* y, int64_t n) {
  fv acc[A];
  for (int j = 0; j < A; ++j) acc[j] = fv{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < A; ++j) {
      fv e = expv(load(x + i + j * L) - shift);
      store(y + i + j * L, e);
      acc[j] += e;
    }
  float s = total(acc);
  for (; i < n; ++i) {
    y[i] = exp1(x[i] - shift);
    s += y[i];
  }
  return s;
}

static float sum(const float* x, int64_t n) {
  fv acc[A];
  for (int j = 0; j < A; ++j) acc[j] = fv{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < A; ++j) acc[j] += load(x + i + j * L);
  float s = total(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

static float sum_sq_centered(const float* x, float c, int64_t n) {
  fv acc[A];
  for (int j = 0; j < A; ++j) acc[j] = fv{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < A; ++j) {
      fv d = load(x + i + j * L) - c;
      acc[j] += d * d;
    }
  float s = total(acc);
  for (; i < n; ++i) {
    float d = x[i] - c;
    s += d * d;
  }
  return s;
}

}  // namespace VM_NS
