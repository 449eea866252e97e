// kron.cu — the Kronecker-factored linear layer  y = x · (W_K ⊗ … ⊗ W_1),  one factor at a time.
//
// Shapes: x (B, N), N = f_1·…·f_K; W_k (f_k, f_k); factors[0] = W_1 acts on the fastest axis of x. A sample read as
// (f_K, …, f_1), row-major, gives
//     y[j_K…j_1] = Σ_{i_K…i_1} x[i_K…i_1] · W_K[i_K, j_K] ⋯ W_1[i_1, j_1],
// so every factor is a matrix product along its own axis and the N×N matrix is never built.
// Reference: lab/kernels/kron.py (kron_ref, an einsum; the tests also check it against torch.kron).
//
// One step ("F-step"): contract the slowest axis, the new axis goes last. A sample's state S read as (f, P), P = N/f,
// becomes C = Sᵀ·W, (P, f) row-major — and that flat array, read as (f', N/f'), is the state for the next factor.
// Applying W_K, W_{K-1}, …, W_1 in that order cycles the axes back to (j_K, …, j_1): no transposes, every step is a
// plain GEMM whose A operand is "k-major" (consecutive p contiguous), the layout a SIMT GEMM wants in shared memory.
//
// Backward (F_k = the state before W_k is applied, F_K = x, F_{k-1} = F_kᵀ·W_k, dF_0 = dy):
//     dW_k = Σ_b F_k[b] · dF_{k-1}[b]        (f_k, P_k)·(P_k, f_k), reduced over the batch     ("dW")
//     dF_k = W_k · dF_{k-1}[b]ᵀ              (f_k, f_k)·(f_k, P_k): contracts the fastest axis ("R-step")
//     dx   = dF_K
//
// Versions (cpu, v1 and v2 live in cpp_src/kron.cpp and lab/kernels/kron.py):
//   v3: one tiled kernel per factor — a 2-stage cp.async pipeline stages 16-deep k-slices of both operands in shared
//       memory, each thread keeps a TM×TN register tile (8×8 at 128×128 block tiles; 4×4 for small grids); backward:
//       an R-step kernel and a batch-reduced dW kernel (deterministic split-K partials + one reduce launch).
//   v4: one fused kernel for all factors — a block owns one sample, or c of the f_K output columns of one (the first
//       factor's output columns never mix again), and keeps its state in shared memory from the first factor to the
//       last; only x is read and y written. Limit: (N/f_K)·c·sizeof(T) per state buffer (two buffers for K ≥ 3, one
//       for K = 2) plus ~34 KB of staging must fit the 227 KB a block may have: N/f_K ≲ 48k floats (K = 2), ≲ 24k
//       (K ≥ 3) at c = 4. Above it, and for K = 1, v4 runs v3. Backward: v3's kernels on the states v4 saved.
//
// Napkin math (H100, fp32, factors 128×128, N = 16384): FLOP = 2·B·N·Σf_k = 8.4 MFLOP per sample; bytes = 2·N·4 =
// 128 KB per sample (read x, write y): 64 FLOP/byte, compute-bound. B = 32: 268 MFLOP — 4.1 us at the 64.8 TFLOP/s
// FP32 FMA rate the lab measured on the H100 — and 4 MB of HBM traffic (~1.4 us at 3 TB/s). B = 1024: 8.6 GFLOP,
// 133 us at that rate (the issue's 5 us / 168 us assumed ~51 TFLOP/s).
// Small batches are latency- and balance-bound: 32 samples are only 32 blocks, so v4 splits each sample into
// f_K/c column slices, and every slice re-reads its sample's x (64 KB) and W_1 (64 KB) from L2. The launcher picks
// the configuration and c with a small cost model (plan_fused); kron.tune() times the alternatives. At batch 32 it
// picks cfg 1 (256 threads, 4×4 tiles), c = 32: 4 slices per sample, 128 blocks, 50.7 KB shared each, 2 per SM.
//
// Measured (H100 80GB HBM3, 132 SMs, torch 2.11; fp32, factors 128×128; CUDA events, L2 flushed before each run;
// the lab's FP32 FMA probe gives 64.8 TFLOP/s, so the FLOP floor is 4.1 us at batch 32 and 133 us at batch 1024):
//   forward (us)        batch   1     32    128   1024   4096
//     v1 (PyTorch)             95    115    109    369   1406
//     v2 (PyTorch)            127     73     77    243    916   (replayed as a CUDA graph: 17, 20, 39, 242, 915)
//     v3                       24     25     56    238    899
//     v4                       21     20     49    268   1028
//     full (N×N matrix)      1148   1264   2101  11290  43200
//   forward + backward (us, eager / CUDA graph): batch 32: v2 546 / 73, v3 338 / 79, v4 447 / 83;
//                                                batch 1024: v2 953 / 945, v3 828 / 820, v4 946 / 938.
// Against the issue's goals: forward at batch 32 is 20 us (goal 10); forward + backward is 1.2-1.6× faster than v2
// eager at batch 32 and 1.15× at 1024 (goal 5×); forward at batch 1024 reaches 36 TFLOP/s = 56% of the FMA rate with
// v3 and 50% with v4 (goal 70%). What bounds them, read from these numbers and the SASS (not yet profiled with Nsight
// Compute):
//  - small batches are latency-bound, not FLOP-bound: batch 1 takes as long as batch 32 (~20 us for 0.3 GFLOP), and
//    cuBLAS, replayed from a graph without launch overhead, lands at the same 17-20 us. A block walks f/16 = 8 k-chunks
//    per factor through a 2-stage pipeline, so most chunks wait on their own load (x comes from HBM after the flush):
//    ~16 dependent round trips per block. Next: stage a slice's whole x tile at once (many loads in flight), KC = 32.
//  - large batches: 8×8 register tiles reach 50-56% of the FMA rate, level with cuBLAS's FP32 GEMM (v2, 243 us). The
//    fused kernel is slower than v3 there: its 8×8 variant sits at the 128-register cap that 2 blocks per SM need
//    (a few spills, 4 of them inside the FMA loop) and each block runs its two GEMMs back to back behind barriers.
//    The rest needs what a tuned SGEMM does (deeper pipeline, warp-specialised loads), or TF32 tensor cores (another
//    precision).
//  - forward + backward eager is CPU-bound (v2: 546 us eager, 73 us as a graph); as a graph, the backward's 5 launches
//    (dW and R-step per factor, then the reduce) cost about what cuBLAS's do.
#include "lab_cuda.cuh"

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace kron {

constexpr int kMaxFactors = 16;
constexpr int kTile = 128;  // largest block tile side: bp, bq <= kTile

template <class T> struct Vec;  // the 16-byte vector of T
template <> struct Vec<float> { using type = float4; static constexpr int n = 4; };
template <> struct Vec<double> { using type = double2; static constexpr int n = 2; };

// k-depth of one pipeline stage: 64 bytes of k per row (16 floats, 8 doubles)
template <class T> __host__ __device__ constexpr int chunk_k() { return 64 / int(sizeof(T)); }

__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ void unpack(const float4& v, float* d) { d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w; }
__device__ __forceinline__ void unpack(const double2& v, double* d) { d[0] = v.x; d[1] = v.y; }
template <class V, class T> __device__ __forceinline__ V pack(const T* s);
template <> __device__ __forceinline__ float4 pack<float4, float>(const float* s) { return make_float4(s[0], s[1], s[2], s[3]); }
template <> __device__ __forceinline__ double2 pack<double2, double>(const double* s) { return make_double2(s[0], s[1]); }

// ---- cp.async: global -> shared without a register round trip; src_bytes = 0 writes zeros (edges) ----------------
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0) : "memory");
}
// 16 bytes through L1: for the small factors every block of an SM re-reads
__device__ __forceinline__ void cp_async16_l1(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0) : "memory");
}
template <class T> __device__ __forceinline__ void cp_async_elem(T* dst, const T* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
               "n"(int(sizeof(T))), "r"(valid ? int(sizeof(T)) : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- thread-block configurations ------------------------------------------------------------------------------
// cfg 0: 256 threads × 8×8 outputs: 128×128 tiles, 16 FMAs per 16-byte shared load — the large-batch path.
// cfg 1: 256 threads × 4×4: 4096-output tiles (128×32 … 32×128) — 4× the blocks of cfg 0 for mid-size grids.
// cfg 2: 128 threads × 4×4: 2048-output tiles — small batches, thin slices, small factors.
// double: 64 double accumulators do not fit beside the rest in 128 registers (8×8 spilled ~1 KB), so cfg 0 is
// cfg 1 there (the same kernel, compiled once).
template <int THREADS_, int TM_, int TN_, int MINB_> struct Cfg {
  static constexpr int THREADS = THREADS_, TM = TM_, TN = TN_, MINB = MINB_;
};
template <class T, int I> struct CfgOf;
template <class T> struct CfgOf<T, 0> { using type = Cfg<256, 8, 8, 2>; };
template <> struct CfgOf<double, 0> { using type = Cfg<256, 4, 4, 2>; };
template <class T> struct CfgOf<T, 1> { using type = Cfg<256, 4, 4, 2>; };
template <class T> struct CfgOf<T, 2> { using type = Cfg<128, 4, 4, 4>; };
constexpr int kConfigs = 3;
struct CfgShape { int threads, tm, tn; };
template <class T> constexpr CfgShape cfg_shape(int cfg) {
  return cfg == 0 ? CfgShape{CfgOf<T, 0>::type::THREADS, CfgOf<T, 0>::type::TM, CfgOf<T, 0>::type::TN}
                  : cfg == 1 ? CfgShape{256, 4, 4} : CfgShape{128, 4, 4};
}

// Block tile for an output with q columns: tnt × tmt threads (powers of two), bp = tmt·TM rows, bq = tnt·TN columns,
// both ≤ kTile; as few columns as cover q, the rest of the threads stacked on rows.
struct Layout { int tmt, tnt, bp, bq; };
__host__ __device__ inline Layout make_layout(int threads, int tm, int tn, int q) {
  if (threads * tm * tn == kTile * kTile) return Layout{kTile / tm, kTile / tn, kTile, kTile};  // 8×8: always 128²
  int lo = threads * tm / kTile;
  if (lo < 1) lo = 1;
  int hi = kTile / tn;
  if (hi > threads) hi = threads;
  int t = 1;
  while (t * tn < q && t < hi) t <<= 1;
  if (t < lo) t = lo;
  return Layout{threads / t, t, (threads / t) * tm, t * tn};
}

// A thread's register tile: element (i, j) is row (i/VW·tmt + tm)·VW + i%VW, column (j/VW·tnt + tn)·VW + j%VW of the
// block tile, so the 16-byte fragment loads of a warp land on consecutive addresses (no bank conflicts).
template <class T> __device__ __forceinline__ int frag_row(int i, int tmt, int tm) {
  constexpr int VW = Vec<T>::n;
  return (i / VW * tmt + tm) * VW + i % VW;
}

// ---- staging: one KC-deep slice of an operand into shared memory, dst[kk·ld + p] = A(k0 + kk, p0 + p) ----------------
// P-contiguous operand: element (k, p) at base + off(p) + k·kstride and VW consecutive p are contiguous (when `vec`).
// The vec path copies 16-byte vectors; each thread always copies the same vector column, so off() is evaluated once.
template <class T, int THREADS, int KC, bool L1 = false, class I = long>  // I: offsets (int within one sample)
struct PStager {
  static constexpr int VW = Vec<T>::n;
  I p0, pd, kstride;
  int bp;
  bool vec;
  int pv, kk0, kstep;
  I my_off;
  bool okp;
  template <class Off>
  __device__ __forceinline__ PStager(I p0_, I pd_, int bp_, I kstride_, bool vec_, Off off)
      : p0(p0_), pd(pd_), kstride(kstride_), bp(bp_), vec(vec_), pv(0), kk0(0), kstep(1), my_off(0), okp(false) {
    if (vec) {
      const int nv = bp / VW;  // a power of two <= THREADS
      pv = threadIdx.x % nv;
      kk0 = threadIdx.x / nv;
      kstep = THREADS / nv;
      const I p = p0 + I(pv) * VW;
      okp = p < pd;
      my_off = okp ? I(off(p)) : I(0);
    }
  }
  template <class Off>
  __device__ __forceinline__ void issue(T* dst, int ld, const T* base, int k0, int kd, Off off) const {
    if (vec) {
      for (int kk = kk0; kk < KC; kk += kstep) {
        const int k = k0 + kk;
        const bool ok = okp && k < kd;
        const T* src = ok ? base + (my_off + I(k) * kstride) : base;
        if (L1)
          cp_async16_l1(dst + kk * ld + pv * VW, src, ok);
        else
          cp_async16(dst + kk * ld + pv * VW, src, ok);
      }
    } else {  // odd sizes or misaligned: element by element
      for (int i = threadIdx.x; i < KC * bp; i += THREADS) {
        const int kk = i / bp, pp = i - kk * bp;
        const int k = k0 + kk;
        const I p = p0 + pp;
        const bool ok = k < kd && p < pd;
        cp_async_elem(dst + kk * ld + pp, ok ? base + (I(off(p)) + I(k) * kstride) : base, ok);
      }
    }
  }
};

// K-contiguous operand: element (k, p) at base + off(p) + k. Element copies, transposed on the way into shared
// memory; consecutive threads take consecutive k of one row, so the global reads coalesce.
template <class T, int THREADS, int KC, class Off>
__device__ __forceinline__ void stage_kcontig(T* dst, int ld, const T* base, Off off, int k0, int kd, long p0,
                                              long pd, int bp) {
  const int kk = threadIdx.x % KC;
  const int k = k0 + kk;
  for (int pp = threadIdx.x / KC; pp < bp; pp += THREADS / KC) {
    const long p = p0 + pp;
    const bool ok = p < pd && k < kd;
    cp_async_elem(dst + kk * ld + pp, ok ? base + off(p) + k : base, ok);
  }
}

// ---- the 2-stage pipeline: stage chunk c+1 while computing chunk c ------------------------------------------------
template <class Issue, class Compute>
__device__ __forceinline__ void pipeline(int nchunks, Issue&& issue, Compute&& compute) {
  if (nchunks <= 0) return;
  issue(0, 0);
  cp_async_commit();
  for (int c = 0; c < nchunks; ++c) {
    if (c + 1 < nchunks) issue((c + 1) & 1, c + 1);
    cp_async_commit();   // possibly empty: keeps the group count uniform
    cp_async_wait<1>();  // everything but the newest group has landed: chunk c is in shared memory
    __syncthreads();
    compute(c & 1, c);
    __syncthreads();  // all reads of stage c&1 done before chunk c+2 overwrites it
  }
}

// 16-byte shared-memory access the compiler may not split: with a run-time leading dimension it cannot prove the
// alignment by itself and otherwise emits 4- and 8-byte loads (seen in the fused kernel's PTX).
template <class V, class T> __device__ __forceinline__ V ld16(const T* p) {
  return *static_cast<const V*>(__builtin_assume_aligned(p, 16));
}
template <class V, class T> __device__ __forceinline__ void st16(T* p, const V& v) {
  *static_cast<V*>(__builtin_assume_aligned(p, 16)) = v;
}
// ...and for shared-memory stores even the assumption is split into 4-byte stores: say it in PTX
__device__ __forceinline__ void sts16(float* p, const float4& v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(p)), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w) : "memory");
}
__device__ __forceinline__ void sts16(double* p, const double2& v) {
  asm volatile("st.shared.v2.f64 [%0], {%1, %2};\n" ::"r"(smem_addr(p)), "d"(v.x), "d"(v.y) : "memory");
}

