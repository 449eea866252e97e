// embedding/v4.cu — v4 (the ladder and the napkin math: embedding.cuh).
//   forward v4: v3 with evict-first stores of the output. The gathered rows are written once and never read back by
//               this kernel; at T = 65536, D = 1024 fp32 those 268 MB stream through a 50 MB L2 and, with ordinary
//               stores, evict table rows that repeated indices would re-read. The kernel is
//               embedding_fwd_checked<..., kStream = true> (embedding.cuh).
//   backward v4: v3 with its own sort: a radix sort of 32-bit keys on the ceil(log2(V + 2)) bits they use (16 for
//               GPT-2's 50257 rows), with 32-bit positions, where v3's at::sort sorts 64-bit keys on all 64 bits
//               with 64-bit positions (8 passes of its onesweep kernel; measured on the H100 at T = 65536: the
//               largest part of v3's time after the row kernel). Same row-centric kernels (rows.cuh).
//
// Keys (sort.cu): key = clamp(idx, -1, V) + 1, in [0, V + 1]: a bad index still sorts to an end (0: negative, V + 1:
// too large) and owns no row; the binding reads the two ends after the launches to raise its error.
#include "rows.cuh"

namespace embedding {

// ---- forward ----------------------------------------------------------------------------------------------------
template <class T, class I>
cudaError_t fwd_v4(const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
                   int64_t num_embeddings, unsigned long long* bad_pos, cudaStream_t stream) {
  return launch_fwd_checked<T, I, true>(static_cast<const I*>(idx), static_cast<const T*>(weight),
                                        static_cast<T*>(out), tokens, dim, num_embeddings, bad_pos, stream);
}

// ---- backward ---------------------------------------------------------------------------------------------------
// The keys and positions come sorted from sort.cu (a unit of its own: cub's radix sort is most of a unit's compile
// time, and an edit here should not recompile it); this is rows.cuh on 32-bit keys (row + 1) and positions.
template <class T>
int64_t bwd_v4_workspace(int64_t tokens, int64_t dim, int64_t num_embeddings) {
  return rows_workspace_bytes<T>(tokens, dim, num_embeddings);
}

template <class T>
cudaError_t bwd_v4(const void* grad_out, const uint32_t* keys, const int32_t* pos, void* grad_weight, int64_t tokens,
                   int64_t dim, int64_t num_embeddings, int64_t padding_idx, void* workspace, cudaStream_t stream) {
  return rows_launch<T, uint32_t, int32_t, 1>(static_cast<const T*>(grad_out), keys, pos, static_cast<T*>(grad_weight),
                                              tokens, dim, num_embeddings, padding_idx, workspace, stream);
}

}  // namespace embedding

#define EMBEDDING_BWD_V4(T, tname)                                                                  \
  LAB_EXPORT("embedding_bwd_v4_" tname, embedding::bwd_v4<T>),                                     \
  LAB_EXPORT("embedding_bwd_v4_workspace_" tname, embedding::bwd_v4_workspace<T>)

LAB_EXPORTS(EMBEDDING_EXPORT_TI(embedding::fwd_v4, "embedding_fwd_v4"), EMBEDDING_BWD_V4(float, "f32"),
            EMBEDDING_BWD_V4(__nv_bfloat16, "bf16"), EMBEDDING_BWD_V4(double, "f64"))
