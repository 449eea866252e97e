// gru/proj.cu — the input projection x W_ih^T of v3..v6 when it has few rows (the fp32 encoder at batch 1..16: T*B
// rows of x), with the persistent kernels' step counters zeroed in the same launch ("gru_proj"). Two kernels: the
// ring kernel (proj_kernel, small tiles, any K and alignment) up to kRingRows rows, and the bulk-copy kernel
// (proj_bulk_kernel, 48 x 64 tiles, float32) above.
//
// Why a kernel of our own for a GEMM cuBLAS already does: at batch 1 (x: 30 x 256, W_ih: 1536 x 256, fp32) the
// whole projection is 11.8 MFLOP and 1.6 MB of W_ih, ~0.4 us of the chip's FMA pipes and ~0.5 us of HBM, but
// cuBLAS runs it as a 32x32-tile GEMM split over K plus a separate reduction kernel (~3.9 + ~2.8 us under Nsight
// Compute, results/<device>/ncu.csv), and the counters' fill is a third kernel (~1 us) before the persistent one;
// in a CUDA graph each kernel boundary adds a gap of its own (73.4 us of kernels, ~80 us replayed). One kernel that
// splits K inside the block (no second pass) and zeroes the counters removes two kernels and their gaps.
//
// The ring kernel (napkin math for the batch-1 encoder, M = 30, N = 1536, K = 256):
//   - a block owns a 32 x 32 output tile: N/32 = 48 blocks at batch 1, (M/32) x 48 = 192 at batch 4 (M = 120).
//   - K goes in chunks of 32 through a ring of 8 in shared memory, filled with cp.async (16-byte copies where rows
//     are 16-byte aligned; element loads otherwise): K = 256 is in flight at once, one wait and one barrier.
//   - the 512 threads are 8 k-groups of 64; group g takes k quad g of every chunk and each thread 4 x 4 outputs.
//     Per quad a thread does 8 shared loads (16 bytes each) for 64 FMAs.
//   - the groups' partial sums meet in shared memory (32 KB, over the ring) and are added in a fixed order: the
//     result does not depend on timing. Each output is a sum of 8 fp32 FMA chains of K/8 terms.
// What the H100 measured (graph replay of the projection alone, L2 flushed, against cuBLAS's GEMM plus the fill it
// replaces; ncu at base clocks):
//   - with two buffers instead of the ring (one memory round trip a chunk): 9.6 us at batch 1; the ring: 8.6 us,
//     against cuBLAS + fill 12.5 us. Ahead of cuBLAS up to M ~ 120, behind from M = 240 (17.7 against 16.0 us).
//   - ncu, batch 1: the 48 busy SMs' L1/shared pipe is saturated (L1/TEX throughput 45% of the whole chip's with
//     48 of 132 SMs busy): at 4 x 4 outputs a thread, 2 FMAs per float read from shared memory, the LDS
//     wavefronts, not the FMAs, bound a block. 32 x 16 tiles (96 blocks, 16 k-groups of one warp) tied at batch 1
//     (8.5 us; ncu 7.9 against 9.3 us) and lost from M = 60 (10.8 against 9.0 us): the same LDS work per output.
//   - fp16/bf16: cuBLAS's tensor-core GEMM plus the fill takes 7.2-7.9 us at every M up to 480, ahead of this
//     kernel everywhere (8.1-9.4 us at batch 1), so the binding keeps cuBLAS for them.
//
// The bulk-copy kernel (M = 240 at batch 8; at batch 8 the projection was the margin of issue 14's fp32 goal:
// cuBLAS's 11.7 us GEMM, the 1 us fill and ~5 us of launch gaps before a 68 us persistent kernel, 86 us in all):
//   - 48 x 64 tiles: 5 x 24 = 120 blocks at M = 240, one wave (cuBLAS: 384 blocks of 32 x 32, 13.2 us under ncu).
//     A block's work is 48 x 64 x 256 = 786 k FMAs, 6.1 k cycles of one SM's 128 FMA lanes (~3.1 us at 1.98 GHz);
//     its rows, (48 + 64) x 256 fp32 = 115 KB, come in as whole rows of global memory.
//   - on sm_90a a row is two cp.async.bulk copies (one per half of K, each half with its own mbarrier), issued by
//     one thread a row: 224 copy instructions a block instead of 7168 16-byte cp.async.
//   - 256 threads, 4 k-groups (k quads interleaved), 6 x 8 outputs a thread: per quad 14 shared loads for 192 FMAs.
// A/B on the H100 (graph, L2 flushed, fp32, N = 1536, K = 256; us; every tree in a run timed alongside the ring
// kernel and cuBLAS + fill, two rounds; ranges over runs):
//   | M (batch at T = 30)                        | 240 (8)     | 480 (16)    | 960 (32)    |
//   | ring kernel (32 x 32)                      | 18.9-20.8   | 30.5-31.0   | 52.4-53.9   |
//   | cp.async 48 x 64 ring                      | 15.6        | 26.4-26.5   | 48.4        |
//   |   the same with a wait per chunk           | 15.0-15.3   | 26.2-26.4   | 48.4-48.8   |
//   | cp.async 48 x 32 (2 blocks an SM)          | 16.4        | 27.5-27.6   | 48.7-48.9   |
//   | cp.async 64 x 64 (96 blocks)               | 18.0        | 31.7        | 46.1        |
//   | bulk, 4 pieces                             | 13.7-14.3   | 24.6        | 45.4-45.6   |
//   | bulk, 4 pieces, 48 x 32 / 24 x 64          | 15.0 / 14.3 | 25.5-25.7 / 24.5-24.7 | 46.3-46.5 / 44.3-44.4 |
//   | bulk, 2 pieces, 512 threads (8 k-groups)   | 14.0-14.1   | 23.4-23.5   | 41.4-41.6   |
//   | bulk, 4 pieces, 512 threads                | 14.7        | 25.5-25.9   | 47.2-47.4   |
//   | bulk, 2 pieces, 256 threads: this kernel   | 13.5        | 22.2-22.3   | 39.2-39.3   |
//   | cuBLAS GEMM + fill                         | 15.8-16.2   | 21.3-21.9   | 28.3-29.0   |
//   Whole encoder (T = 30, input 256, hidden 512, graph): v3 at batch 8 85.1-85.6 -> 81.4 us; v4 at batch 16
//   101.0-101.5 -> 100.3-100.4; at batch 32 cuBLAS's projection is ahead (v4 134.5-135.4 with it, 145.1 with this
//   kernel): the binding takes this kernel up to 512 rows.
// What bounds it (ncu at M = 240, unlocked clocks: 12.0 us): 8 warps an SM (one block: 116 KB of shared memory),
// 0.48 instructions issued per scheduler cycle, the FMA pipe active 35% of the cycles; stalls per issue:
// long_scoreboard 0.65 (the mbarrier waits), wait 0.58, not_selected 0.55, short_scoreboard 0.55 (shared loads);
// L2 -> SM 1.3 TB/s over the chip, L2 hit rate 84%. Neither phase runs near its floor on its own (the 4-piece
// variant, 12.9 us under ncu): with the product taken out the copies alone took 8.3 us (16.3 k cycles for 115 KB an
// SM), with the copies taken out the product alone 9.6 us (19 k cycles for 786 k FMAs an SM: ~41 a cycle of 128);
// together they overlap to ~13. Twice the warps (512 threads, 8 k-groups) did not help (14.1 us: long_scoreboard
// 1.47, not_selected 1.58, mio_throttle 1.00 per issue).
#include "gru.cuh"
#include "lab_sm90.cuh"  // cp.async (lab_gemm.cuh), mbarrier and the bulk copy

