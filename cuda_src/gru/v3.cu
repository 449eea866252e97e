// gru/v3.cu — v3 and v4: the persistent kernel, its plan and its launcher (the ladder and the work split: gru.cuh).
// lab:variants dtype=f32,f16,bf16 rb=1,2,4
//
// Built once per variant, so one build instantiates the KPT x S configurations (6 kernels) of one storage type and
// one RB: rb=2 is v3 (rows in pairs), rb=1 is v3 where a block owns one batch row, rb=4 is v4 (fours). The binding
// picks "gru_v3_plan@<dtype>,<rb>" / "gru_v3@<dtype>,<rb>" by version, dtype and the plan's rows per block. The
// plan asks the occupancy API about the kernel it would launch, so plan and launch live here together.
//
// The input projection (x W_ih^T for all T steps) is a GEMM before the launch (cpp_src/gru/gru.cpp: cuBLAS, or
// proj.cu's kernel for fp32 with T*B <= 128, which also zeroes the step counters). Nsight
// Compute at batch 256, fp32: that GEMM, the same cuBLAS kernel cuDNN runs for its own projection, is about a fifth
// of the time; the recurrence keeps the SMs about 60% busy with no dominant stall (not_selected, short_scoreboard
// and wait about equal, one block of 8 warps per SM).
// Tried and taken out: the projection inside this launch (v7, three designs, commits 332c336..b31fc0d). Each block
// computed x W_ih^T for its own rows and units from a W_ih slice in shared memory, after its step's arrival or while
// its h rows were in flight; it was slower than the GEMM before the launch at every batch (1..256) and dtype timed.
// Under ncu at batch 64 the kernel's warp cycles per issued instruction did not move: no idle issue slots to fill,
// so the projection's instructions (more per FMA than cuBLAS's: its weights come from shared memory) added at the
// step's own rate; at batch 1 they lengthened every step's latency chain.
// Also tried and taken out: twice the warps for the same work, 512 threads a block (KPT 16 x S 32 at hidden 512, 128
// registers, no spills: 16 warps an SM to hide the latencies ncu reports). Slower at every batch timed on the H100
// (T = 30, graph): fp32 v4 batch 64 213.0 -> 225.2 us, batch 256 674.3 -> 686.5, v3 batch 1 65.7 -> 68.8; bf16 v4
// batch 64 173.4 -> 179.2. (Not profiled further; the candidates: a fifth shuffle level per pass, and half the FMAs
// per loop and per shared load.)
// What the fp32 goals missed at batch 8 and 256 are made of (notebook 03 prints it per run): the persistent kernel
// alone is ahead of the goal at both; the kernels before it (cuBLAS's projection GEMM, the fill) and the launch gaps
// are the margin. Moving that projection onto tensor cores at fp32 accuracy (3xTF32: operands split into a TF32 high
// part and the remainder, three products kept) was measured and not taken (lab/studies/gru.py; notebook 03 prints
// it): at batch 256 its fastest form, one TF32 GEMM with K tripled, brings the encoder to 1.5x only if the split pass
// is free (that pass moves ~38 MB: ~9 us at copy bandwidth), and its error against float64 is an order of magnitude
// above the fp32 GEMM's (the small products share the tensor cores' accumulator with the large one); three TF32 GEMMs
// accumulated keep fp32's accuracy but save too little of the projection's time.
//
// The exchange between steps (persistent.cuh), chosen by the binding per the plan: where a block owns one batch row
// (batch <= 4 at hidden 512) the tagged h words, each polled until it carries the step's tag; above, the
// per-batch-slice step counters (a release add after the step's stores, an acquire spin before the next step's
// loads); grid_sync: one grid.sync() a step. The three give the same bits. Measured on the H100 (fp32, T = 30,
// graph, with the reader's all-words rounds: rowstep.cuh): tagged 11-12% faster than the counters at one row a block
// (batch 1..4), 1-2% slower at two (batch 5..8), 11-17% slower at batch 12..16, 1.4x at 32, 1.7-2x at 64..256
// (not profiled; there a thread reads its words in several rounds of four, one after another).
#include "rowstep.cuh"

// cooperative_groups.h without the libcu++ headers it would pull in (cuda/std/type_traits, cuda/atomic): the unit
// needs only this_grid().sync(), and those headers were ~2.2 of this unit's ~5 s nvcc run on the 2-core machine.
// The generated code is the same: cuobjdump -sass of all six variants is byte-identical with and without it.
#define _CG_LIMIT_INCLUDED_DEPENDENCIES
#include <cooperative_groups.h>

