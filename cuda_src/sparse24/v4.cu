// sparse24/v4.cu — v4: Hopper's sparse wgmma (wgmma.mma_async.sp), fed by TMA, warp-specialised (the ladder and the
// format: sparse24.cuh). The second tensor-core design, after v2's mma.sp.sync: the structure of linear's v11 (a
// producer warpgroup drives TMA through an mbarrier ring, two consumer warpgroups issue asynchronous MMAs that read
// both operands from shared memory) with the sparse instruction.
//
// Operands. The sparse operand of wgmma.sp must be A, so the product is computed transposed: D = W·xᵀ, D (rows of W
// x rows of x) = yᵀ. A = the kept values of 64 rows of W per instruction (64 x 16 stored = 64 x 32 dense, 32 B a
// row), B = 256 rows of x (K-major, 32 columns = 64 B a row), the metadata a register per thread.
//   m64n256k32 per instruction: 64·256·32 = 524k MACs, twice a dense m64n256k16's at the same issue cost on paper.
//   Metadata (PTX ISA, sparse wgmma, 16-bit types, selector 0): warp w of the warpgroup holds rows 16w..16w+15, and
//   within a warp the layout of mma.sp m16n8k32 (v2.cu): lanes with lane % 4 in {0, 1} give row g = lane / 4 in the
//   low 16 bits and row g + 8 in the high ones, lane & 1 choosing groups 0..3 or 4..7 of the k32 step. The format's
//   word per (row, 32 columns) is exactly one step, so a thread builds its register from two words as v2 does.
// Tile and stages. A block computes 128 rows of W x 256 rows of x (two consumer warpgroups of 64 rows, 128 fp32
// accumulators a thread); a stage holds 64 dense columns: the kept values in a (128 rows, 64 B) box in the 64-B
// swizzle (8 KB) and x in a (256 rows, 128 B) box in the 128-B swizzle (32 KB); two wgmma.sp per stage and warpgroup
// (the A descriptor steps 32 B, the B one 64 B). 5 stages = 200 KB: one block per SM.
//   Napkin math: 4096^3 = 137 GFLOP (dense count); the smem fill per stage is 40 KB for 4.2 MFLOP (105 FLOP/B). Dense
//   wgmma reads 2 KB of A + 8 KB of B per m64n256k16 (~128 cycles at the dense rate: 80 B/cycle); the sparse one
//   2 KB + 16 KB in the same time on paper: ~144 B/cycle, above the 128 B/cycle an SM's shared memory delivers. So
//   the sparse instruction with B from shared memory cannot run at twice the dense rate here: ~1.8x at most before
//   anything else (the metadata loads, the barriers, the epilogue).
// Metadata. Each consumer thread fetches the 4 words its metadata registers are built from (rows r and r + 8 of W,
// the stage's two k32 steps) itself, one stage ahead, with cp.async into a private 16-byte slot of shared memory (two
// slots: this stage's and the next's), and reads them back with one ld.shared after cp.async.wait_group: the same
// thread writes and reads, so no barrier orders them. Words past K or N copy kEmptyMeta (their values are TMA's zero
// fill). Two designs before this one, kept in the history: (1) metadata straight from global memory into registers a
// stage ahead: wrong results, because the sparse MMA reads its metadata register after it issues and a register
// reloaded while the MMA was in flight gave it the next stage's metadata (the compiler does not know the asm reads it
// late); (2) the producer warp staging each stage's metadata for all consumers and arriving on the stage's barrier:
// correct, but it waited an L2 round trip per stage (ncu's top stall: long_scoreboard) or, with cp.async and
// cp.async.mbarrier.arrive, was flagged by racecheck (its consumers' reads against the next copies into the slot).
// Because of (1), each consumer retires its stage's MMAs (wgmma.wait_group 0) before it builds the next stage's
// registers: the other consumer warpgroup's MMAs can run while one waits (how much they cover: ncu's TC%).
// Epilogue: y = Dᵀ + b goes through shared memory (the ring, free once both consumers are done: a named barrier of
// their 256 threads) so that its stores are 16-byte and along N.
// Limits: TMA needs 16-byte aligned rows of x (K % 8 == 0) and bases; Hopper only. Otherwise this launcher returns
// cudaErrorInvalidValue / cudaErrorNotSupported and the binding runs v2 (cpp_src/sparse24/sparse24.cpp).
// lab:variants dtype=bf16,f16
#include "lab_sm90.cuh"
#include "sparse24.cuh"