#include <type_traits>

namespace gru {

// A tiling of proj_kernel: BM x BN output tile per block, NT threads; each thread RM x RN outputs of one k-group,
// the k-groups (G of them) splitting every chunk of K four columns apiece.
template <int BM_, int BN_, int RM_, int RN_, int NT_>
struct ProjTile {
  static constexpr int BM = BM_, BN = BN_, RM = RM_, RN = RN_, NT = NT_;
  static constexpr int TR = BM / RM, TC = BN / RN;  // a k-group's threads: TR x TC, thread (tm, tn) owns rows
                                                    // tm + TR*i of x and tn + TC*j of W
  static constexpr int Group = TR * TC;
  static constexpr int G = NT / Group;              // k-groups, one 4-wide k quad of each chunk apiece
  static constexpr int PK = 4 * G;                  // chunk of K
  static constexpr int Stages = 256 / PK;           // chunks in flight: K = 256 at once
  static_assert(BM % RM == 0 && BN % RN == 0 && NT % Group == 0 && G >= 1 && Stages >= 2, "tile");
  // Row stride of a tile in elements: one 16-byte copy of padding, so consecutive rows start 4 banks (fp32, PK 32:
  // 36 floats) or more apart, a multiple of 4 banks (16-byte alignment for cp.async); the TC rows of W and the few
  // rows of x a warp reads in one k quad land in distinct 16-byte bank groups.
  template <class T> static constexpr int ld() { return PK + 16 / int(sizeof(T)); }
  // Dynamic shared memory: the ring of Stages (x, w) tile pairs, or the groups' partial sums (G x BM x BN fp32)
  // after the last chunk, whichever is larger.
  template <class T> static constexpr int smem() {
    constexpr int ring = Stages * (BM + BN) * ld<T>() * int(sizeof(T)), sums = G * BM * BN * 4;
    return ring > sums ? ring : sums;
  }
};

// Few rows (T*B <= kRingRows, the encoder at batch 1..4): 32 x 32 tiles, 512 threads of 4 x 4 outputs in 8
// k-groups; N/32 = 48 blocks at batch 1, (M/32) x 48 = 192 at batch 4 (M = 120). Per k quad a thread does 8 shared
// loads (16 bytes each) for 64 FMAs. fp32 ring: 73.7 KB; 16-bit: 40.9 KB; sums: 32 KB.
using SmallTile = ProjTile<32, 32, 4, 4, 512>;
constexpr int kRingRows = 128;  // (the binding's kRingProjRows, cpp_src/gru/gru.cpp)

// acc[i][j] += a[i] . b[j] for every pair: one k quad of a thread's RM x RN outputs, 4 RM RN FMAs (both kernels).
template <int RM, int RN>
__device__ __forceinline__ void outer4(float (&acc)[RM][RN], const float4 (&a)[RM], const float4 (&b)[RN]) {
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RN; ++j) {
      acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
      acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
      acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
      acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
    }
}

