// gru — the GRU forward pass (nn.GRU, gate order r, z, n) as a ladder of versions, and the kernels of the
// seq2seq decoder step that runs without torch.cat.
//
//   r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
//   z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
//   n_t = tanh   (W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
//   h_t = (1 - z_t) * n_t + z_t * h_{t-1}          reference: torch.nn.GRU with the same weights, in float64
//
// Weights as nn.GRU keeps them: w_ih (3H, I), w_hh (3H, H), b_ih (3H), b_hh (3H), rows in gate order r, z, n.
// Layers run one after another (layer l's output sequence is layer l+1's input; v6 overlaps them). cpp_src/gru/gru.cpp
// drives them;
// the matrix products that are plain GEMMs go to cuBLAS through ATen (fp32 output for fp16/bf16 inputs: fp32
// accumulation, no rounding of the gate pre-activations), except v3..v6's fp32 input projection when it has few rows
// (proj.cu); the rest is here.
//
// Units (each its own build; this header holds what they share):
//   gates.cu    gates_kernel, the fused pointwise gate kernel of v1/v2 and the decoder step ("gru_gates")
//   proj.cu     proj_kernel: v3..v6's input projection for fp32 with few rows (T*B <= 128), the step counters zeroed
//               in the same launch ("gru_proj"; its header has the measurements)
//   v3.cu       the persistent kernel of v3 and v4 (RB = 2 / 4), its plan and launcher; built once per dtype and
//               RB (// lab:variants dtype=f32,f16,bf16 rb=2,4): "gru_v3_plan@f32,2", "gru_v3@bf16,4", ...
//   v5.cu       the persistent tensor-core kernel of v5, its plan and launcher; built once per dtype
//               (// lab:variants dtype=f32,f16,bf16; f32 multiplies in TF32): "gru_v5_plan@bf16", "gru_v5@f32", ...
//   v6.cu       the wavefront kernel of v6 (a stack's layers in one launch), its plan and launcher; built like v3.cu:
//               "gru_v6_plan@f32,2", "gru_v6@bf16,4", ...
//   rowstep.cuh the step v3.cu and v6.cu share (weights into registers, h rows into shared memory, the dot products,
//               the gates) and the split their plans share
//   persistent.cuh  what the persistent units share: the variant's storage type, coherent loads, the step counters
//                   (and cooperative.cuh)
//   cooperative.cuh the host side of a cooperative launch (v3.cu, v5.cu, v6.cu, greedy.cu)
//   decoder.cu  decoder_prep_kernel, the decoder step's token pick and gathers ("gru_decoder_prep")
//   greedy.cu   greedy_kernel: every step of the seq2seq decoder's greedy loop in one cooperative launch, the
//               decoder's weights in shared memory ("gru_greedy_plan", "gru_greedy"; its header has the design)
//   cpp_src/gru/cpu.cpp  the C++ CPU version (version 0) and the CPU loops of gru_gates and decoder_prep
//
// Versions (each adds one idea to the one before):
//   v1: per step, two cuBLAS GEMMs (x_t W_ih^T and h_{t-1} W_hh^T) and one fused pointwise kernel for the gates,
//       biases and the state update (gates_kernel) — the path of aten's _thnn_fused_gru_cell. 3 launches a step.
//   v2: the input projection of all T steps as one GEMM up front (it does not depend on h); per step only the
//       recurrent GEMM and the gate kernel. 2 launches a step, and one well-shaped (T*B, I) x (I, 3H) GEMM.
//   v3: persistent — one cooperative launch runs all T steps of a layer. W_hh is split across the blocks by hidden
//       unit and stays in registers (fp32) for the whole sequence; each step a block reads h_{t-1} from L2 into
//       shared memory, computes its units' 3 gate rows for its batch rows (in pairs, or one at a time where a block
//       owns one row; the lanes' partial sums meet in a reduce-scatter, rowstep.cuh), applies the gates, writes h_t,
//       and the grid meets at one grid.sync(). The input projection is one GEMM before the launch (cuBLAS; proj.cu
//       for fp32 with few rows). (Since v5's exchange landed in persistent.cuh, v3/v4 wait by default only for the
//       blocks of their own batch slice, on per-slice step counters; grid_sync=True keeps the one grid.sync(). Where
//       a block owns one batch row, they exchange h as tagged 64-bit words instead, the data its own flag:
//       persistent.cuh.)
//   v4: v3 with four batch rows per pass: 12 independent FMA chains instead of 6, 15 shuffles per 4 rows instead of
//       16: the same work, less exposed latency. (The reduce-scatter was v4's second idea, against v3's butterfly of
//       48 shuffles per 4 rows; v3 took it too, which bought it 1-2% at batch 8..32: rowstep.cuh.)
//   v5: v3's loop with h_{t-1} W_hh^T on tensor cores (mma.sync: fp16/bf16 as stored, TF32 on float32 tensors), the
//       block's W_hh slice in shared memory, the gates applied from the mma fragments; eight warp grids, one chosen
//       per (batch, hidden) by a step-time estimate (v5.cu's header has the split and the napkin math).
//   v6: v3's step, the layers of a stack as a wavefront in one launch: each layer's recurrence and, between layers,
//       a projection role (h_{l-1,t} W_ih^T in the launch) run at once on their own blocks, each waiting only for
//       what it reads; the plan picks the wavefront or layer by layer (v6.cu's header).
//
// v3/v4 work split (H = 512, fp32, 132 SMs, 256 threads a block, one block per SM):
//   - a block owns Hb = 256/S hidden units and Bb batch rows; a unit's 3 rows of W_hh (r, z, n) are spread over S
//     lanes of one warp, KPT = H/S columns each: float w[3][KPT] in registers (H=512: S=16, KPT=32, 96 registers;
//     the whole W_hh, 3 MB, is spread over the register files of 32 blocks; the batch splits into up to Pb = 4
//     slices, so up to 128 blocks, each holding 96 KB of weights).
//   - per step a block computes Bb x 3Hb dot products of length H; lanes reduce their partial sums over the S lanes
//     with shuffles; one thread per (row, unit) applies the gates and keeps its h in fp32 in shared memory (fp16/bf16
//     outputs are rounded, the recurrence is not).
//   - the input projection of the step, x_t W_ih^T (from the up-front GEMM), is prefetched with cp.async *before*
//     the grid barrier: it does not depend on h, so its latency hides behind the wait.
// What bounds a step (napkin math for H = 512, then what the H100 measured; strict fp32, best launch mode, T = 30;
// the timings against cuDNN and the goals' margins: results/<device>/results.csv and notebook 03):
//   - B <= 8: latency. The grid barrier (measured on this H100 to be a large share of a step), an L2 round trip for
//     h_{t-1}, 32-FMA chains and the lane reduction, the gate math, and the barrier's fence waiting for h_t's stores:
//     a few microseconds a step. The tagged exchange (persistent.cuh) takes the fence, the count and the second
//     round trip off the chain where a block owns one row (11-12% faster than the counters at batch 1..4, fp32,
//     graph); with two rows a block it measures 1-2% slower, so the plan keeps the counters there (v3.cu's header).
//     Behind proj.cu the launch starts early and loads W_hh while the projection runs (v3.cu: gru_v3) on the SMs
//     the projection leaves room on: at batch 1 the ring kernel's 48 blocks leave 84; at batch 8 the bulk kernel's
//     120 blocks (128 registers x 256 threads each, beside this kernel's 194 x 256: 82 K of an SM's 64 K) leave 12.
//     The goal is 3x cuDNN at B = 1 and 8: met at batch 1, missed at batch 8, where the persistent kernel alone is
//     ahead of 3x and the kernels before it (proj.cu's projection) and the launch gaps are the margin (notebook 03
//     prints the split per run).
//     Where a step's time goes (a dev build stamping %globaltimer at each phase in thread 0 of every block; H100,
//     fp32, T = 30, L2 warm; the timer ticks every 256 ns, so these are means over 27 steps x all blocks): batch 1
//     and 4 (tagged, one row a block) 1.84-1.85 us a step: ~1.0 us from the last writer's gates to this block's h
//     tile in shared memory (the exchange), ~0.5 us of dot products (before the one-row passes: a pair), ~0.3 us of
//     gates. Batch 8 (two rows a block): 2.28 us with the counters (the exchange 1.43 us: fence, count, then the
//     loads), 2.13 with the tagged words (1.07). The exchange is the largest part, and Hopper's cluster hardware
//     does not shorten it: a slice as one 16-block cluster (W_hh half in shared memory to fit 16 SMs) exchanging h
//     through distributed shared memory and one barrier.cluster a step takes 0.84-0.91 us a step for the exchange
//     alone, and at most 7 such clusters fit the chip (.ci/cluster_exchange_probe.cu, H100): not built.
//   - B = 128: the FP32 FMA pipe. 2*B*3H*H = 201 MFLOP a step over 128 SMs at 128 FMA/clk/SM and the datasheet's
//     1.98 GHz boost (64.9 TFLOP/s) is ~3.1 us; the L2 reads of h (each block its Bb = 32 rows, 64 KB) take ~1.5 us
//     (an estimate); plus the barrier. v3 beats cuDNN here, but with the input-projection GEMM (3 GFLOP of strict
//     fp32, not timed apart) set aside, a step still takes several times the FMA time, and the step time grows
//     linearly with the batch: one block of 8 warps per SM (96 weight registers a thread leave room for no more)
//     cannot hide the shared-load, FMA-chain and lane-reduction latencies (SASS, v3 with its butterfly then: ~275
//     instructions per pair of rows, ~550 cycles of issue for the 2 warps of a scheduler, well under the cycles the
//     measured step time implies). v4 attacks exactly that. B = 256 (Bb = 64): v4 is still ahead of cuDNN but misses
//     issue 14's goal (v3.cu's header: what Nsight Compute says there); B = 64: further ahead than at B = 128.
//   - fp16/bf16 use the same FP32 FMA path (weights converted once into fp32 registers, h read as 16-bit and
//     widened): half the L2 bytes, the same FMA time; cuDNN's bf16 path uses tensor cores, so the gain over it is
//     smaller at large batch (notebooks/03_gru.ipynb has the measured numbers).
//   Limits of v3/v4: H <= 1024 (KPT <= 32 registers per gate row), all Ph x Pb blocks co-resident (checked with the
//   occupancy API; the call fails with a message naming the limit otherwise), Bb x H of h in shared memory per chunk
//   (larger batch slices are processed in chunks of BC rows).
//
// Decoder step (seq2seq, lab/models/seq2seq.py): decoder_prep_kernel picks the next token (argmax over the logits,
// first maximum wins like torch.argmax; or takes given tokens), gathers its embedding into the [emb | h] buffer
// that fc_out reads, and gathers its precomputed GRU input projection (a (vocab, 3H) table: emb @ W_ih_emb^T, once
// per model) plus the context's share (once per sentence). gates_kernel then writes h_t in place into the same
// buffer: no torch.cat anywhere.
//
// fp32 accuracy under --use_fast_math: tanhf would become MUFU.TANH (~1e-3 relative error), so tanh_acc below is a
// polynomial near 0 and an exp form elsewhere (~1e-7); sigmoid uses __expf (a few ulp).
//
// Launchers (exported to cpp_src/gru/gru.cpp): plain C types, dtype codes below, the launch's cudaError_t returned.
#pragma once

