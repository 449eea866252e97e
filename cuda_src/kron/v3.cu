// kron/v3.cu — version 3: v2's fused kernel on tensor cores. One block owns one sample (or c of the f_K output
// columns of one), keeps its state in shared memory from W_K to W_1, and multiplies with mma.sync: TF32 on float32
// tensors (m16n8k8, fp32 accumulate: precision "tf32"), bf16 on bfloat16 tensors (m16n8k16, fp32 accumulate, the
// state between factors rounded to bf16 as cuBLAS-factorwise rounds its intermediate). The algebra of the F-steps:
// kron.cuh.
//
// What changes against v2 (one idea: the multiplies go to the tensor cores; the fusion is v2's):
//  - a warp owns a (16·MI)×32 output tile as MI×4 mma tiles (cfg 0: 8 warps, 64×32 each; cfg 1: 4 warps, 32×32),
//    the warps of a block laid out per step as WR×WC, whichever pads the step's (M, N) least;
//  - fragments come from shared memory laid out k-major (row k, the M or N index contiguous): bf16 with
//    ldmatrix.x4.trans (one instruction per 16×16 A fragment or per two 8×16 B fragments), TF32 with 32-bit loads
//    (ldmatrix has no 32-bit transpose). Rows are padded to ld ≡ 8 (mod 32) elements: the 8 row addresses of an
//    ldmatrix phase, and the (t·ld + g) words of a scalar fragment load, hit distinct banks;
//  - the state between factors is stored already in the next step's A layout (row k', column m' of the flat state),
//    padded the same way, so the next step reads its A fragments in place, conflict-free.
//
// Napkin math (H100 SXM, factors 128×128, N = 16384; FLOP = 2·B·N·Σf = 8.4 MFLOP per sample):
//   B = 1024, TF32: 8.6 GFLOP — 17 us at the datasheet's 495 TFLOP/s dense TF32 (mma.sync reaches a part of it);
//     bytes: x read once, y written once, 2·64 KB per sample = 134 MB — 40 us at 3.35 TB/s: memory-bound, the
//     floor v3 is after. cuBLAS-factorwise (torch.bmm) moves the intermediate through HBM too: 4·64 KB per sample.
//   B = 1024, bf16: the same FLOPs at 989 TFLOP/s (9 us) and half the bytes (67 MB, 20 us).
//   Shared memory per block (cfg 0, c = 128): the state 128 × (128+8) elements + two 16-row (fp32) or 32-row (bf16)
//     stages of x and of W (128+8 wide): 104 KB in fp32 (2 blocks per SM), 69 KB in bf16 (3 per SM).
//   B = 32: 32 samples are 32 blocks; slices of c < f_K columns give each sample 128/c blocks (each re-reads x[b]
//     from L2): the planner weighs that (plan below).
//
// Limits: every state (plus staging) must fit the opt-in shared memory, as in v2; the binding runs v2 (float32, in
// strict fp32) or v2 on float32 copies (bfloat16) where no configuration fits. No backward yet (the forward saves
// no states).
// lab:variants dtype=f32,bf16 cfg=0,1
#include "kron.cuh"
#include "lab_gemm.cuh"
#include "mma_sync.cuh"
#include "plan_info.h"

#include <cuda_bf16.h>

#include <vector>

