// gru/v7.cu — v7: v3/v4's persistent kernel with the input projection inside the launch (the ladder: gru.cuh).
// lab:variants dtype=f32,f16,bf16 rb=2,4
//
// v3 and v4 start with a cuBLAS GEMM, x (T·B, I) times W_ihᵀ, for every step's input projection, and only then
// launch the recurrence. That GEMM is a second kernel on the critical path (at batch 1 a few µs of latency plus a
// launch gap; at batch 64, strict fp32, 30 × 64 × 256 × 1536 is 1.5 GFLOP: ~48 µs next to v4's ~160 µs recurrence,
// notebook 03's profile table). Meanwhile the persistent kernel is latency-bound: after a block stores h_t it waits
// for the other blocks of its slice, its SM half idle (ncu: SM ~50% busy, stalls on the spin and the barriers).
//
// v7 adds one idea: each block computes x_{t+1} W_ihᵀ for its own batch rows and hidden units itself, during step t
// while its h_{t-1} rows are in flight from L2 — the projection of the next step does not depend on h, so it fills
// that latency instead of preceding the launch. W_ih's slice for the block's Hb units (3·Hb rows of I) sits
// in shared memory (W_hh's already fills the registers: 96 per lane at hidden 512); x_{t+1}'s first rows are
// prefetched with cp.async during step t, in a copy group of their own so the step waits only for its h. The
// recurrence itself is v3's (rb 2) or v4's (rb 4) step, unchanged.
//
// Napkin math (H100, hidden 512, input 256, fp32; Hb = 16 units a block, 32 blocks a batch slice):
//   projection a step, per block: nb rows × 3·16 outputs × 256 = 12.3 K FMA per row; the recurrence 24.6 K per row.
//   batch 1: 12 K FMA a step, ~50 ns of one SM's issue: the GEMM and its launch gap are what v7 removes.
//   batch 64 (16 rows a block): 197 K FMA, ~0.9 µs at 128 FMA/clk — against a ~5 µs step, inside the wait.
//   batch 256 (64 rows a block): 0.8 M FMA, ~3.5 µs a step of FMA issue alone, about what the wait leaves: the
//   GEMM (on all SMs, before the launch) is then no worse, and the default keeps v4 there (gru.py).
//   shared memory: W_ih's slice 3·16·256·4 = 48 KB, an x tile of up to 32 rows (32 KB), beside v4's buffers.
// Limits: the W_ih slice and one row of x must fit beside one h row (else the plan's status 2: a large input size
// or hidden slice); then v3/v4 (or v2) run the layer.
#include "rowstep.cuh"

// cooperative_groups.h without the libcu++ headers it would pull in (as in v3.cu)
#define _CG_LIMIT_INCLUDED_DEPENDENCIES
#include <cooperative_groups.h>