// One chunk of K (k0 .. k0 + PK) of x's tile rows and W's tile rows into tiles xs / ws. Out-of-range rows and k
// are zeros, so the tail chunk and the edge tiles need no other guard.
template <class P, class T, bool Vec>
__device__ __forceinline__ void proj_load(T* xs, T* ws, const T* x, const T* w, int m0, int n0, int M, int N, int K,
                                          int k0) {
  constexpr int ld = P::template ld<T>(), BM = P::BM, BN = P::BN, PK = P::PK;
  if constexpr (Vec) {  // K % E == 0 and both bases 16-byte aligned: every copy is all in or all out
    constexpr int E = 16 / int(sizeof(T)), CPR = PK / E;  // elements a copy, copies a row
    static_assert(PK % E == 0, "a chunk is whole 16-byte copies");
    for (int c = threadIdx.x; c < (BM + BN) * CPR; c += P::NT) {
      const bool isw = c >= BM * CPR;
      const int r = isw ? c / CPR - BM : c / CPR, q = c % CPR, row = (isw ? n0 : m0) + r, k = k0 + q * E;
      const T* base = isw ? w : x;
      const bool in = row < (isw ? N : M) && k < K;
      lab::cp_async16(lab::smem_u32((isw ? ws : xs) + r * ld + q * E), in ? base + int64_t(row) * K + k : base,
                      in ? 16 : 0);
    }
  } else {  // element by element, synchronous (odd K or unaligned views)
    for (int e = threadIdx.x; e < (BM + BN) * PK; e += P::NT) {
      const bool isw = e >= BM * PK;
      const int r = isw ? e / PK - BM : e / PK, kk = e % PK, row = (isw ? n0 : m0) + r, k = k0 + kk;
      const T* base = isw ? w : x;
      (isw ? ws : xs)[r * ld + kk] = row < (isw ? N : M) && k < K ? base[int64_t(row) * K + k] : from_f<T>(0.f);
    }
  }
}

