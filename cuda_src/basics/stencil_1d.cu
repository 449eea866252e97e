// basics/stencil_1d.cu — radius-3 1D stencil, zeros outside (the ladder: basics.cuh)
#include "basics.cuh"

namespace basics {

template <class T>
__global__ void stencil_v1(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  T s = 0;
#pragma unroll
  for (int j = -kRadius; j <= kRadius; ++j) {
    int64_t k = i + j;
    if (k >= 0 && k < n) s += x[k];
  }
  y[i] = s;
}

template <class T>
__global__ void stencil_v2(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  __shared__ T tile[kBlock + 2 * kRadius];  // this block's inputs plus a halo of kRadius on each side
  const int64_t base = int64_t(blockIdx.x) * blockDim.x;
  // Cooperative load of blockDim + 2R elements starting at base - R; out-of-range reads become the zero padding.
  for (int t = threadIdx.x; t < kBlock + 2 * kRadius; t += blockDim.x) {
    int64_t k = base - kRadius + t;
    tile[t] = (k >= 0 && k < n) ? x[k] : T(0);
  }
  __syncthreads();  // every thread's window spans elements other threads loaded
  int64_t i = base + threadIdx.x;
  if (i >= n) return;
  T s = 0;
#pragma unroll
  for (int j = 0; j <= 2 * kRadius; ++j) s += tile[threadIdx.x + j];
  y[i] = s;
}

template <class T>
cudaError_t stencil_launch(int version, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unsigned grid = unsigned(lab::ceil_div(n, kBlock));
  if (version == 2)
    stencil_v2<T><<<grid, kBlock, 0, stream>>>(x, y, n);
  else
    stencil_v1<T><<<grid, kBlock, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

}  // namespace basics

LAB_EXPORTS(LAB_EXPORT("stencil_1d_f32", basics::stencil_launch<float>),
            LAB_EXPORT("stencil_1d_f64", basics::stencil_launch<double>))
