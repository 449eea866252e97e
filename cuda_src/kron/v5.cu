// kron/v5.cu — version 5: v4's two wgmma steps fed by TMA, with no operand staged per sample by the threads.
//
// v4 (v4.cu) puts both products on wgmma, but its threads stage every operand: x[b] and the factors are loaded into
// registers and stored transposed, element by element, into K-major tiles (TF32 wgmma takes nothing else). At batch
// 1024 that staging, four block-wide barriers a sample and a prefetch of one sample in registers made it slower than
// v3's mma.sync (results/: bf16 91.8 against 80.4 us). bf16 wgmma also reads "MN-major" operands (the transpose bits
// of the instruction), and those are the layouts x and the factors already have in memory. So here:
//  - the tensor memory accelerator copies x[b], W_2's slice and W_1 into shared memory as they are (64-element
//    boxes, 128-byte swizzle); a producer warpgroup (one thread) keeps a ring of `slots` samples in flight, a "full"
//    and an "empty" mbarrier per slot;
//  - the factors are loaded once per block (one persistent block per SM walks its samples);
//  - the state between the factors and the output tile go from the accumulators to shared memory with
//    stmatrix.trans (one instruction per four 8×8 blocks, already in the layout the next step and the TMA store
//    read), and y leaves by TMA store while the next sample is multiplied;
//  - two consumer warpgroups, in one of two schedules (cfg): 0 "split", both on every sample with half of its 64-row
//    tiles each (a lone sample's chain is shortest), or 1 "ping-pong", each on every other sample with all of its
//    tiles, a T/Y buffer and half of the ring of its own (one warpgroup's stores and barriers overlap the other's
//    wgmma).
//
// The algebra (K = 2; y[b] = W_2ᵀ · X_b · W_1, X_b = x[b] read as (f_2, f_1); kron.cuh): a block owns the c columns
// j0.. of W_2 (a slice; c = 64 or 128) and, per sample,
//   step 1  Tᵀ (f_1 × c) = X_bᵀ · W_2[:, j0:j0+c]    A = X_b (M = p, K = i, MN-major), B = W_2 slice (N-major)
//   step 2  Yᵀ (f_1 × c) = W_1ᵀ · Tᵀ                  A = W_1 (M = n, K = p, MN-major), B = Tᵀ (K-major, ours)
//   y[b][(j0 + j)·f_1 + n] = Y[j][n]
// Both steps have M = f_1 (64-row tiles, shared by the two warpgroups) and N = c. T is rounded to bf16 between the
// steps, as cuBLAS-factorwise rounds its intermediate.
//
// Napkin math (H100 SXM, bf16, 128 × 128, c = 128): per sample 2 · 128³ = 4.2 M MAC, 32 KB of x in and 32 KB of y
// out. Batch 1024 on 132 SMs: 7.8 samples an SM; the 67 MB of x and y take 22 us at the 3.0 TB/s the lab's copy probe
// measures, the multiplies 9 us at the dense bf16 rate. Shared memory: slots × 32 KB of x, W_2 slice 32, W_1 32, T/Y
// 32 KB: split takes 4 slots (224 KB); ping-pong's second T/Y buffer leaves 2, one per consumer's ring (192 KB).
// Little's law asks ~40 KB in flight an SM for 3 TB/s at ~1.5 us of latency. Measured (H100, graph): 30.5 us at batch 1024,
// ncu: DRAM at 62% of the copy probe, the tensor pipe at 55%. Batch 32: c = 64 gives 64 blocks of one (sample, half)
// each; the floor there is one chain: the HBM round trip for x and the factors, two dependent products, the store
// (7.8 us; batch 1: 7.0 us). Where its time goes, from %globaltimer stamps in a dev copy of this kernel (H100, L2
// flushed, the slowest of the 64 blocks, from the first block's entry): barriers set up 0.6 us (the parameters'
// fetch), every load issued 1.3, the factors in 1.3, x in 2.4, step 1 done 3.0, T stored 3.3, step 2 done 3.9, y
// handed to TMA 4.2 and read out 4.5 us. The rest of the 7.8 us is the launch: an empty kernel replayed from a CUDA
// graph takes 3.2-3.5 us of GPU time (and 3.3-7.7 us of the host's across runs, which lab.timing counts where it is
// the larger). A 1.5x goal against torch.bmm's two GEMMs (9.2 us of GPU time) leaves 6.1 us, 2.9 above that empty
// kernel, for a chain that takes 4.5 here.
//
// TF32 (float32 tensors, the "f32" build). TF32 wgmma takes only K-major shared operands, and x[b] is MN-major in
// step 1 whichever way the product is written. So there x goes through registers: the A operand of step 1 may come
// from registers (the fragment layout of mma.m16n8k8), loaded from the TMA'd tile with 32-bit shared loads and
// rounded to TF32 on the way (cvt.rna: the tensor core would truncate, which measured over TF32's tolerance in v3).
// The ring then holds chunks of 32 rows of x[b] (16 KB at f_1 = 128) instead of whole samples: a chunk is free as
// soon as its fragments are in registers. The factors are staged once per block by the consumer threads, transposed
// into K-major tiles and rounded (v4's staging, done once instead of per sample); the state and y leave the
// accumulators by 32-bit stores (stmatrix moves 16-bit elements only). Napkin math (fp32, 128 × 128, batch 1024):
// 134 MB of x and y, 45 us at the 3.0 TB/s copy probe; 8.6 GFLOP, 17 us at the dense TF32 rate. Shared memory at
// c = 128: W_2ᵀ 64 KB, W_1ᵀ 64, T/Y 64, two 16-KB chunks of x (224 KB); at c = 64: 32 + 64 + 32 and six chunks.
// Measured (H100, graph, batch 1024): c = 128 77.4 us, c = 64 82.5 us (each block loads every x fragment for half
// the outputs). ncu at c = 128: DRAM 45% of the copy probe, the tensor pipe at 28%, the warps mostly waiting for x
// (long scoreboard): two chunks in flight are short of the ~40 KB above.
// cfg 2 frees that shared memory: step 2's A operand, W_1ᵀ, may come from registers too, and it is the same for every
// sample, so each consumer thread loads its fragments once (64 registers at f_1 = 128; a warpgroup holds one 64-row
// tile in "split") and W_1ᵀ's 64 KB go to the ring: six chunks (96 KB) in flight at c = 128. Measured (H100, graph,
// same run): batch 1024 69.6 us against split's 76.4 (torch.bmm.tf32 106.0), batch 4096 213.4 against 229.9, batch
// 32 (c = 64) 20.7 against 21.9. The ring is no longer what bounds it: 16-row chunks (twelve in flight) measured
// 71.0 us at batch 1024 and ten 32-row slots at c = 64 75.0, against 70.1 and 73.5 in the same run.
//
// Tried and taken out: the producer prefetching x of the sample one or two on into L2
// (cp.async.bulk.prefetch.tensor) ahead of the ring's TMA loads, against the TF32 build's wait for x at batch 1024.
// Slower everywhere on the H100 (graph): TF32 batch 1024 77.3 -> 87.1 us, batch 4096 231 -> 281 us; bf16 batch 1024
// 30.5 -> 34.0 us, batch 32 7.8 -> 9.5 us.
//
// Scope: K = 2, f_1 and f_2 multiples of 64 up to 256 (a TMA box has at most 256 rows), bfloat16 or float32 (TF32),
// an sm_90 device (wgmma; the module is built for sm_90a); elsewhere the plan says fits = 0 and the binding runs v3.
// lab:variants dtype=f32,bf16
#include "kron.cuh"
#include "lab_sm90.cuh"
#include "plan_info.h"

