// One instruction set's GEMM — no include guard: gemm.cpp includes this once per target, inside a
// `#pragma GCC target` region, with these defined:
//   GEMM_NS        the namespace of this copy (avx512, avx2, generic)
//   GEMM_VBYTES    the vector width in bytes (64, 32, 16)
//   GEMM_MR_F / GEMM_MR_D   rows of the float / double microkernel
// The microkernel's tile is MR rows by NR = 2 vectors of columns; see gemm.cpp.

namespace GEMM_NS {

typedef float vf __attribute__((vector_size(GEMM_VBYTES)));
typedef float vf_u __attribute__((vector_size(GEMM_VBYTES), aligned(4)));
typedef double vd __attribute__((vector_size(GEMM_VBYTES)));
typedef double vd_u __attribute__((vector_size(GEMM_VBYTES), aligned(8)));

template <typename T> struct Arch;
template <> struct Arch<float> {
  using V = vf;
  using VU = vf_u;
  static constexpr int kLanes = GEMM_VBYTES / 4;
  static constexpr int kMR = GEMM_MR_F;
  static constexpr int kNR = 2 * kLanes;
  static constexpr int64_t kKC = 256, kMC = 16 * GEMM_MR_F, kNC = 2048;
};
template <> struct Arch<double> {
  using V = vd;
  using VU = vd_u;
  static constexpr int kLanes = GEMM_VBYTES / 8;
  static constexpr int kMR = GEMM_MR_D;
  static constexpr int kNR = 2 * kLanes;
  static constexpr int64_t kKC = 256, kMC = 16 * GEMM_MR_D, kNC = 1024;
};

template <typename T>
static inline typename Arch<T>::V load(const T* p) {
  return *reinterpret_cast<const typename Arch<T>::VU*>(p);
}
template <typename T>
static inline void store(T* p, typename Arch<T>::V v) {
  *reinterpret_cast<typename Arch<T>::VU*>(p) = v;
}
template <typename T>
static inline typename Arch<T>::V splat(T s) {
  return typename Arch<T>::V{} + s;
}

// The microkernel: an MR x NR tile of C from kc steps of packed A (MR values a step) and
// packed B (NR values a step), accumulated in 2*MR vector registers. A full tile of a
// row-contiguous C is read and written with vector loads, and so are the rows of a tile
// with fewer rows (mr < MR) but whole; a narrower edge tile (nr < NR) or a strided C goes
// through a local tile. The same sums stored either way.
template <typename T>
static void micro(int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c,
                  int64_t rsc, int64_t csc, int mr, int nr, bool accumulate) {
  using A = Arch<T>;
  using V = typename A::V;
  constexpr int MR = A::kMR, L = A::kLanes;
  V acc0[MR], acc1[MR];
  for (int i = 0; i < MR; ++i) acc0[i] = acc1[i] = V{};
  for (int64_t p = 0; p < kc; ++p) {
    V b0 = *reinterpret_cast<const V*>(bp);
    V b1 = *reinterpret_cast<const V*>(bp + L);
    for (int i = 0; i < MR; ++i) {
      V ai = splat<T>(ap[i]);
      acc0[i] += ai * b0;
      acc1[i] += ai * b1;
    }
    ap += MR;
    bp += 2 * L;
  }
  // Whole rows of a row-contiguous C: called with the constant MR for a full tile (the loop
  // unrolled) or with mr (a short prompt's m).
  auto store_rows = [&](int rows) {
    for (int i = 0; i < rows; ++i) {
      T* row = c + i * rsc;
      if (accumulate) {
        store<T>(row, load<T>(row) + acc0[i]);
        store<T>(row + L, load<T>(row + L) + acc1[i]);
      } else {
        store<T>(row, acc0[i]);
        store<T>(row + L, acc1[i]);
      }
    }
  };
  if (nr == 2 * L && csc == 1) {
    if (mr == MR) {
      store_rows(MR);
    } else {
      store_rows(mr);
    }
    return;
  }
  alignas(64) T tile[MR][2 * L];
  for (int i = 0; i < MR; ++i) {
    store<T>(tile[i], acc0[i]);
    store<T>(tile[i] + L, acc1[i]);
  }
  for (int i = 0; i < mr; ++i) {
    T* row = c + i * rsc;
    if (csc == 1 && !accumulate) {
      for (int j = 0; j < nr; ++j) row[j] = tile[i][j];
    } else if (csc == 1) {
      for (int j = 0; j < nr; ++j) row[j] = row[j] + tile[i][j];
    } else {
      for (int j = 0; j < nr; ++j) {
        T* dst = row + j * csc;
        *dst = accumulate ? *dst + tile[i][j] : tile[i][j];
      }
    }
  }
}

// Pack rows [0, mc) x depth [0, kc) of A into MR-row strips, each step MR values (zero
// past the last row).
template <typename T>
static void pack_a(int64_t mc, int64_t kc, const T* a, int64_t rsa, int64_t csa, T* out) {
  constexpr int MR = Arch<T>::kMR;
  for (int64_t i0 = 0; i0 < mc; i0 += MR) {
    int rows = static_cast<int>(mc - i0 < MR ? mc - i0 : MR);
    const T* base = a + i0 * rsa;
    if (csa == 1) {
      for (int64_t p = 0; p < kc; ++p) {
        for (int i = 0; i < rows; ++i) out[p * MR + i] = base[i * rsa + p];
        for (int i = rows; i < MR; ++i) out[p * MR + i] = T(0);
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const T* col = base + p * csa;
        for (int i = 0; i < rows; ++i) out[p * MR + i] = col[i * rsa];
        for (int i = rows; i < MR; ++i) out[p * MR + i] = T(0);
      }
    }
    out += kc * MR;
  }
}

// An 8 x 8 block transposed through registers: dst[p * ld_dst + j] = src[j * ld_src + p]
// (8 vector loads, 24 shuffles, 8 vector stores; a transposed B's columns become rows of
// the packed strip). GCC's __builtin_shuffle: a generic permutation of two vectors.
template <typename T>
static inline void transpose8(const T* src, int64_t ld_src, T* dst, int64_t ld_dst) {
  typedef T t8 __attribute__((vector_size(8 * sizeof(T))));
  typedef T t8u __attribute__((vector_size(8 * sizeof(T)), aligned(sizeof(T))));
  typedef typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type I;
  typedef I m8 __attribute__((vector_size(8 * sizeof(T))));
  t8 r[8], a[8], c[8];
  for (int j = 0; j < 8; ++j) r[j] = *reinterpret_cast<const t8u*>(src + j * ld_src);
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = __builtin_shuffle(r[2 * k], r[2 * k + 1], m8{0, 8, 1, 9, 2, 10, 3, 11});
    a[2 * k + 1] = __builtin_shuffle(r[2 * k], r[2 * k + 1], m8{4, 12, 5, 13, 6, 14, 7, 15});
  }
  // a[0]: rows 0-1 at p 0..3, a[1]: rows 0-1 at p 4..7, a[2]/a[3]: rows 2-3, ...
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 2; ++g) {
      c[4 * g + 2 * h] = __builtin_shuffle(a[4 * g + h], a[4 * g + 2 + h], m8{0, 1, 8, 9, 2, 3, 10, 11});
      c[4 * g + 2 * h + 1] = __builtin_shuffle(a[4 * g + h], a[4 * g + 2 + h], m8{4, 5, 12, 13, 6, 7, 14, 15});
    }
  // c[2h + q] (g = 0: rows 0-3; c[4 + 2h + q]: rows 4-7) holds p = 4h + 2q and 4h + 2q + 1
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 2; ++q) {
      t8 lo = c[2 * h + q], hi = c[4 + 2 * h + q];
      int p = 4 * h + 2 * q;
      *reinterpret_cast<t8u*>(dst + p * ld_dst) = __builtin_shuffle(lo, hi, m8{0, 1, 2, 3, 8, 9, 10, 11});
      *reinterpret_cast<t8u*>(dst + (p + 1) * ld_dst) = __builtin_shuffle(lo, hi, m8{4, 5, 6, 7, 12, 13, 14, 15});
    }
}

