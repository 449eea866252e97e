// rope/v2.cu — v2 and v3 (the ladder and the napkin math: rope.cuh). v2: 16-byte vectors, several heads per thread,
// one launch per tensor; v3: the same kernel, q and k in one grid. Built once per (tensor dtype, table dtype) pair
// and pairing (half-split or interleaved), so one build instantiates rope_v2 for one of the 14 combinations: 4
// kernels (kRows 1, 2, 4, 8) instead of 56, which keeps an edit of this file near the cost of one small nvcc run.
// lab:variants types=f32_f32,f16_f32,f16_f16,bf16_f32,bf16_bf16,f64_f32,f64_f64 pairs=half,interleaved
#include "rope.cuh"

namespace rope {

// ---------------------------------------------------------------------------------------------------------------
// v2 / v3: 16-byte vectors, kRows heads per thread
// ---------------------------------------------------------------------------------------------------------------
// N consecutive table entries starting at p, as Acc values, in the widest loads their alignment allows (the launcher
// checks the table base is 16-byte aligned and every offset used here is a multiple of N).
template <class TC, int N, class A>
__device__ __forceinline__ void load_table(const TC* __restrict__ p, A* out) {
  constexpr int kBytes = N * int(sizeof(TC));
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int w = 0; w < kBytes / 16; ++w) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + w);
      const TC* e = reinterpret_cast<const TC*>(&u);
#pragma unroll
      for (int k = 0; k < 16 / int(sizeof(TC)); ++k) out[w * (16 / sizeof(TC)) + k] = A(to_acc(e[k]));
    }
  } else if constexpr (kBytes == 8) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    const TC* e = reinterpret_cast<const TC*>(&u);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = A(to_acc(e[k]));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = A(to_acc(p[k]));
  }
}