#include <cuda_bf16.h>

#include <climits>

namespace kron {
namespace tma {

#if defined(LAB_VARIANT_dtype_bf16)
using Elem = __nv_bfloat16;
constexpr bool kTF32 = false;
constexpr CUtensorMapDataType kMapType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
#else
using Elem = float;  // multiplied in TF32
constexpr bool kTF32 = true;
constexpr CUtensorMapDataType kMapType = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
#endif
constexpr int E = int(sizeof(Elem));
constexpr int kBox = 128 / E;        // elements in one 128-byte row: the box width and the swizzle atom (64 or 32)
constexpr int kStepK = 32 / E;       // k per wgmma: 16 (bf16), 8 (TF32)
constexpr int kChunkTF32 = 32;       // rows of x[b] per ring slot in TF32 (bf16: a whole sample)
constexpr int kBlockThreads = 384;   // a producer warpgroup (one thread issues the copies) and two consumers
constexpr int kMaxSlots = 8;
constexpr int kMaxF = 256;           // TMA box rows
constexpr int kW1Steps = 16;         // cfg 2 (TF32): k-steps of W_1ᵀ held in registers, f_1 <= 128

struct Args {
  long B;
  const Elem* w1;  // TF32: the factors, staged by the threads (bf16: TMA)
  const Elem* w2;
  int f1, f2, nslices, slots, kc;  // kc: rows of x[b] per slot (bf16: f2)
  bool pingpong;                   // cfg 1 (below); cfg 2 is the kernel's W1R
  uint32_t slot_bytes, t_bytes, off_w2, off_w1, off_t, off_bar;  // byte offsets from the 1024-aligned base (slots at 0)
};

// Byte offset of (row r, byte b of the row) in a 128-byte-swizzled tile: 8-row groups of 1024 B, the 16-byte chunks
// of row r XOR-ed with r % 8 (the pattern TMA writes and wgmma reads).
__device__ __forceinline__ uint32_t swz(int r, int b) {
  return uint32_t((r >> 3) * 1024 + (r & 7) * 128 + ((((b >> 4) ^ (r & 7))) << 4) + (b & 15));
}

// Shared-memory matrix descriptor, 128-byte swizzle: SBO = 1024 (8 rows of 128 B); LBO = the stride between 64-element
// blocks along M/N for MN-major operands (unused by K-major ones). Canonical layouts: the PTX ISA's wgmma section.
__device__ __forceinline__ uint64_t desc(uint32_t saddr, uint32_t lbo) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// ---- the wgmma forms: D (64 × NC, fp32) (+)= A (64 × kStepK) · B (kStepK × NC) ----------------------------------
#define KRON_V5_REGS32                                                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KRON_V5_ACC32(d) LAB_WG_ACC8(d, 0), LAB_WG_ACC8(d, 8), LAB_WG_ACC8(d, 16), LAB_WG_ACC8(d, 24)

// both operands from shared memory; TA/TB = 1: the operand is MN-major (16-bit types only)
template <int NC, int TA, int TB>
__device__ __forceinline__ void mma(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef LAB_SM90A
  if constexpr (!kTF32 && NC == 128) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LAB_WG_REGS64
                 "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : LAB_WG_ACC64(d)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
  } else if constexpr (!kTF32) {
    static_assert(NC == 64, "slices of 64 or 128 columns");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" KRON_V5_REGS32
                 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : KRON_V5_ACC32(d)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
  } else if constexpr (NC == 128) {
    static_assert(TA == 0 && TB == 0, "TF32 operands are K-major");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" LAB_WG_REGS64 "}, %64, %65, p, 1, 1;\n}\n"
                 : LAB_WG_ACC64(d)
                 : "l"(da), "l"(db), "r"(scale_d));
  } else {
    static_assert(TA == 0 && TB == 0 && NC == 64, "TF32 operands are K-major");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" KRON_V5_REGS32 "}, %32, %33, p, 1, 1;\n}\n"
                 : KRON_V5_ACC32(d)
                 : "l"(da), "l"(db), "r"(scale_d));
  }
