// The CUDA versions of the faulty test family: v1 right; oob writes 2^34 elements past the end (an illegal
// address: the context of the process that ran it is unusable afterwards); spin never finishes.
#include "lab_cuda.cuh"
#include "lab_unit.h"

namespace {

__global__ void scale_v1(const float* x, float* y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

__global__ void scale_oob(const float* x, float* y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i + (int64_t(1) << 34)] = 2.0f * x[i];
}

// Nothing writes `faulty_stop`; each volatile read goes to memory, so nvcc cannot prove the loop ends and keep it
// out. (A volatile *local* does not do: on the H100 nvcc dropped that loop and the kernel returned.)
__device__ int faulty_stop = 0;

__global__ void scale_spin(const float* x, float* y, int64_t n) {
  while (!*static_cast<volatile int*>(&faulty_stop)) {
  }
  if (n) y[0] = x[0];
}

template <void (*K)(const float*, float*, int64_t)>
cudaError_t launch(const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  K<<<unsigned(lab::ceil_div(n, 256)), 256, 0, s>>>(x, y, n);
  return cudaGetLastError();
}

}  // namespace

LAB_EXPORTS(LAB_EXPORT("scale_v1", launch<scale_v1>), LAB_EXPORT("scale_oob", launch<scale_oob>),
            LAB_EXPORT("scale_spin", launch<scale_spin>))
