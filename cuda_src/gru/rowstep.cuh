// gru/rowstep.cuh — the pieces of one step of the register-resident persistent kernels, shared by v3.cu (v3/v4: one
// layer a launch) and v6.cu (the layers of a stack as a wavefront in one launch). The work split they implement is
// in gru.cuh's header: a block owns Hb = kThreads/S hidden units and a slice of the batch; a unit's three rows of a
// (3H, H) weight matrix are spread over S lanes of one warp, KPT columns each, in registers for the whole sequence.
//
//   load_w      lane s's KPT columns of its unit's three rows, into registers (once per launch)
//   init_state  the block's biases and its own h (h0's rows or zeros), once per launch; zero_pad: a tile's pad columns
//   load_rows   nr rows of h (global, written during this launch by other SMs: L2-only copies) into the h tile;
//               load_rows_tagged: the same rows from the tagged exchange's words (persistent.cuh), each polled
//               until it carries this step's tag
//   dot_rows    the tile's rows times the three rows: one fp32 sum per (row, gate, unit) into ghs
//   apply_gates the gates and the state update of the chunk's rows, h_t stored in fp32 (own) and as T (out)
// All are force-inlined into the kernels: the code the compiler sees is that of one kernel body.
#pragma once

#include "persistent.cuh"

namespace gru {

// ---- cp.async (sm_80+): copies that complete asynchronously into shared memory ---------------------------------
__device__ __forceinline__ void cp_async16_cg(void* smem, const void* gmem) {  // 16 B, L2 only (coherent)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {  // 4 B; for read-only inputs
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <class T>
__device__ void load_rows(T* hs, int Kp, const T* src, int nr, int H) {
  if (!src) {  // h0 = zeros
    for (int p = threadIdx.x; p < nr * H; p += kThreads) hs[(p / H) * Kp + p % H] = from_f<T>(0.f);
    return;
  }
  constexpr int E = 16 / sizeof(T);  // elements per 16-byte copy
  if (H % E == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int cpr = H / E;
    for (int p = threadIdx.x; p < nr * cpr; p += kThreads) {
      const int r = p / cpr, c = p % cpr;
      cp_async16_cg(hs + r * Kp + c * E, src + int64_t(r) * H + c * E);
    }
  } else {  // odd hidden sizes or a misaligned h0: element loads from L2
    for (int p = threadIdx.x; p < nr * H; p += kThreads) {
      const int r = p / H, k = p % H;
      hs[r * Kp + k] = ldcg(src + int64_t(r) * H + k);
    }
  }
}

// The tagged exchange's read: nr rows of h_{t-1} (written at step t-1 with tag t) from hx into the h tile, each word
// re-read until its tag is t. A thread holds four words; every round re-reads all of its words still missing, so the
// wait after the last writer's store is one L2 round trip, not one per word. Measured on the H100 (fp32, T = 30,
// graph, against spinning on one word at a time, which paid a serial round trip for each stale word after the data
// had arrived): two batch rows a block (batch 5..8) went from 8-15% slower than the step counters to 1-2% slower;
// one row a block, 11-12% faster than the counters (was ~10%). Also tried there and slower at every batch: a
// __nanosleep of 32 or 128 ns between rounds, spinning on the first missing word alone before re-reading all, and a
// second round of loads in flight, issued 256 cycles after the first and looked at after it (L2 sampled twice a
// round trip): batch 1 65.2 -> 69.7 us, batch 8 (tagged) 84.4 -> 87.9.
template <class T>
__device__ void load_rows_tagged(T* hs, int Kp, const unsigned long long* src, int nr, int H, int t) {
  const int n = nr * H;
  const unsigned long long filler = static_cast<unsigned long long>(static_cast<unsigned>(t)) << 32;  // "arrived"
  for (int p0 = threadIdx.x; p0 < n; p0 += 4 * kThreads) {
    unsigned long long w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = p0 + i * kThreads;
      w[i] = p < n ? ld_tagged(src + p) : filler;  // the rows are contiguous in hx: word p is row p / H, unit p % H
    }
    // A word that never arrives is a bug (a writer that skipped it): trap after ~2^26 rounds (seconds) rather than
    // hang the process.
    for (int spins = 0;; ++spins) {
      bool ready = true;
#pragma unroll
      for (int i = 0; i < 4; ++i) ready &= static_cast<int>(w[i] >> 32) == t;
      if (ready) break;
      if (spins == (1 << 26)) __trap();
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (static_cast<int>(w[i] >> 32) != t) w[i] = ld_tagged(src + p0 + i * kThreads);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = p0 + i * kThreads;
      if (p < n) hs[(p / H) * Kp + p % H] = from_f<T>(__uint_as_float(static_cast<unsigned>(w[i])));
    }
  }
}

// The lanes' reduction (dot_pass): a reduce-scatter. Each of the S lanes holds NV partial sums; at every level a lane
// keeps one half of its values and sends the other half to its partner (lane ^ OFF), so the values to sum halve each
// level: NV/2 + NV/4 + ... shuffles (15 for 16 values over 16 lanes) instead of NV * log2(S) for a full butterfly (64).
// Afterwards lane s holds the sums of values [s*NV/S, (s+1)*NV/S) when S <= NV, or of value s/(S/NV) when S > NV.
template <int OFF, int N, int NV>
__device__ __forceinline__ void reduce_scatter(float (&v)[NV], int s) {
  if constexpr (N > 1) {
    const bool upper = (s & OFF) != 0;  // this lane keeps the upper half
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? v[i] : v[i + N / 2];
      const float keep = upper ? v[i + N / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
    }
    if constexpr (OFF > 1) reduce_scatter<OFF / 2, N / 2, NV>(v, s);
  } else {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);  // more lanes than values: plain butterfly
    if constexpr (OFF > 1) reduce_scatter<OFF / 2, 1, NV>(v, s);
  }
}