#endif
}

// TF32 with A from registers: a[0..3] = A(g, t), A(g+8, t), A(g, t+4), A(g+8, t+4) of the warp's 16 rows
template <int NC>
__device__ __forceinline__ void mma_ra(float* d, const uint32_t (&a)[4], uint64_t db, int scale_d) {
#ifdef LAB_SM90A
  if constexpr (NC == 128) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" LAB_WG_REGS64
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : LAB_WG_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  } else {
    static_assert(NC == 64, "slices of 64 or 128 columns");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" KRON_V5_REGS32
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : KRON_V5_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
#endif
}

// The warpgroup index through a shuffle, so that ptxas knows it is warp-uniform (v4.cu says why it matters).
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, int(threadIdx.x) >> 7, 0); }

// Register A operands are read by the asynchronous wgmma after it issues: keep the compiler from reusing their
// registers before the wait that retires it (the values are "used" again here).
template <int KSC, int MT>
__device__ __forceinline__ void fence_frag(uint32_t (&f)[KSC][MT][4]) {
#pragma unroll
  for (int k = 0; k < KSC; ++k)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(f[k][i][r])::"memory");
}

template <int MT, int NC>
__device__ __forceinline__ void fence_acc(float (&acc)[MT][NC / 2]) {
#pragma unroll
  for (int i = 0; i < MT; ++i) lab::fence_regs<NC / 2>(acc[i]);
}

using lab::lds32;
using lab::sts32;
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void stsm_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#ifdef LAB_SM90A
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#endif
}

// The accumulators of m-tile mt (rows m = 64·mt + 16·warp + g + 8h, columns j = 8·jn + 2t + u) into the buffer as
// rows j, m contiguous, in kBox-wide slabs of NC rows (slab m / kBox): step 2's K-major B operand, and the TMA store's
// boxes. ROUND: the state (rounded to TF32 for step 2, which would truncate; bf16 is rounded by the conversion).
// bf16: stmatrix.trans takes a thread's (row g, columns 2t, 2t+1) pair of four 8×8 blocks and writes each block's
// column j as 16 contiguous bytes (8 m) at the address lane 8q + (j & 7) gives: blocks (h, jn) = (0, jn), (1, jn),
// (0, jn + 1), (1, jn + 1); the 8 rows of a phase are 8 consecutive j, 8 distinct 16-byte chunks: no conflicts.
// fp32: one 32-bit store per value; a warp's 32 stores are 4 rows j (2t + u) × 8 consecutive m, whose 16-byte chunks
// the swizzle spreads over all 32 banks.
template <int NC, bool ROUND>
__device__ __forceinline__ void store_rows(uint32_t buf, int mt, const float* d, int warp, int lane) {
  if constexpr (!kTF32) {
    const int q = lane >> 3, r = lane & 7, h = q & 1;
    const uint32_t at = buf + uint32_t(mt * NC * 128 + (q >> 1) * 1024 + r * 128 + (((2 * warp + h) ^ r) << 4));
#pragma unroll
    for (int jn = 0; jn < NC / 8; jn += 2)
      stsm_x4_trans(at + uint32_t(jn * 1024), pack_bf16(d[4 * jn], d[4 * jn + 1]),
                    pack_bf16(d[4 * jn + 2], d[4 * jn + 3]), pack_bf16(d[4 * jn + 4], d[4 * jn + 5]),
                    pack_bf16(d[4 * jn + 6], d[4 * jn + 7]));
  } else {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = 64 * mt + 16 * warp + g + 8 * h;
      const uint32_t slab = buf + uint32_t((m >> 5) * NC * 128);
      const int mb = (m & 31) * 4;
#pragma unroll
      for (int jn = 0; jn < NC / 8; ++jn)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float v = d[4 * jn + 2 * h + u];
          sts32(slab + swz(8 * jn + 2 * t + u, mb), ROUND ? lab::round_tf32(v) : __float_as_uint(v));
        }
    }
  }
}

// TF32: a factor (rows × cols row-major in memory, columns col0.. of it) into a K-major tile of `cols` rows (its
// columns), k = its rows, in 32-wide slabs of `cols` rows; rounded to TF32. Once per block, by the 256 consumers.
// rows and cols are multiples of 64.
__device__ __forceinline__ void stage_factor_t(uint32_t dst, const float* __restrict__ w, int rows, int ld, int col0,
                                               int cols, int ctid) {
  // the loop's trip count is the same for every thread (rows·cols is a multiple of 256): with `e < rows·cols` as its
  // exit, ptxas took the loop for a divergent path and serialized every wgmma of the kernel (C7520)
  for (int e0 = 0; e0 < rows * cols; e0 += 256) {
    const int e = e0 + ctid, k = e / cols, r = e - k * cols;
    sts32(dst + uint32_t((k >> 5) * cols * 128) + swz(r, (k & 31) * 4),
          lab::round_tf32(__ldg(w + long(k) * ld + col0 + r)));
  }
}

