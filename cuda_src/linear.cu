// linear.cu — nn.Linear's forward, y = x · Wᵀ + b, as a ladder of GEMM kernels from the naive loop to Hopper's
// tensor cores, plus a batch-1 GEMV for the decoder's output layer.
//
//   x: (M, K) row-major (the binding flattens leading dims: M = batch·seq), W: (N, K) row-major — nn.Linear.weight
//   (out_features, in_features) read in place, never transposed or copied —, b: (N,) or null, y: (M, N).
//   reference: torch.nn.functional.linear (float64 in the checks; cuBLAS at the same precision in the benchmarks).
//   Both operands are K-contiguous (BLAS "TN"): a coalesced load walks K, so every tiled kernel stores its x and W
//   tiles K-major-transposed in shared memory (SIMT) or reads them K-major (tensor cores, which want exactly this).
//
// Versions (each adds one idea to the one before; all are kept and all take any size):
//   v1: naive — one thread per y element, K-loop from global memory; a warp's W load touches 32 rows (32 sectors).
//   v2: coalesced — one warp per y element: lanes stride K together, so each load is one 128-B line of x and of W;
//       a shuffle reduction at the end. Still 2 loads per FMA, all from L2.
//   v3: shared-memory tiles — 32x32 tiles of x and W staged once per K-step, each element reused 32 times.
//   v4: 1D register blocking — 64x64 tile, BK=8, each thread computes 8 outputs down a column: one W value read
//       from shared memory feeds 8 FMAs.
//   v5: 2D register blocking — 128x128 tile, each thread an 8x8 block: 16 shared loads per 64 FMAs. (nvcc already
//       fuses the 8 scalar shared loads of a row into 2 LDS.128 here: it can prove the 16-B alignment.)
//   v6: vectorised — 16-byte global loads along K, transposed into shared memory on the way in (4 LDS.128 per 64
//       FMAs, as v5 compiles to). Needs K % 4 == 0 and 16-byte aligned rows; otherwise it loads scalars.
//   v7: warp tiling — lanes laid out 8x4 over a 64x32 warp tile, a thread's 8x8 block split into quads 32 rows /
//       16 columns apart, so each LDS.128 of a warp reads one contiguous 128-B (or 64-B) run: no bank conflicts
//       (v5/v6 read W quads 32 B apart across lanes: 2- to 4-way conflicts).
//   v8: asynchronous copies — cp.async moves the tiles global -> shared in the background into a 4-stage ring, so
//       tile t+3 is in flight while tile t's FMAs run, no registers hold it, one barrier per tile. Any K, any
//       alignment (4-byte copies, zero-filled).
//   v9: a bigger thread tile — 8x16 outputs per thread, 4 warps of 64x64 on the 128x128 tile (128 threads):
//       6 LDS.128 feed 128 FMAs (v8: 4 feed 64), and half as many threads share the copy and index work.
//   v10: tensor cores, TF32 — mma.sync.m16n8k8 on operands rounded to TF32 (10-bit mantissa, cvt.rna), fragments
//        by ldmatrix from padded shared rows (conflict-free), a 4-stage cp.async pipeline; fp32 accumulate.
//   v11: tensor cores, bf16 — the same kernel on bf16 operands (mma.sync.m16n8k16): half the bytes per operand
//        and twice the MMA rate of TF32.
//   v12: Hopper wgmma, TF32 — a warpgroup issues asynchronous 64x256x8 MMAs that read both operands from shared
//        memory in the 128-B swizzled layout TMA writes; one producer warp drives TMA (cp.async.bulk.tensor) through
//        4 mbarrier-guarded stages while two consumer warpgroups compute a 128x256 tile. The tensor core reads the
//        fp32 bits and drops the low 13 mantissa bits (truncation; v10 rounds): ~2.6x the rounding error of TF32,
//        still 5x inside the TF32 tolerance. Needs K·4 % 16 == 0 (TMA's stride rule), else it runs v10's kernel.
//   v13: Hopper wgmma, bf16 — v12 on bf16 (64x256x16 MMAs); K % 8 == 0, otherwise v11's kernel.
//   v14: GEMV for small M (the decoder's fc_out at batch 1): one warp per W row, all of a lane's 16-byte loads of
//        the row in flight at once, x in shared memory, one wave of blocks; memory-bound: the goal is copy
//        bandwidth on the weight.
// All tiled versions visit tiles in groups of 8 block-rows (consecutive blocks share W tiles in L2) on a 1-D grid.
// K == 0: y = b (or 0), written by a fill kernel.
//
// Napkin math (H100 SXM; datasheet rates are leads, the lab measures its own ceilings):
//   4096^3: 2·4096^3 = 137 GFLOP; bytes 3·64 MiB = 201 MB -> 0.07 ms at 2968 GB/s, so compute-bound by ~40x.
//   FP32 SIMT peak 132 SMs · 128 FMA/clk · 2 · 1.98 GHz = 66.9 TFLOP/s; cuBLAS fp32 51.1 as measured in issue 4 (76%).
//   v7/v8's inner step per thread: 4 LDS.128 + 64 FFMA, so at best 94% of issue slots are FMAs; v8's main loop
//   (SASS) issues 512 FFMA, 32 LDS.128, 8 LDGSTS and ~45 other instructions per tile: ~87% FMAs. v9: 6 LDS.128
//   per 128 FFMA (96%), 1024 FFMA per 16 LDGSTS per tile.
//   Tensor cores (dense, datasheet): TF32 495, bf16 989 TFLOP/s; cuBLAS 363 and 754 (issue 4).
//   fc_out at batch 1: W is 5893·1280·4 B = 30.2 MB -> 10.2 us at 2968 GB/s; 85% of copy is 12.0 us.
//
// Measured (H100 80GB HBM3, torch 2.11 + CUDA 13.0, 2026-11-22, medians with the L2 flushed; before v9 was added and
// v14 was reworked, with today's v10..v13 then numbered v9..v12):
//   4096^3 fp32 (TFLOP/s): cuBLAS 50.9 | v1 0.50, v2 1.65, v3 7.2, v4 12.7, v5 28.1, v6 34.0, v7 39.0, v8 41.1 (81%).
//   4096^3 TF32: cuBLAS 338 | v10 mma.sync 116 (34%), v12 wgmma 326 (96%).
//   4096^3 bf16: cuBLAS 776 | v11 mma.sync 277 (36%), v13 wgmma 624 (80%).
//   fc_out batch 1: cuBLAS 21.6 us (1402 GB/s), first GEMV 18.9 us (1602 GB/s = 53% of the 3000 GB/s copy).
//   fc_out batch 128: cuBLAS fp32 80.9 us, v8 161, v10 70.3, v12 34.4 us (cuBLAS TF32 40.4).
// Goals: wgmma TF32 96% and bf16 80% of cuBLAS (goal 70%): met. Best SIMT 81% of cuBLAS (goal 90%): missed by 9
// points. Nsight Compute at 4096^3 (commit f66f57c, results/profiles/linear_sgemm_4096_ncu_*.csv; SM clock 1.98 GHz
// under load, so the FP32 peak is 66.8 TFLOP/s and cuBLAS's 2.71 ms is 76% of it) says why. Instructions issued
// (G) / of them FFMA: v8 2.62 / 83%, v9 2.47 / 87%, cuBLAS (sm80_xmma_gemm ... 128x128x8 stage3 ffma) 2.45 / 88%:
// v9 issues what cuBLAS issues. The gap is issue rate: warps issued per scheduler per cycle v8 0.77, v9 0.72, cuBLAS
// 0.90, at the same 2 warps per scheduler for v9 and cuBLAS (1.23 vs 1.50 eligible). Stall cycles per issued
// instruction, v9 | cuBLAS: long scoreboard (waiting on cp.async data) 0.15 | 0.01, dispatch 0.22 | 0.10, wait
// (fixed-latency dependences) 0.13 | 0.01, short scoreboard (shared loads) 0.36 | 0.32, barrier 0.11 | 0.08. v8
// (4 warps per scheduler) loses most at its barrier (0.53) and in dispatch (0.54). So v9 does not lose to cuBLAS on
// instruction count but on stalls: memory dependences (long scoreboard: global loads and cp.async data), dispatch
// and fixed-latency waits. Which instructions stall (ncu's source-level sampling) is not examined yet.
// Today's run (notebook 02 on the H100): v8 40.7 TFLOP/s = 80% of cuBLAS fp32, v12 91% of cuBLAS TF32, v13 82% of
// cuBLAS bf16, v14 at fc_out batch 1 1620 GB/s = 54% of copy; the GEMV's shortfall is measured at v14 below.
#include "lab_cuda.cuh"

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched from the driver at run time)
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace linear {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------------------------
inline bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// Tile t of a 1-D grid -> (tile row, tile column), grouped 8 tile-rows at a time: the blocks resident together
// cover 8 row-tiles of x and a band of W, so both stay in L2 (Triton's "grouped ordering").
struct Tile { int m, n; };
__device__ __forceinline__ Tile tile_of(int t, int tiles_m, int tiles_n) {
  constexpr int G = 8;
  const int per_group = G * tiles_n;
  const int group = t / per_group;
  const int first = group * G;
  const int rows = min(tiles_m - first, G);
  const int r = t - group * per_group;
  return {first + r % rows, r / rows};
}

inline int64_t tiles(int M, int N, int bm, int bn) { return lab::ceil_div(M, bm) * lab::ceil_div(N, bn); }
constexpr int64_t kMaxGrid = 2147483647;

// y[m, n..n+3] = v + b[n..n+3] for the part of the quad inside (M, N); 16-byte store when allowed.
__device__ __forceinline__ void store_quad(float* __restrict__ y, const float* __restrict__ b, int M, int N, int m,
                                           int n, float4 v, bool vec) {
  if (m >= M) return;
  if (vec && n + 3 < N) {
    if (b) {
      const float4 bb = *reinterpret_cast<const float4*>(b + n);
      v.x += bb.x; v.y += bb.y; v.z += bb.z; v.w += bb.w;
    }
    *reinterpret_cast<float4*>(y + int64_t(m) * N + n) = v;
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (n + i < N) y[int64_t(m) * N + n + i] = e[i] + (b ? b[n + i] : 0.f);
}

// y[m, n], y[m, n+1] = (v0, v1) + bias, in T; a 2-element store when allowed (tensor-core epilogues).
template <class T>
__device__ __forceinline__ void store_pair(T* __restrict__ y, const T* __restrict__ b, int M, int N, int m, int n,
                                           float v0, float v1, bool vec) {
  if (m >= M) return;
  if (b) {
    if (n < N) v0 += to_f(b[n]);
    if (n + 1 < N) v1 += to_f(b[n + 1]);
  }
  T* p = y + int64_t(m) * N + n;
  if (vec && n + 1 < N) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
    }
    return;
  }
  if (n < N) p[0] = from_f<T>(v0);
  if (n + 1 < N) p[1] = from_f<T>(v1);
}

