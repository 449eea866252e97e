// kron/backward_tc.cu — the backward of the tensor-core versions (3, 4, 5): TF32 on float32 tensors, bf16 with fp32
// accumulators on bfloat16 ones. One mma.sync GEMM kernel, instantiated for the three kinds of step (kron.cuh has
// the algebra; F_K = x, F_{k-1} = F_kᵀ·W_k, dF_0 = dy):
//   F-step  F_{k-1}[b] (P, f) = F_k[b]ᵀ · W_k                 recomputes the states
//   R-step  dF_k[b] (f, P)    = W_k · dF_{k-1}[b]ᵀ
//   dW      dW_k (f, f)       = Σ_b F_k[b] · dF_{k-1}[b]      split over blocks along the contraction (b, p)
// The forward kernels of v3-v5 keep their states on chip and save none, so the backward recomputes F_{K-1} … F_1
// (K-1 F-steps) before the K R-steps and K dW GEMMs. Every dW is split into per-block fp32 partials, summed in a fixed
// order by one reduce launch (deterministic, as backward.cu). Intermediates are stored in the tensor's dtype (bf16
// rounds each state and dF, as cuBLAS-factorwise does between its GEMMs; TF32 keeps fp32 and rounds operands to TF32
// as it loads their fragments).
//
// The kernel (step_kernel): a block owns a BM × BN output tile — 128 × 128, 8 warps of 64 × 32, where that tile fills
// every SM, else 64 × 64, 4 warps of 32 × 32 — and walks the contraction in 64-byte-deep chunks through a 4-stage
// cp.async pipeline (one barrier a chunk). Each operand is copied as it lies in memory, in 16-byte runs: one
// contiguous along its row/column index is staged [k][m] (fragments by ldmatrix.trans for bf16), one contiguous along k
// as [m][k] (plain ldmatrix); so no operand is transposed by the threads. The output tile leaves through shared memory
// in 16-byte runs along its columns (the R-step puts the samples on the columns, so dF_k[b][i][p] is written along p).
// Odd sizes (a dimension not a multiple of the run, a misaligned view) take element loads and stores with
// per-element bounds; tiles past an edge are zero-filled.
//
// Napkin math (factors 128 × 128, batch 1024, bf16; one (B, N) tensor is 33.5 MB): 5 steps each read two such tensors
// or read one and write one (335 MB), the dW partials 2 × 17 MB written and read back: ~400 MB, 134 us at the 3.0 TB/s
// the lab's copy probe measures (TF32: twice the bytes, ~250 us). The FLOPs (5 GEMMs of 4.3 GFLOP) take ~25 us at the
// dense bf16 rate: the steps are memory-bound, each at most a copy's speed.
// How the kernel got there (H100, graph, L2 flushed, backward alone at batch 1024, bf16 / TF32):
//  1. Operands staged through registers and transposed by the threads where contiguous along k, the accumulators
//     stored straight from the fragments: 417 / 611 us.
//  2. cp.async in 4 stages, every operand copied as it lies (no transposes), no 64-bit division per element: 442-448 /
//     615-620 us — no gain; ncu: the F- and R-steps at 17-20% of the DRAM bandwidth, each fragment store (2 or 4
//     bytes, 8 rows per instruction) touching 8 sectors.
//  3. The output through shared memory in 16-byte runs: 220 / 386 us (forward + backward through autograd 247 / 454,
//     cuBLAS-factorwise 331 / 557 in the same run). ncu (bf16): F-step 41 us at 36% of DRAM peak, each dW 38-40 us at
//     52-55%, each R-step 43 us at 34%, the reduce 24 us at 46%; issue slots ~50% busy. The 64 × 64 tile measured
//     315 / 463 us at this batch.
// The reduce then gave each output column 8 warps over the splits (below): 24 -> 22 us.
//  4. Tried and taken out (9878fa8, reverted): the F- and R-steps persistent, a block walking its tiles as one stream
//     of chunks so that the next tile loads while this one's output is written (its own shared-memory output tile, 3
//     stages, two blocks an SM): 218 / 410 us, no better for bf16 and worse for TF32; ncu kept the F-step at 32% of
//     DRAM peak with the issue slots ~51% busy: ~1.9 K instructions a warp per 128 × 128 tile against 128 mma, most
//     of them the staging's address arithmetic (a cp.async per 16 bytes) and the output's runs.
//  5. Affine staging (stage_affine): where a chunk is base + mm·ms + kk·ks — every operand but a tile or chunk that may
//     cross a sample — a run costs two 32-bit multiply-adds and its cp.async instead of a (b, p) split and 64-bit
//     products: 215 / 358 us (218-220 / 386 in the earlier runs above); forward + backward batch 1024
//     242 / 426 against cuBLAS-factorwise 332 / 558, batch 32 34.0 / 56.5 against 39.7 / 49.3, batch 4096 739 / 1374
//     against 1154 / 2018. (Dev timing on the H100, graph, L2 flushed; results/ and notebook 05 hold the rows of
//     design 3 with the reduce above, measured at 7688426.)
//  6. Programmatic dependent launch (wait_then_release_next, pdl_helps): each kernel launches while the one before it
//     runs and waits on the SMs it leaves idle, so the launch gaps between the six kernels hide behind the tails.
//     A/B in one run (graph, L2 flushed, backward alone, bf16 / TF32, us): batch 1 24.0 -> 20.5 / 32.2 -> 28.4,
//     batch 32 28.6 -> 25.1 / 38.7 -> 35.0, batch 64 36.3 -> 32.8 / 48.8 -> 45.3, batch 128 (not used there)
//     50.6 -> 50.9 / 97.1 -> 96.7, batch 256 86.0 -> 83.4 / 121.4 -> 119.5, batch 1024 218.5 -> 216.4 / 361.6 -> 357.5;
//     forward + backward at batch 32 34.0 -> 30.4 / 56.0 -> 52.5.
// What is left: every step is its own pass over (B, N) tensors; tiles copied by TMA (one instruction a tile, where a
// tile stays within a sample) and the R-step's dF fused into the next dW (as v5 fuses the forward) are the next
// designs.
// lab:variants dtype=f32,bf16
#include "kron.cuh"
#include "mma_sync.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