// The two schedules (cfg): both consumer warpgroups on every sample, each with half of its 64-row tiles (0, "split":
// a sample's latency is halved, for blocks with one or two samples), or each warpgroup on every other sample with all
// of its tiles and a T/Y buffer of its own (1, "ping-pong": one warpgroup's stores and barriers run while the other's
// wgmma keep the tensor cores busy). The ring holds `slots` chunks of kc rows of x[b] (bf16: whole samples).
// W1R (cfg 2, TF32 only): "split", with W_1ᵀ — step 2's A operand — held in registers as wgmma fragments for the
// whole kernel instead of in shared memory. At f_1 = 128 that is 16 k-steps × 4 = 64 registers a thread (a warpgroup
// holds one 64-row tile), and it frees W_1ᵀ's 64 KB for the ring: six 16-KB chunks of x in flight instead of two at
// c = 128, against the wait for x that bounds cfg 0 (see the header).
template <int NC, bool W1R>
__global__ void __launch_bounds__(kBlockThreads, 1)
    tma_kernel(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw2,
               const __grid_constant__ CUtensorMap tw1, const __grid_constant__ CUtensorMap ty,
               const __grid_constant__ Args a) {
#ifdef LAB_SM90A
  // 64-row tiles a warpgroup can hold: 128 accumulators a thread (bf16); TF32 also keeps two chunks of A fragments
  constexpr int MT = W1R ? 1 : kTF32 ? (NC == 64 ? 2 : 1) : 256 / NC;
  static_assert(!W1R || kTF32, "W_1 in registers: the TF32 build's register-A wgmma");
  constexpr int KSC = kChunkTF32 / 8;  // TF32 k-steps per chunk
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (lab::smem_u32(smem_raw) + 1023) & ~1023u;  // the swizzle repeats every 1024 B
  const uint32_t w2s = base + a.off_w2, w1s = base + a.off_w1;
  const uint32_t full = base + a.off_bar, empty = full + 8 * kMaxSlots, wbar = empty + 8 * kMaxSlots;
  const int f1 = a.f1, f2 = a.f2, S = a.slots, kc = a.kc, cps = f2 / kc, mtiles = f1 / 64;
  const bool pp = a.pingpong;
  // ping-pong splits the ring in two, one per consumer: a warpgroup must wait on its slots' phases in order. In one
  // shared ring a warpgroup's next chunk can sit a phase beyond a chunk of the other's that has not landed yet, and a
  // parity wait two phases ahead passes at once (the first TF32 build read stale x that way at batch 1000).
  const int RS = pp ? S / 2 : S;
  const int j0 = int(blockIdx.x % a.nslices) * NC;
  const long b0 = blockIdx.x / a.nslices, bstep = gridDim.x / a.nslices;  // the grid is a multiple of nslices
  const long items = b0 < a.B ? (a.B - 1 - b0) / bstep + 1 : 0;
  const int wg = warpgroup(), warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    lab::prefetch_tensormap(&tx);  // the descriptors' fetch overlaps the set-up (TF32 passes tx for both factors)
    lab::prefetch_tensormap(&ty);
    if constexpr (!kTF32) {
      lab::prefetch_tensormap(&tw2);
      lab::prefetch_tensormap(&tw1);
    }
    for (int s = 0; s < kMaxSlots; ++s) {
      lab::mbar_init(full + 8 * s, 1);            // the producer's expect_tx, then the bytes
      lab::mbar_init(empty + 8 * s, pp ? 4 : 8);  // every warp that reads the slot
    }
    lab::mbar_init(wbar, 1);
    lab::mbar_fence_init();
  }
  __syncthreads();
  if (items == 0) return;

  if (wg == 0) {  // ---- producer: the factors once (bf16), then x[b] chunk by chunk as slots free up
    lab::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      if constexpr (!kTF32) {
        lab::mbar_expect_tx(wbar, uint32_t((NC * f2 + f1 * f1) * E));
        for (int q = 0; q < NC / 64; ++q) lab::tma_load_2d(w2s + uint32_t(q * f2 * 128), &tw2, j0 + q * 64, 0, wbar);
        for (int q = 0; q < f1 / 64; ++q) lab::tma_load_2d(w1s + uint32_t(q * f1 * 128), &tw1, q * 64, 0, wbar);
      }
      for (long n = 0; n < items; ++n)
        for (int q = 0; q < cps; ++q) {
          const int owner = pp ? int(n & 1) : 0;                   // the ring of the warpgroup that takes it
          const long idx = (pp ? n >> 1 : n) * cps + q;             // the chunk's place in that ring
          const int slot = owner * RS + int(idx % RS);
          if (idx >= RS) lab::mbar_wait(empty + 8 * slot, uint32_t(idx / RS - 1) & 1u);
          const uint32_t bar = full + 8 * slot, dst = base + uint32_t(slot) * a.slot_bytes;
          lab::mbar_expect_tx(bar, a.slot_bytes);
          const int row = int((b0 + n * bstep) * f2 + q * kc);  // f1/kBox boxes of (kc rows, kBox columns)
          for (int bx = 0; bx < f1 / kBox; ++bx)
            lab::tma_load_2d(dst + uint32_t(bx * kc * 128), &tx, bx * kBox, row, bar);
        }
    }
    return;
  }

  // ---- consumers
  lab::setmaxnreg_inc<232>();
  const int c = wg - 1;
  const int ctid = threadIdx.x - 128;                        // 0..255 over both consumers
  const int t0 = pp ? 0 : c, tstep = pp ? 1 : 2;             // my m-tiles: t0, t0 + tstep, ...
  const int tiles = (mtiles - t0 + tstep - 1) / tstep;
  const long n0 = pp ? c : 0, nstep = pp ? 2 : 1;            // my samples
  const uint32_t ts = base + a.off_t + (pp ? uint32_t(c) * a.t_bytes : 0u);
  const int bar_id = pp ? 1 + c : 1, bar_n = pp ? 128 : 256;  // named barriers: my warpgroup, or both
  const bool storer = pp ? (threadIdx.x & 127) == 0 : ctid == 0;  // issues (and waits for) the TMA stores of y
  const int ring = pp ? c * RS : 0;                               // my ring's first slot
  if constexpr (kTF32) {  // the factors, transposed to K-major and rounded, once
    stage_factor_t(w2s, reinterpret_cast<const float*>(a.w2), f2, f2, j0, NC, ctid);  // Elem is float here
    if constexpr (!W1R) stage_factor_t(w1s, reinterpret_cast<const float*>(a.w1), f1, f1, 0, f1, ctid);
    lab::fence_proxy_async_smem();
    lab::named_barrier(3, 256);
  } else {
    lab::mbar_wait(wbar, 0);
  }

  // TF32: this thread's A-fragment offsets inside a chunk, for tile i: rows p = 64·mt + 16·warp + g (+8), k rows
  // t (+4) of each 8-row group (x[b] is (kc rows i, f1 columns p), kBox-wide boxes of kc rows)
  uint32_t aoff[MT][2][2];
  if constexpr (kTF32) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int p = 64 * (t0 + tstep * i) + 16 * warp + g + 8 * h, r = t + 4 * hi;
          aoff[i][h][hi] = uint32_t((p / kBox) * kc * 128) + swz(r, (p % kBox) * 4);
        }
  }

  // W1R: step 2's A = W_1ᵀ (M = n, K = p; A(n, p) = W_1[p][n]) for my one m-tile, in the fragment layout of
  // mma_ra: a[0..3] = A(n, k), A(n + 8, k), A(n, k + 4), A(n + 8, k + 4), n = 64·t0 + 16·warp + g, k = 8·ks + t;
  // rounded to TF32 once. The loads run once per block (each warp reads 4 rows × 32 B a k-step).
  uint32_t w1f[W1R ? kW1Steps : 1][4];
  if constexpr (W1R) {
    const float* w1 = reinterpret_cast<const float*>(a.w1);
    const int g = lane >> 2, t = lane & 3, nr = 64 * t0 + 16 * warp + g, ksteps = tiles > 0 ? f1 / 8 : 0;
#pragma unroll
    for (int ks = 0; ks < kW1Steps; ++ks) {
      const float* r0 = w1 + long(8 * ks + t) * f1 + nr;
      const float* r4 = r0 + 4L * f1;
      const bool in = ks < ksteps;  // f_1 = 64: eight k-steps; a warpgroup with no tile loads nothing
      w1f[ks][0] = in ? lab::round_tf32(__ldg(r0)) : 0u;
      w1f[ks][1] = in ? lab::round_tf32(__ldg(r0 + 8)) : 0u;
      w1f[ks][2] = in ? lab::round_tf32(__ldg(r4)) : 0u;
      w1f[ks][3] = in ? lab::round_tf32(__ldg(r4 + 8)) : 0u;
    }
  }

  float acc[MT][NC / 2];
  for (long n = n0; n < items; n += nstep) {
    // ---- step 1: Tᵀ (p × j) = X_bᵀ · W_2[:, j0:j0+c], over the sample's chunks
    if constexpr (!kTF32) {
      const long idx = pp ? n >> 1 : n;  // one chunk a sample
      const int slot = ring + int(idx % RS);
      const uint32_t xs = base + uint32_t(slot) * a.slot_bytes;
      lab::mbar_wait(full + 8 * slot, uint32_t(idx / RS) & 1u);
      lab::wgmma_fence();
      for (int ks = 0; ks < f2 / kStepK; ++ks) {  // k = i down the f2 rows of every box, 16 rows = 2048 B a step
        const uint64_t db = desc(w2s + uint32_t(ks * 2048), uint32_t(f2 * 128));
#pragma unroll
        for (int i = 0; i < MT; ++i)
          if (i < tiles)
            mma<NC, 1, 1>(acc[i], desc(xs + uint32_t((t0 + tstep * i) * f2 * 128 + ks * 2048), uint32_t(f2 * 128)),
                          db, ks > 0);
      }
      lab::wgmma_commit();
      lab::wgmma_wait<0>();
      fence_acc<MT, NC>(acc);
      if (lane == 0) lab::mbar_arrive(empty + 8 * slot);  // this warp is done with the slot
    } else {
      // chunk q: wait for it, load this thread's fragments of its KSC k-steps (two register sets, alternating, so
      // chunk q+1's loads overlap chunk q's wgmma), release it, multiply
      uint32_t fa[2][KSC][MT][4];
      auto chunk = [&](int q, uint32_t(&f)[KSC][MT][4]) {
        const long idx = (pp ? n >> 1 : n) * cps + q;
        const int slot = ring + int(idx % RS);
        const uint32_t xs = base + uint32_t(slot) * a.slot_bytes;
        lab::mbar_wait(full + 8 * slot, uint32_t(idx / RS) & 1u);
        lab::wgmma_wait<1>();  // the wgmma that read this register set (chunk q - 2) are done
        fence_frag<KSC, MT>(f);
#pragma unroll
        for (int ks = 0; ks < KSC; ++ks)
#pragma unroll
          for (int i = 0; i < MT; ++i)
            if (i < tiles) {
              const uint32_t at = xs + uint32_t(ks * 1024);
              f[ks][i][0] = lab::round_tf32(__uint_as_float(lds32(at + aoff[i][0][0])));
              f[ks][i][1] = lab::round_tf32(__uint_as_float(lds32(at + aoff[i][1][0])));
              f[ks][i][2] = lab::round_tf32(__uint_as_float(lds32(at + aoff[i][0][1])));
              f[ks][i][3] = lab::round_tf32(__uint_as_float(lds32(at + aoff[i][1][1])));
            }
        __syncwarp();
        if (lane == 0) lab::mbar_arrive(empty + 8 * slot);  // the fragments are in registers: the slot is free
        lab::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSC; ++ks) {
          const int k = q * kc + ks * 8;  // B = W_2ᵀ slice, K-major: 32-wide slabs of NC rows
          const uint64_t db = desc(w2s + uint32_t((k >> 5) * NC * 128 + (k & 31) * 4), 16u);
#pragma unroll
          for (int i = 0; i < MT; ++i)
            if (i < tiles) mma_ra<NC>(acc[i], f[ks][i], db, q > 0 || ks > 0);
        }
        lab::wgmma_commit();
      };
      for (int q = 0; q < cps; q += 2) {
        chunk(q, fa[0]);
        if (q + 1 < cps) chunk(q + 1, fa[1]);
      }
      lab::wgmma_wait<0>();
      fence_frag<KSC, MT>(fa[0]);
      fence_frag<KSC, MT>(fa[1]);
      fence_acc<MT, NC>(acc);
    }
    if (storer) lab::bulk_wait_read<0>();  // my previous y has left the T/Y buffer
    lab::named_barrier(bar_id, bar_n);