// Lane s's slice of unit j's three rows of W (3H, H), into registers for the whole sequence. Lane s holds columns
// c*4S + 4s + {0..3}: a warp's 16-byte reads of an h row are then contiguous and conflict-free.
template <class T, int KPT, int S>
__device__ __forceinline__ void load_w(float (&w)[3][KPT], const T* W, int j, int s, int H) {
#pragma unroll
  for (int g = 0; g < 3; ++g)
#pragma unroll
    for (int c = 0; c < KPT / 4; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = c * 4 * S + s * 4 + i;
        w[g][c * 4 + i] = (j < H && k < H) ? tof(W[(int64_t(g) * H + j) * H + k]) : 0.f;
      }
}

// 2. The block's biases [6][Hb] (b_ih r,z,n, b_hh r,z,n; zero past H) and its own h [Bb][Hb] in fp32: h0's rows
//    b0.. (nb of them), zeros past them, past H, or everywhere when h0 is nullptr.
template <class T, int Hb>
__device__ __forceinline__ void init_state(float* bias, float* hown, const T* bih, const T* bhh, const T* h0, int j0,
                                           int b0, int nb, int Bb, int H, int tid) {
  for (int p = tid; p < 6 * Hb; p += kThreads) {
    const int g = p / Hb, jj = j0 + p % Hb;
    bias[p] = jj < H ? tof((g < 3 ? bih : bhh)[(g % 3) * H + jj]) : 0.f;
  }
  for (int p = tid; p < Bb * Hb; p += kThreads) {
    const int bb = p / Hb, jj = j0 + p % Hb;
    hown[p] = (h0 && bb < nb && jj < H) ? tof(h0[int64_t(b0 + bb) * H + jj]) : 0.f;
  }
}

// Zeros in columns n..Kp-1 of a tile [rows][Kp] whose columns < n are loaded each step: the dot products run over
// all Kp columns, and 0 * garbage could be NaN.
template <class T>
__device__ __forceinline__ void zero_pad(T* tile, int rows, int Kp, int n, int tid) {
  if (Kp > n)
    for (int p = tid; p < rows * (Kp - n); p += kThreads) tile[(p / (Kp - n)) * Kp + n + p % (Kp - n)] = from_f<T>(0.f);
}

