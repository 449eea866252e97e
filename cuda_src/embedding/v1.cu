// embedding/v1.cu — v1, the naive pair (the ladder and the napkin math: embedding.cuh): forward, one thread per
// output element (the kernel lives in embedding.cuh: v2 falls back to it); backward, one thread per grad_out element
// adding into grad_weight with atomicAdd.
#include "embedding.cuh"

namespace embedding {

// ---- forward ----------------------------------------------------------------------------------------------------
template <class T, class I>
cudaError_t fwd_v1(const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
                   int64_t num_embeddings, cudaStream_t stream) {
  return launch_fwd_v1(static_cast<const I*>(idx), static_cast<const T*>(weight), static_cast<T*>(out), tokens, dim,
                       num_embeddings, stream);
}

// ---- backward: atomic scatter-add -------------------------------------------------------------------------------
// acc is fp32 for fp32 and bf16 tensors (bf16 has atomicAdd too, but adding thousands of hot-row terms in bf16 would
// round at every step: 8 bits of mantissa), fp64 for double (native atomicAdd on sm_60+). Rows with idx[t] ==
// padding_idx or a bad index add nothing; the padding row stays at the memset's zero.
template <class T, class I>
__global__ void embedding_bwd_v1(const T* __restrict__ grad, const I* __restrict__ idx,
                                 typename Acc<T>::type* __restrict__ acc, int64_t total, int64_t dim,
                                 int64_t num_embeddings, int64_t padding_idx) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / dim, c = e - t * dim;
    const I n = idx[t];
    if (!in_range(n, num_embeddings) || int64_t(n) == padding_idx) continue;
    atomicAdd(acc + int64_t(n) * dim + c, to_acc(grad[e]));
  }
}

template <class T, class I>
cudaError_t bwd_v1(const void* grad_out, const void* idx, void* grad_weight, void* acc_buf, int64_t tokens,
                   int64_t dim, int64_t num_embeddings, int64_t padding_idx, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  constexpr bool kSameType = sizeof(A) == sizeof(T);  // fp32, fp64: add into grad_weight itself
  // no rows to write (num_embeddings or dim 0): nothing to do, and the empty fp32 buffer has no address to check
  if (num_embeddings == 0 || dim == 0) return cudaSuccess;
  if (!kSameType && acc_buf == nullptr) return cudaErrorInvalidValue;
  A* acc = kSameType ? static_cast<A*>(grad_weight) : static_cast<A*>(acc_buf);
  const int64_t rows_total = num_embeddings * dim, total = tokens * dim;
  cudaError_t err = cudaMemsetAsync(acc, 0, size_t(rows_total) * sizeof(A), stream);  // rows no token hits are 0
  if (err != cudaSuccess) return err;
  if (total > 0) {
    embedding_bwd_v1<T, I><<<lab::grid_stride_blocks(total, kBlock), kBlock, 0, stream>>>(
        static_cast<const T*>(grad_out), static_cast<const I*>(idx), acc, total, dim, num_embeddings, padding_idx);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if constexpr (!kSameType)
    return launch_convert(static_cast<const float*>(acc_buf), static_cast<T*>(grad_weight), rows_total, stream);
  return cudaSuccess;
}

}  // namespace embedding

LAB_EXPORTS(EMBEDDING_EXPORT_TI(embedding::fwd_v1, "embedding_fwd_v1"),
            EMBEDDING_EXPORT_TI(embedding::bwd_v1, "embedding_bwd_v1"))
