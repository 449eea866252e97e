// basics/vector_add.cu — z = a + b (the ladder: basics.cuh)
#include "basics.cuh"

namespace basics {

__device__ inline float4 add(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ inline double2 add(double2 a, double2 b) { return make_double2(a.x + b.x, a.y + b.y); }

template <class T>
__global__ void add_v1(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

template <class T>
__global__ void add_v2(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t n) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::n;
  const int64_t nv = n / W, stride = int64_t(gridDim.x) * blockDim.x;
  const V* av = reinterpret_cast<const V*>(a);
  const V* bv = reinterpret_cast<const V*>(b);
  V* cv = reinterpret_cast<V*>(c);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nv; i += stride) cv[i] = add(av[i], bv[i]);
  if (blockIdx.x == 0 && threadIdx.x < n - nv * W) {
    int64_t i = nv * W + threadIdx.x;
    c[i] = a[i] + b[i];
  }
}

template <class T>
cudaError_t add_launch(int version, const T* a, const T* b, T* c, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (version == 2 && aligned16(a) && aligned16(b) && aligned16(c)) {
    add_v2<T><<<lab::grid_stride_blocks(n / Vec<T>::n + 1, kBlock), kBlock, 0, stream>>>(a, b, c, n);
  } else {
    add_v1<T><<<unsigned(lab::ceil_div(n, kBlock)), kBlock, 0, stream>>>(a, b, c, n);
  }
  return cudaGetLastError();
}

}  // namespace basics

LAB_EXPORTS(LAB_EXPORT("vector_add_f32", basics::add_launch<float>),
            LAB_EXPORT("vector_add_f64", basics::add_launch<double>))
