// sparse24/v2.cu — v2: the sparse tensor cores, mma.sp.sync m16n8k32 (the ladder and the format: sparse24.cuh).
// The weight is the MMA's A operand (its rows are the instruction's M, the dimension the 2:4 structure runs along is
// its K), x rows are the B columns: D (16 rows of W x 8 rows of x) += A (16 x 32, stored as 16 x 16 kept values +
// metadata) · B (32 x 8). Per k32 step a warp issues 16 mma.sp on a 64 (rows of W) x 32 (rows of x) warp tile, fed by
// 4 ldmatrix.x4 of compressed W (the kept values sit where a dense m16n8k16 A fragment would), 4 ldmatrix.x4 of x
// (non-transposed: x is K-contiguous, the "col" layout B wants) and 8 LDS.32 of metadata. Metadata (PTX ISA, sparse
// m16n8k32, 16-bit types, sparsity selector 0): threads 0 and 1 of each quad hold it, thread t the groups 4t..4t+3
// of this step, for row g in the low 16 bits and row g + 8 in the high ones; the format's one word per (row, 32
// columns) holds both halves, so a thread builds its register from two words with two shifts and a mask.
// Block: 8 warps (2 x 4) on a 128 x 128 tile of y, BK = 64 columns of W per stage (32 kept values per row), a
// 3-stage cp.async ring (29 KB a stage: two blocks fit an SM), rows and steps past the end zero-filled with a valid
// metadata word (kEmptyMeta); the y tile goes through shared memory so that its stores are 16-byte and along N.
// Per stage and warp: 32 mma.sp (2 x 4 x 4) for 8 + 8 ldmatrix.x4 and 16 LDS.32.
// lab:variants dtype=bf16,f16
#include "lab_gemm.cuh"
#include "sparse24.cuh"

#include <algorithm>

namespace sparse24 {

constexpr int BN = 128, BM = 128, BK = 64;   // rows of W, rows of x, columns of W (dense) per stage
constexpr int kStages = 3, kThreads = 256;
constexpr int A_STRIDE = BK / 2 + 8;         // kept values per staged row of W, padded: 80 B, ldmatrix conflict-free
constexpr int B_STRIDE = BK + 8;             // x elements per staged row, padded: 144 B, ldmatrix conflict-free
constexpr int A_ELEMS = BN * A_STRIDE, B_ELEMS = BM * B_STRIDE;
constexpr int STAGE_BYTES = (A_ELEMS + B_ELEMS) * 2 + BN * (BK / 32) * 4;   // + two metadata words per row of W
constexpr int Y_STRIDE = BN + 8;             // the epilogue's y tile (BM rows of x, BN columns), padded
constexpr int SMEM_BYTES = std::max(kStages * STAGE_BYTES, BM * Y_STRIDE * 2);

__device__ __forceinline__ void mma_sp(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t e,
                                       __nv_bfloat16) {
#ifdef LAB_SM80
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
#endif
}
__device__ __forceinline__ void mma_sp(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t e,
                                       __half) {
#ifdef LAB_SM80
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
#endif
}

struct Smem {
  unsigned char* base;
  __device__ T* a(int s) const { return reinterpret_cast<T*>(base + s * STAGE_BYTES); }
  __device__ T* b(int s) const { return a(s) + A_ELEMS; }
  __device__ uint32_t* e(int s) const { return reinterpret_cast<uint32_t*>(b(s) + B_ELEMS); }
};

// Stage kt of the K loop into slot s: BN rows of kept values (4 x 16 B each), BM rows of x (8 x 16 B each) and BN x 2
// metadata words; everything past N, M, K or the last word is zeros (metadata: kEmptyMeta).
template <bool kVecX>
__device__ __forceinline__ void load_stage(const Smem& sm, int s, int kt, const T* __restrict__ x,
                                           const T* __restrict__ values, const int32_t* __restrict__ meta, int M,
                                           int N, int K, int n0, int m0, int Kc, int words) {
  T* A = sm.a(s);
#pragma unroll 1   // rolled: the unrolled copies' addresses, live across the MMAs, spilled at 128 registers
  for (int i = threadIdx.x; i < BN * 4; i += kThreads) {
    const int r = i / 4, c = kt * (BK / 2) + (i % 4) * 8;
    const bool ok = n0 + r < N && c < Kc;   // Kc is a multiple of 16: a chunk is wholly in or out
    lab::cp_async16(lab::smem_u32(A + r * A_STRIDE + (i % 4) * 8), ok ? values + int64_t(n0 + r) * Kc + c : values,
                    ok ? 16 : 0);
  }
  T* B = sm.b(s);
#pragma unroll 1
  for (int i = threadIdx.x; i < BM * 8; i += kThreads) {
    const int r = i / 8, c = kt * BK + (i % 8) * 8;
    T* dst = B + r * B_STRIDE + (i % 8) * 8;
    if constexpr (kVecX) {   // K % 8 == 0: a chunk is wholly in or out
      const bool ok = m0 + r < M && c < K;
      lab::cp_async16(lab::smem_u32(dst), ok ? x + int64_t(m0 + r) * K + c : x, ok ? 16 : 0);
    } else {
      T v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = (m0 + r < M && c + e < K) ? x[int64_t(m0 + r) * K + c + e] : from_f<T>(0.f);
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
    }
  }
  uint32_t* E = sm.e(s);
  for (int i = threadIdx.x; i < BN * 2; i += kThreads) {
    const int r = i / 2, wd = kt * 2 + i % 2;
    if (n0 + r < N && wd < words) lab::cp_async4(lab::smem_u32(E + i), meta + int64_t(n0 + r) * words + wd, 4);
    else E[i] = kEmptyMeta;
  }
}

template <bool kVecX>
__global__ void __launch_bounds__(kThreads, 2) v2_kernel(const T* __restrict__ x, const T* __restrict__ values,
                                                         const int32_t* __restrict__ meta, const T* __restrict__ b,
                                                         T* __restrict__ y, int M, int N, int K, bool vec_y) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem sm{smem_raw};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wn = warp % 2, wm = warp / 2;   // the warp's 64 rows of W and 32 rows of x
  const lab::Tile tl = lab::tile_of(blockIdx.x, int(lab::ceil_div(N, BN)), int(lab::ceil_div(M, BM)));
  const int n0 = tl.m * BN, m0 = tl.n * BM;
  const int Kp = int(padded_k(K)), Kc = Kp / 2, words = Kp / 32;
  const int KT = int(lab::ceil_div(Kp, BK));