namespace gru {
namespace cg = cooperative_groups;

#if defined(LAB_VARIANT_rb_2)
constexpr int kRB = 2;
#elif defined(LAB_VARIANT_rb_4)
constexpr int kRB = 4;
#else
#error "gru/v7.cu is built per variant (// lab:variants above): -DLAB_VARIANT_rb_2 or _rb_4"
#endif

struct V7Args {
  const void* x;     // (T, B, I) the layer's input
  const void* w_ih;  // (3H, I)
  const void* w_hh;  // (3H, H)
  const void* b_ih;  // (3H)
  const void* b_hh;  // (3H)
  const void* h0;    // (B, H) or nullptr (zeros)
  void* out;         // (T, B, H)
  void* h_n;         // (B, H): the last step's h, or nullptr
  int T, B, H, I;
  int Ph;            // hidden-unit partitions (block index % Ph)
  int Bb;            // batch rows per block
  int BC;            // rows of h per shared-memory chunk (BC <= Bb)
  int XC;            // rows of x per shared-memory chunk (XC <= Bb)
  int Ip;            // I padded to a multiple of 4·S (the x tile's and the W_ih slice's row length)
  int* counters;     // per batch slice, zeroed (persistent.cuh); nullptr: grid.sync() each step
};

template <class T, int KPT, int S, int RB>
__global__ void __launch_bounds__(kThreads, 1) gru_v7_kernel(const V7Args a) {
  constexpr int Kp = KPT * S;
  constexpr int Hb = kThreads / S;
  extern __shared__ float4 smem4[];
  const int H = a.H, B = a.B, Bb = a.Bb, BC = a.BC, XC = a.XC, I = a.I, Ip = a.Ip;
  const int j0 = (blockIdx.x % a.Ph) * Hb, b0 = (blockIdx.x / a.Ph) * Bb;
  const int tid = threadIdx.x, s = tid % S, u = tid / S, j = j0 + u;
  const int nb = min(Bb, B - b0);

  T* hs = reinterpret_cast<T*>(smem4);                                   // [BC][Kp]  h_{t-1} rows
  float* ghs = reinterpret_cast<float*>(hs + int64_t(BC) * Kp);          // [BC][3][Hb] reduced h W_hh^T
  float* gis = ghs + BC * 3 * Hb;                                        // [2][Bb][3][Hb] x W_ih^T: steps t, t+1
  float* hown = gis + 2 * Bb * 3 * Hb;                                   // [Bb][Hb] this block's h, fp32
  float* bias = hown + Bb * Hb;                                          // [6][Hb]
  T* wis = reinterpret_cast<T*>(bias + 6 * Hb);                          // [Hb][3][Ip] W_ih rows of the block's units
  T* xs = wis + Hb * 3 * Ip;                                             // [XC][Ip] rows of x

  const T* X = static_cast<const T*>(a.x);
  const T* Wi = static_cast<const T*>(a.w_ih);
  const T* h0 = static_cast<const T*>(a.h0);
  T* out = static_cast<T*>(a.out);

  // 1. W_hh's rows into registers (v3's step 1); W_ih's rows of the block's units into shared memory (in flight
  //    while the registers fill).
  load_wslice<T>(wis, Wi, j0, Hb, H, I, Ip);
  float w[3][KPT];
  load_w<T, KPT, S>(w, static_cast<const T*>(a.w_hh), j, s, H);
  // 2. Biases, the block's own h, the pad columns of both tiles.
  init_state<T, Hb>(bias, hown, static_cast<const T*>(a.b_ih), static_cast<const T*>(a.b_hh), h0, j0, b0, nb, Bb, H,
                    tid);
  zero_pad<T>(hs, BC, Kp, H, tid);
  zero_pad<T>(xs, XC, Ip, I, tid);

  // 3'. Step tt's projection, x rows in chunks of XC; the first chunk of a step after the first was prefetched
  //     into xs (and waited for) by the caller. Ends at a barrier: xs free, the sums in gis[tt & 1] visible to all.
  auto project = [&](int tt) {
    float* gib = gis + (tt & 1) * Bb * 3 * Hb;
    for (int c0 = 0; c0 < nb; c0 += XC) {
      const int nr = min(XC, nb - c0);
      if (tt == 0 || c0 > 0) {
        load_rows<T>(xs, Ip, X + (int64_t(tt) * B + b0 + c0) * I, nr, I);
        cp_async_wait_all();
        __syncthreads();
      }
      proj_rows<T, S>(wis, xs, gib + c0 * 3 * Hb, nr, Ip, s, u);
      __syncthreads();
    }
  };
  project(0);
  if (a.T > 1) {  // x_1's first rows
    load_rows<T>(xs, Ip, X + (int64_t(B) + b0) * I, min(XC, nb), I);
    cp_async_commit();
  }

  for (int t = 0; t < a.T; ++t) {
    const float* gib = gis + (t & 1) * Bb * 3 * Hb;
    if (t > 0) {
      if (a.counters)
        slice_wait(a.counters + blockIdx.x / a.Ph, a.Ph * t);
      else
        cg::this_grid().sync();
    }
    const T* hsrc = t == 0 ? h0 : out + int64_t(t - 1) * B * H;
    for (int c0 = 0; c0 < nb; c0 += BC) {  // 4./5. v3's (rb 2) or v4's (rb 4) step
      const int nr = min(BC, nb - c0);
      load_rows<T>(hs, Kp, hsrc ? hsrc + int64_t(b0 + c0) * H : nullptr, nr, H);
      cp_async_commit();
      if (c0 == 0 && t + 1 < a.T) {
        // 3'. While h_{t-1} comes from L2: the next step's projection (x_{t+1}, prefetched a step ago: the older
        //     copy group, so waiting for it leaves the h copies in flight), then x_{t+2}'s prefetch behind them.
        cp_async_wait_group<1>();
        __syncthreads();
        project(t + 1);
        if (t + 2 < a.T) {
          load_rows<T>(xs, Ip, X + (int64_t(t + 2) * B + b0) * I, min(XC, nb), I);
          cp_async_commit();
          cp_async_wait_group<1>();  // the h copies (x_{t+2}'s may stay in flight)
        } else {
          cp_async_wait_group<0>();
        }
      } else {
        cp_async_wait_group<0>();
      }
      __syncthreads();
      dot_rows<T, KPT, S, RB>(w, hs, ghs, nr, s, u);
      __syncthreads();
      apply_gates<T, Hb>(gib, ghs, bias, hown, out, t, B, b0, j0, H, c0, nr, tid,
                         t + 1 == a.T ? static_cast<T*>(a.h_n) : nullptr);
    }
    if (a.counters && t + 1 < a.T) slice_arrive(a.counters + blockIdx.x / a.Ph);  // h_t stored: count it
  }
}

// ---- the v7 plan: v3's split, plus the W_ih slice and the x tile in shared memory ----------------------------------
struct Plan7 {
  int kpt = 0, s = 0, hb = 0, ph = 0, pb = 0, bb = 0, bc = 0, smem = 0, blocks = 0, max_coresident = 0, ip = 0, xc = 0;
  int status = 0;  // as v3's Plan: 0 ok; 1 hidden too large; 2 does not fit shared memory; 3 not co-resident;
                   // 4 no cooperative launch; 5 a CUDA error while asking
};

template <class T, int KPT, int S, int RB>
const void* v7_kernel() { return reinterpret_cast<const void*>(&gru_v7_kernel<T, KPT, S, RB>); }

template <class T, int RB>
const void* v7_kernel_for(int kpt, int s) {
  if (kpt == 8) return s == 4 ? v7_kernel<T, 8, 4, RB>() : v7_kernel<T, 8, 8, RB>();
  if (kpt == 16) return s == 8 ? v7_kernel<T, 16, 8, RB>() : v7_kernel<T, 16, 16, RB>();
  return s == 16 ? v7_kernel<T, 32, 16, RB>() : v7_kernel<T, 32, 32, RB>();
}

inline Plan7 make_plan7(int B, int H, int I) {
  Plan7 p;
  UnitSplit us;
  if (!split_units(H, &us)) {
    p.status = 1;
    return p;
  }
  p.kpt = us.kpt, p.s = us.s, p.hb = us.hb, p.ph = us.ph;
  p.ip = (I + 4 * us.s - 1) / (4 * us.s) * (4 * us.s);
  int optin = 0;
  p.status = cooperative_device(&optin);
  if (p.status) return p;
  const int sms = lab::sm_count();
  const int max_pb = sms / p.ph;
  if (max_pb < 1) {
    p.max_coresident = sms;
    p.blocks = p.ph;
    p.status = 3;
    return p;
  }
  p.pb = B < max_pb ? B : max_pb;
  p.bb = (B + p.pb - 1) / p.pb;
  p.pb = (B + p.bb - 1) / p.bb;
  p.blocks = p.ph * p.pb;
  // The W_ih slice, then an x tile of up to 32 rows (all of a block's rows up to batch 128 at hidden 512), halved
  // until at least one h row fits beside them.
  const int es = elem_size(kDtype);
  const int64_t wbytes = int64_t(p.hb) * 3 * p.ip * es;
  for (p.xc = p.bb < 32 ? p.bb : 32;; p.xc = (p.xc + 1) / 2) {
    const int64_t extra = wbytes + int64_t(p.xc) * p.ip * es;
    if (extra < optin) {
      p.bc = chunk_rows(p.bb, us, es, optin, &p.smem, int(extra));
      if (p.bc >= 1) break;
    }
    if (p.xc == 1) {
      p.status = 2;
      return p;
    }
  }
  p.status = coresident_blocks(v7_kernel_for<VT, kRB>(p.kpt, p.s), p.smem, &p.max_coresident);
  if (p.status == 0 && p.blocks > p.max_coresident) p.status = 3;
  return p;
}

}  // namespace gru