#pragma unroll
    for (int i = 0; i < MT; ++i)
      if (i < tiles) store_rows<NC, true>(ts, t0 + tstep * i, acc[i], warp, lane);
    lab::fence_proxy_async_smem();  // T, written by the threads, is read by the tensor cores
    lab::named_barrier(bar_id, bar_n);

    // ---- step 2: Yᵀ (n × j) = W_1ᵀ · Tᵀ; B = T, K-major: k = p, kBox per slab of NC rows
    lab::wgmma_fence();
    if constexpr (W1R) {
#pragma unroll
      for (int ks = 0; ks < kW1Steps; ++ks)
        if (ks < f1 / 8 && tiles > 0) {
          const int k = ks * 8;
          mma_ra<NC>(acc[0], w1f[ks], desc(ts + uint32_t((k / kBox) * NC * 128 + (k % kBox) * E), 16u), ks > 0);
        }
    } else {
      for (int ks = 0; ks < f1 / kStepK; ++ks) {
        const int k = ks * kStepK;
        const uint64_t db = desc(ts + uint32_t((k / kBox) * NC * 128 + (k % kBox) * E), 16u);
#pragma unroll
        for (int i = 0; i < MT; ++i)
          if (i < tiles) {
            const int mt = t0 + tstep * i;
            if constexpr (!kTF32)  // W_1 as TMA left it: (p rows, 64-wide n boxes), MN-major
              mma<NC, 1, 0>(acc[i], desc(w1s + uint32_t(mt * f1 * 128 + ks * 2048), uint32_t(f1 * 128)), db, ks > 0);
            else  // W_1ᵀ staged K-major: rows n, 32-wide slabs of p
              mma<NC, 0, 0>(acc[i], desc(w1s + uint32_t((k >> 5) * f1 * 128 + mt * 64 * 128 + (k & 31) * 4), 16u),
                            db, ks > 0);
          }
      }
    }
    lab::wgmma_commit();
    lab::wgmma_wait<0>();
    fence_acc<MT, NC>(acc);
    lab::named_barrier(bar_id, bar_n);  // every warp is done reading T: Y goes over it
