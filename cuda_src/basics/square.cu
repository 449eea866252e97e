// basics/square.cu — y = x * x (the ladder: basics.cuh)
#include "basics.cuh"

namespace basics {

__device__ inline float4 sq(float4 v) { return make_float4(v.x * v.x, v.y * v.y, v.z * v.z, v.w * v.w); }
__device__ inline double2 sq(double2 v) { return make_double2(v.x * v.x, v.y * v.y); }

template <class T>
__global__ void square_v1(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i];
}

template <class T>
__global__ void square_v2(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::n;
  const int64_t nv = n / W, stride = int64_t(gridDim.x) * blockDim.x;
  const V* xv = reinterpret_cast<const V*>(x);
  V* yv = reinterpret_cast<V*>(y);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nv; i += stride) yv[i] = sq(xv[i]);
  // tail: fewer than W elements, done by the first threads of block 0
  if (blockIdx.x == 0 && threadIdx.x < n - nv * W) {
    int64_t i = nv * W + threadIdx.x;
    y[i] = x[i] * x[i];
  }
}

template <class T>
cudaError_t square_launch(int version, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (version == 2 && aligned16(x) && aligned16(y)) {
    square_v2<T><<<lab::grid_stride_blocks(n / Vec<T>::n + 1, kBlock), kBlock, 0, stream>>>(x, y, n);
  } else {
    square_v1<T><<<unsigned(lab::ceil_div(n, kBlock)), kBlock, 0, stream>>>(x, y, n);
  }
  return cudaGetLastError();
}

}  // namespace basics

LAB_EXPORTS(LAB_EXPORT("square_f32", basics::square_launch<float>),
            LAB_EXPORT("square_f64", basics::square_launch<double>))
