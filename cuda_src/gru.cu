// gru.cu — the GRU forward pass (nn.GRU, gate order r, z, n) as a ladder of versions, and the kernels of the
// seq2seq decoder step that runs without torch.cat.
//
//   r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
//   z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
//   n_t = tanh   (W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
//   h_t = (1 - z_t) * n_t + z_t * h_{t-1}          reference: torch.nn.GRU with the same weights, in float64
//
// Weights as nn.GRU keeps them: w_ih (3H, I), w_hh (3H, H), b_ih (3H), b_hh (3H), rows in gate order r, z, n.
// Layers run one after another (layer l's output sequence is layer l+1's input). cpp_src/gru.cpp drives them; the
// matrix products that are plain GEMMs go to cuBLAS through ATen (fp32 output for fp16/bf16 inputs: fp32
// accumulation, no rounding of the gate pre-activations), the rest is here.
//
// Versions (each adds one idea to the one before):
//   v1: per step, two cuBLAS GEMMs (x_t W_ih^T and h_{t-1} W_hh^T) and one fused pointwise kernel for the gates,
//       biases and the state update (gates_kernel) — the path of aten's _thnn_fused_gru_cell. 3 launches a step.
//   v2: the input projection of all T steps as one GEMM up front (it does not depend on h); per step only the
//       recurrent GEMM and the gate kernel. 2 launches a step, and one well-shaped (T*B, I) x (I, 3H) GEMM.
//   v3: persistent — one cooperative launch runs all T steps of a layer. W_hh is split across the blocks by hidden
//       unit and stays in registers (fp32) for the whole sequence; each step a block reads h_{t-1} from L2 into
//       shared memory, computes its units' 3 gate rows for its batch rows, applies the gates, writes h_t, and the
//       grid meets at one grid.sync(). The input projection is still one cuBLAS GEMM before the launch.
//   v4: v3 with four batch rows per pass (12 independent FMA chains instead of 6) and the lane reduction as a
//       reduce-scatter (13 shuffles per 4 rows instead of 48 for a butterfly): the same work, less exposed latency.
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
// What bounds a step (napkin math for H = 512, then what the H100 measured; strict fp32, best launch mode, T = 30):
//   - B <= 8: latency. The grid barrier (~1.2 us measured on this H100), an L2 round trip for h_{t-1}, 32-FMA
//     chains and the lane reduction, the gate math, and the barrier's fence waiting for h_t's stores: ~2-3 us a step.
//     Measured v3: 89 us at B = 1 (2.8 us a step) against cuDNN's 235 us (2.6x; the 3x goal is missed by ~13%),
//     93 us at B = 8 against 223 us (2.4x). Below this needs a cheaper barrier than a grid-wide one (e.g. a thread
//     block cluster exchanging h through distributed shared memory), not faster arithmetic.
//   - B = 128: the FP32 FMA pipe. 2*B*3H*H = 201 MFLOP a step over 128 SMs at 128 FMA/clk/SM is ~3.5 us; the L2
//     reads of h (each block its Bb = 32 rows, 64 KB) take ~1.5 us; plus the barrier. Measured v3: 413 us against
//     cuDNN's 639 us (1.55x). Taking the input-projection GEMM at ~60 us (3 GFLOP of strict fp32 at cuBLAS's rate;
//     an estimate, not timed apart) leaves ~11.7 us a step, 3x the FMA time, and the step time grows linearly with
//     the batch (~0.07 us a row): one block of 8 warps per SM (96 weight registers a thread leave room for no more)
//     cannot hide the shared-load, FMA-chain and 4-level-butterfly latencies (SASS: ~275 instructions per pair of
//     rows, ~550 cycles of issue for the 2 warps of a scheduler, against ~970 cycles implied by the step time).
//     v4 attacks exactly that. B = 256 (Bb = 64): v3 743 us against 858 us (1.16x, the 1.3x
//     goal missed); B = 64: 238 us against 474 us (2.0x).
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
#include "lab_cuda.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace gru {
namespace cg = cooperative_groups;

enum Dtype { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };  // the codes cpp_src/gru.cpp passes
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

