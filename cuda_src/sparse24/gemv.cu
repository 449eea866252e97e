// sparse24/gemv.cu — v1 and v3: SIMT, warps over rows of W, for a few rows of x (the GEMV regime; the ladder and
// the format: sparse24.cuh). One kernel template: v1 gives a warp one row at a time, v3 two rows at once. Per lane
// and step: 16 B of values (4 groups of 2 = 16 columns of W) and their 16 bits of metadata, all of a row's steps (U)
// in flight before the first FMA; the x window of those 16 columns comes from shared memory
// as two LDS.128 (a lane's window is 32 B, consecutive lanes consecutive windows: conflict-free), and each group's two
// x values are picked by its nibble with selects, not a run-time index into registers (which would go to local
// memory). Per step per row of x: 8 FMAs for 16 B + 2 B read: memory-bound on the compressed weight at M <= 8.
// x (MR rows at a time, zero-padded to Kp) is staged once per block; for M > MR the block repeats over row blocks of x,
// reading W again each time: beyond a few rows v2 (tensor cores) is the version to use.
// v3 (ROWS = 2): a warp issues the loads of two rows (n and n + the grid's warp count) before the first FMA: twice
// the bytes per warp at once at the same occupancy. Why it was tried: Nsight Compute at 4096 x 4096 bf16, batch 1,
// put v1 well under the copy rate with long-scoreboard stalls and 16 warps an SM (76 registers x 512 threads: one
// block), each warp walking ~2 rows one after the other. 256-thread blocks, 3 an SM, measured slower at batch 1 and 8
// (results.csv, v1 rows of 3a0213a against f1645d3; at batch 8 MR = 8 spilled at the 80-register cap), so v3 keeps
// v1's block and takes the rows two at a time: 126 registers, one round instead of two. Predicted faster; measured
// slower than v1 (the rows and ncu.csv of 2cabe21: a lower DRAM rate, more long-scoreboard stalls per issue). Our
// reading: v1's warps drift apart, so while some reduce and store a row others have the next row's loads in flight;
// v3 issues everything in one burst and then has nothing in flight while it computes. The next rung is a software
// pipeline (the next row's loads issued before this row's FMAs), not a wider burst; the default stays v1.
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
constexpr int kThreads = 512;