// acc += A(k, rows)ᵀ-outer-B(k, cols) over kc rows of k. As/Bs are k-major with leading dims lda/ldb (multiples of VW,
// 16-byte aligned). Per k: TM/VW + TN/VW 16-byte loads feed TM·TN FMAs.
template <class T, int TM, int TN, int KC>
__device__ __forceinline__ void mma_chunk(const T* __restrict__ As, int lda, const T* __restrict__ Bs, int ldb,
                                          int kc, int a_lane, int a_step, int b_lane, int b_step, T (&acc)[TM][TN]) {
  using V = typename Vec<T>::type;
  constexpr int VW = Vec<T>::n;
  auto step = [&](int kk) {
    T a[TM], b[TN];
#pragma unroll
    for (int v = 0; v < TM / VW; ++v) unpack(ld16<V>(As + kk * lda + a_lane + v * a_step), a + v * VW);
#pragma unroll
    for (int v = 0; v < TN / VW; ++v) unpack(ld16<V>(Bs + kk * ldb + b_lane + v * b_step), b + v * VW);
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
  };
  if (kc == KC) {
#pragma unroll
    for (int kk = 0; kk < KC; ++kk) step(kk);
  } else {
    for (int kk = 0; kk < kc; ++kk) step(kk);
  }
}

