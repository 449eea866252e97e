// kron/v6.cu — version 6: v2's fusion for two factors in strict fp32, with every operand of a block in flight from
// its first cycle (the algebra, the versions and the napkin math: kron.cuh).
//
// Why. At small batch v2 is latency-bound, not FMA-bound (kron.cuh, "What bounds them"): a block walks f/16 chunks
// per factor through a 2-stage cp.async pipeline, so nearly every chunk waits on its own round trip to L2 or HBM
// (~16 of them a block at 128 × 128), and at batch 32 it took 19.5 us against a 4.1 us FMA floor, behind torch.bmm's
// two cuBLAS GEMMs (18.7). Here a block issues all of its loads at entry (x[b], W_2's slice, W_1: 144 KB at
// 128 × 128, c = 32) in six cp.async groups, and each step waits only for the group it multiplies next. The operands
// stay as they lie in memory (rows of k, no transposes, no padding): both steps read A and B as k-major rows, where a
// warp's 16-byte loads are contiguous.
//
// Scope (v2 runs everything else, float64 tensors included): K = 2, float32; f_1 and f_2 multiples of 4; a slice
// width c (columns of W_2 per block, a power of two from 4 to 64) dividing f_2 whose block fits shared memory:
// f_2·f_1 + f_2·c + f_1² + f_1·c floats (160 KB at 128 × 128, c = 32); 16-byte aligned tensors.
//   step 1  S (f_1 × c) = X_bᵀ · W_2[:, c0:c0+c]     M = f_1 (i_1), N = c (j_2), K = f_2 (i_2); A = X_b[i_2][i_1]
//   step 2  Y (c × f_1) = Sᵀ · W_1                   M = c (j_2),   N = f_1 (j_1), K = f_1 (i_1); A = S[i_1][j_2]
//   y[b][(c0 + j)·f_1 + n] = Y[j][n]; with `save`, S is also written to F_1[b][i_1·f_2 + c0 + j] (the state v1's
//   backward reads: backward_v6.cu, or backward.cu where that one does not apply)
// Accumulation is in fp32 FMAs (cfg 1 and 2 add two or four partial sums at the end): the same arithmetic as v2, not
// the same rounding order as cuBLAS.
//
// Napkin math (H100, 128 × 128, batch 32): 134 M MAC, 4.3 us at the chip's FMA rate. Slices of c = 32: 128 blocks
// of 256 threads, one an SM, 1 M MAC a block: 8.2 k cycles of FMA issue an SM (~4.5 us) if nothing else issued. The
// loads: 144 KB a block, 18 MB from L2 for the grid (x and the factors from HBM once).
//
// Measured (H100, CUDA graph, L2 flushed, fp32, 128 × 128; torch.bmm = cuBLAS strict fp32 in the same run), in the
// order the designs were built:
//  1. 4 × 4 outputs a thread, copies indexed by division: batch 1 28.4 us (its plan's c = 4), batch 32 18.0.
//  2. the same with the copies as contiguous runs, a row's loads ahead of its FMAs: batch 1 12.2-13.9, batch 32
//     14.8-16.4 (torch.bmm 15.5-15.6 and 18.6-18.7). Where a batch-32 block's time went (%globaltimer, from its
//     entry): all copies issued 1.7 us, first group landed 2.3, step 1 done 8.5, end 13.6 us: each step ran at about
//     half the FMA issue rate. ncu: 2 warps a scheduler, 36% of cycles with no eligible warp, 0.64 issued a cycle.
//  3. cfg 1 (below), 8 × 4 outputs a thread and every k: one warp a scheduler, slower (batch 32 18.1-18.8 us; ncu
//     54% of cycles with no eligible warp). Replaced by the k-split.
//  4. the bulk-copy engine for the loads (above issue_run): slower at every batch.
//  5. cfg 1 as it is: batch 1 12.3-14.5 us, 8 12.7-14.7, 32 15.4-16.5, 64 22.2-23.9 (torch.bmm 15.5-15.6,
//     16.4-16.5, 18.7-19.0, 24.3-24.4). ncu at batch 32 (c = 32): 0.58 instructions issued a cycle a scheduler, 42%
//     of cycles with no eligible warp; per issued instruction 0.62 cycles stalled on a fixed-latency dependency,
//     0.57 on shared-memory loads (short scoreboard); FMA-pipe instructions 67% of those issued.
//  6. cfg 2, four k-parts (16 warps at c = 32): batch 1 11.8 us, 8 12.2 (cfg 1 14.5 and 14.7 in that run); batch 32
//     16.5, the same as cfg 1: four warps a scheduler did not move it. So at batch 32 the FMA loop is not the bound;
//     the trace points to the operands' delivery: the last group of x[b] landed 6.7 us and W_1 8.5 us after the
//     block's entry: 144 KB a block, 18 MB for the grid, every block pulling the same 64 KB of W_1 (and each sample's
//     x four times) from L2 at once (~2.8 TB/s for the grid). The next design shares them: the four slices of a
//     sample as one thread-block cluster, x[b] and W_1 multicast to its SMs (a quarter of the L2 reads).
//  7. That design, on branch next/v6-cluster, timed on two H200 machines (the H100's SM, clocks and chip; faster HBM;
//     cfg 0-2 timed as on the H100). cfg 3: cfg 1's threads, a sample's S slices one thread-block cluster, every
//     x[b] and W_1 group multicast to the cluster by bulk copies (cp.async.bulk ... multicast::cluster, each CTA
//     issuing 1/S, an mbarrier a group); cfg 4: the same with clusters of two slices. Batch 32, c = 32: cfg 3
//     24.8-27.8 us, cfg 4 16.8-16.9, cfg 0 15.7-16.1, cfg 1 16.3-16.4 (torch.bmm 18.7-19.1). cfg 3's clusters of
//     four 160 KB blocks do not all fit at once (cudaOccupancyMaxActiveClusters: two waves for 32 of them); cfg 4's
//     pairs fit in one wave and halve the grid's L2 reads of x and W_1, and bought nothing: L2 delivery is not what
//     bounds batch 32. Batch 1 (one cluster), c = 16: cfg 3 11.3 us on one machine, 13.5 on the other (cfg 2 12.1-12.2
//     on both). Clean under memcheck, racecheck and synccheck. Not merged.
// Above batch 64 v1 (one kernel per factor, 8 × 8 tiles) is ahead: v6's one block an SM (160 KB) leaves each
// block's load latency and its steps' FMA-rate shortfall unhidden. The launch itself: an empty kernel replayed from
// a graph takes ~3 us of the batch-1 call's 12.
// lab:variants dtype=f32
#include "kron.cuh"
#include "plan_info.h"

