// linear — nn.Linear's forward, y = x · Wᵀ + b, as a ladder of GEMM kernels from the naive loop to Hopper's
// tensor cores (op linear); and a second op, gemv: the same layer at a few rows (the decoder's output layer at
// batch 1), a memory-bound GEMV with a version of its own.
//
//   x: (M, K) row-major (the binding flattens leading dims: M = batch·seq), W: (N, K) row-major — nn.Linear.weight
//   (out_features, in_features) read in place, never transposed or copied —, b: (N,) or null, y: (M, N).
//   reference: torch.nn.functional.linear (float64 in the checks; cuBLAS at the same precision in the benchmarks).
//   Both operands are K-contiguous (BLAS "TN"): a coalesced load walks K, so every tiled kernel stores its x and W
//   tiles K-major-transposed in shared memory (SIMT) or reads them K-major (tensor cores, which want exactly this).
//
// Versions of the GEMM (each adds one idea to the one before; all are kept and all take any size). Precision is a
// dimension of a version, not a rung: v1..v9 and v12 take float32 tensors; v10 and v11 take float32 (multiplying in
// TF32) or bfloat16 tensors, one kernel template built once per dtype.
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
//   v10: tensor cores through mma.sync — float32: m16n8k8 on operands rounded to TF32 (10-bit mantissa, cvt.rna);
//        bfloat16: m16n8k16, half the bytes per operand and twice the MMA rate of TF32. Fragments by ldmatrix from
//        padded shared rows (conflict-free), a 4-stage cp.async pipeline; fp32 accumulate.
//   v11: Hopper wgmma — a warpgroup issues asynchronous 64x256x8 (TF32) or 64x256x16 (bf16) MMAs that read both
//        operands from shared memory in the 128-B swizzled layout TMA writes; one producer warp drives TMA
//        (cp.async.bulk.tensor) through 4 mbarrier-guarded stages while two consumer warpgroups compute a 128x256
//        tile. On float32 the tensor core reads the fp32 bits and drops the low 13 mantissa bits (truncation; v10
//        rounds): ~2.6x the rounding error of TF32, still 5x inside the TF32 tolerance. Needs K·sizeof(T) % 16 == 0
//        (TMA's stride rule), else it runs v10's kernel of the same dtype.
//   v12: v8 for outputs too small to fill the GPU (the decoder's fc_out at batch <= 128: 47 tiles for 132 SMs): K
//        split into S slices over a thread-block cluster (sm_90), partial tiles summed through distributed shared
//        memory in one launch; S = 1 where the tiles fill the GPU. float32. The default (lab/kernels/linear.py,
//        fastest) runs it where v8's tiles are fewer than the SMs, above the gemv op's rows.
// The gemv op (M rows, a few):
//   gemv v1: one warp per W row, all of a lane's 16-byte loads of the row in flight at once, x in shared memory,
//        one wave of blocks; memory-bound: the goal is copy bandwidth on the weight. float32.
// All tiled versions visit tiles in groups of 8 block-rows (consecutive blocks share W tiles in L2) on a 1-D grid.
// K == 0: y = b (or 0), written by a fill kernel.
//
// Napkin math (H100 SXM datasheet; the lab measures its own ceilings and prints them beside every timing):
//   4096^3: 2·4096^3 = 137 GFLOP; bytes 3·64 MiB = 201 MB -> 0.06 ms at 3.35 TB/s, so compute-bound by ~30x.
//   FP32 SIMT peak 132 SMs · 128 FMA/clk · 2 · 1.98 GHz = 66.9 TFLOP/s.
//   v7/v8's inner step per thread: 4 LDS.128 + 64 FFMA, so at best 94% of issue slots are FMAs; v8's main loop
//   (SASS) issues 512 FFMA, 32 LDS.128, 8 LDGSTS and ~45 other instructions per tile: ~87% FMAs. v9: 6 LDS.128
//   per 128 FFMA (96%), 1024 FFMA per 16 LDGSTS per tile.
//   Tensor cores (dense, datasheet): TF32 495, bf16 989 TFLOP/s.
//   fc_out at batch 1: W is 5893·1280·4 B = 30.2 MB -> 9 us at 3.35 TB/s.
//
// What bounds the best SIMT rung (Nsight Compute at 4096^3, .ci/sgemm_stalls.py; the measured tables are in
// results/<device>/profiles/linear_sgemm_4096_ncu_*.csv and notebook 02): v9 issues about as many instructions as
// cuBLAS's FFMA kernel (which also runs 128x128 tiles of 4 warps, 2 blocks an SM), with a similar FFMA share, but at a
// lower issue rate per scheduler (0.72 against 0.90 on the H100). Source-level sampling (..._ncu_source_*.csv;
// `.ci/sgemm_stalls.py summarize` prints it by opcode) puts v9's extra stalls on two LEAs waiting on the long
// scoreboard right after a tile's cp.async copies are issued (one computes a stage's shared address; by the SASS, a
// wait to overwrite registers the copies in flight still read), on dispatch stalls of the FFMAs themselves (about
// twice cuBLAS's share), and on fixed-latency waits at LDGSTS, BRA and IADD3; v8, with 4 warps per scheduler, loses
// most at its barrier and in dispatch.
// Three more designs were built and timed against v8/v9 on the H100 for issue 14's 90% goal (branch
// next/sgemm-designs, whose v13.cu header holds the table and the stalls): fragments double-buffered in registers
// across the tile boundary (A: the shared-load waits became dispatch and fixed-latency waits, 3% slower than v9);
// v9's and v8's kernels at BK 16 in 3 stages (B: the fewest instructions of all, fewer than cuBLAS's, at v9's issue
// rate; at 2048^3 and 4096^3 v9's 2-4% faster than v9 and v8's 0-2% faster than v8, v9's slower at 1024^3; 82% of
// cuBLAS at best); k-major tiles
// filled by 16-byte copies (C: a quarter of the copy instructions, slower: more dispatch and long-scoreboard stalls).
// None is kept: what separates these kernels from cuBLAS's is how the same instructions are scheduled and their
// registers allocated (FFMA operand collection): ptxas decides that, not the CUDA source.
// Timings of every rung against cuBLAS, and the goals' margins: results/<device>/results.csv and notebook 02.
//
// Units (each its own build, so an edit rebuilds one; see lab/build.py): this header holds what they all share (fp32
// helpers, cp.async wrappers); simt.cuh the SIMT tile pieces of v4..v9; tc.cuh what the tensor-core units share (bf16,
// the paired epilogue store, ldmatrix/mma.sync wrappers); wgmma.cuh the Hopper wrappers of v11.
//   v1.cu .. v7.cu   one version each                 v8_v9.cu     async_copy_warptile, built per version (variants)
//   v10.cu           v10_mma_sync, built per dtype     v11.cu       v11_wgmma, built per dtype
//   gemv_v1.cu       the GEMV (op gemv)                fill.cu      K == 0: y = b
//   v12.cu           splitk_warptile (cluster split-K)
// The binding (cpp_src/linear/linear.cpp) picks the launcher: nothing when M or N is 0, fill when K == 0, and
// v10's for v11 when TMA cannot take the operands.
// Launchers (exported to cpp_src/linear/linear.cpp, looked up by name there):
//   cudaError_t (const T* x, const T* w, const T* b, T* y, int M, int N, int K, cudaStream_t), T = float or bf16
//   (the binding passes at::BFloat16*, the same 16-bit layout); M, N, K > 0 (the binding handles the empty cases).
#pragma once
#include "lab_cuda.cuh"
#include "lab_gemm.cuh"

