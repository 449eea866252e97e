// gru/v3.cu — v3 and v4: the persistent kernel, its plan and its launcher (the ladder and the work split: gru.cuh).
// lab:variants dtype=f32,f16,bf16 rb=2,4
//
// Built once per variant, so one build instantiates the KPT x S configurations (6 kernels) of one storage type and
// one RB: rb=2 is v3 (rows in pairs, butterfly), rb=4 is v4 (rows in fours, reduce-scatter). The binding picks
// "gru_v3_plan@<dtype>,<rb>" / "gru_v3@<dtype>,<rb>" by version and dtype. The plan asks the occupancy API about the
// kernel it would launch, so plan and launch live here together.
#include "persistent.cuh"

// cooperative_groups.h without the libcu++ headers it would pull in (cuda/std/type_traits, cuda/atomic): the unit
// needs only this_grid().sync(), and those headers were ~2.2 of this unit's ~5 s nvcc run on the 2-core machine.
// The generated code is the same: cuobjdump -sass of all six variants is byte-identical with and without it.
#define _CG_LIMIT_INCLUDED_DEPENDENCIES
#include <cooperative_groups.h>

namespace gru {
namespace cg = cooperative_groups;

// This build's variant: the storage type VT of the kernels (persistent.cuh) and the rows per pass RB.
#if defined(LAB_VARIANT_rb_2)
constexpr int kRB = 2;
#elif defined(LAB_VARIANT_rb_4)
constexpr int kRB = 4;
#else
#error "gru/v3.cu is built per variant (// lab:variants above): -DLAB_VARIANT_rb_2 or _rb_4"
#endif

// Four consecutive elements of the shared-memory h tile, widened to fp32.
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 ld4(const __nv_bfloat16* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);  // bf16 -> fp32 is a 16-bit shift
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}
__device__ __forceinline__ float4 ld4(const __half* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

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
  int T, B, H;
  int Ph;            // hidden-unit partitions (block index % Ph)
  int Bb;            // batch rows per block
  int BC;            // batch rows per shared-memory chunk (BC <= Bb)
  int* counters;     // per batch slice (block index / Ph), zeroed before the launch: slice_wait / slice_arrive
                     // (persistent.cuh); nullptr: one grid-wide barrier a step (cooperative_groups grid.sync())
};

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

// v4's lane reduction: a reduce-scatter. Each of the S lanes holds NV partial sums; at every level a lane keeps one
// half of its values and sends the other half to its partner (lane ^ OFF), so the values to sum halve each level:
// NV/2 + NV/4 + ... shuffles (15 for 16 values over 16 lanes) instead of NV * log2(S) for a full butterfly (64).
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

