// Attempt 3 of the notes: pack every tensor's pointer and size into one struct and pass it by value.
// Kernel arguments travel in a parameter buffer of limited size: 4 KB until CUDA 12.1, 32764 bytes from CUDA 12.1
// on Volta and newer (this nvcc targets nothing older). Build with -DN_TENSORS=n: the struct is 16·n bytes, plus
// 4 for the scale. Past the limit nvcc refuses ("Formal parameter space overflowed"); under it the program scales
// every tensor by 2 and checks.
//   prints one line: RESULT tensors=n param_bytes=... error=... values_ok=...
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#ifndef N_TENSORS
#define N_TENSORS 255
#endif
constexpr int kSize = 256;  // elements per tensor

struct Meta {
  float* ptr[N_TENSORS];
  int64_t size[N_TENSORS];
};

__global__ void scale_all(const Meta m, float a) {
  for (int t = blockIdx.x; t < N_TENSORS; t += gridDim.x)
    for (int i = threadIdx.x; i < m.size[t]; i += blockDim.x) m.ptr[t][i] *= a;
}

int main() {
  static Meta m;
  float* buf = nullptr;
  cudaMalloc(&buf, sizeof(float) * kSize * N_TENSORS);
  static float host[kSize * N_TENSORS];
  for (float& x : host) x = 1.f;
  cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice);
  for (int t = 0; t < N_TENSORS; ++t) m.ptr[t] = buf + t * kSize, m.size[t] = kSize;
  scale_all<<<132, 256>>>(m, 2.f);
  cudaError_t launch = cudaGetLastError();
  cudaError_t run = cudaDeviceSynchronize();
  cudaError_t err = launch != cudaSuccess ? launch : run;
  bool ok = err == cudaSuccess;
  if (ok) {
    cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost);
    for (float x : host) ok = ok && x == 2.f;
  }
  std::printf("RESULT tensors=%d param_bytes=%d error=%s values_ok=%s\n", N_TENSORS, int(sizeof(Meta) + sizeof(float)),
              cudaGetErrorName(err), ok ? "yes" : "no");
  return 0;
}
