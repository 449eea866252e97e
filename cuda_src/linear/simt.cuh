// linear/simt.cuh — what the SIMT units share: the tile loaders of v4..v7, the 128x128 tile of v5..v9 and the
// warp-tiled thread layout of v7..v9 (the ladder: linear.cuh).
#pragma once

#include "linear.cuh"

namespace linear {

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

constexpr int kBM = 128, kBN = 128, kP = 132;  // SIMT tile for v5..v8; pitch 132 words (16-B aligned rows)

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
// HALVES = 1: rows +0..3 only (v12, where a warp's rows +32.. are all past M: half the FMAs, one LDS.128 of x).
template <int P, int NQ, int HALVES = 2>
__device__ __forceinline__ void warp_tile_step(float (&acc)[8][4 * NQ], const float (*As)[P], const float (*Bs)[P],
                                               int k, const WarpTile<NQ>& wt) {
  float av[8];
#pragma unroll
  for (int ha = 0; ha < HALVES; ++ha) {
    const float4 a = *reinterpret_cast<const float4*>(&As[k][wt.row + 32 * ha]);
    av[4 * ha] = a.x; av[4 * ha + 1] = a.y; av[4 * ha + 2] = a.z; av[4 * ha + 3] = a.w;
  }
  float bv[4 * NQ];
#pragma unroll
  for (int q = 0; q < NQ; ++q) {
    const float4 t = *reinterpret_cast<const float4*>(&Bs[k][wt.col + 16 * q]);
    bv[4 * q] = t.x; bv[4 * q + 1] = t.y; bv[4 * q + 2] = t.z; bv[4 * q + 3] = t.w;
  }
#pragma unroll
  for (int i = 0; i < 4 * HALVES; ++i)
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

// ---------------------------------------------------------------------------------------------------------------
// cp.async tile copies of v8, v9 and v12 (the mapping and why: v8_v9.cu)
// ---------------------------------------------------------------------------------------------------------------
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

}  // namespace linear
