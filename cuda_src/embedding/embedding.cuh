// embedding — nn.Embedding forward (a gather of weight rows) and backward (the dense weight gradient, a scatter-add).
// This header holds what the units share; each version is its own unit (v1.cu .. v4.cu; v4's sort in sort.cu), so an
// edit of one rebuilds that one; rows.cuh holds the row-centric backward kernels v3 and v4 share.
//
// What it computes. idx: integer indices of any shape, T = idx.numel() tokens, int64 or int32; weight: (V, D) =
// (num_embeddings, dim), fp32, bf16 or fp64.
//   forward:   out[t, :] = weight[idx[t], :]                                  out: idx.shape + (D,)
//   backward:  grad_weight[n, :] = sum over t with idx[t] == n of grad_out[t, :]; the row of padding_idx is 0
// As nn.Embedding: the forward still gathers the padding row (only its gradient is zero). The backward adds in fp32
// (fp64 for double) and rounds each grad_weight element once (bf16: through an fp32 buffer).
// Reference: F.embedding, and index_add_ of grad_out in float64 (lab/kernels/embedding.py).
//
// Bad indices. The binding checks every index is in [0, V) (a ValueError naming the index; on CUDA a sync, skipped
// under graph capture). The kernels still never read outside weight: a forward row with a bad index is written as
// NaN, a backward row with a bad index is skipped, so a caller who turned the check off gets NaN, never a fault.
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
//   forward v3:  v2 with the range check fused into the gather (the kernel records the first bad position in one
//                word: the binding's check is an 8-byte read after the kernel, not a reduction and a read before it).
//   backward v3: row-centric: CSR offsets of the sorted indices; one block per (row, column tile) writes each
//                grad_weight element once (no memset; rows no token hits get their 0 there); runs longer than 64
//                tokens are cut at fixed boundaries of the sorted order, each piece summed by its own block, the
//                pieces added in order by the row's block. Deterministic, and no warp sums a hot row alone.
//   forward v4:  v3 with evict-first (streaming) stores of the output.
//   backward v4: v3 with its own radix sort (cub) of 32-bit keys on the log2(V) bits they use and 32-bit positions,
//                instead of at::sort's 64-bit keys on all 64 bits.
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
//     v1 and v2 zero grad_weight first: another 206 MB of writes (61 us) on top. v1's atomics on fp32 run in L2;
//     hot rows (Zipf) serialize on the same addresses. v2 pays a sort of 65536 keys (small) and, for a hot row, one
//     warp summing thousands of rows alone: the long pole under Zipf indices. v3 removes both: 474 MB, each byte once.
//
// Not done (ideas for later versions): the eager check costs a synchronisation (a graph has none); under Zipf indices
// the row kernel's blocks are uneven (a hot row adds ~140 pieces, most rows none): a block per piece range, not per
// row, would even them out.
//
// Units (each its own nvcc build; lab/build.py):
//   embedding.cuh  element types, the index guard, the v1 forward kernel (v2 falls back to it) and the zeroing and
//                  conversion helpers of the backward.
//   v1.cu          forward v1, backward v1 (atomics).
//   v2.cu          forward v2 (warp per row, 16-byte vectors), backward v2 (sorted, deterministic).
//   rows.cuh       the row-centric backward kernels (CSR offsets, long-run pieces, rows) of v3 and v4.
//   v3.cu          forward v3 (fused check), backward v3 (rows.cuh on at::sort's output).
//   v4.cu          forward v4 (streaming stores), backward v4 (rows.cuh on sort.cu's 32-bit keys and positions).
//   sort.cu        backward v4's sort: cub's radix sort of 32-bit keys on the bits V needs (a unit of its own: cub is
//                  most of a unit's compile time, and an edit of v4's kernels need not recompile it).
//
// Launchers (exported to cpp_src/embedding/embedding.cpp; names "embedding_fwd_v{1,2,3}_<T>_<I>", "embedding_bwd_v1_<T>_<I>"
// with T in f32, bf16, f64 and I in i32, i64; "embedding_bwd_v{2,3}_<T>" (int64 sorted keys); v3's signatures are in
// v3.cu: the forward takes a bad-position word, the backward a workspace sized by "embedding_bwd_v3_workspace_<T>"):
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

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// One warp copies one row of `dim` elements. kVec: as 16-byte vectors (uint4: 4 fp32, 8 bf16, 2 fp64; the caller
// checked that dim * sizeof(T) is a multiple of 16 and both rows are 16-byte aligned), kUnroll vectors per lane loaded
// before the first store (at D = 1024 fp32 a row is 256 vectors, 8 per lane: a warp has the whole 4 KB row in flight
// in two steps). kStream (forward v4): evict-first stores (st.global.cs).
template <class T, bool kVec, bool kStream>
__device__ __forceinline__ void copy_row(const T* __restrict__ src, T* __restrict__ dst, int64_t dim, int lane) {
  constexpr int kUnroll = 4;
  auto store = [](auto* p, auto v) {
    if constexpr (kStream) __stcs(p, v); else *p = v;
  };
  if constexpr (kVec) {
    const int64_t nvec = dim * int64_t(sizeof(T)) / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    int64_t v = lane;
    for (; v + 32 * (kUnroll - 1) < nvec; v += 32 * kUnroll) {
      uint4 r[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) r[k] = __ldg(s + v + 32 * k);
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) store(d + v + 32 * k, r[k]);
    }
    for (; v < nvec; v += 32) store(d + v, __ldg(s + v));
  } else {
    for (int64_t c = lane; c < dim; c += 32) store(dst + c, src[c]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// forward v3 / v4: v2's warp-per-row copy with the range check fused in. bad_pos: one word the caller set to ~0 (all
// ones) on this stream; after the kernel it holds the smallest token position with a bad index, or stays ~0.
// kStream (v4): the output is stored with evict-first hints (st.global.cs): nothing reads it back in this kernel, so
// its 268 MB need not push table rows (re-read under repeated indices) out of L2.
// ---------------------------------------------------------------------------------------------------------------
template <class T, class I, bool kVec, bool kStream>
__global__ void __launch_bounds__(kBlock) embedding_fwd_checked(const I* __restrict__ idx, const T* __restrict__ weight,
                                                           T* __restrict__ out, int64_t tokens, int64_t dim,
                                                           int64_t num_embeddings,
                                                           unsigned long long* __restrict__ bad_pos) {
  constexpr int kWarps = kBlock / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); t < tokens; t += int64_t(gridDim.x) * kWarps) {
    const I n = idx[t];
    T* dst = out + t * dim;
    if (!in_range(n, num_embeddings)) {
      if (lane == 0) atomicMin(bad_pos, static_cast<unsigned long long>(t));  // the binding names the first one
      for (int64_t c = lane; c < dim; c += 32) dst[c] = bad_row_value<T>();
      continue;
    }
    copy_row<T, kVec, kStream>(weight + int64_t(n) * dim, dst, dim, lane);
  }
}

template <class T, class I, bool kStream>
cudaError_t launch_fwd_checked(const I* idx, const T* weight, T* out, int64_t tokens, int64_t dim,
                               int64_t num_embeddings, unsigned long long* bad_pos, cudaStream_t stream) {
  if (tokens == 0 || dim == 0) return cudaSuccess;
  const bool vec = (dim * int64_t(sizeof(T))) % 16 == 0 && aligned16(weight) && aligned16(out);
  const unsigned blocks = lab::grid_stride_blocks(tokens, kBlock / 32, 8);
  if (vec)
    embedding_fwd_checked<T, I, true, kStream><<<blocks, kBlock, 0, stream>>>(idx, weight, out, tokens, dim,
                                                                               num_embeddings, bad_pos);
  else
    embedding_fwd_checked<T, I, false, kStream><<<blocks, kBlock, 0, stream>>>(idx, weight, out, tokens, dim,
                                                                                num_embeddings, bad_pos);
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