namespace kron {
namespace tcb {

#if defined(LAB_VARIANT_dtype_bf16)
using Elem = __nv_bfloat16;
#else
using Elem = float;  // multiplied in TF32
#endif
using M = tc::Mma<Elem>;
constexpr int KS = M::KS, KC = M::KC;        // k per mma (8 TF32, 16 bf16), k per chunk (64 bytes of a row)
constexpr int VW = 16 / int(sizeof(Elem));   // elements per 16-byte vector
constexpr int kPad = 8;                      // row padding of the shared tiles: ld ≡ 8 (mod 32) words (TF32's
                                             // scalar fragment loads), 16 (mod 128) bytes (bf16's ldmatrix rows)

enum Mode { kFStep = 0, kRStep = 1, kDW = 2 };

template <int BM_, int BN_, int WM_, int WN_, int NS_> struct TileCfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, NS = NS_;  // block tile; WM × WN warps; NS stages
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int MI = BM / WM / 16, NI = BN / WN / 8;              // m16 and n8 tiles per warp
};
using Big = TileCfg<128, 128, 2, 4, 4>;  // warp tile 64 × 32, 64 accumulators a thread
using Small = TileCfg<64, 64, 2, 2, 4>;  // warp tile 32 × 32

// The three steps as GEMMs C (rows × cols) = A (rows × depth) · B (depth × cols), each operand read where it lies:
//   F-step  rows (b, p), cols j, k = i    A = F_k[b][i][p]  (along rows)   B = W[i][j]      (along cols)
//   R-step  rows i, cols (b, p), k = j    A = W[i][j]       (along k)      B = dF[b][p][j]  (along k)
//   dW      rows i, cols j, k = (b, p)    A = F_k[b][i][p]  (along k)      B = dF[b][p][j]  (along cols)
// An operand contiguous along its row/column index is staged as [k][m] (the layout mma_sync.cuh's load_a / load_b2
// read, ldmatrix.trans for bf16); one contiguous along k as [m][k] (load_a_rows / load_b2_rows, plain ldmatrix). Both
// are then 16-byte copies from global memory (cp.async, no register round trip) in the vector case: no transposes.
// The R-step is written with the sample index on the columns so that its output, dF_k[b][i][p], is stored along p.
template <int MODE> __host__ __device__ constexpr bool a_along_k() { return MODE != kFStep; }
template <int MODE> __host__ __device__ constexpr bool b_along_k() { return MODE == kRStep; }

struct StepArgs {
  const Elem* a;  // F-step: F_k; R-step: W_k; dW: F_k
  const Elem* b;  // F-step: W_k; R-step: dF_{k-1}; dW: dF_{k-1}
  void* c;        // F-step: F_{k-1}; R-step: dF_k (Elem); dW: the partials (float, splits × f × f)
  long rows;      // the GEMM's M: B·P (F-step) or f
  long cols;      // N: f, or B·P (R-step)
  long depth;     // K: f, or B·P (dW)
  long n;         // elements of a sample, N = f·P
  int f, p;       // the factor's size and P = N / f
  int tiles_n, tiles, splits;
  bool vec_a, vec_b;  // 16-byte runs: the run's dimension a multiple of VW, the pointer 16-byte aligned
  bool vec_c;         // the same for the output's runs along its columns
  bool aff_a, aff_b;  // the operand's chunk is affine, base + mm·ms + kk·ks with 32-bit offsets (stage_affine)
};

// (b, p) of index base + off of a flattened (b, p) axis, given (b0, p0) of base: the rows of an F-step tile, the
// columns of an R-step tile and the contraction of a dW chunk are such an axis. Nothing divides in the common case
// (P at least the tile: one wrap at most; the first builds divided in 64 bits for every element).
__device__ __forceinline__ void split_bp(long b0, int p0, int off, int P, long& b, int& p) {
  const int t = p0 + off;
  if (t < P) {
    b = b0, p = t;
  } else {
    const int q = t / P;
    b = b0 + q, p = t - q * P;
  }
}

// Stage one operand's R × KC chunk into shared memory. ALONG_K: stored [R][KC + VW] (rows of k), else [KC][R + kPad].
// at(mm, kk): the element offset of the chunk's (row or column mm, k kk); mn_cnt × k_cnt of it lie inside. A run is VW
// elements along the contiguous dimension: one cp.async of 16 bytes (zero-filled outside; the counts are multiples of
// VW when vec), or VW element loads with per-element bounds.
template <int R, int THREADS, bool ALONG_K, class At>
__device__ __forceinline__ void stage(Elem* s, const Elem* base, At&& at, int mn_cnt, int k_cnt, bool vec) {
  constexpr int RUNS = R * KC / VW;
  constexpr int LD = ALONG_K ? KC + VW : R + kPad;
  for (int q = threadIdx.x; q < RUNS; q += THREADS) {
    int mm, kk;
    if constexpr (ALONG_K) mm = q / (KC / VW), kk = (q % (KC / VW)) * VW;
    else kk = q / (R / VW), mm = (q % (R / VW)) * VW;
    Elem* dst = ALONG_K ? s + mm * LD + kk : s + kk * LD + mm;
    if (vec) {
      const bool ok = mm < mn_cnt && kk < k_cnt;
      cp_async16(dst, ok ? base + at(mm, kk) : base, ok);
    } else {
#pragma unroll
      for (int j = 0; j < VW; ++j) {
        const int em = mm + (ALONG_K ? 0 : j), ek = kk + (ALONG_K ? j : 0);
        dst[j] = (em < mn_cnt && ek < k_cnt) ? base[at(em, ek)] : tc::elem_zero<Elem>();
      }
    }
  }
}
// The same where the chunk is affine in (mm, kk) — element (mm, kk) at base + mm·ms + kk·ks, runs 16-byte aligned —
// as every operand is except where a tile or chunk may cross a sample: each run then costs two 32-bit multiply-adds
// and the cp.async. (The general path's (b, p) split and 64-bit products per run made the staging most of the F- and
// R-steps' instructions.)
template <int R, int THREADS, bool ALONG_K>
__device__ __forceinline__ void stage_affine(Elem* s, const Elem* base, int ms, int ks, int mn_cnt, int k_cnt) {
  constexpr int RUNS = R * KC / VW;
  constexpr int LD = ALONG_K ? KC + VW : R + kPad;
  static_assert(RUNS % THREADS == 0, "every thread stages the same number of runs");
#pragma unroll
  for (int i = 0; i < RUNS / THREADS; ++i) {
    const int q = int(threadIdx.x) + i * THREADS;
    int mm, kk;
    if constexpr (ALONG_K) mm = q / (KC / VW), kk = (q % (KC / VW)) * VW;
    else kk = q / (R / VW), mm = (q % (R / VW)) * VW;
    const bool ok = mm < mn_cnt && kk < k_cnt;
    cp_async16(ALONG_K ? s + mm * LD + kk : s + kk * LD + mm, ok ? base + (mm * ms + kk * ks) : base, ok);
  }
}
template <int R, bool ALONG_K> __host__ __device__ constexpr int tile_elems() {
  return ALONG_K ? R * (KC + VW) : KC * (R + kPad);
}
template <int MODE, class TL> __host__ __device__ constexpr int stage_bytes() {
  return (tile_elems<TL::BM, a_along_k<MODE>()>() + tile_elems<TL::BN, b_along_k<MODE>()>()) * int(sizeof(Elem));
}
// what a step writes: the partials of dW in fp32, the states and dF in the dtype
template <int MODE> using OutOf = typename std::conditional<MODE == kDW, float, Elem>::type;
template <int MODE, class TL> constexpr int smem_bytes() {
  constexpr int stages = TL::NS * stage_bytes<MODE, TL>();
  constexpr int ctile = TL::BM * (TL::BN + 16 / int(sizeof(OutOf<MODE>))) * int(sizeof(OutOf<MODE>));
  return stages > ctile ? stages : ctile;
}

// Programmatic dependent launch (sm_90; launch_pdl below): every kernel of the backward may start while the one before
// it in the stream still runs. It first waits until that grid has finished and its writes are visible, then lets the
// next kernel's grid launch: that grid's blocks take the SMs this one leaves idle and wait here in turn, so a launch's
// latency hides behind the previous kernel's tail. Before sm_90: nothing (a plain launch).
__device__ __forceinline__ void wait_then_release_next() {
  lab::pdl_wait();
  lab::pdl_launch_dependents();
}

template <int MODE, class TL>
__global__ void __launch_bounds__(TL::THREADS) step_kernel(const __grid_constant__ StepArgs a) {
  constexpr int BM = TL::BM, BN = TL::BN, MI = TL::MI, NI = TL::NI, NS = TL::NS;
  constexpr bool AK = a_along_k<MODE>(), BK = b_along_k<MODE>();
  constexpr int LDA = AK ? KC + VW : BM + kPad, LDB = BK ? KC + VW : BN + kPad;
  constexpr int A_ELEMS = tile_elems<BM, AK>(), STAGE = A_ELEMS + tile_elems<BN, BK>();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* smem = reinterpret_cast<Elem*>(smem_raw);
  wait_then_release_next();
  const int z = int(blockIdx.x) / a.tiles, tile = int(blockIdx.x) % a.tiles;
  const long m0 = long(tile / a.tiles_n) * BM, n0 = long(tile % a.tiles_n) * BN;
  const long nchunks = (a.depth + KC - 1) / KC;
  const long c_lo = nchunks * z / a.splits, c_hi = nchunks * (z + 1) / a.splits;  // this split's chunks
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm = warp / TL::WN, wn = warp % TL::WN;
  const int P = a.p;
  const int mcnt = int(min(long(BM), a.rows - m0)), ncnt = int(min(long(BN), a.cols - n0));
  // (b, p) of the tile's first row (F-step) or column (R-step); dW: of the chunk being issued (chunks go in order)
  long sb0 = 0, kb = 0;
  int sp0 = 0, kp = 0;
  if constexpr (MODE == kFStep) sb0 = m0 / P, sp0 = int(m0 % P);
  if constexpr (MODE == kRStep) sb0 = n0 / P, sp0 = int(n0 % P);
  if constexpr (MODE == kDW) kb = c_lo * KC / P, kp = int(c_lo * KC % P);

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  tc::pipeline_ns(
      int(c_hi - c_lo), NS,
      [&](int s, int c) {
        Elem* st = smem + s * STAGE;
        const long k0 = (c_lo + c) * KC;
        const int kcnt = int(min(long(KC), a.depth - k0));
        if constexpr (MODE == kDW) {  // advance (kb, kp) to k0 (the first chunk's was set above)
          if (c > 0)
            for (kp += KC; kp >= P; kp -= P) ++kb;
        }
        // A(row m0 + mm, k0 + kk) and B(k0 + kk, column n0 + mm) (the table above)
        auto at_a = [&](int mm, int kk) -> long {
          long b;
          int p;
          if constexpr (MODE == kFStep) {
            split_bp(sb0, sp0, mm, P, b, p);
            return b * a.n + (k0 + kk) * P + p;
          } else if constexpr (MODE == kRStep) {
            return (m0 + mm) * a.f + k0 + kk;
          } else {
            split_bp(kb, kp, kk, P, b, p);
            return b * a.n + (m0 + mm) * P + p;
          }
        };
        auto at_b = [&](int mm, int kk) -> long {
          if constexpr (MODE == kRStep) return (n0 + mm) * a.f + k0 + kk;
          else return (k0 + kk) * a.f + n0 + mm;
        };
        if (a.aff_a) {  // the first element and the strides of A's chunk (the table above)
          const Elem* base;
          int ms, ks;
          if constexpr (MODE == kFStep) base = a.a + sb0 * a.n + k0 * P + sp0, ms = 1, ks = P;
          else if constexpr (MODE == kRStep) base = a.a + m0 * a.f + k0, ms = a.f, ks = 1;
          else base = a.a + kb * a.n + m0 * P + kp, ms = P, ks = 1;
          stage_affine<BM, TL::THREADS, AK>(st, base, ms, ks, mcnt, kcnt);
        } else {
          stage<BM, TL::THREADS, AK>(st, a.a, at_a, mcnt, kcnt, a.vec_a);
        }
        if (a.aff_b) {
          if constexpr (MODE == kRStep)
            stage_affine<BN, TL::THREADS, BK>(st + A_ELEMS, a.b + n0 * a.f + k0, a.f, 1, ncnt, kcnt);
          else
            stage_affine<BN, TL::THREADS, BK>(st + A_ELEMS, a.b + k0 * a.f + n0, 1, a.f, ncnt, kcnt);
        } else {
          stage<BN, TL::THREADS, BK>(st + A_ELEMS, a.b, at_b, ncnt, kcnt, a.vec_b);
        }
      },
      [&](int s, int) {
        const Elem* sa = smem + s * STAGE;
        const Elem* sb = sa + A_ELEMS;
#pragma unroll
        for (int ks = 0; ks < KC; ks += KS) {
          uint32_t af[MI][4], bf[NI / 2][4];
#pragma unroll
          for (int i = 0; i < MI; ++i) {
            if constexpr (AK) M::load_a_rows(af[i], sa, LDA, wm * MI * 16 + i * 16, ks, lane);
            else M::template load_a<true>(af[i], sa, LDA, wm * MI * 16 + i * 16, ks, lane);
          }
#pragma unroll
          for (int j = 0; j < NI / 2; ++j) {
            if constexpr (BK) M::load_b2_rows(bf[j], sb, LDB, wn * NI * 8 + j * 16, ks, lane);
            else M::load_b2(bf[j], sb, LDB, wn * NI * 8 + j * 16, ks, lane);
          }
#pragma unroll
          for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
              M::mma(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
        }
      });

  // The output tile leaves through shared memory (the stages are free: pipeline_ns ends on a barrier): the fragments
  // (c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1) of each 16 × 8 tile) go to Cs[row][column], then every
  // output is written along its columns in 16-byte runs. (Storing the fragments straight to global memory, 2- or
  // 4-byte stores each touching 8 rows, left the F- and R-steps at ~20% of the DRAM bandwidth.)
  using Out = OutOf<MODE>;
  constexpr int OVW = 16 / int(sizeof(Out)), LDC = BN + OVW;
  Out* Cs = reinterpret_cast<Out*>(smem_raw);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        Out* d = Cs + (wm * MI * 16 + i * 16 + h * 8 + g) * LDC + wn * NI * 8 + j * 8 + 2 * t;
        tc::store_pair(d, acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
      }
  __syncthreads();
  Out* c = static_cast<Out*>(a.c);
  for (int q = threadIdx.x; q < BM * BN / OVW; q += TL::THREADS) {
    const int rl = q / (BN / OVW), cl = (q % (BN / OVW)) * OVW;
    if (rl >= mcnt || cl >= ncnt) continue;
    const long r = m0 + rl;
    // the run's first element: F-step F_{k-1}[b][p][j] = (r, col); R-step dF_k[b][i = r][p] with (b, p) = col;
    // dW partial z, (r, col)
    long at;
    if constexpr (MODE == kRStep) {
      long b;
      int p;
      split_bp(sb0, sp0, cl, P, b, p);
      at = b * a.n + r * P + p;
    } else if constexpr (MODE == kDW) {
      at = long(z) * a.f * a.f + r * a.f + n0 + cl;
    } else {
      at = r * a.f + n0 + cl;
    }
    const Out* src = Cs + rl * LDC + cl;
    if (a.vec_c) {  // a run stays in one row (and sample) and is 16-byte aligned
      *reinterpret_cast<uint4*>(c + at) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < OVW && cl + e < ncnt; ++e) {
        long ae = at + e;
        if constexpr (MODE == kRStep) {  // the next column may be the next sample's
          long b;
          int p;
          split_bp(sb0, sp0, cl + e, P, b, p);
          ae = b * a.n + r * P + p;
        }
        c[ae] = src[e];
      }
    }
  }
}

struct ReduceArgs {
  const float* part[kMaxFactors];
  Elem* out[kMaxFactors];
  int ff[kMaxFactors];  // f_k²
  int splits[kMaxFactors];
};
// dW_k[e] = Σ_z part_k[z][e] (fp32), rounded once to the dtype. grid (cdiv(max f_k², 128), K), 256 threads: lane l of
// warp w sums the 4 elements e0 + 4l … over the splits z ≡ w (mod 8) (float4 loads where f_k² is a multiple of 4),
// then the 8 warps' sums are added in warp order: a fixed order, so the result does not depend on scheduling. (One
// thread per element, walking all 264 splits of a 128 × 128 factor in turn, read at 46% of the DRAM bandwidth.)
__global__ void __launch_bounds__(256) reduce_kernel(const __grid_constant__ ReduceArgs a) {
  wait_then_release_next();
  const int k = blockIdx.y, ff = a.ff[k], splits = a.splits[k];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int e0 = blockIdx.x * 128 + lane * 4;
  if (int(blockIdx.x) * 128 >= ff) return;  // the whole block: this factor is smaller
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  const bool vec = ff % 4 == 0;
  for (int z = w; z < splits; z += 8) {
    const float* p = a.part[k] + long(z) * ff + e0;
    if (vec && e0 < ff) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      s[0] += v.x, s[1] += v.y, s[2] += v.z, s[3] += v.w;
    } else if (!vec) {
      for (int j = 0; j < 4; ++j)
        if (e0 + j < ff) s[j] += p[j];
    }
  }
  __shared__ float red[8][32][4];
  for (int j = 0; j < 4; ++j) red[w][lane][j] = s[j];
  __syncthreads();
  if (w != 0) return;
  for (int j = 0; j < 4 && e0 + j < ff; ++j) {
    float t = red[0][lane][j];
    for (int i = 1; i < 8; ++i) t += red[i][lane][j];
    tc::store_one(&a.out[k][e0 + j], t);
  }
}

