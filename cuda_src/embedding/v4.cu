// embedding/v4.cu — forward v4 (the ladder and the napkin math: embedding.cuh): v3 with evict-first stores of the
// output. The gathered rows are written once and never read back by this kernel; at T = 65536, D = 1024 fp32 those
// 268 MB stream through a 50 MB L2 and, with ordinary stores, evict table rows that repeated indices would re-read.
// The kernel is embedding_fwd_checked<..., kStream = true> (embedding.cuh). No backward v4: backward v3 is the top
// rung.
#include "embedding.cuh"

namespace embedding {

template <class T, class I>
cudaError_t fwd_v4(const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
                   int64_t num_embeddings, unsigned long long* bad_pos, cudaStream_t stream) {
  return launch_fwd_checked<T, I, true>(static_cast<const I*>(idx), static_cast<const T*>(weight),
                                        static_cast<T*>(out), tokens, dim, num_embeddings, bad_pos, stream);
}

}  // namespace embedding

LAB_EXPORTS(EMBEDDING_EXPORT_TI(embedding::fwd_v4, "embedding_fwd_v4"))
