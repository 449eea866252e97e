// linear/tc.cuh — what the tensor-core units (v10.cu, v11.cu) and the fill share (the ladder: linear.cuh):
// bf16 and its conversions, the paired epilogue store, the ldmatrix and mma.sync wrappers; on the host, the two units'
// element type and their launch. Apart from linear.cuh because <cuda_bf16.h> costs every unit that includes it ~0.5 s
// of compile time.
#pragma once

#include <cuda_bf16.h>

#include "linear.cuh"

namespace linear {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// y[m, n], y[m, n+1] = (v0, v1) + bias, in T; a 2-element store when allowed (tensor-core epilogues).
template <class T>
__device__ __forceinline__ void store_pair(T* __restrict__ y, const T* __restrict__ b, int M, int N, int m, int n,
                                           float v0, float v1, bool vec) {
  if (m >= M) return;
  if (b) {
    if (n < N) v0 += to_f(b[n]);
    if (n + 1 < N) v1 += to_f(b[n + 1]);
  }
  T* p = y + int64_t(m) * N + n;
  if (vec && n + 1 < N) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
    }
    return;
  }
  if (n < N) p[0] = from_f<T>(v0);
  if (n + 1 < N) p[1] = from_f<T>(v1);
}

inline bool vec_in(const bf16* x, const bf16* w, int K) { return K % 8 == 0 && aligned(x, 16) && aligned(w, 16); }
inline bool vec2_out(const bf16* y, const bf16* b, int N) {
  return N % 2 == 0 && aligned(y, 4) && (!b || aligned(b, 4));
}

using lab::ldmatrix_x4;

// fp32 bits -> TF32 bits, rounded (lab_gemm.cuh's cvt.rna), for operands loaded as raw 32-bit words.
__device__ __forceinline__ uint32_t round_tf32(uint32_t f) { return lab::round_tf32(__uint_as_float(f)); }

// D (16x8, fp32) += A (16 x k) · B (k x 8), the element type picking the mma (lab_gemm.cuh): TF32 m16n8k8 for float,
// bf16 m16n8k16. Fragments (g = lane/4, t = lane%4): c0,c1 = D[g][2t..2t+1], c2,c3 = D[g+8][2t..2t+1].
__device__ __forceinline__ void mma_16x8(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], float) {
  lab::mma_tf32_16x8x8(c, a, b[0], b[1]);
}
__device__ __forceinline__ void mma_16x8(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bf16) {
  lab::mma_bf16_16x8x16(c, a, b[0], b[1]);
}

// ---- host side: what both tensor-core units (v10.cu, v11.cu) share ------------------------------------------------
// The element type of a unit built once per dtype (`// lab:variants dtype=f32,bf16`, each build with
// -DLAB_VARIANT_dtype_f32 or _bf16): float for float32 tensors (multiplied in TF32), bf16 for bfloat16 ones. Each
// unit instantiates its launcher for this type alone (as kron.cuh's Real, optim.cuh's VariantParam).
#if defined(LAB_VARIANT_dtype_f32)
using VariantT = float;
#elif defined(LAB_VARIANT_dtype_bf16)
using VariantT = bf16;
#endif

// Their blocks take more dynamic shared memory than the 48 KB a kernel gets without asking: the kernel opts in to
// `smem` bytes first, then runs on a 1-D grid of g tiles (a grid too large for one dimension is refused before
// anything runs). One function, so the two units cannot drift apart in the order of these steps or their errors.
template <class... P, class... A>
cudaError_t launch_opt_in_smem(void (*kernel)(P...), int64_t g, int threads, int smem, cudaStream_t s,
                               const A&... args) {
  if (g > kMaxGrid) return cudaErrorInvalidConfiguration;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(g), threads, smem, s>>>(args...);
  return cudaGetLastError();
}

}  // namespace linear