// Rotate the V pairs a thread owns: half-split pairs (a[e], b[e]) at angles e = 0..V-1; interleaved pairs
// (a[2e], a[2e+1]) at angles e < V/2 and (b[2e], b[2e+1]) at angles V/2 + e.
template <class T, bool kInterleaved, int V, class A>
__device__ __forceinline__ void rotate(uint4& ua, uint4& ub, const A* c, const A* s) {
  T* a = reinterpret_cast<T*>(&ua);
  T* b = reinterpret_cast<T*>(&ub);
  if constexpr (kInterleaved) {
#pragma unroll
    for (int e = 0; e < V / 2; ++e) {
      const A a0 = to_acc(a[2 * e]), a1 = to_acc(a[2 * e + 1]);
      a[2 * e] = from_acc<T>(a0 * c[e] - a1 * s[e]);
      a[2 * e + 1] = from_acc<T>(a1 * c[e] + a0 * s[e]);
      const A b0 = to_acc(b[2 * e]), b1 = to_acc(b[2 * e + 1]);
      b[2 * e] = from_acc<T>(b0 * c[V / 2 + e] - b1 * s[V / 2 + e]);
      b[2 * e + 1] = from_acc<T>(b1 * c[V / 2 + e] + b0 * s[V / 2 + e]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A xa = to_acc(a[e]), xb = to_acc(b[e]);
      a[e] = from_acc<T>(xa * c[e] - xb * s[e]);
      b[e] = from_acc<T>(xb * c[e] + xa * s[e]);
    }
  }
}

// Thread t -> (lane j, chunk of kRows heads, batch b, position s), ordered so that consecutive threads walk memory
// in order: lanes fastest, then for "bshd" the chunks of one position (its heads are adjacent rows), for "bhsd" the
// positions of one chunk (a head's positions are adjacent rows). A warp's load instruction then covers whole
// 128-byte half rows of 32/lanes adjacent rows. (Walking bhsd position-major instead — 32 heads, 512 KB apart, in
// one block — was slower than memory order at 4 heads per thread, bf16 (8, 32, 2048, 128), on the H100; notebook 07.)
// 32-bit index math (the launcher checks the thread count fits); chunks never straddle the two tensors.
template <class T, class TC, bool kInterleaved, int kRows>
__global__ void __launch_bounds__(kBlock) rope_v2(const Problem<T, TC> p) {
  using A = typename Acc<T>::type;
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte vector = pairs per thread
  const unsigned half = unsigned(p.head_dim) / 2, lanes = half / V;
  const unsigned c0 = unsigned((p.heads0 + kRows - 1) / kRows);
  const unsigned chunks = c0 + unsigned((p.heads1 + kRows - 1) / kRows);
  const unsigned S = unsigned(p.seq);
  const unsigned t = blockIdx.x * kBlock + threadIdx.x;
  const unsigned j = t % lanes, u = t / lanes;
  unsigned b, s, chunk;
  if (p.bshd) {  // u = (b*S + s)*chunks + chunk
    const unsigned bs = u / chunks;
    chunk = u - bs * chunks, b = bs / S, s = bs - b * S;
  } else {       // u = (b*chunks + chunk)*S + s
    const unsigned bc = u / S;
    s = u - bc * S, b = bc / chunks, chunk = bc - b * chunks;
  }
  if (b >= unsigned(p.batch)) return;
  const bool second = chunk >= c0;
  const T* x = second ? p.x1 : p.x0;
  T* y = second ? p.y1 : p.y0;
  const unsigned H = unsigned(second ? p.heads1 : p.heads0);
  const unsigned h0 = (second ? chunk - c0 : chunk) * kRows;
  const unsigned bs = b * S + s;
  const int64_t D = p.head_dim;
  // element offset of head h0's row, and the distance between consecutive heads' rows
  const int64_t row0 = p.bshd ? (int64_t(bs) * H + h0) * D : ((int64_t(b) * H + h0) * S + s) * D;
  const int64_t hstride = p.bshd ? D : int64_t(S) * D;
  const int64_t xa = row0 + int64_t(j) * V;  // this lane's first-half vector; its second-half partner is + half

  // cos/sin of this lane's V pairs at position offset + s: loaded once, used for kRows heads
  const int64_t trow = (p.offset + s) * int64_t(half);
  A c[V], sn[V];
  if constexpr (kInterleaved) {  // pairs j*V/2 .. (first vector) and half/2 + j*V/2 .. (second vector)
    load_table<TC, V / 2>(p.cos + trow + j * (V / 2), c);
    load_table<TC, V / 2>(p.cos + trow + half / 2 + j * (V / 2), c + V / 2);
    load_table<TC, V / 2>(p.sin + trow + j * (V / 2), sn);
    load_table<TC, V / 2>(p.sin + trow + half / 2 + j * (V / 2), sn + V / 2);
  } else {
    load_table<TC, V>(p.cos + trow + j * V, c);
    load_table<TC, V>(p.sin + trow + j * V, sn);
  }
#pragma unroll
  for (int e = 0; e < V; ++e) sn[e] *= A(p.sign);

  // all 2*kRows loads before the first use: 32*kRows bytes in flight per thread
  uint4 va[kRows], vb[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (h0 + r < H) {
      va[r] = *reinterpret_cast<const uint4*>(x + xa + r * hstride);
      vb[r] = *reinterpret_cast<const uint4*>(x + xa + r * hstride + half);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (h0 + r < H) {
      rotate<T, kInterleaved, V>(va[r], vb[r], c, sn);
      *reinterpret_cast<uint4*>(y + xa + r * hstride) = va[r];
      *reinterpret_cast<uint4*>(y + xa + r * hstride + half) = vb[r];
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------------------------------------------
inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// Heads per thread: 2 (the table is read once per 2 rows, 64 B of loads in flight per thread) unless that leaves
// too few threads to fill the GPU (decoding: batch * heads rows of one position), then 1. More heads per thread buy
// nothing (measured: notebook 07; the finding: rope.cuh) and 4 or 8 cost registers and occupancy.
inline int auto_rows(int64_t rows, int64_t lanes) {
  const int64_t fill = int64_t(lab::sm_count()) * 1024;  // half the resident threads of every SM
  return rows / 2 * lanes >= fill ? 2 : 1;
}

template <class T, class TC, bool kInterleaved>
cudaError_t launch_v2_rows(const Problem<T, TC>& p, int rows, unsigned blocks, cudaStream_t stream) {
  switch (rows) {
    case 1: rope_v2<T, TC, kInterleaved, 1><<<blocks, kBlock, 0, stream>>>(p); break;
    case 2: rope_v2<T, TC, kInterleaved, 2><<<blocks, kBlock, 0, stream>>>(p); break;
    case 4: rope_v2<T, TC, kInterleaved, 4><<<blocks, kBlock, 0, stream>>>(p); break;
    case 8: rope_v2<T, TC, kInterleaved, 8><<<blocks, kBlock, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// v2 needs whole 16-byte vectors in each half row and 16-byte aligned pointers; anything else (head_dim 6, a view
// that starts mid-vector) takes v1's path, which handles every even head_dim.
template <class T, class TC>
bool v2_fits(const Problem<T, TC>& p) {
  constexpr int V = 16 / sizeof(T);
  if ((p.head_dim / 2) % V != 0) return false;
  if (!aligned16(p.x0) || !aligned16(p.y0) || !aligned16(p.cos) || !aligned16(p.sin)) return false;
  if (p.heads1 && (!aligned16(p.x1) || !aligned16(p.y1))) return false;
  return true;
}

template <class T, class TC, bool kInterleaved>
cudaError_t launch_v2(const Problem<T, TC>& p, int rows, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const int64_t lanes = p.head_dim / 2 / V;
  const int64_t nrows = p.batch * p.seq * (p.heads0 + p.heads1);
  if (nrows == 0) return cudaSuccess;
  if (!v2_fits(p)) return launch_v1(p, stream);
  if (rows == 0) rows = auto_rows(nrows, lanes);
  const int64_t chunks = lab::ceil_div(p.heads0, rows) + lab::ceil_div(p.heads1, rows);
  const int64_t threads = p.batch * p.seq * chunks * lanes;
  if (threads > int64_t(UINT32_MAX) - kBlock) return launch_v1(p, stream);  // past the 32-bit thread index
  const unsigned blocks = unsigned(lab::ceil_div(threads, kBlock));
  return launch_v2_rows<T, TC, kInterleaved>(p, rows, blocks, stream);  // p.interleaved == kInterleaved (below)
}

// The launchers exported (signature: rope.cuh). v3 hands v2's kernel both tensors: one grid covers the rows of q and
// then of k (one launch and one tail instead of two). A build serves one pairing; the binding picks its variant.
template <int kVersion, class T, class TC, bool kInterleaved>
cudaError_t launch(const void* q, void* q_out, int64_t q_heads, const void* k, void* k_out, int64_t k_heads,
                   const void* cos, const void* sin, int64_t batch, int64_t seq, int64_t head_dim, int64_t offset,
                   bool bshd, bool interleaved, bool inverse, int rows, cudaStream_t stream) {
  if (interleaved != kInterleaved) return cudaErrorInvalidValue;  // the other pairing's variant
  const Problem<T, TC> p = problem<T, TC>(q, q_out, q_heads, k, k_out, k_heads, cos, sin, batch, seq, head_dim,
                                          offset, bshd, interleaved, inverse);
  if (kVersion == 3) return launch_v2<T, TC, kInterleaved>(p, rows, stream);  // both tensors, one grid
  // v2: one launch per tensor
  return per_tensor(p, [&](const Problem<T, TC>& one) { return launch_v2<T, TC, kInterleaved>(one, rows, stream); });
}

}  // namespace rope

// This build's (tensor, table) dtype pair and pairing: registered as "rope_v2@<T>_<TC>,<pairs>", "rope_v3@...",
// e.g. "rope_v2@bf16_f32,half".
#if defined(LAB_VARIANT_types_f32_f32)
using T_ = float;
using TC_ = float;
#elif defined(LAB_VARIANT_types_f16_f32)
using T_ = __half;
using TC_ = float;
#elif defined(LAB_VARIANT_types_f16_f16)
using T_ = __half;
using TC_ = __half;
#elif defined(LAB_VARIANT_types_bf16_f32)
using T_ = __nv_bfloat16;
using TC_ = float;
#elif defined(LAB_VARIANT_types_bf16_bf16)
using T_ = __nv_bfloat16;
using TC_ = __nv_bfloat16;
#elif defined(LAB_VARIANT_types_f64_f32)
using T_ = double;
using TC_ = float;
#elif defined(LAB_VARIANT_types_f64_f64)
using T_ = double;
using TC_ = double;
#else
#error "rope/v2.cu is built once per variant (// lab:variants types=...): define LAB_VARIANT_types_<T>_<TC>"
#endif
#if defined(LAB_VARIANT_pairs_half)
constexpr bool kInterleaved_ = false;
#elif defined(LAB_VARIANT_pairs_interleaved)
constexpr bool kInterleaved_ = true;
#else
#error "rope/v2.cu is built once per variant (// lab:variants ... pairs=...): define LAB_VARIANT_pairs_<pairing>"
#endif

LAB_EXPORTS(LAB_EXPORT("rope_v2", rope::launch<2, T_, TC_, kInterleaved_>),
            LAB_EXPORT("rope_v3", rope::launch<3, T_, TC_, kInterleaved_>))
