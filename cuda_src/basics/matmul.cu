// basics/matmul.cu — C = A @ B, row-major (the ladder: basics.cuh)
#include "basics.cuh"

namespace basics {

template <class T>
__global__ void matmul_v1(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
  // threadIdx.x walks columns: a warp reads 32 consecutive B elements and writes 32 consecutive C elements.
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  T acc = 0;
  for (int k = 0; k < K; ++k) acc += A[int64_t(row) * K + k] * B[int64_t(k) * N + col];
  C[int64_t(row) * N + col] = acc;
}

template <class T>
__global__ void matmul_v2(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
  // +1 column of padding on As: the inner loop reads As[ty][k] (a broadcast) and Bs[k][tx] (consecutive),
  // the padding keeps the transposed-looking store pattern of larger tiles off a single bank.
  __shared__ T As[kTile][kTile + 1];
  __shared__ T Bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
  T acc = 0;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Each thread loads one element of each tile; zeros past the edges make odd sizes need no special case below.
    As[ty][tx] = (row < M && k0 + tx < K) ? A[int64_t(row) * K + k0 + tx] : T(0);
    Bs[ty][tx] = (k0 + ty < K && col < N) ? B[int64_t(k0 + ty) * N + col] : T(0);
    __syncthreads();  // tiles complete before anyone reads them
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();  // everyone done reading before the next iteration overwrites the tiles
  }
  if (row < M && col < N) C[int64_t(row) * N + col] = acc;
}

template <class T>
cudaError_t matmul_launch(int version, const T* A, const T* B, T* C, int M, int N, int K, cudaStream_t stream) {
  if (M == 0 || N == 0) return cudaSuccess;
  dim3 block(kTile, version == 2 ? kTile : 8);
  dim3 grid(unsigned(lab::ceil_div(N, block.x)), unsigned(lab::ceil_div(M, version == 2 ? kTile : block.y)));
  if (grid.y > 65535) return cudaErrorInvalidConfiguration;
  if (version == 2)
    matmul_v2<T><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  else
    matmul_v1<T><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  return cudaGetLastError();
}

}  // namespace basics

LAB_EXPORTS(LAB_EXPORT("matmul_f32", basics::matmul_launch<float>),
            LAB_EXPORT("matmul_f64", basics::matmul_launch<double>))
