// embedding/sort.cu — backward v4's sort (embedding.cuh, v4.cu): the indices as 32-bit keys sorted with their 32-bit
// token positions by cub's radix sort, on the ceil(log2(V + 2)) bits the keys use (16 for GPT-2's 50257 rows) where
// at::sort (v2, v3) sorts 64-bit keys on all 64 bits with 64-bit positions. Its own unit because cub's sort templates
// are most of a unit's compile time: an edit of v4's kernels (v4.cu, rows.cuh) does not recompile them.
//
// Keys: key = clamp(idx, -1, V) + 1, in [0, V + 1]: a bad index still sorts to an end (0: negative, V + 1: too large)
// and owns no row. Radix sort is stable: equal keys keep token order, so the sums of v4 are in token order within
// each piece, the same bits every run.
#include <cub/device/device_radix_sort.cuh>

#include "embedding.cuh"

namespace embedding {

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
inline size_t cub_scratch_bytes(int64_t tokens, int64_t num_embeddings) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                  static_cast<int>(tokens), 0, key_bits(num_embeddings));
  return bytes;
}

// Scratch of sort32 in bytes: [keys in][positions in][cub's scratch], each 256-byte aligned.
int64_t sort32_workspace(int64_t tokens, int64_t num_embeddings) {
  return int64_t(2 * align256(size_t(tokens) * 4) + align256(cub_scratch_bytes(tokens, num_embeddings)));
}

// idx (tokens of I) -> keys (sorted, row + 1) and pos (the token each came from), and ends[2] (key_ends).
// tokens < 2^31 and num_embeddings < 2^31 - 1 (32-bit keys and positions; the binding checks).
template <class I>
cudaError_t sort32(const void* idx, int64_t tokens, int64_t num_embeddings, void* workspace, uint32_t* keys,
                   int32_t* pos, int64_t* ends, cudaStream_t stream) {
  if (tokens > 0x7fffffff || num_embeddings > 0x7ffffffe) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  char* w = static_cast<char*>(workspace);
  const size_t n4 = align256(size_t(tokens) * 4);
  auto* keys_in = reinterpret_cast<uint32_t*>(w);
  auto* pos_in = reinterpret_cast<int32_t*>(w + n4);
  sort_inputs<I><<<lab::grid_stride_blocks(tokens, kBlock), kBlock, 0, stream>>>(static_cast<const I*>(idx), tokens,
                                                                                 num_embeddings, keys_in, pos_in);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  size_t bytes = cub_scratch_bytes(tokens, num_embeddings);
  err = cub::DeviceRadixSort::SortPairs(w + 2 * n4, bytes, keys_in, keys, pos_in, pos, static_cast<int>(tokens), 0,
                                        key_bits(num_embeddings), stream);
  if (err != cudaSuccess) return err;
  key_ends<<<1, 1, 0, stream>>>(keys, tokens, ends);
  return cudaGetLastError();
}

}  // namespace embedding

LAB_EXPORTS(LAB_EXPORT("embedding_sort32_i64", embedding::sort32<int64_t>),
            LAB_EXPORT("embedding_sort32_i32", embedding::sort32<int32_t>),
            LAB_EXPORT("embedding_sort32_workspace", embedding::sort32_workspace))
