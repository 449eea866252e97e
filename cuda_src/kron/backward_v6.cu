// kron/backward_v6.cu — version 6's backward: two factors in strict fp32, small batches, one block per (sample, slice
// of W_1's rows) doing all four of the sample's products, then one reduce launch (the algebra: kron.cuh).
//
// Why. v1's backward (backward.cu, also v2's and until now v6's) runs per factor a dW kernel and an R-step kernel, then
// a reduce: at batch 1 the four kernels took 11 + 11 + 9 + 9 us (H100, 128 × 128, torch.profiler's kernel records of
// an eager step), each block walking f/16 chunks of k through a 2-stage pipeline, one round trip to L2 a chunk; at
// batch 32 53 us of a 73 us training step (its CUDA graph) whose forward (v6) took 14. Here every operand of a block
// is in flight from its first cycle (as in v6's forward) and one kernel does what the four did.
//
// The algebra for K = 2, a sample read as X (f_2 × f_1) [i_2][i_1], G = dy[b] (f_2 × f_1) [j_2][j_1], the forward's
// state F_1 = Xᵀ·W_2 (f_1 × f_2) [i_1][j_2] (v6 saves it), dF_1 = W_1·Gᵀ:
//     dW_1 = Σ_b F_1[b]·G[b]      dW_2 = Σ_b X[b]·dF_1[b]      dx[b] = W_2·dF_1[b]ᵀ
// A block owns sample b and rows i ∈ [r0, r0 + c) of dF_1 (r0 = s·c, S = f_1/c slices a sample):
//   step 1  T  = W_1[r0:r0+c, :]·Gᵀ          (c × f_2), k = j_1     T = dF_1[b][r0:r0+c, :], kept in shared memory
//   step 2  P1 = F_1[b][r0:r0+c, :]·G        (c × f_1), k = j_2     rows r0.. of sample b's share of dW_1 -> part1[b]
//   step 3  dx[b][:, r0:r0+c] = W_2·Tᵀ       (f_2 × c), k = j_2     dx's columns are dF_1's rows: no other block's T
//   step 4  P2 = X[b][:, r0:r0+c]·T          (f_2 × f_2), k = i     this slice's share of dW_2 -> part2[b·S + s]
// then dW_1 = Σ_b part1[b], dW_2 = Σ_z part2[z] in a fixed order (reduce_kernel): the result does not depend on
// scheduling. Every product accumulates in fp32 FMAs in ascending k.
//
// The products' operands in shared memory are rows of k as they lie in memory (no transposes). In every step the
// output's "Q" rows come from an operand whose rows run along k, read as broadcasts (the 8 lanes of a quarter-warp
// read the same 16 bytes); a thread takes rows q0, q0+4, q0+8, q0+12 and the four quarter-warps rows 1 apart. The
// "L" columns come either from rows along k (steps 1 and 3: a thread takes rows l, l+8, l+16, l+24, 8 lanes 1 row
// apart) or from a k-major operand (steps 2 and 4: 4 consecutive columns a thread, 8 lanes read 128 contiguous
// bytes). Every operand's rows are padded by 4 floats: 8 consecutive rows, or the quarter-warps' 4, then start in
// different bank quads. Per 4 values of k a thread issues 8 16-byte shared loads for 64 FMAs, the ratio of v6's
// 4 × 4 forward. The block's two halves (8 warps each) run steps 1 and 2 side by side, then steps 3 and 4.
//
// Scope (v1's backward runs everything else): K = 2, float32; f_1 and f_2 multiples of 32; c ∈ {16, 32} dividing
// f_1 and the block's shared memory within the device's limit (200 KB at 128 × 128, c = 32); B·S blocks at most
// 4 an SM (part2 is B·S·f_2² floats: 8 MB at batch 32, 128 × 128); 16-byte aligned tensors.
//
// Napkin math (H100, 128 × 128, batch 32, c = 32): 4 · 134 M MAC = 537 M MAC, 8.2 us at the chip's FMA rate.
// 128 blocks, one an SM, 2 M MAC a block: 16 k cycles of FMA issue an SM (~8.8 us) if nothing else issued. Loads:
// 200 KB a block, 25 MB from L2 for the grid (W_2 alone 8 MB: every block reads all of it); part1 + part2 10 MB out
// and back in through the reduce.
//
// Measured (H100, CUDA graph of a training step = v6's forward + this backward, L2 flushed, fp32, 128 × 128;
// torch.profiler for the kernels), in the order the designs were built:
//  0. v1's kernels (before): the backward 42.1 us at batch 1 (dW 22.5, R-steps 18.0, reduce 1.6 for both factors'
//     kernels; forward v6's), 53.3 at batch 32; the step 62.3 / 78.5 with v1's forward, torch.bmm's 46.5 / 72.4.
//  1. one 256-thread block doing the four steps in turn, Q rows 4 consecutive a thread, only the L operands padded:
//     the fused kernel 15.1 us at batch 1 (c = 16), 24.5 at 32; the step 29.7 / 46.3. ncu at batch 32: 2 warps a
//     scheduler, 0.55 issued a cycle, 45% of cycles with no eligible warp.
//  2. two halves of 8 warps, steps 1 ∥ 2 then 3 ∥ 4: 13.2 / 24.0 us (4 warps a scheduler; issue rate 0.56 a cycle,
//     per issued instruction 2.15 cycles stalled on shared-memory loads, 0.62 on the MIO queue; shared loads cost
//     4.1 wavefronts each, 1.14 M bank conflicts).
//  3. (this) the quarter-warps' Q rows 1 apart and every operand padded: 12.2 / 22.8 us; the step 26.8 / 44.4 against
//     torch.bmm's 45.6 / 72.5 and v1's 62.5 / 77.8; batch 64 75.7 (torch.bmm 90.7), batch 128 153.7 (141.2; v1
//     161.3). ncu at batch 32: 3.1 wavefronts a shared load (0.10 M conflicts), 0.62 issued a cycle, 38% of cycles
//     with no eligible warp, per issued instruction 1.58 cycles on shared-memory loads, 1.48 not selected; FMAs 70%
//     of the instructions. Where a block's time goes (%globaltimer, from its entry, median of the 128 blocks at batch
//     32; 8 blocks at batch 1): all copies queued 3.9 us (1.9), the first group landed 4.2 (2.0), steps 1 ∥ 2 done
//     12.7 (6.2), steps 3 ∥ 4 done 21.0 (10.9). Each pair of steps is 1 M MAC an SM (0.5 M at batch 1, c = 16) and
//     takes 8.5 us (4.2), half the FMA rate: per 64 FMAs a thread issues 8 shared loads of ~3.1 wavefronts each, 25
//     cycles of the SM's one wavefront a cycle against 16 of FMA issue (4 schedulers). (The path returns 128 bytes a
//     cycle, one register a lane: a 16-byte load takes 4 cycles, or 2 where lanes n and n^1 share an address, as in
//     the Q loads' quarter-warp broadcasts — NVIDIA's developer forum on uniform shared loads; so 3 on average here.) So the steps are bound by
//     shared-memory bandwidth, the 4 × 4 tile's ratio; larger tiles need a k-split at c = 32 (4096 outputs a step
//     for 256 threads) whose partial sums, 16 KB a step with two steps at once, do not both fit beside the 200 KB of
//     operands (one does: step 2's could leave as extra dW_1 partials instead).
//  4. only the first pair's operands queued at entry, W_2 and x's slice after they land (so no thread waits in the
//     copy queue while it could multiply): the first group landed at 3.5 us instead of 4.2, but steps 1 ∥ 2 then took
//     9.1 us (the later copies now arrive during them) and ended where design 3's did: 12.6 / 22.9 us, batch 128
//     156 (design 3 in the same run: 12.2 / 22.9, 153.5). Not kept.
//  5. at c = 32 an 8 × 4 tile a thread (32 path-cycles per 128 FMAs: balanced on paper), each step's k split between
//     two warps: step 2's halves leave as two dW_1 partials, steps 1 and 3 add theirs through a 16 KB scratch after a
//     named barrier (branch next/v6b-8x4; 117 registers). Timed A/B against design 3 on one H100, alternating, two
//     rounds: the fused kernel 22.3-22.4 / 83.0-84.3 us at batch 32 / 128 (design 3: 22.9-23.1 / 86.8-87.0), but the
//     reduce, now summing 2B dW_1 partials, 25.3 us at batch 128 against 22.6-22.7, and the step 44.3-44.6 /
//     153.0-154.1 against 44.7 / 154.6: within 1%. At 64 × 96 batch 128 and 32 × 160 batch 128 the fused kernel is
//     slower (27.7-28.0 against 25.2-25.7; 28.5-28.8 against 24.2-24.5), and racecheck reported 32 hazards at its
//     store of T in steps 1 and 3 (line 346 on the branch; not investigated further). Not kept.
// lab:variants dtype=f32
#include "kron.cuh"

