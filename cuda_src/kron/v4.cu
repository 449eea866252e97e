// kron/v4.cu — version 4: two factors on Hopper's wgmma. v3 (mma.sync) measured issue-bound: per 16×8 mma a warp also
// issues fragment loads, TF32 roundings, staging and barrier code, and ncu found the SM ~50% busy with the tensor
// pipe at ~20%. wgmma reads both operands from shared memory itself: one instruction per 64×64×(32 bytes of k)
// per warpgroup, no fragments in registers, the accumulators only.
//
// Scope (v3 runs everything else): K = 2 factors, f_1 and f_2 multiples of 64, so every operand is whole 64-row,
// 128-byte-slab tiles and no edge is padded. y[b] = W_2ᵀ · X_b · W_1 with X_b = x[b] read as (f_2, f_1):
//   step 1  C (f_1 × c) = X_bᵀ · W_2[:, c0:c0+c]     M = f_1 (p), N = c (j), K = f_2 (i)
//   step 2  Y (c × f_1) = Cᵀ · W_1                   M = c (j),   N = f_1,   K = f_1 (p)
//   y[b][(c0 + j)·f_1 + n] = Y[j][n]
// (c: the slice of W_2's columns a block owns, a multiple of 64 dividing f_2, as v2/v3's slices.)
//
// Shared-memory operands are K-major in the 128-byte swizzle layout the descriptors of linear v11 use (rows of 128 B
// = 32 fp32 / 64 bf16 of k, 8-row groups 1024 B apart, the 16-byte chunks of row r XOR-ed with r % 8; k beyond one
// row lives in the next "slab" of R rows). TF32 wgmma takes only K-major operands, and x[b] and W are k-row-major in
// memory, so the threads stage them transposed (16-byte loads along the row, element stores into the swizzled slab),
// rounding fp32 to TF32 on the way. The state C is stored from the accumulators straight into step 2's A layout.
//
// Napkin math (H100, 128×128, c = 128; per sample 2·128³ MAC = 4.2 M): fp32 buffers X_bᵀ, W_2ᵀ, C (64 KB each; W_1ᵀ
// reuses X_bᵀ's) = 192 KB, one block per SM; bf16 96 KB, two. The flow per block is sequential — stage, multiply,
// store, stage, multiply, store — so one block per SM leaves the tensor cores idle while it stages; the next rung is a
// persistent block that stages the next sample during this one's step 2.
// lab:variants dtype=f32,bf16
#include "kron.cuh"
#include "lab_sm90.cuh"
#include "plan_info.h"

#include <cuda_bf16.h>

namespace kron {
namespace wg {

#if defined(LAB_VARIANT_dtype_bf16)
using Elem = __nv_bfloat16;
#else
using Elem = float;
#endif
constexpr int E = int(sizeof(Elem));
constexpr int kSlab = 128 / E;          // k per 128-byte row: 32 fp32, 64 bf16
constexpr int kStepK = 32 / E;          // k per wgmma: 8 (TF32), 16 (bf16)
constexpr int kBlockThreads = 256;           // two warpgroups
constexpr int kWgTile = 64;               // m64n64 tiles: 32 accumulators a thread
constexpr int kTilesPerPass = 2;        // a warpgroup holds two tiles' accumulators at once (64 registers)

// Byte offset of element (row r, column k) in a K-major operand of R rows (R a multiple of 8).
__device__ __forceinline__ uint32_t swz(int R, int r, int k) {
  const int slab = k / kSlab, kb = (k % kSlab) * E;
  return uint32_t(slab * R * 128 + (r >> 3) * 1024 + (r & 7) * 128 + ((((kb >> 4) ^ (r & 7))) << 4) + (kb & 15));
}

__device__ __forceinline__ uint32_t to_tf32(float v) {
  uint32_t u;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(u) : "f"(v));
  return u;
}
__device__ __forceinline__ void sts32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}

