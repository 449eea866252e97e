// kron/v4.cu — version 4: two factors on Hopper's wgmma, one persistent block per SM. v3 (mma.sync) measured
// issue-bound: per 16×8 mma a warp also issues fragment loads, TF32 roundings, staging and barrier code, and ncu found
// the SM about half busy with the tensor pipe near a fifth. wgmma reads both operands from shared memory itself: one
// instruction per 64×64×(32 bytes of k) per warpgroup, no fragments in registers, the accumulators only.
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
// The schedule. A first build ran one block per (sample, slice), stage -> multiply -> store -> stage -> multiply:
// with one 192 KB block per SM nothing overlapped the staging, and it measured slower than v3. Now:
//  - the factors are the same for every sample, so a block keeps W_2's slice and W_1 (transposed) for its lifetime,
//    and the grid is one block per SM, each walking its samples;
//  - x[b+1] is loaded into registers (16 KB per thread-block-wide pass: 16 × 16 B a thread in fp32 at 128×128) before
//    step 1 of x[b] is issued, so the HBM latency hides behind the tensor cores; once step 1 is done with X_bᵀ, the
//    registers are stored transposed over it.
//
// Napkin math (H100, 128×128; per sample 2·128³ MAC = 4.2 M): bf16, c = 128: X_bᵀ, W_2ᵀ, W_1ᵀ, C 32 KB each = 128 KB;
// per SM 7.8 samples at batch 1024, each 32 KB in + 32 KB out: the 67 MB of x and y take 20 us at 3.35 TB/s, the
// mma 9 us at the dense bf16 rate. fp32: 64 KB each would be 256 KB, so c = 64 (two blocks share a sample, one W_2
// half each: X_bᵀ 64 + W_2ᵀ 32 + W_1ᵀ 64 + C 32 = 192 KB); x is read twice (the second time mostly from L2: the two
// slices of a sample are neighbouring blocks, in step), 134 MB of x and y: 40 us at 3.35 TB/s.
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

__device__ __forceinline__ uint32_t to_tf32(float v) { return lab::round_tf32(v); }  // lab_gemm.cuh's cvt.rna
using lab::sts32;
__device__ __forceinline__ void sts16(uint32_t a, unsigned short v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(a), "h"(v) : "memory");
}

__device__ __forceinline__ void fence_proxy_async() { lab::fence_proxy_async_smem(); }

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
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" KRON_WG_REGS32
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
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
  long B;
  int f1, f2, c, nslices;
  uint32_t off_w2, off_w1, off_s;  // byte offsets of W_2-slice, W_1 and state buffers (X_bᵀ at 0)
};

// x[b] vectors (bf16: pairs of vectors) a thread holds for the next sample; at 128×128 exactly 16 (fp32), 4 (bf16)
constexpr int kMaxVecs = E == 2 ? 8 : 16;

// The 16-byte vectors of a k-row-major matrix (Kd rows of R elements) that thread t loads and stores transposed:
// groups of 8 k-rows (k-row pairs in bf16) × 4 vectors, a warp per group, group g = warp + 8·i for the i-th vector.
// Lanes span 8 k-rows: the transposed stores of one instruction then hit 16 different banks (2-way), where lanes
// along one k-row hit 2 (16-way).
struct VecMap {
  int gk;  // groups along k
  __device__ __forceinline__ VecMap(int Kd) : gk(Kd / (8 * (E == 2 ? 2 : 1))) {}
  __device__ __forceinline__ void at(int i, int& k, int& r) const {
    constexpr int VW = 16 / E, KR = E == 2 ? 2 : 1;
    const int g = (threadIdx.x >> 5) + 8 * i, lane = threadIdx.x & 31;
    k = ((g % gk) * 8 + (lane & 7)) * KR;
    r = ((g / gk) * 4 + (lane >> 3)) * VW;
  }
};
__host__ __device__ constexpr int vecs_per_thread(int R, int Kd) { return R * Kd / (16 / E) / kBlockThreads; }

