// gru/gates.cu — the fused gate kernel of v1/v2 and of the seq2seq decoder step (the ladder: gru.cuh)
#include "gru.cuh"

namespace gru {

// =================================================================================================================
// v1/v2 (and the decoder step): the fused gate kernel. One thread per (batch row, hidden unit).
//   gi: (B, >=3H) row stride ldgi, input projections without bias (or with, and b_ih == nullptr)
//   gh: (B, >=3H) row stride ldgh, recurrent projections without bias; nullptr means h_{t-1} W_hh^T = 0
//   h_prev (nullptr: zeros) and h_out may be the same memory (in place: each thread reads its element first)
// =================================================================================================================
template <class T, class A>
__global__ void gates_kernel(const A* __restrict__ gi, int64_t ldgi, const A* __restrict__ gh, int64_t ldgh,
                             const T* __restrict__ b_ih, const T* __restrict__ b_hh, const T* h_prev, int64_t ldhp,
                             T* h_out, int64_t ldho, int B, int H) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(B) * H) return;
  const int b = int(idx / H), j = int(idx % H);
  const A* x = gi + int64_t(b) * ldgi;
  A ir = x[j], iz = x[H + j], in = x[2 * H + j];
  if (b_ih) {
    ir += A(tof(b_ih[j]));
    iz += A(tof(b_ih[H + j]));
    in += A(tof(b_ih[2 * H + j]));
  }
  A hr = 0, hz = 0, hn = 0;
  if (gh) {
    const A* y = gh + int64_t(b) * ldgh;
    hr = y[j];
    hz = y[H + j];
    hn = y[2 * H + j];
  }
  hr += A(tof(b_hh[j]));
  hz += A(tof(b_hh[H + j]));
  hn += A(tof(b_hh[2 * H + j]));
  const A r = sigm(ir + hr), z = sigm(iz + hz), n = tanh_acc(in + r * hn);
  const A hp = h_prev ? A(tof(h_prev[int64_t(b) * ldhp + j])) : A(0);
  h_out[int64_t(b) * ldho + j] = store_as<T, A>(n + z * (hp - n));
}

}  // namespace gru

// =================================================================================================================
// Launcher (called from cpp_src/gru/gru.cpp for v1, v2 and gru_gates). dtype: 0 float32, 1 float16, 2 bfloat16,
// 3 float64. gi/gh are float (double for float64).
// =================================================================================================================
cudaError_t gru_gates(int dtype, const void* gi, int64_t ldgi, const void* gh, int64_t ldgh, const void* b_ih,
                      const void* b_hh, const void* h_prev, int64_t ldhp, void* h_out, int64_t ldho, int B, int H,
                      cudaStream_t stream) {
  using namespace gru;
  const int64_t n = int64_t(B) * H;
  if (n == 0) return cudaSuccess;
  const unsigned grid = unsigned(lab::ceil_div(n, kThreads));
#define LAB_GATES(T, A)                                                                                         \
  gates_kernel<T, A><<<grid, kThreads, 0, stream>>>(                                                           \
      static_cast<const A*>(gi), ldgi, static_cast<const A*>(gh), ldgh, static_cast<const T*>(b_ih),           \
      static_cast<const T*>(b_hh), static_cast<const T*>(h_prev), ldhp, static_cast<T*>(h_out), ldho, B, H)
  switch (dtype) {
    case kF32: LAB_GATES(float, float); break;
    case kF16: LAB_GATES(__half, float); break;
    case kBF16: LAB_GATES(__nv_bfloat16, float); break;
    case kF64: LAB_GATES(double, double); break;
    default: return cudaErrorInvalidValue;
  }
#undef LAB_GATES
  return cudaGetLastError();
}

LAB_EXPORTS(LAB_EXPORT("gru_gates", gru_gates))