#include "lab_cuda.cuh"
#include "lab_unit.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace gru {

enum Dtype { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };  // the codes cpp_src/gru/gru.cpp passes
constexpr int kThreads = 256;

// ---- conversions (torch builds with __CUDA_NO_HALF_CONVERSIONS__: intrinsics only) -------------------------------
__device__ __forceinline__ float tof(float v) { return v; }
__device__ __forceinline__ double tof(double v) { return v; }
__device__ __forceinline__ float tof(__half v) { return __half2float(v); }
__device__ __forceinline__ float tof(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ double from_d(double v) { return v; }

// Stores of the accumulate type A into the storage type T.
template <class T, class A> __device__ __forceinline__ T store_as(A v) { return from_f<T>(float(v)); }
template <> __device__ __forceinline__ double store_as<double, double>(double v) { return v; }

// Four consecutive elements in shared memory (8- or 16-byte aligned), widened to fp32: v3/v6's h tile, proj.cu's tiles.
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 ld4(const __nv_bfloat16* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);  // bf16 -> fp32 is a 16-bit shift
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}
__device__ __forceinline__ float4 ld4(const __half* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// ---- activations ------------------------------------------------------------------------------------------------
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

// tanh to ~1e-7 relative without MUFU.TANH: odd Taylor series to x^13 for |x| < 0.5 (truncation < 5e-8 relative),
// 1 - 2/(e^{2|x|} + 1) above (no cancellation there: the result is > 0.46).
__device__ __forceinline__ float tanh_acc(float x) {
  const float a = fabsf(x);
  if (a < 0.5f) {
    const float x2 = x * x;
    float p = 21844.f / 6081075.f;
    p = fmaf(p, x2, -1382.f / 155925.f);
    p = fmaf(p, x2, 62.f / 2835.f);
    p = fmaf(p, x2, -17.f / 315.f);
    p = fmaf(p, x2, 2.f / 15.f);
    p = fmaf(p, x2, -1.f / 3.f);
    return fmaf(p * x2, x, x);
  }
  const float t = 1.f - 2.f / (__expf(2.f * a) + 1.f);
  return copysignf(t, x);
}
__device__ __forceinline__ double tanh_acc(double x) { return tanh(x); }

}  // namespace gru
