// lab_cuda.cuh — small helpers shared by every cuda_src/<family>.cu. No torch headers here: kernels see plain
// pointers, sizes and a stream, which keeps nvcc off torch's headers (a one-line .cu edit rebuilds in ~1.5 s).
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "lab_unit.h"  // lab::ceil_div (host and device), the export table

namespace lab {

// One integer attribute of the current device, cached per device (asked once, ~1 us after that); `fallback` where
// the device index is out of the cache's range.
template <cudaDeviceAttr Attr>
inline int device_attr(int fallback) {
  static int values[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return fallback;
  if (!values[dev]) cudaDeviceGetAttribute(&values[dev], Attr, dev);
  return values[dev];
}

// Multiprocessor count: 132 on an H100 SXM.
inline int sm_count() { return device_attr<cudaDevAttrMultiProcessorCount>(132); }
// Shared memory a block may opt in to: 227 KB on an H100.
inline int smem_optin() { return device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(227 * 1024); }
// Threads one SM can hold at once: 2048 on an H100.
inline int max_threads_per_sm() { return device_attr<cudaDevAttrMaxThreadsPerMultiProcessor>(2048); }

// Grid for a grid-stride loop over `items` with `block` threads: a few waves of blocks per SM keeps every SM busy
// and amortises block start-up; never more blocks than there is work.
inline unsigned grid_stride_blocks(int64_t items, int block, int blocks_per_sm = 4) {
  int64_t need = ceil_div(items, block);
  int64_t cap = int64_t(sm_count()) * blocks_per_sm;
  int64_t g = need < cap ? need : cap;
  return unsigned(g > 0 ? g : 1);
}

// ---- Programmatic dependent launch (sm_90+; gru: proj.cu -> v3/v4, kron: the backward's kernel chain) ----------
// A kernel launched with programmatic stream serialization (pdl_attribute) may start while the kernel before it in
// the stream still runs, once every block of that kernel has executed pdl_launch_dependents (or exited). Before
// pdl_wait returns, the dependent may read only what was written before that earlier kernel started; after, the
// earlier grid has finished and its writes are visible. Both are no-ops before sm_90 and in a plain launch.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The launch attribute that makes a launch programmatic (cudaLaunchKernelEx / cudaLaunchKernelExC; stream capture
// records it as a programmatic edge of the graph), and whether this device has it (sm_90+).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}
inline bool has_pdl() { return device_attr<cudaDevAttrComputeCapabilityMajor>(0) >= 9; }

}  // namespace lab