namespace gru {
namespace cg = cooperative_groups;

// This build's variant: the storage type VT of the kernels (persistent.cuh) and the rows per pass RB.
#if defined(LAB_VARIANT_rb_1)
constexpr int kRB = 1;
#elif defined(LAB_VARIANT_rb_2)
constexpr int kRB = 2;
#elif defined(LAB_VARIANT_rb_4)
constexpr int kRB = 4;
#else
#error "gru/v3.cu is built per variant (// lab:variants above): -DLAB_VARIANT_rb_1, _rb_2 or _rb_4"
#endif

// =================================================================================================================
// v3: the persistent kernel (see gru.cuh for the work split). Template: storage type T, KPT columns of W_hh per
// lane, S lanes per hidden unit (S*KPT >= H), Hb = kThreads/S units per block.
// =================================================================================================================
struct V3Args {
  const float* gi;  // (T, B, 3H) x_t W_ih^T, fp32, no bias
  const void* w_hh;  // (3H, H)
  const void* b_ih;  // (3H)
  const void* b_hh;  // (3H)
  const void* h0;    // (B, H) or nullptr (zeros)
  void* out;         // (T, B, H)
  void* h_n;         // (B, H): the last step's h, or nullptr
  int T, B, H;
  int Ph;            // hidden-unit partitions (block index % Ph)
  int Bb;            // batch rows per block
  int BC;            // batch rows per shared-memory chunk (BC <= Bb)
  int* counters;     // per batch slice (block index / Ph), zeroed before the launch: slice_wait / slice_arrive
                     // (persistent.cuh); nullptr: one grid-wide barrier a step (cooperative_groups grid.sync())
  unsigned long long* hx;  // (2, B, H) zeroed: the tagged exchange (persistent.cuh), in place of counters and
                           // grid.sync(); nullptr: not used
};

template <class T, int KPT, int S, int RB>
__global__ void __launch_bounds__(kThreads, 1) gru_v3_kernel(const V3Args a) {
  static_assert(KPT % 4 == 0 && S >= 4 && S <= 32 && (S & (S - 1)) == 0, "KPT multiple of 4, S a power of 2");
  static_assert(RB == 1 || RB == 2 || RB == 4, "v3 takes rows in pairs, v4 in fours, either one where it has one");
  constexpr int Kp = KPT * S;  // padded row length of the h tile (columns >= H are zero)
  constexpr int Hb = kThreads / S;
  extern __shared__ float4 smem4[];
  const int H = a.H, B = a.B, Bb = a.Bb, BC = a.BC;
  const int j0 = (blockIdx.x % a.Ph) * Hb, b0 = (blockIdx.x / a.Ph) * Bb;
  const int tid = threadIdx.x, s = tid % S, u = tid / S, j = j0 + u;
  const int nb = min(Bb, B - b0);  // this block's batch rows (the plan makes every block's slice non-empty)

  T* hs = reinterpret_cast<T*>(smem4);                                   // [BC][Kp]  h_{t-1} rows
  float* ghs = reinterpret_cast<float*>(hs + int64_t(BC) * Kp);          // [BC][3][Hb] reduced h W_hh^T
  float* gis = ghs + BC * 3 * Hb;                                        // [2][Bb][3][Hb] x W_ih^T, double-buffered
  float* hown = gis + 2 * Bb * 3 * Hb;                                   // [Bb][Hb] this block's h, fp32
  float* bias = hown + Bb * Hb;                                          // [6][Hb] b_ih r,z,n, b_hh r,z,n

  const T* W = static_cast<const T*>(a.w_hh);
  const T* bih = static_cast<const T*>(a.b_ih);
  const T* bhh = static_cast<const T*>(a.b_hh);
  const T* h0 = static_cast<const T*>(a.h0);
  T* out = static_cast<T*>(a.out);

  // 1. This lane's slice of its unit's three W_hh rows, into registers for the whole sequence. Lane s holds columns
  //    c*4S + 4s + {0..3}: a warp's 16-byte reads of an h row are then contiguous and conflict-free.
  float w[3][KPT];
  load_w<T, KPT, S>(w, W, j, s, H);
  // 2. Biases, the block's own h (fp32), and zeros in the pad columns of the h tile.
  init_state<T, Hb>(bias, hown, bih, bhh, h0, j0, b0, nb, Bb, H, tid);
  zero_pad<T>(hs, BC, Kp, H, tid);
  // Launched early (behind proj.cu, whose output gi and zeroed exchange state are read from here on), the steps
  // above overlapped the projection's tail: W_hh (fp32: 3 MB across the blocks) was loading while it ran.
  wait_for_prior_grid();

  for (int t = 0; t < a.T; ++t) {
    // 3. Prefetch this step's input projections: independent of h, so they are in flight across the barrier.
    float* gib = gis + (t & 1) * Bb * 3 * Hb;
    const float* gsrc = a.gi + int64_t(t) * B * 3 * H;
    for (int p = tid; p < nb * 3 * Hb; p += kThreads) {
      const int uu = p % Hb, g = (p / Hb) % 3, bb = p / (3 * Hb);
      if (j0 + uu < H) cp_async4(gib + p, gsrc + (int64_t(b0 + bb) * 3 + g) * H + j0 + uu);
    }
    if (t > 0 && !a.hx) {  // h_{t-1} of this block's rows is written: by its slice's blocks, or by every block
      if (a.counters)
        slice_wait(a.counters + blockIdx.x / a.Ph, a.Ph * t);
      else
        cg::this_grid().sync();
    }
    const T* hsrc = t == 0 ? h0 : out + int64_t(t - 1) * B * H;

    for (int c0 = 0; c0 < nb; c0 += BC) {
      const int nr = min(BC, nb - c0);
      if (a.hx && t > 0)
        load_rows_tagged<T>(hs, Kp, a.hx + (int64_t((t - 1) & 1) * B + b0 + c0) * H, nr, H, t);
      else
        load_rows<T>(hs, Kp, hsrc ? hsrc + int64_t(b0 + c0) * H : nullptr, nr, H);
      cp_async_wait_all();
      __syncthreads();  // the h tile (and the prefetched gi) visible to all

      dot_rows<T, KPT, S, RB>(w, hs, ghs, nr, s, u);  // 4. (v4: 4'.) h W_hh^T into ghs
      __syncthreads();  // all sums of the chunk stored

      apply_gates<T, Hb>(gib, ghs, bias, hown, out, t, B, b0, j0, H, c0, nr, tid,  // 5.
                         t + 1 == a.T ? static_cast<T*>(a.h_n) : nullptr,
                         a.hx ? a.hx + int64_t(t & 1) * B * H : nullptr);
      // The next chunk's load overwrites hs (read only before the barrier above); its __syncthreads orders the
      // gate phase's reads of ghs before the next dot phase rewrites them.
    }
    if (a.counters && t + 1 < a.T) slice_arrive(a.counters + blockIdx.x / a.Ph);  // h_t stored: count it
  }
}

// ---- the v3 plan: how the work is split, and whether it fits ----------------------------------------------------
struct Plan {
  int kpt = 0, s = 0, hb = 0, ph = 0, pb = 0, bb = 0, bc = 0, smem = 0, blocks = 0, max_coresident = 0;
  int status = 0;  // 0 ok; 1 hidden too large; 2 batch slice does not fit shared memory; 3 not co-resident;
                   // 4 no cooperative launch on this device; 5 a CUDA error while asking
};

template <class T, int KPT, int S, int RB>
const void* v3_kernel() { return reinterpret_cast<const void*>(&gru_v3_kernel<T, KPT, S, RB>); }

template <class T, int RB>
const void* v3_kernel_for(int kpt, int s) {
  if (kpt == 8) return s == 4 ? v3_kernel<T, 8, 4, RB>() : v3_kernel<T, 8, 8, RB>();
  if (kpt == 16) return s == 8 ? v3_kernel<T, 16, 8, RB>() : v3_kernel<T, 16, 16, RB>();
  return s == 16 ? v3_kernel<T, 32, 16, RB>() : v3_kernel<T, 32, 32, RB>();
}

// rb=1: passes of one row, which v3 runs where a block owns one (batch 1..4 at hidden 512: a pass of two computed
// that row twice). H100, fp32, T = 30, graph, L2 flushed, two rounds: batch 1 65.2-65.6 -> 59.1 us, batch 3
// 69.1-69.7 -> 62.9-63.0, batch 4 72.1-72.8 -> 66.0-66.1 (measured as 6 more kernels in the rb=2 unit, 04ade4a; a
// unit of its own since, so a one-line edit of this file waits for units of 6 kernels: 9.9 s on the H100 machine
// with 12 in one unit). v4 keeps its fours (the rung it is; v3 is the default there).

// version 3: rows in pairs (one at a time where a block owns one); version 4: rows in fours. A variant build holds
// the kernels of one (dtype, RB): choosing the version and dtype is the binding's choice of variant name.
inline Plan make_plan(int B, int H) {
  Plan p;
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
  const int max_pb = sms / p.ph;  // one block per SM
  if (max_pb < 1) {
    p.max_coresident = sms;
    p.blocks = p.ph;
    p.status = 3;
    return p;
  }
  p.pb = B < max_pb ? B : max_pb;
  p.bb = (B + p.pb - 1) / p.pb;
  p.pb = (B + p.bb - 1) / p.bb;  // no block without rows
  p.blocks = p.ph * p.pb;
  p.bc = chunk_rows(p.bb, us, elem_size(kDtype), optin, &p.smem);
  if (p.bc < 1) {
    p.status = 2;
    return p;
  }
  p.status = coresident_blocks(v3_kernel_for<VT, kRB>(p.kpt, p.s), p.smem, &p.max_coresident);
  if (p.status == 0 && p.blocks > p.max_coresident) p.status = 3;
  return p;
}

}  // namespace gru