#include <type_traits>

namespace sparse24 {

// What a metadata word past K or N reads (a valid nibble in every group; the values there are TMA's zero fill).
__device__ const uint32_t kEmptyWord = kEmptyMeta;

namespace v4cfg {
constexpr int BW = 128, BX = 256, BK = 64;            // rows of W, rows of x, dense columns of W per stage
constexpr int STAGES = 5, THREADS = 384;              // a producer warpgroup + two consumer warpgroups
constexpr int A_BYTES = BW * 64, B_BYTES = BX * 128;  // (128 rows, 32 kept values) + (256 rows, 64 x values)
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;        // 40 KB: a multiple of 1024 B (the swizzles' repeat)
constexpr int Y_STRIDE = BW + 8;                      // the epilogue's y tile (BX rows of x, BW columns), padded
constexpr int META_SLOT = 256 * 16;                  // a consumer thread's 4 metadata words, for 256 threads
constexpr int SMEM = STAGES * STAGE_BYTES + 2 * META_SLOT + 1024 /* alignment slack */ + 2 * STAGES * 8 /* barriers */;
static_assert(BX * Y_STRIDE * 2 <= STAGES * STAGE_BYTES, "the y tile reuses the ring");
}  // namespace v4cfg

// D (64 x 256, fp32, 128 registers a thread) += A (64 x 32, 2:4, smem) · B (32 x 256, smem); scale-d = 1 (D is
// zeroed before the first step), no negation, both operands K-major.
__device__ __forceinline__ void wgmma_sp(float* d, uint64_t da, uint64_t db, uint32_t e, __nv_bfloat16) {
#ifdef LAB_SM90A
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sp.sync.aligned.m64n256k32.f32.bf16.bf16 {" LAB_WG_REGS128 "}, %128, %129, %130, 0, "
               "p, 1, 1, 0, 0;\n}\n"
               : LAB_WG_ACC128(d)
               : "l"(da), "l"(db), "r"(e));
#endif
}
__device__ __forceinline__ void wgmma_sp(float* d, uint64_t da, uint64_t db, uint32_t e, __half) {
#ifdef LAB_SM90A
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sp.sync.aligned.m64n256k32.f32.f16.f16 {" LAB_WG_REGS128 "}, %128, %129, %130, 0, "
               "p, 1, 1, 0, 0;\n}\n"
               : LAB_WG_ACC128(d)
               : "l"(da), "l"(db), "r"(e));
#endif
}