#include <cstdint>

#include "lab_unit.h"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------------------------
inline bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

using lab::Tile;
using lab::tile_of;

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

// What the launchers choose their paths by (forward_f32 / forward_bf16 computed these once for every version; now
// each launcher asks for the ones it uses). 16-byte loads along K: K a multiple of 16 B and both bases aligned.
inline bool vec_in(const float* x, const float* w, int K) { return K % 4 == 0 && aligned(x, 16) && aligned(w, 16); }
// 16-byte (float4) stores of y and loads of b.
inline bool vec4_out(const float* y, const float* b, int N) {
  return N % 4 == 0 && aligned(y, 16) && (!b || aligned(b, 16));
}
// 2-element stores (tensor-core epilogues; the bf16 ones: tc.cuh).
inline bool vec2_out(const float* y, const float* b, int N) {
  return N % 2 == 0 && aligned(y, 8) && (!b || aligned(b, 8));
}

inline int device_major() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major;
}

// ---------------------------------------------------------------------------------------------------------------
// PTX wrappers: shared-memory addresses, cp.async and ldmatrix (sm_80+) and the tile order live in
// cuda_src/lab_gemm.cuh (shared with sparse24); mma.sync: tc.cuh; mbarrier, TMA and wgmma (sm_90a): wgmma.cuh.
// ---------------------------------------------------------------------------------------------------------------
using lab::cp_async16;
using lab::cp_async4;
using lab::cp_async_commit;
using lab::cp_async_wait;
using lab::smem_u32;

}  // namespace linear