// out (M, N) fp32 = x (M, K) @ w (N, K)^T; zero[0 .. nzero) = 0.
template <class P, class T, bool Vec>
__global__ void __launch_bounds__(P::NT) proj_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                     float* __restrict__ out, int M, int N, int K,
                                                     int* __restrict__ zero, int nzero) {
  constexpr int BM = P::BM, BN = P::BN, RM = P::RM, RN = P::RN, TR = P::TR, TC = P::TC, NT = P::NT;
  constexpr int G = P::G, PK = P::PK, Stages = P::Stages, ld = P::template ld<T>(), kStage = (BM + BN) * ld;
  extern __shared__ float4 proj_smem4[];
  T* tiles = reinterpret_cast<T*>(proj_smem4);  // [Stages][BM rows of x, then BN rows of W][ld]
  const int tid = threadIdx.x;
  // The persistent kernel launched after this one (early: cooperative.cuh) may start now, on the SMs this grid leaves
  // free, and load its weights; it reads out and zero only after this grid has finished (griddepcontrol.wait).
  lab::pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * NT + tid; i < nzero; i += int64_t(gridDim.x) * NT) zero[i] = 0;

  const int tiles_n = max(1, int(lab::ceil_div(N, BN)));
  const int m0 = int(blockIdx.x / tiles_n) * BM, n0 = int(blockIdx.x % tiles_n) * BN;
  // k-group g is threads g*Group .. ; a thread owns rows tm + TR*i of x and tn + TC*j of W: a warp's reads of one
  // k quad hit 32/TC rows of x and TC rows of W, in distinct bank groups (ld), one wavefront each
  const int g = tid / P::Group, tm = (tid % P::Group) / TC, tn = tid % TC;
  float acc[RM][RN] = {};

  // A ring of Stages chunks: all of them are requested before the first is multiplied, so the block pays one
  // memory latency rather than one a chunk (with two buffers, 8 chunks cost ~8 round trips: 9.6 us at batch 1).
  // One commit group a chunk (empty past the end): at chunk c, the groups of c .. c+Stages-1 are outstanding.
  const int nc = int(lab::ceil_div(K, PK));
  for (int c = 0; c < Stages; ++c) {
    if (c < nc) proj_load<P, T, Vec>(tiles + c * kStage, tiles + c * kStage + BM * ld, x, w, m0, n0, M, N, K, c * PK);
    lab::cp_async_commit();
  }
  const bool ring = nc > Stages;  // else every chunk has its own slot: one wait and one barrier for all of them
  for (int c = 0; c < nc; ++c) {
    const T* xs = tiles + (c % Stages) * kStage;
    if (ring) {
      lab::cp_async_wait<Stages - 1>();  // chunk c has landed
      __syncthreads();
    } else if (c == 0) {
      lab::cp_async_wait<0>();
      __syncthreads();
    }
    float4 a[RM], b[RN];
#pragma unroll
    for (int i = 0; i < RM; ++i) a[i] = ld4(xs + (tm + TR * i) * ld + 4 * g);
#pragma unroll
    for (int j = 0; j < RN; ++j) b[j] = ld4(xs + (BM + tn + TC * j) * ld + 4 * g);
    outer4(acc, a, b);
    if (ring) {
      __syncthreads();  // every group is done with this slot before chunk c + Stages's copies overwrite it
      if (c + Stages < nc) {
        T* nx = tiles + (c % Stages) * kStage;
        proj_load<P, T, Vec>(nx, nx + BM * ld, x, w, m0, n0, M, N, K, (c + Stages) * PK);
      }
      lab::cp_async_commit();
    }
  }
  lab::cp_async_wait<0>();  // (only empty groups are left)
  __syncthreads();          // all reads of the ring are done before the partial sums overwrite it
  float* red = reinterpret_cast<float*>(proj_smem4);  // [G][BM][BN], over the ring (its reads are done)
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RN; ++j) red[(g * BM + tm + TR * i) * BN + tn + TC * j] = acc[i][j];
  __syncthreads();
  // the groups' partial sums added in a fixed order: the result does not depend on timing
  for (int o = tid; o < BM * BN; o += NT) {
    const int m = m0 + o / BN, n = n0 + o % BN;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < G; ++q) s += red[q * BM * BN + o];
    if (m < M && n < N) out[int64_t(m) * N + n] = s;
  }
}