// K == 0: the product is empty, y = b broadcast over rows (or zeros).
template <class T>
__global__ void fill_bias(const T* __restrict__ b, T* __restrict__ y, int M, int N) {
  const int64_t total = int64_t(M) * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = b ? b[i % N] : from_f<T>(0.f);
}

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

// ---------------------------------------------------------------------------------------------------------------
// v3: shared-memory tiles, 32x32, one output per thread (1024 threads). Both tiles are loaded along K (coalesced)
// and kept K-contiguous: thread (ty, tx) reads xs[ty][k] (a broadcast) and ws[tx][k] (row stride 33 words, so the
// 32 lanes hit 32 different banks).
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(1024) v3_smem_tiles(const float* __restrict__ x, const float* __restrict__ w,
                                                      const float* __restrict__ b, float* __restrict__ y, int M,
                                                      int N, int K) {
  constexpr int T = 32;
  __shared__ float xs[T][T + 1];
  __shared__ float ws[T][T + 1];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, T)), int(lab::ceil_div(N, T)));
  const int tx = threadIdx.x % T, ty = threadIdx.x / T;
  const int m0 = tl.m * T, n0 = tl.n * T;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += T) {
    const bool k_ok = k0 + tx < K;
    xs[ty][tx] = (m0 + ty < M && k_ok) ? x[int64_t(m0 + ty) * K + k0 + tx] : 0.f;
    ws[ty][tx] = (n0 + ty < N && k_ok) ? w[int64_t(n0 + ty) * K + k0 + tx] : 0.f;
    __syncthreads();  // tiles complete before anyone reads them
#pragma unroll
    for (int k = 0; k < T; ++k) acc += xs[ty][k] * ws[tx][k];
    __syncthreads();  // everyone done before the next K-step overwrites them
  }
  const int m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) y[int64_t(m) * N + n] = acc + (b ? b[n] : 0.f);
}

