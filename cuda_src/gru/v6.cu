// gru/v6.cu — v6: the layers of a GRU stack as a wavefront in one persistent launch (the ladder: gru.cuh).
// lab:variants dtype=f32,f16,bf16 rb=1,2,4
//
// v3 runs a stack layer after layer: a launch per layer, and before each a cuBLAS GEMM for that layer's input
// projection (which needs the whole output sequence of the layer below). At small batch a layer's launch fills 32
// of the 132 SMs (H = 512: 32 blocks of 16 units) and each of its T steps is latency: an L2 round trip, the FMA
// chains, the exchange. v6 adds one idea: run the layers at the same time, layer l at step t while layer l-1 is at
// step t+1 or later — a wavefront — so L layers cost about T + 2(L-1) step latencies instead of L·T.
//
// Roles. A launch of Lw layers has 2·Lw - 1 roles of Ph·Pb blocks each (Ph blocks cover the hidden units, Pb slices
// cover the batch, as in v3), in this order:
//     q = 0: layer 0's recurrence      (its input projection x W_ih^T: one GEMM before the launch, as in v3)
//     q = 1: layer 1's input projection h0_t W_ih1^T, t = 0..T-1   (h0_t: layer 0's output at step t)
//     q = 2: layer 1's recurrence
//     q = 3: layer 2's input projection, q = 4: layer 2's recurrence, ...
// A projection block is a v3 block without the gates: the same register-resident rows (of W_ih instead of W_hh,
// (3H, H) for every layer above the first), the same dot_rows, and it writes the three sums per (row, unit) to a
// (T, B, 3H) fp32 buffer — the layout the GEMM writes for layer 0 — that the recurrence above reads. W_ih and W_hh
// of one layer do not fit one block's registers together (2 × 96 at H = 512), hence two roles.
//
// Dependencies (step counters as v3's, persistent.cuh; counts only grow):
//     recurrence q, step t:  its own slice at step t-1 (h_{t-1}), and for q > 0 the projection block of its units
//                            at step t (gi_t)
//     projection q, step t:  the recurrence q-1 of its slice at step t (the layer below's h_t)
// A recurrence slice shares one counter, as in v3: its Ph blocks wait for each other every step, so no block can
// count step t+1 before all counted step t, and a count of Ph·(t+1) means "every block finished step t". Projection
// blocks never wait for each other, so a shared count would not mean that (one block at step t+2, another still at
// step t: the count reads Ph·(t+1) too early — compute-sanitizer's racecheck, which slows some blocks far more than
// others, caught exactly that in the first build): each projection block counts its own steps, and the recurrence
// block above waits for the one projection block that wrote its units' gi.
// Every wait points at a lower role or an earlier step: no cycle, and all blocks are co-resident (cooperative
// launch), so no deadlock. A role runs ahead of the one above it as far as it likes: every buffer holds all T
// steps, so nothing is overwritten. grid_sync: the same work in lockstep waves — wave w runs step w - q of role q —
// with one grid.sync() between waves (T + 2(Lw-1) waves): the same operations, the same bits, a check on the
// counters' waits.
//
// Napkin math (H = 512, T = 30, batch 1, fp32; v3 on the H100: ~70 us a layer's launch, ~2.3 us a step): two
// layers layer by layer cost 2 × (GEMM + launch) ≈ 2 × 79 us; as a wavefront 32 steps of the slowest role (the
// recurrence: the projection has no gates) plus one GEMM, ≈ 85 us if a step costs what it costs in v3 (notebook 03
// section 5c prints what the H100 measured, wavefront against layer by layer, per batch). The price:
// 3 roles × 32 blocks leave one batch slice (132 / 96), so the wavefront does Pb = 1 with all B rows per block,
// where v3 splits the batch over up to 4 slices. Where that costs more than the overlap saves (a large batch, whose
// step is FMA-bound, not latency-bound), the plan runs fewer layers per launch (config: the most layers a launch
// runs, 1..4; -1: the plan's choice), down to v3's layer-by-layer launches.
// Limits: as v3 (H <= 1024, every block co-resident), at most kMaxLayers = 4 layers a launch.
#include "rowstep.cuh"

