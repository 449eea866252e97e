// linear/v1.cu — naive (the ladder: linear.cuh)
#include "linear.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v1: naive. Block = 32 (n) x 8 (m) outputs. Lanes of a warp own consecutive n, so each W load of the warp touches
// 32 different rows K·4 bytes apart (32 sectors per request, 4 useful bytes in each); x[m, k] is a broadcast.
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(256) v1_naive(const float* __restrict__ x, const float* __restrict__ w,
                                                const float* __restrict__ b, float* __restrict__ y, int M, int N,
                                                int K) {
  const int tiles_n = int(lab::ceil_div(N, 32));
  const int tm = blockIdx.x / tiles_n, tn = blockIdx.x % tiles_n;
  const int n = tn * 32 + threadIdx.x % 32, m = tm * 8 + threadIdx.x / 32;
  if (m >= M || n >= N) return;
  const float* xr = x + int64_t(m) * K;
  const float* wr = w + int64_t(n) * K;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += xr[k] * wr[k];
  y[int64_t(m) * N + n] = acc + (b ? b[n] : 0.f);
}

cudaError_t forward_v1(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = tiles(M, N, 8, 32);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  v1_naive<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v1", linear::forward_v1))
