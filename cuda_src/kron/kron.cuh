// kron — the Kronecker-factored linear layer  y = x · (W_K ⊗ … ⊗ W_1),  one factor at a time.
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
// Versions (cpu lives in cpp_src/kron/cpu.cpp; the PyTorch baselines torch, torch.bmm and torch.kron in
// lab/kernels/kron.py):
//   v1: one tiled kernel per factor — a 2-stage cp.async pipeline stages 16-deep k-slices of both operands in shared
//       memory, each thread keeps a TM×TN register tile (8×8 at 128×128 block tiles; 4×4 for small grids); backward:
//       an R-step kernel and a batch-reduced dW kernel (deterministic split-K partials + one reduce launch).
//   v2: one fused kernel for all factors — a block owns one sample, or c of the f_K output columns of one (the first
//       factor's output columns never mix again), and keeps its state in shared memory from the first factor to the
//       last; only x is read and y written. Limit: (N/f_K)·c·sizeof(T) per state buffer (two buffers for K ≥ 3, one
//       for K = 2) plus ~34 KB of staging must fit the 227 KB a block may have: N/f_K ≲ 48k floats (K = 2), ≲ 24k
//       (K ≥ 3) at c = 4. Above it, and for K = 1, v2 runs v1. Backward: v1's kernels on the states v2 saved.
//   v3: v2's fusion on tensor cores: mma.sync TF32 on float32 tensors, bf16 (ldmatrix.trans fragments)
//       on bfloat16 ones; the state stored directly in the next step's padded operand layout (v3.cu).
//   v4: two factors (multiples of 64) on wgmma: K-major 128-byte-swizzled tiles staged transposed by the threads,
//       one persistent block per SM with the factors resident and the next sample prefetched into registers (v4.cu);
//       v3 elsewhere.
//   v5: v4's two wgmma steps fed by TMA (v5.cu): a producer warpgroup keeps a ring of x in flight, two consumer
//       warpgroups multiply (split or ping-pong), the state and y leave through shared memory, y by TMA store. bf16:
//       x and the factors MN-major as TMA copies them; TF32: x through registers, W_2 staged once, W_1 held in
//       registers (schedule 2) or staged once. v3 elsewhere.
//   v6: v2 for two factors in strict fp32 with all of a block's operands in flight from its start (six cp.async
//       groups, no 2-stage pipeline), 4 × 4 or (k split among two or four threads) 8 × 4 outputs a thread (v6.cu);
//       v2 elsewhere. Backward (backward_v6.cu): two factors, multiples of 32, small batches: one block a (sample,
//       slice of W_1's rows) computes dx's columns and its shares of dW_1 and dW_2 from operands all in flight at
//       entry, then one reduce launch; v1's kernels elsewhere, on the state it saves.
//   backward of v3-v5 (backward_tc.cu): at their precision, the states recomputed (their forwards save none), then
//       per factor a split-K dW and an R-step, one mma.sync GEMM kernel for the three step kinds, one reduce launch.
//
// Napkin math (H100, fp32, factors 128×128, N = 16384): FLOP = 2·B·N·Σf_k = 8.4 MFLOP per sample; bytes = 2·N·4 =
// 128 KB per sample (read x, write y): 64 FLOP/byte, compute-bound. B = 32: 268 MFLOP — 4.0 us at the datasheet's
// 66.9 TFLOP/s FP32 rate — and 4 MB of HBM traffic (~1.3 us at 3.35 TB/s). B = 1024: 8.6 GFLOP, 128 us at that rate.
// (The notebook divides by the FMA rate the lab's probe measures instead.)
// Small batches are latency- and balance-bound: 32 samples are only 32 blocks, so v2 splits each sample into
// f_K/c column slices, and every slice re-reads its sample's x (64 KB) and W_1 (64 KB) from L2. The launcher picks
// the configuration and c with a small cost model (plan_fused); kron.tune() times the alternatives. At batch 32 it
// picks cfg 1 (256 threads, 4×4 tiles), c = 32: 4 slices per sample, 128 blocks, 50.7 KB shared each, 2 per SM.
//
// What bounds them (timings and the goals' margins: results/<device>/results.csv and notebook 05; read from those
// and the SASS, not yet profiled with Nsight Compute):
//  - small batches are latency-bound, not FLOP-bound: batch 1 takes about as long as batch 32, and cuBLAS, replayed
//    from a graph without launch overhead, lands in the same place. A block walks f/16 = 8 k-chunks per factor
//    through a 2-stage pipeline, so most chunks wait on their own load (x comes from HBM after the flush): ~16
//    dependent round trips per block. Next: stage a slice's whole x tile at once (many loads in flight), KC = 32.
//  - large batches: 8×8 register tiles run level with cuBLAS's FP32 GEMM (torch.bmm). The fused kernel is slower
//    than v1 there: its 8×8 variant sits at the 128-register cap that 2 blocks per SM need (a few spills, 4 of them
//    inside the FMA loop) and each block runs its two GEMMs back to back behind barriers. The rest needs what a tuned
//    SGEMM does (deeper pipeline, warp-specialised loads), or TF32 tensor cores (another precision).
//  - forward + backward eager is CPU-bound (autograd and per-op launches); as a graph, v1's backward (5 launches: dW
//    and R-step per factor, then the reduce) costs about what cuBLAS's does. v6's backward at small batch is one
//    kernel and a reduce, bound by shared-memory bandwidth (backward_v6.cu's header has the trace and ncu figures).
//
// Units (this header holds what they share; each is its own build, so an edit of one rebuilds one):
//   v1.cu        the F-step kernel and the per-factor forward (version 1; version 2 where the fused kernel does not
//                fit, or K = 1)
//   backward.cu  the R-step, dW and reduce kernels and the backward driver (versions 1 and 2; 6 where its own
//                does not apply)
//   backward_v6.cu  version 6's backward (float32 only)
//   backward_tc.cu  the backward of versions 3-5 (TF32 / bf16), built per dtype
//   mma_sync.cuh the mma.sync fragments and the cp.async pipeline that v3.cu and backward_tc.cu share
//   v2.cu        the fused kernel, built once per dtype and block configuration (`// lab:variants dtype=f32,f64
//                cfg=0,1,2`): one instantiation of it alone takes 3-4 s of nvcc on the H100 machine
//   v2_plan.cu   v2's planner (plan_fused: configuration and slice width c) and its launch; it reaches the three
//                configurations' kernels through the binding (FusedKernels below)
//   v3.cu        v3: kernel, planner and launch, built per dtype (f32 = TF32, bf16) and configuration (8 or 4 warps)
//   v4.cu        v4: kernel, planner and launch, built per dtype (f32 = TF32, bf16); sm_90a only
//   v5.cu        v5: kernel, planner and launch, built per dtype (f32 = TF32, bf16); sm_90a only
//   v6.cu        v6: kernel, planner and launch, float32 only
// The others are built once per dtype (`// lab:variants dtype=f32,f64`); launchers are registered as "name@f32",
// "name@f64" (v2.cu: "name@f32,0" ...); cpp_src/kron/kron.cpp (the binding) picks them by name, and asks v2's plan
// before it launches v2.
#pragma once