// =================================================================================================================
// Launchers (called from cpp_src/gru/gru.cpp), one pair per variant: "gru_v3_plan@f32,2" ... "gru_v3@bf16,4"
// (rb 2 = version 3, rb 4 = version 4). The variant fixes the dtype (float32, float16 or bfloat16); gi is float.
// =================================================================================================================
// info: kpt, s, hb, ph, pb, bb, bc, smem, blocks, max_coresident. Returns the plan's status (0 = it fits).
// v3 and v4 have the same split; v4's kernel differs only in its dot-product phase.
int gru_v3_plan(int B, int H, int* info) {
  const gru::Plan p = gru::make_plan(B, H);
  const int v[10] = {p.kpt, p.s, p.hb, p.ph, p.pb, p.bb, p.bc, p.smem, p.blocks, p.max_coresident};
  for (int i = 0; i < 10; ++i) info[i] = v[i];
  return p.status;
}

// counters: at least batch ints, zeroed (the per-slice step counts); hx: (2, B, H) 64-bit words, zeroed (the tagged
// exchange); both nullptr: grid.sync() each step. h_n: (B, H), the last step's h (written by the kernel: no copy
// after it), or nullptr. early: the kernel before this launch in the stream is proj.cu's, which wrote gi and zeroed
// the exchange state: launch with programmatic dependent launch (cooperative.cuh). Measured on the H100 (fp32,
// hidden 512, T = 30, graph): batch 1 71.2 -> 66.7 us, batch 4 74.9 -> 74.0 (its 120 rows of projection fill the
// SMs, so little of the launch overlaps). Tried and taken out: early behind cuBLAS's projection too, the fill replaced
// by a zeroing kernel of proj.cu's that lets the launch start (commit e4d65d9): within 0.5 us at fp32 batch 8..256
// (b8 86.1 -> 85.7, b256 674.3 -> 673.6), bf16 batch 8 77.0 -> 75.4: not worth a kernel of its own.
cudaError_t gru_v3(const float* gi, const void* w_hh, const void* b_ih, const void* b_hh, const void* h0, void* out,
                   void* h_n, int T, int B, int H, int* counters, unsigned long long* hx, bool early,
                   cudaStream_t stream) {
  using namespace gru;
  if (T == 0 || B == 0) return cudaSuccess;
  const Plan p = make_plan(B, H);
  if (p.status == 3) return cudaErrorCooperativeLaunchTooLarge;
  if (p.status) return cudaErrorInvalidConfiguration;
  V3Args a{gi, w_hh, b_ih, b_hh, h0, out, h_n, T, B, H, p.ph, p.bb, p.bc, counters, hx};
  void* args[] = {&a};
  // cooperative: the blocks of a slice wait for each other (the counters) or all of them do (grid.sync())
  return launch_cooperative(v3_kernel_for<VT, kRB>(p.kpt, p.s), p.blocks, p.smem, stream, args, early);
}

LAB_EXPORTS(LAB_EXPORT("gru_v3_plan", gru_v3_plan), LAB_EXPORT("gru_v3", gru_v3))