// dst(r, k) = src[k·ld + r] for r < R, k < Kd: a k-row-major matrix stored K-major (transposed). A warp takes 4 k-rows
// × 8 16-byte vectors per pass (each k-row's 8 vectors: 128 contiguous bytes). bf16 pairs rows k, k+1 so that every
// store is one 32-bit (k, k+1) pair.
__device__ __forceinline__ void stage_t(uint32_t dst, int R, int Kd, const Elem* __restrict__ src, int ld) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int VW = 16 / E;                    // elements per 16-byte vector
  constexpr int KR = E == 2 ? 2 : 1;            // k-rows per store
  const int kq = lane >> 3, rq = lane & 7;
  for (int k0 = (warp * 4 + kq) * KR; k0 < Kd; k0 += 8 * 4 * KR) {
    for (int r0 = rq * VW; r0 < R; r0 += 8 * VW) {
      if constexpr (E == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(src + long(k0) * ld + r0));
        sts32(dst + swz(R, r0 + 0, k0), to_tf32(v.x));
        sts32(dst + swz(R, r0 + 1, k0), to_tf32(v.y));
        sts32(dst + swz(R, r0 + 2, k0), to_tf32(v.z));
        sts32(dst + swz(R, r0 + 3, k0), to_tf32(v.w));
      } else {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(src + long(k0) * ld + r0));
        const uint4 b = __ldg(reinterpret_cast<const uint4*>(src + long(k0 + 1) * ld + r0));
        const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // elements 2i, 2i+1 of each row: (k0, k0+1) pairs for rows r0+2i, r0+2i+1
          sts32(dst + swz(R, r0 + 2 * i, k0), __byte_perm(av[i], bv[i], 0x5410));
          sts32(dst + swz(R, r0 + 2 * i + 1, k0), __byte_perm(av[i], bv[i], 0x7632));
        }
      }
    }
  }
}

__device__ __forceinline__ void fence_proxy_async() {
#ifdef LAB_SM90A
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The 32 accumulators of an m64n64 tile.
#define KRON_WG_ACC32(d) LAB_WG_ACC8(d, 0), LAB_WG_ACC8(d, 8), LAB_WG_ACC8(d, 16), LAB_WG_ACC8(d, 24)
#define KRON_WG_REGS32                                                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"

// D (64×64 fp32) += A (64 × one k-step, smem) · B (the same k-step of 64 rows, smem). scale_d = 0: D = A·B.
__device__ __forceinline__ void wgmma64(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef LAB_SM90A
#if defined(LAB_VARIANT_dtype_bf16)
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" KRON_WG_REGS32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : KRON_WG_ACC32(d)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" KRON_WG_REGS32 "}, %32, %33, p, 1, 1;\n}\n"
               : KRON_WG_ACC32(d)
               : "l"(da), "l"(db), "r"(scale_d));
#endif
#endif
}

struct Args {
  const Elem* x;
  Elem* y;
  const Elem* w1;  // W_1 (f1 × f1)
  const Elem* w2;  // W_2 (f2 × f2)
  int f1, f2, c, nslices;
  uint32_t off_w, off_s;  // byte offsets of the W_2-slice and state buffers (the first, X_bᵀ then W_1ᵀ, at 0)
};

