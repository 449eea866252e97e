// lab_cuda.cuh — small helpers shared by every cuda_src/<family>.cu. No torch headers here: kernels see plain
// pointers, sizes and a stream, which keeps nvcc off torch's headers (a one-line .cu edit rebuilds in ~1.5 s).
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "lab_unit.h"  // lab::ceil_div (host and device), the export table

namespace lab {

// Multiprocessor count of the current device (cached per device; asked once, costs ~1 us after that).
inline int sm_count() {
  static int counts[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 132;
  if (!counts[dev]) cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev);
  return counts[dev];
}

// Shared memory a block may opt in to on the current device (cached per device): 227 KB on an H100.
inline int smem_optin() {
  static int bytes[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 227 * 1024;
  if (!bytes[dev]) cudaDeviceGetAttribute(&bytes[dev], cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return bytes[dev];
}

// Threads one SM can hold at once (cached per device): 2048 on an H100.
inline int max_threads_per_sm() {
  static int threads[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 2048;
  if (!threads[dev]) cudaDeviceGetAttribute(&threads[dev], cudaDevAttrMaxThreadsPerMultiProcessor, dev);
  return threads[dev];
}

// Grid for a grid-stride loop over `items` with `block` threads: a few waves of blocks per SM keeps every SM busy
// and amortises block start-up; never more blocks than there is work.
inline unsigned grid_stride_blocks(int64_t items, int block, int blocks_per_sm = 4) {
  int64_t need = ceil_div(items, block);
  int64_t cap = int64_t(sm_count()) * blocks_per_sm;
  int64_t g = need < cap ? need : cap;
  return unsigned(g > 0 ? g : 1);
}

}  // namespace lab
