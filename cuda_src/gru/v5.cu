// gru/v5.cu — v5: v3's persistent kernel with the recurrent product on tensor cores (mma.sync), its plan and its
// launcher (the ladder and v3's structure: gru.cuh).
// lab:variants dtype=f32,f16,bf16
//
// What changes from v3. v3 keeps W_hh in registers as fp32 and computes h_{t-1} W_hh^T with FP32 FMAs, whatever the
// storage type; at batch 128 a step is then ~200 MFLOP on the FMA pipe (gru.cuh's napkin math), and cuDNN's bf16
// path, on tensor cores, wins from batch 64 up. v5 does the product with mma.sync: m16n8k16 on fp16/bf16 tensors
// (the storage type is the operand type: h is already rounded to it when stored), m16n8k8 TF32 on float32 tensors
// (h and W rounded with cvt.rna; this is the `tf32` precision, compared with cuDNN with TF32 on). Accumulation, the
// gates, and the block's own h (the z * h_{t-1} term) stay fp32, as in v3.
//
// Work split. A block owns Hb = 8*WN hidden units (all three gate rows of each: the gates of a unit meet in one
// block, as in v3) and Bb batch rows; its W_hh slice (3*Hb rows x H) sits in shared memory for the whole sequence
// (v3 kept it in registers: an mma operand is read through ldmatrix from shared memory instead). The 8 warps form a
// WM x WN x WK grid: a warp computes 16 batch rows x 8 units x the 3 gates (three n8 tiles, so a lane's accumulators
// for r, z and n are the same (row, unit) pairs) over every WK-th 64-byte block of K. Batch rows go through shared
// memory in chunks of BC = 16*WM rows. Per chunk: copy h rows (L2, cp.async.cg) -> mma into fp32 accumulators ->
// the gates straight from the fragments (a lane's r, z, n accumulators are the same (row, unit) pairs; K-split warps
// first hand their partial sums to the tile's warp 0 through shared memory) -> h_t stored.
// Between steps a block waits only for the Ph blocks of its batch slice (per-slice step counters, below); the first
// design met at one grid.sync() a step (grid_sync = true keeps it, for comparison).
// The configurations (kCfgs) trade the unit slice (wide Hb: fewer blocks read each h row, so less L2 traffic, but
// more W per block) against the batch chunk and the K split (small batches: K over 8 warps keeps a step's mma
// chain short). The plan estimates each one's step time and takes the cheapest that fits; `config` forces one.
//
// Napkin math, H = 512, bf16, B = 128: a step is 2 * 128 * 1536 * 512 = 201 MFLOP, ~0.4 us at a third of the dense
// bf16 rate; each block reads its rows of h (16 rows x 1 KB at Hb = 32, Pb = 8: 2 MB a step from L2 over the chip).
// What the H100 measured instead (ncu, notebook 03 and the issue notes): a step several times that, the tensor pipe
// a few percent busy, warps stalled on the barrier and on fixed-latency dependencies. A step is a chain of
// latencies -- wait for the slice, copy h from L2, the mma chain, the gates, the stores and their fence -- with one
// block of 8 warps per SM to overlap them; arithmetic is not the bound.
//
// Fragments. h rows and W rows are stored K-contiguous with a 16-byte pad per row (row pitch an odd multiple of 16
// bytes modulo 128: the 8 row addresses of an ldmatrix phase hit distinct bank groups). One 64-byte block of K is
// two ldmatrix.x4 of A (16 rows x 32 bytes each) and one ldmatrix.x4 of B per gate (8 rows x 64 bytes); the same
// byte layout serves both element sizes: 32 bytes of K are one k16 step of fp16/bf16 or one k8 step of TF32 (an
// fp32 word is two b16 halves: ldmatrix hands lane (g, t) word t of row g, the TF32 fragment's element).
#include "lab_gemm.cuh"
#include "persistent.cuh"

