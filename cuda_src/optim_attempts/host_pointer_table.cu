// Attempt 2 of the notes: hand the kernel a host array of device pointers (float** to host memory).
// It builds, and every pointer in the array is a valid device address, but the array itself is in host memory: the
// kernel's first load through it is an illegal address (unless this system lets the GPU read pageable host memory,
// HMM/ATS — the program prints that attribute). `device` mode copies the same array to device memory first (the
// notes' "revisit attempt 2", what v3/v4 do), and works.
//   usage: host_pointer_table host|device      prints one line: RESULT mode=... error=... values_ok=...
// Run it in its own process (lab.kernels.optim.attempt_host_pointers does): the fault leaves the process's CUDA
// context unusable.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

constexpr int kTensors = 3, kSize = 1024;

__global__ void scale_all(float* const* ptrs, int n, int size, float a) {
  for (int t = 0; t < n; ++t)
    for (int i = threadIdx.x; i < size; i += blockDim.x) ptrs[t][i] *= a;
}

int main(int argc, char** argv) {
  const bool on_device = argc > 1 && std::strcmp(argv[1], "device") == 0;
  int dev = 0, pageable = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev);
  float* host_ptrs[kTensors];                          // the pointer table, in host memory (this stack frame)
  for (int t = 0; t < kTensors; ++t) {
    cudaMalloc(&host_ptrs[t], kSize * sizeof(float));
    float ones[kSize];
    for (float& x : ones) x = 1.f;
    cudaMemcpy(host_ptrs[t], ones, sizeof ones, cudaMemcpyHostToDevice);
  }
  float* const* table = host_ptrs;
  if (on_device) {                                     // copy the table itself to device memory
    float** dev_table = nullptr;
    cudaMalloc(&dev_table, sizeof host_ptrs);
    cudaMemcpy(dev_table, host_ptrs, sizeof host_ptrs, cudaMemcpyHostToDevice);
    table = dev_table;
  }
  scale_all<<<1, 256>>>(table, kTensors, kSize, 2.f);
  cudaError_t launch = cudaGetLastError();
  cudaError_t run = cudaDeviceSynchronize();
  cudaError_t err = launch != cudaSuccess ? launch : run;
  bool ok = false;
  if (err == cudaSuccess) {
    ok = true;
    float back[kSize];
    for (int t = 0; t < kTensors; ++t) {
      cudaMemcpy(back, host_ptrs[t], sizeof back, cudaMemcpyDeviceToHost);
      for (float x : back) ok = ok && x == 2.f;
    }
  }
  std::printf("RESULT mode=%s error=%s (%s) values_ok=%s pageable_memory_access=%d\n", on_device ? "device" : "host",
              cudaGetErrorName(err), cudaGetErrorString(err), err == cudaSuccess ? (ok ? "yes" : "no") : "-",
              pageable);
  return 0;
}