// Rows r .. r+NR-1 of the tile's nr rows (hs, row length Kp = KPT*S, zero past H; rows past nr repeat the last)
// times the unit's three rows: 3 NR FMA chains over lane s's KPT columns, then the unit's S lanes reduce the 4 NR
// values (row q, gate g at q*4 + g; g = 3 a zero pad) with a reduce-scatter (NR = 2 at S = 16: 8 shuffles, where a
// butterfly of the 6 sums took 24 shuffles and 24 adds), and the lanes left holding a sum of a row < nr store it:
// ghs[((r + q)*3 + g)*Hb + u]. v3 with the butterfly, then with this (H100, fp32, T = 30, graph, two rounds):
// batch 8 82.6-83.3 -> 81.9-82.0 us, batch 16 107.5-108.3 -> 106.3-106.5, batch 32 145.6-147.2 -> 143.5.
template <class T, int KPT, int S, int NR>
__device__ __forceinline__ void dot_pass(const float (&w)[3][KPT], const T* hs, float* ghs, int r, int nr, int s,
                                         int u) {
  constexpr int Kp = KPT * S, Hb = kThreads / S, NV = 4 * NR;
  const T* h[NR];
#pragma unroll
  for (int q = 0; q < NR; ++q) h[q] = hs + min(r + q, nr - 1) * Kp + s * 4;
  float acc[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) acc[i] = 0.f;
#pragma unroll
  for (int c = 0; c < KPT / 4; ++c) {
    float4 x[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) x[q] = ld4(h[q] + c * 4 * S);
#pragma unroll
    for (int g = 0; g < 3; ++g)
#pragma unroll
      for (int q = 0; q < NR; ++q) {
        float& y = acc[q * 4 + g];
        y = fmaf(w[g][c * 4 + 0], x[q].x, y);
        y = fmaf(w[g][c * 4 + 1], x[q].y, y);
        y = fmaf(w[g][c * 4 + 2], x[q].z, y);
        y = fmaf(w[g][c * 4 + 3], x[q].w, y);
      }
  }
  reduce_scatter<S / 2, NV, NV>(acc, s);
  if constexpr (S <= NV) {
#pragma unroll
    for (int i = 0; i < NV / S; ++i) {
      const int idx = s * (NV / S) + i, q = idx / 4, g = idx % 4;
      if (g < 3 && r + q < nr) ghs[((r + q) * 3 + g) * Hb + u] = acc[i];
    }
  } else {
    const int idx = s / (S / NV), q = idx / 4, g = idx % 4;
    if (s % (S / NV) == 0 && g < 3 && r + q < nr) ghs[((r + q) * 3 + g) * Hb + u] = acc[0];
  }
}

// The tile's nr rows times the unit's three rows, one fp32 sum per (row, gate, unit) into ghs[(r*3 + g)*Hb + u],
// Hb = kThreads/S, in passes of RB rows: v3 RB = 2 (6 FMA chains), v4 RB = 4 (12 chains: more independent work per
// shared load and per shuffle), and RB = 1 where a block owns one row (v3's and v6's rb=2 builds: a pass of two
// computed that row twice; v4 keeps its fours). One pass size a kernel: with a tail of smaller passes in the same
// kernel instead (no row computed twice anywhere), v3 gained less at batch 1 (65.5 -> 61.7 us), and v4 at batch
// 16/64 and v6 (2 layers) at batch 8/64 lost 2% (101.5 -> 103.6, 212.3 -> 216.1; 142.8 -> 146.3, 461.6 -> 470.8;
// H100, fp32, graph).
template <class T, int KPT, int S, int RB>
__device__ __forceinline__ void dot_rows(const float (&w)[3][KPT], const T* hs, float* ghs, int nr, int s, int u) {
  for (int r = 0; r < nr; r += RB) dot_pass<T, KPT, S, RB>(w, hs, ghs, r, nr, s, u);
}