// ---------------------------------------------------------------------------------------------------------------
// Tile loaders for v4..v7: a (rows x BK) slab of a K-contiguous matrix, stored transposed, s[k][row] (row pitch
// P = rows + 4 words), so the inner loop reads 4 consecutive rows at one k with one LDS.128. Out-of-range
// elements are zeros, which makes every size work without a special case in the inner loop.
// ---------------------------------------------------------------------------------------------------------------
// Scalar: thread t loads elements t, t + THREADS, ...; 8 lanes cover 32 contiguous bytes of one row (one sector).
template <int ROWS, int BK, int THREADS, int P>
__device__ __forceinline__ void load_tile_scalar(float (*s)[P], const float* __restrict__ g, int rows_total, int K,
                                                 int r0, int k0) {
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * BK; i += THREADS) {
    const int r = i / BK, c = i % BK;
    s[c][r] = (r0 + r < rows_total && k0 + c < K) ? g[int64_t(r0 + r) * K + k0 + c] : 0.f;
  }
}

// 16-byte loads into registers (the caller stores them, so a load can be in flight across other work). Thread t
// takes row t/2 and the 16-byte chunks 2j + t%2: two lanes cover 32 contiguous bytes of a row, and the transposed
// stores of one warp (rows r..r+15, k = 4q+i) land in 32 distinct banks with the pitch of 132 words (4·132 ≡ 16
// mod 32). Needs K % 4 == 0 and a 16-byte aligned base; a chunk is then either wholly inside K or wholly outside.
template <int BK>
struct Frag4 { float4 v[BK / 8]; };

template <int ROWS, int BK, int THREADS>
__device__ __forceinline__ Frag4<BK> load_tile_vec(const float* __restrict__ g, int rows_total, int K, int r0,
                                                   int k0) {
  static_assert(THREADS == 2 * ROWS && BK % 8 == 0, "two threads per row, BK a multiple of 8");
  Frag4<BK> f;
  const int r = threadIdx.x / 2;
#pragma unroll
  for (int j = 0; j < BK / 8; ++j) {
    const int k = k0 + 4 * (2 * j + threadIdx.x % 2);
    f.v[j] = (r0 + r < rows_total && k < K)
                 ? *reinterpret_cast<const float4*>(g + int64_t(r0 + r) * K + k)
                 : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  return f;
}

template <int ROWS, int BK, int P>
__device__ __forceinline__ void store_tile_vec(float (*s)[P], const Frag4<BK>& f) {
  const int r = threadIdx.x / 2;
#pragma unroll
  for (int j = 0; j < BK / 8; ++j) {
    const int q = 2 * j + threadIdx.x % 2;
    s[4 * q + 0][r] = f.v[j].x;
    s[4 * q + 1][r] = f.v[j].y;
    s[4 * q + 2][r] = f.v[j].z;
    s[4 * q + 3][r] = f.v[j].w;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// v4: 1D register blocking. 64x64 tile, BK = 8, 512 threads; thread (ty, tx) computes y[ty·8 + i, tx], i < 8.
// Per k: one W value (Bs[k][tx], consecutive lanes: conflict-free) and 8 x values (a broadcast: a warp shares ty).
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(512) v4_blocktile_1d(const float* __restrict__ x, const float* __restrict__ w,
                                                       const float* __restrict__ b, float* __restrict__ y, int M,
                                                       int N, int K) {
  constexpr int BM = 64, BN = 64, BK = 8, TM = 8, P = 68;  // pitch 68: 4·68 ≡ 16 mod 32 (conflict-free stores)
  __shared__ float As[BK][P];
  __shared__ float Bs[BK][P];
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, BM)), int(lab::ceil_div(N, BN)));
  const int m0 = tl.m * BM, n0 = tl.n * BN;
  const int tx = threadIdx.x % BN, ty = threadIdx.x / BN;
  float acc[TM] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    load_tile_scalar<BM, BK, 512, P>(As, x, M, K, m0, k0);
    load_tile_scalar<BN, BK, 512, P>(Bs, w, N, K, n0, k0);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float bv = Bs[k][tx];
#pragma unroll
      for (int i = 0; i < TM; ++i) acc[i] += As[k][ty * TM + i] * bv;
    }
    __syncthreads();
  }
  const int n = n0 + tx;
  if (n >= N) return;
  const float bias = b ? b[n] : 0.f;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + ty * TM + i;
    if (m < M) y[int64_t(m) * N + n] = acc[i] + bias;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// v5: 2D register blocking. 128x128 tile, BK = 8, 256 threads as 16x16; thread (ty, tx) computes the 8x8 block
// y[ty·8 + i, tx·8 + j]. Per k: 8 x values + 8 W values from shared memory feed 64 FMAs (scalar loads here).
// ---------------------------------------------------------------------------------------------------------------
constexpr int kBM = 128, kBN = 128, kP = 132;  // SIMT tile for v5..v8; pitch 132 words (16-B aligned rows)

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

// ---------------------------------------------------------------------------------------------------------------
// Warp tiling (v7, v8, v9): 8 warps as 2 (m) x 4 (n), warp tile 64x32; lanes as 8 (m) x 4 (n). A thread owns rows
// wm·64 + lm·4 + {0..3} and + 32, columns wn·32 + ln·4 + {0..3} and + 16. One LDS.128 of x quads reads 8 distinct
// consecutive quads (128 B, the rest broadcast), one of W quads 4 consecutive quads (64 B): one wavefront each.
// ---------------------------------------------------------------------------------------------------------------
// NQ = 2 (v7, v8): an 8x8 thread tile, warps 2 (m) x 4 (n) of 64x32, 256 threads.
// NQ = 4 (v9): an 8x16 thread tile (column quads 16 apart), warps 2 x 2 of 64x64, 128 threads.
template <int NQ>
struct WarpTile {
  static constexpr int WARPS_N = 128 / (16 * NQ), THREADS = 64 * WARPS_N;
  int row, col;  // this thread's first row / column inside the block tile
  __device__ __forceinline__ WarpTile() {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    row = (warp / WARPS_N) * 64 + (lane / 4) * 4;
    col = (warp % WARPS_N) * 16 * NQ + (lane % 4) * 4;
  }
};

