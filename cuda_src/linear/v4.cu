// linear/v4.cu — 1D register blocking (the ladder: linear.cuh)
#include "linear.cuh"
#include "simt.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v4: 1D register blocking. 64x64 tile, BK = 8, 512 threads; thread (ty, tx) computes y[ty·8 + i, tx], i < 8.
// Per k: one W value (Bs[k][tx], consecutive lanes: conflict-free) and 8 x values (a broadcast: a warp shares ty).
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(512) v4_blocktile_1d(const float* __restrict__ x, const float* __restrict__ w,
                                                       const float* __restrict__ b, float* __restrict__ y, int M,
                                                       int N, int K) {
  constexpr int BM = 64, BN = 64, BK = 8, TM = 8, P = 68;  // pitch 68: 4·68 ≡ 16 mod 32 (conflict-free stores)
  __shared__ float As[BK][P];
  __shared__ float Bs[BK][P];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, BM)), int(lab::ceil_div(N, BN)));
  const int m0 = tl.m * BM, n0 = tl.n * BN;
  const int tx = threadIdx.x % BN, ty = threadIdx.x / BN;
  float acc[TM] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    load_tile_scalar<BM, BK, 512, P>(As, x, M, K, m0, k0);
    load_tile_scalar<BN, BK, 512, P>(Bs, w, N, K, n0, k0);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float bv = Bs[k][tx];
#pragma unroll
      for (int i = 0; i < TM; ++i) acc[i] += As[k][ty * TM + i] * bv;
    }
    __syncthreads();
  }
  const int n = n0 + tx;
  if (n >= N) return;
  const float bias = b ? b[n] : 0.f;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + ty * TM + i;
    if (m < M) y[int64_t(m) * N + n] = acc[i] + bias;
  }
}

cudaError_t forward_v4(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = tiles(M, N, 64, 64);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  v4_blocktile_1d<<<unsigned(g), 512, 0, s>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v4", linear::forward_v4))