#define _CG_LIMIT_INCLUDED_DEPENDENCIES  // as in v3.cu: this_grid().sync() without the libcu++ headers
#include <cooperative_groups.h>

#include <algorithm>

namespace gru {
namespace cg = cooperative_groups;

#if defined(LAB_VARIANT_rb_1)
constexpr int kRB = 1;
#elif defined(LAB_VARIANT_rb_2)
constexpr int kRB = 2;
#elif defined(LAB_VARIANT_rb_4)
constexpr int kRB = 4;
#else
#error "gru/v6.cu is built per variant (// lab:variants above): -DLAB_VARIANT_rb_1, _rb_2 or _rb_4"
#endif

constexpr int kMaxLayers = 4;

struct V6Args {
  const void* w_ih[kMaxLayers];  // layer l's (3H, H) input weights, l >= 1 (the projection roles' rows)
  const void* w_hh[kMaxLayers];  // (3H, H)
  const void* b_ih[kMaxLayers];  // (3H)
  const void* b_hh[kMaxLayers];  // (3H)
  const void* h0[kMaxLayers];    // (B, H) or nullptr (zeros)
  void* out[kMaxLayers];         // (T, B, H): layer l's output sequence
  void* h_n[kMaxLayers];         // (B, H): layer l's last h
  float* gi[kMaxLayers];         // (T, B, 3H) layer l's input projection, no bias: l = 0 from the GEMM before the
                                 // launch; l >= 1 written in the launch by role 2l - 1
  int L, T, B, H;
  int Ph, Pb, Bb, BC;            // blocks per role = Ph · Pb, as v3's split
  int* counters;                 // [2L - 1][Pb][Ph] steps done, zeroed: a recurrence slice counts in [q][slice][0],
                                 // a projection block in [q][slice][its unit slice]; nullptr: grid.sync()
};

__device__ __forceinline__ void spin_until(const int* counter, int target) {
  while (ld_acquire(counter) < target) {
  }
}

template <class T, int KPT, int S, int RB>
__global__ void __launch_bounds__(kThreads, 1) gru_v6_kernel(const V6Args a) {
  constexpr int Kp = KPT * S;
  constexpr int Hb = kThreads / S;
  extern __shared__ float4 smem4[];
  const int H = a.H, B = a.B, Bb = a.Bb, BC = a.BC;
  const int per_role = a.Ph * a.Pb;
  const int q = blockIdx.x / per_role, lb = blockIdx.x % per_role, slice = lb / a.Ph;
  const bool proj = q & 1;      // odd roles project the layer below's output for layer l
  const int l = (q + 1) / 2;    // the layer this role serves
  const int j0 = (lb % a.Ph) * Hb, b0 = slice * Bb;
  const int tid = threadIdx.x, s = tid % S, u = tid / S, j = j0 + u;
  const int nb = min(Bb, B - b0);

  T* hs = reinterpret_cast<T*>(smem4);                                   // [BC][Kp]  h rows
  float* ghs = reinterpret_cast<float*>(hs + int64_t(BC) * Kp);          // [BC][3][Hb] reduced sums
  float* gis = ghs + BC * 3 * Hb;                                        // [2][Bb][3][Hb] x W_ih^T, double-buffered
  float* hown = gis + 2 * Bb * 3 * Hb;                                   // [Bb][Hb] this block's h, fp32
  float* bias = hown + Bb * Hb;                                          // [6][Hb]

  const T* h0 = static_cast<const T*>(a.h0[l]);
  T* out = static_cast<T*>(a.out[l]);
  float w[3][KPT];
  load_w<T, KPT, S>(w, static_cast<const T*>(proj ? a.w_ih[l] : a.w_hh[l]), j, s, H);
  if (!proj)
    init_state<T, Hb>(bias, hown, static_cast<const T*>(a.b_ih[l]), static_cast<const T*>(a.b_hh[l]), h0, j0, b0, nb,
                      Bb, H, tid);
  zero_pad<T>(hs, BC, Kp, H, tid);

  // own: where this block counts its steps; below: what it waits for, and the count that means "step t is done"
  const int us = lb % a.Ph;
  int* own = a.counters ? a.counters + (q * a.Pb + slice) * a.Ph + (proj ? us : 0) : nullptr;
  const int* below = a.counters && q > 0 ? a.counters + ((q - 1) * a.Pb + slice) * a.Ph + (proj ? 0 : us) : nullptr;
  const int below_per_step = proj ? a.Ph : 1;
  const int steps = a.counters ? a.T : a.T + 2 * (a.L - 1);  // grid_sync: lockstep waves
  for (int it = 0; it < steps; ++it) {
    int t = it;
    if (!a.counters) {
      if (it > 0) cg::this_grid().sync();
      t = it - q;  // wave it runs step it - q of role q
      if (t < 0 || t >= a.T) continue;
    }
    if (proj) {
      // ---- projection for layer l: gi_l[t] = h_{l-1, t} W_ih_l^T ----
      if (below) {
        if (tid == 0) spin_until(below, below_per_step * (t + 1));
        __syncthreads();
      }
      const T* src = static_cast<const T*>(a.out[l - 1]) + int64_t(t) * B * H;
      float* dst = a.gi[l] + int64_t(t) * B * 3 * H;
      for (int c0 = 0; c0 < nb; c0 += BC) {
        const int nr = min(BC, nb - c0);
        load_rows<T>(hs, Kp, src + int64_t(b0 + c0) * H, nr, H);
        cp_async_wait_all();
        __syncthreads();
        dot_rows<T, KPT, S, RB>(w, hs, ghs, nr, s, u);
        __syncthreads();
        for (int p = tid; p < nr * 3 * Hb; p += kThreads) {  // ghs[(r*3 + g)*Hb + uu] -> gi row b, gate g, unit j
          const int uu = p % Hb, rg = p / Hb;
          if (j0 + uu < H) dst[(int64_t(b0 + c0) * 3 + rg) * H + j0 + uu] = ghs[p];
        }
      }
      if (own) slice_arrive(own);
      continue;
    }
    // ---- recurrence of layer l, step t (v3's step) ----
    float* gib = gis + (t & 1) * Bb * 3 * Hb;
    const float* gsrc = a.gi[l] + int64_t(t) * B * 3 * H;
    if (l == 0)  // from the GEMM: prefetch, in flight across the wait
      for (int p = tid; p < nb * 3 * Hb; p += kThreads) {
        const int uu = p % Hb, g = (p / Hb) % 3, bb = p / (3 * Hb);
        if (j0 + uu < H) cp_async4(gib + p, gsrc + (int64_t(b0 + bb) * 3 + g) * H + j0 + uu);
      }
    if (a.counters) {
      if (tid == 0) {
        if (below) spin_until(below, below_per_step * (t + 1));  // gi_l[t] written by the projection block
        if (t > 0) spin_until(own, a.Ph * t);           // h_{t-1} written by this slice's blocks
      }
      __syncthreads();
    }
    if (l > 0)  // written during this launch by other SMs: L2 loads
      for (int p = tid; p < nb * 3 * Hb; p += kThreads) {
        const int uu = p % Hb, g = (p / Hb) % 3, bb = p / (3 * Hb);
        if (j0 + uu < H) gib[p] = __ldcg(gsrc + (int64_t(b0 + bb) * 3 + g) * H + j0 + uu);
      }
    const T* hsrc = t == 0 ? h0 : out + int64_t(t - 1) * B * H;
    for (int c0 = 0; c0 < nb; c0 += BC) {
      const int nr = min(BC, nb - c0);
      load_rows<T>(hs, Kp, hsrc ? hsrc + int64_t(b0 + c0) * H : nullptr, nr, H);
      cp_async_wait_all();
      __syncthreads();  // the h tile and gi visible to all
      dot_rows<T, KPT, S, RB>(w, hs, ghs, nr, s, u);
      __syncthreads();
      apply_gates<T, Hb>(gib, ghs, bias, hown, out, t, B, b0, j0, H, c0, nr, tid,
                         t + 1 == a.T ? static_cast<T*>(a.h_n[l]) : nullptr);
    }
    // the last layer's last step has no reader; every other step has one (this slice's next step, the projection)
    if (own && (t + 1 < a.T || l + 1 < a.L)) slice_arrive(own);
  }
}

// ---- the plan ---------------------------------------------------------------------------------------------------
struct Plan6 {
  int kpt = 0, s = 0, hb = 0, ph = 0, pb = 0, bb = 0, bc = 0, smem = 0, blocks = 0, max_coresident = 0;
  int layers = 0;  // layers per launch (the first launch; a stack of L runs in ceil(L / layers) launches)
  int status = 0;  // as v3's: 0 ok; 1 hidden too large; 2 shared memory; 3 not co-resident; 4 no cooperative
                   // launch; 5 a CUDA error; 6 a bad config
};

template <class T, int KPT, int S, int RB>
const void* v6_kernel() { return reinterpret_cast<const void*>(&gru_v6_kernel<T, KPT, S, RB>); }

template <int RB>
const void* v6_kernel_rb(int kpt, int s) {
  if (kpt == 8) return s == 4 ? v6_kernel<VT, 8, 4, RB>() : v6_kernel<VT, 8, 8, RB>();
  if (kpt == 16) return s == 8 ? v6_kernel<VT, 16, 8, RB>() : v6_kernel<VT, 16, 16, RB>();
  return s == 16 ? v6_kernel<VT, 32, 16, RB>() : v6_kernel<VT, 32, 32, RB>();
}

// rb=1 (as v3.cu's): passes of one row, which the binding takes where a block owns one. H100, fp32, 2 layers,
// T = 30, graph, two rounds: batch 1 94.9-95.2 -> 88.2-88.4 us (measured as 6 more kernels in the rb=2 unit,
// 04ade4a: a one-line edit of this file then took 11.8 s on the H100 machine).
inline const void* v6_kernel_for(int kpt, int s) { return v6_kernel_rb<kRB>(kpt, s); }

// A step's time by rows per block, for choosing the layers per launch: a latency part and a part that grows with
// the rows a block multiplies (3·KPT FMAs a lane a row). Fit to the H100 sweep of this kernel (fp32, H = 512,
// T = 30, 2 layers, batch 1..128, CUDA graphs: the wavefront and one layer a launch), within ~10%.
constexpr double kStepNs = 2600.0, kRowNs = 280.0;  // kRowNs at KPT = 32
inline double step_ns(int bb, int kpt) { return kStepNs + kRowNs * bb * kpt / 32.0; }

// Layers per launch. Running lw layers as one wavefront takes T + 2(lw-1) steps instead of lw·T, but its 2·lw - 1
// roles of Ph blocks leave fewer batch slices, so more rows per block and longer steps: at H = 512 a wavefront of
// two layers has one slice where v3 has four. config -1 picks the lw (1 .. as many as fit, at most L and
// kMaxLayers) whose estimate (launches · steps · step_ns) is least: the wavefront at small batch, layer by layer
// where a step is FMA-bound; 1..4: the most that fit up to that many.
inline Plan6 make_plan6(int B, int H, int L, int T, int config) {
  Plan6 p;
  if (config != -1 && (config < 1 || config > kMaxLayers)) {
    p.status = 6;
    return p;
  }
  UnitSplit us;
  if (!split_units(H, &us)) {
    p.status = 1;
    return p;
  }
  p.kpt = us.kpt, p.s = us.s, p.hb = us.hb, p.ph = us.ph;
  int optin = 0;
  p.status = cooperative_device(&optin);
  if (p.status) return p;
  const int sms = lab::sm_count();
  int lw = L < kMaxLayers ? L : kMaxLayers;
  if (config > 0 && config < lw) lw = config;
  while (lw > 1 && (2 * lw - 1) * p.ph > sms) --lw;
  if (config == -1) {  // the cheapest lw up to the most that fit (ties: the larger)
    double best = 0;
    int pick = lw;
    for (int c = lw; c >= 1; --c) {
      const int pb = std::max(1, std::min(B, sms / ((2 * c - 1) * p.ph)));
      const int bb = (B + pb - 1) / pb;
      const double est = double((L + c - 1) / c) * (T + 2 * (c - 1)) * step_ns(bb, p.kpt);
      if (c == lw || est < best) best = est, pick = c;
    }
    lw = pick;
  }
  p.layers = lw;
  const int roles = 2 * lw - 1;
  const int max_pb = sms / (roles * p.ph);  // one block per SM
  if (max_pb < 1) {
    p.max_coresident = sms;
    p.blocks = roles * p.ph;
    p.status = 3;
    return p;
  }
  p.pb = B < max_pb ? B : max_pb;
  p.bb = (B + p.pb - 1) / p.pb;
  p.pb = (B + p.bb - 1) / p.bb;
  p.blocks = roles * p.ph * p.pb;
  p.bc = chunk_rows(p.bb, us, elem_size(kDtype), optin, &p.smem);
  if (p.bc < 1) {
    p.status = 2;
    return p;
  }
  p.status = coresident_blocks(v6_kernel_for(p.kpt, p.s), p.smem, &p.max_coresident);
  if (p.status == 0 && p.blocks > p.max_coresident) p.status = 3;
  return p;
}

}  // namespace gru

