// gru/decoder.cu — the seq2seq decoder step's token pick and gathers (the ladder: gru.cuh, "Decoder step")
#include "gru.cuh"

namespace gru {

// ---- the decoder step's token pick and gathers -------------------------------------------------------------------
template <class T> __device__ __forceinline__ T qnan();
template <> __device__ __forceinline__ float qnan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double qnan<double>() { return __longlong_as_double(0x7ff8000000000000ll); }

// torch.argmax order: NaN is the largest value; among equals the first index wins.
template <class T>
__device__ __forceinline__ bool better(T v, int i, T bv, int bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > bv || (v == bv && i < bi);
}

// One block per batch row: token = argmax(logits[b]) or tokens_in[b]; xh[b, :E] = emb[token];
// gi[b, :] = gi_table[token] + gi_ctx[b]. A token outside [0, vocab) poisons the row with NaN (no device assert).
// Tried, not kept: the greedy loop's fc_out as a plain GEMM (mm) with fc_ctx added here as the logits are read,
// instead of addmm (which copies fc_ctx into its output first; alone, addmm 48.0 us against mm 40.8 at batch 128 on
// the H100). Whole greedy decodes, same run (graph, L2 flushed): batch 8 1101 -> 1059 us, but 32 1546 -> 1573,
// 64 1795 -> 1845, 128 2545 -> 2553: the pick's second read of the row cost more than the copy saved.
template <class T>
__global__ void decoder_prep_kernel(const T* __restrict__ logits, int64_t ldl, int V, const int64_t* __restrict__ tok_in,
                                    int64_t* __restrict__ tok_out, const T* __restrict__ emb, int E,
                                    const T* __restrict__ gtab, const T* __restrict__ gctx, int G3, int vocab,
                                    T* __restrict__ xh, int64_t ldxh, T* __restrict__ gi) {
  const int b = blockIdx.x, tid = threadIdx.x;
  __shared__ int64_t tok_s;
  if (logits) {
    const T* row = logits + int64_t(b) * ldl;
    T bv = row[0];
    int bi = 0;
    for (int i = tid; i < V; i += blockDim.x)
      if (better(row[i], i, bv, bi)) bv = row[i], bi = i;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const T ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    __shared__ T wv[32];
    __shared__ int wi[32];
    if ((tid & 31) == 0) wv[tid >> 5] = bv, wi[tid >> 5] = bi;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < int(blockDim.x >> 5); ++w)
        if (better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w];
      tok_s = bi;
    }
  } else if (tid == 0) {
    tok_s = tok_in[b];
  }
  __syncthreads();
  const int64_t tok = tok_s;
  if (tid == 0 && tok_out) tok_out[b] = tok;
  const bool ok = tok >= 0 && tok < vocab;
  for (int k = tid; k < E; k += blockDim.x) xh[int64_t(b) * ldxh + k] = ok ? emb[tok * E + k] : qnan<T>();
  for (int k = tid; k < G3; k += blockDim.x)
    gi[int64_t(b) * G3 + k] = ok ? gtab[tok * G3 + k] + gctx[int64_t(b) * G3 + k] : qnan<T>();
}

}  // namespace gru

// Launcher (called from cpp_src/gru/gru.cpp). dtype: 0 float32, 3 float64.
cudaError_t gru_decoder_prep(int dtype, const void* logits, int64_t ldl, int V, const int64_t* tok_in,
                             int64_t* tok_out, const void* emb, int E, const void* gtab, const void* gctx, int G3,
                             int vocab, void* xh, int64_t ldxh, void* gi, int B, cudaStream_t stream) {
  using namespace gru;
  if (B == 0) return cudaSuccess;
#define LAB_PREP(T)                                                                                              \
  decoder_prep_kernel<T><<<B, kThreads, 0, stream>>>(                                                           \
      static_cast<const T*>(logits), ldl, V, tok_in, tok_out, static_cast<const T*>(emb), E,                    \
      static_cast<const T*>(gtab), static_cast<const T*>(gctx), G3, vocab, static_cast<T*>(xh), ldxh,           \
      static_cast<T*>(gi))
  if (dtype == kF32)
    LAB_PREP(float);
  else if (dtype == kF64)
    LAB_PREP(double);
  else
    return cudaErrorInvalidValue;
#undef LAB_PREP
  return cudaGetLastError();
}

LAB_EXPORTS(LAB_EXPORT("gru_decoder_prep", gru_decoder_prep))