// Pack depth [0, kc) x columns [0, nc) of B into NR-column strips (zero past the last).
template <typename T>
static void pack_b(int64_t kc, int64_t nc, const T* b, int64_t rsb, int64_t csb, T* out) {
  constexpr int NR = Arch<T>::kNR, L = Arch<T>::kLanes;
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    int cols = static_cast<int>(nc - j0 < NR ? nc - j0 : NR);
    const T* base = b + j0 * csb;
    if (csb == 1 && cols == NR) {
      for (int64_t p = 0; p < kc; ++p) {
        const T* row = base + p * rsb;
        store<T>(out + p * NR, load<T>(row));
        store<T>(out + p * NR + L, load<T>(row + L));
      }
    } else if (rsb == 1 && cols == NR) {  // B is a transposed view: columns contiguous
      int64_t p0 = 0;
      for (; p0 + 8 <= kc; p0 += 8)
        for (int j = 0; j < NR; j += 8) transpose8<T>(base + j * csb + p0, csb, out + p0 * NR + j, NR);
      for (; p0 < kc; ++p0)
        for (int j = 0; j < NR; ++j) out[p0 * NR + j] = base[j * csb + p0];
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        for (int j = 0; j < cols; ++j) out[p * NR + j] = base[p * rsb + j * csb];
        for (int j = cols; j < NR; ++j) out[p * NR + j] = T(0);
      }
    }
    out += kc * NR;
  }
}

