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
// Keys: key = clamp(idx, -1, V) + 1, in [0, V + 1]: a bad index still sorts to an end (0: negative, V + 1: too large)
// and owns no row; the binding reads the two ends after the launch to raise its error.
#include <cub/device/device_radix_sort.cuh>

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
// keys and positions for the sort: keys[j] = clamp(idx[j], -1, V) + 1, pos[j] = j
template <class I>
__global__ void sort_inputs(const I* __restrict__ idx, int64_t tokens, int64_t num_embeddings,
                            uint32_t* __restrict__ keys, int32_t* __restrict__ pos) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < tokens; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = int64_t(idx[j]);
    keys[j] = uint32_t((n < 0 ? -1 : (n > num_embeddings ? num_embeddings : n)) + 1);
    pos[j] = int32_t(j);
  }
}

// the smallest and largest row the sorted keys name (-1: a negative index, V: one >= V), for the binding's check
__global__ void key_ends(const uint32_t* __restrict__ sorted, int64_t tokens, int64_t* __restrict__ ends) {
  ends[0] = int64_t(sorted[0]) - 1;
  ends[1] = int64_t(sorted[tokens - 1]) - 1;
}

inline int key_bits(int64_t num_embeddings) {  // bits of the largest key, V + 1
  int b = 1;
  while ((int64_t(1) << b) <= num_embeddings + 1) ++b;
  return b;
}

inline size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// cub's scratch for sorting `tokens` pairs (a query: no work is done with a null pointer)
inline size_t sort_scratch_bytes(int64_t tokens, int64_t num_embeddings) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                  static_cast<int>(tokens), 0, key_bits(num_embeddings));
  return bytes;
}

// Workspace layout: [rows.cuh's offsets + partials][keys in][keys out][pos in][pos out][cub scratch], each 256-aligned.
template <class T>
int64_t bwd_v4_workspace(int64_t tokens, int64_t dim, int64_t num_embeddings) {
  return align256(rows_workspace_bytes<T>(tokens, dim, num_embeddings)) + 4 * align256(size_t(tokens) * 4) +
         align256(sort_scratch_bytes(tokens, num_embeddings));
}

template <class T, class I>
cudaError_t bwd_v4(const void* grad_out, const void* idx, void* grad_weight, int64_t tokens, int64_t dim,
                   int64_t num_embeddings, int64_t padding_idx, void* workspace, int64_t* ends, cudaStream_t stream) {
  if (tokens > 0x7fffffff || num_embeddings > 0x7ffffffe) return cudaErrorInvalidValue;  // 32-bit keys, positions
  char* w = static_cast<char*>(workspace) + align256(rows_workspace_bytes<T>(tokens, dim, num_embeddings));
  const size_t n4 = align256(size_t(tokens) * 4);
  auto* keys_in = reinterpret_cast<uint32_t*>(w);
  auto* keys = reinterpret_cast<uint32_t*>(w + n4);
  auto* pos_in = reinterpret_cast<int32_t*>(w + 2 * n4);
  auto* pos = reinterpret_cast<int32_t*>(w + 3 * n4);
  void* scratch = w + 4 * n4;
  if (tokens > 0) {
    sort_inputs<I><<<lab::grid_stride_blocks(tokens, kBlock), kBlock, 0, stream>>>(static_cast<const I*>(idx), tokens,
                                                                                   num_embeddings, keys_in, pos_in);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    size_t bytes = sort_scratch_bytes(tokens, num_embeddings);
    err = cub::DeviceRadixSort::SortPairs(scratch, bytes, keys_in, keys, pos_in, pos, static_cast<int>(tokens), 0,
                                          key_bits(num_embeddings), stream);
    if (err != cudaSuccess) return err;
    key_ends<<<1, 1, 0, stream>>>(keys, tokens, ends);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return rows_launch<T, uint32_t, int32_t, 1>(static_cast<const T*>(grad_out), keys, pos, static_cast<T*>(grad_weight),
                                              tokens, dim, num_embeddings, padding_idx, workspace, stream);
}

}  // namespace embedding

#define EMBEDDING_BWD_V4(T, tname)                                                                  \
  LAB_EXPORT("embedding_bwd_v4_" tname "_i64", embedding::bwd_v4<T, int64_t>),                   \
  LAB_EXPORT("embedding_bwd_v4_" tname "_i32", embedding::bwd_v4<T, int32_t>),                   \
  LAB_EXPORT("embedding_bwd_v4_workspace_" tname, embedding::bwd_v4_workspace<T>)

LAB_EXPORTS(EMBEDDING_EXPORT_TI(embedding::fwd_v4, "embedding_fwd_v4"), EMBEDDING_BWD_V4(float, "f32"),
            EMBEDDING_BWD_V4(__nv_bfloat16, "bf16"), EMBEDDING_BWD_V4(double, "f64"))
