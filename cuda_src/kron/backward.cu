// kron/backward.cu — the backward of versions 1 and 2: per factor an R-step kernel (dx) and a split-K dW kernel,
// then one reduce launch for every dW (the algebra: kron.cuh). v2 runs it on the states its fused kernel saved.
// lab:variants dtype=f32,f64
#include "kron.cuh"

namespace kron {

// ---------------------------------------------------------------------------------------------------------------
// Backward R-step: out[b][i][m] = Σ_j W[i][j]·d[b][m][j]. Rows p = (b, m) flattened over B·M, columns i.
// Both operands are contiguous in the contracted index j, so both are transposed while staged.
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    rstep_kernel(const T* __restrict__ d, const T* __restrict__ w, T* __restrict__ out, long rows, int M, long N,
                 int f, int tiles_q, bool vec_out) {
  using V = typename Vec<T>::type;
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n, LD = kTile + VW;
  __shared__ __align__(16) T As[2][KC][LD];
  __shared__ __align__(16) T Bs[2][KC][LD];
  const Layout L = make_layout(THREADS, TM, TN, f);
  const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
  const long p0 = long(blockIdx.x / tiles_q) * L.bp;
  const int q0 = int(blockIdx.x % tiles_q) * L.bq;
  auto row = [f](long p) { return p * f; };
  T acc[TM][TN];
  zero(acc);
  pipeline(
      cdiv(f, KC),
      [&](int s, int c) {
        stage_kcontig<T, THREADS, KC>(&As[s][0][0], LD, d, row, c * KC, f, p0, rows, L.bp);
        stage_kcontig<T, THREADS, KC>(&Bs[s][0][0], LD, w, row, c * KC, f, long(q0), long(f), L.bq);
      },
      [&](int s, int c) {
        mma_chunk<T, TM, TN, KC>(&As[s][0][0], LD, &Bs[s][0][0], LD, min(KC, f - c * KC), tm * VW, L.tmt * VW,
                                 tn * VW, L.tnt * VW, acc);
      });
  // transposed store: a VW-run of rows p..p+VW-1 is VW consecutive m of one sample when vec_out (M % VW == 0)
#pragma unroll
  for (int v = 0; v < TM / VW; ++v) {
    const long pv = p0 + long(v * L.tmt + tm) * VW;
    if (vec_out) {
      if (pv >= rows) continue;
      const long b = pv / M, m = pv % M;
      T* o = out + b * N + m;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int q = q0 + frag_row<T>(j, L.tnt, tn);
        if (q >= f) continue;
        T tmp[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) tmp[e] = acc[v * VW + e][j];
        st16<V>(o + long(q) * M, pack<V>(tmp));
      }
    } else {
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const long p = pv + e;
        if (p >= rows) continue;
        const long b = p / M, m = p % M;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const int q = q0 + frag_row<T>(j, L.tnt, tn);
          if (q < f) out[b * N + long(q) * M + m] = acc[v * VW + e][j];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward dW, split-K over the batch: partial[z][i][j] = Σ_{(b, m) in split z} F[b][i][m]·D[b][m][j].
// The contraction runs over chunks (b, m0..m0+KC) that never straddle a sample; split z owns a contiguous range of
// them. The partials are summed in a fixed order by reduce_kernel: the result does not depend on scheduling.
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    dw_kernel(const T* __restrict__ F, const T* __restrict__ D, T* __restrict__ part, int M, long N, int f,
              int tiles_q, int tiles, int splits, long total_chunks, bool vec_d, bool vec_part) {
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n, LD = kTile + VW;
  __shared__ __align__(16) T As[2][KC][LD];
  __shared__ __align__(16) T Bs[2][KC][LD];
  const Layout L = make_layout(THREADS, TM, TN, f);
  const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
  const int z = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const long p0 = long(tile / tiles_q) * L.bp;
  const int q0 = (tile % tiles_q) * L.bq;
  const int nkc = cdiv(M, KC);
  const long t0 = total_chunks * z / splits, t1 = total_chunks * (z + 1) / splits;
  auto frow = [M](long i) { return i * M; };
  auto doff = [](long q) { return q; };
  const PStager<T, THREADS, KC> sb(q0, f, L.bq, f, vec_d, doff);
  T acc[TM][TN];
  zero(acc);
  pipeline(
      int(t1 - t0),
      [&](int s, int c) {
        const long t = t0 + c;
        const long b = t / nkc;
        const int k0 = int(t % nkc) * KC;
        stage_kcontig<T, THREADS, KC>(&As[s][0][0], LD, F + b * N, frow, k0, M, p0, long(f), L.bp);
        sb.issue(&Bs[s][0][0], LD, D + b * N, k0, M, doff);
      },
      [&](int s, int c) {
        const int k0 = int((t0 + c) % nkc) * KC;
        mma_chunk<T, TM, TN, KC>(&As[s][0][0], LD, &Bs[s][0][0], LD, min(KC, M - k0), tm * VW, L.tmt * VW, tn * VW,
                                 L.tnt * VW, acc);
      });
  store_rows(part + long(z) * f * f, f, long(f), f, p0, q0, acc, L, tm, tn, vec_part);
}

template <class T> struct ReduceArgs {
  const T* part[kMaxFactors];
  T* out[kMaxFactors];
  int ff[kMaxFactors];      // f_k², elements of dW_k
  int splits[kMaxFactors];
  int K;
};

// dW_k[e] = Σ_z part_k[z][e], z in order. grid.y = factor.
template <class T>
__global__ void reduce_kernel(const __grid_constant__ ReduceArgs<T> a) {
  const int k = blockIdx.y;
  const int ff = a.ff[k], splits = a.splits[k];
  const T* part = a.part[k];
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < ff; e += gridDim.x * blockDim.x) {
    T s = T(0);
    for (int z = 0; z < splits; ++z) s += part[long(z) * ff + e];
    a.out[k][e] = s;
  }
}

template <class T, class C>
cudaError_t launch_rstep(const T* d, const T* w, T* out, long B, long N, int f, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  const StepGrid g = step_grid<C>(B, N, f);  // M = g.m rows of a sample
  if (!g.fits()) return cudaErrorInvalidConfiguration;
  const bool vec_out = g.m % VW == 0 && N % VW == 0 && aligned16(out);
  rstep_kernel<T, C><<<unsigned(g.blocks), C::THREADS, 0, s>>>(d, w, out, g.rows, g.m, N, f, g.tiles_q, vec_out);
  return cudaGetLastError();
}

template <class T>
cudaError_t rstep(const T* d, const T* w, T* out, long B, long N, int f, cudaStream_t s) {
  const int cfg = pick_cfg<T>(B * (N / f), f, device_facts().sms, false);
  return cfg == 0 ? launch_rstep<T, typename CfgOf<T, 0>::type>(d, w, out, B, N, f, s)
                  : launch_rstep<T, typename CfgOf<T, 2>::type>(d, w, out, B, N, f, s);
}

// dW split: enough (tile, split) blocks for two waves, each split at least 4 chunks long.
inline int dw_cfg(int f) { return f >= 96 ? 0 : 2; }
template <class T> inline int dw_splits(long B, long N, int f, int sms) {
  const CfgShape cs = cfg_shape<T>(dw_cfg(f));
  const Layout L = make_layout(cs.threads, cs.tm, cs.tn, f);
  const long tiles = long(cdiv(f, L.bp)) * cdiv(f, L.bq);
  const long total = B * cdiv(int(N / f), chunk_k<T>());
  long splits = (2L * sms + tiles - 1) / tiles;
  splits = std::min(splits, std::max(1L, total / 4));
  splits = std::min(splits, 1024L);
  return int(std::max(1L, splits));
}

template <class T, class C>
cudaError_t launch_dw(const T* F, const T* D, T* part, long B, long N, int f, int splits, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  const Layout L = make_layout(C::THREADS, C::TM, C::TN, f);
  const int M = int(N / f);
  const int tiles_q = cdiv(f, L.bq), tiles = cdiv(f, L.bp) * tiles_q;
  const long total = B * cdiv(M, chunk_k<T>());
  const bool vec_d = f % VW == 0 && N % VW == 0 && aligned16(D);
  const bool vec_part = f % VW == 0 && aligned16(part);
  dw_kernel<T, C><<<unsigned(long(tiles) * splits), C::THREADS, 0, s>>>(F, D, part, M, N, f, tiles_q, tiles, splits,
                                                                         total, vec_d, vec_part);
  return cudaGetLastError();
}

// ---- backward driver ----------------------------------------------------------------------------------------------
// Workspace (elements) for backward: dF ping-pong buffers (K-1 of them, at most 2) + the dW partials.
template <class T> long backward_workspace(long B, long N, const int* f, int K) {
  const int sms = device_facts().sms;
  long n = long(std::min(K - 1, 2)) * padded(B * N);
  for (int k = 0; k < K; ++k) n += padded(long(dw_splits<T>(B, N, f[k], sms)) * f[k] * f[k]);
  return n;
}

template <class T>
cudaError_t backward(const T* g, const T* x, const T* const* w, const int* f, int K, long B, long N,
                     const T* const* states, T* dx, T* const* dw, T* ws, cudaStream_t s) {
  const int sms = device_facts().sms;
  T* dF[2] = {ws, ws + (K >= 3 ? padded(B * N) : 0)};
  T* part = ws + long(std::min(K - 1, 2)) * padded(B * N);
  ReduceArgs<T> ra{};
  ra.K = K;
  int max_ff = 1;
  for (int k = 1; k <= K; ++k) {  // 1-based factor index; array index k-1
    const int fk = f[k - 1];
    const T* D = k == 1 ? g : dF[(k - 2) & 1];
    const T* Fk = k == K ? x : states[k - 1];
    const int splits = dw_splits<T>(B, N, fk, sms);
    if (B > 0) {
      cudaError_t e = dw_cfg(fk) == 0 ? launch_dw<T, typename CfgOf<T, 0>::type>(Fk, D, part, B, N, fk, splits, s)
                                      : launch_dw<T, typename CfgOf<T, 2>::type>(Fk, D, part, B, N, fk, splits, s);
      if (e != cudaSuccess) return e;
    }
    ra.part[k - 1] = part;
    ra.out[k - 1] = dw[k - 1];
    ra.ff[k - 1] = fk * fk;
    ra.splits[k - 1] = B > 0 ? splits : 0;
    max_ff = std::max(max_ff, fk * fk);
    part += padded(long(splits) * fk * fk);
    if (B > 0) {
      T* out = k == K ? dx : dF[(k - 1) & 1];
      cudaError_t e = rstep(D, w[k - 1], out, B, N, fk, s);
      if (e != cudaSuccess) return e;
    }
  }
  dim3 grid(unsigned(std::min(cdiv(max_ff, 256), 4 * sms)), unsigned(K));
  reduce_kernel<T><<<grid, 256, 0, s>>>(ra);
  return cudaGetLastError();
}

}  // namespace kron

// ---- the launchers cpp_src/kron/kron.cpp calls ("kron_backward@f32", ...) -------------------------------------------
//   kron_backward: cudaError_t (const T* g, const T* x, const T* const* w, const int* f, int K, int64_t B, int64_t N,
//                               const T* const* states, T* dx, T* const* dw, T* ws, cudaStream_t)
//   kron_backward_workspace: int64_t (int64_t B, int64_t N, const int* f, int K), in elements of T
LAB_EXPORTS(LAB_EXPORT("kron_backward", kron::backward<kron::Real>),
            LAB_EXPORT("kron_backward_workspace", kron::backward_workspace<kron::Real>))