// acc[i][4q + e] += x-row i · W-column (quad q, element e); rows i = 4·ha + r (ha: +0 / +32), columns 16 apart.
template <int P, int NQ>
__device__ __forceinline__ void warp_tile_step(float (&acc)[8][4 * NQ], const float (*As)[P], const float (*Bs)[P],
                                               int k, const WarpTile<NQ>& wt) {
  const float4 a0 = *reinterpret_cast<const float4*>(&As[k][wt.row]);
  const float4 a1 = *reinterpret_cast<const float4*>(&As[k][wt.row + 32]);
  const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  float bv[4 * NQ];
#pragma unroll
  for (int q = 0; q < NQ; ++q) {
    const float4 t = *reinterpret_cast<const float4*>(&Bs[k][wt.col + 16 * q]);
    bv[4 * q] = t.x; bv[4 * q + 1] = t.y; bv[4 * q + 2] = t.z; bv[4 * q + 3] = t.w;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4 * NQ; ++j) acc[i][j] += av[i] * bv[j];
}

template <int NQ>
__device__ __forceinline__ void warp_tile_store(const float (&acc)[8][4 * NQ], float* __restrict__ y,
                                                const float* __restrict__ b, int M, int N, int m0, int n0,
                                                const WarpTile<NQ>& wt, bool vec_out) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = m0 + wt.row + (i % 4) + (i / 4) * 32;
#pragma unroll
    for (int h = 0; h < NQ; ++h)
      store_quad(y, b, M, N, m, n0 + wt.col + 16 * h,
                 make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]), vec_out);
  }
}

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

// ---------------------------------------------------------------------------------------------------------------
// PTX wrappers: shared-memory addresses, cp.async, ldmatrix, mma.sync (sm_80+); mbarrier, TMA, wgmma (sm_90a).
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LAB_SM80 1
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LAB_SM90A 1
#endif

// 16-byte async copy global -> shared; bytes < 16 zero-fills the rest (0: all zeros, nothing read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
#ifdef LAB_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}
// 4-byte async copy (cp.async.ca: the only variant for sizes 4 and 8); bytes = 0 writes a zero.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int bytes) {
#ifdef LAB_SM80
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef LAB_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef LAB_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four 8x8 matrices of 16-bit elements (8 rows of 16 B each); lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#ifdef LAB_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

__device__ __forceinline__ uint32_t round_tf32(uint32_t f) {
  uint32_t r = f;
#ifdef LAB_SM80
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(f)));
#endif
  return r;
}

