// linear/v8_v9.cu — asynchronous copies (v8) and the bigger thread tile (v9): one kernel template, built once per
// version (the ladder: linear.cuh)
// lab:variants version=v8,v9
#include "linear.cuh"
#include "simt.cuh"

namespace linear {

// v8: v7 fed by asynchronous copies. cp.async moves each element global -> shared in the background (4-byte copies,
// so they can land transposed; zero-filled past M/N/K, so any K and any alignment works), into a ring of 4 stages:
// the copies for tile t+3 are in flight while tile t's BK·64 FMAs per thread run, no registers hold them, and there
// is one barrier per tile. (Staging the next tile through registers instead needs 16 more live registers; at the
// 128-register cap of 2 blocks per SM ptxas sank those loads below the FMAs, i.e. no overlap at all.)
// Copy mapping: 8 lanes per row cover 32 contiguous bytes (one sector); the transposed stores of a warp land in
// 32 distinct banks (word c·132 + r, c < 8, r < 4: bank 4c + r).
// The copy itself: TileCopy (simt.cuh, shared with v12).

// v8 (NQ = 2: 8x8 per thread, 256 threads) and v9 (NQ = 4: 8x16 per thread, 128 threads): the same kernel.
template <int NQ, int BK, int STAGES>
__global__ void __launch_bounds__(WarpTile<NQ>::THREADS, 2)
    async_copy_warptile(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                        float* __restrict__ y, int M, int N, int K, bool vec_out) {
  constexpr int THREADS = WarpTile<NQ>::THREADS;
  __shared__ __align__(16) float As[STAGES][BK][kP];
  __shared__ __align__(16) float Bs[STAGES][BK][kP];
  constexpr uint32_t kStage = BK * kP * sizeof(float);
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, kBM)), int(lab::ceil_div(N, kBN)));
  const int m0 = tl.m * kBM, n0 = tl.n * kBN;
  const TileCopy<kBM, BK, THREADS, kP> cx(x, M, K, m0);
  const TileCopy<kBN, BK, THREADS, kP> cw(w, N, K, n0);
  const uint32_t sa = smem_u32(As), sb = smem_u32(Bs);
  const WarpTile<NQ> wt;
  float acc[8][4 * NQ] = {};
  const int nk = int(lab::ceil_div(K, BK));
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) {
      cx.issue(sa + s * kStage, s * BK, K);
      cw.issue(sb + s * kStage, s * BK, K);
    }
    cp_async_commit();
  }
  int load_slot = STAGES - 1, cur = 0;
  for (int t = 0; t < nk; ++t) {
    cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed ...
    __syncthreads();              // ... everyone's; and the slot read at t-1 (refilled next) is free
    if (t + STAGES - 1 < nk) {
      cx.issue(sa + load_slot * kStage, (t + STAGES - 1) * BK, K);
      cw.issue(sb + load_slot * kStage, (t + STAGES - 1) * BK, K);
    }
    cp_async_commit();
#pragma unroll
    for (int k = 0; k < BK; ++k) warp_tile_step<kP, NQ>(acc, As[cur], Bs[cur], k, wt);
    load_slot = load_slot + 1 == STAGES ? 0 : load_slot + 1;
    cur = cur + 1 == STAGES ? 0 : cur + 1;
  }
  cp_async_wait<0>();
  warp_tile_store<NQ>(acc, y, b, M, N, m0, n0, wt, vec_out);
}
constexpr int kAsyncBK = 8, kAsyncStages = 4;  // 4 x 8.4 KB of shared memory

template <int NQ, int BK, int STAGES>
cudaError_t launch_async(const float* x, const float* w, const float* b, float* y, int M, int N, int K, bool vec_out,
                         cudaStream_t s) {
  if (device_major() < 8) return cudaErrorNotSupported;  // cp.async: sm_80+
  const int64_t g = tiles(M, N, kBM, kBN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  async_copy_warptile<NQ, BK, STAGES><<<unsigned(g), WarpTile<NQ>::THREADS, 0, s>>>(x, w, b, y, M, N, K, vec_out);
  return cudaGetLastError();
}

#if defined(LAB_VARIANT_version_v8)
constexpr int kNQ = 2;  // v8: 8x8 per thread, 256 threads
#elif defined(LAB_VARIANT_version_v9)
constexpr int kNQ = 4;  // v9: 8x16 per thread, 128 threads
#else
#error "v8_v9.cu is built once per version (// lab:variants version=v8,v9): define LAB_VARIANT_version_v8 or _v9"
#endif

cudaError_t forward_async(const float* x, const float* w, const float* b, float* y, int M, int N, int K,
                          cudaStream_t s) {
  return launch_async<kNQ, kAsyncBK, kAsyncStages>(x, w, b, y, M, N, K, vec4_out(y, b, N), s);
}

}  // namespace linear

// registered as "async_warptile@v8" and "async_warptile@v9"
LAB_EXPORTS(LAB_EXPORT("async_warptile", linear::forward_async))