template <int MR, int ROWS>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const T* __restrict__ x, const T* __restrict__ values,
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
    for (int64_t n0 = int64_t(threadIdx.x / 32) * gridDim.x + blockIdx.x; n0 < N; n0 += ROWS * stride) {
      const uint4* vrow[ROWS];      // 8 values = one step
      const uint16_t* mrow[ROWS];   // 16 bits = one step
      bool live[ROWS];
#pragma unroll
      for (int q = 0; q < ROWS; ++q) {
        const int64_t n = n0 + q * stride;
        live[q] = n < N;
        vrow[q] = reinterpret_cast<const uint4*>(values + (live[q] ? n : 0) * (Kp / 2));
        mrow[q] = meta16 + (live[q] ? n : 0) * (Kp / 16);
      }
      float acc[ROWS][MR] = {};
      for (int s0 = lane; s0 < steps; s0 += 32 * kU) {
        uint4 v[ROWS][kU];
        uint32_t mt[ROWS][kU];
#pragma unroll
        for (int q = 0; q < ROWS; ++q)
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int s = s0 + 32 * u;
            const bool ok = live[q] && s < steps;
            v[q][u] = ok ? ldg_stream(vrow[q] + s) : make_uint4(0, 0, 0, 0);
            mt[q][u] = ok ? __ldg(mrow[q] + s) : 0x4444u;   // a dead row's zeros, under valid nibbles
          }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int s = s0 + 32 * u;
          if (s >= steps) break;
#pragma unroll
          for (int r = 0; r < MR; ++r) {
            if (r >= rows) break;
            const uint4* xw = reinterpret_cast<const uint4*>(xs + r * Kp + 16 * s);
            const uint4 xa = xw[0], xb = xw[1];
            const uint32_t xwd[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
            for (int q = 0; q < ROWS; ++q) {
              const uint32_t vw[4] = {v[q][u].x, v[q][u].y, v[q][u].z, v[q][u].w};
#pragma unroll
              for (int g = 0; g < 4; ++g) {
                const uint32_t nib = (mt[q][u] >> (4 * g)) & 0xfu;
                const int i0 = nib & 3, i1 = nib >> 2;
                const float x0 = lo_f(xwd[2 * g], T{}), x1 = hi_f(xwd[2 * g], T{});
                const float x2 = lo_f(xwd[2 * g + 1], T{}), x3 = hi_f(xwd[2 * g + 1], T{});
                acc[q][r] = fmaf(lo_f(vw[g], T{}), pick3(i0, x0, x1, x2), acc[q][r]);
                acc[q][r] = fmaf(hi_f(vw[g], T{}), pick3(i1 - 1, x1, x2, x3), acc[q][r]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int q = 0; q < ROWS; ++q) {
#pragma unroll
        for (int r = 0; r < MR; ++r)
#pragma unroll
          for (int off = 16; off > 0; off /= 2) acc[q][r] += __shfl_xor_sync(0xffffffffu, acc[q][r], off);
        const int64_t n = n0 + q * stride;
        if (lane == 0 && live[q]) {
          const float bias = b ? to_f(b[n]) : 0.f;
#pragma unroll
          for (int r = 0; r < MR; ++r)
            if (r < rows) y[int64_t(m0 + r) * N + n] = from_f<T>(acc[q][r] + bias);
        }
      }
    }
  }
}

template <int MR, int ROWS>
cudaError_t launch_gemv(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
                        int Kp, cudaStream_t s) {
  auto kernel = gemv_kernel<MR, ROWS>;
  const int smem = MR * Kp * int(sizeof(T));
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  int per_sm = 0;
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  if (e != cudaSuccess) return e;
  // one wave: every block resident at once (each stages x once per row block)
  const int64_t blocks =
      std::min<int64_t>(lab::ceil_div(N, kThreads / 32), int64_t(std::max(per_sm, 1)) * lab::sm_count());
  const bool vec_x = K % 8 == 0 && aligned16(x);
  kernel<<<unsigned(blocks), kThreads, smem, s>>>(x, values, reinterpret_cast<const uint16_t*>(meta), b, y, M, N, K,
                                                   Kp, vec_x);
  return cudaGetLastError();
}

// MR: the rows of x staged at once: the power of two >= M, up to 8, halved while MR rows of x do not fit in shared
// memory (half the opt-in limit from MR = 4 up, so two blocks share an SM). A K too long for even one row (Kp·2 B over
// the opt-in limit, ~116k columns on an H100) is refused with cudaErrorInvalidValue, which the binding names.
template <int ROWS>
cudaError_t forward(const T* x, const T* values, const int32_t* meta, const T* b, T* y, int M, int N, int K,
                    cudaStream_t s) {
  const int Kp = int(padded_k(K));
  const int64_t row_bytes = int64_t(Kp) * sizeof(T), cap = lab::smem_optin();
  int mr = M >= 5 ? 8 : M >= 3 ? 4 : M;
  while (mr > 1 && mr * row_bytes > (mr >= 4 ? cap / 2 : cap)) mr /= 2;
  if (row_bytes > cap) return cudaErrorInvalidValue;
  // two rows at once only where they fit the 128 registers of a 512-thread block without spilling much: at MR = 4
  // and 8 their accumulators and x windows spilled hundreds of bytes (ptxas), so there v3 is v1
  switch (mr) {
    case 8: return launch_gemv<8, 1>(x, values, meta, b, y, M, N, K, Kp, s);
    case 4: return launch_gemv<4, 1>(x, values, meta, b, y, M, N, K, Kp, s);
    case 2: return launch_gemv<2, ROWS>(x, values, meta, b, y, M, N, K, Kp, s);
    default: return launch_gemv<1, ROWS>(x, values, meta, b, y, M, N, K, Kp, s);
  }
}

}  // namespace sparse24

LAB_EXPORTS(LAB_EXPORT("v1", sparse24::forward<1>), LAB_EXPORT("v3", sparse24::forward<2>))
