// Attempt 1 of the notes: hand the kernel the list as a std::vector<float*>.
// It does not build: std::vector's members (operator[], size, data) are host functions, so device code cannot call
// them, and the vector's storage is on the host heap anyway. Built by lab.kernels.optim.attempt_std_vector, which
// expects nvcc to refuse it.
#include <cstdio>
#include <vector>

__global__ void scale_all(std::vector<float*> ptrs, int n, float a) {
  for (size_t t = 0; t < ptrs.size(); ++t)
    for (int i = threadIdx.x; i < n; i += blockDim.x) ptrs[t][i] *= a;
}

int main() {
  std::vector<float*> ptrs(3, nullptr);
  scale_all<<<1, 256>>>(ptrs, 1024, 2.f);
  std::printf("RESULT launched\n");
  return 0;
}