  float acc[4][4][4] = {};
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage<kVecX>(sm, s, s, x, values, meta, M, N, K, n0, m0, Kc, words);
    lab::cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    lab::cp_async_wait<kStages - 2>();
    __syncthreads();   // stage kt landed for every thread; every warp is done with stage kt - 1's slot
    const int nxt = kt + kStages - 1;
    if (nxt < KT) load_stage<kVecX>(sm, nxt % kStages, nxt, x, values, meta, M, N, K, n0, m0, Kc, words);
    lab::cp_async_commit();
    const int s = kt % kStages;
    const T* A = sm.a(s);
    const T* B = sm.b(s);
    const uint32_t* E = sm.e(s);
#pragma unroll
    for (int ks = 0; ks < BK / 32; ++ks) {
      uint32_t bf[4][4];   // x fragments of the whole warp tile; W's one 16-row block at a time (fewer registers)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        lab::ldmatrix_x4(bf[j], lab::smem_u32(B + (wm * 32 + 8 * j + lane % 8) * B_STRIDE + ks * 32 + (lane / 8) * 8));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t af[4];
        lab::ldmatrix_x4(af, lab::smem_u32(A + (wn * 64 + 16 * i + lane % 16) * A_STRIDE + ks * 16 + (lane / 16) * 8));
        const int r0 = wn * 64 + 16 * i + lane / 4;
        const uint32_t w0 = E[r0 * 2 + ks], w1 = E[(r0 + 8) * 2 + ks];
        const uint32_t ef = (lane & 1) ? (w0 >> 16) | (w1 & 0xffff0000u) : (w0 & 0xffffu) | (w1 << 16);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_sp(acc[i][j], af, bf[j], ef, T{});
      }
    }
  }
  lab::cp_async_wait<0>();
  __syncthreads();   // the ring is free: the y tile reuses it

  // y tile (BM rows of x, BN columns) in T, bias added: c0, c1 = (row of W g, rows of x 2t, 2t + 1), c2, c3 = row g + 8
  T* Ys = reinterpret_cast<T*>(smem_raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int nr = wn * 64 + 16 * i + lane / 4;
    const float b0 = (b && n0 + nr < N) ? to_f(b[n0 + nr]) : 0.f;
    const float b1 = (b && n0 + nr + 8 < N) ? to_f(b[n0 + nr + 8]) : 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int mr = wm * 32 + 8 * j + 2 * (lane % 4);
      Ys[mr * Y_STRIDE + nr] = from_f<T>(acc[i][j][0] + b0);
      Ys[(mr + 1) * Y_STRIDE + nr] = from_f<T>(acc[i][j][1] + b0);
      Ys[mr * Y_STRIDE + nr + 8] = from_f<T>(acc[i][j][2] + b1);
      Ys[(mr + 1) * Y_STRIDE + nr + 8] = from_f<T>(acc[i][j][3] + b1);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < BM * (BN / 8); i += kThreads) {
    const int r = i / (BN / 8), c = (i % (BN / 8)) * 8;
    if (m0 + r >= M || n0 + c >= N) continue;
    const T* src = Ys + r * Y_STRIDE + c;
    T* dst = y + int64_t(m0 + r) * N + n0 + c;
    if (vec_y && n0 + c + 8 <= N) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && n0 + c + e < N; ++e) dst[e] = src[e];
    }
  }
}

cudaError_t forward_v2(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
                       cudaStream_t s) {
  const int64_t tiles = lab::ceil_div(N, BN) * lab::ceil_div(M, BM);
  if (tiles > 2147483647) return cudaErrorInvalidConfiguration;
  const bool vec_x = K % 8 == 0 && aligned16(x);
  const bool vec_y = N % 8 == 0 && aligned16(y);
  auto kernel = vec_x ? v2_kernel<true> : v2_kernel<false>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(tiles), kThreads, SMEM_BYTES, s>>>(x, values, meta, b, y, M, N, K, vec_y);
  return cudaGetLastError();
}

}  // namespace sparse24

LAB_EXPORTS(LAB_EXPORT("v2", sparse24::forward_v2))
