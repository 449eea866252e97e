// kron/v2.cu — version 2: one fused kernel for every factor, each sample's state in shared memory (the algebra,
// the versions and the napkin math: kron.cuh). Built once per dtype and block configuration, so an edit compiles one
// instantiation per build (in parallel); the planner that picks the configuration and slice width c, and fills the
// arguments, is v2_plan.cu.
// lab:variants dtype=f32,f64 cfg=0,1,2
#include "kron.cuh"

namespace kron {

// ---------------------------------------------------------------------------------------------------------------
// v2: every factor in one kernel, the state in shared memory.
// Block (b, slice) computes y[b] rows j_K in [c0, c0 + c): step 1 stages x[b] (f_K × P1) through the pipeline and
// writes the state (P1, c) = x[b]ᵀ·W_K[:, c0:c0+c] to shared memory; steps 2..K read it in place (k-major, as the
// next factor wants it) and stage only the factor; the last step writes y. c is a multiple of 4, so every state row
// is 16-byte aligned. Optionally each intermediate state is also written to global memory (for the backward).
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB) fused_kernel(const __grid_constant__ FusedArgs<T> a) {
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* As = reinterpret_cast<T*>(smem_raw);  // [2][KC][ldA]: x chunks (step 1 only)
  T* Bs = As + 2 * KC * a.ldA;             // [2][KC][ldB]: factor chunks
  T* const buf0 = Bs + 2 * KC * a.ldB;     // state buffers (the second one only for K >= 3)
  T* const buf1 = buf0 + a.buf_elems;
  const int K = a.K;
  const long N = a.N;
  const long b = blockIdx.x / a.nslices;
  const int c0 = int(blockIdx.x % a.nslices) * a.c;
  const int fK = a.f[K - 1];
  const int ccols = min(a.c, fK - c0);  // columns of W_K this slice really has
  const int P1 = int(N / fK);
  const int S = P1 * a.c;  // state elements
  auto ident = [](int p) { return p; };

  // step 1: state (P1, c) = x[b]ᵀ · W_K[:, c0 : c0 + c]
  {
    const Layout L = make_layout(THREADS, TM, TN, a.c);
    const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
    const int tiles_q = cdiv(a.c, L.bq), tiles = cdiv(P1, L.bp) * tiles_q;
    const T* xb = a.x + b * N;
    const T* wK = a.w[K - 1] + c0;
    const bool vec_w = (a.wvec >> (K - 1)) & 1u;
    for (int t = 0; t < tiles; ++t) {
      const int p0 = (t / tiles_q) * L.bp, q0 = (t % tiles_q) * L.bq;
      const PStager<T, THREADS, KC, false, int> sa(p0, P1, L.bp, P1, a.vec_x, ident);
      const PStager<T, THREADS, KC, true, int> sb(q0, ccols, L.bq, fK, vec_w, ident);
      T acc[TM][TN];
      zero(acc);
      pipeline(
          cdiv(fK, KC),
          [&](int s, int c) {
            sa.issue(As + s * KC * a.ldA, a.ldA, xb, c * KC, fK, ident);
            sb.issue(Bs + s * KC * a.ldB, a.ldB, wK, c * KC, fK, ident);
          },
          [&](int s, int c) {
            mma_chunk<T, TM, TN, KC>(As + s * KC * a.ldA, a.ldA, Bs + s * KC * a.ldB, a.ldB, min(KC, fK - c * KC),
                                     tm * VW, L.tmt * VW, tn * VW, L.tnt * VW, acc);
          });
      store_rows<true>(buf0, a.c, long(P1), a.c, long(p0), q0, acc, L, tm, tn, true);
    }
    __syncthreads();
  }

  int cur = 0;
  long T_s = 1;  // product of the factors applied after W_K so far (the j-axes after j_K in the state)
  for (int s = 1; s <= K; ++s) {
    if (s > 1) {
      // step s applies W_{K-s+1} = w[K - s] to the state (f_s, P) in buf[cur]
      const int idx = K - s, fs = a.f[idx], P = S / fs;
      const T* src = cur ? buf1 : buf0;
      const T* ws = a.w[idx];
      const bool vec_w = (a.wvec >> idx) & 1u;
      const Layout L = make_layout(THREADS, TM, TN, fs);
      const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
      const int tiles_q = cdiv(fs, L.bq), tiles = cdiv(P, L.bp) * tiles_q;
      for (int t = 0; t < tiles; ++t) {
        const int p0 = (t / tiles_q) * L.bp, q0 = (t % tiles_q) * L.bq;
        const PStager<T, THREADS, KC, true, int> sb(q0, fs, L.bq, fs, vec_w, ident);
        T acc[TM][TN];
        zero(acc);
        pipeline(
            cdiv(fs, KC), [&](int st, int c) { sb.issue(Bs + st * KC * a.ldB, a.ldB, ws, c * KC, fs, ident); },
            [&](int st, int c) {
              // A in place: rows k of the state are P apart; rows past the state's end land in the slack
              mma_chunk<T, TM, TN, KC>(src + long(c) * KC * P + p0, P, Bs + st * KC * a.ldB, a.ldB,
                                       min(KC, fs - c * KC), tm * VW, L.tmt * VW, tn * VW, L.tnt * VW, acc);
            });
        if (s < K) {
          store_rows<true>(cur ? buf0 : buf1, fs, long(P), fs, long(p0), q0, acc, L, tm, tn, fs % VW == 0);
        } else {
          // last step: row p = (j_K local, j_{K-1}, …, j_2) -> y[b][(c0 + jl)·(N/f_K) + rest·f_1 + q]
          using V = typename Vec<T>::type;
          const long R1 = N / (long(fK) * fs);
#pragma unroll
          for (int i = 0; i < TM; ++i) {
            const int p = p0 + frag_row<T>(i, L.tmt, tm);
            if (p >= P) continue;
            const int jl = int(p / R1);
            if (jl >= ccols) continue;
            T* d = a.y + b * N + long(c0 + jl) * (N / fK) + (p - jl * R1) * fs;
            if (a.vec_y) {
#pragma unroll
              for (int v = 0; v < TN / VW; ++v) {
                const int q = q0 + (v * L.tnt + tn) * VW;
                if (q < fs) st16<V>(d + q, pack<V>(&acc[i][v * VW]));
              }
            } else {
#pragma unroll
              for (int j = 0; j < TN; ++j) {
                const int q = q0 + frag_row<T>(j, L.tnt, tn);
                if (q < fs) d[q] = acc[i][j];
              }
            }
          }
        }
      }
      __syncthreads();
      cur ^= 1;
      T_s *= fs;
    }
    // the state after step s (s < K) is F_{K-s}: (i-part, j_K, j-tail) in global memory, this slice's j_K only
    if (s < K && a.save[s] != nullptr) {
      T* dst = a.save[s] + b * N;
      const T* st = cur ? buf1 : buf0;
      const long ct = long(a.c) * T_s;
      for (int e = threadIdx.x; e < S; e += THREADS) {
        const long ip = e / ct, rem = e - ip * ct;
        const long jl = rem / T_s, tt = rem - jl * T_s;
        if (jl < ccols) dst[(ip * fK + c0 + jl) * T_s + tt] = st[e];
      }
    }
  }
}