// ---- planning: which tile and how many dW splits (the same answer for the workspace and the launch) --------------
struct StepPlan {
  bool big;
  int tiles_n, tiles, splits;
};
template <class TL> long tiles_of(long rows, long cols) {
  return ((rows + TL::BM - 1) / TL::BM) * ((cols + TL::BN - 1) / TL::BN);
}
// F- and R-steps: the 128 × 128 tile where both sides are over 64 and it fills every SM
inline StepPlan plan_step(long rows, long cols, int sms) {
  const bool big = rows > 64 && cols > 64 && tiles_of<Big>(rows, cols) >= sms;
  const int bn = big ? Big::BN : Small::BN;
  return {big, int((cols + bn - 1) / bn), int(big ? tiles_of<Big>(rows, cols) : tiles_of<Small>(rows, cols)), 1};
}
// dW: split the contraction so that tiles × splits blocks fill two waves, each split at least 4 chunks deep
inline StepPlan plan_dw(long depth, int f, int sms) {
  const long chunks = (depth + KC - 1) / KC;
  auto splits_for = [&](long tiles) {
    long s = (2L * sms + tiles - 1) / tiles;
    s = std::min(s, std::max(1L, chunks / 4));
    return int(std::max(1L, std::min(s, 1024L)));
  };
  const long tb = tiles_of<Big>(f, f), ts = tiles_of<Small>(f, f);
  const bool big = f > 64 && tb * splits_for(tb) >= sms;
  const long tiles = big ? tb : ts;
  return {big, cdiv(f, big ? Big::BN : Small::BN), int(tiles), splits_for(tiles)};
}