template <class T, int KPT, int S, int RB>
__global__ void __launch_bounds__(kThreads, 1) gru_v3_kernel(const V3Args a) {
  static_assert(KPT % 4 == 0 && S >= 4 && S <= 32 && (S & (S - 1)) == 0, "KPT multiple of 4, S a power of 2");
  static_assert(RB == 2 || RB == 4, "v3 takes rows in pairs, v4 in fours");
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
#pragma unroll
  for (int g = 0; g < 3; ++g)
#pragma unroll
    for (int c = 0; c < KPT / 4; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = c * 4 * S + s * 4 + i;
        w[g][c * 4 + i] = (j < H && k < H) ? tof(W[(int64_t(g) * H + j) * H + k]) : 0.f;
      }
  // 2. Biases, the block's own h (fp32), and zeros in the pad columns of the h tile (0 * garbage could be NaN).
  for (int p = tid; p < 6 * Hb; p += kThreads) {
    const int g = p / Hb, jj = j0 + p % Hb;
    bias[p] = jj < H ? tof((g < 3 ? bih : bhh)[(g % 3) * H + jj]) : 0.f;
  }
  for (int p = tid; p < Bb * Hb; p += kThreads) {
    const int bb = p / Hb, jj = j0 + p % Hb;
    hown[p] = (h0 && bb < nb && jj < H) ? tof(h0[int64_t(b0 + bb) * H + jj]) : 0.f;
  }
  if (Kp > H)
    for (int p = tid; p < BC * (Kp - H); p += kThreads) hs[(p / (Kp - H)) * Kp + H + p % (Kp - H)] = from_f<T>(0.f);

  for (int t = 0; t < a.T; ++t) {
    // 3. Prefetch this step's input projections: independent of h, so they are in flight across the barrier.
    float* gib = gis + (t & 1) * Bb * 3 * Hb;
    const float* gsrc = a.gi + int64_t(t) * B * 3 * H;
    for (int p = tid; p < nb * 3 * Hb; p += kThreads) {
      const int uu = p % Hb, g = (p / Hb) % 3, bb = p / (3 * Hb);
      if (j0 + uu < H) cp_async4(gib + p, gsrc + (int64_t(b0 + bb) * 3 + g) * H + j0 + uu);
    }
    if (t > 0) {  // h_{t-1} of this block's rows is written: by its slice's blocks, or by every block (grid.sync)
      if (a.counters)
        slice_wait(a.counters + blockIdx.x / a.Ph, a.Ph * t);
      else
        cg::this_grid().sync();
    }
    const T* hsrc = t == 0 ? h0 : out + int64_t(t - 1) * B * H;

    for (int c0 = 0; c0 < nb; c0 += BC) {
      const int nr = min(BC, nb - c0);
      load_rows<T>(hs, Kp, hsrc ? hsrc + int64_t(b0 + c0) * H : nullptr, nr, H);
      cp_async_wait_all();
      __syncthreads();  // the h tile (and the prefetched gi) visible to all

      if constexpr (RB == 4) {
        // 4'. v4: four rows at a time (12 FMA chains, 16 values with a zero pad per row), reduce-scatter.
        constexpr int NV = 16;
        for (int r = 0; r < nr; r += 4) {
          const T* hq[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) hq[q] = hs + min(r + q, nr - 1) * Kp + s * 4;  // past the end: repeat
          float acc[NV];
#pragma unroll
          for (int i = 0; i < NV; ++i) acc[i] = 0.f;
#pragma unroll
          for (int c = 0; c < KPT / 4; ++c) {
            float4 x[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) x[q] = ld4(hq[q] + c * 4 * S);
#pragma unroll
            for (int g = 0; g < 3; ++g)
#pragma unroll
              for (int q = 0; q < 4; ++q) {
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
              const int idx = s * (NV / S) + i, q = idx / 4, g = idx % 4;  // value idx = row q, gate g (3: pad)
              if (g < 3 && r + q < nr) ghs[((r + q) * 3 + g) * Hb + u] = acc[i];
            }
          } else {
            const int idx = s / (S / NV), q = idx / 4, g = idx % 4;
            if (s % (S / NV) == 0 && g < 3 && r + q < nr) ghs[((r + q) * 3 + g) * Hb + u] = acc[0];
          }
        }
      } else {
        // 4. h W_hh^T for (row, unit u), two rows at a time: 6 FMA chains, KPT/4 x 2 16-byte shared loads.
        for (int r = 0; r < nr; r += 2) {
          const int r1 = min(r + 1, nr - 1);
          const T* ha = hs + r * Kp + s * 4;
          const T* hb = hs + r1 * Kp + s * 4;
          float acc[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int c = 0; c < KPT / 4; ++c) {
            const float4 x0 = ld4(ha + c * 4 * S), x1 = ld4(hb + c * 4 * S);
#pragma unroll
            for (int g = 0; g < 3; ++g) {
              acc[g] = fmaf(w[g][c * 4 + 0], x0.x, acc[g]);
              acc[g] = fmaf(w[g][c * 4 + 1], x0.y, acc[g]);
              acc[g] = fmaf(w[g][c * 4 + 2], x0.z, acc[g]);
              acc[g] = fmaf(w[g][c * 4 + 3], x0.w, acc[g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 0], x1.x, acc[3 + g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 1], x1.y, acc[3 + g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 2], x1.z, acc[3 + g]);
              acc[3 + g] = fmaf(w[g][c * 4 + 3], x1.w, acc[3 + g]);
            }
          }
          // butterfly over the unit's S lanes (aligned groups of S inside the warp): every lane gets the sums
#pragma unroll
          for (int off = S / 2; off > 0; off >>= 1)
#pragma unroll
            for (int q = 0; q < 6; ++q) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], off);
          // lanes 0..5 of the unit store the 6 sums (row r gates r,z,n; row r1 gates r,z,n)
          float v = acc[0];
#pragma unroll
          for (int q = 1; q < 6; ++q) v = (s == q) ? acc[q] : v;
          if (s < 3 || (s < 6 && r1 != r)) ghs[((s < 3 ? r : r1) * 3 + s % 3) * Hb + u] = v;
        }
      }
      __syncthreads();  // all sums of the chunk stored

      // 5. Gates and the update, one thread per (row, unit): units fastest, so stores of h_t coalesce.
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
        hown[bb * Hb + uu] = hn;  // the same thread owns (bb, uu) at every step
        out[(int64_t(t) * B + b0 + bb) * H + jj] = from_f<T>(hn);
      }
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