// L2-only loads (ld.global.cg): h_{t-1} was written by other SMs during this launch; L1 is not coherent.
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ __half ldcg(const __half* p) {
  return __ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ __nv_bfloat16 ldcg(const __nv_bfloat16* p) {
  return __ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}

// Four consecutive elements of the shared-memory h tile, widened to fp32.
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

// ---- cp.async (sm_80+): copies that complete asynchronously into shared memory ---------------------------------
__device__ __forceinline__ void cp_async16_cg(void* smem, const void* gmem) {  // 16 B, L2 only (coherent)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {  // 4 B; for read-only inputs
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// =================================================================================================================
// v1/v2 (and the decoder step): the fused gate kernel. One thread per (batch row, hidden unit).
//   gi: (B, >=3H) row stride ldgi, input projections without bias (or with, and b_ih == nullptr)
//   gh: (B, >=3H) row stride ldgh, recurrent projections without bias; nullptr means h_{t-1} W_hh^T = 0
//   h_prev (nullptr: zeros) and h_out may be the same memory (in place: each thread reads its element first)
// =================================================================================================================
template <class T, class A>
__global__ void gates_kernel(const A* __restrict__ gi, int64_t ldgi, const A* __restrict__ gh, int64_t ldgh,
                             const T* __restrict__ b_ih, const T* __restrict__ b_hh, const T* h_prev, int64_t ldhp,
                             T* h_out, int64_t ldho, int B, int H) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(B) * H) return;
  const int b = int(idx / H), j = int(idx % H);
  const A* x = gi + int64_t(b) * ldgi;
  A ir = x[j], iz = x[H + j], in = x[2 * H + j];
  if (b_ih) {
    ir += A(tof(b_ih[j]));
    iz += A(tof(b_ih[H + j]));
    in += A(tof(b_ih[2 * H + j]));
  }
  A hr = 0, hz = 0, hn = 0;
  if (gh) {
    const A* y = gh + int64_t(b) * ldgh;
    hr = y[j];
    hz = y[H + j];
    hn = y[2 * H + j];
  }
  hr += A(tof(b_hh[j]));
  hz += A(tof(b_hh[H + j]));
  hn += A(tof(b_hh[2 * H + j]));
  const A r = sigm(ir + hr), z = sigm(iz + hz), n = tanh_acc(in + r * hn);
  const A hp = h_prev ? A(tof(h_prev[int64_t(b) * ldhp + j])) : A(0);
  h_out[int64_t(b) * ldho + j] = store_as<T, A>(n + z * (hp - n));
}

// =================================================================================================================
// v3: the persistent kernel (see the header for the work split). Template: storage type T, KPT columns of W_hh per
// lane, S lanes per hidden unit (S*KPT >= H), Hb = kThreads/S units per block.
// =================================================================================================================
struct V3Args {
  const float* gi;  // (T, B, 3H) x_t W_ih^T, fp32, no bias
  const void* w_hh;  // (3H, H)
  const void* b_ih;  // (3H)
  const void* b_hh;  // (3H)
  const void* h0;    // (B, H) or nullptr (zeros)
  void* out;         // (T, B, H)
  int T, B, H;
  int Ph;            // hidden-unit partitions (block index % Ph)
  int Bb;            // batch rows per block
  int BC;            // batch rows per shared-memory chunk (BC <= Bb)
};

template <class T>
__device__ void load_rows(T* hs, int Kp, const T* src, int nr, int H) {
  if (!src) {  // h0 = zeros
    for (int p = threadIdx.x; p < nr * H; p += kThreads) hs[(p / H) * Kp + p % H] = from_f<T>(0.f);
    return;
  }
  constexpr int E = 16 / sizeof(T);  // elements per 16-byte copy
  if (H % E == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int cpr = H / E;
    for (int p = threadIdx.x; p < nr * cpr; p += kThreads) {
      const int r = p / cpr, c = p % cpr;
      cp_async16_cg(hs + r * Kp + c * E, src + int64_t(r) * H + c * E);
    }
  } else {  // odd hidden sizes or a misaligned h0: element loads from L2
    for (int p = threadIdx.x; p < nr * H; p += kThreads) {
      const int r = p / H, k = p % H;
      hs[r * Kp + k] = ldcg(src + int64_t(r) * H + k);
    }
  }
}