namespace kron {
namespace tc {

#if defined(LAB_VARIANT_dtype_bf16)
using Elem = __nv_bfloat16;
#else
using Elem = float;  // multiplied in TF32
#endif
#if defined(LAB_VARIANT_cfg_1)
constexpr int kWarps = 4, kMI = 2;  // warp tile 32×32: small steps (slices of small batches)
#else
constexpr int kWarps = 8, kMI = 4;  // warp tile 64×32: 128×128 block tiles, W staged once per step
#endif
constexpr int kNI = 4;  // n8 tiles per warp: 32 columns
constexpr int kBlockThreads = kWarps * 32;

// the mma and its fragment loads: mma_sync.cuh
using M = Mma<Elem>;
constexpr int KS = M::KS, KC = M::KC;
constexpr int VW = 16 / int(sizeof(Elem));  // elements per 16-byte vector


// The state between factors: TF32 keeps fp32 storage, rounded to nearest TF32 (the next step would truncate it);
// bf16 rounds to nearest bf16, as cuBLAS-factorwise writes its intermediate.
__device__ __forceinline__ float state_val(float v, float*) { return __uint_as_float(tf32(v)); }
__device__ __forceinline__ __nv_bfloat16 state_val(float v, __nv_bfloat16*) { return __float2bfloat16_rn(v); }
// two adjacent state elements, 8-byte (fp32) or 4-byte (bf16) aligned
__device__ __forceinline__ void store_state_pair(float* p, float v0, float v1) {
  *reinterpret_cast<float2*>(p) = make_float2(__uint_as_float(tf32(v0)), __uint_as_float(tf32(v1)));
}
__device__ __forceinline__ void store_state_pair(__nv_bfloat16* p, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
}

// ---- a step's block tile: the warps laid out WR × WC, whichever pads the step's M × N output least ----------------
struct StepTile {
  int wr, wc, bm, bn;
};
__host__ __device__ inline StepTile step_tile(int m, int n) {
  StepTile best{1, kWarps, 16 * kMI, kWarps * 8 * kNI};
  long best_cost = -1;
  for (int wr = 1; wr <= kWarps; wr *= 2) {
    const int wc = kWarps / wr, bm = wr * 16 * kMI, bn = wc * 8 * kNI;
    const long cost = long(cdiv(m, bm)) * bm * long(cdiv(n, bn)) * bn;
    if (best_cost < 0 || cost < best_cost) best = StepTile{wr, wc, bm, bn}, best_cost = cost;
  }
  return best;
}
// The state as a step's A operand: row k (f rows, padded to the mma's k with zeros), column m (mrow of them), the
// row length padded to the block tile and then by 8 elements (≡ 8 mod 32: conflict-free fragment loads).
__host__ __device__ inline int a_ld(int mrow, const StepTile& L) { return cdiv(mrow, L.bm) * L.bm + 8; }

// ---- staging one KC-deep chunk: dst[kk·ld + pp] = src[(k0 + kk)·kstride + p0 + pp], zero past kd / pd -----------
// vec: pd, kstride and p0 multiples of VW and src 16-byte aligned: 16-byte cp.async, zero-filled past the edges;
// else element loads through registers (odd sizes: cp.async has no 2-byte form).
// bp is a power of two (a block tile side), so rows and columns come from shifts: the first build divided by a
// run-time bp here and in the stores, and ncu found those integer chains ("wait" stalls) ahead of the mma.
__device__ __forceinline__ void stage(Elem* dst, int ld, const Elem* src, int kstride, int k0, int kd, int p0,
                                      int pd, int bp, bool vec) {
  const int lb = __ffs(bp) - 1;  // log2(bp)
  if (vec) {
    const int lv = lb - (VW == 8 ? 3 : 2);  // log2(vectors per row)
    for (int i = threadIdx.x; i < (KC << lv); i += kBlockThreads) {
      const int kk = i >> lv, pv = (i & ((1 << lv) - 1)) * VW;
      const int k = k0 + kk, p = p0 + pv;
      const bool ok = k < kd && p < pd;
      cp_async16(dst + kk * ld + pv, ok ? src + long(k) * kstride + p : src, ok);
    }
  } else {
    for (int i = threadIdx.x; i < (KC << lb); i += kBlockThreads) {
      const int kk = i >> lb, pp = i & (bp - 1);
      const int k = k0 + kk, p = p0 + pp;
      dst[kk * ld + pp] = (k < kd && p < pd) ? src[long(k) * kstride + p] : elem_zero<Elem>();
    }
  }
}

struct Args {
  const Elem* x;
  Elem* y;
  const Elem* w[kMaxFactors];
  int f[kMaxFactors];
  long N;
  int K, c, nslices, ldA1, ldB, buf_elems, stages;
  unsigned wvec;  // bit k: factor k can be staged in 16-byte vectors
  bool vec_x;     // x[b] rows (P1 long) in 16-byte vectors
  bool pair_y;    // adjacent outputs of the last step stored as one 8- (fp32) or 4-byte (bf16) word
};

// ---------------------------------------------------------------------------------------------------------------
// Block (b, slice): the state after step s is (rows, cols) = (S/f_s, f_s) flat (step 1: (P1, c)), S = P1·c; step s
// reads it as A (k = f_{s}'s axis rows, m columns) from shared memory, except step 1, which stages x[b] like W.
// ---------------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kBlockThreads, kWarps == 8 ? 2 : 3) fused_tc_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ns = a.stages;
  Elem* const As = reinterpret_cast<Elem*>(smem_raw);  // [ns][KC][ldA1]: x chunks (step 1 only)
  Elem* const Bs = As + ns * KC * a.ldA1;              // [ns][KC][ldB]: factor chunks
  Elem* const buf0 = Bs + ns * KC * a.ldB;             // states: the second buffer only for K >= 3
  Elem* const buf1 = buf0 + a.buf_elems;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = a.K;
  const long N = a.N;
  const long b = blockIdx.x / a.nslices;
  const int c0 = int(blockIdx.x % a.nslices) * a.c;
  const int fK = a.f[K - 1];
  const int ccols = min(a.c, fK - c0);  // columns of W_K this slice really has
  const int P1 = int(N / fK);
  const long S = long(P1) * a.c;        // state elements
  // this slice's outputs: y[b][c0·P1 + e], e < ccols·P1; as rows × columns of the last state (f_1 columns for
  // K >= 2, and f_1 divides P1; for K = 1 one row of c columns, ccols of them real)
  const int ylim_m = K == 1 ? 1 : ccols * (P1 / a.f[0]), ylim_n = K == 1 ? ccols : a.f[0];
  const Elem* const xb = a.x + b * N;
  Elem* const yb = a.y + b * N + long(c0) * P1;

