// linear/v6.cu — vectorised loads (the ladder: linear.cuh)
#include "linear.cuh"
#include "simt.cuh"

namespace linear {

// 8x8 outer product from two quads of x (rows) and two quads of W (columns); acc[i][j], i = 4·ha + e, j = 4·hb + f.
__device__ __forceinline__ void outer8x8(float (&acc)[8][8], const float4 (&a)[2], const float4 (&bq)[2]) {
  const float av[8] = {a[0].x, a[0].y, a[0].z, a[0].w, a[1].x, a[1].y, a[1].z, a[1].w};
  const float bv[8] = {bq[0].x, bq[0].y, bq[0].z, bq[0].w, bq[1].x, bq[1].y, bq[1].z, bq[1].w};
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] += av[i] * bv[j];
}

// ---------------------------------------------------------------------------------------------------------------
// v6: v5 with 16-byte loads: float4 global loads along K (load_tile_vec) and float4 shared loads of each quad.
// kVec = false (K % 4 != 0 or an unaligned base) keeps v5's scalar global loads.
// ---------------------------------------------------------------------------------------------------------------
template <bool kVec>
__global__ void __launch_bounds__(256) v6_vectorized(const float* __restrict__ x, const float* __restrict__ w,
                                                     const float* __restrict__ b, float* __restrict__ y, int M,
                                                     int N, int K, bool vec_out) {
  constexpr int BK = 8;
  __shared__ __align__(16) float As[BK][kP];
  __shared__ __align__(16) float Bs[BK][kP];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, kBM)), int(lab::ceil_div(N, kBN)));
  const int m0 = tl.m * kBM, n0 = tl.n * kBN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[8][8] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    if constexpr (kVec) {
      store_tile_vec<kBM, BK, kP>(As, load_tile_vec<kBM, BK, 256>(x, M, K, m0, k0));
      store_tile_vec<kBN, BK, kP>(Bs, load_tile_vec<kBN, BK, 256>(w, N, K, n0, k0));
    } else {
      load_tile_scalar<kBM, BK, 256, kP>(As, x, M, K, m0, k0);
      load_tile_scalar<kBN, BK, 256, kP>(Bs, w, N, K, n0, k0);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a[2] = {*reinterpret_cast<const float4*>(&As[k][ty * 8]),
                           *reinterpret_cast<const float4*>(&As[k][ty * 8 + 4])};
      const float4 bq[2] = {*reinterpret_cast<const float4*>(&Bs[k][tx * 8]),
                            *reinterpret_cast<const float4*>(&Bs[k][tx * 8 + 4])};
      outer8x8(acc, a, bq);
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

cudaError_t forward_v6(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = tiles(M, N, kBM, kBN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  (vec_in(x, w, K) ? v6_vectorized<true> : v6_vectorized<false>)<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K,
                                                                                        vec4_out(y, b, N));
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v6", linear::forward_v6))