// v4's lane reduction: a reduce-scatter. Each of the S lanes holds NV partial sums; at every level a lane keeps one
// half of its values and sends the other half to its partner (lane ^ OFF), so the values to sum halve each level:
// NV/2 + NV/4 + ... shuffles (15 for 16 values over 16 lanes) instead of NV * log2(S) for a full butterfly (64).
// Afterwards lane s holds the sums of values [s*NV/S, (s+1)*NV/S) when S <= NV, or of value s/(S/NV) when S > NV.
template <int OFF, int N, int NV>
__device__ __forceinline__ void reduce_scatter(float (&v)[NV], int s) {
  if constexpr (N > 1) {
    const bool upper = (s & OFF) != 0;  // this lane keeps the upper half
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? v[i] : v[i + N / 2];
      const float keep = upper ? v[i + N / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
    }
    if constexpr (OFF > 1) reduce_scatter<OFF / 2, N / 2, NV>(v, s);
  } else {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);  // more lanes than values: plain butterfly
    if constexpr (OFF > 1) reduce_scatter<OFF / 2, 1, NV>(v, s);
  }
}

template <class T, int KPT, int S, int RB>
__global__ void __launch_bounds__(kThreads, 1) gru_v3_kernel(const V3Args a) {
  static_assert(KPT % 4 == 0 && S >= 4 && S <= 32 && (S & (S - 1)) == 0, "KPT multiple of 4, S a power of 2");
  static_assert(RB == 2 || RB == 4, "v3 takes rows in pairs, v4 in fours");
  constexpr int Kp = KPT * S;  // padded row length of the h tile (columns >= H are zero)
  constexpr int Hb = kThreads / S;
  extern __shared__ float4 smem4[];
  const int H = a.H, B = a.B, Bb = a.Bb, BC = a.BC;
  const int j0 = (blockIdx.x % a.Ph) * Hb, b0 = (blockIdx.x / a.Ph) * Bb;
  const int tid = threadIdx.x, s = tid % S, u = tid / S, j = j0 + u;
  const int nb = min(Bb, B - b0);  // this block's batch rows (the plan makes every block's slice non-empty)

  T* hs = reinterpret_cast<T*>(smem4);                                   // [BC][Kp]  h_{t-1} rows
  float* ghs = reinterpret_cast<float*>(hs + int64_t(BC) * Kp);          // [BC][3][Hb] reduced h W_hh^T
  float* gis = ghs + BC * 3 * Hb;                                        // [2][Bb][3][Hb] x W_ih^T, double-buffered
  float* hown = gis + 2 * Bb * 3 * Hb;                                   // [Bb][Hb] this block's h, fp32
  float* bias = hown + Bb * Hb;                                          // [6][Hb] b_ih r,z,n, b_hh r,z,n

  const T* W = static_cast<const T*>(a.w_hh);
  const T* bih = static_cast<const T*>(a.b_ih);
  const T* bhh = static_cast<const T*>(a.b_hh);
  const T* h0 = static_cast<const T*>(a.h0);
  T* out = static_cast<T*>(a.out);

  // 1. This lane's slice of its unit's three W_hh rows, into registers for the whole sequence. Lane s holds columns
  //    c*4S + 4s + {0..3}: a warp's 16-byte reads of an h row are then contiguous and conflict-free.
  float w[3][KPT];
#pragma unroll
  for (int g = 0; g < 3; ++g)
#pragma unroll
    for (int c = 0; c < KPT / 4; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = c * 4 * S + s * 4 + i;
        w[g][c * 4 + i] = (j < H && k < H) ? tof(W[(int64_t(g) * H + j) * H + k]) : 0.f;
      }
  // 2. Biases, the block's own h (fp32), and zeros in the pad columns of the h tile (0 * garbage could be NaN).
  for (int p = tid; p < 6 * Hb; p += kThreads) {
    const int g = p / Hb, jj = j0 + p % Hb;
    bias[p] = jj < H ? tof((g < 3 ? bih : bhh)[(g % 3) * H + jj]) : 0.f;
  }
  for (int p = tid; p < Bb * Hb; p += kThreads) {
    const int bb = p / Hb, jj = j0 + p % Hb;
    hown[p] = (h0 && bb < nb && jj < H) ? tof(h0[int64_t(b0 + bb) * H + jj]) : 0.f;
  }
  if (Kp > H)
    for (int p = tid; p < BC * (Kp - H); p += kThreads) hs[(p / (Kp - H)) * Kp + H + p % (Kp - H)] = from_f<T>(0.f);

  for (int t = 0; t < a.T; ++t) {
    // 3. Prefetch this step's input projections: independent of h, so they are in flight across the barrier.
    float* gib = gis + (t & 1) * Bb * 3 * Hb;
    const float* gsrc = a.gi + int64_t(t) * B * 3 * H;
    for (int p = tid; p < nb * 3 * Hb; p += kThreads) {
      const int uu = p % Hb, g = (p / Hb) % 3, bb = p / (3 * Hb);
      if (j0 + uu < H) cp_async4(gib + p, gsrc + (int64_t(b0 + bb) * 3 + g) * H + j0 + uu);
    }
    if (t > 0) cg::this_grid().sync();  // every block's h_{t-1} is written (the one barrier of the step)
    const T* hsrc = t == 0 ? h0 : out + int64_t(t - 1) * B * H;

    for (int c0 = 0; c0 < nb; c0 += BC) {
      const int nr = min(BC, nb - c0);
      load_rows<T>(hs, Kp, hsrc ? hsrc + int64_t(b0 + c0) * H : nullptr, nr, H);
      cp_async_wait_all();
      __syncthreads();  // the h tile (and the prefetched gi) visible to all

      if constexpr (RB == 4) {
        // 4'. v4: four rows at a time (12 FMA chains, 16 values with a zero pad per row), reduce-scatter.
        constexpr int NV = 16;
        for (int r = 0; r < nr; r += 4) {
          const T* hq[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) hq[q] = hs + min(r + q, nr - 1) * Kp + s * 4;  // past the end: repeat
          float acc[NV];
#pragma unroll
          for (int i = 0; i < NV; ++i) acc[i] = 0.f;
#pragma unroll
          for (int c = 0; c < KPT / 4; ++c) {
            float4 x[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) x[q] = ld4(hq[q] + c * 4 * S);
#pragma unroll
            for (int g = 0; g < 3; ++g)
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                float& y = acc[q * 4 + g];
                y = fmaf(w[g][c * 4 + 0], x[q].x, y);
                y = fmaf(w[g][c * 4 + 1], x[q].y, y);
                y = fmaf(w[g][c * 4 + 2], x[q].z, y);
                y = fmaf(w[g][c * 4 + 3], x[q].w, y);
              }
          }
          reduce_scatter<S / 2, NV, NV>(acc, s);
          if constexpr (S <= NV) {
#pragma unroll
            for (int i = 0; i < NV / S; ++i) {
              const int idx = s * (NV / S) + i, q = idx / 4, g = idx % 4;  // value idx = row q, gate g (3: pad)
              if (g < 3 && r + q < nr) ghs[((r + q) * 3 + g) * Hb + u] = acc[i];
            }
          } else {
            const int idx = s / (S / NV), q = idx / 4, g = idx % 4;
            if (s % (S / NV) == 0 && g < 3 && r + q < nr) ghs[((r + q) * 3 + g) * Hb + u] = acc[0];
          }
        }
      } else {
        // 4. h W_hh^T for (row, unit u), two rows at a time: 6 FMA chains, KPT/4 x 2 16-byte shared loads.
        for (int r = 0; r < nr; r += 2) {
          const int r1 = min(r + 1, nr - 1);
          const T* ha = hs + r * Kp + s * 4;
          const T* hb = hs + r1 * Kp + s * 4;
          float acc[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int c = 0; c < KPT / 4; ++c) {
            const float4 x0 = ld4(ha + c * 4 * S), x1 = ld4(hb + c * 4 * S);
#pragma unroll
            for (int g = 0; g < 3; ++g) {
              acc[g] = fmaf(w[g][c * 4 + 0], x0.x, acc[g]);
              acc[g] = fmaf(w[g][c * 4 + 1], x0.y, acc[g]);
              acc[g] = fmaf(w[g][c * 4 + 2], x0.z, acc[g]);
              acc[g] = fmaf(w[g][c * 4 + 3], x0.w, acc[g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 0], x1.x, acc[3 + g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 1], x1.y, acc[3 + g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 2], x1.z, acc[3 + g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 3], x1.w, acc[3 + g]);
            }
          }
          // butterfly over the unit's S lanes (aligned groups of S inside the warp): every lane gets the sums
#pragma unroll
          for (int off = S / 2; off > 0; off >>= 1)
#pragma unroll
            for (int q = 0; q < 6; ++q) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], off);
          // lanes 0..5 of the unit store the 6 sums (row r gates r,z,n; row r1 gates r,z,n)
          float v = acc[0];
#pragma unroll
          for (int q = 1; q < 6; ++q) v = (s == q) ? acc[q] : v;
          if (s < 3 || (s < 6 && r1 != r)) ghs[((s < 3 ? r : r1) * 3 + s % 3) * Hb + u] = v;
        }
      }
      __syncthreads();  // all sums of the chunk stored

      // 5. Gates and the update, one thread per (row, unit): units fastest, so stores of h_t coalesce.
      for (int p = tid; p < nr * Hb; p += kThreads) {
        const int uu = p % Hb, r = p / Hb, jj = j0 + uu, bb = c0 + r;
        if (jj >= H) continue;
        const float* x = gib + bb * 3 * Hb + uu;
        const float* y = ghs + r * 3 * Hb + uu;
        const float rg = sigm(x[0] + bias[uu] + y[0] + bias[3 * Hb + uu]);
        const float zg = sigm(x[Hb] + bias[Hb + uu] + y[Hb] + bias[4 * Hb + uu]);
        const float ng = tanh_acc(x[2 * Hb] + bias[2 * Hb + uu] + rg * (y[2 * Hb] + bias[5 * Hb + uu]));
        const float hp = hown[bb * Hb + uu];
        const float hn = ng + zg * (hp - ng);
        hown[bb * Hb + uu] = hn;  // the same thread owns (bb, uu) at every step
        out[(int64_t(t) * B + b0 + bb) * H + jj] = from_f<T>(hn);
      }
      // The next chunk's load overwrites hs (read only before the barrier above); its __syncthreads orders the
      // gate phase's reads of ghs before the next dot phase rewrites them.
    }
  }
}