// Few rows, row-contiguous B (a decoder's one-token step, 1x768x3072; a small batch):
// packing B would copy all of it to use it once, so B streams through in its own order,
// KB of its rows at a time, each added (times a broadcast of A) into C's rows, which stay
// in L1/L2; C is read and written once per KB rows of B.
template <typename T, int ROWS>
static void rows_by_b(int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b,
                      int64_t rsb, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  using V = typename Arch<T>::V;
  constexpr int L = Arch<T>::kLanes, KB = 8;
  int64_t nv = csc == 1 ? n / L * L : 0;  // columns done with vectors
  for (int64_t p0 = 0; p0 < k; p0 += KB) {
    int kb = static_cast<int>(k - p0 < KB ? k - p0 : KB);
    bool first = p0 == 0 && !accumulate;
    T as[ROWS][KB];
    for (int i = 0; i < ROWS; ++i)
      for (int q = 0; q < KB; ++q) as[i][q] = q < kb ? a[i * rsa + (p0 + q) * csa] : T(0);
    const T* bp = b + p0 * rsb;
    if (kb == KB) {
      V av[ROWS][KB];
      for (int i = 0; i < ROWS; ++i)
        for (int q = 0; q < KB; ++q) av[i][q] = splat<T>(as[i][q]);
      for (int64_t j = 0; j < nv; j += L) {
        V bv[KB];
        for (int q = 0; q < KB; ++q) bv[q] = load<T>(bp + q * rsb + j);
        for (int i = 0; i < ROWS; ++i) {
          V s = first ? V{} : load<T>(c + i * rsc + j);
          for (int q = 0; q < KB; ++q) s += av[i][q] * bv[q];
          store<T>(c + i * rsc + j, s);
        }
      }
    } else {
      for (int64_t j = 0; j < nv; ++j)
        for (int i = 0; i < ROWS; ++i) {
          T s = first ? T(0) : c[i * rsc + j];
          for (int q = 0; q < kb; ++q) s += as[i][q] * bp[q * rsb + j];
          c[i * rsc + j] = s;
        }
    }
    for (int64_t j = nv; j < n; ++j)
      for (int i = 0; i < ROWS; ++i) {
        T* dst = c + i * rsc + j * csc;
        T s = first ? T(0) : *dst;
        for (int q = 0; q < kb; ++q) s += as[i][q] * bp[q * rsb + j];
        *dst = s;
      }
  }
}

// Few rows, B a transposed view of a row-major weight (linear's W^T, W n x k) and A rows
// contiguous: every output is a dot product of two contiguous rows; 4 columns at a time
// share each load of A.
template <typename T, int ROWS>
static void rows_dot_cols(int64_t n, int64_t k, const T* a, int64_t rsa, const T* b,
                          int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  using V = typename Arch<T>::V;
  constexpr int L = Arch<T>::kLanes, NC = 4;
  int64_t j = 0;
  for (; j < n; j += NC) {
    int cols = static_cast<int>(n - j < NC ? n - j : NC);
    const T* w[NC];
    for (int q = 0; q < NC; ++q) w[q] = b + (j + (q < cols ? q : 0)) * csb;
    V acc[ROWS][NC];
    for (int i = 0; i < ROWS; ++i)
      for (int q = 0; q < NC; ++q) acc[i][q] = V{};
    int64_t p = 0;
    for (; p + L <= k; p += L) {
      V wv[NC];
      for (int q = 0; q < NC; ++q) wv[q] = load<T>(w[q] + p);
      for (int i = 0; i < ROWS; ++i) {
        V av = load<T>(a + i * rsa + p);
        for (int q = 0; q < NC; ++q) acc[i][q] += av * wv[q];
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int q = 0; q < cols; ++q) {
        alignas(64) T lanes[L];
        store<T>(lanes, acc[i][q]);
        T sum = T(0);
        for (int l = 0; l < L; ++l) sum += lanes[l];
        for (int64_t r = p; r < k; ++r) sum += a[i * rsa + r] * w[q][r];
        T* dst = c + i * rsc + (j + q) * csc;
        *dst = accumulate ? *dst + sum : sum;
      }
  }
}

template <typename T, int ROWS>
static void small_m(int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b,
                    int64_t rsb, int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  if (csb == 1)
    rows_by_b<T, ROWS>(n, k, a, rsa, csa, b, rsb, c, rsc, csc, accumulate);
  else
    rows_dot_cols<T, ROWS>(n, k, a, rsa, b, csb, c, rsc, csc, accumulate);
}

// Rows of A at a time for the few-rows paths (at most 4: each keeps ROWS x NV vectors).
template <typename T>
static void few_rows(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa,
                     const T* b, int64_t rsb, int64_t csb, T* c, int64_t rsc, int64_t csc,
                     bool accumulate) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    small_m<T, 4>(n, k, a + i * rsa, rsa, csa, b, rsb, csb, c + i * rsc, rsc, csc, accumulate);
  switch (m - i) {
    case 3: small_m<T, 3>(n, k, a + i * rsa, rsa, csa, b, rsb, csb, c + i * rsc, rsc, csc, accumulate); break;
    case 2: small_m<T, 2>(n, k, a + i * rsa, rsa, csa, b, rsb, csb, c + i * rsc, rsc, csc, accumulate); break;
    case 1: small_m<T, 1>(n, k, a + i * rsa, rsa, csa, b, rsb, csb, c + i * rsc, rsc, csc, accumulate); break;
    default: break;
  }
}