// D (16x8, fp32) += A (16 x k) · B (k x 8). Fragments (g = lane/4, t = lane%4): c0,c1 = D[g][2t..2t+1],
// c2,c3 = D[g+8][2t..2t+1].
__device__ __forceinline__ void mma_16x8(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], float) {
#ifdef LAB_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
__device__ __forceinline__ void mma_16x8(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bf16) {
#ifdef LAB_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// v8: v7 fed by asynchronous copies. cp.async moves each element global -> shared in the background (4-byte copies,
// so they can land transposed; zero-filled past M/N/K, so any K and any alignment works), into a ring of 4 stages:
// the copies for tile t+3 are in flight while tile t's BK·64 FMAs per thread run, no registers hold them, and there
// is one barrier per tile. (Staging the next tile through registers instead needs 16 more live registers; at the
// 128-register cap of 2 blocks per SM ptxas sank those loads below the FMAs, i.e. no overlap at all.)
// Copy mapping: 8 lanes per row cover 32 contiguous bytes (one sector); the transposed stores of a warp land in
// 32 distinct banks (word c·132 + r, c < 8, r < 4: bank 4c + r).
// The per-thread part of the copy that does not change along K, computed once: thread t copies column t % BK of rows
// t / BK + j·(THREADS / BK), j < ROWS·BK / THREADS. Per tile only the K predicate and the K offset change, which
// keeps the integer work per tile at a few instructions per copy (recomputing rows and bounds per tile cost ~100
// integer instructions per 512 FMAs).
template <int ROWS, int BK, int THREADS, int P>
struct TileCopy {
  static constexpr int PASSES = ROWS * BK / THREADS, STEP = THREADS / BK;  // rows apart between passes
  const float* src;  // row r0 + t/BK of the operand (its first row if that one is out of range)
  int64_t step;      // STEP rows, in elements
  uint32_t dst;      // byte offset of s[t%BK][t/BK] inside a stage
  uint32_t rows_ok;  // bit j: row of pass j is inside the operand
  int col;

  __device__ __forceinline__ TileCopy(const float* g, int rows_total, int K, int r0) {
    const int r = threadIdx.x / BK;
    col = threadIdx.x % BK;
    step = int64_t(STEP) * K;
    src = g + (r0 + r < rows_total ? int64_t(r0 + r) * K : 0);
    dst = uint32_t((col * P + r) * sizeof(float));
    rows_ok = 0;
#pragma unroll
    for (int j = 0; j < PASSES; ++j) rows_ok |= uint32_t(r0 + r + j * STEP < rows_total) << j;
  }
  // Copy the tile starting at column k0 into the stage at shared address `stage`. Interior tiles (every row in
  // range, the whole BK inside K) take the branch without predicates.
  __device__ __forceinline__ void issue(uint32_t stage, int k0, int K) const {
    if (rows_ok == (1u << PASSES) - 1 && k0 + BK <= K) {
      const float* p = src + k0 + col;
#pragma unroll
      for (int j = 0; j < PASSES; ++j) cp_async4(stage + dst + j * STEP * sizeof(float), p + j * step, 4);
      return;
    }
    const bool k_ok = k0 + col < K;
#pragma unroll
    for (int j = 0; j < PASSES; ++j) {
      const bool ok = k_ok && ((rows_ok >> j) & 1u);
      // a skipped copy (bytes = 0) reads nothing but is still given an address inside the operand
      cp_async4(stage + dst + j * STEP * sizeof(float), ok ? src + j * step + k0 + col : src, ok ? 4 : 0);
    }
  }
};

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

// ---------------------------------------------------------------------------------------------------------------
// v10 / v11: mma.sync tensor cores. 128x128 block tile, 8 warps as 2 (m) x 4 (n), warp tile 64x32 = 4x4 MMA tiles.
// Each stage holds 64 bytes of K (TF32: 16, bf16: 32 elements) for 128 rows of x and 128 rows of W, rows padded to
// 80 B so the 8 row addresses of an ldmatrix fall in 8 different 16-B bank groups (80·r mod 128 distinct, r < 8).
// Per 32 bytes of K (one MMA k-step, k8 TF32 / k16 bf16) the fragment addressing is the same in bytes for both
// types: A x4 = rows 0-15 x bytes {0-15, 16-31}; B x4 = n-rows {0-7, 8-15} x bytes {0-15, 16-31}.
// The pipeline: 4 stages of cp.async (16-B, zero-filled past M/N/K), wait for the oldest, refill the slot freed by
// the previous iteration, compute. kVec = false (K·size % 16 != 0 or unaligned) loads element-wise instead.
// ---------------------------------------------------------------------------------------------------------------
namespace mma {
constexpr int BM = 128, BN = 128, KB = 64, PITCH = 80, STAGES = 4, THREADS = 256;
constexpr int STAGE_BYTES = (BM + BN) * PITCH;
constexpr int SMEM = STAGES * STAGE_BYTES;  // 80 KB
}  // namespace mma

template <class T, bool kVec>
__global__ void __launch_bounds__(256) v10_mma_sync(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, int M, int N, int K,
                                                   bool vec_out) {
#ifdef LAB_SM80
  using namespace mma;
  constexpr int ES = sizeof(T), BK = KB / ES, EPC = 16 / ES;  // elements per 16-B chunk
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_u32(smem);
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, BM)), int(lab::ceil_div(N, BN)));
  const int m0 = tl.m * BM, n0 = tl.n * BN;
  const int nk = int(lab::ceil_div(K, BK));

  // 256 rows (x then W) x 4 chunks of 16 B per stage: 4 chunks per thread.
  auto load_stage = [&](int kt, int slot) {
    const uint32_t s0 = sbase + slot * STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < (BM + BN) * 4 / THREADS; ++i) {
      const int c = threadIdx.x + i * THREADS, row = c / 4, ch = c % 4;
      const bool is_x = row < BM;
      const int r = is_x ? m0 + row : n0 + row - BM;
      const bool row_ok = r < (is_x ? M : N);
      const int k = kt * BK + ch * EPC;
      const uint32_t dst = s0 + row * PITCH + ch * 16;
      const T* src = is_x ? x : w;
      if constexpr (kVec) {
        const int bytes = row_ok ? max(0, min(EPC, K - k)) * ES : 0;
        cp_async16(dst, bytes > 0 ? src + int64_t(r) * K + k : src, bytes);
      } else {
        T* d = reinterpret_cast<T*>(smem + (dst - sbase));
#pragma unroll
        for (int e = 0; e < EPC; ++e) d[e] = (row_ok && k + e < K) ? src[int64_t(r) * K + k + e] : from_f<T>(0.f);
      }
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % 2, wn = warp / 2;
  float acc[4][4][4] = {};

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();  // stage kt has landed (for this thread) ...
    __syncthreads();              // ... for every thread; and slot (kt-1)%STAGES is no longer read
    if (kt + STAGES - 1 < nk) load_stage(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
    cp_async_commit();
    const uint32_t sa = sbase + (kt % STAGES) * STAGE_BYTES, sb = sa + BM * PITCH;
#pragma unroll
    for (int ks = 0; ks < KB / 32; ++ks) {
      uint32_t a[4][4], bq[4][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        ldmatrix_x4(a[mt], sa + (wm * 64 + mt * 16 + lane % 16) * PITCH + ks * 32 + (lane / 16) * 16);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, sb + (wn * 32 + np * 16 + (lane / 16) * 8 + lane % 8) * PITCH + ks * 32 + ((lane / 8) % 2) * 16);
        bq[2 * np][0] = r[0];
        bq[2 * np][1] = r[1];
        bq[2 * np + 1][0] = r[2];
        bq[2 * np + 1][1] = r[3];
      }
      if constexpr (sizeof(T) == 4) {  // TF32: round to nearest (the tensor core would truncate the low 13 bits)
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = round_tf32(a[mt][e]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) bq[nt][e] = round_tf32(bq[nt][e]);
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_16x8(acc[mt][nt], a[mt], bq[nt], T());
    }
  }
  cp_async_wait<0>();  // no copy may still be writing shared memory when the block exits

  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int r = m0 + wm * 64 + mt * 16 + g, c = n0 + wn * 32 + nt * 8 + 2 * t4;
      store_pair<T>(y, b, M, N, r, c, acc[mt][nt][0], acc[mt][nt][1], vec_out);
      store_pair<T>(y, b, M, N, r + 8, c, acc[mt][nt][2], acc[mt][nt][3], vec_out);
    }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// v12 / v13: Hopper. TMA writes each stage in the 128-B swizzled K-major layout (rows of 128 B = 32 fp32 or 64 bf16
// along K, 16-B chunks XOR-ed with row % 8); wgmma reads it through a shared-memory descriptor: start address,
// stride between 8-row groups (SBO = 1024 B), swizzle mode. One wgmma covers 32 bytes of K (k8 TF32, k16 bf16), so
// the k-th step of a stage starts 32·k bytes into the row (the swizzle is applied on the address, base 1024-aligned).
// Roles: warpgroup 0 is the producer (one thread issues the TMA loads; its registers are given back with
// setmaxnreg), warpgroups 1 and 2 each own 64 rows x BN columns of the 128 x BN tile, accumulators in registers.
// Barriers per stage: full (TMA bytes landed: expect_tx by the producer) and empty (8 consumer warps done reading).
// Consumers keep one wgmma group in flight: issue stage k, wait until stage k-1's group retired, release k-1.
// ---------------------------------------------------------------------------------------------------------------
namespace wg {
template <class T, int BN>
struct Cfg {
  static constexpr int BM = 128, ES = sizeof(T), BK = 128 / ES, KSTEP = 32 / ES;
  static constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128, STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int STAGES = BN == 256 ? 4 : 6;  // 192 KB of stages either way
  static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 /* alignment slack */ + 2 * STAGES * 8 /* barriers */;
};
}  // namespace wg

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_fence_init() {
#ifdef LAB_SM90A
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef LAB_SM90A
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
#endif
}
// TMA: the box at (c0 along K, c1 along rows) of the tensor map -> shared memory at dst; completes on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#ifdef LAB_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef LAB_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef LAB_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef LAB_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef LAB_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
// Keep the compiler from moving accumulator reads/writes across the asynchronous wgmma window.
template <int N>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor: K-major operand in the 128-B swizzle layout.
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4)  // start address, 16-B units
         | (uint64_t(16 >> 4) << 16)       // leading-dimension byte offset (unused for swizzled K-major)
         | (uint64_t(1024 >> 4) << 32)     // stride byte offset: 8 rows x 128 B
         | (uint64_t(1) << 62);            // 128-B swizzle
}

