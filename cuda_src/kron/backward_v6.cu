// kron/backward_v6.cu — version 6's backward: two factors in strict fp32, small batches, one block per (sample, slice
// of W_1's rows) doing all four of the sample's products, then one reduce launch (the algebra: kron.cuh).
//
// Why. v1's backward (backward.cu, also v2's and until now v6's) runs per factor a dW kernel and an R-step kernel, then
// a reduce: at batch 1 the four kernels took 11 + 11 + 9 + 9 us (H100, graph, 128 × 128, torch.profiler), each block
// walking f/16 chunks of k through a 2-stage pipeline, one round trip to L2 a chunk; at batch 32 53 us of a 73 us
// training step whose forward (v6) took 14. Here every operand of a block is in flight from its first cycle (as in
// v6's forward) and one kernel does what the four did.
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
// The products' operands in shared memory are rows of k as they lie in memory (no transposes): in every step the
// output's "Q" rows (4 consecutive a thread, the same for the 8 lanes of a quarter-warp: broadcast reads) come from
// an operand whose rows run along k; the "L" columns (8 lanes of a quarter-warp apart) come either from rows along k
// (steps 1 and 3: a thread takes rows l, l+8, l+16, l+24; those operands' rows are padded by 4 floats, so 8 lanes'
// 16-byte reads of 8 consecutive rows hit 8 different bank quads) or from a k-major operand (steps 2 and 4: 4
// consecutive columns a thread, 8 lanes read 128 contiguous bytes). Per 4 values of k a thread issues 8 16-byte
// shared loads for 64 FMAs — the ratio of v6's 4 × 4 forward.
//
// Scope (v1's backward runs everything else): K = 2, float32; f_1 and f_2 multiples of 32; c ∈ {16, 32} dividing
// f_1 and the block's shared memory within the device's limit (196 KB at 128 × 128, c = 32); B·S blocks at most
// 4 an SM (part2 is B·S·f_2² floats: 8 MB at batch 32, 128 × 128); 16-byte aligned tensors.
//
// Napkin math (H100, 128 × 128, batch 32, c = 32): 4 · 134 M MAC = 537 M MAC, 8.2 us at the chip's FMA rate.
// 128 blocks, one an SM, 2 M MAC a block: 16 k cycles of FMA issue an SM (~8.8 us) if nothing else issued. Loads:
// 196 KB a block, 25 MB from L2 for the grid (W_2 alone 8 MB: every block reads all of it); part1 + part2 10 MB out
// and back in through the reduce.
// lab:variants dtype=f32
#include "kron.cuh"

#include <initializer_list>

namespace kron {
namespace v6b {

constexpr int kThreads = 256;  // 8 warps; a warp tile is 16 Q × 32 L outputs, 4 × 4 a thread
constexpr int kPad = 4;        // floats after each row of the operands read as 8 consecutive rows by a quarter-warp
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
//   a: row q0 of the Q operand, rows lda apart, k contiguous (rows q0..q0+3)
//   b: LKMAJOR: element (k = 0, l0) of a k-major operand, rows of k ldb apart, columns l0..l0+3;
//      else:    row l0 of an operand with k contiguous, rows ldb apart, the thread's rows l0, l0+8, l0+16, l0+24
template <bool LKMAJOR>
__device__ __forceinline__ void mma4x4(float (&acc)[4][4], const float* a, int lda, const float* b, int ldb, int K) {
#pragma unroll 2
  for (int k = 0; k < K; k += 4) {
    float av[4][4], bv[4][4];  // av[q][kk], bv[l][kk]
#pragma unroll
    for (int q = 0; q < 4; ++q) unpack(ld16<float4>(a + q * lda + k), av[q]);
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

// Warp tile wt of a Q × L output (Q a multiple of 16, L of 32): the thread's first Q row and first L index.
// LKMAJOR: 4 consecutive L a thread (lanes 4 apart); else L rows l0 + 8·j (lanes 1 apart).
template <bool LKMAJOR>
__device__ __forceinline__ void tile_origin(int wt, int L, int* q0, int* l0) {
  const int lane = threadIdx.x & 31, lt = L / 32;
  *q0 = (wt / lt) * 16 + (lane >> 3) * 4;
  *l0 = (wt % lt) * 32 + (LKMAJOR ? (lane & 7) * 4 : (lane & 7));
}

__global__ void __launch_bounds__(kThreads) fused_kernel(const Args a) {
  extern __shared__ __align__(16) float smem[];
  const int f1 = a.f1, f2 = a.f2, c = a.c;
  const int ldg = f1 + kPad, ldw2 = f2 + kPad;
  float* Gs = smem;               // [f_2][f_1 + 4]  dy[b]
  float* W1s = Gs + f2 * ldg;     // [c][f_1]        W_1[r0:r0+c, :]
  float* Fs = W1s + c * f1;       // [c][f_2]        F_1[b][r0:r0+c, :]
  float* W2s = Fs + c * f2;       // [f_2][f_2 + 4]  W_2
  float* Xs = W2s + f2 * ldw2;    // [f_2][c]        x[b][:, r0:r0+c]
  float* Ts = Xs + f2 * c;        // [c][f_2]        T = dF_1[b][r0:r0+c, :]
  const long b = blockIdx.x / a.S;
  const int s = int(blockIdx.x % a.S), r0 = s * c;
  const long N = long(f1) * f2;
  const int warp = threadIdx.x >> 5, nwarps = kThreads >> 5;

  // every load of the block at entry, in the order the steps use them: four cp.async groups
  issue_rows(W1s, f1, a.w1 + long(r0) * f1, f1, c, f1 / 4);  // group 0: step 1
  issue_rows(Gs, ldg, a.g + b * N, f1, f2, f1 / 4);
  cp_async_commit();
  issue_rows(Fs, f2, a.st + b * N + long(r0) * f2, f2, c, f2 / 4);  // group 1: step 2
  cp_async_commit();
  issue_rows(W2s, ldw2, a.w2, f2, f2, f2 / 4);  // group 2: step 3
  cp_async_commit();
  issue_rows(Xs, c, a.x + b * N + r0, f1, f2, c / 4);  // group 3: step 4
  cp_async_commit();

  // step 1: T (c × f_2) = W_1 rows · Gᵀ, k = j_1; L = j_2 from G's rows
  cp_async_wait<3>();
  __syncthreads();
  for (int wt = warp; wt < (c / 16) * (f2 / 32); wt += nwarps) {
    int q0, l0;
    tile_origin<false>(wt, f2, &q0, &l0);
    float acc[4][4] = {};
    mma4x4<false>(acc, W1s + q0 * f1, f1, Gs + l0 * ldg, ldg, f1);
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int l = 0; l < 4; ++l) Ts[(q0 + q) * f2 + l0 + 8 * l] = acc[q][l];
  }

  // step 2: P1 (c × f_1) = F_1 rows · G, k = j_2; L = j_1, G k-major -> part1[b][r0 + q][j_1]
  cp_async_wait<2>();
  __syncthreads();  // (also: T whole for steps 3 and 4)
  for (int wt = warp; wt < (c / 16) * (f1 / 32); wt += nwarps) {
    int q0, l0;
    tile_origin<true>(wt, f1, &q0, &l0);
    float acc[4][4] = {};
    mma4x4<true>(acc, Fs + q0 * f2, f2, Gs + l0, ldg, f2);
    float* p = a.part1 + b * f1 * f1 + long(r0 + q0) * f1 + l0;
#pragma unroll
    for (int q = 0; q < 4; ++q) st16<float4>(p + q * f1, make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]));
  }