template <class P, class T>
cudaError_t proj_launch_tile(const T* x, const T* w, float* out, int M, int N, int K, int* zero, int nzero,
                             cudaStream_t stream) {
  // One block at least, so the counters are zeroed even with nothing to multiply.
  const int64_t n = lab::ceil_div(M, P::BM) * lab::ceil_div(N, P::BN), tiles = n > 0 ? n : 1;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  const bool vec = K % (16 / int(sizeof(T))) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  constexpr int smem = P::template smem<T>();
  auto* kernel = vec ? proj_kernel<P, T, true> : proj_kernel<P, T, false>;
  static bool opted[2][64] = {};  // above 48 KB a kernel opts in, once per device (one table per P, T)
  int dev = 0;
  if (smem > 48 * 1024 && cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < 64 && !opted[vec][dev]) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    opted[vec][dev] = true;
  }
  kernel<<<unsigned(tiles), P::NT, smem, stream>>>(x, w, out, M, N, K, zero, nzero);
  return cudaGetLastError();
}

// =================================================================================================================
// The bulk-copy kernel (float32, more than kRingRows rows, K % 4 == 0, 16-byte aligned operands): the tile's rows of
// x and W are whole rows of global memory (K floats, contiguous), so on sm_90a each is a few cp.async.bulk copies
// (the copy engine's transfers, one instruction per row piece, completing on an mbarrier) instead of K/4 16-byte
// cp.async instructions a row. The tile stays row-major in shared memory (row stride ldk = K rounded up to 32, + 4:
// consecutive rows 4 banks apart), K split into kPieces column pieces, each with its own mbarrier, so the product
// starts on the first piece while the others are in flight. The product is the cp.async kernel's (P's thread tile
// and k-groups); the sums meet the same way.
// =================================================================================================================
using BulkTile = ProjTile<48, 64, 6, 8, 256>;  // 120 blocks at M = 240; 14 shared loads for 192 FMAs a k quad
constexpr int kPieces = 2;                      // column pieces of K, one mbarrier each
__host__ __device__ constexpr int bulk_ldk(int K) { return (K + 31) / 32 * 32 + 4; }
// Dynamic shared memory: the tile's rows, or the k-groups' partial sums after the product, whichever is larger.
template <class P> constexpr int bulk_smem(int K) {
  const int rows = (P::BM + P::BN) * bulk_ldk(K) * 4, sums = P::G * P::BM * P::BN * 4;
  return rows > sums ? rows : sums;
}