#define _CG_LIMIT_INCLUDED_DEPENDENCIES  // see v3.cu
#include <cooperative_groups.h>

namespace gru {
namespace cg = cooperative_groups;


// The warp grids: WM warps along batch rows (16 each), WN along hidden units (8 each), WK along K. WM*WN*WK = 8.
struct Cfg { int wm, wn, wk; };
constexpr int kNumCfgs = 8;
constexpr Cfg kCfgs[kNumCfgs] = {{1, 1, 8}, {1, 2, 4}, {1, 4, 2}, {1, 8, 1},
                                 {2, 2, 2}, {2, 4, 1}, {4, 2, 1}, {8, 1, 1}};

struct V5Args {
  const float* gi;   // (T, B, 3H) x_t W_ih^T, fp32, no bias
  const void* w_hh;  // (3H, H)
  const void* b_ih;  // (3H)
  const void* b_hh;  // (3H)
  const void* h0;    // (B, H) or nullptr (zeros)
  void* out;         // (T, B, H)
  int T, B, H;
  int Kp, ld;        // K padded to 64 bytes; row pitch of the h and W tiles in elements (Kp + 16 bytes)
  int Ph, Bb;        // hidden-unit slices (block index % Ph), batch rows per block
  int wm, wn, wk;    // the warp grid (kCfgs)
  int gi_bufs;       // 2: the input projections double-buffered (prefetched across the barrier); 1 where 2 do not fit
  int* counters;     // per batch slice, zeroed before the launch: the slice's blocks count finished steps here;
                     // nullptr: one grid-wide barrier a step instead (cooperative_groups grid.sync())
};

// The step's exchange between blocks: slice_wait / slice_arrive (persistent.cuh), or grid.sync().

// The mma of the storage type on one 32-byte step of K: a = 16 rows x 32 B of h, (b0, b1) = 8 W rows x 32 B.
__device__ __forceinline__ void mma_step(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float) {
  lab::mma_tf32_16x8x8(c, a, b0, b1);
}
__device__ __forceinline__ void mma_step(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, __half) {
  lab::mma_f16_16x8x16(c, a, b0, b1);
}
__device__ __forceinline__ void mma_step(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                         __nv_bfloat16) {
  lab::mma_bf16_16x8x16(c, a, b0, b1);
}

// W_hh as the mma reads it: TF32-rounded for float32 (once, here), the 16-bit types as stored.
__device__ __forceinline__ float w_operand(float v) { return __uint_as_float(lab::round_tf32(v)); }
__device__ __forceinline__ __half w_operand(__half v) { return v; }
__device__ __forceinline__ __nv_bfloat16 w_operand(__nv_bfloat16 v) { return v; }


// Two adjacent elements of a row: one 4- or 8-byte store where the pair is aligned and whole, else element stores.
__device__ __forceinline__ void store2(float* p, float a, float b, bool pair, bool second) {
  if (pair) *reinterpret_cast<float2*>(p) = make_float2(a, b);
  else { p[0] = a; if (second) p[1] = b; }
}
__device__ __forceinline__ void store2(__half* p, float a, float b, bool pair, bool second) {
  if (pair) *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  else { p[0] = __float2half_rn(a); if (second) p[1] = __float2half_rn(b); }
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b, bool pair, bool second) {
  if (pair) *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else { p[0] = __float2bfloat16_rn(a); if (second) p[1] = __float2bfloat16_rn(b); }
}

// Copies of `rows` rows of `per_row` 16-byte pieces (src pitch `sp` elements of S, dst pitch `dp` elements of D):
// each thread keeps one (row, piece) start and steps by whole rows, so a copy costs adds, not a division. Pieces of
// rows at or past `valid_rows` and pieces whose `valid(piece)` is false are zero-filled without reading.
template <class D, class S, class Valid>
__device__ __forceinline__ void copy_rows16(D* dst, int dp, const S* src, int64_t sp, int rows, int per_row,
                                            Valid valid) {
  constexpr int ED = 16 / sizeof(D), ES = 16 / sizeof(S);
  if (per_row <= kThreads) {
    const int step = kThreads / per_row;
    if (int(threadIdx.x) >= step * per_row) return;
    const int c = threadIdx.x % per_row;
    const bool ok = valid(c);
    for (int r = threadIdx.x / per_row; r < rows; r += step)
      lab::cp_async16(lab::smem_u32(dst + r * dp + c * ED), ok ? src + r * sp + c * ES : src, ok ? 16 : 0);
  } else {
    for (int p = threadIdx.x; p < rows * per_row; p += kThreads) {
      const int r = p / per_row, c = p % per_row;
      const bool ok = valid(c);
      lab::cp_async16(lab::smem_u32(dst + r * dp + c * ED), ok ? src + r * sp + c * ES : src, ok ? 16 : 0);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1) gru_v5_kernel(const V5Args a) {
  extern __shared__ float4 smem4[];
  const int H = a.H, B = a.B, Bb = a.Bb, ld = a.ld, Kp = a.Kp, WK = a.wk;
  const int Hb = 8 * a.wn, BC = 16 * a.wm, tiles = a.wm * a.wn;
  const int j0 = (blockIdx.x % a.Ph) * Hb, b0 = (blockIdx.x / a.Ph) * Bb;
  const int nb = min(Bb, B - b0);  // this block's batch rows (the plan leaves no block without rows)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wk = warp % WK, tile = warp / WK, wn = tile % a.wn, wm = tile / a.wn;
  const int gbufs = a.gi_bufs;

  T* Ws = reinterpret_cast<T*>(smem4);                         // [3*Hb][ld]  W_hh rows g*H + j0 + u at g*Hb + u
  T* hs = Ws + 3 * Hb * ld;                                    // [BC][ld]    h_{t-1} rows of the chunk
  float* red = reinterpret_cast<float*>(hs + BC * ld);         // [tiles][WK-1][12][32] partial sums, K-split warps
  float* gis = red + tiles * (WK - 1) * 12 * 32;               // [gbufs][Bb][3][Hb] x W_ih^T
  float* hown = gis + gbufs * Bb * 3 * Hb;                     // [Bb][Hb]    this block's h, fp32

  const T* W = static_cast<const T*>(a.w_hh);
  const T* bih = static_cast<const T*>(a.b_ih);
  const T* bhh = static_cast<const T*>(a.b_hh);
  const T* h0 = static_cast<const T*>(a.h0);
  T* out = static_cast<T*>(a.out);

  // 1. The block's W_hh slice, once: zeros past H (units and columns); zeros in the whole h tile (its pad columns
  //    are never written again, and 0 * garbage could be NaN). 16-byte copies where rows allow: element by element,
  //    the first H100 run spent ~30 us here (a load's latency per element, in series).
  constexpr int E = 16 / sizeof(T);  // elements per 16-byte copy
  const bool vec_h = H % E == 0;     // rows of h and W_hh are whole 16-byte pieces (h0/W alignment: the binding)
  if (vec_h && (reinterpret_cast<uintptr_t>(W) & 15) == 0) {
    for (int g = 0; g < 3; ++g)      // gate g's Hb rows: W_hh rows g*H + j0 .. (past H: zeros)
      copy_rows16(Ws + g * Hb * ld, ld, W + (int64_t(g) * H + j0) * H, H, min(Hb, H - j0), H / E,
                  [](int) { return true; });
    for (int p = tid; p < 3 * Hb * Kp; p += kThreads) {
      const int row = p / Kp, k = p % Kp;
      if (k >= H || j0 + row % Hb >= H) Ws[row * ld + k] = from_f<T>(0.f);
    }
    lab::cp_async_commit();
    lab::cp_async_wait<0>();
    __syncthreads();
    if constexpr (sizeof(T) == 4)  // TF32: round in place
      for (int p = tid; p < 3 * Hb * Kp; p += kThreads) {
        T& w = Ws[(p / Kp) * ld + p % Kp];
        w = w_operand(w);
      }
  } else {
#pragma unroll 4
    for (int p = tid; p < 3 * Hb * Kp; p += kThreads) {
      const int row = p / Kp, k = p % Kp, g = row / Hb, j = j0 + row % Hb;
      Ws[row * ld + k] = (j < H && k < H) ? w_operand(W[(int64_t(g) * H + j) * H + k]) : from_f<T>(0.f);
    }
  }
  for (int p = tid; p < BC * ld; p += kThreads) hs[p] = from_f<T>(0.f);
  for (int p = tid; p < Bb * Hb; p += kThreads) {
    const int bb = p / Hb, jj = j0 + p % Hb;
    hown[p] = (h0 && bb < nb && jj < H) ? tof(h0[int64_t(b0 + bb) * H + jj]) : 0.f;
  }
  // This lane's gate items (K-split warp 0 of each tile): rows wm*16 + lane/4 (+8), units wn*8 + 2*(lane%4) (+1),
  // the mma accumulator layout. Their biases stay in registers: [unit 0/1][b_ir, b_iz, b_in, b_hr, b_hz, b_hn].
  const int u0 = wn * 8 + 2 * (lane % 4), ju = j0 + u0;
  const bool has0 = ju < H, has1 = ju + 1 < H;
  float bs[2][6];
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int g = 0; g < 6; ++g)
      bs[q][g] = (ju + q < H) ? tof((g < 3 ? bih : bhh)[(g % 3) * H + ju + q]) : 0.f;
  __syncthreads();  // the zeros above land before any copy of step 0 writes the same tile (a race the H100 caught)

  // per-lane ldmatrix addresses: A (h) rows wm*16 + lane%16, byte column 16*(lane/16); B (W) rows of the warp's 8
  // units in gate g, byte column 16*(lane/8)
  const uint32_t a_addr = lab::smem_u32(hs + (wm * 16 + lane % 16) * ld) + 16 * (lane / 16);
  uint32_t b_addr[3];
#pragma unroll
  for (int g = 0; g < 3; ++g) b_addr[g] = lab::smem_u32(Ws + (g * Hb + wn * 8 + lane % 8) * ld) + 16 * (lane / 8);
  const int nkb = Kp * int(sizeof(T)) / 64;  // 64-byte blocks of K
  const bool pair_out = has1 && (H % 2 == 0);  // (ju, ju+1) one aligned 2-element store (ju is even)

  for (int t = 0; t < a.T; ++t) {
    // 2. Prefetch this step's input projections (independent of h: in flight across the barrier), as v3. One
    //    buffer where two do not fit: then the previous step's gate phase must be over first.
    if (gbufs == 1 && t > 0) __syncthreads();
    float* gib = gis + (t % gbufs) * Bb * 3 * Hb;
    const float* gsrc = a.gi + (int64_t(t) * B + b0) * 3 * H;
    if (H % 4 == 0) {  // rows (b, g) of Hb floats from column j0: 16-byte pieces, zeros past H
      copy_rows16(gib, Hb, gsrc + j0, H, nb * 3, Hb / 4, [&](int c) { return j0 + 4 * c < H; });
    } else {
      for (int p = tid; p < nb * 3 * Hb; p += kThreads) {
        const int uu = p % Hb, row = p / Hb;
        const float* src = gsrc + int64_t(row) * H + j0 + uu;
        lab::cp_async4(lab::smem_u32(gib + p), j0 + uu < H ? src : gsrc, j0 + uu < H ? 4 : 0);
      }
    }
    lab::cp_async_commit();
    if (t > 0) {  // h_{t-1} of this block's rows is written: by its slice's blocks, or by every block (grid.sync)
      if (a.counters) {
        slice_wait(a.counters + blockIdx.x / a.Ph, a.Ph * t);
      } else {
        cg::this_grid().sync();
      }
    }
    const T* hsrc = t == 0 ? h0 : out + int64_t(t - 1) * B * H;

    for (int c0 = 0; c0 < nb; c0 += BC) {
      const int nr = min(BC, nb - c0);
      if (c0 > 0) __syncthreads();  // every warp is done reading the previous chunk's h tile and partial sums
      // 3. h_{t-1} rows of the chunk into the h tile (rows past nr keep old, finite values: their sums are unused)
      if (!hsrc) {
        for (int p = tid; p < nr * H; p += kThreads) hs[(p / H) * ld + p % H] = from_f<T>(0.f);
      } else {
        const T* src = hsrc + int64_t(b0 + c0) * H;
        if (vec_h && (reinterpret_cast<uintptr_t>(hsrc) & 15) == 0) {
          copy_rows16(hs, ld, src, H, nr, H / E, [](int) { return true; });
        } else {
          for (int p = tid; p < nr * H; p += kThreads)
            hs[(p / H) * ld + p % H] = ldcg(src + int64_t(p / H) * H + p % H);
        }
      }
      lab::cp_async_commit();
      lab::cp_async_wait<0>();
      __syncthreads();  // the h tile (and the prefetched gi) visible to all

      // 4. h W_hh^T on tensor cores: this warp's 16 rows x 8 units x 3 gates over every WK-th 64-byte block of K.
      //    Two accumulator sets (the two k-halves of a block): six independent mma chains instead of three.
      //    Tried and measured slower (7eeb01f, H100): loading the fragments one block ahead into a second register
      //    set, 2-6% slower at every batch (128 registers instead of 118).
      const bool live = wm * 16 < nr;
      float acc[3][4] = {}, acc2[3][4] = {};
      if (live) {
#pragma unroll 4
        for (int kb = wk; kb < nkb; kb += WK) {
          uint32_t a0[4], a1[4];
          lab::ldmatrix_x4(a0, a_addr + kb * 64);
          lab::ldmatrix_x4(a1, a_addr + kb * 64 + 32);
          if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              a0[e] = lab::round_tf32(__uint_as_float(a0[e]));
              a1[e] = lab::round_tf32(__uint_as_float(a1[e]));
            }
          }
#pragma unroll
          for (int g = 0; g < 3; ++g) {
            uint32_t b[4];
            lab::ldmatrix_x4(b, b_addr[g] + kb * 64);
            mma_step(acc[g], a0, b[0], b[1], T());
            mma_step(acc2[g], a1, b[2], b[3], T());
          }
        }
#pragma unroll
        for (int g = 0; g < 3; ++g)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[g][e] += acc2[g][e];
      }
      // 5. K-split warps hand their partial sums to the tile's warp 0 (lane-major: conflict-free), which applies
      //    the gates straight from its accumulators: lane (g, t) holds r, z, n of the same 4 (row, unit) pairs.
      if (WK > 1) {
        if (live && wk > 0) {
          float* r = red + ((tile * (WK - 1) + wk - 1) * 12) * 32 + lane;
#pragma unroll
          for (int g = 0; g < 3; ++g)
#pragma unroll
            for (int e = 0; e < 4; ++e) r[(g * 4 + e) * 32] = acc[g][e];
        }
        __syncthreads();
        if (live && wk == 0)
          for (int w = 0; w < WK - 1; ++w) {
            const float* r = red + ((tile * (WK - 1) + w) * 12) * 32 + lane;
#pragma unroll
            for (int g = 0; g < 3; ++g)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[g][e] += r[(g * 4 + e) * 32];
          }
      }
      if (live && wk == 0 && has0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows lane/4 and lane/4 + 8 of the tile
          const int r = wm * 16 + lane / 4 + 8 * h, bb = c0 + r;
          if (r >= nr) continue;
          const float* x = gib + bb * 3 * Hb + u0;
          float* own = hown + bb * Hb + u0;
          float hn[2];
#pragma unroll
          for (int q = 0; q < 2; ++q) {  // units u0, u0 + 1 (the second may be past H: computed, not stored)
            const float rg = sigm(x[q] + bs[q][0] + acc[0][2 * h + q] + bs[q][3]);
            const float zg = sigm(x[Hb + q] + bs[q][1] + acc[1][2 * h + q] + bs[q][4]);
            const float ng = tanh_acc(x[2 * Hb + q] + bs[q][2] + rg * (acc[2][2 * h + q] + bs[q][5]));
            hn[q] = ng + zg * (own[q] - ng);
          }
          own[0] = hn[0];
          own[1] = hn[1];
          store2(out + (int64_t(t) * B + b0 + bb) * H + ju, hn[0], hn[1], pair_out, has1);
        }
      }
    }
    if (a.counters && t + 1 < a.T) slice_arrive(a.counters + blockIdx.x / a.Ph);  // h_t stored: count it
  }
}