  // step 3: dx[b][i_2][r0 + q] = Σ_{j_2} W_2[i_2][j_2]·T[q][j_2]: Q = q from T's rows, L = i_2 from W_2's rows
  cp_async_wait<1>();
  __syncthreads();
  for (int wt = warp; wt < (c / 16) * (f2 / 32); wt += nwarps) {
    int q0, l0;
    tile_origin<false>(wt, f2, &q0, &l0);
    float acc[4][4] = {};
    mma4x4<false>(acc, Ts + q0 * f2, f2, W2s + l0 * ldw2, ldw2, f2);
    float* d = a.dx + b * N + r0 + q0;
#pragma unroll
    for (int l = 0; l < 4; ++l)
      st16<float4>(d + long(l0 + 8 * l) * f1, make_float4(acc[0][l], acc[1][l], acc[2][l], acc[3][l]));
  }

  // step 4: P2 (f_2 × f_2) = X[:, r0:r0+c]·T, k = i; Q = i_2 from Xs's rows, L = j_2 from T (k-major)
  cp_async_wait<0>();
  __syncthreads();
  float* p2 = a.part2 + long(blockIdx.x) * f2 * f2;
  for (int wt = warp; wt < (f2 / 16) * (f2 / 32); wt += nwarps) {
    int q0, l0;
    tile_origin<true>(wt, f2, &q0, &l0);
    float acc[4][4] = {};
    mma4x4<true>(acc, Xs + q0 * c, c, Ts + l0, f2, c);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      st16<float4>(p2 + long(q0 + q) * f2 + l0, make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]));
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

__global__ void __launch_bounds__(kThreads) reduce_kernel(const __grid_constant__ ReduceArgs a) {
  __shared__ float4 sums[kThreads / 32][32];
  const int k = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ff = a.ff[k], Z = a.Z[k];
  const long e = (long(blockIdx.x) * 32 + lane) * 4;
  const bool live = e < ff;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (live) {
    const float* p = a.part[k] + e;
#pragma unroll 4
    for (int z = warp; z < Z; z += kThreads / 32) {
      const float4 v = ld16<float4>(p + long(z) * ff);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
  }
  sums[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && live) {
    float4 t = sums[0][lane];
    for (int w = 1; w < kThreads / 32; ++w) {
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
  return 4L * (long(f2) * (f1 + kPad) + long(c) * f1 + long(c) * f2 + long(f2) * (f2 + kPad) + long(f2) * c +
               long(c) * f2);
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
  reduce_kernel<<<grid, kThreads, 0, s>>>(r);
  return cudaGetLastError();
}

}  // namespace v6b
}  // namespace kron

// ---- what the binding calls ("kron_v6_backward@f32", "kron_v6_backward_workspace@f32") ------------------------------
//   kron_v6_backward: backward.cu's kron_backward signature (float), states = {F_1}
//   kron_v6_backward_workspace: int64_t (int64_t B, int64_t N, const int* f, int K), floats; 0: does not apply
LAB_EXPORTS(LAB_EXPORT("kron_v6_backward", kron::v6b::backward),
            LAB_EXPORT("kron_v6_backward_workspace", kron::v6b::workspace))