#include <vector>

namespace kron {
namespace v6 {

constexpr int kGroups1 = 4;  // cp.async groups of step 1's operands (x[b] rows and W_2 slice rows, by k quarter)
constexpr int kGroups2 = 2;  // ... and of W_1 (by k half): 6 groups, committed in order
constexpr int kMaxThreads = 512;

// The three configurations (the plan's cfg):
//   cfg 0: a thread owns a 4 × 4 output tile and walks all of k (16 FMAs per two 16-byte shared loads); f_1·c/16
//          threads a block
//   cfg 1: a thread owns an 8 × 4 tile and walks every other k: two threads (one in each half of the block's warps,
//          so one of each on every scheduler) share a tile and add their partial sums through shared memory at the
//          end of a step (32 FMAs per three shared loads, the same warps a scheduler); f_1·c/16 threads
//   cfg 2: the same with k split four ways: f_1·c/8 threads, twice the warps a scheduler (the parts' tiles go through
//          x[b]'s buffer, so 3c <= f_2)
template <int CFG> struct Conf;
template <> struct Conf<0> { static constexpr int TM = 4, KS = 1; };
template <> struct Conf<1> { static constexpr int TM = 8, KS = 2; };
template <> struct Conf<2> { static constexpr int TM = 8, KS = 4; };
constexpr int kConfigs = 3;
constexpr int tm_of(int cfg) { return cfg == 0 ? 4 : 8; }
constexpr int ks_of(int cfg) { return cfg == 0 ? 1 : cfg == 1 ? 2 : 4; }

// How a step's M × N output is dealt to warps: lanes form wm × wn tiles of TM × 4 (wn = 8 where N allows), warps
// tile the rest. ok = false where the shape does not divide evenly.
struct WarpGrid {
  int wm, wn, warps_m, warps_n;
  bool ok;
};
__host__ __device__ inline WarpGrid warp_grid(int M, int N, int TM) {
  WarpGrid g{0, 0, 0, 0, false};
  if (M % TM || N % 4) return g;
  const int mt = M / TM, nt = N / 4;
  int wn = nt < 8 ? nt : 8;
  if (wn < 1 || 32 % wn) return g;
  int wm = 32 / wn;
  if (wm > mt) {
    wm = mt;
    if (32 % wm) return g;
    wn = 32 / wm;
  }
  if (mt % wm || nt % wn) return g;
  g = WarpGrid{wm, wn, mt / wm, nt / wn, true};
  return g;
}

struct Args {
  const float* x;   // (B, f_2·f_1)
  float* y;         // (B, f_2·f_1)
  const float* w1;  // W_1 (f_1, f_1): factors[0]
  const float* w2;  // W_2 (f_2, f_2): factors[1]
  float* save;      // F_1 (B, N) or nullptr
  int f1, f2, c, lc, nslices;  // lc = log2(c / 4)
};

// A contiguous run of n4 16-byte vectors, global -> shared, the block's threads striding over it
__device__ __forceinline__ void issue_run(float* dst, const float* src, int n4) {
  for (int e = threadIdx.x; e < n4; e += blockDim.x) cp_async16(dst + 4 * e, src + 4 * e, true);
}
// Rows r0..r1 of W_2's slice (c columns, rows f_2 apart in global memory) into [f_2][c]
__device__ __forceinline__ void issue_slice(float* dst, const float* src, int r0, int r1, int c, int lc, int f2) {
  const int n = (r1 - r0) << lc;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int r = r0 + (e >> lc), q = (e & ((1 << lc) - 1)) * 4;
    cp_async16(dst + r * c + q, src + long(r) * f2 + q, true);
  }
}

// cp.async.wait_group takes an immediate: at most n of this thread's groups still in flight
__device__ __forceinline__ void wait_groups(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    default: cp_async_wait<5>(); break;
  }
}