// ---- the v3 plan: how the work is split, and whether it fits ----------------------------------------------------
struct Plan {
  int kpt = 0, s = 0, hb = 0, ph = 0, pb = 0, bb = 0, bc = 0, smem = 0, blocks = 0, max_coresident = 0;
  int status = 0;  // 0 ok; 1 hidden too large; 2 batch slice does not fit shared memory; 3 not co-resident;
                   // 4 no cooperative launch on this device; 5 a CUDA error while asking
};

inline int elem_size(int dtype) { return dtype == kF32 ? 4 : dtype == kF64 ? 8 : 2; }

template <class T, int KPT, int S, int RB>
const void* v3_kernel() { return reinterpret_cast<const void*>(&gru_v3_kernel<T, KPT, S, RB>); }

template <class T, int RB>
const void* v3_kernel_for(int kpt, int s) {
  if (kpt == 8) return s == 4 ? v3_kernel<T, 8, 4, RB>() : v3_kernel<T, 8, 8, RB>();
  if (kpt == 16) return s == 8 ? v3_kernel<T, 16, 8, RB>() : v3_kernel<T, 16, 16, RB>();
  return s == 16 ? v3_kernel<T, 32, 16, RB>() : v3_kernel<T, 32, 32, RB>();
}

template <int RB>
const void* v3_kernel_for(int dtype, int kpt, int s) {
  if (dtype == kF16) return v3_kernel_for<__half, RB>(kpt, s);
  if (dtype == kBF16) return v3_kernel_for<__nv_bfloat16, RB>(kpt, s);
  return v3_kernel_for<float, RB>(kpt, s);
}