#include "lab_cuda.cuh"
#include "lab_unit.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
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
// Host side: device facts, configuration choice, launches
// ---------------------------------------------------------------------------------------------------------------
struct DeviceFacts { int sms, smem_optin; };
inline DeviceFacts device_facts() { return {lab::sm_count(), lab::smem_optin()}; }  // both cached (lab_cuda.cuh)

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// A version's plan is a pure function of the device and the call's numbers (shape, forced configuration), and its
// search asks the device's limits and occupancy and walks many layouts: host time an eager call would pay twice (the
// binding's fits check, then the launch). v5 planned afresh each call: 25 us of host time against v3's 16 (H200,
// bf16, .ci/kron_host_probe.py), 9.8 with its plan cached (7c26fec). Each version's plan() keeps one PlanCache in a
// function-local static, so every unit (each dtype's build of a source) has its own (units are built with
// -fno-gnu-unique: see lab/build.py). The key holds what the search reads besides the device; v2_plan.cu's also
// holds its kernels' addresses (a rebuilt v2.cu is planned afresh).
template <class Plan> class PlanCache {
 public:
  // key: the call's numbers (the current device is prepended here); search: run once per new key
  template <class Search> Plan get(std::vector<long> key, Search&& search) {
    int dev = 0;
    cudaGetDevice(&dev);
    key.insert(key.begin(), long(dev));
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    const Plan p = search();
    std::lock_guard<std::mutex> g(mu_);
    return map_.emplace(std::move(key), p).first->second;
  }

 private:
  std::mutex mu_;
  std::map<std::vector<long>, Plan> map_;
};

// The grid of a per-factor step kernel, F-step (v1.cu) or R-step (backward.cu): B·(N/f) output rows of f columns,
// one block per bp × bq tile of configuration C's layout. Both launchers size their grid here, so the two grids and
// the refusal of one too large for a 1-D launch cannot drift apart.
struct StepGrid {
  Layout L;
  int m;        // N/f: rows of one sample (P of the F-step, M of the R-step)
  long rows;    // B·m
  int tiles_q;  // column tiles
  long blocks;  // row tiles × column tiles
  bool fits() const { return blocks <= 0x7fffffffL; }  // gridDim.x
};
template <class C> StepGrid step_grid(long B, long N, int f) {
  const Layout L = make_layout(C::THREADS, C::TM, C::TN, f);
  const int m = int(N / f);
  const long rows = B * m;
  const int tiles_q = cdiv(f, L.bq);
  return StepGrid{L, m, rows, tiles_q, (rows + L.bp - 1) / L.bp * tiles_q};
}

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

// ---- v2: what its kernel builds (v2.cu, one per dtype and configuration) and its planner (v2_plan.cu) share ------
// The fused kernel's argument block (the kernel: v2.cu).
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

// One build of v2.cu holds one configuration's fused kernel; the planner reaches all three through the binding, which
// looks them up by name ("kron_v2_occupancy@f32,0", "kron_v2_launch@f32,0", ...) and hands them over in this order.
template <class T> struct FusedKernels {
  int (*occupancy[kConfigs])(size_t smem);  // resident blocks per SM with `smem` bytes of dynamic shared memory
  cudaError_t (*launch[kConfigs])(const FusedArgs<T>* a, unsigned blocks, size_t smem, cudaStream_t s);
};

// Workspace sub-buffers start on 16-byte boundaries (so the vector paths stay on): B·N rounded up to 4 elements.
inline long padded(long n) { return (n + 3) / 4 * 4; }

// The element type a unit instantiates: each unit is built once per `// lab:variants dtype=...` value.
#if defined(LAB_VARIANT_dtype_f64)
using Real = double;
#elif defined(LAB_VARIANT_dtype_f32)
using Real = float;
#endif

}  // namespace kron