__global__ void __launch_bounds__(v4cfg::THREADS, 1)
    v4_kernel(const __grid_constant__ CUtensorMap tmw, const __grid_constant__ CUtensorMap tmx,
              const int32_t* __restrict__ meta, const T* __restrict__ b, T* __restrict__ y, int M, int N, int K,
              bool vec_y) {
#ifdef LAB_SM90A
  using namespace v4cfg;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = lab::smem_u32(smem_raw);
  const uint32_t s0 = (raw + 1023) & ~1023u;  // the 128-B swizzle's pattern repeats every 1024 B
  const uint32_t meta_s = s0 + STAGES * STAGE_BYTES;   // 2 slots x 256 consumer threads x 4 words
  const uint32_t full = meta_s + 2 * META_SLOT, empty = full + STAGES * 8;
  const lab::Tile tl = lab::tile_of(blockIdx.x, int(lab::ceil_div(N, BW)), int(lab::ceil_div(M, BX)));
  const int n0 = tl.m * BW, m0 = tl.n * BX;
  const int Kp = int(padded_k(K)), words = Kp / 32;
  const int nk = int(lab::ceil_div(Kp, BK));
  const int role = threadIdx.x / 128, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      lab::mbar_init(full + 8 * s, 1);   // the producer's arrive.expect_tx, then the TMA bytes
      lab::mbar_init(empty + 8 * s, 8);  // one arrive per consumer warp
    }
    lab::mbar_fence_init();
  }
  __syncthreads();

  if (role == 0) {
    lab::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) lab::mbar_wait(empty + 8 * s, ((kt / STAGES) + 1) & 1);  // consumers freed it
        lab::mbar_expect_tx(full + 8 * s, STAGE_BYTES);  // the full boxes count, zero-filled parts included
        const uint32_t sa = s0 + s * STAGE_BYTES;
        lab::tma_load_2d(sa, &tmw, kt * (BK / 2), n0, full + 8 * s);        // kept values: columns of values
        lab::tma_load_2d(sa + A_BYTES, &tmx, kt * BK, m0, full + 8 * s);    // x: columns of x (zeros past K)
      }
    }
    return;  // (the consumers' named barriers below count their own 256 threads only)
  }
  lab::setmaxnreg_inc<232>();
  const int c = role - 1;                     // rows 64c .. 64c+63 of the block's 128 rows of W
  const int w = (threadIdx.x / 32) % 4, g = lane / 4;
  const int r0 = n0 + 64 * c + 16 * w + g;    // this thread's two rows of W for the metadata: r0, r0 + 8
  const uint32_t my_meta = meta_s + 16 * (threadIdx.x - 128);   // + slot * META_SLOT
  // Stage kt's 4 words -> this thread's slot kt % 2: (r0, step 0), (r0, step 1), (r0 + 8, step 0), (r0 + 8, step 1)
  auto fetch_meta = [&](int kt) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = r0 + 8 * (j / 2), wd = kt * 2 + j % 2;
      const bool in = r < N && wd < words;
      lab::cp_async4(my_meta + (kt % 2) * META_SLOT + 4 * j,
                     in ? static_cast<const void*>(meta + int64_t(r) * words + wd) : &kEmptyWord, 4);
    }
    lab::cp_async_commit();
  };

  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  fetch_meta(0);
  for (int kt = 0; kt < nk; ++kt) {
    const int s = kt % STAGES;
    if (kt + 1 < nk) {
      fetch_meta(kt + 1);          // into the other slot, read (by this thread) one stage ago
      lab::cp_async_wait<1>();     // stage kt's words have landed
    } else {
      lab::cp_async_wait<0>();
    }
    // The registers of the stage's two k32 steps: row r0 (low half) and r0 + 8 (high half), groups 0..3 or 4..7.
    // (No wgmma of this warpgroup is in flight here: the previous stage's group was retired below.)
    const uint4 m4 = lab::lds_u32x4(my_meta + (kt % 2) * META_SLOT);
    const uint32_t e[2] = {(lane & 1) ? (m4.x >> 16) | (m4.z & 0xffff0000u) : (m4.x & 0xffffu) | (m4.z << 16),
                           (lane & 1) ? (m4.y >> 16) | (m4.w & 0xffff0000u) : (m4.y & 0xffffu) | (m4.w << 16)};
    lab::mbar_wait(full + 8 * s, (kt / STAGES) & 1);
    const uint32_t sa = s0 + s * STAGE_BYTES + c * 64 * 64, sb = s0 + s * STAGE_BYTES + A_BYTES;
    lab::fence_regs<128>(d);
    lab::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      wgmma_sp(d, lab::smem_desc<64>(sa + 32 * kk), lab::smem_desc<128>(sb + 64 * kk), e[kk], T{});
    lab::wgmma_commit();
    lab::wgmma_wait<0>();   // this stage's MMAs are done with its smem and its metadata registers
    lab::fence_regs<128>(d);
    if (lane == 0) lab::mbar_arrive(empty + 8 * s);
  }

  // Epilogue: both consumers are done reading the ring (and every TMA write landed: they waited for each stage).
  lab::named_barrier(1, 256);
  T* Ys = reinterpret_cast<T*>(smem_raw + (s0 - raw));  // [BX rows of x][Y_STRIDE], columns = rows of W
  const int nr = 64 * c + 16 * w + g;                   // D's row (a column of y) of d[4j], d[4j+1]; +8: d[4j+2..3]
  const float b0 = (b && n0 + nr < N) ? to_f(b[n0 + nr]) : 0.f;
  const float b1 = (b && n0 + nr + 8 < N) ? to_f(b[n0 + nr + 8]) : 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int mr = 8 * j + 2 * (lane % 4);              // D's columns (rows of y) of d[4j], d[4j+2]; +1: the odd ones
    Ys[mr * Y_STRIDE + nr] = from_f<T>(d[4 * j] + b0);
    Ys[(mr + 1) * Y_STRIDE + nr] = from_f<T>(d[4 * j + 1] + b0);
    Ys[mr * Y_STRIDE + nr + 8] = from_f<T>(d[4 * j + 2] + b1);
    Ys[(mr + 1) * Y_STRIDE + nr + 8] = from_f<T>(d[4 * j + 3] + b1);
  }
  lab::named_barrier(1, 256);
  for (int i = threadIdx.x - 128; i < BX * (BW / 8); i += 256) {
    const int r = i / (BW / 8), cc = (i % (BW / 8)) * 8;
    if (m0 + r >= M || n0 + cc >= N) continue;
    const T* src = Ys + r * Y_STRIDE + cc;
    T* dst = y + int64_t(m0 + r) * N + n0 + cc;
    if (vec_y && n0 + cc + 8 <= N) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && n0 + cc + e < N; ++e) dst[e] = src[e];
    }
  }
