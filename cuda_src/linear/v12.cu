// linear/v12.cu — v8 with K split over a thread-block cluster: the rung for outputs too small to fill the GPU (the
// ladder: linear.cuh).
//
// Why: v8's 128×128 tiles give fc_out (M ≤ 128 rows × N = 5893 × K = 1280) one row of 47 tiles: 47 blocks for 132
// SMs, each walking all of K, so its time hardly moves from M = 1 to M = 128 and sits above cuBLAS's. Splitting K
// into S slices multiplies the blocks by S (S = 5 at fc_out: 235 blocks, one wave at two blocks per SM) and divides
// each block's K loop by S; the S partial tiles then have to be summed.
//
// The sum stays on chip: the S blocks of one output tile form a cluster (Hopper: blocks of a cluster are co-scheduled
// on one GPC and can read each other's shared memory). Each writes its 128×128 partial tile to its own shared memory,
// the cluster meets (barrier.cluster), and block r sums rows [r·128/S, (r+1)·128/S) over all S partials through
// distributed shared memory, adds the bias and stores them: one launch, no workspace in HBM, the same sum order on
// every run. Where the tiles alone fill the GPU (S = 1) it is v8 with no exchange.
//
// Napkin math (fc_out, H100): the FMAs v12 runs are those of whole 128-row tiles, 47·128·128·1280 = 0.99 G FMA at any
// M ≤ 128 (rows past M are zeros), 33 us at 128 FMA/clk/SM on 132 SMs at 1.755 GHz; W is 30.2 MB, 9 us at 3.35 TB/s.
// Warps whose 64 rows are all past M skip their FMAs (at M ≤ 64 half of the block), and warps whose second 32 rows are
// past M run half of them (M ≤ 32), which frees issue slots for the block beside them. The partial tile is 128 × 132 floats (67.6 KB, rows padded like the stages) beside v8's 33.8 KB
// of stages: two blocks per SM.
#include "linear.cuh"
#include "simt.cuh"

#include <cooperative_groups.h>

#include <algorithm>

