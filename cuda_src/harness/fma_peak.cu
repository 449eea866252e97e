// harness/fma_peak.cu — the FP32 FMA throughput probe: a kernel of the harness (lab.bench measures this GPU's
// ceilings with it), not of a family.
#include <cuda_runtime.h>

#include "lab_unit.h"

namespace harness {

// ---------------------------------------------------------------------------------------------------------------
// fma_peak: the FP32 FMA ceiling the lab measures once per GPU (bench.ceilings). Registers only, no memory traffic:
// 8 independent FMA chains per thread hide the ~4-cycle FMA latency; 16 unrolled steps per loop trip keep the loop
// overhead small. FLOPs = threads * iters * 16 * 8 * 2.
// ---------------------------------------------------------------------------------------------------------------
__global__ void fma_peak_kernel(float* __restrict__ out, int iters, float b, float c) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  float a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = tid * 1e-7f + j;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < 16; ++u) {
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] = fmaf(a[j], b, c);
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += a[j];
  out[tid] = s;  // keeps the chains alive
}


cudaError_t fma_peak_launch(float* out, int blocks, int threads, int iters, cudaStream_t s) {
  // b, c are runtime values so the compiler cannot fold the chain
  fma_peak_kernel<<<blocks, threads, 0, s>>>(out, iters, 0.9999999f, 1e-7f);
  return cudaGetLastError();
}

}  // namespace harness

LAB_EXPORTS(LAB_EXPORT("fma_peak", harness::fma_peak_launch))