// The blocked product (BLIS's loop order): columns in NC blocks, depth in KC blocks (B's
// KC x NC panel packed once, kept in L2/L3), rows in MC blocks (A's MC x KC block packed,
// kept in L2), then NR x MR microtiles whose B strip stays in L1. Only the first depth
// block writes C (unless accumulating): later ones add to it. bpack and apack hold
// blocked_workspace() bytes. Each element of C is summed the same way whatever block of
// rows or columns it falls in, so gemm.cpp may split a product into blocks of rows (at
// MR) or columns (at NR) across threads and get the same bits.
template <typename T>
static void blocked(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa,
                    const T* b, int64_t rsb, int64_t csb, T* c, int64_t rsc, int64_t csc,
                    bool accumulate, T* bpack, T* apack) {
  using A = Arch<T>;
  constexpr int MR = A::kMR, NR = A::kNR;
  for (int64_t jc = 0; jc < n; jc += A::kNC) {
    int64_t nc = n - jc < A::kNC ? n - jc : A::kNC;
    for (int64_t pc = 0; pc < k; pc += A::kKC) {
      int64_t kc = k - pc < A::kKC ? k - pc : A::kKC;
      bool add = accumulate || pc > 0;
      pack_b<T>(kc, nc, b + pc * rsb + jc * csb, rsb, csb, bpack);
      for (int64_t ic = 0; ic < m; ic += A::kMC) {
        int64_t mc = m - ic < A::kMC ? m - ic : A::kMC;
        pack_a<T>(mc, kc, a + ic * rsa + pc * csa, rsa, csa, apack);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          int nr = static_cast<int>(nc - jr < NR ? nc - jr : NR);
          const T* bp = bpack + (jr / NR) * kc * NR;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int mr = static_cast<int>(mc - ir < MR ? mc - ir : MR);
            micro<T>(kc, apack + (ir / MR) * kc * MR, bp,
                     c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc, mr, nr, add);
          }
        }
      }
    }
  }
}

// Elements of B's panel (*b_elems) and of A's block (*a_elems) blocked() packs for an
// m x n x k product (each fits int64: at most KC x NC and KC x MC).
template <typename T>
static void blocked_workspace(int64_t m, int64_t n, int64_t k, int64_t* b_elems, int64_t* a_elems) {
  using A = Arch<T>;
  constexpr int MR = A::kMR, NR = A::kNR;
  int64_t kc_max = k < A::kKC ? k : A::kKC;
  int64_t nc_max = n < A::kNC ? ((n + NR - 1) / NR) * NR : A::kNC;
  int64_t mc_max = m < A::kMC ? ((m + MR - 1) / MR) * MR : A::kMC;
  *b_elems = kc_max * nc_max;
  *a_elems = kc_max * mc_max;
}

// This copy's entry points, for gemm.cpp's driver.
template <typename T>
static GemmKernels<T> kernels() {
  return {few_rows<T>, blocked<T>, blocked_workspace<T>, Arch<T>::kMR, Arch<T>::kNR};
}

}  // namespace GEMM_NS