// One step: out(m, n) for the (M/64)×(N/64) tiles, A (M rows) and B (N rows) K-major, Kd deep; each warpgroup takes
// tiles wg, wg+2, ... in passes of two, and hands every finished tile to `emit(m0, n0, acc)`.
template <class Emit>
__device__ __forceinline__ void gemm_step(uint32_t a, int M, uint32_t b, int N, int Kd, Emit&& emit) {
  const int wg = threadIdx.x >> 7;
  const int tn = N / kWgTile, tiles = (M / kWgTile) * tn;
  for (int t0 = wg * kTilesPerPass; t0 < tiles; t0 += 2 * kTilesPerPass) {
    float acc[kTilesPerPass][32];
    const int nt = min(kTilesPerPass, tiles - t0);
    lab::wgmma_fence();
    for (int k = 0; k < Kd; k += kStepK) {
      const uint32_t kofs = uint32_t((k % kSlab) * E);  // a k-step inside the slab's 128-byte rows
#pragma unroll
      for (int i = 0; i < kTilesPerPass; ++i) {
        if (i < nt) {
          const int t = t0 + i, m0 = (t / tn) * kWgTile, n0 = (t % tn) * kWgTile;
          const uint64_t da = lab::smem_desc<128>(a + uint32_t((k / kSlab) * M * 128 + m0 * 128) + kofs);
          const uint64_t db = lab::smem_desc<128>(b + uint32_t((k / kSlab) * N * 128 + n0 * 128) + kofs);
          wgmma64(acc[i], da, db, k > 0);
        }
      }
    }
    lab::wgmma_commit();
    lab::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kTilesPerPass; ++i) {
      lab::fence_regs<32>(acc[i]);
      if (i < nt) {
        const int t = t0 + i;
        emit((t / tn) * kWgTile, (t % tn) * kWgTile, acc[i]);
      }
    }
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) wg_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (lab::smem_u32(smem_raw) + 1023) & ~1023u;  // the swizzle repeats every 1024 B
  const uint32_t bufX = base, bufW = base + a.off_w, bufS = base + a.off_s;
  const int f1 = a.f1, f2 = a.f2, c = a.c;
  const long N = long(f1) * f2;
  const long b = blockIdx.x / a.nslices;
  const int c0 = int(blockIdx.x % a.nslices) * c;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  // X_bᵀ (f1 rows p, f2 deep i) and W_2[:, c0:c0+c]ᵀ (c rows j, f2 deep)
  stage_t(bufX, f1, f2, a.x + b * N, f1);
  stage_t(bufW, c, f2, a.w2 + c0, f2);
  fence_proxy_async();
  __syncthreads();

  // step 1: C[p][j] -> the state, stored as step 2's A: row j, column p (rounded to the element type)
  gemm_step(bufX, f1, bufW, c, f2, [&](int m0, int n0, const float* d) {
#pragma unroll
    for (int j = 0; j < kWgTile / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int p = m0 + 16 * warp + (lane >> 2) + 8 * h;
        const int jj = n0 + 8 * j + 2 * (lane & 3);
        const float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
        if constexpr (E == 4) {
          sts32(bufS + swz(c, jj, p), to_tf32(v0));
          sts32(bufS + swz(c, jj + 1, p), to_tf32(v1));
        } else {
          const __nv_bfloat16 b0 = __float2bfloat16_rn(v0), b1 = __float2bfloat16_rn(v1);
          asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(bufS + swz(c, jj, p)), "h"(*reinterpret_cast<const unsigned short*>(&b0)) : "memory");
          asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(bufS + swz(c, jj + 1, p)), "h"(*reinterpret_cast<const unsigned short*>(&b1)) : "memory");
        }
      }
  });
  __syncthreads();  // every warpgroup is done reading X_bᵀ: W_1ᵀ goes there
  stage_t(bufX, f1, f1, a.w1, f1);
  fence_proxy_async();
  __syncthreads();

  // step 2: Y[j][n] -> y[b][(c0 + j)·f1 + n]
  Elem* yb = a.y + b * N + long(c0) * f1;
  gemm_step(bufS, c, bufX, f1, f1, [&](int m0, int n0, const float* d) {
#pragma unroll
    for (int j = 0; j < kWgTile / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int jj = m0 + 16 * warp + (lane >> 2) + 8 * h;
        const int n = n0 + 8 * j + 2 * (lane & 3);
        Elem* p = yb + long(jj) * f1 + n;
        if constexpr (E == 4)
          *reinterpret_cast<float2*>(p) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        else
          *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
      }
  });
}

// ---- plan and launch ------------------------------------------------------------------------------------------------
struct Plan {
  bool ok = false;
  int c = 0, nslices = 0, blocks_per_sm = 0;
  uint32_t off_w = 0, off_s = 0;
  long smem = 0;
  double cost = 0;
};

bool supported(const int* f, int K) { return K == 2 && f[0] % 64 == 0 && f[1] % 64 == 0; }

void optin() {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || done[dev]) return;
  cudaFuncSetAttribute(wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device_facts().smem_optin);
  done[dev] = true;
}