template <class T, int TM, int TN> __device__ __forceinline__ void zero(T (&acc)[TM][TN]) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
}

// Row-major store of a register tile: dst[r·ld + q] for r < rows, q < cols. vec: cols and ld are multiples of VW and
// dst is 16-byte aligned.
template <bool SHARED = false, class T, int TM, int TN>
__device__ __forceinline__ void store_rows(T* dst, long ld, long rows, int cols, long p0, int q0,
                                           const T (&acc)[TM][TN], const Layout& L, int tm, int tn, bool vec) {
  using V = typename Vec<T>::type;
  constexpr int VW = Vec<T>::n;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const long r = p0 + frag_row<T>(i, L.tmt, tm);
    if (r >= rows) continue;
    T* d = dst + r * ld;
    if (vec) {
#pragma unroll
      for (int v = 0; v < TN / VW; ++v) {
        const int q = q0 + (v * L.tnt + tn) * VW;
        if (q < cols) {
          if (SHARED)
            sts16(d + q, pack<V>(&acc[i][v * VW]));
          else
            st16<V>(d + q, pack<V>(&acc[i][v * VW]));
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int q = q0 + frag_row<T>(j, L.tnt, tn);
        if (q < cols) d[q] = acc[i][j];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// v3 forward: one F-step over the whole batch. Rows r = (b, p) flattened over B·P; y[r·f + j] = Σ_i x[b][i][p]·W[i][j]
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    fstep_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, long rows, int P, long N, int f,
                 int tiles_q, bool vec_x, bool vec_w, bool vec_y) {
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n, LD = kTile + VW;
  __shared__ __align__(16) T As[2][KC][LD];
  __shared__ __align__(16) T Bs[2][KC][LD];
  const Layout L = make_layout(THREADS, TM, TN, f);
  const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
  const long p0 = long(blockIdx.x / tiles_q) * L.bp;
  const int q0 = int(blockIdx.x % tiles_q) * L.bq;
  auto xoff = [P, N](long r) { return (r / P) * N + r % P; };  // (b, p) -> offset of x[b][0][p]
  auto woff = [](long q) { return q; };
  const PStager<T, THREADS, KC> sa(p0, rows, L.bp, P, vec_x, xoff);
  const PStager<T, THREADS, KC, true> sb(q0, f, L.bq, f, vec_w, woff);
  T acc[TM][TN];
  zero(acc);
  pipeline(
      cdiv(f, KC),
      [&](int s, int c) {
        sa.issue(&As[s][0][0], LD, x, c * KC, f, xoff);
        sb.issue(&Bs[s][0][0], LD, w, c * KC, f, woff);
      },
      [&](int s, int c) {
        mma_chunk<T, TM, TN, KC>(&As[s][0][0], LD, &Bs[s][0][0], LD, min(KC, f - c * KC), tm * VW, L.tmt * VW,
                                 tn * VW, L.tnt * VW, acc);
      });
  store_rows(y, f, rows, f, p0, q0, acc, L, tm, tn, vec_y);
}

// ---------------------------------------------------------------------------------------------------------------
// Backward R-step: out[b][i][m] = Σ_j W[i][j]·d[b][m][j]. Rows p = (b, m) flattened over B·M, columns i.
// Both operands are contiguous in the contracted index j, so both are transposed while staged.
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    rstep_kernel(const T* __restrict__ d, const T* __restrict__ w, T* __restrict__ out, long rows, int M, long N,
                 int f, int tiles_q, bool vec_out) {
  using V = typename Vec<T>::type;
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n, LD = kTile + VW;
  __shared__ __align__(16) T As[2][KC][LD];
  __shared__ __align__(16) T Bs[2][KC][LD];
  const Layout L = make_layout(THREADS, TM, TN, f);
  const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
  const long p0 = long(blockIdx.x / tiles_q) * L.bp;
  const int q0 = int(blockIdx.x % tiles_q) * L.bq;
  auto row = [f](long p) { return p * f; };
  T acc[TM][TN];
  zero(acc);
  pipeline(
      cdiv(f, KC),
      [&](int s, int c) {
        stage_kcontig<T, THREADS, KC>(&As[s][0][0], LD, d, row, c * KC, f, p0, rows, L.bp);
        stage_kcontig<T, THREADS, KC>(&Bs[s][0][0], LD, w, row, c * KC, f, long(q0), long(f), L.bq);
      },
      [&](int s, int c) {
        mma_chunk<T, TM, TN, KC>(&As[s][0][0], LD, &Bs[s][0][0], LD, min(KC, f - c * KC), tm * VW, L.tmt * VW,
                                 tn * VW, L.tnt * VW, acc);
      });
  // transposed store: a VW-run of rows p..p+VW-1 is VW consecutive m of one sample when vec_out (M % VW == 0)
#pragma unroll
  for (int v = 0; v < TM / VW; ++v) {
    const long pv = p0 + long(v * L.tmt + tm) * VW;
    if (vec_out) {
      if (pv >= rows) continue;
      const long b = pv / M, m = pv % M;
      T* o = out + b * N + m;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int q = q0 + frag_row<T>(j, L.tnt, tn);
        if (q >= f) continue;
        T tmp[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) tmp[e] = acc[v * VW + e][j];
        st16<V>(o + long(q) * M, pack<V>(tmp));
      }
    } else {
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const long p = pv + e;
        if (p >= rows) continue;
        const long b = p / M, m = p % M;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const int q = q0 + frag_row<T>(j, L.tnt, tn);
          if (q < f) out[b * N + long(q) * M + m] = acc[v * VW + e][j];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward dW, split-K over the batch: partial[z][i][j] = Σ_{(b, m) in split z} F[b][i][m]·D[b][m][j].
// The contraction runs over chunks (b, m0..m0+KC) that never straddle a sample; split z owns a contiguous range of
// them. The partials are summed in a fixed order by reduce_kernel: the result does not depend on scheduling.
// ---------------------------------------------------------------------------------------------------------------
template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    dw_kernel(const T* __restrict__ F, const T* __restrict__ D, T* __restrict__ part, int M, long N, int f,
              int tiles_q, int tiles, int splits, long total_chunks, bool vec_d, bool vec_part) {
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n, LD = kTile + VW;
  __shared__ __align__(16) T As[2][KC][LD];
  __shared__ __align__(16) T Bs[2][KC][LD];
  const Layout L = make_layout(THREADS, TM, TN, f);
  const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
  const int z = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const long p0 = long(tile / tiles_q) * L.bp;
  const int q0 = (tile % tiles_q) * L.bq;
  const int nkc = cdiv(M, KC);
  const long t0 = total_chunks * z / splits, t1 = total_chunks * (z + 1) / splits;
  auto frow = [M](long i) { return i * M; };
  auto doff = [](long q) { return q; };
  const PStager<T, THREADS, KC> sb(q0, f, L.bq, f, vec_d, doff);
  T acc[TM][TN];
  zero(acc);
  pipeline(
      int(t1 - t0),
      [&](int s, int c) {
        const long t = t0 + c;
        const long b = t / nkc;
        const int k0 = int(t % nkc) * KC;
        stage_kcontig<T, THREADS, KC>(&As[s][0][0], LD, F + b * N, frow, k0, M, p0, long(f), L.bp);
        sb.issue(&Bs[s][0][0], LD, D + b * N, k0, M, doff);
      },
      [&](int s, int c) {
        const int k0 = int((t0 + c) % nkc) * KC;
        mma_chunk<T, TM, TN, KC>(&As[s][0][0], LD, &Bs[s][0][0], LD, min(KC, M - k0), tm * VW, L.tmt * VW, tn * VW,
                                 L.tnt * VW, acc);
      });
  store_rows(part + long(z) * f * f, f, long(f), f, p0, q0, acc, L, tm, tn, vec_part);
}

template <class T> struct ReduceArgs {
  const T* part[kMaxFactors];
  T* out[kMaxFactors];
  int ff[kMaxFactors];      // f_k², elements of dW_k
  int splits[kMaxFactors];
  int K;
};

// dW_k[e] = Σ_z part_k[z][e], z in order. grid.y = factor.
template <class T>
__global__ void reduce_kernel(const __grid_constant__ ReduceArgs<T> a) {
  const int k = blockIdx.y;
  const int ff = a.ff[k], splits = a.splits[k];
  const T* part = a.part[k];
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < ff; e += gridDim.x * blockDim.x) {
    T s = T(0);
    for (int z = 0; z < splits; ++z) s += part[long(z) * ff + e];
    a.out[k][e] = s;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// v4: every factor in one kernel, the state in shared memory.
// Block (b, slice) computes y[b] rows j_K in [c0, c0 + c): step 1 stages x[b] (f_K × P1) through the pipeline and
// writes the state (P1, c) = x[b]ᵀ·W_K[:, c0:c0+c] to shared memory; steps 2..K read it in place (k-major, as the
// next factor wants it) and stage only the factor; the last step writes y. c is a multiple of 4, so every state row
// is 16-byte aligned. Optionally each intermediate state is also written to global memory (for the backward).
// ---------------------------------------------------------------------------------------------------------------
template <class T> struct FusedArgs {
  const T* x;
  T* y;
  const T* w[kMaxFactors];
  T* save[kMaxFactors];  // save[s]: the state after step s (F_{K-s}), or null
  int f[kMaxFactors];
  long N;
  int K, c, nslices, buf_elems, ldA, ldB;
  unsigned wvec;  // bit k: factor k can be staged in 16-byte vectors
  bool vec_x, vec_y;
};

template <class T, class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB) fused_kernel(const __grid_constant__ FusedArgs<T> a) {
  constexpr int THREADS = C::THREADS, TM = C::TM, TN = C::TN, KC = chunk_k<T>(), VW = Vec<T>::n;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* As = reinterpret_cast<T*>(smem_raw);  // [2][KC][ldA]: x chunks (step 1 only)
  T* Bs = As + 2 * KC * a.ldA;             // [2][KC][ldB]: factor chunks
  T* const buf0 = Bs + 2 * KC * a.ldB;     // state buffers (the second one only for K >= 3)
  T* const buf1 = buf0 + a.buf_elems;
  const int K = a.K;
  const long N = a.N;
  const long b = blockIdx.x / a.nslices;
  const int c0 = int(blockIdx.x % a.nslices) * a.c;
  const int fK = a.f[K - 1];
  const int ccols = min(a.c, fK - c0);  // columns of W_K this slice really has
  const int P1 = int(N / fK);
  const int S = P1 * a.c;  // state elements
  auto ident = [](int p) { return p; };

  // step 1: state (P1, c) = x[b]ᵀ · W_K[:, c0 : c0 + c]
  {
    const Layout L = make_layout(THREADS, TM, TN, a.c);
    const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
    const int tiles_q = cdiv(a.c, L.bq), tiles = cdiv(P1, L.bp) * tiles_q;
    const T* xb = a.x + b * N;
    const T* wK = a.w[K - 1] + c0;
    const bool vec_w = (a.wvec >> (K - 1)) & 1u;
    for (int t = 0; t < tiles; ++t) {
      const int p0 = (t / tiles_q) * L.bp, q0 = (t % tiles_q) * L.bq;
      const PStager<T, THREADS, KC, false, int> sa(p0, P1, L.bp, P1, a.vec_x, ident);
      const PStager<T, THREADS, KC, true, int> sb(q0, ccols, L.bq, fK, vec_w, ident);
      T acc[TM][TN];
      zero(acc);
      pipeline(
          cdiv(fK, KC),
          [&](int s, int c) {
            sa.issue(As + s * KC * a.ldA, a.ldA, xb, c * KC, fK, ident);
            sb.issue(Bs + s * KC * a.ldB, a.ldB, wK, c * KC, fK, ident);
          },
          [&](int s, int c) {
            mma_chunk<T, TM, TN, KC>(As + s * KC * a.ldA, a.ldA, Bs + s * KC * a.ldB, a.ldB, min(KC, fK - c * KC),
                                     tm * VW, L.tmt * VW, tn * VW, L.tnt * VW, acc);
          });
      store_rows<true>(buf0, a.c, long(P1), a.c, long(p0), q0, acc, L, tm, tn, true);
    }
    __syncthreads();
  }

  int cur = 0;
  long T_s = 1;  // product of the factors applied after W_K so far (the j-axes after j_K in the state)
  for (int s = 1; s <= K; ++s) {
    if (s > 1) {
      // step s applies W_{K-s+1} = w[K - s] to the state (f_s, P) in buf[cur]
      const int idx = K - s, fs = a.f[idx], P = S / fs;
      const T* src = cur ? buf1 : buf0;
      const T* ws = a.w[idx];
      const bool vec_w = (a.wvec >> idx) & 1u;
      const Layout L = make_layout(THREADS, TM, TN, fs);
      const int tm = threadIdx.x / L.tnt, tn = threadIdx.x % L.tnt;
      const int tiles_q = cdiv(fs, L.bq), tiles = cdiv(P, L.bp) * tiles_q;
      for (int t = 0; t < tiles; ++t) {
        const int p0 = (t / tiles_q) * L.bp, q0 = (t % tiles_q) * L.bq;
        const PStager<T, THREADS, KC, true, int> sb(q0, fs, L.bq, fs, vec_w, ident);
        T acc[TM][TN];
        zero(acc);
        pipeline(
            cdiv(fs, KC), [&](int st, int c) { sb.issue(Bs + st * KC * a.ldB, a.ldB, ws, c * KC, fs, ident); },
            [&](int st, int c) {
              // A in place: rows k of the state are P apart; rows past the state's end land in the slack
              mma_chunk<T, TM, TN, KC>(src + long(c) * KC * P + p0, P, Bs + st * KC * a.ldB, a.ldB,
                                       min(KC, fs - c * KC), tm * VW, L.tmt * VW, tn * VW, L.tnt * VW, acc);
            });
        if (s < K) {
          store_rows<true>(cur ? buf0 : buf1, fs, long(P), fs, long(p0), q0, acc, L, tm, tn, fs % VW == 0);
        } else {
          // last step: row p = (j_K local, j_{K-1}, …, j_2) -> y[b][(c0 + jl)·(N/f_K) + rest·f_1 + q]
          using V = typename Vec<T>::type;
          const long R1 = N / (long(fK) * fs);
#pragma unroll
          for (int i = 0; i < TM; ++i) {
            const int p = p0 + frag_row<T>(i, L.tmt, tm);
            if (p >= P) continue;
            const int jl = int(p / R1);
            if (jl >= ccols) continue;
            T* d = a.y + b * N + long(c0 + jl) * (N / fK) + (p - jl * R1) * fs;
            if (a.vec_y) {
#pragma unroll
              for (int v = 0; v < TN / VW; ++v) {
                const int q = q0 + (v * L.tnt + tn) * VW;
                if (q < fs) st16<V>(d + q, pack<V>(&acc[i][v * VW]));
              }
            } else {
#pragma unroll
              for (int j = 0; j < TN; ++j) {
                const int q = q0 + frag_row<T>(j, L.tnt, tn);
                if (q < fs) d[q] = acc[i][j];
              }
            }
          }
        }
      }
      __syncthreads();
      cur ^= 1;
      T_s *= fs;
    }
    // the state after step s (s < K) is F_{K-s}: (i-part, j_K, j-tail) in global memory, this slice's j_K only
    if (s < K && a.save[s] != nullptr) {
      T* dst = a.save[s] + b * N;
      const T* st = cur ? buf1 : buf0;
      const long ct = long(a.c) * T_s;
      for (int e = threadIdx.x; e < S; e += THREADS) {
        const long ip = e / ct, rem = e - ip * ct;
        const long jl = rem / T_s, tt = rem - jl * T_s;
        if (jl < ccols) dst[(ip * fK + c0 + jl) * T_s + tt] = st[e];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side: device facts, configuration choice, launches
// ---------------------------------------------------------------------------------------------------------------
struct DeviceFacts { int sms, smem_optin; };
inline DeviceFacts device_facts() {
  static DeviceFacts cache[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return {132, 227 * 1024};
  if (!cache[dev].sms) {
    int sms = 0, optin = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cache[dev] = {sms, optin};
  }
  return cache[dev];
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Per-SM cost of a grid of `tiles` equal tiles, in FMA slots; smaller 4×4 tiles pay for their extra shared loads.
template <class T> double grid_cost(long tiles, int cfg, int f, int sms) {
  const CfgShape c = cfg_shape<T>(cfg);
  const Layout L = make_layout(c.threads, c.tm, c.tn, f);
  const double eff = c.tm * c.tn == 64 ? 1.0 : (c.threads == 256 ? 0.75 : 0.7);
  return double((tiles + sms - 1) / sms) * L.bp * L.bq / eff;
}

// The smaller-tile configurations (1, 2) when the 128×128 tiles of cfg 0 would leave SMs idle.
template <class T> int pick_cfg(long rows, int f, int sms, bool allow_cfg1 = true) {
  int best = 0;
  double best_cost = 0;
  for (int cfg = 0; cfg < kConfigs; ++cfg) {
    if (cfg == 1 && !allow_cfg1) continue;
    const CfgShape cs = cfg_shape<T>(cfg);
    const Layout L = make_layout(cs.threads, cs.tm, cs.tn, f);
    const long tiles = (rows + L.bp - 1) / L.bp * cdiv(f, L.bq);
    const double c = grid_cost<T>(tiles, cfg, f, sms);
    if (cfg == 0 || c < best_cost) best = cfg, best_cost = c;
  }
  return best;
}

template <class T, class C>
cudaError_t launch_fstep(const T* x, const T* w, T* y, long B, long N, int f, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  const Layout L = make_layout(C::THREADS, C::TM, C::TN, f);
  const int P = int(N / f);
  const long rows = B * P;
  const int tiles_q = cdiv(f, L.bq);
  const long blocks = (rows + L.bp - 1) / L.bp * tiles_q;
  if (blocks > 0x7fffffffL) return cudaErrorInvalidConfiguration;
  const bool vec_x = P % VW == 0 && N % VW == 0 && aligned16(x);
  const bool vec_w = f % VW == 0 && aligned16(w);
  const bool vec_y = f % VW == 0 && aligned16(y);
  fstep_kernel<T, C><<<unsigned(blocks), C::THREADS, 0, s>>>(x, w, y, rows, P, N, f, tiles_q, vec_x, vec_w, vec_y);
  return cudaGetLastError();
}

template <class T>
cudaError_t fstep(const T* x, const T* w, T* y, long B, long N, int f, int cfg, cudaStream_t s) {
  if (cfg < 0) cfg = pick_cfg<T>(B * (N / f), f, device_facts().sms);
  switch (cfg) {
    case 0: return launch_fstep<T, typename CfgOf<T, 0>::type>(x, w, y, B, N, f, s);
    case 1: return launch_fstep<T, typename CfgOf<T, 1>::type>(x, w, y, B, N, f, s);
    default: return launch_fstep<T, typename CfgOf<T, 2>::type>(x, w, y, B, N, f, s);
  }
}

template <class T, class C>
cudaError_t launch_rstep(const T* d, const T* w, T* out, long B, long N, int f, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  const Layout L = make_layout(C::THREADS, C::TM, C::TN, f);
  const int M = int(N / f);
  const long rows = B * M;
  const int tiles_q = cdiv(f, L.bq);
  const long blocks = (rows + L.bp - 1) / L.bp * tiles_q;
  if (blocks > 0x7fffffffL) return cudaErrorInvalidConfiguration;
  const bool vec_out = M % VW == 0 && N % VW == 0 && aligned16(out);
  rstep_kernel<T, C><<<unsigned(blocks), C::THREADS, 0, s>>>(d, w, out, rows, M, N, f, tiles_q, vec_out);
  return cudaGetLastError();
}

template <class T>
cudaError_t rstep(const T* d, const T* w, T* out, long B, long N, int f, cudaStream_t s) {
  const int cfg = pick_cfg<T>(B * (N / f), f, device_facts().sms, false);
  return cfg == 0 ? launch_rstep<T, typename CfgOf<T, 0>::type>(d, w, out, B, N, f, s)
                  : launch_rstep<T, typename CfgOf<T, 2>::type>(d, w, out, B, N, f, s);
}

// dW split: enough (tile, split) blocks for two waves, each split at least 4 chunks long.
inline int dw_cfg(int f) { return f >= 96 ? 0 : 2; }
template <class T> inline int dw_splits(long B, long N, int f, int sms) {
  const CfgShape cs = cfg_shape<T>(dw_cfg(f));
  const Layout L = make_layout(cs.threads, cs.tm, cs.tn, f);
  const long tiles = long(cdiv(f, L.bp)) * cdiv(f, L.bq);
  const long total = B * cdiv(int(N / f), chunk_k<T>());
  long splits = (2L * sms + tiles - 1) / tiles;
  splits = std::min(splits, std::max(1L, total / 4));
  splits = std::min(splits, 1024L);
  return int(std::max(1L, splits));
}

template <class T, class C>
cudaError_t launch_dw(const T* F, const T* D, T* part, long B, long N, int f, int splits, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  const Layout L = make_layout(C::THREADS, C::TM, C::TN, f);
  const int M = int(N / f);
  const int tiles_q = cdiv(f, L.bq), tiles = cdiv(f, L.bp) * tiles_q;
  const long total = B * cdiv(M, chunk_k<T>());
  const bool vec_d = f % VW == 0 && N % VW == 0 && aligned16(D);
  const bool vec_part = f % VW == 0 && aligned16(part);
  dw_kernel<T, C><<<unsigned(long(tiles) * splits), C::THREADS, 0, s>>>(F, D, part, M, N, f, tiles_q, tiles, splits,
                                                                         total, vec_d, vec_part);
  return cudaGetLastError();
}

// ---- v4 planning: which configuration and slice width c --------------------------------------------------------
struct FusedPlan {
  bool ok = false;
  int cfg = -1, c = 0, nslices = 0, buf_elems = 0, nbuf = 0, ldA = 0, ldB = 0, blocks_per_sm = 0;
  long smem = 0;
  double cost = 0;
};

template <class T> using FusedFn = void (*)(FusedArgs<T>);
template <class T> FusedFn<T> fused_fn(int cfg) {
  switch (cfg) {
    case 0: return fused_kernel<T, typename CfgOf<T, 0>::type>;
    case 1: return fused_kernel<T, typename CfgOf<T, 1>::type>;
    default: return fused_kernel<T, typename CfgOf<T, 2>::type>;
  }
}

// Opt every fused kernel into the device's full shared memory once (per device, per dtype).
template <class T> void fused_optin() {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || done[dev]) return;
  const int optin = device_facts().smem_optin;
  for (int cfg = 0; cfg < kConfigs; ++cfg)
    cudaFuncSetAttribute(fused_fn<T>(cfg), cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  done[dev] = true;
}

// Shared memory and tiling of one (cfg, c) choice; ok = false when it does not fit.
template <class T> FusedPlan fused_layout(long N, const int* f, int K, int cfg, int c) {
  constexpr int KC = chunk_k<T>(), VW = Vec<T>::n;
  FusedPlan p;
  p.cfg = cfg;
  p.c = c;
  const CfgShape cs = cfg_shape<T>(cfg);
  const int th = cs.threads, tm = cs.tm, tn = cs.tn;
  const int fK = f[K - 1];
  const long S = (N / fK) * c;
  if (S > (1L << 28)) return p;
  const Layout L1 = make_layout(th, tm, tn, c);
  int bq = L1.bq;
  for (int s = 2; s <= K; ++s) bq = std::max(bq, make_layout(th, tm, tn, f[K - s]).bq);
  p.ldA = L1.bp + VW;
  p.ldB = bq + VW;
  p.nbuf = K >= 3 ? 2 : 1;
  p.buf_elems = int((S + kTile + 3) / 4 * 4);  // + slack: tile rows past the state's end are read, never stored
  p.nslices = cdiv(fK, c);
  p.smem = long(sizeof(T)) * (2L * KC * p.ldA + 2L * KC * p.ldB + long(p.nbuf) * p.buf_elems);
  p.ok = p.smem <= device_facts().smem_optin;
  return p;
}

// Estimated time (clock cycles) of a plan: the busiest SM's FMA slots (padding included, derated for small
// register tiles and few resident warps) against its share of L2 reads (each slice re-reads x[b] and the factors).
template <class T> double fused_cost(FusedPlan& p, long B, long N, const int* f, int K) {
  const DeviceFacts dev = device_facts();
  const CfgShape cs = cfg_shape<T>(p.cfg);
  const int th = cs.threads, tm = cs.tm, tn = cs.tn;
  const int fK = f[K - 1];
  const long P1 = N / fK;
  const long S = P1 * p.c;
  double work = 0;
  {
    const Layout L = make_layout(th, tm, tn, p.c);
    work += double(cdiv(int(P1), L.bp)) * cdiv(p.c, L.bq) * L.bp * L.bq * fK;
  }
  double wbytes = double(fK) * p.c;
  for (int s = 2; s <= K; ++s) {
    const int fs = f[K - s];
    const Layout L = make_layout(th, tm, tn, fs);
    work += double(cdiv(int(S / fs), L.bp)) * cdiv(fs, L.bq) * L.bp * L.bq * fs;
    wbytes += double(fs) * fs;
  }
  const long blocks = B * p.nslices;
  const long per_sm = (blocks + dev.sms - 1) / dev.sms;
  const long resident = std::min<long>(std::max(p.blocks_per_sm, 1), per_sm);
  const double warps = double(resident) * th / 32;
  const double eff = (tm * tn == 64 ? 1.0 : 0.75) * std::min(1.0, warps / 8.0);
  const double t_fma = double(per_sm) * work / (128.0 * eff);
  const double t_l2 = double(per_sm) * (double(N) + wbytes) * sizeof(T) / 24.0;  // ~24 B/clk/SM from L2
  return std::max(t_fma, t_l2);
}

template <class T> FusedPlan plan_fused(long B, long N, const int* f, int K, int force_cfg, int force_c) {
  static std::mutex mu;
  static std::map<std::vector<long>, FusedPlan> cache;
  int dev = 0;
  cudaGetDevice(&dev);
  std::vector<long> key = {dev, long(sizeof(T)), B, N, K, force_cfg, force_c};
  for (int k = 0; k < K; ++k) key.push_back(f[k]);
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  fused_optin<T>();
  FusedPlan best;
  if (K >= 2) {
    const int fK = f[K - 1];
    std::vector<int> cs;
    if (force_c > 0) {
      cs.push_back((force_c + 3) / 4 * 4);
    } else {
      for (int n = 1; n <= fK; n *= 2) {
        const int c = (cdiv(fK, n) + 3) / 4 * 4;
        if (cs.empty() || cs.back() != c) cs.push_back(c);
        if (c == 4) break;
      }
    }
    for (int cfg = 0; cfg < kConfigs; ++cfg) {
      if (force_cfg >= 0 && cfg != force_cfg) continue;
      for (int c : cs) {
        FusedPlan p = fused_layout<T>(N, f, K, cfg, c);
        if (!p.ok) continue;
        int bps = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, fused_fn<T>(cfg), cfg_shape<T>(cfg).threads,
                                                      size_t(p.smem));
        if (bps <= 0) continue;
        p.blocks_per_sm = bps;
        p.cost = fused_cost<T>(p, B, N, f, K);
        if (!best.ok || p.cost < best.cost * 0.999) best = p;
      }
    }
  }
  std::lock_guard<std::mutex> g(mu);
  cache[key] = best;
  return best;
}

template <class T>
cudaError_t fused(const T* x, T* y, const T* const* w, const int* f, int K, long B, long N, T* const* states,
                  const FusedPlan& p, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  FusedArgs<T> a{};
  a.x = x;
  a.y = y;
  a.N = N;
  a.K = K;
  a.c = p.c;
  a.nslices = p.nslices;
  a.buf_elems = p.buf_elems;
  a.ldA = p.ldA;
  a.ldB = p.ldB;
  a.wvec = 0;
  for (int k = 0; k < K; ++k) {
    a.w[k] = w[k];
    a.f[k] = f[k];
    if (f[k] % VW == 0 && aligned16(w[k])) a.wvec |= 1u << k;
  }
  // save[s] = F_{K-s} = states[K-s-1]
  for (int st = 1; st < K; ++st) a.save[st] = states ? states[K - st - 1] : nullptr;
  const long P1 = N / f[K - 1];
  a.vec_x = P1 % VW == 0 && N % VW == 0 && aligned16(x);
  a.vec_y = f[0] % VW == 0 && aligned16(y);
  const long blocks = B * p.nslices;
  if (blocks > 0x7fffffffL) return cudaErrorInvalidConfiguration;
  fused_fn<T>(p.cfg)<<<unsigned(blocks), cfg_shape<T>(p.cfg).threads, size_t(p.smem), s>>>(a);
  return cudaGetLastError();
}

// ---- forward / backward drivers -----------------------------------------------------------------------------------
// Workspace sub-buffers start on 16-byte boundaries (so the vector paths stay on): B·N rounded up to 4 elements.
inline long padded(long n) { return (n + 3) / 4 * 4; }

// version 3: one F-step per factor (intermediates in `states` when given, else in scratch: forward_scratch());
// version 4: the fused kernel (states saved when given), or version 3 where it does not fit / K = 1.
template <class T>
cudaError_t forward(int version, const T* x, T* y, const T* const* w, const int* f, int K, long B, long N,
                    T* const* states, T* scratch, int cfg, int cols, cudaStream_t s) {
  if (B == 0 || N == 0) return cudaSuccess;
  if (version == 4) {
    const FusedPlan p = plan_fused<T>(B, N, f, K, cfg, cols);
    if (p.ok) return fused(x, y, w, f, K, B, N, states, p, s);
  }
  const T* src = x;
  for (int st = 1; st <= K; ++st) {
    const int idx = K - st;  // W_{K-st+1}
    T* dst = st == K ? y : (states ? states[K - st - 1] : scratch + long((st - 1) & 1) * padded(B * N));
    cudaError_t e = fstep(src, w[idx], dst, B, N, f[idx], version == 3 ? cfg : -1, s);
    if (e != cudaSuccess) return e;
    src = dst;
  }
  return cudaSuccess;
}

inline long forward_scratch(long B, long N, int K) { return long(std::min(K - 1, 2)) * padded(B * N); }

// Workspace (elements) for backward: dF ping-pong buffers (K-1 of them, at most 2) + the dW partials.
template <class T> long backward_workspace(long B, long N, const int* f, int K) {
  const int sms = device_facts().sms;
  long n = long(std::min(K - 1, 2)) * padded(B * N);
  for (int k = 0; k < K; ++k) n += padded(long(dw_splits<T>(B, N, f[k], sms)) * f[k] * f[k]);
  return n;
}

template <class T>
cudaError_t backward(const T* g, const T* x, const T* const* w, const int* f, int K, long B, long N,
                     const T* const* states, T* dx, T* const* dw, T* ws, cudaStream_t s) {
  const int sms = device_facts().sms;
  T* dF[2] = {ws, ws + (K >= 3 ? padded(B * N) : 0)};
  T* part = ws + long(std::min(K - 1, 2)) * padded(B * N);
  ReduceArgs<T> ra{};
  ra.K = K;
  int max_ff = 1;
  for (int k = 1; k <= K; ++k) {  // 1-based factor index; array index k-1
    const int fk = f[k - 1];
    const T* D = k == 1 ? g : dF[(k - 2) & 1];
    const T* Fk = k == K ? x : states[k - 1];
    const int splits = dw_splits<T>(B, N, fk, sms);
    if (B > 0) {
      cudaError_t e = dw_cfg(fk) == 0 ? launch_dw<T, typename CfgOf<T, 0>::type>(Fk, D, part, B, N, fk, splits, s)
                                      : launch_dw<T, typename CfgOf<T, 2>::type>(Fk, D, part, B, N, fk, splits, s);
      if (e != cudaSuccess) return e;
    }
    ra.part[k - 1] = part;
    ra.out[k - 1] = dw[k - 1];
    ra.ff[k - 1] = fk * fk;
    ra.splits[k - 1] = B > 0 ? splits : 0;
    max_ff = std::max(max_ff, fk * fk);
    part += padded(long(splits) * fk * fk);
    if (B > 0) {
      T* out = k == K ? dx : dF[(k - 1) & 1];
      cudaError_t e = rstep(D, w[k - 1], out, B, N, fk, s);
      if (e != cudaSuccess) return e;
    }
  }
  dim3 grid(unsigned(std::min(cdiv(max_ff, 256), 4 * sms)), unsigned(K));
  reduce_kernel<T><<<grid, 256, 0, s>>>(ra);
  return cudaGetLastError();
}

}  // namespace kron

// ---- the launchers cpp_src/kron.cpp calls (one overload per dtype) ---------------------------------------------
#define LAB_KRON_INSTANTIATE(T)                                                                                    \
  cudaError_t kron_forward(int version, const T* x, T* y, const T* const* w, const int* f, int K, int64_t B,       \
                           int64_t N, T* const* states, T* scratch, int cfg, int cols, cudaStream_t s) {           \
    return kron::forward<T>(version, x, y, w, f, K, B, N, states, scratch, cfg, cols, s);                          \
  }                                                                                                                \
  cudaError_t kron_backward(const T* g, const T* x, const T* const* w, const int* f, int K, int64_t B, int64_t N,  \
                            const T* const* states, T* dx, T* const* dw, T* ws, cudaStream_t s) {                  \
    return kron::backward<T>(g, x, w, f, K, B, N, states, dx, dw, ws, s);                                          \
  }                                                                                                                \
  int64_t kron_backward_workspace(const T*, int64_t B, int64_t N, const int* f, int K) {                           \
    return kron::backward_workspace<T>(B, N, f, K);                                                                \
  }                                                                                                                \
  int64_t kron_forward_scratch(const T*, int64_t B, int64_t N, int K) { return kron::forward_scratch(B, N, K); }   \
  void kron_fused_plan(const T*, int64_t B, int64_t N, const int* f, int K, int cfg, int cols, int64_t* info) {    \
    const kron::FusedPlan p = kron::plan_fused<T>(B, N, f, K, cfg, cols);                                          \
    const kron::CfgShape cs = kron::cfg_shape<T>(p.ok ? p.cfg : 0);                                               \
    const int64_t v[] = {p.ok, p.cfg, p.c, p.nslices, p.smem, p.blocks_per_sm, cs.threads, cs.tm, cs.tn,            \
                         int64_t(p.cost), kron::device_facts().smem_optin};                                         \
    for (int i = 0; i < 11; ++i) info[i] = v[i];                                                                   \
  }
LAB_KRON_INSTANTIATE(float)
LAB_KRON_INSTANTIATE(double)