// acc += Σ_{i < n} A[i]ᵀ ⊗ B[i], A[i] = a + i·lda (TM floats), B[i] = b + i·ldb (4 floats), rows 16-byte aligned.
// Unrolled by 4: the compiler issues the four rows' shared loads ahead of their FMAs. Measured against loading the
// next row's fragments by hand before this row's FMAs (the same at the last row, so no read leaves the range: a row
// past it may be a group still being copied in, which racecheck flagged when an earlier build read it): within
// 0.3-1.7 us either way (H100, graph, 128 x 128), this one ahead at batch 32-64 (cfg 1, c = 32: 15.4 against 15.9
// us), behind at batch 1 (12.6 against 12.3).
template <int TM>
__device__ __forceinline__ void fma_rows(float (&acc)[TM][4], const float* a, int lda, const float* b, int ldb,
                                         int n) {
#pragma unroll 4
  for (int i = 0; i < n; ++i, a += lda, b += ldb) {
    float av[TM], bv[4];
#pragma unroll
    for (int v = 0; v < TM / 4; ++v) unpack(ld16<float4>(a + 4 * v), av + 4 * v);
    unpack(ld16<float4>(b), bv);
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[r][j] = fmaf(av[r], bv[j], acc[r][j]);
  }
}

// Rows r0..r1 of k, the ones of this thread's k-part h of KS (k ≡ h mod KS): A and B advanced to the first such row
template <int TM, int KS>
__device__ __forceinline__ void fma_range(float (&acc)[TM][4], const float* A, int lda, const float* B, int ldb,
                                          int r0, int r1, int h) {
  const int first = r0 + ((h - r0 % KS) + KS) % KS;
  const int n = first < r1 ? (r1 - first + KS - 1) / KS : 0;
  fma_rows<TM>(acc, A + long(first) * lda, KS * lda, B + long(first) * ldb, KS * ldb, n);
}

// cfg 1, 2: the k-parts' tiles summed. After a barrier (the scratch is x[b]'s buffer, which the parts may still be
// reading), parts 1.. store their tiles into `scratch` (row-major, `ld` floats a row, one tile of `tile` floats a
// part), then part 0 adds them to its own; the caller stores part 0's result.
template <int TM, int KS>
__device__ __forceinline__ void add_parts(float (&acc)[TM][4], float* scratch, int ld, int tile, int m0, int n0,
                                          int h) {
  __syncthreads();
  if (h > 0)
#pragma unroll
    for (int r = 0; r < TM; ++r)
      sts16(scratch + (h - 1) * tile + (m0 + r) * ld + n0, make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  __syncthreads();
  if (h == 0)
#pragma unroll
    for (int p = 1; p < KS; ++p)
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        float v[4];
        unpack(ld16<float4>(scratch + (p - 1) * tile + (m0 + r) * ld + n0), v);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r][j] += v[j];
      }
}