// Store one loaded vector transposed: element (r + i, k) of the K-major operand of R rows. bf16 holds rows k and k+1
// (two vectors): each store is one (k, k+1) pair.
struct Vec2 {
  uint4 a, b;
};
__device__ __forceinline__ Vec2 load_vec(const Elem* src, int ld, int k, int r) {
  Vec2 v;
  v.a = __ldg(reinterpret_cast<const uint4*>(src + long(k) * ld + r));
  if constexpr (E == 2) v.b = __ldg(reinterpret_cast<const uint4*>(src + long(k + 1) * ld + r));
  return v;
}
// The address math is swz()'s, split so that only the row's low 3 bits change between a vector's elements: the
// first build called swz() per element, and the integer chains were the top stall ("wait") of the whole kernel.
__device__ __forceinline__ void store_vec_t(uint32_t dst, int R, int k, int r, const Vec2& v) {
  const int kb = (k % kSlab) * E, kc = kb >> 4;
  const uint32_t row0 = dst + uint32_t((k / kSlab) * R * 128 + (r >> 3) * 1024 + (kb & 15));
  const uint32_t av[4] = {v.a.x, v.a.y, v.a.z, v.a.w};
  if constexpr (E == 4) {
    const int r7 = r & 7;  // 0 or 4: a 4-element vector stays inside its 8-row group
#pragma unroll
    for (int i = 0; i < 4; ++i)
      sts32(row0 + uint32_t((r7 + i) * 128 + ((kc ^ (r7 + i)) << 4)), to_tf32(__uint_as_float(av[i])));
  } else {
    const uint32_t bv[4] = {v.b.x, v.b.y, v.b.z, v.b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // elements 2i, 2i+1 of each row: (k, k+1) pairs for rows r+2i, r+2i+1 (r % 8 = 0)
      sts32(row0 + uint32_t((2 * i) * 128 + ((kc ^ (2 * i)) << 4)), __byte_perm(av[i], bv[i], 0x5410));
      sts32(row0 + uint32_t((2 * i + 1) * 128 + ((kc ^ (2 * i + 1)) << 4)), __byte_perm(av[i], bv[i], 0x7632));
    }
  }
}
// A whole matrix, loaded and stored in passes (the factors, once per block).
__device__ __forceinline__ void stage_t(uint32_t dst, int R, int Kd, const Elem* __restrict__ src, int ld) {
  const VecMap vm(Kd);
  const int n = vecs_per_thread(R, Kd) / (E == 2 ? 2 : 1);
  for (int i = 0; i < n; ++i) {
    int k, r;
    vm.at(i, k, r);
    store_vec_t(dst, R, k, r, load_vec(src, ld, k, r));
  }
}

// One step: out(m, n) for the (M/64)×(N/64) tiles, A (M rows) and B (N rows) K-major, Kd deep; warpgroup w takes
// tiles w, w + 2, ... in passes of two, and hands every finished tile to `emit(m0, n0, acc)`.
// The warpgroup index through a shuffle: the compiler then knows it is warp-uniform. Computed from threadIdx.x, the
// tile branches below looked divergent to ptxas, which then waited for every wgmma before issuing the next (C7520,
// "wgmma.mma_async instructions are serialized"; in SASS a WARPGROUP.DEPBAR after each HGMMA).
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, int(threadIdx.x) >> 7, 0); }

