// linear/v3.cu — shared-memory tiles (the ladder: linear.cuh)
#include "linear.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v3: shared-memory tiles, 32x32, one output per thread (1024 threads). Both tiles are loaded along K (coalesced)
// and kept K-contiguous: thread (ty, tx) reads xs[ty][k] (a broadcast) and ws[tx][k] (row stride 33 words, so the
// 32 lanes hit 32 different banks).
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(1024) v3_smem_tiles(const float* __restrict__ x, const float* __restrict__ w,
                                                      const float* __restrict__ b, float* __restrict__ y, int M,
                                                      int N, int K) {
  constexpr int T = 32;
  __shared__ float xs[T][T + 1];
  __shared__ float ws[T][T + 1];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, T)), int(lab::ceil_div(N, T)));
  const int tx = threadIdx.x % T, ty = threadIdx.x / T;
  const int m0 = tl.m * T, n0 = tl.n * T;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += T) {
    const bool k_ok = k0 + tx < K;
    xs[ty][tx] = (m0 + ty < M && k_ok) ? x[int64_t(m0 + ty) * K + k0 + tx] : 0.f;
    ws[ty][tx] = (n0 + ty < N && k_ok) ? w[int64_t(n0 + ty) * K + k0 + tx] : 0.f;
    __syncthreads();  // tiles complete before anyone reads them
#pragma unroll
    for (int k = 0; k < T; ++k) acc += xs[ty][k] * ws[tx][k];
    __syncthreads();  // everyone done before the next K-step overwrites them
  }
  const int m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) y[int64_t(m) * N + n] = acc + (b ? b[n] : 0.f);
}

cudaError_t forward_v3(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = tiles(M, N, 32, 32);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  v3_smem_tiles<<<unsigned(g), 1024, 0, s>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v3", linear::forward_v3))