__device__ __forceinline__ void tile_origin(const WarpGrid& g, int TM, int t, int* m0, int* n0) {
  const int w = t / 32, l = t % 32;
  *m0 = ((w / g.warps_n) * g.wm + l / g.wn) * TM;
  *n0 = ((w % g.warps_n) * g.wn + l % g.wn) * 4;
}

template <int CFG>
__global__ void __launch_bounds__(kMaxThreads) prefetched_kernel(const Args a) {
  constexpr int TM = Conf<CFG>::TM, KS = Conf<CFG>::KS;
  extern __shared__ __align__(16) float smem[];
  const int f1 = a.f1, f2 = a.f2, c = a.c;
  float* Xs = smem;               // [f_2][f_1]  x[b] as it lies (after each step's FMAs: cfg 1, 2's scratch)
  float* W2s = Xs + f2 * f1;      // [f_2][c]    W_2[:, c0:c0+c]
  float* W1s = W2s + f2 * c;      // [f_1][f_1]  W_1
  float* Ss = W1s + f1 * f1;      // [f_1][c]    the state between the steps
  const long b = blockIdx.x / a.nslices;
  const int c0 = int(blockIdx.x % a.nslices) * c;
  const long N = long(f1) * f2;
  const float* xb = a.x + b * N;
  const int part = blockDim.x / KS, h = threadIdx.x / part, t = threadIdx.x % part;  // k-part h, thread t of it

  // Every load of the block, in six cp.async groups: step 1's operands by k quarter, then W_1 by k half (x[b] and
  // W_1 are contiguous runs of rows: no index arithmetic per copy). Measured against the bulk-copy engine doing the
  // same (cp.async.bulk, warp 0 issuing one copy per group of x[b] and W_1 rows and one per W_2 slice row, each group
  // completing on an mbarrier; H100, graph, L2 flushed, 128 x 128): slower at every batch, cfg 0 batch 1 16.0 us
  // against 12.2-13.9 here, batch 32 19.9 against 14.8-16.4. Not profiled further; its design had 32 copies of 128 B
  // a group for W_2's slice. What the threads' copies cost, from %globaltimer stamps (batch 32, cfg 0): all issued
  // 1.7 us after the block's entry, the first group landed at 2.3 us.
  const int q1 = cdiv(f2, kGroups1), q2 = cdiv(f1, kGroups2);
  for (int g = 0; g < kGroups1; ++g) {
    const int r0 = min(f2, g * q1), r1 = min(f2, r0 + q1);
    issue_run(Xs + r0 * f1, xb + long(r0) * f1, (r1 - r0) * f1 / 4);
    issue_slice(W2s, a.w2 + c0, r0, r1, c, a.lc, f2);
    cp_async_commit();
  }
  for (int g = 0; g < kGroups2; ++g) {
    const int r0 = min(f1, g * q2), r1 = min(f1, r0 + q2);
    issue_run(W1s + r0 * f1, a.w1 + long(r0) * f1, (r1 - r0) * f1 / 4);
    cp_async_commit();
  }

  // step 1: S = X_bᵀ · W_2 slice, each k quarter as soon as it has landed
  {
    int m0, n0;
    tile_origin(warp_grid(f1, c, TM), TM, t, &m0, &n0);
    float acc[TM][4] = {};
    for (int g = 0; g < kGroups1; ++g) {
      wait_groups(kGroups1 + kGroups2 - 1 - g);
      __syncthreads();  // every thread's copies of group g visible
      fma_range<TM, KS>(acc, Xs + m0, f1, W2s + n0, c, min(f2, g * q1), min(f2, (g + 1) * q1), h);
    }
    if constexpr (KS > 1) add_parts<TM, KS>(acc, Xs, c, f1 * c, m0, n0, h);
    if (h == 0)
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        const float4 v = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        sts16(Ss + (m0 + r) * c + n0, v);
        if (a.save) st16<float4>(a.save + b * N + long(m0 + r) * f2 + c0 + n0, v);
      }
    __syncthreads();  // S whole
  }

  // step 2: Y = Sᵀ · W_1, each k half as soon as it has landed
  {
    int m0, n0;
    tile_origin(warp_grid(c, f1, TM), TM, t, &m0, &n0);
    float acc[TM][4] = {};
    for (int g = 0; g < kGroups2; ++g) {
      wait_groups(kGroups2 - 1 - g);
      __syncthreads();
      fma_range<TM, KS>(acc, Ss + m0, c, W1s + n0, f1, min(f1, g * q2), min(f1, (g + 1) * q2), h);
    }
    if constexpr (KS > 1) add_parts<TM, KS>(acc, Xs, f1, c * f1, m0, n0, h);
    float* yb = a.y + b * N;
    if (h == 0)
#pragma unroll
      for (int r = 0; r < TM; ++r)
        st16<float4>(yb + long(c0 + m0 + r) * f1 + n0, make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  }
}