template <class Emit>
__device__ __forceinline__ void gemm_step(uint32_t a, int M, uint32_t b, int N, int Kd, Emit&& emit) {
  const int wg = warpgroup();
  const int tn = N / kWgTile, tiles = (M / kWgTile) * tn;
  for (int t0 = wg; t0 < tiles; t0 += 2 * kTilesPerPass) {
    float acc[kTilesPerPass][32];
    lab::wgmma_fence();
    for (int k = 0; k < Kd; k += kStepK) {
      const uint32_t kofs = uint32_t((k % kSlab) * E);  // a k-step inside the slab's 128-byte rows
#pragma unroll
      for (int i = 0; i < kTilesPerPass; ++i) {
        const int t = t0 + 2 * i;
        if (t < tiles) {
          const int m0 = (t / tn) * kWgTile, n0 = (t % tn) * kWgTile;
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
      const int t = t0 + 2 * i;
      if (t < tiles) emit((t / tn) * kWgTile, (t % tn) * kWgTile, acc[i]);
    }
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) wg_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (lab::smem_u32(smem_raw) + 1023) & ~1023u;  // the swizzle repeats every 1024 B
  const uint32_t bufX = base, bufW2 = base + a.off_w2, bufW1 = base + a.off_w1, bufS = base + a.off_s;
  const int f1 = a.f1, f2 = a.f2, c = a.c;
  const long N = long(f1) * f2;
  const int slice = int(blockIdx.x % a.nslices);
  const long bstep = gridDim.x / a.nslices;  // the grid is a multiple of nslices: every block keeps one slice
  const int c0 = slice * c;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  long b = blockIdx.x / a.nslices;
  if (b >= a.B) return;

  // once per block: W_2[:, c0:c0+c]ᵀ (c rows j, f2 deep), W_1ᵀ (f1 rows n, f1 deep), and the first X_bᵀ
  stage_t(bufW2, c, f2, a.w2 + c0, f2);
  stage_t(bufW1, f1, f1, a.w1, f1);
  stage_t(bufX, f1, f2, a.x + b * N, f1);
  fence_proxy_async();
  __syncthreads();

  const VecMap vm(f2);
  const int nv = vecs_per_thread(f1, f2) / (E == 2 ? 2 : 1);  // <= kMaxVecs (plan)
  for (; b < a.B; b += bstep) {
    // x[b + bstep] into registers: in flight while step 1 runs
    const long bn = b + bstep;
    Vec2 pre[kMaxVecs];
    if (bn < a.B) {
#pragma unroll
      for (int i = 0; i < kMaxVecs; ++i)
        if (i < nv) {
          int k, r;
          vm.at(i, k, r);
          pre[i] = load_vec(a.x + bn * N, f1, k, r);
        }
    }

    // step 1: C[p][j] -> the state, stored as step 2's A: row j, column p (rounded to the element type)
    // (row jj = n0 + 8j + 2q + u, column p): jj >> 3 = n0/8 + j and jj & 7 = 2q + u, so each of the four (h, u)
    // addresses is computed once and the 16 j's are 1024 B apart
    gemm_step(bufX, f1, bufW2, c, f2, [&](int m0, int n0, const float* d) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int p = m0 + 16 * warp + (lane >> 2) + 8 * h;
        const int pb = (p % kSlab) * E, pc = pb >> 4;
        const uint32_t rowp = bufS + uint32_t((p / kSlab) * c * 128 + (n0 >> 3) * 1024 + (pb & 15));
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int r7 = 2 * (lane & 3) + u;
          const uint32_t at = rowp + uint32_t(r7 * 128 + ((pc ^ r7) << 4));
#pragma unroll
          for (int j = 0; j < kWgTile / 8; ++j) {
            const float v = d[4 * j + 2 * h + u];
            if constexpr (E == 4) {
              sts32(at + j * 1024, to_tf32(v));
            } else {
              const __nv_bfloat16 bv = __float2bfloat16_rn(v);
              sts16(at + j * 1024, *reinterpret_cast<const unsigned short*>(&bv));
            }
          }
        }
      }
    });
    __syncthreads();  // both warpgroups are done reading X_bᵀ: the next sample's goes there
    if (bn < a.B) {
#pragma unroll
      for (int i = 0; i < kMaxVecs; ++i)
        if (i < nv) {
          int k, r;
          vm.at(i, k, r);
          store_vec_t(bufX, f1, k, r, pre[i]);
        }
    }
    fence_proxy_async();
    __syncthreads();  // the state (and the next X_bᵀ) written, visible to the tensor cores

    // step 2: Y[j][n] -> y[b][(c0 + j)·f1 + n]
    Elem* yb = a.y + b * N + long(c0) * f1;
    gemm_step(bufS, c, bufW1, f1, f1, [&](int m0, int n0, const float* d) {
#pragma unroll
      for (int j = 0; j < kWgTile / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int jj = m0 + 16 * warp + (lane >> 2) + 8 * h;
          const int n = n0 + 8 * j + 2 * (lane & 3);
          Elem* q = yb + long(jj) * f1 + n;
          if constexpr (E == 4)
            *reinterpret_cast<float2*>(q) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
          else
            *reinterpret_cast<__nv_bfloat162*>(q) = __floats2bfloat162_rn(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        }
    });
    __syncthreads();  // step 2 is done reading the state before the next step 1 overwrites it
  }
}

