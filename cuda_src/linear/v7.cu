// linear/v7.cu — warp tiling (the ladder: linear.cuh)
#include "linear.cuh"
#include "simt.cuh"

namespace linear {

// v7: v6's loads and tile, the warp-tiled thread layout.
template <bool kVec>
__global__ void __launch_bounds__(256) v7_warptile(const float* __restrict__ x, const float* __restrict__ w,
                                                   const float* __restrict__ b, float* __restrict__ y, int M, int N,
                                                   int K, bool vec_out) {
  constexpr int BK = 8;
  __shared__ __align__(16) float As[BK][kP];
  __shared__ __align__(16) float Bs[BK][kP];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, kBM)), int(lab::ceil_div(N, kBN)));
  const int m0 = tl.m * kBM, n0 = tl.n * kBN;
  const WarpTile<2> wt;
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
    for (int k = 0; k < BK; ++k) warp_tile_step<kP>(acc, As, Bs, k, wt);
    __syncthreads();
  }
  warp_tile_store(acc, y, b, M, N, m0, n0, wt, vec_out);
}

cudaError_t forward_v7(const float* x, const float* w, const float* b, float* y, int M, int N, int K, cudaStream_t s) {
  const int64_t g = tiles(M, N, kBM, kBN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  (vec_in(x, w, K) ? v7_warptile<true> : v7_warptile<false>)<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K,
                                                                                      vec4_out(y, b, N));
  return cudaGetLastError();
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("v7", linear::forward_v7))