// =================================================================================================================
// Launchers (called from cpp_src/gru/gru.cpp), one pair per variant: "gru_v7_plan@f32,2" ... "gru_v7@bf16,4"; the
// binding takes rb 4 where a block has kV6Rb4Rows rows or more, as for v6.
// =================================================================================================================
// info: kpt, s, hb, ph, pb, bb, bc, smem, blocks, max_coresident, ip, xc. Returns the plan's status (0 = it fits).
int gru_v7_plan(int B, int H, int I, int* info) {
  const gru::Plan7 p = gru::make_plan7(B, H, I);
  const int v[12] = {p.kpt, p.s, p.hb, p.ph, p.pb, p.bb, p.bc, p.smem, p.blocks, p.max_coresident, p.ip, p.xc};
  for (int i = 0; i < 12; ++i) info[i] = v[i];
  return p.status;
}

// x: (T, B, I) contiguous, the layer's input; counters: at least batch ints, zeroed; nullptr: grid.sync() each step.
cudaError_t gru_v7(const void* x, const void* w_ih, const void* w_hh, const void* b_ih, const void* b_hh,
                   const void* h0, void* out, void* h_n, int T, int B, int H, int I, int* counters,
                   cudaStream_t stream) {
  using namespace gru;
  if (T == 0 || B == 0) return cudaSuccess;
  const Plan7 p = make_plan7(B, H, I);
  if (p.status == 3) return cudaErrorCooperativeLaunchTooLarge;
  if (p.status) return cudaErrorInvalidConfiguration;
  V7Args a{x, w_ih, w_hh, b_ih, b_hh, h0, out, h_n, T, B, H, I, p.ph, p.bb, p.bc, p.xc, p.ip, counters};
  void* args[] = {&a};
  return launch_cooperative(v7_kernel_for<VT, kRB>(p.kpt, p.s), p.blocks, p.smem, stream, args);
}

LAB_EXPORTS(LAB_EXPORT("gru_v7_plan", gru_v7_plan), LAB_EXPORT("gru_v7", gru_v7))