#include <initializer_list>

namespace kron {
namespace v6b {

constexpr int kThreads = 512;  // two halves of 8 warps; a warp tile is 16 Q × 32 L outputs, 4 × 4 a thread
constexpr int kHalf = kThreads / 2;
constexpr int kPad = 4;        // floats after each operand row: 8 consecutive rows (a quarter-warp's L reads) or 4
                               // rows 1 apart (the quarter-warps' Q reads) start in different bank quads
constexpr int kMaxBlocksPerSm = 4;

struct Args {
  const float* g;   // dy (B, N)
  const float* x;   // (B, N)
  const float* w1;  // W_1 (f_1, f_1): factors[0]
  const float* w2;  // W_2 (f_2, f_2): factors[1]
  const float* st;  // F_1 (B, N): [b][i_1][j_2], the state the forward saved
  float* dx;        // (B, N)
  float* part1;     // (B, f_1, f_1)
  float* part2;     // (B·S, f_2, f_2)
  int f1, f2, c, S;
};

// rows × (4·per) floats global -> shared, rows `ls` floats apart there and `ld` here. Eight threads a row, each a
// 16-byte run (per runs a row, a multiple of 8 for the block's operands; Xs's rows of c = 16 leave half idle), so a
// warp's copy instruction moves four rows' 128 contiguous bytes; no division per copy.
__device__ __forceinline__ void issue_rows(float* dst, int ld, const float* src, long ls, int rows, int per) {
  for (int r = threadIdx.x >> 3; r < rows; r += kThreads >> 3)
    for (int v = threadIdx.x & 7; v < per; v += 8) cp_async16(dst + r * ld + 4 * v, src + r * ls + 4 * v, true);
}

// acc[q][l] += Σ_{k < K} A[q][k]·B[l][k] for the thread's 4 × 4 outputs, k ascending, 4 at a time.
//   a: row q0 of the Q operand, k contiguous, rows lda apart; the thread's rows q0, q0+4, q0+8, q0+12
//   b: LKMAJOR: element (k = 0, l0) of a k-major operand, rows of k ldb apart, columns l0..l0+3;
//      else:    row l0 of an operand with k contiguous, rows ldb apart, the thread's rows l0, l0+8, l0+16, l0+24
template <bool LKMAJOR>
__device__ __forceinline__ void mma4x4(float (&acc)[4][4], const float* a, int lda, const float* b, int ldb, int K) {
#pragma unroll 2
  for (int k = 0; k < K; k += 4) {
    float av[4][4], bv[4][4];  // av[q][kk], bv[l][kk]
#pragma unroll
    for (int q = 0; q < 4; ++q) unpack(ld16<float4>(a + 4 * q * lda + k), av[q]);
    if constexpr (LKMAJOR) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float t[4];
        unpack(ld16<float4>(b + (k + kk) * ldb), t);
#pragma unroll
        for (int l = 0; l < 4; ++l) bv[l][kk] = t[l];
      }
    } else {
#pragma unroll
      for (int l = 0; l < 4; ++l) unpack(ld16<float4>(b + 8 * l * ldb + k), bv[l]);
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int l = 0; l < 4; ++l) acc[q][l] = fmaf(av[q][kk], bv[l][kk], acc[q][l]);
  }
}