// version 3: rows in pairs, butterfly reduction; version 4: rows in fours, reduce-scatter
inline const void* v3_kernel_for(int version, int dtype, int kpt, int s) {
  return version == 4 ? v3_kernel_for<4>(dtype, kpt, s) : v3_kernel_for<2>(dtype, kpt, s);
}

inline Plan make_plan(int version, int dtype, int B, int H) {
  Plan p;
  p.kpt = H <= 64 ? 8 : H <= 256 ? 16 : H <= 1024 ? 32 : 0;
  if (!p.kpt) {
    p.status = 1;
    return p;
  }
  const int need = (H + p.kpt - 1) / p.kpt;
  p.s = 4;
  while (p.s < need) p.s *= 2;
  p.hb = kThreads / p.s;
  p.ph = (H + p.hb - 1) / p.hb;
  int dev = 0, coop = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    p.status = 5;
    return p;
  }
  if (!coop) {
    p.status = 4;
    return p;
  }
  const int sms = lab::sm_count();
  const int max_pb = sms / p.ph;  // one block per SM
  if (max_pb < 1) {
    p.max_coresident = sms;
    p.blocks = p.ph;
    p.status = 3;
    return p;
  }
  p.pb = B < max_pb ? B : max_pb;
  p.bb = (B + p.pb - 1) / p.pb;
  p.pb = (B + p.bb - 1) / p.bb;  // no block without rows
  p.blocks = p.ph * p.pb;
  const int kp = p.kpt * p.s;
  const int fixed = (2 * p.bb * 3 * p.hb + p.bb * p.hb + 6 * p.hb) * 4;
  const int row = kp * elem_size(dtype) + 3 * p.hb * 4;
  const int budget = optin - 1024;  // leave the runtime's reserved shared memory alone
  p.bc = fixed < budget ? (budget - fixed) / row : 0;
  if (p.bc > p.bb) p.bc = p.bb;
  if (p.bc < 1) {
    p.status = 2;
    return p;
  }
  p.smem = fixed + p.bc * row;
  const void* k = v3_kernel_for(version, dtype, p.kpt, p.s);
  int occ = 0;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, p.smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, kThreads, p.smem) != cudaSuccess) {
    p.status = 5;
    return p;
  }
  p.max_coresident = occ * sms;
  if (p.blocks > p.max_coresident) p.status = 3;
  return p;
}