template <int CFG> const void* kernel_of() { return reinterpret_cast<const void*>(&prefetched_kernel<CFG>); }
inline const void* kernel_for(int cfg) {
  return cfg == 0 ? kernel_of<0>() : cfg == 1 ? kernel_of<1>() : kernel_of<2>();
}

// ---- host: the plan (configuration and slice width c) and the launch ---------------------------------------------
struct Plan {
  bool ok = false;
  int cfg = -1, c = 0, nslices = 0, threads = 0, blocks_per_sm = 0;
  long smem = 0;
  double cost = 0;
};

inline long smem_bytes(int f1, int f2, int c) {
  return 4L * (long(f2) * f1 + long(f2) * c + long(f1) * f1 + long(f1) * c);
}

// The kernels have no static shared memory (a block's static and dynamic bytes together may not pass the device's
// opt-in limit: gru's proj.cu once failed its launch that way).
int dynamic_limit() { return device_facts().smem_optin; }

void optin() {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || done[dev]) return;
  for (int cfg = 0; cfg < kConfigs; ++cfg)
    cudaFuncSetAttribute(kernel_for(cfg), cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_limit());
  done[dev] = true;
}

// The candidates: cfg 0-2 × slice widths c in {4, ..., 64} that divide f_2, each costed in cycles of the busiest SM:
// waves of blocks, each as long as one thread's walk over f_1 + f_2 values of k (a half or a quarter of them in cfg 1,
// 2), at I issue slots a k (TM·4 FMAs, TM/4 + 1 shared loads, ~3 more) times the warps a scheduler takes in turn,
// or I plus ~10 cycles of exposed latency where a scheduler has one warp; against the SM's share of L2 reads at
// ~24 B a cycle. Ties go to the wider slice (fewer re-reads of x[b] and W_1).
Plan search(long B, int f1, int f2, int force_cfg, int force_c) {
  Plan best;
  const DeviceFacts d = device_facts();
  optin();
  for (int cfg = 0; cfg < kConfigs; ++cfg) {
    if (force_cfg >= 0 && cfg != force_cfg) continue;
    const int TM = tm_of(cfg), KS = ks_of(cfg);
    for (int c = 64; c >= 4; c /= 2) {
      if (force_c > 0 && c != force_c) continue;
      if (c > f2 || f2 % c) continue;
      const long threads = long(f1) * c * KS / (4 * TM);  // KS parts of f_1·c / (4·TM) threads
      if (threads / KS < 32 || threads > kMaxThreads || (threads / KS) % 32) continue;
      if ((KS - 1) * c > f2) continue;  // the parts' tiles fit x[b]'s buffer
      if (!warp_grid(f1, c, TM).ok || !warp_grid(c, f1, TM).ok) continue;
      Plan p;
      p.cfg = cfg;
      p.c = c;
      p.nslices = f2 / c;
      p.threads = int(threads);
      p.smem = smem_bytes(f1, f2, c);
      if (p.smem > dynamic_limit()) continue;
      if (B * p.nslices > 0x7fffffffL) continue;
      int bps = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kernel_for(cfg), p.threads, size_t(p.smem));
      if (bps <= 0) continue;
      p.blocks_per_sm = bps;
      const long blocks = B * p.nslices;
      const long waves = (blocks + long(d.sms) * bps - 1) / (long(d.sms) * bps);
      const long resident = std::min<long>(bps, (blocks + d.sms - 1) / d.sms);
      const double per_sched = double(resident) * p.threads / 32 / 4;
      const double I = (4.0 * TM + TM / 4 + 1 + 3) / KS;
      const double per_k = per_sched <= 1.0 ? I + 10.0 : std::max(per_sched * I, I + 10.0);
      const double t_fma = double(waves) * per_k * (f1 + f2);
      const double t_l2 = double((blocks + d.sms - 1) / d.sms) * smem_bytes(f1, f2, c) / 24.0;
      p.cost = std::max(t_fma, t_l2);
      p.ok = true;
      if (!best.ok || p.cost < best.cost * 0.999) best = p;
    }
  }
  return best;
}
// cached per (device, B, f_1, f_2, forced cfg and c): kron.cuh's PlanCache
Plan plan(long B, const int* f, int K, int force_cfg, int force_c) {
  if (K != 2 || B <= 0) return Plan{};
  const int f1 = f[0], f2 = f[1];
  if (f1 % 4 || f2 % 4) return Plan{};
  static PlanCache<Plan> cache;
  return cache.get({B, f1, f2, force_cfg, force_c}, [&] { return search(B, f1, f2, force_cfg, force_c); });
}