// 5. Gates and the update for the chunk's nr rows (rows c0.. of the block's slice, which starts at batch row b0),
//    one thread per (row, unit): units fastest, so stores of h_t coalesce. gib: the step's x_t W_ih^T
//    [Bb][3][Hb] (no bias); ghs: dot_rows' sums; bias [6][Hb]: b_ih r,z,n, b_hh r,z,n; hown [Bb][Hb]: the block's h
//    in fp32 (the same thread owns (row, unit) at every step); out: (T, B, H), h_t stored at step t; last: (B, H),
//    h_t stored there too (h_n, at the last step), or nullptr.
//    hx: the tagged exchange's buffer of step t's parity (B, H) (persistent.cuh), or nullptr.
template <class T, int Hb>
__device__ __forceinline__ void apply_gates(const float* gib, const float* ghs, const float* bias, float* hown,
                                            T* out, int t, int B, int b0, int j0, int H, int c0, int nr, int tid,
                                            T* last, unsigned long long* hx = nullptr) {
  for (int p = tid; p < nr * Hb; p += kThreads) {
    const int uu = p % Hb, r = p / Hb, jj = j0 + uu, bb = c0 + r;
    if (jj >= H) continue;
    const float* x = gib + bb * 3 * Hb + uu;
    const float* y = ghs + r * 3 * Hb + uu;
    const float rg = sigm(x[0] + bias[uu] + y[0] + bias[3 * Hb + uu]);
    const float zg = sigm(x[Hb] + bias[Hb + uu] + y[Hb] + bias[4 * Hb + uu]);
    const float ng = tanh_acc(x[2 * Hb] + bias[2 * Hb + uu] + rg * (y[2 * Hb] + bias[5 * Hb + uu]));
    const float hp = hown[bb * Hb + uu];
    const float hn = ng + zg * (hp - ng);
    hown[bb * Hb + uu] = hn;
    const T ht = from_f<T>(hn);
    out[(int64_t(t) * B + b0 + bb) * H + jj] = ht;
    if (last) last[int64_t(b0 + bb) * H + jj] = ht;
    if (hx) st_tagged(hx + int64_t(b0 + bb) * H + jj, tof(ht), t);  // the value the readers of out would see
  }
}

}  // namespace gru

// ---- host: the split both plans make ------------------------------------------------------------------------------
namespace gru {

inline int elem_size(int dtype) { return dtype == kF32 ? 4 : dtype == kF64 ? 8 : 2; }

// How H hidden units spread over lanes and blocks: KPT columns per lane (8, 16 or 32 registers per gate row), S
// lanes per unit (a power of 2, S*KPT >= H), Hb = kThreads/S units per block, Ph blocks to cover H. False when H is
// too large to keep a unit's rows in registers (H > 1024).
struct UnitSplit {
  int kpt = 0, s = 0, hb = 0, ph = 0;
};
inline bool split_units(int H, UnitSplit* u) {
  u->kpt = H <= 64 ? 8 : H <= 256 ? 16 : H <= 1024 ? 32 : 0;
  if (!u->kpt) return false;
  const int need = (H + u->kpt - 1) / u->kpt;
  u->s = 4;
  while (u->s < need) u->s *= 2;
  u->hb = kThreads / u->s;
  u->ph = (H + u->hb - 1) / u->hb;
  return true;
}

// Rows of h per shared-memory chunk for a block of bb batch rows (at most bb), and the block's shared memory: the h
// tile and the reduced sums per chunk row, the double-buffered input projections, the block's h and the biases for
// all bb rows. 0 when not even one row fits in the opt-in limit (less the runtime's reserved 1 KB).
inline int chunk_rows(int bb, const UnitSplit& u, int esize, int optin, int* smem) {
  const int kp = u.kpt * u.s;
  const int fixed = (2 * bb * 3 * u.hb + bb * u.hb + 6 * u.hb) * 4;
  const int row = kp * esize + 3 * u.hb * 4;
  const int budget = optin - 1024;
  int bc = fixed < budget ? (budget - fixed) / row : 0;
  if (bc > bb) bc = bb;
  *smem = fixed + bc * row;
  return bc;
}

}  // namespace gru