inline int elem_size(int dtype) { return dtype == kF32 ? 4 : dtype == kF64 ? 8 : 2; }

template <class T, int KPT, int S, int RB>
const void* v3_kernel() { return reinterpret_cast<const void*>(&gru_v3_kernel<T, KPT, S, RB>); }

template <class T, int RB>
const void* v3_kernel_for(int kpt, int s) {
  if (kpt == 8) return s == 4 ? v3_kernel<T, 8, 4, RB>() : v3_kernel<T, 8, 8, RB>();
  if (kpt == 16) return s == 8 ? v3_kernel<T, 16, 8, RB>() : v3_kernel<T, 16, 16, RB>();
  return s == 16 ? v3_kernel<T, 32, 16, RB>() : v3_kernel<T, 32, 32, RB>();
}

// version 3: rows in pairs, butterfly reduction; version 4: rows in fours, reduce-scatter. A variant build holds the
// kernels of one (dtype, RB): choosing the version and dtype is the binding's choice of variant name.
inline Plan make_plan(int B, int H) {
  Plan p;
  p.kpt = H <= 64 ? 8 : H <= 256 ? 16 : H <= 1024 ? 32 : 0;
  if (!p.kpt) {
    p.status = 1;
    return p;
  }
  const int need = (H + p.kpt - 1) / p.kpt;
  p.s = 4;
  while (p.s < need) p.s *= 2;
  p.hb = kThreads / p.s;
  p.ph = (H + p.hb - 1) / p.hb;
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
  const int kp = p.kpt * p.s;
  const int fixed = (2 * p.bb * 3 * p.hb + p.bb * p.hb + 6 * p.hb) * 4;
  const int row = kp * elem_size(kDtype) + 3 * p.hb * 4;
  const int budget = optin - 1024;  // leave the runtime's reserved shared memory alone
  p.bc = fixed < budget ? (budget - fixed) / row : 0;
  if (p.bc > p.bb) p.bc = p.bb;
  if (p.bc < 1) {
    p.status = 2;
    return p;
  }
  p.smem = fixed + p.bc * row;
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

// counters: at least batch ints, zeroed (the per-slice step counts); nullptr: grid.sync() each step.
cudaError_t gru_v3(const float* gi, const void* w_hh, const void* b_ih, const void* b_hh, const void* h0, void* out,
                   int T, int B, int H, int* counters, cudaStream_t stream) {
  using namespace gru;
  if (T == 0 || B == 0) return cudaSuccess;
  const Plan p = make_plan(B, H);
  if (p.status == 3) return cudaErrorCooperativeLaunchTooLarge;
  if (p.status) return cudaErrorInvalidConfiguration;
  V3Args a{gi, w_hh, b_ih, b_hh, h0, out, T, B, H, p.ph, p.bb, p.bc, counters};
  void* args[] = {&a};
  // cooperative: the blocks of a slice wait for each other (the counters) or all of them do (grid.sync())
  return launch_cooperative(v3_kernel_for<VT, kRB>(p.kpt, p.s), p.blocks, p.smem, stream, args);
}

LAB_EXPORTS(LAB_EXPORT("gru_v3_plan", gru_v3_plan), LAB_EXPORT("gru_v3", gru_v3))