// ---- the plan: which configuration, how the work is split, and whether it fits ----------------------------------
struct V5Plan {
  int cfg = -1, hb = 0, bc = 0, wk = 0, ph = 0, pb = 0, bb = 0, kp = 0, ld = 0, smem = 0, blocks = 0,
      max_coresident = 0, cost_ns = 0, gi_bufs = 0;
  int status = 0;  // 0 ok; 2 no configuration fits shared memory; 3 not co-resident; 4 no cooperative launch;
                   // 5 a CUDA error while asking; 6 config out of range
};

// A configuration's split and an estimate of one step's time on the busiest block (ns): it ranks the
// configurations, it does not predict the measured time.
inline V5Plan plan_cfg(int B, int H, int c, int sms, int optin) {
  V5Plan p;
  p.cfg = c;
  const Cfg k = kCfgs[c];
  const int es = int(sizeof(VT));
  p.hb = 8 * k.wn;
  p.bc = 16 * k.wm;
  p.wk = k.wk;
  p.kp = (H + 64 / es - 1) / (64 / es) * (64 / es);
  p.ld = p.kp + 16 / es;
  p.ph = (H + p.hb - 1) / p.hb;
  const int max_pb = sms / p.ph;  // one block per SM
  if (max_pb < 1) {
    p.blocks = p.ph;
    p.max_coresident = sms;
    p.status = 3;
    return p;
  }
  p.pb = B < max_pb ? B : max_pb;
  p.bb = (B + p.pb - 1) / p.pb;
  p.pb = (B + p.bb - 1) / p.bb;  // no block without rows
  p.blocks = p.ph * p.pb;
  const int tiles = k.wm * k.wn;
  for (p.gi_bufs = 2; p.gi_bufs >= 1; --p.gi_bufs) {
    p.smem = (3 * p.hb + p.bc) * p.ld * es +
             (tiles * (k.wk - 1) * 12 * 32 + p.gi_bufs * p.bb * 3 * p.hb + p.bb * p.hb) * 4;
    if (p.smem <= optin - 1024) break;
  }
  if (p.gi_bufs < 1) {
    p.status = 2;
    return p;
  }
  // One chunk is a chain of latencies (copy from L2, mma, gates), so chunks multiply the step; the mma term is the
  // longer of a warp's chain and the SM's tensor pipe shared by the live warps. Constants fitted to an H100 sweep of
  // every grid that fits (6525554: bf16 and TF32, hidden 512, batch 1-256, per-slice counters): at each of those 12
  // points the pick is within 3% of the fastest grid measured.
  const int chunks = (p.bb + p.bc - 1) / p.bc;
  const int rows = p.bb < p.bc ? p.bb : p.bc;
  const int live_m = k.wm < (rows + 15) / 16 ? k.wm : (rows + 15) / 16, live_tiles = k.wn * live_m;
  const int items = (rows * p.hb + 32 * live_tiles - 1) / (32 * live_tiles);  // gate items per lane
  const int nkb = p.kp * es / 64, kbs = (nkb + p.wk - 1) / p.wk;
  const double chain = 30.0 * kbs, pipe = 3.0 * live_tiles * nkb * 6;  // ns
  const double per_chunk = 500.0 + double(rows) * H * es / 50.0 + (chain > pipe ? chain : pipe) + 20.0 * items;
  p.cost_ns = int(chunks * per_chunk + double(p.ph) * B * H * es / 4000.0);
  return p;
}

