// linear/gemv_v1.cu — the linear family's other op, gemv: y = x·Wᵀ + b for a few rows of x (the decoder's fc_out at
// batch 1), memory-bound, so not a rung of the GEMM ladder; v1 is its first (and only) version (linear.cuh)
#include "linear.cuh"

#include <algorithm>

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// gemv v1: GEMV for small M. One warp per W row; a lane issues all U of its 16-byte loads of the row (predicated past
// the end) before the first FMA, so a row costs one memory round trip (K = 1280: 10 loads per lane; U = 12 covers
// K <= 1536 in one batch). W is read with ld.global.nc.L1::no_allocate (read once); x (M <= MR rows) is staged in
// shared memory once per block. The grid is what fits on the GPU at once (one wave); warp w of block g takes rows
// w·G + g, w·G + g + 8G, ..., so the rows in flight are spread evenly over the SMs. Memory-bound: bytes = N·K·4.
// (The first version, one row per warp for all 5893 rows, 8 + 2 loads per lane, x through L1, was far from the goal
// at fc_out batch 1 on the H100: 5 blocks per SM fit, so 737 blocks ran as a wave and a 12% tail, and every row cost
// two memory round trips.) The rework measured no better. Why the goal (85% of the large-copy rate; W's 30.2 MB alone
// are 9.0 us at the datasheet's 3.35 TB/s) is out of reach at this size was measured by .ci/l2_flush_probe.py on the
// H100: gemv v1, cuBLAS, w.sum() and a copy of W, each after the lab's write flush and after a read flush, at 30.2 MB
// (fc_out's W, below the 50 MB L2) and 121 MB (4x the rows, above the L2); the numbers: notebook 02 and
// results/<device>/l2_flush_probe.txt. Two things cost: the write flush leaves the L2 dirty and the kernel's misses
// pay the write-back (it costs time at this size), and a 30 MB read is too short to reach the streaming rate: the
// read rate rises with size (w.sum() reads W much more slowly at 30 MB than at 121 MB), and gemv v1 is already faster
// than torch's read-only reduction of W and level with or ahead of cuBLAS. At 121 MB the same kernel reaches the
// goal's fraction of copy after a read flush.
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ float4 ldg_stream(const float4* p) {
  float4 v;
  asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, a.w * b.w)));
}

// kVec: K % 4 == 0 and 16-byte aligned x, W (else scalar loads); kSmemX: x (M <= MR rows) staged in shared memory.
template <int MR, int U, bool kVec, bool kSmemX>
__global__ void __launch_bounds__(256) gemv_v1(const float* __restrict__ x, const float* __restrict__ w,
                                                const float* __restrict__ b, float* __restrict__ y, int M, int N,
                                                int K) {
  extern __shared__ __align__(16) float xs[];
  const int lane = threadIdx.x % 32;
  if constexpr (kSmemX) {
    const int n4 = M * K / 4;
    for (int i = threadIdx.x; i < n4; i += blockDim.x)
      reinterpret_cast<float4*>(xs)[i] = __ldg(reinterpret_cast<const float4*>(x) + i);
    __syncthreads();
  }
  const int64_t stride = int64_t(gridDim.x) * 8;
  for (int64_t n = int64_t(threadIdx.x / 32) * gridDim.x + blockIdx.x; n < N; n += stride) {
    const float* wr = w + n * K;
    for (int m0 = 0; m0 < M; m0 += MR) {
      const int rows = min(MR, M - m0);
      float acc[MR] = {};
      if constexpr (kVec) {
        const int K4 = K / 4;
        const float4* w4 = reinterpret_cast<const float4*>(wr);
        const float4* x4 = reinterpret_cast<const float4*>(kSmemX ? xs : x + int64_t(m0) * K);
        for (int k = lane; k < K4; k += 32 * U) {
          float4 wv[U];
#pragma unroll
          for (int u = 0; u < U; ++u)
            wv[u] = k + 32 * u < K4 ? ldg_stream(w4 + k + 32 * u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int r = 0; r < MR; ++r) {
            if (r < rows) {
#pragma unroll
              for (int u = 0; u < U; ++u)
                if (k + 32 * u < K4) acc[r] += dot4(wv[u], x4[int64_t(r) * K4 + k + 32 * u]);
            }
          }
        }
      } else {
        for (int k = lane; k < K; k += 32) {
          const float wv = __ldg(wr + k);
#pragma unroll
          for (int r = 0; r < MR; ++r)
            if (r < rows) acc[r] += wv * __ldg(x + int64_t(m0 + r) * K + k);
        }
      }
#pragma unroll
      for (int r = 0; r < MR; ++r)
#pragma unroll
        for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
      if (lane == 0) {
        const float bias = b ? b[n] : 0.f;
#pragma unroll
        for (int r = 0; r < MR; ++r)
          if (r < rows) y[int64_t(m0 + r) * N + n] = acc[r] + bias;
      }
    }
  }
}

// The launch of gemv v1 for one configuration: the grid is the number of blocks resident at once (or fewer, one row
// per warp), or `blocks` when given (> 0; the tuning sweep).
template <int MR, int U, bool kVec, bool kSmemX>
cudaError_t launch_gemv_cfg(const float* x, const float* w, const float* b, float* y, int M, int N, int K,
                            int blocks, cudaStream_t s) {
  auto kernel = gemv_v1<MR, U, kVec, kSmemX>;
  const int smem = kSmemX ? M * K * int(sizeof(float)) : 0;
  if (blocks <= 0) {
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, smem);
    if (e != cudaSuccess) return e;
    blocks = int(std::min<int64_t>(lab::ceil_div(N, 8), int64_t(std::max(per_sm, 1)) * lab::sm_count()));
  }
  kernel<<<unsigned(blocks), 256, smem, s>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}

constexpr int kGemvU = 12;  // 16-byte loads in flight per lane (K <= 1536 in one batch; 75 registers at M = 1)

cudaError_t forward_gemv_v1(const float* x, const float* w, const float* b, float* y, int M, int N, int K,
                        cudaStream_t s) {
  if (!vec_in(x, w, K)) return launch_gemv_cfg<4, 1, false, false>(x, w, b, y, M, N, K, 0, s);
  const bool smem_x = M <= 4 && int64_t(M) * K * 4 <= 48 * 1024;
  if (M == 1)
    return smem_x ? launch_gemv_cfg<1, kGemvU, true, true>(x, w, b, y, M, N, K, 0, s)
                  : launch_gemv_cfg<1, kGemvU, true, false>(x, w, b, y, M, N, K, 0, s);
  return smem_x ? launch_gemv_cfg<4, kGemvU, true, true>(x, w, b, y, M, N, K, 0, s)
                : launch_gemv_cfg<4, kGemvU, true, false>(x, w, b, y, M, N, K, 0, s);
}

}  // namespace linear

LAB_EXPORTS(LAB_EXPORT("gemv_v1", linear::forward_gemv_v1))