template <class P>
__global__ void __launch_bounds__(P::NT) proj_bulk_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                          float* __restrict__ out, int M, int N, int K,
                                                          int* __restrict__ zero, int nzero) {
  constexpr int BM = P::BM, BN = P::BN, RM = P::RM, RN = P::RN, TR = P::TR, TC = P::TC, NT = P::NT, G = P::G;
  static_assert(BM + BN <= NT, "one thread issues each row's copies");
  extern __shared__ float4 proj_smem4[];
  const int tid = threadIdx.x, ldk = bulk_ldk(K), nq = K / 4;  // nq: 16-byte quads of a row
  float* xs = reinterpret_cast<float*>(proj_smem4);  // [BM][ldk] rows m0.. of x
  float* ws = xs + BM * ldk;                         // [BN][ldk] rows n0.. of W
  lab::pdl_launch_dependents();  // (as proj_kernel: the persistent kernel may start loading its weights)
  for (int64_t i = int64_t(blockIdx.x) * NT + tid; i < nzero; i += int64_t(gridDim.x) * NT) zero[i] = 0;

  const int tiles_n = max(1, int(lab::ceil_div(N, BN)));
  const int m0 = int(blockIdx.x / tiles_n) * BM, n0 = int(blockIdx.x % tiles_n) * BN;
  const int rx = max(0, min(BM, M - m0)), rw = max(0, min(BN, N - n0));  // rows in range; the others are never
  // written: they feed only outputs past M or N, which are not stored, so what they hold does not matter
  const int g = tid / P::Group, tm = (tid % P::Group) / TC, tn = tid % TC;
  float acc[RM][RN] = {};
  auto multiply = [&](int col) {  // k quad col/4 of this thread's rows: RM + RN shared loads, 4 RM RN FMAs
    float4 a[RM], b[RN];
#pragma unroll
    for (int i = 0; i < RM; ++i) a[i] = ld4(xs + (tm + TR * i) * ldk + col);
#pragma unroll
    for (int j = 0; j < RN; ++j) b[j] = ld4(ws + (tn + TC * j) * ldk + col);
    outer4(acc, a, b);
  };
  // piece q: quads [q nq / kPieces, (q+1) nq / kPieces); k-group g takes the quads k4 with k4 % G == g
  auto piece = [&](int q) {
    const int lo = q * nq / kPieces, hi = (q + 1) * nq / kPieces;
    for (int k4 = lo + ((g - lo % G) + G) % G; k4 < hi; k4 += G) multiply(4 * k4);
  };
#ifdef LAB_SM90A
  __shared__ __align__(8) unsigned long long bars[kPieces];
  if (tid == 0) {
    for (int q = 0; q < kPieces; ++q) lab::mbar_init(lab::smem_u32(bars + q), 1);
    lab::mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0)  // the byte counts first, so no copy can complete a phase early
    for (int q = 0; q < kPieces; ++q) {
      const int quads = (q + 1) * nq / kPieces - q * nq / kPieces;  // of each row in piece q
      lab::mbar_expect_tx(lab::smem_u32(bars + q), uint32_t(rx + rw) * 16u * uint32_t(quads));
    }
  __syncthreads();
  if (tid < rx + rw) {  // a row a thread: its pieces in order
    const bool isw = tid >= rx;
    const int r = isw ? tid - rx : tid;
    const float* src = isw ? w + int64_t(n0 + r) * K : x + int64_t(m0 + r) * K;
    float* dst = (isw ? ws : xs) + r * ldk;
    for (int q = 0; q < kPieces; ++q) {
      const int lo = q * nq / kPieces, hi = (q + 1) * nq / kPieces;
      if (hi > lo) lab::bulk_load(lab::smem_u32(dst + 4 * lo), src + 4 * lo, uint32_t(16 * (hi - lo)),
                                  lab::smem_u32(bars + q));
    }
  }
  for (int q = 0; q < kPieces; ++q) {
    lab::mbar_wait(lab::smem_u32(bars + q), 0);  // piece q of every row has landed
    piece(q);
  }
#else
  for (int i = tid; i < (rx + rw) * nq; i += NT) {  // plain 16-byte loads elsewhere
    const int r = i / nq, c = i % nq;
    const bool isw = r >= rx;
    *reinterpret_cast<float4*>((isw ? ws + (r - rx) * ldk : xs + r * ldk) + 4 * c) =
        *reinterpret_cast<const float4*>((isw ? w + int64_t(n0 + r - rx) * K : x + int64_t(m0 + r) * K) + 4 * c);
  }
  __syncthreads();
  for (int q = 0; q < kPieces; ++q) piece(q);
#endif
  __syncthreads();  // all reads of the tiles are done before the partial sums overwrite them
  float* red = reinterpret_cast<float*>(proj_smem4);  // [G][BM][BN]
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RN; ++j) red[(g * BM + tm + TR * i) * BN + tn + TC * j] = acc[i][j];
  __syncthreads();
  for (int o = tid; o < BM * BN; o += NT) {  // in a fixed order, as proj_kernel
    const int m = m0 + o / BN, n = n0 + o % BN;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < G; ++q) s += red[q * BM * BN + o];
    if (m < M && n < N) out[int64_t(m) * N + n] = s;
  }
}