// A launch with programmatic stream serialization where the GPU has it (sm_90+: the kernels wait at
// wait_then_release_next; stream capture records it as a programmatic edge of the graph), a plain one before.
template <class Args>
cudaError_t launch_pdl(void (*kernel)(Args), dim3 grid, int threads, int smem, cudaStream_t s, const Args& args,
                       bool pdl) {
  cudaLaunchAttribute attr[1] = {lab::pdl_attribute()};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && lab::has_pdl() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args);
}

template <int MODE, class TL> cudaError_t launch_step(const StepArgs& a, cudaStream_t s, bool pdl) {
  constexpr int smem = smem_bytes<MODE, TL>();
  static bool opted[64] = {};  // the opt-in above 48 KB, once per instantiation and device
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || !opted[dev]) {
    cudaError_t e = cudaFuncSetAttribute(step_kernel<MODE, TL>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64) opted[dev] = true;
  }
  return launch_pdl(step_kernel<MODE, TL>, dim3(unsigned(long(a.tiles) * a.splits)), TL::THREADS, smem, s, a, pdl);
}
template <int MODE> cudaError_t launch(StepArgs a, const StepPlan& p, cudaStream_t s, bool pdl) {
  a.tiles_n = p.tiles_n;
  a.tiles = p.tiles;
  a.splits = p.splits;
  return p.big ? launch_step<MODE, Big>(a, s, pdl) : launch_step<MODE, Small>(a, s, pdl);
}
// Whether a call's launches go out with programmatic dependent launch: where every step's grid is 128 × 128 tiles
// (one block an SM) or at most two blocks an SM. Where a grid of 64 × 64 tiles has ~4 blocks an SM (the F- and
// R-steps at batch 128, 128 × 128 factors: 512 blocks), the next grid's blocks, placed while this one's still run,
// pile onto the SMs that freed first: with PDL on every launch, batch 128 measured 50.3 -> 52.0 (bf16) and 96.4 -> 98.1
// us (TF32) on the H100 (graph, backward alone), while every other batch gained (the header's design 6).
inline bool pdl_helps(const StepPlan& p, int sms) { return p.big || long(p.tiles) * p.splits <= 2L * sms; }