// Warp tile wt of a Q × L output (Q a multiple of 16, L of 32): the thread's first Q row (quarter-warps 1 apart,
// rows q0 + 4·j) and first L index (LKMAJOR: 4 consecutive L a thread, lanes 4 apart; else rows l0 + 8·j, lanes 1
// apart).
template <bool LKMAJOR>
__device__ __forceinline__ void tile_origin(int wt, int L, int* q0, int* l0) {
  const int lane = threadIdx.x & 31, lt = L / 32;
  *q0 = (wt / lt) * 16 + (lane >> 3);
  *l0 = (wt % lt) * 32 + (LKMAJOR ? (lane & 7) * 4 : (lane & 7));
}

__global__ void __launch_bounds__(kThreads, 1) fused_kernel(const Args a) {
  extern __shared__ __align__(16) float smem[];
  const int f1 = a.f1, f2 = a.f2, c = a.c;
  const int ldg = f1 + kPad, ldw2 = f2 + kPad;
  const int ldx = c + kPad;
  float* Gs = smem;               // [f_2][f_1 + 4]  dy[b]
  float* W1s = Gs + f2 * ldg;     // [c][f_1 + 4]    W_1[r0:r0+c, :]
  float* Fs = W1s + c * ldg;      // [c][f_2 + 4]    F_1[b][r0:r0+c, :]
  float* W2s = Fs + c * ldw2;     // [f_2][f_2 + 4]  W_2
  float* Xs = W2s + f2 * ldw2;    // [f_2][c + 4]    x[b][:, r0:r0+c]
  float* Ts = Xs + f2 * ldx;      // [c][f_2 + 4]    T = dF_1[b][r0:r0+c, :]
  const long b = blockIdx.x / a.S;
  const int s = int(blockIdx.x % a.S), r0 = s * c;
  const long N = long(f1) * f2;
  // two halves of 8 warps: half 0 runs steps 1 and 3, half 1 steps 2 and 4 (each pair independent of each other)
  const int half = threadIdx.x / kHalf, warp = (threadIdx.x % kHalf) >> 5, nwarps = kHalf >> 5;

  // every load of the block at entry, in three cp.async groups: the first pair's operands, then the second's
  issue_rows(W1s, ldg, a.w1 + long(r0) * f1, f1, c, f1 / 4);  // group 0: steps 1 and 2
  issue_rows(Gs, ldg, a.g + b * N, f1, f2, f1 / 4);
  issue_rows(Fs, ldw2, a.st + b * N + long(r0) * f2, f2, c, f2 / 4);
  cp_async_commit();
  issue_rows(Xs, ldx, a.x + b * N + r0, f1, f2, c / 4);  // group 1: step 4
  cp_async_commit();
  issue_rows(W2s, ldw2, a.w2, f2, f2, f2 / 4);  // group 2: step 3
  cp_async_commit();
  cp_async_wait<2>();
  __syncthreads();

  if (half == 0) {
    // step 1: T (c × f_2) = W_1 rows · Gᵀ, k = j_1; L = j_2 from G's rows
    for (int wt = warp; wt < (c / 16) * (f2 / 32); wt += nwarps) {
      int q0, l0;
      tile_origin<false>(wt, f2, &q0, &l0);
      float acc[4][4] = {};
      mma4x4<false>(acc, W1s + q0 * ldg, ldg, Gs + l0 * ldg, ldg, f1);
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int l = 0; l < 4; ++l) Ts[(q0 + 4 * q) * ldw2 + l0 + 8 * l] = acc[q][l];
    }
  } else {
    // step 2: P1 (c × f_1) = F_1 rows · G, k = j_2; L = j_1, G k-major -> part1[b][r0 + q][j_1]
    for (int wt = warp; wt < (c / 16) * (f1 / 32); wt += nwarps) {
      int q0, l0;
      tile_origin<true>(wt, f1, &q0, &l0);
      float acc[4][4] = {};
      mma4x4<true>(acc, Fs + q0 * ldw2, ldw2, Gs + l0, ldg, f2);
      float* p = a.part1 + b * f1 * f1 + long(r0 + q0) * f1 + l0;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        st16<float4>(p + 4 * q * f1, make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]));
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // T whole; W_2 and x[b]'s slice landed

  if (half == 0) {
    // step 3: dx[b][i_2][r0 + q] = Σ_{j_2} W_2[i_2][j_2]·T[q][j_2]: Q = q from T's rows, L = i_2 from W_2's rows
    for (int wt = warp; wt < (c / 16) * (f2 / 32); wt += nwarps) {
      int q0, l0;
      tile_origin<false>(wt, f2, &q0, &l0);
      float acc[4][4] = {};
      mma4x4<false>(acc, Ts + q0 * ldw2, ldw2, W2s + l0 * ldw2, ldw2, f2);
      float* d = a.dx + b * N + r0 + q0;
#pragma unroll
      for (int l = 0; l < 4; ++l)
#pragma unroll
        for (int q = 0; q < 4; ++q) d[long(l0 + 8 * l) * f1 + 4 * q] = acc[q][l];
    }
  } else {
    // step 4: P2 (f_2 × f_2) = X[:, r0:r0+c]·T, k = i; Q = i_2 from Xs's rows, L = j_2 from T (k-major)
    float* p2 = a.part2 + long(blockIdx.x) * f2 * f2;
    for (int wt = warp; wt < (f2 / 16) * (f2 / 32); wt += nwarps) {
      int q0, l0;
      tile_origin<true>(wt, f2, &q0, &l0);
      float acc[4][4] = {};
      mma4x4<true>(acc, Xs + q0 * ldx, ldx, Ts + l0, ldw2, c);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        st16<float4>(p2 + long(q0 + 4 * q) * f2 + l0, make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]));
    }
  }
}