#pragma unroll
    for (int i = 0; i < MT; ++i)
      if (i < tiles) store_rows<NC, false>(ts, t0 + tstep * i, acc[i], warp, lane);
    lab::fence_proxy_async_smem();
    lab::named_barrier(bar_id, bar_n);
    if (storer) {
      const int row = int((b0 + n * bstep) * f2 + j0);
      for (int bx = 0; bx < f1 / kBox; ++bx) lab::tma_store_2d(&ty, bx * kBox, row, ts + uint32_t(bx * NC * 128));
      lab::bulk_commit();
    }
  }
  // the block may exit once the TMA engine has read its last y out of shared memory: the writes complete before the
  // grid does (as CUTLASS's TMA-store epilogues end; waiting for the writes as well measured no different)
  if (storer) lab::bulk_wait_read<0>();
#endif
}

// ---- plan and launch ------------------------------------------------------------------------------------------------
struct Plan {
  bool ok = false;
  int c = 0, nslices = 0, slots = 0, kc = 0, grid = 0, cfg = 0;
  uint32_t slot_bytes = 0, t_bytes = 0, off_w2 = 0, off_w1 = 0, off_t = 0, off_bar = 0;
  long smem = 0;
  double cost = 0;
};

bool supported(long B, const int* f, int K) {
  if (K != 2 || B <= 0) return false;
  const int f1 = f[0], f2 = f[1];
  if (f1 % 64 || f2 % 64 || f1 > kMaxF || f2 > kMaxF) return false;
  if (B * f2 > INT_MAX) return false;  // TMA row coordinates are 32-bit
  // wgmma and these TMA forms: Hopper (the module is built for sm_90a)
  return lab::device_attr<cudaDevAttrComputeCapabilityMajor>(0) == 9;
}

