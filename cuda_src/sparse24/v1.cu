// sparse24/v1.cu — v1: SIMT, one warp per row of W, for a few rows of x (the GEMV regime; the ladder and the format:
// sparse24.cuh). Per lane and step: 16 B of values (4 groups of 2 = 16 columns of W) and their 16 bits of metadata,
// all of a row's steps (U) in flight before the first FMA; the x window of those 16 columns comes from shared memory
// as two LDS.128 (a lane's window is 32 B, consecutive lanes consecutive windows: conflict-free), and each group's two
// x values are picked by its nibble with selects, not a run-time index into registers (which would go to local
// memory). Per step per row of x: 8 FMAs for 16 B + 2 B read: memory-bound on the compressed weight at M <= 8.
// x (MR rows at a time, zero-padded to Kp) is staged once per block; for M > MR the block repeats over row blocks of x,
// reading W again each time: beyond a few rows v2 (tensor cores) is the version to use.
// lab:variants dtype=bf16,f16
#include "sparse24.cuh"

#include <algorithm>

namespace sparse24 {

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// x[c] for c in {lo, lo + 1, lo + 2} chosen by i - lo (i = the nibble's index, lo = 0 for i0 in 0..2, 1 for i1 in 1..3)
__device__ __forceinline__ float pick3(int i, float a, float b, float c) { return i == 0 ? a : (i == 1 ? b : c); }

constexpr int kU = 8;        // steps of a row in flight per lane: 8 x 16 columns x 32 lanes covers K <= 4096 at once
constexpr int kThreads = 256;

template <int MR>
__global__ void __launch_bounds__(kThreads, 3) v1_kernel(const T* __restrict__ x, const T* __restrict__ values,
                                                      const uint16_t* __restrict__ meta16, const T* __restrict__ b,
                                                      T* __restrict__ y, int M, int N, int K, int Kp, bool vec_x) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* xs = reinterpret_cast<T*>(smem_raw);                 // (MR, Kp): the block's rows of x, zeros past K
  const int lane = threadIdx.x % 32, warps = kThreads / 32;
  const int steps = Kp / 16;                              // 16 columns of W per lane-step
  const int64_t stride = int64_t(gridDim.x) * warps;
  for (int m0 = 0; m0 < M; m0 += MR) {
    const int rows = min(MR, M - m0);
    __syncthreads();                                      // the previous row block's readers are done
    if (vec_x) {                                          // K % 8 == 0 and x 16-byte aligned: 16-byte copies
      const int per_row = Kp / 8;
      for (int i = threadIdx.x; i < MR * per_row; i += kThreads) {
        const int r = i / per_row, c = (i % per_row) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows && c < K) v = __ldg(reinterpret_cast<const uint4*>(x + int64_t(m0 + r) * K + c));
        reinterpret_cast<uint4*>(xs)[i] = v;
      }
    } else {
      for (int i = threadIdx.x; i < MR * Kp; i += kThreads) {
        const int r = i / Kp, c = i % Kp;
        xs[i] = (r < rows && c < K) ? x[int64_t(m0 + r) * K + c] : from_f<T>(0.f);
      }
    }
    __syncthreads();
    for (int64_t n = int64_t(threadIdx.x / 32) * gridDim.x + blockIdx.x; n < N; n += stride) {
      const uint4* vrow = reinterpret_cast<const uint4*>(values + n * (Kp / 2));   // 8 values = one step
      const uint16_t* mrow = meta16 + n * (Kp / 16);                               // 16 bits = one step
      float acc[MR] = {};
      for (int s0 = lane; s0 < steps; s0 += 32 * kU) {
        uint4 v[kU];
        uint32_t mt[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int s = s0 + 32 * u;
          v[u] = s < steps ? ldg_stream(vrow + s) : make_uint4(0, 0, 0, 0);
          mt[u] = s < steps ? __ldg(mrow + s) : 0u;
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int s = s0 + 32 * u;
          if (s >= steps) break;
          const uint32_t vw[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
          int i0[4], i1[4];   // the kept columns of the step's 4 groups (compile-time indexed: registers)
#pragma unroll
          for (int g = 0; g < 4; ++g) {
            const uint32_t nib = (mt[u] >> (4 * g)) & 0xfu;
            i0[g] = nib & 3;
            i1[g] = nib >> 2;
          }
#pragma unroll
          for (int r = 0; r < MR; ++r) {
            if (r >= rows) break;
            const uint4* xw = reinterpret_cast<const uint4*>(xs + r * Kp + 16 * s);
            const uint4 xa = xw[0], xb = xw[1];
            const uint32_t xwd[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
            for (int g = 0; g < 4; ++g) {
              const float x0 = lo_f(xwd[2 * g], T{}), x1 = hi_f(xwd[2 * g], T{});
              const float x2 = lo_f(xwd[2 * g + 1], T{}), x3 = hi_f(xwd[2 * g + 1], T{});
              acc[r] = fmaf(lo_f(vw[g], T{}), pick3(i0[g], x0, x1, x2), acc[r]);
              acc[r] = fmaf(hi_f(vw[g], T{}), pick3(i1[g] - 1, x1, x2, x3), acc[r]);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < MR; ++r)
#pragma unroll
        for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
      if (lane == 0) {
        const float bias = b ? to_f(b[n]) : 0.f;
#pragma unroll
        for (int r = 0; r < MR; ++r)
          if (r < rows) y[int64_t(m0 + r) * N + n] = from_f<T>(acc[r] + bias);
      }
    }
  }
}

template <int MR>
cudaError_t launch_v1(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
                      int Kp, cudaStream_t s) {
  auto kernel = v1_kernel<MR>;
  const int smem = MR * Kp * int(sizeof(T));
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  int per_sm = 0;
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  if (e != cudaSuccess) return e;
  // one wave: every block resident at once (each stages x once per row block). 256 threads and at most 80 registers
  // (3 blocks an SM): at 512 threads and 76 registers one block fit, 16 warps an SM, and the M = 1 GEMV read its
  // weight at 1.4 TB/s (ncu, 4096 x 4096 bf16) with long-scoreboard stalls: too few loads in flight
  const int64_t blocks = std::min<int64_t>(lab::ceil_div(N, kThreads / 32), int64_t(std::max(per_sm, 1)) * lab::sm_count());
  const bool vec_x = K % 8 == 0 && aligned16(x);
  kernel<<<unsigned(blocks), kThreads, smem, s>>>(x, values, reinterpret_cast<const uint16_t*>(meta), b, y, M, N, K,
                                                   Kp, vec_x);
  return cudaGetLastError();
}

// MR: the rows of x staged at once: the power of two >= M, up to 8, halved while MR rows of x do not fit in shared
// memory (half the opt-in limit from MR = 4 up, so two blocks share an SM). A K too long for even one row (Kp·2 B over
// the opt-in limit, ~116k columns on an H100) is refused with cudaErrorInvalidValue, which the binding names.
cudaError_t forward_v1(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
                       cudaStream_t s) {
  const int Kp = int(padded_k(K));
  const int64_t row_bytes = int64_t(Kp) * sizeof(T), cap = lab::smem_optin();
  int mr = M >= 5 ? 8 : M >= 3 ? 4 : M;
  while (mr > 1 && mr * row_bytes > (mr >= 4 ? cap / 2 : cap)) mr /= 2;
  if (row_bytes > cap) return cudaErrorInvalidValue;
  switch (mr) {
    case 8: return launch_v1<8>(x, values, meta, b, y, M, N, K, Kp, s);
    case 4: return launch_v1<4>(x, values, meta, b, y, M, N, K, Kp, s);
    case 2: return launch_v1<2>(x, values, meta, b, y, M, N, K, Kp, s);
    default: return launch_v1<1>(x, values, meta, b, y, M, N, K, Kp, s);
  }
}

}  // namespace sparse24

LAB_EXPORTS(LAB_EXPORT("v1", sparse24::forward_v1))