// dW_k[e] = Σ_z part_k[z][e]. A block takes 128 consecutive elements (a float4 a lane) of one factor (blockIdx.y);
// warp w sums z = w, w + 8, ... in order, then warp 0 adds the 8 warps' sums in order: a fixed order, so the result
// does not depend on scheduling. 8 warps' loads in flight where one thread a column would walk all Z (128 partials of
// dW_2 at batch 32) one load after another.
struct ReduceArgs {
  const float* part[2];
  float* out[2];
  int ff[2];  // f_k²
  int Z[2];   // partials
};

constexpr int kReduceThreads = 256;
__global__ void __launch_bounds__(kReduceThreads) reduce_kernel(const __grid_constant__ ReduceArgs a) {
  __shared__ float4 sums[kReduceThreads / 32][32];
  const int k = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ff = a.ff[k], Z = a.Z[k];
  const long e = (long(blockIdx.x) * 32 + lane) * 4;
  const bool live = e < ff;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (live) {
    const float* p = a.part[k] + e;
#pragma unroll 4
    for (int z = warp; z < Z; z += kReduceThreads / 32) {
      const float4 v = ld16<float4>(p + long(z) * ff);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
  }
  sums[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && live) {
    float4 t = sums[0][lane];
    for (int w = 1; w < kReduceThreads / 32; ++w) {
      const float4 v = sums[w][lane];
      t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
    }
    st16<float4>(a.out[k] + e, t);
  }
}

// ---- host: the plan and the launch ----------------------------------------------------------------------------------
struct Plan {
  bool ok = false;
  int c = 0, S = 0;
  long blocks = 0, smem = 0, ws = 0;  // ws: part1 + part2, floats
};

inline long smem_bytes(int f1, int f2, int c) {
  return 4L * (long(f2 + c) * (f1 + kPad) + long(c + f2 + c) * (f2 + kPad) + long(f2) * (c + kPad));
}

// c = 32 where the batch fills half the SMs with it (a thinner slice re-reads W_2 and G[b] more often for the same
// work), else 16; none where no c fits or the grid passes 4 blocks an SM (above it v1's kernels: part2 grows as B·S).
Plan plan(long B, const int* f, int K) {
  Plan p;
  if (K != 2 || B <= 0) return p;
  const int f1 = f[0], f2 = f[1];
  if (f1 % 32 || f2 % 32) return p;
  const DeviceFacts d = device_facts();
  for (int c : {32, 16}) {
    if (f1 % c || smem_bytes(f1, f2, c) > d.smem_optin) continue;
    const long blocks = B * (f1 / c);
    if (c == 32 && 2 * blocks < d.sms && f1 % 16 == 0 && smem_bytes(f1, f2, 16) <= d.smem_optin) continue;
    if (blocks > long(kMaxBlocksPerSm) * d.sms) return p;
    p.ok = true;
    p.c = c;
    p.S = f1 / c;
    p.blocks = blocks;
    p.smem = smem_bytes(f1, f2, c);
    p.ws = B * f1 * f1 + blocks * f2 * f2;
    return p;
  }
  return p;
}

// The workspace backward needs (floats), or 0 where this backward does not apply (the binding then runs v1's).
int64_t workspace(int64_t B, int64_t N, const int* f, int K) {
  if (K != 2 || long(f[0]) * f[1] != N) return 0;
  const Plan p = plan(B, f, K);
  return p.ok ? p.ws : 0;
}

// backward.cu's signature: states = {F_1}; ws of workspace() floats. cudaErrorInvalidConfiguration where the plan does
// not apply or a pointer is not 16-byte aligned (the binding asks workspace() and checks alignment first).
cudaError_t backward(const float* g, const float* x, const float* const* w, const int* f, int K, int64_t B, int64_t N,
                     const float* const* states, float* dx, float* const* dw, float* ws, cudaStream_t s) {
  const Plan p = plan(B, f, K);
  if (!p.ok || !states || long(f[0]) * f[1] != N) return cudaErrorInvalidConfiguration;
  const float* ptrs[] = {g, x, w[0], w[1], states[0], dx, dw[0], dw[1], ws};
  for (const float* q : ptrs)
    if (!aligned16(q)) return cudaErrorInvalidConfiguration;
  const int f1 = f[0], f2 = f[1];
  static bool opted[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= 0 && dev < 64 && !opted[dev]) {
    cudaFuncSetAttribute(fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device_facts().smem_optin);
    opted[dev] = true;
  }
  float* part1 = ws;
  float* part2 = ws + B * f1 * f1;
  const Args a{g, x, w[0], w[1], states[0], dx, part1, part2, f1, f2, p.c, p.S};
  fused_kernel<<<unsigned(p.blocks), kThreads, size_t(p.smem), s>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  ReduceArgs r{{part1, part2}, {dw[0], dw[1]}, {f1 * f1, f2 * f2}, {int(B), int(p.blocks)}};
  const int fmax = std::max(f1, f2);
  dim3 grid(unsigned(cdiv(fmax * fmax / 4, 32)), 2);
  reduce_kernel<<<grid, kReduceThreads, 0, s>>>(r);
  return cudaGetLastError();
}

}  // namespace v6b
}  // namespace kron

// ---- what the binding calls ("kron_v6_backward@f32", "kron_v6_backward_workspace@f32") ------------------------------
//   kron_v6_backward: backward.cu's kron_backward signature (float), states = {F_1}
//   kron_v6_backward_workspace: int64_t (int64_t B, int64_t N, const int* f, int K), floats; 0: does not apply
LAB_EXPORTS(LAB_EXPORT("kron_v6_backward", kron::v6b::backward),
            LAB_EXPORT("kron_v6_backward_workspace", kron::v6b::workspace))
