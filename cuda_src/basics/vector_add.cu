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

// v3: v2's grid stopped at 4 blocks of 256 threads per SM, half of the 2048 thread slots an H100 SM holds (Nsight
// Compute, results/<device>/ncu.csv: v2's achieved occupancy far below that of Triton's kernel, whose grid is one
// 1024-element program per block with no cap). v3 sizes the grid to every thread slot of every SM and has each thread
// issue both of its 16-byte loads per operand (elements i and i + stride) before it adds. Little's law: ~3 TB/s x
// ~1 us of DRAM latency / 132 SMs ~= 23 KB must be in flight per SM; v2 asks for 1024 threads x 2 x 16 B = 32 KB,
// barely above it (a stall, a block's start or its tail leaves DRAM idle); v3 asks for 2048 x 4 x 16 B = 128 KB.
template <class T>
__global__ void add_v3(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t n) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::n;
  const int64_t nv = n / W, stride = int64_t(gridDim.x) * blockDim.x;
  const V* av = reinterpret_cast<const V*>(a);
  const V* bv = reinterpret_cast<const V*>(b);
  V* cv = reinterpret_cast<V*>(c);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nv; i += 2 * stride) {
    const int64_t j = i + stride;
    const bool two = j < nv;
    V a0 = av[i], b0 = bv[i], a1, b1;
    if (two) a1 = av[j], b1 = bv[j];
    cv[i] = add(a0, b0);
    if (two) cv[j] = add(a1, b1);
  }
  if (blockIdx.x == 0 && threadIdx.x < n - nv * W) {   // the n % W elements past the last whole vector
    int64_t i = nv * W + threadIdx.x;
    c[i] = a[i] + b[i];
  }
}

// v4: measured, v3's fuller grid did not help (ncu at 2^28 floats: achieved occupancy up from v2's, DRAM throughput
// not), and the kernels that reach the copy ceiling -- torch.add, Triton's, and v1 in float64 -- share one trait v2 and
// v3 lack: no grid-stride loop. Every block covers one contiguous tile once and exits, and the hardware dispatches
// blocks in index order, so the addresses in flight at any moment form one window that slides through memory; in a
// grid-stride loop each resident warp walks its own sequence of trips, the warps drift apart, and the in-flight
// addresses spread over several regions of DRAM (our reading, not measured: more DRAM row-buffer misses). v4 is
// v2's 16-byte body in Triton's shape: blocks of 128 threads, each thread two vectors per operand (1024 floats or 512
// doubles a block, both loads issued before either add), one block per tile: 2^28 floats -> 262144 blocks. (Measured:
// level with Triton and torch.add at 2^26-2^28; the block size changed with the loop, the two not measured apart.)
constexpr int kBlock4 = 128, kVecs4 = 2;

template <class T>
__global__ void add_v4(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t n) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::n;
  const int64_t nv = n / W, first = int64_t(blockIdx.x) * (kBlock4 * kVecs4) + threadIdx.x;
  const V* av = reinterpret_cast<const V*>(a);
  const V* bv = reinterpret_cast<const V*>(b);
  V* cv = reinterpret_cast<V*>(c);
  V x[kVecs4], y[kVecs4];
#pragma unroll
  for (int k = 0; k < kVecs4; ++k) {
    const int64_t i = first + k * kBlock4;
    if (i < nv) x[k] = av[i], y[k] = bv[i];
  }
#pragma unroll
  for (int k = 0; k < kVecs4; ++k) {
    const int64_t i = first + k * kBlock4;
    if (i < nv) cv[i] = add(x[k], y[k]);
  }
  if (blockIdx.x == 0 && threadIdx.x < n - nv * W) {   // the n % W elements past the last whole vector
    int64_t i = nv * W + threadIdx.x;
    c[i] = a[i] + b[i];
  }
}

template <class T>
cudaError_t add_launch(int version, const T* a, const T* b, T* c, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = aligned16(a) && aligned16(b) && aligned16(c);
  if (version == 2 && vec) {
    add_v2<T><<<lab::grid_stride_blocks(n / Vec<T>::n + 1, kBlock), kBlock, 0, stream>>>(a, b, c, n);
  } else if (version == 3 && vec) {
    // two vectors per thread per trip; at most every thread slot of every SM (2048 / 256 = 8 blocks per SM)
    add_v3<T><<<lab::grid_stride_blocks(lab::ceil_div(n / Vec<T>::n + 1, int64_t(2)), kBlock,
                                         lab::max_threads_per_sm() / kBlock), kBlock, 0, stream>>>(a, b, c, n);
  } else if (version == 4 && vec) {
    // one block per tile of kBlock4 * kVecs4 vectors, at least one (the scalar tail lives in block 0)
    const int64_t tiles = lab::ceil_div(n / Vec<T>::n, int64_t(kBlock4) * kVecs4);
    add_v4<T><<<unsigned(tiles > 0 ? tiles : 1), kBlock4, 0, stream>>>(a, b, c, n);
  } else {
    add_v1<T><<<unsigned(lab::ceil_div(n, kBlock)), kBlock, 0, stream>>>(a, b, c, n);
  }
  return cudaGetLastError();
}

}  // namespace basics

LAB_EXPORTS(LAB_EXPORT("vector_add_f32", basics::add_launch<float>),
            LAB_EXPORT("vector_add_f64", basics::add_launch<double>))