// Shared memory: the ring's slots (kc rows of x[b] each), W_2's slice, W_1, one T/Y buffer (two for ping-pong), the
// barriers.
Plan layout(int f1, int f2, int c, int slots, int cfg) {
  Plan p;
  p.c = c;
  p.cfg = cfg;
  p.nslices = f2 / c;
  p.slots = slots;
  p.kc = kTF32 ? kChunkTF32 : f2;
  p.slot_bytes = uint32_t(f1 * p.kc * E);
  p.t_bytes = uint32_t(c * f1 * E);
  p.off_w2 = uint32_t(slots) * p.slot_bytes;
  p.off_w1 = p.off_w2 + uint32_t(c * f2 * E);
  p.off_t = p.off_w1 + (cfg == 2 ? 0u : uint32_t(f1 * f1 * E));  // cfg 2: W_1ᵀ lives in registers
  p.off_bar = p.off_t + (cfg == 1 ? 2 : 1) * p.t_bytes;
  p.smem = long(p.off_bar) + 8 * (2 * kMaxSlots + 1) + 1024;  // + the alignment slack
  // the 64-row tiles a warpgroup holds (the kernel's MT): 128 accumulators a thread; TF32 keeps fragments too
  const int mtiles = f1 / 64, held = cfg == 1 ? mtiles : (mtiles + 1) / 2;
  const int mt_max = cfg == 2 ? (kTF32 && f1 <= 8 * kW1Steps ? 1 : 0) : kTF32 ? (c == 64 ? 2 : 1) : 256 / c;
  // a sample's chunks must fit the ring at once in bf16 (one slot a sample); TF32 needs two chunks in flight
  // ping-pong: a ring of slots/2 per consumer (TF32: at least two chunks each, so one loads while one is read)
  const bool ring_ok = cfg == 1 ? slots % 2 == 0 && slots / 2 >= (kTF32 ? 2 : 1) : slots >= 2;
  p.ok = p.smem <= device_facts().smem_optin && held <= mt_max && ring_ok;
  return p;
}

template <int NC, bool W1R> void optin() {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64 || done[dev]) return;
  cudaFuncSetAttribute(tma_kernel<NC, W1R>, cudaFuncAttributeMaxDynamicSharedMemorySize, device_facts().smem_optin);
  done[dev] = true;
}

// Estimated clock cycles of the busiest block: its first sample's chain (the loads' round trip and both steps; the
// same for both schedules, measured), then each further sample at the larger of its multiplies and its share of HBM
// (~20 B/clk an SM): ping-pong overlaps one warpgroup's epilogue with the other's wgmma, split does not. Measured on
// the H100 (bf16, 128 × 128, graph): batch 1024 split 31.2 us, ping-pong 30.5 us (28.7 us with one ring shared by
// the consumers, which raced: see the kernel); batch 32 (one sample a block) 7.7 us either way, c = 64 ahead of
// c = 128 (8.2 us).
Plan search(long B, const int* f, int K, int force_cfg, int force_c) {
  Plan best;
  if (!supported(B, f, K)) return best;
  const int f1 = f[0], f2 = f[1], sms = device_facts().sms;
  for (int c = 128; c >= 64; c /= 2) {
    if (f2 % c || (force_c > 0 && c != force_c)) continue;
    for (int cfg = 0; cfg < 3; ++cfg) {
      if (force_cfg >= 0 && cfg != force_cfg) continue;
      Plan p;
      for (int s = kMaxSlots; s >= 2 && !p.ok; --s) p = layout(f1, f2, c, s, cfg);
      if (!p.ok) continue;
      const long items = B * p.nslices;
      p.grid = int(std::min<long>(items, std::max(sms / p.nslices, 1) * long(p.nslices)));
      const long per_block = (B + p.grid / p.nslices - 1) / (p.grid / p.nslices);
      const double mac = double(c) * f1 * double(f1 + f2);
      // cfg 2 skips staging W_1ᵀ (64 KB at f_1 = 128): its chain is shorter (TF32 batch 32, c = 64: 20.7 us, split
      // 21.9)
      const double first = mac * (kTF32 ? 3.0 : 1.0) / 2048.0 + (cfg == 2 ? 2300.0 : 2500.0);
      // TF32 (fitted): ~270 MAC/clk an SM plus ~1200 clk of epilogue a sample; measured at batch 1024: c = 128 split
      // 76.4-77.4 us, c = 64 split 82.1-82.5, ping-pong 82.6 (ncu: the consumers mostly wait for x). With W_1 in
      // registers and six chunks in flight (cfg 2), ~290: batch 1024 69.6 us (c = 64: 73.3), 4096 213.4 (split 229.9)
      const double next = kTF32 ? mac / (cfg == 2 ? 290.0 : 270.0) + 1200.0
                          : cfg == 1 ? mac / 1400.0
                                     : mac / 1024.0 + 1000.0;
      const double mem = double(f1) * (f2 + c) * E / 20.0;
      p.cost = first + double(per_block - 1) * std::max(next, mem);
      if (!best.ok || p.cost < best.cost * 0.999) best = p;
    }
  }
  return best;
}

