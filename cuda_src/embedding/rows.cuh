// embedding/rows.cuh — the row-centric backward that v3 and v4 share (the ladder: embedding.cuh; v3.cu sorts with
// at::sort in the binding, v4.cu with its own radix sort). Given the indices sorted stably into runs (keys, and the
// token position each came from), it writes grad_weight: a CSR offsets table (where each row's run starts); one block
// per (row, column tile) writes every grad_weight element exactly once (a sum, or 0 for a row no token hits): no
// memset, and grad_out is read once. A run longer than kChunk tokens is cut at fixed kChunk boundaries of the sorted
// order: each piece is summed by its own block into a scratch row, and the row's block adds the pieces in order. Same
// bits every run, no long pole.
// Key types: K holds row + kShift (v3: int64 rows, shift 0; v4: uint32 keys with bad indices clamped to -1 and V, shift
// 1); P is the position type (int64 from at::sort, int32 in v4). Bad keys sort to the ends and own no row.
#pragma once

#include "embedding.cuh"

namespace embedding {

// Pieces of long runs: kChunk sorted positions per chunk. A chunk meets at most two runs longer than kChunk (one
// ending in it, one starting in it; a run covering the whole chunk is the only one it meets), so the scratch holds two
// rows per chunk: slot 0 for the piece at the chunk's start, slot 1 for a piece that starts inside it.
// With kChunk = 64 the hottest Zipf row (~14% of 65536 tokens) is ~140 pieces: the pieces are summed 64 rows each by
// ~140 blocks at once, then one block adds 140 partial rows (L2-resident: the scratch is 8 MB).
constexpr int64_t kChunk = 64;
constexpr int kThreads = 128;  // per block of the row and piece kernels: one column tile = 128 x kVec columns

template <int kShift, class K> __device__ __forceinline__ int64_t row_of(K key) { return int64_t(key) - kShift; }

inline int64_t offsets_bytes(int64_t num_embeddings) { return ((num_embeddings + 1) * 8 + 255) / 256 * 256; }

// Scratch bytes of rows_launch: offsets (V + 1 int64, 256-byte aligned) then the pieces' partial rows
// (ceil(T / kChunk) x 2 x D of the accumulate type).
template <class T>
int64_t rows_workspace_bytes(int64_t tokens, int64_t dim, int64_t num_embeddings) {
  return offsets_bytes(num_embeddings) + lab::ceil_div(tokens, kChunk) * 2 * dim * int64_t(sizeof(typename Acc<T>::type));
}

// Vectors of grad_out / grad_weight elements: kVec elements = 16 bytes when rows allow it, else 1.
template <class T, int kVec> struct alignas(kVec * sizeof(T)) Vec { T v[kVec]; };

// offsets[n] = the first sorted position whose key is >= n (a lower bound), for n in [0, V]: row n's run is
// [offsets[n], offsets[n+1]). A binary search per row (log2 T dependent loads of an L2-resident array) rather than
// a pass over the positions that fills the gaps between keys: that pass gives one thread a serial loop over every
// row no token hits (T = 1, V = 1e6: a million stores in one thread). Bad keys sort to the ends and own no row.
template <class K, int kShift>
__global__ void csr_offsets(const K* __restrict__ sorted, int64_t tokens, int64_t num_embeddings,
                            int64_t* __restrict__ offsets) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n <= num_embeddings;
       n += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = tokens;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (row_of<kShift>(sorted[mid]) < n) lo = mid + 1; else hi = mid;
    }
    offsets[n] = lo;
  }
}

// Sum rows perm[lo..hi) of grad (token order within the range) over this thread's vector of columns.
template <class T, int kVec, class P>
__device__ __forceinline__ void add_rows(const T* __restrict__ grad, const P* __restrict__ perm, int64_t lo,
                                         int64_t hi, int64_t dim, int64_t col, typename Acc<T>::type (&s)[kVec]) {
  using V = Vec<T, kVec>;
  constexpr int kUnroll = 8;  // eight rows' loads in flight before the first add (a 64-row piece: 8 round trips)
  int64_t k = lo;
  for (; k + kUnroll <= hi; k += kUnroll) {
    V r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = *reinterpret_cast<const V*>(grad + int64_t(perm[k + u]) * dim + col);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < kVec; ++e) s[e] += to_acc(r[u].v[e]);
  }
  for (; k < hi; ++k) {
    const V r = *reinterpret_cast<const V*>(grad + int64_t(perm[k]) * dim + col);
#pragma unroll
    for (int e = 0; e < kVec; ++e) s[e] += to_acc(r.v[e]);
  }
}

// One block per (chunk, column tile): the pieces of long runs (> kChunk tokens) that meet this chunk, each summed in
// token order into partials[chunk][slot] (Acc type, (chunks, 2, dim)). Chunks that meet no long run return at once.
template <class T, int kVec, class K, class P, int kShift>
__global__ void __launch_bounds__(kThreads) long_run_pieces(const T* __restrict__ grad,
                                                            const K* __restrict__ sorted,
                                                            const P* __restrict__ perm,
                                                            const int64_t* __restrict__ offsets, int64_t tokens,
                                                            int64_t dim, int64_t num_embeddings, int64_t padding_idx,
                                                            typename Acc<T>::type* __restrict__ partials) {
  using A = typename Acc<T>::type;
  const int64_t chunk = blockIdx.x, c0 = chunk * kChunk, c1 = min(c0 + kChunk, tokens);
  const int64_t col = (int64_t(blockIdx.y) * kThreads + threadIdx.x) * kVec;
  if (col >= dim) return;
  for (int slot = 0; slot < 2; ++slot) {
    const int64_t key = row_of<kShift>(sorted[slot == 0 ? c0 : c1 - 1]);
    if (key < 0 || key >= num_embeddings || key == padding_idx) continue;
    const int64_t lo = offsets[key], hi = offsets[key + 1];
    if (hi - lo <= kChunk) continue;                   // a short run: its row's block sums it directly
    if (slot == 1 && lo <= c0) continue;               // the same run as slot 0's (it covers the whole chunk)
    const int64_t a = max(lo, c0), b = min(hi, c1);    // the piece
    A s[kVec] = {};
    add_rows<T, kVec, P>(grad, perm, a, b, dim, col, s);
    A* dst = partials + (chunk * 2 + slot) * dim + col;
#pragma unroll
    for (int e = 0; e < kVec; ++e) dst[e] = s[e];
  }
}

