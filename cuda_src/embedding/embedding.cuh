// embedding — nn.Embedding forward (a gather of weight rows) and backward (the dense weight gradient, a scatter-add).
// This header holds what the units share; each version is its own unit (v1.cu, v2.cu), so an edit of one rebuilds
// that one.
//
// What it computes. idx: integer indices of any shape, T = idx.numel() tokens, int64 or int32; weight: (V, D) =
// (num_embeddings, dim), fp32, bf16 or fp64.
//   forward:   out[t, :] = weight[idx[t], :]                                  out: idx.shape + (D,)
//   backward:  grad_weight[n, :] = sum over t with idx[t] == n of grad_out[t, :]; the row of padding_idx is 0
// As nn.Embedding: the forward still gathers the padding row (only its gradient is zero). The backward adds in fp32
// (fp64 for double) and rounds each grad_weight element once (bf16: through an fp32 buffer).
// Reference: F.embedding, and index_add_ of grad_out in float64 (lab/kernels/embedding.py).
//
// Bad indices. The binding checks every index is in [0, V) before a launch (a ValueError naming the index). The
// kernels still never read outside weight: a forward row with a bad index is written as NaN, a backward row with a
// bad index is skipped, so a caller who turned the check off (check_indices=False) gets garbage, never a fault.
//
// Versions (each adds one idea to the one before):
//   forward v1: one thread per output element: scalar load of weight[idx[t], c], scalar store. The naive one.
//   forward v2: one warp per row: the index is read once per row (not once per element), and the row is copied in
//               16-byte vectors when D * sizeof(T) % 16 == 0 and weight and out are 16-byte aligned (scalar else).
//   backward v1: one thread per grad_out element, atomicAdd into an fp32 (fp64) grad_weight (bf16: into an fp32
//                buffer, then one conversion pass). The order of the adds is whatever the hardware does: not
//                deterministic in the last bits.
//   backward v2: deterministic: the binding sorts the indices (at::sort, stable) into (sorted, perm); one warp per
//                run of equal indices sums its rows in sorted order (= token order) and writes its row once. Bit for
//                bit the same run to run; no atomics.
//
// Napkin math (H100 SXM datasheet: 3.35 TB/s HBM3, 132 SMs, 50 MB L2), the bench shape T = 65536 tokens, D = 1024,
// V = 50257, fp32:
//   forward: 65536 x 1024 x 4 B = 268 MB read (the gathered rows) + 268 MB written = 537 MB -> 160 us at 3.35 TB/s.
//     The table is 206 MB (> L2), so each distinct row comes from HBM once; with uniform indices the 65536 draws hit
//     1 - e^(-65536/50257) = 73% of the 50257 rows, ~36.6k distinct rows (56% of the draws), so HBM reads could be
//     below 268 MB. Zipf-like indices repeat hot rows
//     that then hit in L2: fewer bytes still. So "% of copy bandwidth" at T*D read + T*D written is a fair goal.
//     v1 issues one 4-byte load + one 8-byte index load + one store per element; v2 one 16-byte load + one 16-byte
//     store per 4 fp32 elements (8 bf16), and the index once per row.
//   backward: read 268 MB of grad_out + write 206 MB of grad_weight (V x D x 4 B) = 474 MB -> 141 us at 3.35 TB/s.
//     v1 and v2 as written zero grad_weight first: another 206 MB of writes (61 us) on top. v1's atomics on fp32
//     run in L2; hot rows (Zipf) serialize on the same addresses. v2 pays a sort of 65536 keys (small) and, for a hot
//     row, one warp summing thousands of rows alone: the long pole under Zipf indices (see "not done" below).
//
// Not done (ideas for later versions): splitting long runs of equal indices across warps with a fixed-order second
// pass (keeps determinism, removes v2's Zipf long pole); 16-byte vectors in the backward; skipping the memset of rows
// that a run writes anyway.
//
// Units (each its own nvcc build; lab/build.py):
//   embedding.cuh  element types, the index guard, the v1 forward kernel (v2 falls back to it) and the zeroing and
//                  conversion helpers of the backward.
//   v1.cu          forward v1, backward v1 (atomics).
//   v2.cu          forward v2 (warp per row, 16-byte vectors), backward v2 (sorted, deterministic).
//
// Launchers (exported to cpp_src/embedding/embedding.cpp; names "embedding_fwd_v1_<T>_<I>", "embedding_bwd_v1_<T>_<I>",
// "embedding_fwd_v2_<T>_<I>" with T in f32, bf16, f64 and I in i32, i64; "embedding_bwd_v2_<T>" (int64 sorted keys)):
//   forward:     cudaError_t (const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
//                             int64_t num_embeddings, cudaStream_t stream)
//   backward v1: cudaError_t (const void* grad_out, const void* idx, void* grad_weight, void* acc, int64_t tokens,
//                             int64_t dim, int64_t num_embeddings, int64_t padding_idx, cudaStream_t stream)
//                acc: an fp32 (V, D) scratch buffer for bf16 (null for fp32 and fp64, which add into grad_weight).
//   backward v2: cudaError_t (const void* grad_out, const int64_t* sorted, const int64_t* perm, void* grad_weight,
//                             int64_t tokens, int64_t dim, int64_t num_embeddings, int64_t padding_idx,
//                             cudaStream_t stream)
// padding_idx: the resolved row in [0, V), or -1 for none. Shapes, dtypes, devices and index ranges are checked on the
// C++ side before a call.
#pragma once