Plan layout(int f1, int f2, int c) {
  Plan p;
  p.c = c;
  p.nslices = f2 / c;
  const long bx = long(f1) * std::max(f1, f2) * E;  // X_bᵀ, later W_1ᵀ
  const long bw = long(c) * f2 * E, bs = long(c) * f1 * E;
  p.off_w = uint32_t(bx);
  p.off_s = uint32_t(bx + bw);
  p.smem = bx + bw + bs + 1024;  // + alignment slack
  p.ok = p.smem <= device_facts().smem_optin;
  return p;
}

// Estimated clock cycles: waves of blocks × a block's mma time (at ~half of wgmma's dense rate) plus its staging.
Plan plan(long B, const int* f, int K, int force_c) {
  Plan best;
  if (!supported(f, K) || B <= 0) return best;
  const int f1 = f[0], f2 = f[1];
  const int sms = device_facts().sms;
  optin();
  for (int c = f2; c >= 64; c /= 2) {
    if (f2 % c != 0 || c % 64 != 0) continue;
    if (force_c > 0 && c != force_c) continue;
    Plan p = layout(f1, f2, c);
    if (!p.ok) continue;
    int bps = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, wg_kernel, kBlockThreads, size_t(p.smem));
    if (bps <= 0) continue;
    p.blocks_per_sm = bps;
    const long blocks = B * p.nslices;
    const long waves = (blocks + long(sms) * bps - 1) / (long(sms) * bps);
    const double rate = E == 2 ? 1024.0 : 512.0;                       // MAC per clock per SM
    const double mma = 2.0 * c * f1 * double(f2 + f1) / 2 / rate;        // both steps
    const double stage = (double(f1) * f2 + double(c) * f2 + double(f1) * f1) * E / 32.0;  // ~32 B/clk/SM staged
    p.cost = double(waves) * bps * (mma + stage);
    if (!best.ok || p.cost < best.cost * 0.999) best = p;
  }
  return best;
}

void plan_info(int64_t B, int64_t N, const int* f, int K, int cols, int64_t* info) {
  (void)N;
  const Plan p = plan(B, f, K, cols);
  info[kFits] = p.ok;
  info[kCfg] = 0;
  info[kC] = p.c;
  info[kSlices] = p.nslices;
  info[kSmemBytes] = p.smem;
  info[kBlocksPerSm] = p.blocks_per_sm;
  info[kron::kThreads] = kBlockThreads;  // the plan field (this unit once named its constant kThreads too: info[256])
  info[kTM] = kWgTile;  // the wgmma tile
  info[kTN] = kWgTile;
  info[kCost] = int64_t(p.cost);
  info[kSmemLimit] = device_facts().smem_optin;
  info[kStages] = 1;
}

cudaError_t forward(const Elem* x, Elem* y, const Elem* const* w, const int* f, int K, int64_t B, int64_t N, int cols,
                    cudaStream_t s) {
  if (B == 0) return cudaSuccess;
  const Plan p = plan(B, f, K, cols);
  if (!p.ok) return cudaErrorInvalidConfiguration;
  for (int k = 0; k < 2; ++k)
    if (!aligned16(w[k])) return cudaErrorMisalignedAddress;
  if (!aligned16(x) || !aligned16(y)) return cudaErrorMisalignedAddress;
  (void)N;
  Args a{};
  a.x = x;
  a.y = y;
  a.w1 = w[0];
  a.w2 = w[1];
  a.f1 = f[0];
  a.f2 = f[1];
  a.c = p.c;
  a.nslices = p.nslices;
  a.off_w = p.off_w;
  a.off_s = p.off_s;
  const long blocks = B * p.nslices;
  if (blocks > 0x7fffffffL) return cudaErrorInvalidConfiguration;
  optin();
  wg_kernel<<<unsigned(blocks), kBlockThreads, size_t(p.smem), s>>>(a);
  return cudaGetLastError();
}

}  // namespace wg
}  // namespace kron

// ---- what the binding calls ("kron_v4_plan@f32", "kron_v4_forward@bf16") -------------------------------------------
//   the same signatures as v3's (cuda_src/kron/v3.cu); fits = 0 where v4 does not apply (K != 2, a factor size not a
//   multiple of 64, or over shared memory): the binding then runs v3
LAB_EXPORTS(LAB_EXPORT("kron_v4_plan", kron::wg::plan_info), LAB_EXPORT("kron_v4_forward", kron::wg::forward))