// =================================================================================================================
// Launchers (cpp_src/gru/gru.cpp): "gru_v6_plan@<dtype>,<rb>" / "gru_v6@<dtype>,<rb>".
// =================================================================================================================
// info: kpt, s, hb, ph, pb, bb, bc, smem, blocks, max_coresident, layers. Returns the plan's status (0 = it fits).
int gru_v6_plan(int B, int H, int L, int T, int config, int* info) {
  const gru::Plan6 p = gru::make_plan6(B, H, L, T, config);
  const int v[11] = {p.kpt, p.s, p.hb, p.ph, p.pb, p.bb, p.bc, p.smem, p.blocks, p.max_coresident, p.layers};
  for (int i = 0; i < 11; ++i) info[i] = v[i];
  return p.status;
}

// One launch of L consecutive layers, L = the plan's layers for (B, H, L, T, config) (the binding splits a deeper stack
// into launches the plan allows). Arrays of L pointers:
// w_ih[0] is not read (layer 0's projection is gi[0], from the GEMM); gi[l >= 1]: (T, B, 3H) float scratch; h_n[l]:
// (B, H), layer l's last h (written by the kernel).
// counters: (2L - 1) · Pb · Ph ints (the plan's batch_slices, hidden_slices), zeroed; nullptr: grid.sync() between
// waves.
cudaError_t gru_v6(int L, const void* const* w_ih, const void* const* w_hh, const void* const* b_ih,
                   const void* const* b_hh, const void* const* h0, void* const* out, void* const* h_n,
                   float* const* gi, int T, int B, int H, int config, int* counters, cudaStream_t stream) {
  using namespace gru;
  if (T == 0 || B == 0) return cudaSuccess;
  const Plan6 p = make_plan6(B, H, L, T, config);
  if (p.status == 3) return cudaErrorCooperativeLaunchTooLarge;
  if (p.status || L != p.layers) return cudaErrorInvalidConfiguration;
  V6Args a{};
  for (int l = 0; l < L; ++l) {
    a.w_ih[l] = w_ih[l], a.w_hh[l] = w_hh[l], a.b_ih[l] = b_ih[l], a.b_hh[l] = b_hh[l];
    a.h0[l] = h0[l], a.out[l] = out[l], a.h_n[l] = h_n[l], a.gi[l] = gi[l];
  }
  a.L = L, a.T = T, a.B = B, a.H = H, a.Ph = p.ph, a.Pb = p.pb, a.Bb = p.bb, a.BC = p.bc;
  a.counters = counters;
  void* args[] = {&a};
  return launch_cooperative(v6_kernel_for(p.kpt, p.s), p.blocks, p.smem, stream, args);
}

LAB_EXPORTS(LAB_EXPORT("gru_v6_plan", gru_v6_plan), LAB_EXPORT("gru_v6", gru_v6))