inline V5Plan make_v5_plan(int B, int H, int force) {
  V5Plan best;
  int optin = 0;
  best.status = cooperative_device(&optin);
  if (best.status) return best;
  if (force >= kNumCfgs) {
    best.status = 6;
    return best;
  }
  const int sms = lab::sm_count();
  bool any = false;
  for (int c = 0; c < kNumCfgs; ++c) {
    if (force >= 0 && c != force) continue;
    const V5Plan p = plan_cfg(B, H, c, sms, optin);
    // the cheapest plan that fits; where none fits, the first configuration's reason
    if (!any || (p.status == 0 && (best.status != 0 || p.cost_ns < best.cost_ns))) best = p;
    any = true;
  }
  if (best.status) return best;
  best.status = coresident_blocks(reinterpret_cast<const void*>(&gru_v5_kernel<VT>), best.smem,
                                  &best.max_coresident);
  if (best.status == 0 && best.blocks > best.max_coresident) best.status = 3;
  return best;
}

}  // namespace gru

// =================================================================================================================
// Launchers (called from cpp_src/gru/gru.cpp), one pair per variant: "gru_v5_plan@f32" ... "gru_v5@bf16".
// config: -1 = the plan's choice, 0..7 = force kCfgs[config].
// =================================================================================================================
// info: cfg, hb, bc, wk, ph, pb, bb, kp, smem, blocks, max_coresident, cost_ns. Returns the plan's status.
int gru_v5_plan(int B, int H, int config, int* info) {
  const gru::V5Plan p = gru::make_v5_plan(B, H, config);
  const int v[12] = {p.cfg, p.hb, p.bc, p.wk, p.ph, p.pb, p.bb, p.kp, p.smem, p.blocks, p.max_coresident, p.cost_ns};
  for (int i = 0; i < 12; ++i) info[i] = v[i];
  return p.status;
}

