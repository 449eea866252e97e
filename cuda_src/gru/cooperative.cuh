// gru/cooperative.cuh — the host side of a cooperative launch, for the units whose blocks wait for each other
// (v3.cu, v5.cu through persistent.cuh; greedy.cu): whether the device offers it, how many blocks fit on the chip at
// once, the launch itself.
#pragma once

#include "gru.cuh"

namespace gru {

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
// early = true adds programmatic dependent launch (sm_90): the grid may start while the kernel before it in the stream
// still runs, once that kernel's blocks have all executed griddepcontrol.launch_dependents (proj.cu does, first
// thing). The kernel must then execute griddepcontrol.wait (gru::wait_for_prior_grid) before it touches anything the
// kernel before it writes; the binding sets early only where that kernel is proj.cu, launched without this attribute,
// so every older write in the stream is complete before either starts. Before sm_90 the launch is a plain one.
inline cudaError_t launch_cooperative(const void* kernel, int blocks, int smem, cudaStream_t stream, void** args,
                                      bool early = false) {
  early = early && lab::has_pdl();
  cudaLaunchAttribute attr[2] = {{}, lab::pdl_attribute()};
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = early ? 2 : 1;
  return cudaLaunchKernelExC(&cfg, kernel, args);
}

}  // namespace gru