// ---- the decoder step's token pick and gathers -------------------------------------------------------------------
template <class T> __device__ __forceinline__ T qnan();
template <> __device__ __forceinline__ float qnan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double qnan<double>() { return __longlong_as_double(0x7ff8000000000000ll); }

// torch.argmax order: NaN is the largest value; among equals the first index wins.
template <class T>
__device__ __forceinline__ bool better(T v, int i, T bv, int bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > bv || (v == bv && i < bi);
}

// One block per batch row: token = argmax(logits[b]) or tokens_in[b]; xh[b, :E] = emb[token];
// gi[b, :] = gi_table[token] + gi_ctx[b]. A token outside [0, vocab) poisons the row with NaN (no device assert).
template <class T>
__global__ void decoder_prep_kernel(const T* __restrict__ logits, int64_t ldl, int V, const int64_t* __restrict__ tok_in,
                                    int64_t* __restrict__ tok_out, const T* __restrict__ emb, int E,
                                    const T* __restrict__ gtab, const T* __restrict__ gctx, int G3, int vocab,
                                    T* __restrict__ xh, int64_t ldxh, T* __restrict__ gi) {
  const int b = blockIdx.x, tid = threadIdx.x;
  __shared__ int64_t tok_s;
  if (logits) {
    const T* row = logits + int64_t(b) * ldl;
    T bv = row[0];
    int bi = 0;
    for (int i = tid; i < V; i += blockDim.x)
      if (better(row[i], i, bv, bi)) bv = row[i], bi = i;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const T ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    __shared__ T wv[32];
    __shared__ int wi[32];
    if ((tid & 31) == 0) wv[tid >> 5] = bv, wi[tid >> 5] = bi;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < int(blockDim.x >> 5); ++w)
        if (better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w];
      tok_s = bi;
    }
  } else if (tid == 0) {
    tok_s = tok_in[b];
  }
  __syncthreads();
  const int64_t tok = tok_s;
  if (tid == 0 && tok_out) tok_out[b] = tok;
  const bool ok = tok >= 0 && tok < vocab;
  for (int k = tid; k < E; k += blockDim.x) xh[int64_t(b) * ldxh + k] = ok ? emb[tok * E + k] : qnan<T>();
  for (int k = tid; k < G3; k += blockDim.x)
    gi[int64_t(b) * G3 + k] = ok ? gtab[tok * G3 + k] + gctx[int64_t(b) * G3 + k] : qnan<T>();
}

}  // namespace gru