inline bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// stage_affine's offsets, mm·ms + kk·ks with mm < 128, kk < KC and strides up to max(P, f), fit 32 bits
inline bool small32(long P, long f) { return std::max(P, f) * (kTile + 32) < (1L << 31); }
inline long pad256(long bytes) { return (bytes + 255) / 256 * 256; }

// Workspace bytes: the recomputed states F_1 … F_{K-1}, the dF ping-pong (at most 2), the dW partials.
int64_t workspace_bytes(int64_t B, int64_t N, const int* f, int K) {
  const int sms = device_facts().sms;
  const long state = pad256(B * N * long(sizeof(Elem)));
  long n = long(K - 1) * state + long(std::min(K - 1, 2)) * state;
  for (int k = 0; k < K; ++k) n += pad256(long(plan_dw(B * (N / f[k]), f[k], sms).splits) * f[k] * f[k] * 4);
  return n;
}

cudaError_t backward(const Elem* g, const Elem* x, const Elem* const* w, const int* f, int K, int64_t B, int64_t N,
                     Elem* dx, Elem* const* dw, void* ws, cudaStream_t s) {
  const int sms = device_facts().sms;
  char* p = static_cast<char*>(ws);
  const long state = pad256(B * N * long(sizeof(Elem)));
  Elem* F[kMaxFactors + 1] = {};  // F[k] = the state before W_k is applied (1-based): F[K] = x
  for (int k = 1; k < K; ++k, p += state) F[k] = reinterpret_cast<Elem*>(p);
  F[K] = const_cast<Elem*>(x);
  Elem* dF[2] = {reinterpret_cast<Elem*>(p), reinterpret_cast<Elem*>(p + (K >= 3 ? state : 0))};
  p += long(std::min(K - 1, 2)) * state;

  bool pdl = true;  // pdl_helps for every step of this call
  for (int k = 1; k <= K && B > 0; ++k) {
    const long P = N / f[k - 1];
    pdl = pdl && pdl_helps(plan_dw(B * P, f[k - 1], sms), sms) && pdl_helps(plan_step(f[k - 1], B * P, sms), sms) &&
          (k == 1 || pdl_helps(plan_step(B * P, f[k - 1], sms), sms));
  }
  auto args = [&](const Elem* A, const Elem* Bop, void* C, int fk, bool vec_a, bool vec_b) {
    StepArgs a{};
    a.a = A, a.b = Bop, a.c = C, a.n = N, a.f = fk, a.p = int(N / fk), a.vec_a = vec_a, a.vec_b = vec_b;
    return a;
  };
  if (B > 0) {
    for (int k = K; k >= 2; --k) {  // F_{k-1} = F_kᵀ · W_k
      const int fk = f[k - 1];
      StepArgs a = args(F[k], w[k - 1], F[k - 1], fk, (N / fk) % VW == 0 && al16(F[k]), fk % VW == 0 && al16(w[k - 1]));
      a.rows = B * (N / fk), a.cols = fk, a.depth = fk, a.vec_c = fk % VW == 0 && al16(F[k - 1]);
      const StepPlan pl = plan_step(a.rows, fk, sms);
      a.aff_a = a.vec_a && (N / fk) % (pl.big ? Big::BM : Small::BM) == 0 && small32(N / fk, fk);  // a tile in a sample
      a.aff_b = a.vec_b && small32(N / fk, fk);
      cudaError_t e = launch<kFStep>(a, pl, s, pdl);
      if (e != cudaSuccess) return e;
    }
  }
  ReduceArgs ra{};
  int max_ff = 1;
  const Elem* D = g;
  for (int k = 1; k <= K; ++k) {
    const int fk = f[k - 1];
    const long P = N / fk;
    const StepPlan pd = plan_dw(B * P, fk, sms);
    ra.part[k - 1] = reinterpret_cast<const float*>(p);
    ra.out[k - 1] = dw[k - 1];
    ra.ff[k - 1] = fk * fk;
    ra.splits[k - 1] = B > 0 ? pd.splits : 0;
    max_ff = std::max(max_ff, fk * fk);
    if (B > 0) {
      StepArgs a = args(F[k], D, p, fk, P % VW == 0 && al16(F[k]), fk % VW == 0 && al16(D));
      a.rows = fk, a.cols = fk, a.depth = B * P, a.vec_c = fk % 4 == 0;  // partials: float runs, 256-byte aligned
      a.aff_a = a.vec_a && P % KC == 0 && small32(P, fk);  // a chunk in a sample
      a.aff_b = a.vec_b && small32(P, fk);
      cudaError_t e = launch<kDW>(a, pd, s, pdl);
      if (e != cudaSuccess) return e;
      Elem* out = k == K ? dx : dF[(k - 1) & 1];
      StepArgs r = args(w[k - 1], D, out, fk, fk % VW == 0 && al16(w[k - 1]), fk % VW == 0 && al16(D));
      r.rows = fk, r.cols = B * P, r.depth = fk, r.vec_c = P % VW == 0 && al16(out);
      r.aff_a = r.vec_a && small32(P, fk);
      r.aff_b = r.vec_b && small32(P, fk);
      e = launch<kRStep>(r, plan_step(r.rows, r.cols, sms), s, pdl);
      if (e != cudaSuccess) return e;
      D = out;
    }
    p += pad256(long(pd.splits) * fk * fk * 4);
  }
  dim3 grid(unsigned(cdiv(max_ff, 128)), unsigned(K));
  return launch_pdl(reduce_kernel, grid, 256, 0, s, ra, pdl && B > 0);
}

}  // namespace tcb
}  // namespace kron

// ---- what the binding calls ("kron_tc_backward@f32", "kron_tc_backward@bf16", ...) ---------------------------------
//   kron_tc_backward: cudaError_t (const T* g, const T* x, const T* const* w, const int* f, int K, int64_t B,
//                                  int64_t N, T* dx, T* const* dw, void* ws, cudaStream_t)   (T: float (TF32), bf16)
//   kron_tc_backward_workspace: int64_t (int64_t B, int64_t N, const int* f, int K), in bytes
LAB_EXPORTS(LAB_EXPORT("kron_tc_backward", kron::tcb::backward),
            LAB_EXPORT("kron_tc_backward_workspace", kron::tcb::workspace_bytes))