  for (int s = 1; s <= K; ++s) {
    const int idx = K - s;                  // this step applies W_{idx+1} = w[idx]
    const int kd = a.f[idx];                // contraction length
    const int ncol = s == 1 ? a.c : kd;     // output columns
    const int mrow = int(S / ncol);         // output rows (P1 for step 1)
    const bool last = s == K;
    const StepTile L = step_tile(mrow, ncol);
    const int wm = warp / L.wc, wn = warp % L.wc;
    const int tiles_n = cdiv(ncol, L.bn), tiles = cdiv(mrow, L.bm) * tiles_n;
    const Elem* const src = (s & 1) ? buf1 : buf0;  // step s >= 2 reads the state step s-1 wrote
    const int lda = s == 1 ? a.ldA1 : a_ld(mrow, L);
    Elem* const dst = (s & 1) ? buf0 : buf1;        // ...and writes the next one here
    // the next step's A layout: nrow columns, f_next rows (zero-padded to the mma's k), nld apart
    int nk = 0, nrow = 0, nld = 0;
    if (!last) {
      nk = a.f[idx - 1];
      nrow = int(S / nk);
      nld = a_ld(nrow, step_tile(nrow, nk));
      const int pad = (cdiv(nk, KS) * KS - nk) * nld;
      for (int i = threadIdx.x; i < pad; i += kBlockThreads) dst[nk * nld + i] = elem_zero<Elem>();
    }
    const Elem* const wsrc = s == 1 ? a.w[K - 1] + c0 : a.w[idx];
    const int wpd = s == 1 ? ccols : kd;
    const bool vec_w = (a.wvec >> idx) & 1u;

    for (int t = 0; t < tiles; ++t) {
      const int m0 = (t / tiles_n) * L.bm, n0 = (t % tiles_n) * L.bn;
      float acc[kMI][kNI][4];
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int j = 0; j < kNI; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
      pipeline_ns(
          cdiv(kd, KC), ns,
          [&](int st, int ch) {
            if (s == 1) stage(As + st * KC * a.ldA1, a.ldA1, xb, P1, ch * KC, kd, m0, P1, L.bm, a.vec_x);
            stage(Bs + st * KC * a.ldB, a.ldB, wsrc, kd, ch * KC, kd, n0, wpd, L.bn, vec_w);
          },
          [&](int st, int ch) {
            // staged x holds columns m0.. at 0; the state is read in place (its rows start at k = ch·KC)
            const Elem* as = s == 1 ? As + st * KC * a.ldA1 : src + ch * KC * lda;
            const int am0 = (s == 1 ? 0 : m0) + wm * 16 * kMI;
            const Elem* bs = Bs + st * KC * a.ldB;
#pragma unroll
            for (int kk = 0; kk < KC; kk += KS) {
              if (ch * KC + kk >= kd) break;  // uniform: the last chunk of a short k
              uint32_t af[kMI][4], bf[kNI / 2][4];
#pragma unroll
              if (s == 1) {
#pragma unroll
                for (int i = 0; i < kMI; ++i) M::load_a<true>(af[i], as, lda, am0 + i * 16, kk, lane);
              } else {
#pragma unroll
                for (int i = 0; i < kMI; ++i) M::load_a<false>(af[i], as, lda, am0 + i * 16, kk, lane);
              }
#pragma unroll
              for (int j = 0; j < kNI / 2; ++j) M::load_b2(bf[j], bs, a.ldB, wn * 32 + j * 16, kk, lane);
#pragma unroll
              for (int i = 0; i < kMI; ++i)
#pragma unroll
                for (int j = 0; j < kNI; ++j)
                  M::mma(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
            }
          });

      // store: acc[i][j] holds rows (g, g+8), columns (2t, 2t+1) of mma tile (i, j); row pointers once per row,
      // 32-bit index math (a state has at most 2^26 elements: plan)
      const int g = lane >> 2, tq = lane & 3;
      const int mw = m0 + wm * 16 * kMI + g, nw = n0 + wn * 32 + 2 * tq;
      if (last) {  // y: element (m, n) of the last state is yb[m·ncol + n], this slice's part only
#pragma unroll
        for (int i = 0; i < kMI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = mw + i * 16 + h * 8;
            if (m >= ylim_m) continue;
            Elem* row = yb + m * ncol;
#pragma unroll
            for (int j = 0; j < kNI; ++j) {
              const int n = nw + j * 8;
              if (n >= ylim_n) continue;
              const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
              if (a.pair_y) {  // ylim_n even: n + 1 is in too
                store_pair(row + n, v0, v1);
              } else {
                store_one(row + n, v0);
                if (n + 1 < ylim_n) store_one(row + n + 1, v1);
              }
            }
          }
      } else if (nrow == ncol) {  // K = 2 and the like: (k', m') = (m, n), a padded row-major store
#pragma unroll
        for (int i = 0; i < kMI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = mw + i * 16 + h * 8;
            if (m >= mrow) continue;
            Elem* row = dst + m * nld;
#pragma unroll
            for (int j = 0; j < kNI; ++j) {
              const int n = nw + j * 8;
              if (n >= ncol) continue;
              const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
              if (n + 1 < ncol)
                store_state_pair(row + n, v0, v1);
              else
                row[n] = state_val(v0, row);
            }
          }
      } else {  // general: flat index e -> (k', m') = (e / nrow, e % nrow)
#pragma unroll
        for (int i = 0; i < kMI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = mw + i * 16 + h * 8;
            if (m >= mrow) continue;
#pragma unroll
            for (int j = 0; j < kNI; ++j) {
              const int n = nw + j * 8;
#pragma unroll
              for (int u = 0; u < 2; ++u) {
                if (n + u >= ncol) break;
                const int e = m * ncol + n + u;
                const int kq = e / nrow;
                Elem* d = dst + kq * nld + (e - kq * nrow);
                *d = state_val(acc[i][j][2 * h + u], d);
              }
            }
          }
      }
    }
    __syncthreads();  // the state is complete before the next step reads it
  }
}

// ---- planning: slice width c for this configuration, and what it costs ----------------------------------------------
struct Plan {
  bool ok = false;
  int c = 0, nslices = 0, ldA1 = 0, ldB = 0, buf_elems = 0, nbuf = 0, blocks_per_sm = 0, stages = 2;
  long smem = 0;
  double cost = 0;
};

Plan layout(long N, const int* f, int K, int c, int stages) {
  Plan p;
  p.c = c;
  p.stages = stages;
  const int fK = f[K - 1];
  const long P1 = N / fK, S = P1 * c;
  if (P1 > (1L << 26) || S > (1L << 26)) return p;
  const StepTile L1 = step_tile(int(P1), c);
  p.ldA1 = L1.bm + 8;
  int maxbn = L1.bn;
  long buf = 0;
  for (int s = 2; s <= K; ++s) {
    const int fs = f[K - s];
    const int mrow = int(S / fs);
    const StepTile Ls = step_tile(mrow, fs);
    maxbn = std::max(maxbn, Ls.bn);
    buf = std::max(buf, long(cdiv(fs, KS)) * KS * a_ld(mrow, Ls));
  }
  p.ldB = maxbn + 8;
  p.nbuf = K >= 3 ? 2 : (K == 2 ? 1 : 0);
  p.buf_elems = int(buf);
  p.nslices = cdiv(fK, c);
  p.smem = long(sizeof(Elem)) * (long(stages) * KC * (p.ldA1 + p.ldB) + long(p.nbuf) * buf);
  p.ok = p.smem <= device_facts().smem_optin;
  return p;
}

void optin() {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || done[dev]) return;
  cudaFuncSetAttribute(fused_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device_facts().smem_optin);
  done[dev] = true;
}

// Estimated clock cycles: the busiest SM's padded mma work (at ~half the dense tensor rate, mma.sync's reach,
// derated below 8 resident warps) against its share of L2 reads (every slice re-reads x[b] and the factors) and of
// the HBM traffic (x and y once).
double cost(const Plan& p, long B, long N, const int* f, int K) {
  const DeviceFacts dev = device_facts();
  const int fK = f[K - 1];
  const long P1 = N / fK, S = P1 * p.c;
  double work = 0, wbytes = 0;
  for (int s = 1; s <= K; ++s) {
    const int kd = f[K - s], ncol = s == 1 ? p.c : kd, mrow = int(S / ncol);
    const StepTile L = step_tile(mrow, ncol);
    work += double(cdiv(mrow, L.bm)) * L.bm * cdiv(ncol, L.bn) * L.bn * (cdiv(kd, KS) * KS);
    wbytes += double(kd) * std::min(ncol, kd) * cdiv(mrow, L.bm);
  }
  const long blocks = B * p.nslices;
  const long per_sm = (blocks + dev.sms - 1) / dev.sms;
  const long resident = std::min<long>(std::max(p.blocks_per_sm, 1), per_sm);
  const double eff = std::min(1.0, double(resident) * kWarps / 8.0);
  const double rate = sizeof(Elem) == 2 ? 1024.0 : 512.0;  // MAC per clock per SM
  const double t_mma = double(per_sm) * work / (rate * eff);
  const double t_l2 = double(per_sm) * (double(N) + wbytes) * sizeof(Elem) / 24.0;
  const double t_hbm = 2.0 * B * N * sizeof(Elem) / 1900.0;  // ~3.2 TB/s at ~1.7 GHz, the whole chip
  return std::max(std::max(t_mma, t_l2), t_hbm);
}

Plan search(long B, long N, const int* f, int K, int force_c) {
  Plan best;
  const int fK = f[K - 1];
  std::vector<int> cs;
  if (force_c > 0) {
    cs.push_back((force_c + 7) / 8 * 8);
  } else {
    for (int n = 1; n <= fK; n *= 2) {
      const int c = (cdiv(fK, n) + 7) / 8 * 8;  // a multiple of 8: 16-byte vectors of W_K's slice in both dtypes
      if (cs.empty() || cs.back() != c) cs.push_back(c);
      if (c == 8) break;
    }
  }
  optin();
  for (int c : cs) {
    // stages: as many as keep the most resident blocks. More stages at fewer blocks measured slower (fp32 at batch
    // 1024: 2 blocks x 2 stages 140 us, 1 block x 8 stages 263 us): the kernel is bound by issue, not by load latency
    Plan pc;
    for (int st = 2; st <= kMaxStages; ++st) {
      Plan p = layout(N, f, K, c, st);
      if (!p.ok) break;
      int bps = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, fused_tc_kernel, kBlockThreads, size_t(p.smem));
      if (bps <= 0) break;
      p.blocks_per_sm = bps;
      if (!pc.ok || bps > pc.blocks_per_sm || (bps == pc.blocks_per_sm && st > pc.stages)) pc = p;
    }
    if (!pc.ok) continue;
    pc.cost = cost(pc, B, N, f, K);
    if (!best.ok || pc.cost < best.cost * 0.999) best = pc;
  }
  return best;
}
// cached per (device, B, N, factors, forced c): kron.cuh's PlanCache
Plan plan(long B, long N, const int* f, int K, int force_c) {
  static PlanCache<Plan> cache;
  std::vector<long> key = {B, N, K, force_c};
  key.insert(key.end(), f, f + K);
  return cache.get(std::move(key), [&] { return search(B, N, f, K, force_c); });
}