// =================================================================================================================
// Launchers (called from cpp_src/gru.cpp). dtype: 0 float32, 1 float16, 2 bfloat16, 3 float64. gi/gh are float
// (double for float64).
// =================================================================================================================
cudaError_t gru_gates(int dtype, const void* gi, int64_t ldgi, const void* gh, int64_t ldgh, const void* b_ih,
                      const void* b_hh, const void* h_prev, int64_t ldhp, void* h_out, int64_t ldho, int B, int H,
                      cudaStream_t stream) {
  using namespace gru;
  const int64_t n = int64_t(B) * H;
  if (n == 0) return cudaSuccess;
  const unsigned grid = unsigned(lab::ceil_div(n, kThreads));
#define LAB_GATES(T, A)                                                                                         \
  gates_kernel<T, A><<<grid, kThreads, 0, stream>>>(                                                           \
      static_cast<const A*>(gi), ldgi, static_cast<const A*>(gh), ldgh, static_cast<const T*>(b_ih),           \
      static_cast<const T*>(b_hh), static_cast<const T*>(h_prev), ldhp, static_cast<T*>(h_out), ldho, B, H)
  switch (dtype) {
    case kF32: LAB_GATES(float, float); break;
    case kF16: LAB_GATES(__half, float); break;
    case kBF16: LAB_GATES(__nv_bfloat16, float); break;
    case kF64: LAB_GATES(double, double); break;
    default: return cudaErrorInvalidValue;
  }
#undef LAB_GATES
  return cudaGetLastError();
}

// info: kpt, s, hb, ph, pb, bb, bc, smem, blocks, max_coresident. Returns the plan's status (0 = it fits).
// version: 3 or 4 (the same split; v4's kernel differs only in its dot-product phase).
int gru_v3_plan(int version, int dtype, int B, int H, int* info) {
  const gru::Plan p = gru::make_plan(version, dtype, B, H);
  const int v[10] = {p.kpt, p.s, p.hb, p.ph, p.pb, p.bb, p.bc, p.smem, p.blocks, p.max_coresident};
  for (int i = 0; i < 10; ++i) info[i] = v[i];
  return p.status;
}

cudaError_t gru_v3(int version, int dtype, const float* gi, const void* w_hh, const void* b_ih, const void* b_hh,
                   const void* h0, void* out, int T, int B, int H, cudaStream_t stream) {
  using namespace gru;
  if (T == 0 || B == 0) return cudaSuccess;
  if (dtype == kF64 || (version != 3 && version != 4)) return cudaErrorInvalidValue;
  const Plan p = make_plan(version, dtype, B, H);
  if (p.status == 3) return cudaErrorCooperativeLaunchTooLarge;
  if (p.status) return cudaErrorInvalidConfiguration;
  V3Args a{gi, w_hh, b_ih, b_hh, h0, out, T, B, H, p.ph, p.bb, p.bc};
  void* args[] = {&a};
  // A cooperative launch (grid.sync() needs one) through the launch-attribute API, which stream capture records
  // into a CUDA graph kernel node like any other launch.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(p.smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelExC(&cfg, v3_kernel_for(version, dtype, p.kpt, p.s), args);
}

cudaError_t gru_decoder_prep(int dtype, const void* logits, int64_t ldl, int V, const int64_t* tok_in,
                             int64_t* tok_out, const void* emb, int E, const void* gtab, const void* gctx, int G3,
                             int vocab, void* xh, int64_t ldxh, void* gi, int B, cudaStream_t stream) {
  using namespace gru;
  if (B == 0) return cudaSuccess;
#define LAB_PREP(T)                                                                                              \
  decoder_prep_kernel<T><<<B, kThreads, 0, stream>>>(                                                           \
      static_cast<const T*>(logits), ldl, V, tok_in, tok_out, static_cast<const T*>(emb), E,                    \
      static_cast<const T*>(gtab), static_cast<const T*>(gctx), G3, vocab, static_cast<T*>(xh), ldxh,           \
      static_cast<T*>(gi))
  if (dtype == kF32)
    LAB_PREP(float);
  else if (dtype == kF64)
    LAB_PREP(double);
  else
    return cudaErrorInvalidValue;
#undef LAB_PREP
  return cudaGetLastError();
}
