// sparse24/cpu.cpp — the C++ CPU version of the sparse24 family (version 0): the compression of a 2:4 weight into
// the lab's format (sparse24.cuh says what it is) and y = x·Wᵀ + b from it, on plain pointers, no torch headers. Rows
// of W run in parallel on torch's thread pool (lab::parallel_for); each output is a dot product over the kept values
// only (half the multiplies of the dense one), accumulated in float.
#include <cstdint>
#include <limits>

#include "lab_half.h"
#include "lab_unit.h"

namespace {

int64_t padded_k(int64_t K) { return lab::ceil_div(K, 32) * 32; }

// The first group (row-major: n·Kp/4 + group) with more than 2 nonzeros, or -1. Groups with fewer keep zeros at their
// lowest free positions (compress.cu's rule: the nibble is always one of the six valid ones).
template <class T>
int64_t compress_cpu(const T* w, T* values, int32_t* meta, int64_t N, int64_t K) {
  const int64_t Kp = padded_k(K), groups = Kp / 4;
  int64_t first_bad = std::numeric_limits<int64_t>::max();
  for (int64_t n = 0; n < N; ++n) {
    const T* row = w + n * K;
    T* vrow = values + n * (Kp / 2);
    int32_t* mrow = meta + n * (Kp / 32);
    for (int64_t g = 0; g < groups; ++g) {
      float v[4];
      int nz[4], count = 0;
      for (int i = 0; i < 4; ++i) {
        const int64_t c = 4 * g + i;
        v[i] = c < K ? float(row[c]) : 0.f;
        if (v[i] != 0.f) nz[count++] = i;   // NaN counts as nonzero
      }
      if (count > 2 && n * groups + g < first_bad) first_bad = n * groups + g;
      int i0 = 0, i1 = 1;
      if (count >= 2) { i0 = nz[0]; i1 = nz[1]; }
      else if (count == 1) { i0 = nz[0] == 3 ? 2 : nz[0]; i1 = nz[0] == 3 ? 3 : nz[0] + 1; }
      vrow[2 * g] = v[i0];
      vrow[2 * g + 1] = v[i1];
      const int shift = int(4 * (g % 8));
      const uint32_t word = g % 8 == 0 ? 0u : uint32_t(mrow[g / 8]);
      mrow[g / 8] = int32_t(word | (uint32_t(i0 | (i1 << 2)) << shift));
    }
  }
  return first_bad == std::numeric_limits<int64_t>::max() ? -1 : first_bad;
}

template <class T>
void linear_cpu(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int64_t M, int64_t N, int64_t K) {
  const int64_t Kp = padded_k(K);
  lab::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* vrow = values + n * (Kp / 2);
      const int32_t* mrow = meta + n * (Kp / 32);
      for (int64_t m = 0; m < M; ++m) {
        const T* xr = x + m * K;
        float acc = b ? float(b[n]) : 0.f;
        for (int64_t g = 0; g < Kp / 4; ++g) {
          const uint32_t nib = (uint32_t(mrow[g / 8]) >> (4 * (g % 8))) & 0xfu;
          const int64_t c0 = 4 * g + (nib & 3), c1 = 4 * g + (nib >> 2);
          if (c0 < K) acc += float(vrow[2 * g]) * float(xr[c0]);     // columns past K are padding (zeros)
          if (c1 < K) acc += float(vrow[2 * g + 1]) * float(xr[c1]);
        }
        y[m * N + n] = acc;
      }
    }
  });
}

}  // namespace

LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("compress_cpu_bf16", compress_cpu<lab::BFloat16>),
            LAB_EXPORT("compress_cpu_f16", compress_cpu<lab::Half>),
            LAB_EXPORT("linear_cpu_bf16", linear_cpu<lab::BFloat16>),
            LAB_EXPORT("linear_cpu_f16", linear_cpu<lab::Half>))
