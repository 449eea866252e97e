// embedding/v2.cu — v2 (the ladder and the napkin math: embedding.cuh): forward, one warp per row with 16-byte
// vectors; backward, deterministic: one warp per run of equal sorted indices, summed in token order.
#include "embedding.cuh"

namespace embedding {

constexpr int kWarps = kBlock / 32;  // rows (forward) or sorted positions (backward) per block

// ---------------------------------------------------------------------------------------------------------------
// forward v2: one warp per row
// ---------------------------------------------------------------------------------------------------------------
// The index is read once per row by the whole warp (one broadcast load), not once per element as in v1, and the row
// is copied by copy_row (embedding.cuh): as 16-byte vectors (kVec) when the launcher found D * sizeof(T) a multiple
// of 16 and both base pointers 16-byte aligned (so every row starts on a 16-byte boundary), else element by element.
template <class T, class I, bool kVec>
__global__ void __launch_bounds__(kBlock) embedding_fwd_v2(const I* __restrict__ idx, const T* __restrict__ weight,
                                                           T* __restrict__ out, int64_t tokens, int64_t dim,
                                                           int64_t num_embeddings) {
  const int lane = threadIdx.x & 31;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); t < tokens; t += int64_t(gridDim.x) * kWarps) {
    const I n = idx[t];
    T* dst = out + t * dim;
    if (!in_range(n, num_embeddings)) {  // never read outside weight (the binding's check was turned off)
      for (int64_t c = lane; c < dim; c += 32) dst[c] = bad_row_value<T>();
      continue;
    }
    copy_row<T, kVec, false>(weight + int64_t(n) * dim, dst, dim, lane);
  }
}

template <class T, class I>
cudaError_t fwd_v2(const void* idx_, const void* weight_, void* out_, int64_t tokens, int64_t dim,
                   int64_t num_embeddings, cudaStream_t stream) {
  const I* idx = static_cast<const I*>(idx_);
  const T* weight = static_cast<const T*>(weight_);
  T* out = static_cast<T*>(out_);
  if (tokens == 0 || dim == 0) return cudaSuccess;
  const bool vec = (dim * int64_t(sizeof(T))) % 16 == 0 && aligned16(weight) && aligned16(out);
  // a grid-stride loop over rows: 4 blocks of 8 warps per SM at a time, each warp walking rows
  const unsigned blocks = lab::grid_stride_blocks(tokens, kWarps, 8);
  if (vec)
    embedding_fwd_v2<T, I, true><<<blocks, kBlock, 0, stream>>>(idx, weight, out, tokens, dim, num_embeddings);
  else
    embedding_fwd_v2<T, I, false><<<blocks, kBlock, 0, stream>>>(idx, weight, out, tokens, dim, num_embeddings);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------------
// backward v2: deterministic, from sorted indices
// ---------------------------------------------------------------------------------------------------------------
// sorted: the indices sorted stably (int64), perm: where each came from (sorted[j] = idx[perm[j]]), so equal indices
// sit in runs in token order. Warp j owns sorted position j; it works only if j starts a run (sorted[j-1] differs).
// It finds the run's end, and its lanes walk the columns (32 consecutive columns per step: coalesced), each lane
// adding the run's rows in order in fp32 (fp64) and writing the sum once. Every run's sum is computed by one warp in
// one fixed order: bit for bit the same every run. Rows no run covers (and the padding row's, and a bad index's) are
// the memset's zeros.
template <class T>
__global__ void __launch_bounds__(kBlock) embedding_bwd_v2(const T* __restrict__ grad,
                                                           const int64_t* __restrict__ sorted,
                                                           const int64_t* __restrict__ perm, T* __restrict__ gw,
                                                           int64_t tokens, int64_t dim, int64_t num_embeddings,
                                                           int64_t padding_idx) {
  using A = typename Acc<T>::type;
  const int lane = threadIdx.x & 31;
  for (int64_t j = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); j < tokens; j += int64_t(gridDim.x) * kWarps) {
    const int64_t n = sorted[j];
    if (j > 0 && sorted[j - 1] == n) continue;                                // not the start of a run
    if (!in_range(n, num_embeddings) || n == padding_idx) continue;
    int64_t end = j + 1;
    while (end < tokens && sorted[end] == n) ++end;                            // warp-uniform
    T* dst = gw + n * dim;
    for (int64_t c = lane; c < dim; c += 32) {
      A s = A(0);
      for (int64_t k = j; k < end; ++k) s += to_acc(grad[perm[k] * dim + c]);  // token order
      dst[c] = from_acc<T>(s);
    }
  }
}

template <class T>
cudaError_t bwd_v2(const void* grad_out, const int64_t* sorted, const int64_t* perm, void* grad_weight,
                   int64_t tokens, int64_t dim, int64_t num_embeddings, int64_t padding_idx, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(grad_weight, 0, size_t(num_embeddings * dim) * sizeof(T), stream);
  if (err != cudaSuccess || tokens == 0 || dim == 0) return err;
  const unsigned blocks = lab::grid_stride_blocks(tokens, kWarps, 8);
  embedding_bwd_v2<T><<<blocks, kBlock, 0, stream>>>(static_cast<const T*>(grad_out), sorted, perm,
                                                     static_cast<T*>(grad_weight), tokens, dim, num_embeddings,
                                                     padding_idx);
  return cudaGetLastError();
}

}  // namespace embedding

LAB_EXPORTS(EMBEDDING_EXPORT_TI(embedding::fwd_v2, "embedding_fwd_v2"),
            LAB_EXPORT("embedding_bwd_v2_f32", embedding::bwd_v2<float>),
            LAB_EXPORT("embedding_bwd_v2_bf16", embedding::bwd_v2<__nv_bfloat16>),
            LAB_EXPORT("embedding_bwd_v2_f64", embedding::bwd_v2<double>))
