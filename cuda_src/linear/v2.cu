// linear/v2.cu — coalesced (the ladder: linear.cuh)
#include "linear.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v2: coalesced. One warp per output: lane l reads x[m, l], x[m, l+32], ... and the same of W[n, :], so a warp's
// load is one contiguous 128-B line. The 8 warps of a block share m (x row from L1) and take consecutive n.
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(256) v2_coalesced(const float* __restrict__ x, const float* __restrict__ w,
                                                    const float* __restrict__ b, float* __restrict__ y, int M, int N,
                                                    int K) {
  const int64_t o = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;  // output index m·N + n
  if (o >= int64_t(M) * N) return;
  const int m = int(o / N), n = int(o % N), lane = threadIdx.x % 32;
  const float* xr = x + int64_t(m) * K;
  const float* wr = w + int64_t(n) * K;
  float acc = 0.f;
  for (int k = lane; k < K; k += 32) acc += xr[k] * wr[k];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) y[o] = acc + (b ? b[n] : 0.f);
}

cudaError_t forward_v2(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = lab::ceil_div(int64_t(M) * N, 8);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  v2_coalesced<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v2", linear::forward_v2))