// The plan, cached per (device, B, factors, forced cfg and c): kron.cuh's PlanCache says why.
Plan plan(long B, const int* f, int K, int force_cfg, int force_c) {
  static PlanCache<Plan> cache;
  std::vector<long> key = {B, K, force_cfg, force_c};
  key.insert(key.end(), f, f + K);
  return cache.get(std::move(key), [&] { return search(B, f, K, force_cfg, force_c); });
}

void plan_info(int64_t B, int64_t N, const int* f, int K, int cfg, int cols, int64_t* info) {
  (void)N;
  const Plan p = plan(B, f, K, cfg, cols);
  info[kFits] = p.ok;
  info[kCfg] = p.cfg;
  info[kC] = p.c;
  info[kSlices] = p.nslices;
  info[kSmemBytes] = p.smem;
  info[kBlocksPerSm] = p.ok ? 1 : 0;
  info[kron::kThreads] = kBlockThreads;
  info[kTM] = 64;  // the wgmma tile: 64 rows × c columns
  info[kTN] = p.c;
  info[kCost] = int64_t(p.cost);
  info[kSmemLimit] = device_facts().smem_optin;
  info[kStages] = p.slots;  // ring slots: samples (bf16) or 32-row chunks of one (TF32)
}

// the tensor maps of a launch, through lab_sm90.cuh's cache (four encodings a call made small batches host-bound)
bool tensor_map(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int box_rows) {
  return lab::cached_tensor_map(map, base, kMapType, E, cols, rows, box_rows);
}

template <int NC, bool W1R>
cudaError_t launch(const Plan& p, const CUtensorMap& tx, const CUtensorMap& tw2, const CUtensorMap& tw1,
                   const CUtensorMap& ty, const Args& a, cudaStream_t s) {
  optin<NC, W1R>();
  tma_kernel<NC, W1R><<<unsigned(p.grid), kBlockThreads, size_t(p.smem), s>>>(tx, tw2, tw1, ty, a);
  return cudaGetLastError();
}

cudaError_t forward(const Elem* x, Elem* y, const Elem* const* w, const int* f, int K, int64_t B, int64_t N, int cfg,
                    int cols, cudaStream_t s) {
  (void)N;
  if (B == 0) return cudaSuccess;
  const Plan p = plan(B, f, K, cfg, cols);
  if (!p.ok) return cudaErrorInvalidConfiguration;
  if (!aligned16(x) || !aligned16(y) || !aligned16(w[0]) || !aligned16(w[1])) return cudaErrorMisalignedAddress;
  const int f1 = f[0], f2 = f[1];
  CUtensorMap tx, tw2, tw1, ty;
  // every map: (rows, f columns) row-major, boxes of kBox columns (128 B, the swizzle) × kc rows of x, c rows of y,
  // a whole factor (bf16; TF32 stages the factors with the threads and passes x's map in their place)
  if (!tensor_map(&tx, x, f1, B * f2, p.kc) || !tensor_map(&ty, y, f1, B * f2, p.c)) return cudaErrorInvalidValue;
  if (kTF32) {
    tw2 = tx;
    tw1 = tx;
  } else if (!tensor_map(&tw2, w[1], f2, f2, f2) || !tensor_map(&tw1, w[0], f1, f1, f1)) {
    return cudaErrorInvalidValue;
  }
  Args a{};
  a.B = B;
  a.w1 = w[0];
  a.w2 = w[1];
  a.kc = p.kc;
  a.f1 = f1;
  a.f2 = f2;
  a.nslices = p.nslices;
  a.slots = p.slots;
  a.pingpong = p.cfg == 1;
  a.slot_bytes = p.slot_bytes;
  a.t_bytes = p.t_bytes;
  a.off_w2 = p.off_w2;
  a.off_w1 = p.off_w1;
  a.off_t = p.off_t;
  a.off_bar = p.off_bar;
  // cfg 2 (W_1 in registers) exists in the TF32 build only: the bf16 build instantiates the shared-memory kernels
  const bool w1r = kTF32 && p.cfg == 2;
  if (p.c == 128)
    return w1r ? launch<128, kTF32>(p, tx, tw2, tw1, ty, a, s) : launch<128, false>(p, tx, tw2, tw1, ty, a, s);
  return w1r ? launch<64, kTF32>(p, tx, tw2, tw1, ty, a, s) : launch<64, false>(p, tx, tw2, tw1, ty, a, s);
}

}  // namespace tma
}  // namespace kron

// ---- what the binding calls ("kron_v5_plan@f32", "kron_v5_forward@bf16", ...) ---------------------------------------
//   kron_v5_plan:    void (int64_t B, int64_t N, const int* f, int K, int cfg, int cols, int64_t* info)
//   kron_v5_forward: cudaError_t (const T* x, T* y, const T* const* w, const int* f, int K, int64_t B,
//                                 int64_t N, int cfg, int cols, cudaStream_t)   (T: float (TF32) or bf16)
//   cfg: -1 automatic, 0 split, 1 ping-pong, 2 split with W_1 in registers (TF32, f_1 <= 128); fits = 0 where v5
//   does not apply (or the forced cfg does not fit): the binding then runs v3
LAB_EXPORTS(LAB_EXPORT("kron_v5_plan", kron::tma::plan_info), LAB_EXPORT("kron_v5_forward", kron::tma::forward))
