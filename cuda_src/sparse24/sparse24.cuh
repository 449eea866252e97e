// sparse24 — nn.Linear's forward, y = x·Wᵀ + b, with a weight W pruned to 2:4 structured sparsity: in every aligned
// group of 4 consecutive elements of a row of W, at most 2 are nonzero. Hopper's (and Ampere's) tensor cores have a
// sparse MMA, mma.sp, that takes such an A operand compressed to half its columns plus 4 bits of metadata per group,
// and skips the zeros: twice the dense MMA rate on paper, and half the weight bytes for a memory-bound GEMV.
//
//   x: (M, K) row-major (the binding flattens leading dims), W: (N, K) as nn.Linear stores it, pruned to 2:4 along K,
//   b: (N,) or null, y: (M, N). dtype bf16 or fp16; fp32 accumulation. reference: F.linear with the pruned dense W
//   (float64 in the checks; dense cuBLAS at the same precision in the benchmarks).
//
// The lab's compressed format (written by compress.cu / cpp_src/sparse24/cpu.cpp, read by every version):
//   Kp = K rounded up to a multiple of 32 (the padded groups are all zeros: valid 2:4 groups)
//   values (N, Kp/2), W's dtype: group j of row n keeps 2 elements, in increasing column order, at values[n][2j..2j+1]
//   meta   (N, Kp/32) int32:     group j's nibble i0 | i1 << 2 (the kept columns 4j+i0 < 4j+i1) at bits 4·(j%8) of
//                                word j/8. A group with fewer than 2 nonzeros keeps zeros at its lowest free positions,
//                                so every nibble is one of the six valid ones (never 0b0000/0101/1010/1111, which the
//                                PTX ISA calls undefined behaviour).
//   One word covers 32 columns of one row: exactly what one m16n8k32 step of mma.sp needs from that row (below).
//
// Versions (each kept; all take any M, N, K):
//   v1: SIMT, one warp per row of W (the GEMV of the decoder's fc_out and of batch-1 inference). A lane reads 16 B of
//       values (4 groups) and their 16 bits of metadata per step, all U steps of a row in flight before the first
//       FMA, and picks the 2 x values of each group by the nibble from a 16-element window of x staged in shared
//       memory (two LDS.128: conflict-free, no run-time register indexing). Memory-bound on the compressed weight.
//   v2: tensor cores, mma.sp.sync m16n8k32 (A = the compressed W tile from shared memory by ldmatrix, B = x rows
//       by ldmatrix, fp32 accumulators), a 128 (rows of W) x 128 (rows of x) block tile, 8 warps of 64 x 32, BK = 64,
//       a 3-stage cp.async ring, the y tile staged in shared memory for 16-B stores. For large M.
//   v3: v1 with two rows of W per warp in flight at once (at M <= 2; above, where the registers would spill, v1):
//       twice the bytes per warp at once at the same occupancy, for the GEMV's latency-bound stream. Measured
//       slower than v1 on the H100 (gemv.cu says why we think so); kept as the rung that did not pay.
//   v4: tensor cores, Hopper's wgmma.mma_async.sp m64n256k32 (A = the compressed W tile, B = x, both read from
//       shared memory through descriptors; the metadata a register), fed by TMA into a 5-stage mbarrier ring by a
//       producer warpgroup, two consumer warpgroups on a 128 (rows of W) x 256 (rows of x) tile: linear v11's
//       structure with the sparse instruction. Needs K % 8 == 0 and aligned x (TMA) and a Hopper GPU; else v2.
//
// Napkin math (H100 SXM datasheet; the lab measures its own ceilings):
//   bytes of W, 16-bit: dense 2·N·K; compressed N·K (values) + N·K/8 (metadata) = 0.5625x dense: a memory-bound
//   GEMV can run at most 1.78x faster than the dense one. 4096 x 4096: 33.6 MB dense, 18.9 MB compressed -> 5.6 us
//   at 3.35 TB/s (the dense one 10 us). fc_out (5893 x 1280): 15.1 MB dense, 8.5 MB compressed.
//   FLOPs: 2·M·N·K counted dense (what the layer computes; the sparse MMA skips half): 4096³ = 137 GFLOP, dense
//   bf16 cuBLAS at ~750 TFLOP/s ~ 180 us; the sparse tensor-core peak is 2x the dense one (1979 TFLOP/s bf16
//   datasheet, dense-equivalent), but mma.sync (not wgmma) is the path here, which on Hopper does not reach the
//   dense wgmma rate.
//
// Units (each its own build; see lab/build.py):
//   compress.cu  prune-checked compression of a dense 2:4 weight into (values, meta), built once per dtype
//   gemv.cu      v1 and v3, one SIMT kernel template (rows of W per warp: 1 or 2), built once per dtype
//   v2.cu        the mma.sp GEMM, built once per dtype
//   v4.cu        the wgmma.sp GEMM (sm_90a), built once per dtype
// Launchers (exported to cpp_src/sparse24/sparse24.cpp, looked up by name there, "name@bf16" / "name@f16"):
//   compress: cudaError_t (const T* w, T* values, int32_t* meta, int N, int K, unsigned long long* bad, stream)
//   v1..v4:   cudaError_t (const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
//                          cudaStream_t); M, N, K > 0 (the binding handles the empty cases)
#pragma once
#include "lab_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sparse24 {

// The element type of a unit built once per dtype (// lab:variants dtype=bf16,f16).
#if defined(LAB_VARIANT_dtype_bf16)
using T = __nv_bfloat16;
#elif defined(LAB_VARIANT_dtype_f16)
using T = __half;
#endif

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class E> __device__ __forceinline__ E from_f(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// Two 16-bit elements packed in a 32-bit word (low half first) -> floats.
__device__ __forceinline__ float lo_f(uint32_t w, __nv_bfloat16) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w, __nv_bfloat16) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float lo_f(uint32_t w, __half) { return __half2float(__ushort_as_half(uint16_t(w))); }
__device__ __forceinline__ float hi_f(uint32_t w, __half) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }

constexpr int kGroupsPerWord = 8;      // 8 nibbles of metadata per int32: 32 columns of W
constexpr uint32_t kEmptyMeta = 0x44444444u;  // every group keeps columns 0 and 1 (i0 = 0, i1 = 1): a valid nibble
                                              // for rows and steps past the end, whose values are zero-filled

__host__ __device__ constexpr int64_t padded_k(int64_t K) { return lab::ceil_div(K, 32) * 32; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace sparse24
