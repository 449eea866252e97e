// basics.cu — the first CUDA lessons, each as a ladder of versions.
//
//   square      y = x * x                       reference: torch.square
//   vector_add  z = a + b                       reference: torch.add
//   stencil_1d  y[i] = sum_{|j|<=3} x[i+j]      reference: F.conv1d with a ones(7) filter, zero padding
//   matmul      C = A @ B   (M,K) @ (K,N)       reference: torch.mm
//
// Versions (each adds one idea to the one before):
//   square/vector_add v1: one thread per element — the classic first kernel.
//   square/vector_add v2: 16-byte loads (float4/double2) in a grid-stride loop — fewer, wider memory instructions
//                         and no block-launch tail; the scalar v1 path takes misaligned pointers.
//   stencil_1d v1: each thread reads its 7 inputs from global memory (L1/L2 absorb the 7x re-read).
//   stencil_1d v2: the block stages its input tile plus a 3-wide halo on each side in shared memory once;
//                  the 7 reads per output then hit shared memory (__syncthreads between load and use).
//   matmul v1: one thread per C element, K-loop from global memory: 2 loads per FMA, memory-bound.
//   matmul v2: 32x32 shared-memory tiles: each loaded element is reused 32 times, so 2/32 loads per FMA.
//
// Napkin math (H100, ~3 TB/s measured copy bandwidth): square on 2^26 floats moves 512 MiB (read + write):
// 0.18 ms at copy speed. vector_add moves 768 MiB: 0.27 ms. These two are pure bandwidth; the goal is >= 90% of copy.
#include "lab_cuda.cuh"

namespace basics {

constexpr int kBlock = 256;
constexpr int kRadius = 3;
constexpr int kTile = 32;

template <class T> struct Vec;                      // the 16-byte vector of T
template <> struct Vec<float> { using type = float4; static constexpr int n = 4; };
template <> struct Vec<double> { using type = double2; static constexpr int n = 2; };

__device__ inline float4 sq(float4 v) { return make_float4(v.x * v.x, v.y * v.y, v.z * v.z, v.w * v.w); }
__device__ inline double2 sq(double2 v) { return make_double2(v.x * v.x, v.y * v.y); }
__device__ inline float4 add(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ inline double2 add(double2 a, double2 b) { return make_double2(a.x + b.x, a.y + b.y); }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---------------------------------------------------------------------------------------------------------------
// square
// ---------------------------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------------------------
// vector_add
// ---------------------------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------------------------
// stencil_1d, radius 3, zeros outside [0, n)
// ---------------------------------------------------------------------------------------------------------------
template <class T>
__global__ void stencil_v1(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  T s = 0;
#pragma unroll
  for (int j = -kRadius; j <= kRadius; ++j) {
    int64_t k = i + j;
    if (k >= 0 && k < n) s += x[k];
  }
  y[i] = s;
}

template <class T>
__global__ void stencil_v2(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  __shared__ T tile[kBlock + 2 * kRadius];  // this block's inputs plus a halo of kRadius on each side
  const int64_t base = int64_t(blockIdx.x) * blockDim.x;
  // Cooperative load of blockDim + 2R elements starting at base - R; out-of-range reads become the zero padding.
  for (int t = threadIdx.x; t < kBlock + 2 * kRadius; t += blockDim.x) {
    int64_t k = base - kRadius + t;
    tile[t] = (k >= 0 && k < n) ? x[k] : T(0);
  }
  __syncthreads();  // every thread's window spans elements other threads loaded
  int64_t i = base + threadIdx.x;
  if (i >= n) return;
  T s = 0;
#pragma unroll
  for (int j = 0; j <= 2 * kRadius; ++j) s += tile[threadIdx.x + j];
  y[i] = s;
}

template <class T>
cudaError_t stencil_launch(int version, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unsigned grid = unsigned(lab::ceil_div(n, kBlock));
  if (version == 2)
    stencil_v2<T><<<grid, kBlock, 0, stream>>>(x, y, n);
  else
    stencil_v1<T><<<grid, kBlock, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------------
// matmul: C (M,N) = A (M,K) @ B (K,N), all row-major
// ---------------------------------------------------------------------------------------------------------------
template <class T>
__global__ void matmul_v1(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
  // threadIdx.x walks columns: a warp reads 32 consecutive B elements and writes 32 consecutive C elements.
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  T acc = 0;
  for (int k = 0; k < K; ++k) acc += A[int64_t(row) * K + k] * B[int64_t(k) * N + col];
  C[int64_t(row) * N + col] = acc;
}

template <class T>
__global__ void matmul_v2(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
  // +1 column of padding on As: the inner loop reads As[ty][k] (a broadcast) and Bs[k][tx] (consecutive),
  // the padding keeps the transposed-looking store pattern of larger tiles off a single bank.
  __shared__ T As[kTile][kTile + 1];
  __shared__ T Bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
  T acc = 0;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Each thread loads one element of each tile; zeros past the edges make odd sizes need no special case below.
    As[ty][tx] = (row < M && k0 + tx < K) ? A[int64_t(row) * K + k0 + tx] : T(0);
    Bs[ty][tx] = (k0 + ty < K && col < N) ? B[int64_t(k0 + ty) * N + col] : T(0);
    __syncthreads();  // tiles complete before anyone reads them
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();  // everyone done reading before the next iteration overwrites the tiles
  }
  if (row < M && col < N) C[int64_t(row) * N + col] = acc;
}

template <class T>
cudaError_t matmul_launch(int version, const T* A, const T* B, T* C, int M, int N, int K, cudaStream_t stream) {
  if (M == 0 || N == 0) return cudaSuccess;
  dim3 block(kTile, version == 2 ? kTile : 8);
  dim3 grid(unsigned(lab::ceil_div(N, block.x)), unsigned(lab::ceil_div(M, version == 2 ? kTile : block.y)));
  if (grid.y > 65535) return cudaErrorInvalidConfiguration;
  if (version == 2)
    matmul_v2<T><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  else
    matmul_v1<T><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  return cudaGetLastError();
}

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

}  // namespace basics

cudaError_t basics_fma_peak(float* out, int blocks, int threads, int iters, cudaStream_t s) {
  // b, c are runtime values so the compiler cannot fold the chain
  basics::fma_peak_kernel<<<blocks, threads, 0, s>>>(out, iters, 0.9999999f, 1e-7f);
  return cudaGetLastError();
}

// ---- the launchers cpp_src/basics.cpp calls (one overload per dtype) --------------------------------------------
#define LAB_BASICS_INSTANTIATE(T)                                                                                 \
  cudaError_t basics_square(int v, const T* x, T* y, int64_t n, cudaStream_t s) {                                 \
    return basics::square_launch<T>(v, x, y, n, s);                                                               \
  }                                                                                                               \
  cudaError_t basics_vector_add(int v, const T* a, const T* b, T* c, int64_t n, cudaStream_t s) {                 \
    return basics::add_launch<T>(v, a, b, c, n, s);                                                               \
  }                                                                                                               \
  cudaError_t basics_stencil_1d(int v, const T* x, T* y, int64_t n, cudaStream_t s) {                             \
    return basics::stencil_launch<T>(v, x, y, n, s);                                                              \
  }                                                                                                               \
  cudaError_t basics_matmul(int v, const T* A, const T* B, T* C, int M, int N, int K, cudaStream_t s) {           \
    return basics::matmul_launch<T>(v, A, B, C, M, N, K, s);                                                      \
  }
LAB_BASICS_INSTANTIATE(float)
LAB_BASICS_INSTANTIATE(double)