// What this configuration would launch, as the kPlanFields numbers (plan_info.h); the binding compares the costs of
// the configurations' builds and launches the cheaper.
void plan_info(int64_t B, int64_t N, const int* f, int K, int cols, int64_t* info) {
  const Plan p = (B > 0 && K >= 1) ? plan(B, N, f, K, cols) : Plan{};
  info[kFits] = p.ok;
  info[kCfg] = kWarps == 8 ? 0 : 1;
  info[kC] = p.c;
  info[kSlices] = p.nslices;
  info[kSmemBytes] = p.smem;
  info[kBlocksPerSm] = p.blocks_per_sm;
  info[kron::kThreads] = kBlockThreads;  // the plan field (this unit once named its constant kThreads too: info[256])
  info[kTM] = 16 * kMI;  // the warp tile
  info[kTN] = 8 * kNI;
  info[kCost] = int64_t(p.cost);
  info[kSmemLimit] = device_facts().smem_optin;
  info[kStages] = p.stages;
}

cudaError_t forward(const Elem* x, Elem* y, const Elem* const* w, const int* f, int K, int64_t B, int64_t N,
                    int cols, cudaStream_t s) {
  if (B == 0 || N == 0) return cudaSuccess;
  const Plan p = plan(B, N, f, K, cols);
  if (!p.ok) return cudaErrorInvalidConfiguration;
  Args a{};
  a.x = x;
  a.y = y;
  a.N = N;
  a.K = K;
  a.c = p.c;
  a.nslices = p.nslices;
  a.ldA1 = p.ldA1;
  a.ldB = p.ldB;
  a.buf_elems = p.buf_elems;
  a.stages = p.stages;
  for (int k = 0; k < K; ++k) {
    a.w[k] = w[k];
    a.f[k] = f[k];
    if (f[k] % VW == 0 && aligned16(w[k])) a.wvec |= 1u << k;
  }
  const long P1 = N / f[K - 1];
  a.vec_x = P1 % VW == 0 && aligned16(x);
  a.pair_y = N % 2 == 0 && f[0] % 2 == 0 &&
             (reinterpret_cast<uintptr_t>(y) % (2 * sizeof(Elem))) == 0;
  const long blocks = B * p.nslices;
  if (blocks > 0x7fffffffL) return cudaErrorInvalidConfiguration;
  optin();
  fused_tc_kernel<<<unsigned(blocks), kBlockThreads, size_t(p.smem), s>>>(a);
  return cudaGetLastError();
}

}  // namespace tc
}  // namespace kron

// ---- what the binding calls ("kron_v3_plan@f32,0", "kron_v3_forward@bf16,1", ...) -----------------------------------
//   kron_v3_plan:    void (int64_t B, int64_t N, const int* f, int K, int cols, int64_t* info /* [kPlanFields] */)
//   kron_v3_forward: cudaError_t (const T* x, T* y, const T* const* w, const int* f, int K, int64_t B, int64_t N,
//                                 int cols, cudaStream_t)   (T: float or bf16 storage)
LAB_EXPORTS(LAB_EXPORT("kron_v3_plan", kron::tc::plan_info), LAB_EXPORT("kron_v3_forward", kron::tc::forward))