// The wgmma instructions: D (64 x N, fp32 registers, 128 threads) += A (64 x k, smem) · B (k x N, smem as N x k).
// Register d[4j + {0,1,2,3}] of a thread (warp w, lane l) is D[16w + l/4 + {0,0,8,8}][8j + 2(l%4) + {0,1,0,1}].

__device__ __forceinline__ void wgmma_m64n256k16_bf16(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef LAB_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
      "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
      "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
      "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wgmma_m64n128k16_bf16(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef LAB_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63 "
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wgmma_m64n256k8_tf32(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef LAB_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
      "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
      "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
      "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
      "}, %128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wgmma_m64n128k8_tf32(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef LAB_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63 "
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
#endif
}

template <class T, int BN>
__device__ __forceinline__ void wgmma_step(float* d, uint64_t da, uint64_t db) {
  if constexpr (sizeof(T) == 2) {
    if constexpr (BN == 256) wgmma_m64n256k16_bf16(d, da, db, 1);
    else wgmma_m64n128k16_bf16(d, da, db, 1);
  } else {
    if constexpr (BN == 256) wgmma_m64n256k8_tf32(d, da, db, 1);
    else wgmma_m64n128k8_tf32(d, da, db, 1);
  }
}

template <class T, int BN>
__global__ void __launch_bounds__(384, 1) v12_wgmma(const __grid_constant__ CUtensorMap tmx,
                                                    const __grid_constant__ CUtensorMap tmw, const T* __restrict__ b,
                                                    T* __restrict__ y, int M, int N, int K, bool vec_out) {
#ifdef LAB_SM90A
  using C = wg::Cfg<T, BN>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t s0 = (smem_u32(smem_raw) + 1023) & ~1023u;  // the swizzle pattern repeats every 1024 B
  const uint32_t full = s0 + C::STAGES * C::STAGE_BYTES, empty = full + C::STAGES * 8;
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, C::BM)), int(lab::ceil_div(N, BN)));
  const int nk = int(lab::ceil_div(K, C::BK));
  const int role = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(full + 8 * s, 1);   // the producer's arrive.expect_tx, then the TMA bytes
      mbar_init(empty + 8 * s, 8);  // one arrive per consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (role == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % C::STAGES;
        if (kt >= C::STAGES) mbar_wait(empty + 8 * s, ((kt / C::STAGES) + 1) & 1);  // consumers freed it
        mbar_expect_tx(full + 8 * s, C::STAGE_BYTES);  // the full box counts, zero-filled parts included
        const uint32_t sa = s0 + s * C::STAGE_BYTES;
        tma_load_2d(sa, &tmx, kt * C::BK, tl.m * C::BM, full + 8 * s);
        tma_load_2d(sa + C::A_BYTES, &tmw, kt * C::BK, tl.n * BN, full + 8 * s);
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int c = role - 1;  // rows 64c .. 64c+63 of the tile
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
    const int lane = threadIdx.x % 32;
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % C::STAGES;
      mbar_wait(full + 8 * s, (kt / C::STAGES) & 1);
      const uint32_t sa = s0 + s * C::STAGE_BYTES + c * 64 * 128, sb = s0 + s * C::STAGE_BYTES + C::A_BYTES;
      fence_regs<BN / 2>(d);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < C::BK / C::KSTEP; ++kk) wgmma_step<T, BN>(d, wg_desc(sa + 32 * kk), wg_desc(sb + 32 * kk));
      wgmma_commit();
      wgmma_wait<1>();  // the group of stage kt-1 has retired: its shared memory can be refilled
      fence_regs<BN / 2>(d);
      if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((kt - 1) % C::STAGES));
    }
    wgmma_wait<0>();
    fence_regs<BN / 2>(d);
    const int tid = threadIdx.x % 128;
    const int r = tl.m * C::BM + c * 64 + (tid / 32) * 16 + lane / 4;
    const int cb = tl.n * BN + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      store_pair<T>(y, b, M, N, r, cb + 8 * j, d[4 * j], d[4 * j + 1], vec_out);
      store_pair<T>(y, b, M, N, r + 8, cb + 8 * j, d[4 * j + 2], d[4 * j + 3], vec_out);
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// v14: GEMV for small M. One warp per W row; a lane issues all U of its 16-byte loads of the row (predicated past
// the end) before the first FMA, so a row costs one memory round trip (K = 1280: 10 loads per lane; U = 12 covers
// K <= 1536 in one batch). W is read with ld.global.nc.L1::no_allocate (read once); x (M <= MR rows) is staged in
// shared memory once per block. The grid is what fits on the GPU at once (one wave); warp w of block g takes rows
// w·G + g, w·G + g + 8G, ..., so the rows in flight are spread evenly over the SMs. Memory-bound: bytes = N·K·4.
// (The first version, one row per warp for all 5893 rows, 8 + 2 loads per lane, x through L1, took 18.9 us at
// fc_out batch 1 on the H100 = 53% of copy: 5 blocks per SM fit, so 737 blocks ran as a wave and a 12% tail, and
// every row cost two memory round trips.) The rework measured 18.5-18.7 us (54% of copy): no better. Why the goal
// (85% of the large-copy rate, 12.0 us) is out of reach at this size, measured by .ci/l2_flush_probe.py on the H100
// (results/l2_flush_probe.txt; medians, us, after the lab's write flush | after a read flush):
//   30.2 MB (fc_out's W, below the 50 MB L2): v14 18.6 | 16.0, cuBLAS 20.7 | 16.1, w.sum() 23.1 | 18.7,
//                                             copying W 28.1 | 22.0 (2745 GB/s counting both directions)
//   121 MB (4x the rows, above the L2):       v14 51.9 | 45.9 (2628 GB/s = 88% of copy), cuBLAS 57.6 | 47.9
// Two things cost: the write flush leaves the L2 dirty and the kernel's misses pay the write-back (2.6 us here), and
// a 30 MB read is too short to reach the streaming rate: the read rate rises with size (w.sum() 1612 GB/s at 30 MB,
// 2498 at 121 MB), and v14 is already faster than torch's read-only reduction of W and equal to cuBLAS. At 121 MB
// the same kernel reaches 88% of copy after a read flush.
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ float4 ldg_stream(const float4* p) {
  float4 v;
  asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, a.w * b.w)));
}

