// linear/fill.cu — K == 0 for every version: y = b broadcast over rows, or zeros (the ladder: linear.cuh). The
// binding calls it instead of the version's launcher when K == 0 (and nothing at all when M or N is 0).
#include "linear.cuh"
#include "tc.cuh"

namespace linear {

// K == 0: the product is empty, y = b broadcast over rows (or zeros).
template <class T>
__global__ void fill_bias(const T* __restrict__ b, T* __restrict__ y, int M, int N) {
  const int64_t total = int64_t(M) * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = b ? b[i % N] : from_f<T>(0.f);
}

template <class T>
cudaError_t launch_fill(const T* b, T* y, int M, int N, cudaStream_t s) {
  fill_bias<T><<<lab::grid_stride_blocks(int64_t(M) * N, 256), 256, 0, s>>>(b, y, M, N);
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("fill_f32", linear::launch_fill<float>),
            LAB_EXPORT("fill_bf16", linear::launch_fill<linear::bf16>))