// ---- this build's configuration: occupancy and launch, for v2_plan.cu ----------------------------------------------
#if defined(LAB_VARIANT_cfg_0)
constexpr int kCfg = 0;
#elif defined(LAB_VARIANT_cfg_1)
constexpr int kCfg = 1;
#else
constexpr int kCfg = 2;
#endif
using Conf = CfgOf<Real, kCfg>::type;

// Opt the fused kernel into the device's full shared memory once (per device).
void fused_optin() {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || done[dev]) return;
  const int optin = device_facts().smem_optin;
  cudaFuncSetAttribute(fused_kernel<Real, Conf>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  done[dev] = true;
}

int fused_occupancy(size_t smem) {
  fused_optin();
  int bps = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, fused_kernel<Real, Conf>, Conf::THREADS, smem);
  return bps;
}

cudaError_t fused_launch(const FusedArgs<Real>* a, unsigned blocks, size_t smem, cudaStream_t s) {
  fused_optin();
  fused_kernel<Real, Conf><<<blocks, Conf::THREADS, smem, s>>>(*a);
  return cudaGetLastError();
}

}  // namespace kron

// ---- what v2_plan.cu calls, through the binding ("kron_v2_occupancy@f32,0", ...) -----------------------------------
LAB_EXPORTS(LAB_EXPORT("kron_v2_occupancy", kron::fused_occupancy), LAB_EXPORT("kron_v2_launch", kron::fused_launch))