// One block per (row, column tile): grad_weight[n, tile] written once.
template <class T, int kVec, class P>
__global__ void __launch_bounds__(kThreads) rows_from_runs(const T* __restrict__ grad,
                                                           const P* __restrict__ perm,
                                                           const int64_t* __restrict__ offsets,
                                                           const typename Acc<T>::type* __restrict__ partials,
                                                           int64_t dim, int64_t padding_idx, T* __restrict__ gw) {
  using A = typename Acc<T>::type;
  const int64_t n = blockIdx.x;
  const int64_t col = (int64_t(blockIdx.y) * kThreads + threadIdx.x) * kVec;
  if (col >= dim) return;
  A s[kVec] = {};
  const int64_t lo = offsets[n], hi = offsets[n + 1];
  if (n != padding_idx && hi > lo) {
    if (hi - lo <= kChunk) {
      add_rows<T, kVec, P>(grad, perm, lo, hi, dim, col, s);
    } else {  // the pieces, in chunk order: the first one in slot 1 unless the run starts on a chunk boundary
      // ~140 pieces for the hottest Zipf row: their loads must be in flight together (one at a time, that is ~140
      // L2 round trips in a row in one block, the tail of the grid), hence 8 loads issued before their adds.
      const int64_t first = lo / kChunk, last = (hi - 1) / kChunk;
      auto piece = [&](int64_t c) {
        return partials + (c * 2 + ((c == first && lo % kChunk != 0) ? 1 : 0)) * dim + col;
      };
      constexpr int kUnroll = 8;
      int64_t c = first;
      for (; c + kUnroll <= last + 1; c += kUnroll) {
        A r[kUnroll][kVec];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int e = 0; e < kVec; ++e) r[u][e] = piece(c + u)[e];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int e = 0; e < kVec; ++e) s[e] += r[u][e];
      }
      for (; c <= last; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) s[e] += piece(c)[e];
    }
  }
  Vec<T, kVec> o;
#pragma unroll
  for (int e = 0; e < kVec; ++e) o.v[e] = from_acc<T>(s[e]);
  *reinterpret_cast<Vec<T, kVec>*>(gw + n * dim + col) = o;
}

template <class T, int kVec, class K, class P, int kShift>
cudaError_t rows_launch_vec(const T* grad, const K* sorted, const P* perm, T* gw, int64_t tokens,
                          int64_t dim, int64_t num_embeddings, int64_t padding_idx, int64_t* offsets,
                          typename Acc<T>::type* partials, cudaStream_t stream) {
  const int64_t tiles = lab::ceil_div(dim, int64_t(kThreads) * kVec);
  if (tiles > 65535) return cudaErrorInvalidConfiguration;  // dim > 8M elements: the binding refuses it first
  if (tokens > 0) {
    long_run_pieces<T, kVec, K, P, kShift><<<dim3(unsigned(lab::ceil_div(tokens, kChunk)), unsigned(tiles)), kThreads, 0, stream>>>(
        grad, sorted, perm, offsets, tokens, dim, num_embeddings, padding_idx, partials);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  rows_from_runs<T, kVec, P><<<dim3(unsigned(num_embeddings), unsigned(tiles)), kThreads, 0, stream>>>(
      grad, perm, offsets, partials, dim, padding_idx, gw);
  return cudaGetLastError();
}

// The row-centric backward from sorted keys and their token positions: offsets, pieces of long runs, rows.
// workspace: offsets (V + 1 int64) then the pieces' partial rows, as rows_workspace_bytes sizes it.
template <class T, class K, class P, int kShift>
cudaError_t rows_launch(const T* grad, const K* sorted, const P* perm, T* gw, int64_t tokens, int64_t dim,
                        int64_t num_embeddings, int64_t padding_idx, void* workspace, cudaStream_t stream) {
  if (num_embeddings == 0 || dim == 0) return cudaSuccess;
  if (num_embeddings > 0x7fffffff) return cudaErrorInvalidConfiguration;  // one block row per grid x
  auto* offsets = static_cast<int64_t*>(workspace);
  auto* partials = reinterpret_cast<typename Acc<T>::type*>(static_cast<char*>(workspace) +
                                                            offsets_bytes(num_embeddings));
  csr_offsets<K, kShift><<<lab::grid_stride_blocks(num_embeddings + 1, kBlock), kBlock, 0, stream>>>(
      sorted, tokens, num_embeddings, offsets);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kV = 16 / sizeof(T);  // 4 fp32, 8 bf16, 2 fp64
  if (dim % kV == 0 && aligned16(grad) && aligned16(gw))
    return rows_launch_vec<T, kV, K, P, kShift>(grad, sorted, perm, gw, tokens, dim, num_embeddings, padding_idx,
                                                 offsets, partials, stream);
  return rows_launch_vec<T, 1, K, P, kShift>(grad, sorted, perm, gw, tokens, dim, num_embeddings, padding_idx, offsets,
                                             partials, stream);
}
}  // namespace embedding
