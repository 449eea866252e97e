// harness/smem_fill.cu — the shared-memory fill probe: how long a grid takes to pull `bytes` a block from HBM into
// shared memory, and nothing else. The floor under a launch that must bring its weights on chip before it can
// finish: the one-step decoder (cuda_src/gru/greedy.cu, one block an SM, ~160 KB a block) does its arithmetic on
// top of this. lab.ceilings.smem_fill times it like any row (graph replay, the L2 flushed before each repetition).
#include <cuda_runtime.h>

#include "lab_sm90.cuh"  // mbarrier and the bulk copy (sm_90a); cp.async (lab_gemm.cuh) elsewhere
#include "lab_unit.h"

namespace harness {

constexpr int kFillThreads = 256;
constexpr int kPiece = 32768;  // bytes a bulk copy: a few copies a block, in flight together

// Block b copies src[b bytes, (b + 1) bytes) into its shared memory, then writes the slice's last 16 bytes, read back
// from shared memory, to sink[b] (so a test can see that the copy landed). On sm_90a thread 0 starts the bulk copies
// on one mbarrier; elsewhere every thread issues 16-byte cp.async copies. bytes: a multiple of 16.
__global__ void __launch_bounds__(kFillThreads) smem_fill_kernel(const char* __restrict__ src, int bytes,
                                                                 int4* __restrict__ sink) {
  extern __shared__ __align__(128) char sm[];
  const char* s = src + int64_t(blockIdx.x) * bytes;
#ifdef LAB_SM90A
  __shared__ __align__(8) unsigned long long bar;
  if (threadIdx.x != 0) return;  // one thread issues, waits and reports
  const uint32_t b = lab::smem_u32(&bar);
  lab::mbar_init(b, 1);
  lab::mbar_fence_init();
  lab::mbar_expect_tx(b, uint32_t(bytes));  // the byte count before any copy can complete
  for (int o = 0; o < bytes; o += kPiece)
    lab::bulk_load(lab::smem_u32(sm + o), s + o, uint32_t(bytes - o < kPiece ? bytes - o : kPiece), b);
  lab::mbar_wait(b, 0);
#else
  for (int i = threadIdx.x; i < bytes / 16; i += kFillThreads) lab::cp_async16(lab::smem_u32(sm + 16 * i), s + 16 * i, 16);
  lab::cp_async_commit();
  lab::cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x != 0) return;
#endif
  sink[blockIdx.x] = *reinterpret_cast<const int4*>(sm + bytes - 16);
}

// src: blocks * bytes bytes, 16-byte aligned; sink: blocks int4. bytes: a positive multiple of 16 within the block's
// opt-in shared memory (else the attribute call fails and its error comes back).
cudaError_t smem_fill_launch(const void* src, int blocks, int bytes, void* sink, cudaStream_t stream) {
  if (blocks <= 0 || bytes <= 0 || bytes % 16 != 0) return cudaErrorInvalidValue;
  const cudaError_t e = cudaFuncSetAttribute(smem_fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  smem_fill_kernel<<<blocks, kFillThreads, bytes, stream>>>(static_cast<const char*>(src), bytes,
                                                             static_cast<int4*>(sink));
  return cudaGetLastError();
}

}  // namespace harness

LAB_EXPORTS(LAB_EXPORT("smem_fill", harness::smem_fill_launch))