// The bulk kernel where it applies (K % 4 == 0, 16-byte aligned bases, the tile's rows fit in shared memory);
// returns cudaErrorNotSupported where it does not, for the caller to take the ring kernel.
template <class P>
cudaError_t proj_bulk_launch(const float* x, const float* w, float* out, int M, int N, int K, int* zero, int nzero,
                             cudaStream_t stream) {
  if ((reinterpret_cast<uintptr_t>(x) & 15) || (reinterpret_cast<uintptr_t>(w) & 15) || K % 4 || K > (1 << 16))
    return cudaErrorNotSupported;
  const int smem = bulk_smem<P>(K);
  // Per device: the most dynamic shared memory a block of this kernel may take (the opt-in limit less its static
  // mbarriers, rounded down to 128 bytes), asked once, so a K too large is declined here rather than by a failing
  // cudaFuncSetAttribute (an API error under compute-sanitizer); its static bytes; and the size the kernel has opted
  // in to so far. The default limit (48 KB) counts static and dynamic bytes together: for K <= 96 the partial sums
  // are the larger part, exactly 48 KB, and without the opt-in such a launch failed (cudaErrorInvalidValue) in a
  // process whose first bulk projection it was (found by compute-sanitizer's run of the seq2seq small model).
  static int limit[64] = {}, fixed[64] = {}, opted[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return cudaErrorNotSupported;
  if (!limit[dev]) {
    int optin = 0;
    cudaFuncAttributes fa{};
    cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, proj_bulk_kernel<P>);
    if (e != cudaSuccess) return e;
    limit[dev] = (optin - int(fa.sharedSizeBytes)) & ~127;
    fixed[dev] = int(fa.sharedSizeBytes);
  }
  if (smem > limit[dev]) return cudaErrorNotSupported;
  if (smem + fixed[dev] > 48 * 1024 && smem > opted[dev]) {
    const cudaError_t e = cudaFuncSetAttribute(proj_bulk_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    opted[dev] = smem;
  }
  const int64_t n = lab::ceil_div(M, P::BM) * lab::ceil_div(N, P::BN), tiles = n > 0 ? n : 1;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  proj_bulk_kernel<P><<<unsigned(tiles), P::NT, smem, stream>>>(x, w, out, M, N, K, zero, nzero);
  return cudaGetLastError();
}

template <class T>
cudaError_t proj_launch(const void* x, const void* w, float* out, int M, int N, int K, int* zero, int nzero,
                        cudaStream_t stream) {
  const T *xp = static_cast<const T*>(x), *wp = static_cast<const T*>(w);
  // the bulk-copy kernel for float32 only: the binding sends 16-bit projections to cuBLAS's tensor cores (header)
  if constexpr (std::is_same<T, float>::value) {
    if (M > kRingRows) {
      const cudaError_t e = proj_bulk_launch<BulkTile>(xp, wp, out, M, N, K, zero, nzero, stream);
      if (e != cudaErrorNotSupported) return e;  // else (odd K, unaligned views, K past shared memory): the ring
    }
  }
  return proj_launch_tile<SmallTile, T>(xp, wp, out, M, N, K, zero, nzero, stream);
}

}  // namespace gru

// Launcher (cpp_src/gru/gru.cpp): dtype 0 float32, 1 float16, 2 bfloat16 (x and w); out (M, N) fp32, contiguous;
// zero: nzero ints set to 0 (the step counters of the launch that follows), or nullptr.
cudaError_t gru_proj(int dtype, const void* x, const void* w, float* out, int M, int N, int K, int* zero, int nzero,
                     cudaStream_t stream) {
  using namespace gru;
  switch (dtype) {
    case kF32: return proj_launch<float>(x, w, out, M, N, K, zero, nzero, stream);
    case kF16: return proj_launch<__half>(x, w, out, M, N, K, zero, nzero, stream);
    case kBF16: return proj_launch<__nv_bfloat16>(x, w, out, M, N, K, zero, nzero, stream);
    default: return cudaErrorInvalidValue;
  }
}

LAB_EXPORTS(LAB_EXPORT("gru_proj", gru_proj))
