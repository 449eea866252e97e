// kron/cpu.cpp — the C++ CPU version of the Kronecker layer (version 0): the same steps as the CUDA code (the algebra:
// the header of cuda_src/kron/kron.cuh), on plain pointers, no torch headers; its own unit, so editing it rebuilds this
// file alone. Loops run on torch's thread pool through lab::parallel_for.
//   forward   F-step  y[b] (P, f) = x[b]ᵀ (f, P)ᵀ · W          — for W_K, …, W_1 in turn
//   backward  dW_k = Σ_b F_k[b] · dF_{k-1}[b];  dF_k[b] = W_k · dF_{k-1}[b]ᵀ;  dx = dF_K
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lab_unit.h"

namespace {

constexpr int64_t kRows = 64;    // CPU: rows of a sample per task (64·f values of y stay in cache across the k loop)
using lab::ceil_div;

// ---- CPU version ------------------------------------------------------------------------------------------------
// The tasks of both steps: kRows of the `rows` rows of one sample (of B), task t = (sample, block of rows), on the
// thread pool one or more tasks at a time; body(b, r0, r1) does rows [r0, r1) of sample b.
template <class Body>
void for_row_blocks(int64_t B, int64_t rows, const Body& body) {
  const int64_t nblk = ceil_div(rows, kRows);
  lab::parallel_for(0, B * nblk, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t / nblk, r0 = (t % nblk) * kRows, r1 = std::min(rows, r0 + kRows);
      body(b, r0, r1);
    }
  });
}

// F-step: y[b][p][j] = Σ_i x[b][i][p]·W[i][j]. Per task: kRows rows of one sample; the i-loop streams x's row i and
// W's row i while the task's block of y stays in cache; the inner j-loop is a contiguous axpy (vectorised).
template <class T>
void fstep_cpu(const T* x, const T* w, T* y, int64_t B, int64_t N, int64_t f) {
  const int64_t P = N / f;
  for_row_blocks(B, P, [&](int64_t b, int64_t p0, int64_t p1) {
    const T* xb = x + b * N;
    T* yb = y + b * N;
    std::fill(yb + p0 * f, yb + p1 * f, T(0));
    for (int64_t i = 0; i < f; ++i) {
      const T* wi = w + i * f;
      const T* xi = xb + i * P;
      for (int64_t p = p0; p < p1; ++p) {
        const T a = xi[p];
        T* yp = yb + p * f;
        for (int64_t j = 0; j < f; ++j) yp[j] += a * wi[j];
      }
    }
  });
}

// R-step: out[b][i][m] = Σ_j W[i][j]·d[b][m][j] (a dot product of two contiguous rows per output).
template <class T>
void rstep_cpu(const T* d, const T* w, T* out, int64_t B, int64_t N, int64_t f) {
  const int64_t M = N / f;
  for_row_blocks(B, M, [&](int64_t b, int64_t m0, int64_t m1) {
    for (int64_t i = 0; i < f; ++i) {
      const T* wi = w + i * f;
      T* o = out + b * N + i * M;
      for (int64_t m = m0; m < m1; ++m) {
        const T* dm = d + b * N + m * f;
        T s = 0;
        for (int64_t j = 0; j < f; ++j) s += wi[j] * dm[j];
        o[m] = s;
      }
    }
  });
}

// dW[i][j] = Σ_b Σ_m F[b][i][m]·D[b][m][j]; one task per row i of dW, summed in a fixed order (deterministic).
template <class T>
void dw_cpu(const T* F, const T* D, T* dw, int64_t B, int64_t N, int64_t f) {
  const int64_t M = N / f;
  lab::parallel_for(0, f, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      T* o = dw + i * f;
      std::fill(o, o + f, T(0));
      for (int64_t b = 0; b < B; ++b) {
        const T* Fi = F + b * N + i * M;
        const T* Db = D + b * N;
        for (int64_t m = 0; m < M; ++m) {
          const T a = Fi[m];
          const T* dm = Db + m * f;
          for (int64_t j = 0; j < f; ++j) o[j] += a * dm[j];
        }
      }
    }
  });
}

template <class T>
void forward_cpu(const T* x, T* y, const T* const* w, const int* f, int K, int64_t B, int64_t N,
                 T* const* states) {
  std::vector<T> scratch(!states && K > 1 ? size_t(std::min(K - 1, 2)) * B * N : 0);
  const T* src = x;
  for (int st = 1; st <= K; ++st) {
    const int idx = K - st;  // step st applies W_{K-st+1}
    T* dst = st == K ? y : (states ? states[K - st - 1] : scratch.data() + ((st - 1) & 1) * B * N);
    fstep_cpu(src, w[idx], dst, B, N, f[idx]);
    src = dst;
  }
}

template <class T>
void backward_cpu(const T* g, const T* x, const T* const* w, const int* f, int K, int64_t B, int64_t N,
                  const T* const* states, T* dx, T* const* dws) {
  std::vector<T> buf(size_t(std::min(K - 1, 2)) * B * N);
  T* dF[2] = {buf.data(), buf.data() + (K >= 3 ? B * N : 0)};
  for (int k = 1; k <= K; ++k) {
    const T* D = k == 1 ? g : dF[(k - 2) & 1];
    const T* Fk = k == K ? x : states[k - 1];
    dw_cpu(Fk, D, dws[k - 1], B, N, f[k - 1]);
    rstep_cpu(D, w[k - 1], k == K ? dx : dF[(k - 1) & 1], B, N, f[k - 1]);
  }
}

}  // namespace

// kron_cpu_forward_f32: void (const T* x, T* y, const T* const* w, const int* f, int K, int64_t B, int64_t N,
//                             T* const* states /* null: none */)
// kron_cpu_backward_f32: void (const T* g, const T* x, const T* const* w, const int* f, int K, int64_t B, int64_t N,
//                              const T* const* states, T* dx, T* const* dws)
LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("kron_cpu_forward_f32", forward_cpu<float>),
            LAB_EXPORT("kron_cpu_forward_f64", forward_cpu<double>),
            LAB_EXPORT("kron_cpu_backward_f32", backward_cpu<float>),
            LAB_EXPORT("kron_cpu_backward_f64", backward_cpu<double>))