// kVec: K % 4 == 0 and 16-byte aligned x, W (else scalar loads); kSmemX: x (M <= MR rows) staged in shared memory.
template <int MR, int U, bool kVec, bool kSmemX>
__global__ void __launch_bounds__(256) v14_gemv(const float* __restrict__ x, const float* __restrict__ w,
                                                const float* __restrict__ b, float* __restrict__ y, int M, int N,
                                                int K) {
  extern __shared__ __align__(16) float xs[];
  const int lane = threadIdx.x % 32;
  if constexpr (kSmemX) {
    const int n4 = M * K / 4;
    for (int i = threadIdx.x; i < n4; i += blockDim.x)
      reinterpret_cast<float4*>(xs)[i] = __ldg(reinterpret_cast<const float4*>(x) + i);
    __syncthreads();
  }
  const int64_t stride = int64_t(gridDim.x) * 8;
  for (int64_t n = int64_t(threadIdx.x / 32) * gridDim.x + blockIdx.x; n < N; n += stride) {
    const float* wr = w + n * K;
    for (int m0 = 0; m0 < M; m0 += MR) {
      const int rows = min(MR, M - m0);
      float acc[MR] = {};
      if constexpr (kVec) {
        const int K4 = K / 4;
        const float4* w4 = reinterpret_cast<const float4*>(wr);
        const float4* x4 = reinterpret_cast<const float4*>(kSmemX ? xs : x + int64_t(m0) * K);
        for (int k = lane; k < K4; k += 32 * U) {
          float4 wv[U];
#pragma unroll
          for (int u = 0; u < U; ++u)
            wv[u] = k + 32 * u < K4 ? ldg_stream(w4 + k + 32 * u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int r = 0; r < MR; ++r) {
            if (r < rows) {
#pragma unroll
              for (int u = 0; u < U; ++u)
                if (k + 32 * u < K4) acc[r] += dot4(wv[u], x4[int64_t(r) * K4 + k + 32 * u]);
            }
          }
        }
      } else {
        for (int k = lane; k < K; k += 32) {
          const float wv = __ldg(wr + k);
#pragma unroll
          for (int r = 0; r < MR; ++r)
            if (r < rows) acc[r] += wv * __ldg(x + int64_t(m0 + r) * K + k);
        }
      }
#pragma unroll
      for (int r = 0; r < MR; ++r)
#pragma unroll
        for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
      if (lane == 0) {
        const float bias = b ? b[n] : 0.f;
#pragma unroll
        for (int r = 0; r < MR; ++r)
          if (r < rows) y[int64_t(m0 + r) * N + n] = acc[r] + bias;
      }
    }
  }
}

// The launch of v14 for one configuration: the grid is the number of blocks resident at once (or fewer, one row
// per warp), or `blocks` when given (> 0; the tuning sweep).
template <int MR, int U, bool kVec, bool kSmemX>
cudaError_t launch_gemv_cfg(const float* x, const float* w, const float* b, float* y, int M, int N, int K,
                            int blocks, cudaStream_t s) {
  auto kernel = v14_gemv<MR, U, kVec, kSmemX>;
  const int smem = kSmemX ? M * K * int(sizeof(float)) : 0;
  if (blocks <= 0) {
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, smem);
    if (e != cudaSuccess) return e;
    blocks = int(std::min<int64_t>(lab::ceil_div(N, 8), int64_t(std::max(per_sm, 1)) * lab::sm_count()));
  }
  kernel<<<unsigned(blocks), 256, smem, s>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------------------------------------------
inline int device_major() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major;
}