// ---- plan and launch ------------------------------------------------------------------------------------------------
struct Plan {
  bool ok = false;
  int c = 0, nslices = 0, blocks_per_sm = 0, grid = 0;
  uint32_t off_w2 = 0, off_w1 = 0, off_s = 0;
  long smem = 0;
  double cost = 0;
};

bool supported(const int* f, int K) {
  return K == 2 && f[0] % 64 == 0 && f[1] % 64 == 0 &&
         vecs_per_thread(f[0], f[1]) / (E == 2 ? 2 : 1) <= kMaxVecs;  // x[b] fits the prefetch registers
}

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
  const long bx = long(f1) * f2 * E, bw2 = long(c) * f2 * E, bw1 = long(f1) * f1 * E, bs = long(c) * f1 * E;
  p.off_w2 = uint32_t(bx);
  p.off_w1 = uint32_t(bx + bw2);
  p.off_s = uint32_t(bx + bw2 + bw1);
  p.smem = bx + bw2 + bw1 + bs + 1024;  // + alignment slack
  p.ok = p.smem <= device_facts().smem_optin;
  return p;
}

// Estimated clock cycles of the busiest block: its (sample, slice) items × (mma at ~half of wgmma's dense rate + the
// sample's x at an SM's share of HBM, ~14 B/clk), plus the factors staged once.
Plan search(long B, int f1, int f2, int force_c) {
  Plan best;
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
    const long items = B * p.nslices;
    const long slots = std::max<long>(long(sms) * bps / p.nslices * p.nslices, p.nslices);
    p.grid = int(std::min(items, slots));
    const long per_block = (B + p.grid / p.nslices - 1) / (p.grid / p.nslices);
    const double rate = E == 2 ? 1024.0 : 512.0;  // MAC per clock per SM
    const double mma = double(c) * f1 * double(f2 + f1) / rate;
    const double xin = double(f1) * f2 * E / 14.0, yout = double(c) * f1 * E / 14.0;
    const double once = (double(c) * f2 + double(f1) * f1) * E / 32.0;
    p.cost = double(per_block) * std::max(mma, xin + yout) + once;
    if (!best.ok || p.cost < best.cost * 0.999) best = p;
  }
  return best;
}
// cached per (device, B, f_1, f_2, forced c): kron.cuh's PlanCache
Plan plan(long B, const int* f, int K, int force_c) {
  if (!supported(f, K) || B <= 0) return Plan{};
  static PlanCache<Plan> cache;
  return cache.get({B, f[0], f[1], force_c}, [&] { return search(B, f[0], f[1], force_c); });
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
  a.B = B;
  a.off_w2 = p.off_w2;
  a.off_w1 = p.off_w1;
  a.off_s = p.off_s;
  optin();
  wg_kernel<<<unsigned(p.grid), kBlockThreads, size_t(p.smem), s>>>(a);
  return cudaGetLastError();
}

}  // namespace wg
}  // namespace kron

// ---- what the binding calls ("kron_v4_plan@f32", "kron_v4_forward@bf16") -------------------------------------------
//   the same signatures as v3's (cuda_src/kron/v3.cu); fits = 0 where v4 does not apply (K != 2, a factor size not a
//   multiple of 64, or over shared memory): the binding then runs v3
LAB_EXPORTS(LAB_EXPORT("kron_v4_plan", kron::wg::plan_info), LAB_EXPORT("kron_v4_forward", kron::wg::forward))
