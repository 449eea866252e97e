// linear/cpu.cpp — the C++ CPU version of the linear family (version 0): plain pointers, no torch headers, its own
// unit, so editing it rebuilds this file alone. The tiles run on torch's thread pool through lab::parallel_for.
#include <algorithm>
#include <cstdint>

#include "lab_unit.h"

namespace {

using lab::ceil_div;

// ---- the C++ CPU version ----------------------------------------------------------------------------------------
// y[m, n] = b[n] + sum_k x[m, k]·w[n, k]. Both operands are K-contiguous, so the natural inner loop is a dot
// product; a float reduction does not auto-vectorise (that would reorder the sum), so each dot product keeps 8
// partial sums in one vector, one per lane, reduced once at the end (GCC vector extensions: AVX on x86, lowered to
// what the target has elsewhere). The micro-kernel computes a 2x4 block of y from 8 accumulator vectors: each x
// chunk it loads feeds 4 FMAs, each W chunk 2 (6 loads per 8 FMAs).
// Cache blocking: parallel over 64x64 tiles of y; inside a tile K is swept in chunks of 512 (x and W slabs of
// 64 x 512 x 4 B = 128 KB each, L2-resident while the 2x4 micro-tiles sweep them).
constexpr int64_t kMR = 2, kNR = 4, kTileM = 64, kTileN = 64, kKc = 512;
typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// One binary, the widest vectors the CPU has: an AVX2+FMA clone and a baseline (SSE2) clone, picked when the module
// loads; fp-contract lets the AVX2 clone fuse each multiply-add (ISO C++ mode turns contraction off).
#define LAB_CPU_CLONES __attribute__((target_clones("arch=haswell", "default"), optimize("fp-contract=fast")))
#else
#define LAB_CPU_CLONES
#endif
#define LAB_LOAD8(v, p) __builtin_memcpy(&(v), (p), sizeof(v8f))

// acc[r·4 + c] += dot(x_r[0:kc], w_c[0:kc]) for the full 2x4 micro-tile.
LAB_CPU_CLONES void micro_2x4(const float* x0, const float* x1, const float* w0, const float* w1, const float* w2,
                              const float* w3, int64_t kc, float* acc) {
  v8f s00{}, s01{}, s02{}, s03{}, s10{}, s11{}, s12{}, s13{}, a0, a1, b;
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    LAB_LOAD8(a0, x0 + k);
    LAB_LOAD8(a1, x1 + k);
    LAB_LOAD8(b, w0 + k); s00 += a0 * b; s10 += a1 * b;
    LAB_LOAD8(b, w1 + k); s01 += a0 * b; s11 += a1 * b;
    LAB_LOAD8(b, w2 + k); s02 += a0 * b; s12 += a1 * b;
    LAB_LOAD8(b, w3 + k); s03 += a0 * b; s13 += a1 * b;
  }
  const v8f* s[kMR][kNR] = {{&s00, &s01, &s02, &s03}, {&s10, &s11, &s12, &s13}};
  const float* xs[kMR] = {x0, x1};
  const float* ws[kNR] = {w0, w1, w2, w3};
  for (int r = 0; r < kMR; ++r)
    for (int c = 0; c < kNR; ++c) {
      float t = 0.f;
      for (int l = 0; l < 8; ++l) t += (*s[r][c])[l];
      for (int64_t kk = k; kk < kc; ++kk) t += xs[r][kk] * ws[c][kk];
      acc[r * kNR + c] += t;
    }
}

// One dot product (the edges of a tile, where a full 2x4 micro-tile does not fit).
LAB_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  v8f s{}, va, vb;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    LAB_LOAD8(va, a + k);
    LAB_LOAD8(vb, b + k);
    s += va * vb;
  }
  float t = 0.f;
  for (int l = 0; l < 8; ++l) t += s[l];
  for (; k < n; ++k) t += a[k] * b[k];
  return t;
}

void linear_cpu(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t tiles_m = ceil_div(M, kTileM), tiles_n = ceil_div(N, kTileN);
  lab::parallel_for(0, tiles_m * tiles_n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = (t / tiles_n) * kTileM, m1 = std::min(M, m0 + kTileM);
      const int64_t n0 = (t % tiles_n) * kTileN, n1 = std::min(N, n0 + kTileN);
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t n = n0; n < n1; ++n) y[m * N + n] = b ? b[n] : 0.f;
      for (int64_t k0 = 0; k0 < K; k0 += kKc) {
        const int64_t kc = std::min(kKc, K - k0);
        for (int64_t m = m0; m < m1; m += kMR) {
          for (int64_t n = n0; n < n1; n += kNR) {
            if (m + kMR <= m1 && n + kNR <= n1) {
              float acc[kMR * kNR] = {};
              const float* xr = x + m * K + k0;
              const float* wr = w + n * K + k0;
              micro_2x4(xr, xr + K, wr, wr + K, wr + 2 * K, wr + 3 * K, kc, acc);
              for (int r = 0; r < kMR; ++r)
                for (int c = 0; c < kNR; ++c) y[(m + r) * N + n + c] += acc[r * kNR + c];
            } else {
              for (int64_t r = m; r < std::min(m + kMR, m1); ++r)
                for (int64_t c = n; c < std::min(n + kNR, n1); ++c)
                  y[r * N + c] += dot(x + r * K + k0, w + c * K + k0, kc);
            }
          }
        }
      }
    }
  });
}

}  // namespace

LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("linear_cpu", linear_cpu))