namespace linear {
namespace cg = cooperative_groups;

constexpr int kSplitBK = 8, kSplitStages = 4, kMaxSplits = 8;  // 8: the portable cluster size
constexpr size_t kPartialBytes = size_t(kBM) * kP * sizeof(float);

template <int BK, int STAGES>
__global__ void __launch_bounds__(WarpTile<2>::THREADS, 2)
    splitk_warptile(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                    float* __restrict__ y, int M, int N, int K, int kchunk, bool vec_out) {
  constexpr int NQ = 2, THREADS = WarpTile<NQ>::THREADS;
  __shared__ __align__(16) float As[STAGES][BK][kP];
  __shared__ __align__(16) float Bs[STAGES][BK][kP];
  extern __shared__ __align__(16) float part[];  // [kBM][kP]: this block's partial tile
  constexpr uint32_t kStage = BK * kP * sizeof(float);
  cg::cluster_group cluster = cg::this_cluster();
  const int S = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const Tile tl = tile_of(blockIdx.x / S, int(lab::ceil_div(M, kBM)), int(lab::ceil_div(N, kBN)));
  const int m0 = tl.m * kBM, n0 = tl.n * kBN;
  const int k_begin = rank * kchunk, k_end = min(K, k_begin + kchunk);
  // TileCopy's row strides come from the real K; its bounds test takes k_end, so the slice's last tile is predicated
  const TileCopy<kBM, BK, THREADS, kP> cx(x, M, K, m0);
  const TileCopy<kBN, BK, THREADS, kP> cw(w, N, K, n0);
  const uint32_t sa = smem_u32(As), sb = smem_u32(Bs);
  const WarpTile<NQ> wt;
  const bool rows_live = m0 + (wt.row & ~63) < M;        // this warp's 64 rows reach into x (warp-uniform)
  const bool top_only = m0 + (wt.row & ~63) + 32 >= M;   // ... and its second 32 rows do not
  float acc[8][4 * NQ] = {};
  const int nk = k_end > k_begin ? int(lab::ceil_div(k_end - k_begin, BK)) : 0;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) {
      cx.issue(sa + s * kStage, k_begin + s * BK, k_end);
      cw.issue(sb + s * kStage, k_begin + s * BK, k_end);
    }
    cp_async_commit();
  }
  int load_slot = STAGES - 1, cur = 0;
  for (int t = 0; t < nk; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (t + STAGES - 1 < nk) {
      cx.issue(sa + load_slot * kStage, k_begin + (t + STAGES - 1) * BK, k_end);
      cw.issue(sb + load_slot * kStage, k_begin + (t + STAGES - 1) * BK, k_end);
    }
    cp_async_commit();
    if (rows_live && top_only) {
#pragma unroll
      for (int k = 0; k < BK; ++k) warp_tile_step<kP, NQ, 1>(acc, As[cur], Bs[cur], k, wt);
    } else if (rows_live) {
#pragma unroll
      for (int k = 0; k < BK; ++k) warp_tile_step<kP, NQ>(acc, As[cur], Bs[cur], k, wt);
    }
    load_slot = load_slot + 1 == STAGES ? 0 : load_slot + 1;
    cur = cur + 1 == STAGES ? 0 : cur + 1;
  }
  cp_async_wait<0>();
  if (S == 1) {
    warp_tile_store<NQ>(acc, y, b, M, N, m0, n0, wt, vec_out);
    return;
  }
  // the partial tile into this block's shared memory: row wt.row + i%4 + (i/4)·32, columns wt.col + 16h .. + 3
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int h = 0; h < NQ; ++h)
      *reinterpret_cast<float4*>(&part[(wt.row + (i % 4) + (i / 4) * 32) * kP + wt.col + 16 * h]) =
          make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
  cluster.sync();  // every partial written (release / acquire across the cluster)
  // block `rank` sums its share of the rows over the S partials, in rank order (the same order on every run)
  const int r0 = rank * kBM / S, r1 = (rank + 1) * kBM / S;
  for (int e = threadIdx.x; e < (r1 - r0) * (kBN / 4); e += THREADS) {
    const int r = r0 + e / (kBN / 4), c = 4 * (e % (kBN / 4));
    if (m0 + r >= M) continue;
    float4 s4 = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p = 0; p < S; ++p) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(&part[r * kP + c], p));
      s4.x += v.x; s4.y += v.y; s4.z += v.z; s4.w += v.w;
    }
    store_quad(y, b, M, N, m0 + r, n0 + c, s4, vec_out);
  }
  cluster.sync();  // no block leaves (and frees its shared memory) while another still reads it
}

// S: enough K slices that tiles × S fills two blocks per SM, at most 8, each slice a whole number of BK-deep tiles.
struct Split {
  int S, kchunk;
};
inline Split plan_split(int M, int N, int K) {
  const int64_t t = tiles(M, N, kBM, kBN);
  const int sms = lab::sm_count();
  int S = int(std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, 2 * sms / std::max<int64_t>(t, 1))));
  const int kchunk = int(lab::ceil_div(lab::ceil_div(K, S), kSplitBK) * kSplitBK);
  S = int(lab::ceil_div(K, kchunk));  // no empty slice
  return {S, kchunk};
}

cudaError_t forward_splitk(const float* x, const float* w, const float* b, float* y, int M, int N, int K,
                           cudaStream_t s) {
  if (device_major() < 9) return cudaErrorNotSupported;  // thread-block clusters: sm_90
  const Split sp = plan_split(M, N, K);
  const int64_t g = tiles(M, N, kBM, kBN) * sp.S;
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  auto kernel = splitk_warptile<kSplitBK, kSplitStages>;
  static bool optin[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= 0 && dev < 64 && !optin[dev]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPartialBytes));
    optin[dev] = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(g));
  cfg.blockDim = dim3(WarpTile<2>::THREADS);
  cfg.dynamicSmemBytes = sp.S > 1 ? kPartialBytes : 0;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(sp.S);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, x, w, b, y, M, N, K, sp.kchunk, vec4_out(y, b, N));
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("splitk", linear::forward_splitk))