#endif
}

// Where the metadata designs (header) stand, measured on the H100 (results.csv, 4096^3 bf16, and the ncu rows beside
// them): (2) with cp.async (commits f5934d5, 0b89ecd) is the fastest build so far; this one, kept because racecheck
// passes it, is slower. Each consumer thread issues 4 small copies a stage, the 4 lanes of a quad fetch the same 4
// words, and one stage of look-ahead does not cover the L2 latency: ncu's top stall is long_scoreboard, and the
// tensor pipe is busier in (2). The next step: each lane of a quad fetches one of the quad's 4 words into a slot the
// quad shares (its cp.async.wait_group, then __syncwarp, order the copies before the quad's reads: warp-local, which
// racecheck follows), three stages ahead.

cudaError_t forward_v4(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
                       cudaStream_t s) {
  using namespace v4cfg;
  if (lab::device_attr<cudaDevAttrComputeCapabilityMajor>(0) != 9) return cudaErrorNotSupported;  // sm_90a only
  // TMA: rows of x 16-byte aligned (K % 8 == 0) and both bases (values' rows are Kp/2 elements: multiples of 32 B)
  if (K % 8 != 0 || !aligned16(x) || !aligned16(values)) return cudaErrorInvalidValue;
  const int64_t tiles = lab::ceil_div(N, BW) * lab::ceil_div(M, BX);
  if (tiles > 2147483647) return cudaErrorInvalidConfiguration;
  constexpr CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUtensorMap tmw, tmx;
  // values (N, Kp/2) in (128 rows, 64 B) boxes, 64-B swizzle; x (M, K) in (256 rows, 128 B) boxes, 128-B swizzle
  if (!lab::make_tensor_map(&tmw, values, dt, 2, padded_k(K) / 2, N, BW, 64) ||
      !lab::make_tensor_map(&tmx, x, dt, 2, K, M, BX, 128))
    return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(v4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (e != cudaSuccess) return e;
  const bool vec_y = N % 8 == 0 && aligned16(y);
  v4_kernel<<<unsigned(tiles), THREADS, SMEM, s>>>(tmw, tmx, meta, b, y, M, N, K, vec_y);
  return cudaGetLastError();
}

}  // namespace sparse24

LAB_EXPORTS(LAB_EXPORT("v4", sparse24::forward_v4))
