// linear/v10.cu — v10, tensor cores through mma.sync: TF32 on float32 tensors, bf16 on bfloat16 tensors; one kernel
// template, built once per dtype (the ladder: linear.cuh). v11 runs this kernel too when TMA cannot take its operands
// (the binding sends them here).
// lab:variants dtype=f32,bf16
#include "linear.cuh"
#include "tc.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v10: mma.sync tensor cores. 128x128 block tile, 8 warps as 2 (m) x 4 (n), warp tile 64x32 = 4x4 MMA tiles.
// Each stage holds 64 bytes of K (TF32: 16, bf16: 32 elements) for 128 rows of x and 128 rows of W, rows padded to
// 80 B so the 8 row addresses of an ldmatrix fall in 8 different 16-B bank groups (80·r mod 128 distinct, r < 8).
// Per 32 bytes of K (one MMA k-step, k8 TF32 / k16 bf16) the fragment addressing is the same in bytes for both
// types: A x4 = rows 0-15 x bytes {0-15, 16-31}; B x4 = n-rows {0-7, 8-15} x bytes {0-15, 16-31}.
// The pipeline: 4 stages of cp.async (16-B, zero-filled past M/N/K), wait for the oldest, refill the slot freed by
// the previous iteration, compute. kVec = false (K·size % 16 != 0 or unaligned) loads element-wise instead.
// ---------------------------------------------------------------------------------------------------------------
namespace mma {
constexpr int BM = 128, BN = 128, KB = 64, PITCH = 80, STAGES = 4, THREADS = 256;
constexpr int STAGE_BYTES = (BM + BN) * PITCH;
constexpr int SMEM = STAGES * STAGE_BYTES;  // 80 KB
}  // namespace mma

template <class T, bool kVec>
__global__ void __launch_bounds__(256) v10_mma_sync(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, T* __restrict__ y, int M, int N, int K,
                                                   bool vec_out) {
#ifdef LAB_SM80
  using namespace mma;
  constexpr int ES = sizeof(T), BK = KB / ES, EPC = 16 / ES;  // elements per 16-B chunk
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_u32(smem);
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, BM)), int(lab::ceil_div(N, BN)));
  const int m0 = tl.m * BM, n0 = tl.n * BN;
  const int nk = int(lab::ceil_div(K, BK));

  // 256 rows (x then W) x 4 chunks of 16 B per stage: 4 chunks per thread.
  auto load_stage = [&](int kt, int slot) {
    const uint32_t s0 = sbase + slot * STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < (BM + BN) * 4 / THREADS; ++i) {
      const int c = threadIdx.x + i * THREADS, row = c / 4, ch = c % 4;
      const bool is_x = row < BM;
      const int r = is_x ? m0 + row : n0 + row - BM;
      const bool row_ok = r < (is_x ? M : N);
      const int k = kt * BK + ch * EPC;
      const uint32_t dst = s0 + row * PITCH + ch * 16;
      const T* src = is_x ? x : w;
      if constexpr (kVec) {
        const int bytes = row_ok ? max(0, min(EPC, K - k)) * ES : 0;
        cp_async16(dst, bytes > 0 ? src + int64_t(r) * K + k : src, bytes);
      } else {
        T* d = reinterpret_cast<T*>(smem + (dst - sbase));
#pragma unroll
        for (int e = 0; e < EPC; ++e) d[e] = (row_ok && k + e < K) ? src[int64_t(r) * K + k + e] : from_f<T>(0.f);
      }
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % 2, wn = warp / 2;
  float acc[4][4][4] = {};

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();  // stage kt has landed (for this thread) ...
    __syncthreads();              // ... for every thread; and slot (kt-1)%STAGES is no longer read
    if (kt + STAGES - 1 < nk) load_stage(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
    cp_async_commit();
    const uint32_t sa = sbase + (kt % STAGES) * STAGE_BYTES, sb = sa + BM * PITCH;
#pragma unroll
    for (int ks = 0; ks < KB / 32; ++ks) {
      uint32_t a[4][4], bq[4][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        ldmatrix_x4(a[mt], sa + (wm * 64 + mt * 16 + lane % 16) * PITCH + ks * 32 + (lane / 16) * 16);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, sb + (wn * 32 + np * 16 + (lane / 16) * 8 + lane % 8) * PITCH + ks * 32 + ((lane / 8) % 2) * 16);
        bq[2 * np][0] = r[0];
        bq[2 * np][1] = r[1];
        bq[2 * np + 1][0] = r[2];
        bq[2 * np + 1][1] = r[3];
      }
      if constexpr (sizeof(T) == 4) {  // TF32: round to nearest (the tensor core would truncate the low 13 bits)
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = round_tf32(a[mt][e]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) bq[nt][e] = round_tf32(bq[nt][e]);
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_16x8(acc[mt][nt], a[mt], bq[nt], T());
    }
  }
  cp_async_wait<0>();  // no copy may still be writing shared memory when the block exits

  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int r = m0 + wm * 64 + mt * 16 + g, c = n0 + wn * 32 + nt * 8 + 2 * t4;
      store_pair<T>(y, b, M, N, r, c, acc[mt][nt][0], acc[mt][nt][1], vec_out);
      store_pair<T>(y, b, M, N, r + 8, c, acc[mt][nt][2], acc[mt][nt][3], vec_out);
    }
#endif
}

template <class T>
cudaError_t launch_mma(const T* x, const T* w, const T* b, T* y, int M, int N, int K, bool vec_in, bool vec_out,
                       cudaStream_t s) {
  if (device_major() < 8) return cudaErrorNotSupported;  // mma.sync / cp.async / ldmatrix need sm_80+
  auto kernel = vec_in ? v10_mma_sync<T, true> : v10_mma_sync<T, false>;
  return launch_opt_in_smem(kernel, tiles(M, N, mma::BM, mma::BN), mma::THREADS, mma::SMEM, s, x, w, b, y, M, N, K,
                            vec_out);
}

using T = VariantT;  // this build's dtype (tc.cuh): float (v10 on float32 tensors: TF32 multiplies) or bf16

cudaError_t forward_mma(const T* x, const T* w, const T* b, T* y, int M, int N, int K, cudaStream_t s) {
  return launch_mma<T>(x, w, b, y, M, N, K, vec_in(x, w, K), vec2_out(y, b, N), s);
}

}  // namespace linear

// registered as "mma_sync@f32" and "mma_sync@bf16" (v10 at either dtype; bf16 is at::BFloat16's 16-bit layout)
LAB_EXPORTS(LAB_EXPORT("mma_sync", linear::forward_mma))
