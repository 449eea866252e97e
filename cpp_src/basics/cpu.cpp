// basics/cpu.cpp — the C++ CPU versions of the basics family (version 0): plain pointers, no torch headers, its own
// unit, so editing it rebuilds this file alone. Loops run on torch's thread pool through lab::parallel_for.
#include <algorithm>
#include <cstdint>

#include "lab_unit.h"

namespace {

constexpr int kRadius = 3;
constexpr int64_t kGrain = 1 << 15;  // elements per parallel_for task: big enough to amortise the task hand-off

template <class T>
void square_cpu(const T* x, T* y, int64_t n) {
  lab::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] * x[i];  // vectorised by the compiler at -O3
  });
}

template <class T>
void add_cpu(const T* a, const T* b, T* c, int64_t n) {
  lab::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) c[i] = a[i] + b[i];
  });
}

template <class T>
void stencil_cpu(const T* x, T* y, int64_t n) {
  lab::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      T s = 0;
      for (int j = -kRadius; j <= kRadius; ++j) {
        int64_t k = i + j;
        if (k >= 0 && k < n) s += x[k];
      }
      y[i] = s;
    }
  });
}

// C = A @ B, row-major. Rows are split across threads; inside, an i-k-j order streams rows of B and C so the
// inner loop is a contiguous axpy the compiler vectorises; K is blocked so a slab of B stays in cache while a
// thread's rows are swept over it (kc=256 rows of B x 512 columns x 4 B = 512 KB, about one L2).
template <class T>
void matmul_cpu(const T* A, const T* B, T* C, int64_t M, int64_t N, int64_t K) {
  constexpr int64_t kc = 256, nc = 512;
  lab::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * N + j] = 0;
    for (int64_t j0 = 0; j0 < N; j0 += nc) {
      const int64_t j1 = std::min(N, j0 + nc);
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t k1 = std::min(K, k0 + kc);
        for (int64_t i = r0; i < r1; ++i) {
          T* c = C + i * N;
          for (int64_t k = k0; k < k1; ++k) {
            const T a = A[i * K + k];
            const T* b = B + k * N;
            for (int64_t j = j0; j < j1; ++j) c[j] += a * b[j];
          }
        }
      }
    }
  });
}

}  // namespace

LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("square_cpu_f32", square_cpu<float>), LAB_EXPORT("square_cpu_f64", square_cpu<double>),
            LAB_EXPORT("vector_add_cpu_f32", add_cpu<float>), LAB_EXPORT("vector_add_cpu_f64", add_cpu<double>),
            LAB_EXPORT("stencil_1d_cpu_f32", stencil_cpu<float>),
            LAB_EXPORT("stencil_1d_cpu_f64", stencil_cpu<double>),
            LAB_EXPORT("matmul_cpu_f32", matmul_cpu<float>), LAB_EXPORT("matmul_cpu_f64", matmul_cpu<double>))
