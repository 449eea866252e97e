// linear/v5.cu — 2D register blocking (the ladder: linear.cuh)
#include "linear.cuh"
#include "simt.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v5: 2D register blocking. 128x128 tile, BK = 8, 256 threads as 16x16; thread (ty, tx) computes the 8x8 block
// y[ty·8 + i, tx·8 + j]. Per k: 8 x values + 8 W values from shared memory feed 64 FMAs (scalar loads here).
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(256) v5_blocktile_2d(const float* __restrict__ x, const float* __restrict__ w,
                                                       const float* __restrict__ b, float* __restrict__ y, int M,
                                                       int N, int K, bool vec_out) {
  constexpr int BK = 8;
  __shared__ float As[BK][kP];
  __shared__ float Bs[BK][kP];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, kBM)), int(lab::ceil_div(N, kBN)));
  const int m0 = tl.m * kBM, n0 = tl.n * kBN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[8][8] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    load_tile_scalar<kBM, BK, 256, kP>(As, x, M, K, m0, k0);
    load_tile_scalar<kBN, BK, 256, kP>(Bs, w, N, K, n0, k0);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[8], bb[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = As[k][ty * 8 + i];
#pragma unroll
      for (int j = 0; j < 8; ++j) bb[j] = Bs[k][tx * 8 + j];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += a[i] * bb[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = m0 + ty * 8 + i;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      store_quad(y, b, M, N, m, n0 + tx * 8 + 4 * h,
                 make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]), vec_out);
  }
}

cudaError_t forward_v5(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = tiles(M, N, kBM, kBN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  v5_blocktile_2d<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K, vec4_out(y, b, N));
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v5", linear::forward_v5))