#include <cuda_bf16.h>

#include "lab_cuda.cuh"
#include "lab_types.cuh"
#include "lab_unit.h"

namespace embedding {

constexpr int kBlock = 256;

// ---- element types (lab_types.cuh): fp32 accumulation for fp32/bf16, fp64 for double ---------------------------
using lab::Acc;
using lab::from_acc;
using lab::to_acc;

// What a forward row with a bad index is written as: NaN shows up in any check; zeros would hide.
template <class T> __device__ __forceinline__ T bad_row_value() { return from_acc<T>(typename Acc<T>::type(NAN)); }

template <class I>
__device__ __forceinline__ bool in_range(I n, int64_t num_embeddings) {
  return n >= 0 && int64_t(n) < num_embeddings;
}

// ---------------------------------------------------------------------------------------------------------------
// forward v1: one thread per output element
// ---------------------------------------------------------------------------------------------------------------
template <class T, class I>
__global__ void embedding_fwd_v1(const I* __restrict__ idx, const T* __restrict__ weight, T* __restrict__ out,
                                 int64_t total, int64_t dim, int64_t num_embeddings) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / dim, c = e - t * dim;
    const I n = idx[t];  // every thread of a row reads the same index: L1 serves all but the first
    out[e] = in_range(n, num_embeddings) ? weight[int64_t(n) * dim + c] : bad_row_value<T>();
  }
}

template <class T, class I>
cudaError_t launch_fwd_v1(const I* idx, const T* weight, T* out, int64_t tokens, int64_t dim, int64_t num_embeddings,
                          cudaStream_t stream) {
  const int64_t total = tokens * dim;
  if (total == 0) return cudaSuccess;
  embedding_fwd_v1<T, I><<<lab::grid_stride_blocks(total, kBlock), kBlock, 0, stream>>>(idx, weight, out, total, dim,
                                                                                      num_embeddings);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------------
// backward helpers: zero the accumulator, convert an fp32 accumulator to bf16
// ---------------------------------------------------------------------------------------------------------------
template <class T>
__global__ void convert_rows(const float* __restrict__ acc, T* __restrict__ out, int64_t total) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = from_acc<T>(acc[e]);
}

template <class T>
cudaError_t launch_convert(const float* acc, T* out, int64_t total, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  convert_rows<T><<<lab::grid_stride_blocks(total, kBlock), kBlock, 0, stream>>>(acc, out, total);
  return cudaGetLastError();
}

}  // namespace embedding

// The export list of every (element, index) type pair: X(launcher template, name prefix) expands to 6 entries.
#define EMBEDDING_EXPORT_TI(fn, prefix)                                                      \
  LAB_EXPORT(prefix "_f32_i64", fn<float, int64_t>), LAB_EXPORT(prefix "_f32_i32", fn<float, int32_t>),     \
  LAB_EXPORT(prefix "_bf16_i64", fn<__nv_bfloat16, int64_t>),                               \
  LAB_EXPORT(prefix "_bf16_i32", fn<__nv_bfloat16, int32_t>),                               \
  LAB_EXPORT(prefix "_f64_i64", fn<double, int64_t>), LAB_EXPORT(prefix "_f64_i32", fn<double, int32_t>)