// cuTensorMapEncodeTiled lives in the driver (libcuda); fetched through the runtime so the module needs no -lcuda.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return EncodeTiled(nullptr);
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A (rows, K) row-major matrix as a 2-D tensor map with a (box_rows, 128 B) box, 128-B swizzle, zeros out of bounds.
inline bool make_tensor_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int elem_size, int K,
                            int rows, int box_rows) {
  const EncodeTiled encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(K) * elem_size};  // bytes between rows; must be a multiple of 16
  const cuuint32_t box[2] = {cuuint32_t(128 / elem_size), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class T>
cudaError_t launch_fill(const T* b, T* y, int M, int N, cudaStream_t s) {
  fill_bias<T><<<lab::grid_stride_blocks(int64_t(M) * N, 256), 256, 0, s>>>(b, y, M, N);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_mma(const T* x, const T* w, const T* b, T* y, int M, int N, int K, bool vec_in, bool vec_out,
                       cudaStream_t s) {
  if (device_major() < 8) return cudaErrorNotSupported;  // mma.sync / cp.async / ldmatrix need sm_80+
  const int64_t g = tiles(M, N, mma::BM, mma::BN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  auto kernel = vec_in ? v10_mma_sync<T, true> : v10_mma_sync<T, false>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mma::SMEM);
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(g), mma::THREADS, mma::SMEM, s>>>(x, w, b, y, M, N, K, vec_out);
  return cudaGetLastError();
}

template <class T, int BN>
cudaError_t launch_wgmma_bn(const T* x, const T* w, const T* b, T* y, int M, int N, int K, bool vec_out,
                            cudaStream_t s) {
  using C = wg::Cfg<T, BN>;
  constexpr CUtensorMapDataType dt = sizeof(T) == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUtensorMap tmx, tmw;
  if (!make_tensor_map(&tmx, x, dt, C::ES, K, M, C::BM) || !make_tensor_map(&tmw, w, dt, C::ES, K, N, BN))
    return cudaErrorInvalidValue;
  const int64_t g = tiles(M, N, C::BM, BN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  auto kernel = v12_wgmma<T, BN>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(g), 384, C::SMEM, s>>>(tmx, tmw, b, y, M, N, K, vec_out);
  return cudaGetLastError();
}

// v12/v13: 128x256 tiles when they fill the GPU, else 128x128 (twice the blocks: fc_out at M = 128 has 24 tiles of
// 256 columns for 132 SMs). TMA needs 16-byte aligned rows: otherwise the mma.sync kernel of the same precision.
template <class T>
cudaError_t launch_wgmma(const T* x, const T* w, const T* b, T* y, int M, int N, int K, bool vec_out,
                         cudaStream_t s) {
  if (device_major() != 9) return cudaErrorNotSupported;  // wgmma/TMA: Hopper (the module is built for sm_90a)
  const bool tma_ok = (int64_t(K) * sizeof(T)) % 16 == 0 && aligned(x, 16) && aligned(w, 16);
  if (!tma_ok) return launch_mma<T>(x, w, b, y, M, N, K, false, vec_out, s);
  if (tiles(M, N, 128, 256) >= lab::sm_count()) return launch_wgmma_bn<T, 256>(x, w, b, y, M, N, K, vec_out, s);
  return launch_wgmma_bn<T, 128>(x, w, b, y, M, N, K, vec_out, s);
}

template <int NQ, int BK, int STAGES>
cudaError_t launch_async(const float* x, const float* w, const float* b, float* y, int M, int N, int K, bool vec_out,
                         cudaStream_t s) {
  if (device_major() < 8) return cudaErrorNotSupported;  // cp.async: sm_80+
  const int64_t g = tiles(M, N, kBM, kBN);
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  async_copy_warptile<NQ, BK, STAGES><<<unsigned(g), WarpTile<NQ>::THREADS, 0, s>>>(x, w, b, y, M, N, K, vec_out);
  return cudaGetLastError();
}

constexpr int kGemvU = 12;  // 16-byte loads in flight per lane in v14 (K <= 1536 in one batch; 75 registers at M = 1)

cudaError_t forward_f32(int version, const float* x, const float* w, const float* b, float* y, int M, int N, int K,
                        cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  if (K == 0) return launch_fill<float>(b, y, M, N, s);
  const bool vec_in = K % 4 == 0 && aligned(x, 16) && aligned(w, 16);
  const bool vec4_out = N % 4 == 0 && aligned(y, 16) && (!b || aligned(b, 16));
  const bool vec2_out = N % 2 == 0 && aligned(y, 8) && (!b || aligned(b, 8));
  int64_t g = 0;
  switch (version) {
    case 1:
      g = tiles(M, N, 8, 32);
      if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
      v1_naive<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K);
      break;
    case 2:
      g = lab::ceil_div(int64_t(M) * N, 8);
      if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
      v2_coalesced<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K);
      break;
    case 3:
      g = tiles(M, N, 32, 32);
      if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
      v3_smem_tiles<<<unsigned(g), 1024, 0, s>>>(x, w, b, y, M, N, K);
      break;
    case 4:
      g = tiles(M, N, 64, 64);
      if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
      v4_blocktile_1d<<<unsigned(g), 512, 0, s>>>(x, w, b, y, M, N, K);
      break;
    case 5:
    case 6:
    case 7:
    case 8:
      g = tiles(M, N, kBM, kBN);
      if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
      if (version == 5)
        v5_blocktile_2d<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K, vec4_out);
      else if (version == 6)
        (vec_in ? v6_vectorized<true> : v6_vectorized<false>)<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K,
                                                                                           vec4_out);
      else if (version == 7)
        (vec_in ? v7_warptile<true> : v7_warptile<false>)<<<unsigned(g), 256, 0, s>>>(x, w, b, y, M, N, K, vec4_out);
      else
        return launch_async<2, kAsyncBK, kAsyncStages>(x, w, b, y, M, N, K, vec4_out, s);
      break;
    case 9:
      return launch_async<4, kAsyncBK, kAsyncStages>(x, w, b, y, M, N, K, vec4_out, s);
    case 10:
      return launch_mma<float>(x, w, b, y, M, N, K, vec_in, vec2_out, s);
    case 12:
      return launch_wgmma<float>(x, w, b, y, M, N, K, vec2_out, s);
    case 14: {
      if (!vec_in) return launch_gemv_cfg<4, 1, false, false>(x, w, b, y, M, N, K, 0, s);
      const bool smem_x = M <= 4 && int64_t(M) * K * 4 <= 48 * 1024;
      if (M == 1)
        return smem_x ? launch_gemv_cfg<1, kGemvU, true, true>(x, w, b, y, M, N, K, 0, s)
                      : launch_gemv_cfg<1, kGemvU, true, false>(x, w, b, y, M, N, K, 0, s);
      return smem_x ? launch_gemv_cfg<4, kGemvU, true, true>(x, w, b, y, M, N, K, 0, s)
                    : launch_gemv_cfg<4, kGemvU, true, false>(x, w, b, y, M, N, K, 0, s);
    }
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t forward_bf16(int version, const bf16* x, const bf16* w, const bf16* b, bf16* y, int M, int N, int K,
                         cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  if (K == 0) return launch_fill<bf16>(b, y, M, N, s);
  const bool vec_in = K % 8 == 0 && aligned(x, 16) && aligned(w, 16);
  const bool vec2_out = N % 2 == 0 && aligned(y, 4) && (!b || aligned(b, 4));
  switch (version) {
    case 11:
      return launch_mma<bf16>(x, w, b, y, M, N, K, vec_in, vec2_out, s);
    case 13:
      return launch_wgmma<bf16>(x, w, b, y, M, N, K, vec2_out, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace linear

// ---- the launchers cpp_src/linear.cpp calls ----------------------------------------------------------------------
// version: 1..10, 12, 14 take float32 (v10/v12 multiply in TF32); 11 and 13 take bfloat16 (passed as raw 16-bit).
cudaError_t linear_forward_f32(int version, const float* x, const float* w, const float* b, float* y, int M, int N,
                               int K, cudaStream_t stream) {
  return linear::forward_f32(version, x, w, b, y, M, N, K, stream);
}

cudaError_t linear_forward_bf16(int version, const void* x, const void* w, const void* b, void* y, int M, int N,
                                int K, cudaStream_t stream) {
  using linear::bf16;
  return linear::forward_bf16(version, static_cast<const bf16*>(x), static_cast<const bf16*>(w),
                              static_cast<const bf16*>(b), static_cast<bf16*>(y), M, N, K, stream);
}
