// kron/v1.cu — version 1's forward: one F-step kernel per factor (the algebra, the versions and the napkin math:
// kron.cuh). Version 4 runs this forward where its fused kernel does not fit, and for K = 1.
// lab:variants dtype=f32,f64
#include "kron.cuh"

namespace kron {

// ---------------------------------------------------------------------------------------------------------------
// v1 forward: one F-step over the whole batch. Rows r = (b, p) flattened over B·P; y[r·f + j] = Σ_i x[b][i][p]·W[i][j]
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    fstep_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, long rows, int P, long N, int f,
                 int tiles_q, bool vec_x, bool vec_w, bool vec_y) {
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n, LD = kTile + VW;
  __shared__ __align__(16) T As[2][KC][LD];
  __shared__ __align__(16) T Bs[2][KC][LD];
  const Layout L = make_layout(THREADS, TM, TN, f);
  const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
  const long p0 = long(blockIdx.x / tiles_q) * L.bp;
  const int q0 = int(blockIdx.x % tiles_q) * L.bq;
  auto xoff = [P, N](long r) { return (r / P) * N + r % P; };  // (b, p) -> offset of x[b][0][p]
  auto woff = [](long q) { return q; };
  const PStager<T, THREADS, KC> sa(p0, rows, L.bp, P, vec_x, xoff);
  const PStager<T, THREADS, KC, true> sb(q0, f, L.bq, f, vec_w, woff);
  T acc[TM][TN];
  zero(acc);
  pipeline(
      cdiv(f, KC),
      [&](int s, int c) {
        sa.issue(&As[s][0][0], LD, x, c * KC, f, xoff);
        sb.issue(&Bs[s][0][0], LD, w, c * KC, f, woff);
      },
      [&](int s, int c) {
        mma_chunk<T, TM, TN, KC>(&As[s][0][0], LD, &Bs[s][0][0], LD, min(KC, f - c * KC), tm * VW, L.tmt * VW,
                                 tn * VW, L.tnt * VW, acc);
      });
  store_rows(y, f, rows, f, p0, q0, acc, L, tm, tn, vec_y);
}

// ---- host side: the F-step's configuration (pick_cfg, kron.cuh) and launch -----------------------------------------
template <class T, class C>
cudaError_t launch_fstep(const T* x, const T* w, T* y, long B, long N, int f, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  const StepGrid g = step_grid<C>(B, N, f);  // P = g.m rows of a sample
  if (!g.fits()) return cudaErrorInvalidConfiguration;
  const bool vec_x = g.m % VW == 0 && N % VW == 0 && aligned16(x);
  const bool vec_w = f % VW == 0 && aligned16(w);
  const bool vec_y = f % VW == 0 && aligned16(y);
  fstep_kernel<T, C><<<unsigned(g.blocks), C::THREADS, 0, s>>>(x, w, y, g.rows, g.m, N, f, g.tiles_q, vec_x, vec_w,
                                                                vec_y);
  return cudaGetLastError();
}

template <class T>
cudaError_t fstep(const T* x, const T* w, T* y, long B, long N, int f, int cfg, cudaStream_t s) {
  if (cfg < 0) cfg = pick_cfg<T>(B * (N / f), f, device_facts().sms);
  switch (cfg) {
    case 0: return launch_fstep<T, typename CfgOf<T, 0>::type>(x, w, y, B, N, f, s);
    case 1: return launch_fstep<T, typename CfgOf<T, 1>::type>(x, w, y, B, N, f, s);
    default: return launch_fstep<T, typename CfgOf<T, 2>::type>(x, w, y, B, N, f, s);
  }
}

// ---- forward driver -----------------------------------------------------------------------------------------------
// version 1: one F-step per factor (intermediates in `states` when given, else in scratch: forward_scratch());
// version 2: the fused kernel (states saved when given), or version 1 where it does not fit / K = 1. The fused
// kernel is v2.cu's; the binding asks its plan and calls this forward for version 2 only where it does not fit.
template <class T>
cudaError_t forward(int version, const T* x, T* y, const T* const* w, const int* f, int K, long B, long N,
                    T* const* states, T* scratch, int cfg, cudaStream_t s) {
  if (B == 0 || N == 0) return cudaSuccess;
  const T* src = x;
  for (int st = 1; st <= K; ++st) {
    const int idx = K - st;  // W_{K-st+1}
    T* dst = st == K ? y : (states ? states[K - st - 1] : scratch + long((st - 1) & 1) * padded(B * N));
    cudaError_t e = fstep(src, w[idx], dst, B, N, f[idx], version == 1 ? cfg : -1, s);
    if (e != cudaSuccess) return e;
    src = dst;
  }
  return cudaSuccess;
}

inline long forward_scratch(long B, long N, int K) { return long(std::min(K - 1, 2)) * padded(B * N); }

}  // namespace kron

// ---- the launchers cpp_src/kron/kron.cpp calls ("kron_v1_forward@f32", ...) -----------------------------------------
//   kron_v1_forward: cudaError_t (int version, const T* x, T* y, const T* const* w, const int* f, int K, int64_t B,
//                                 int64_t N, T* const* states, T* scratch, int cfg, cudaStream_t)
//   kron_forward_scratch: int64_t (int64_t B, int64_t N, int K)
LAB_EXPORTS(LAB_EXPORT("kron_v1_forward", kron::forward<kron::Real>),
            LAB_EXPORT("kron_forward_scratch", kron::forward_scratch))
