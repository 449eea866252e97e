// gru/persistent.cuh — what the two persistent units (v3.cu: v3/v4, v5.cu: v5) share: the storage type of the
// variant being built, coherent loads of h, and the host side of a cooperative launch (whether the device offers it,
// how many blocks fit on the chip at once, the launch itself). Apart from gru.cuh so the gate and decoder units do
// not compile it.
#pragma once

#include "gru.cuh"

namespace gru {

// This build's storage type (// lab:variants dtype=f32,f16,bf16 in both units): float (v5: multiplied in TF32),
// __half or __nv_bfloat16.
#if defined(LAB_VARIANT_dtype_f32)
using VT = float;
constexpr int kDtype = kF32;
#elif defined(LAB_VARIANT_dtype_f16)
using VT = __half;
constexpr int kDtype = kF16;
#elif defined(LAB_VARIANT_dtype_bf16)
using VT = __nv_bfloat16;
constexpr int kDtype = kBF16;
#else
#error "the persistent GRU units are built per variant: -DLAB_VARIANT_dtype_f32, _f16 or _bf16"
#endif

// L2-only loads (ld.global.cg): h_{t-1} was written by other SMs during this launch; L1 is not coherent.
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ __half ldcg(const __half* p) {
  return __ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ __nv_bfloat16 ldcg(const __nv_bfloat16* p) {
  return __ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}

// Whether the current device runs cooperative launches, and the shared memory a block may opt in to. Returns a plan
// status: 0, 4 (no cooperative launch) or 5 (a CUDA error while asking).
inline int cooperative_device(int* optin) {
  int dev = 0, coop = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return 5;
  return coop ? 0 : 4;
}

// How many blocks of `kernel` (kThreads threads, `smem` bytes of dynamic shared memory, opted in here) the chip
// holds at once, into *coresident. Returns 0, or 5 on a CUDA error.
inline int coresident_blocks(const void* kernel, int smem, int* coresident) {
  int occ = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem) != cudaSuccess)
    return 5;
  *coresident = occ * lab::sm_count();
  return 0;
}

// A cooperative launch (all blocks resident at once: the persistent kernels' blocks wait for each other) through the
// launch-attribute API, which stream capture records into a CUDA graph kernel node like any other launch.
inline cudaError_t launch_cooperative(const void* kernel, int blocks, int smem, cudaStream_t stream, void** args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelExC(&cfg, kernel, args);
}

}  // namespace gru