// The kPlanFields numbers (plan_info.h) of what forward would launch; fits = 0 where v6 does not apply.
void plan_info(int64_t B, int64_t N, const int* f, int K, int cfg, int cols, int64_t* info) {
  const Plan p = (B > 0 && K == 2 && long(f[0]) * f[1] == N) ? plan(B, f, K, cfg, cols) : Plan{};
  for (int i = 0; i < kPlanFields; ++i) info[i] = 0;
  info[kFits] = p.ok;
  info[kCfg] = p.cfg;
  info[kC] = p.c;
  info[kSlices] = p.nslices;
  info[kSmemBytes] = p.smem;
  info[kBlocksPerSm] = p.blocks_per_sm;
  info[kThreads] = p.threads;
  info[kTM] = p.ok ? tm_of(p.cfg) : 0;
  info[kTN] = 4;
  info[kCost] = int64_t(p.cost);
  info[kSmemLimit] = device_facts().smem_optin;
  info[kStages] = kGroups1 + kGroups2;
}

// y = x · (W_2 ⊗ W_1); save: F_1 or nullptr. cudaErrorInvalidConfiguration where the plan does not fit or a pointer
// is not 16-byte aligned (the binding asks plan_info and checks alignment first, and runs v2 instead).
cudaError_t forward(const float* x, float* y, const float* const* w, const int* f, int K, int64_t B, int64_t N,
                    float* save, int cfg, int cols, cudaStream_t s) {
  if (B == 0 || N == 0) return cudaSuccess;
  const Plan p = plan(B, f, K, cfg, cols);
  if (!p.ok || !aligned16(x) || !aligned16(y) || !aligned16(w[0]) || !aligned16(w[1]) || (save && !aligned16(save)))
    return cudaErrorInvalidConfiguration;
  int lc = 0;
  while ((4 << lc) < p.c) ++lc;
  const Args a{x, y, w[0], w[1], save, f[0], f[1], p.c, lc, p.nslices};
  optin();
  if (p.cfg == 0)
    prefetched_kernel<0><<<unsigned(B * p.nslices), p.threads, size_t(p.smem), s>>>(a);
  else if (p.cfg == 1)
    prefetched_kernel<1><<<unsigned(B * p.nslices), p.threads, size_t(p.smem), s>>>(a);
  else
    prefetched_kernel<2><<<unsigned(B * p.nslices), p.threads, size_t(p.smem), s>>>(a);
  return cudaGetLastError();
}

}  // namespace v6
}  // namespace kron

// ---- what the binding calls ("kron_v6_plan@f32", "kron_v6_forward@f32") --------------------------------------------
//   kron_v6_plan:    void (int64_t B, int64_t N, const int* f, int K, int cfg, int cols, int64_t* info)
//   kron_v6_forward: cudaError_t (const float* x, float* y, const float* const* w, const int* f, int K, int64_t B,
//                                 int64_t N, float* save /* F_1 or nullptr */, int cfg, int cols, cudaStream_t)
LAB_EXPORTS(LAB_EXPORT("kron_v6_plan", kron::v6::plan_info), LAB_EXPORT("kron_v6_forward", kron::v6::forward))