// counters: at least batch ints, zeroed (the per-slice step counts); nullptr: grid.sync() each step.
cudaError_t gru_v5(const float* gi, const void* w_hh, const void* b_ih, const void* b_hh, const void* h0, void* out,
                   int T, int B, int H, int config, int* counters, cudaStream_t stream) {
  using namespace gru;
  if (T == 0 || B == 0) return cudaSuccess;
  const V5Plan p = make_v5_plan(B, H, config);
  if (p.status == 3) return cudaErrorCooperativeLaunchTooLarge;
  if (p.status) return cudaErrorInvalidConfiguration;
  const Cfg k = kCfgs[p.cfg];
  V5Args a{gi, w_hh, b_ih, b_hh, h0, out, T, B, H, p.kp, p.ld, p.ph, p.bb, k.wm, k.wn, k.wk, p.gi_bufs, counters};
  void* args[] = {&a};
  // cooperative: the blocks of a slice wait for each other (the counters) or all of them do (grid.sync())
  return launch_cooperative(reinterpret_cast<const void*>(&gru_v5_kernel<VT>), p.blocks, p.smem, stream, args);
}

LAB_EXPORTS(LAB_EXPORT("gru_v5_plan", gru_v5_plan), LAB_EXPORT("gru_v5", gru_v5))
