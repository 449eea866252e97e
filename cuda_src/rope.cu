// rope.cu — rotary position embedding (RoPE) of queries and keys, forward and backward.
//
// What it computes. A tensor of rows of D = head_dim features, laid out (batch, heads, seq, D) ("bhsd") or
// (batch, seq, heads, D) ("bshd"); the row at sequence index s sits at position p = offset + s (offset > 0 when
// decoding with a cache). Its features are rotated in D/2 pairs; pair i turns by the angle p * theta_i, whose cosine
// and sine the caller tabulates as cos[p, i], sin[p, i] (two (max_pos, D/2) tables, fp32 or the tensor's dtype):
//   half-split pairs  (GPT-NeoX, HF Llama):  (x_a, x_b) = (x[i], x[i + D/2])
//   interleaved pairs (GPT-J, Meta Llama):   (x_a, x_b) = (x[2i], x[2i + 1])
//   y_a = x_a cos - x_b sin,   y_b = x_b cos + x_a sin                                    (forward)
//   the Jacobian is the rotation itself, so dL/dx is dL/dy rotated by -angle: the same kernel with -sin (backward).
// Reference: the rotate_half form, y = x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) =
// cat(-x2, x1) (lab/kernels/rope.py: rope_ref), run in float64. Arithmetic here is fp32 (fp64 for double tensors);
// each output is rounded once.
//
// Versions (each adds one idea to the one before):
//   v1: one thread per pair: 2 scalar loads, cos and sin from the tables, 2 scalar stores; one launch per tensor.
//   v2: 16-byte vectors and several heads per thread: a thread owns 16 bytes of the first half of a row and the
//       matching 16 bytes of the second half (V = 16 / sizeof(T) pairs), loads its V cos/sin once and applies them
//       to kRows heads at the same (batch, seq) position, all loads in flight before the first store; consecutive
//       threads walk memory in order.
//   v3: q and k in one launch: one grid covers the rows of both (one launch and one tail instead of two).
//
// Napkin math (H100, bf16 (8, 32, 2048, 128), one tensor): 2^26 elements, 134 MB read + 134 MB written; the tables
// are 2048 x 64 x 4 B x 2 = 1 MB and stay in L2. At the measured copy bandwidth (~3.0 TB/s, read + write, 1 GiB)
// that is 90 us: the floor. Arithmetic: 3 FLOP per element, 0.2 GFLOP, ~3 us of FP32 rate: irrelevant. So the game
// is bytes in flight per SM and memory instructions per byte:
//   v1 issues 6 memory instructions per 4 bytes of tensor read (2-byte loads, 4-byte table loads, 2-byte stores);
//   v2 issues 4 per 32 bytes (two 16-byte loads, two 16-byte stores), plus the table once per kRows heads.
//
// Measured (H100 80GB HBM3, torch 2.11, CUDA events, L2 flushed before every run; the helper's runs of 2026-11-22):
//   copy_ of the same 134 MB           93.8 us  2861 GB/s   <- what a plain copy of these bytes reaches
//   v1                                197.4 us  1360 GB/s   45% of the copy ceiling (2-byte accesses)
//   v2 (2 heads per thread)            95.4 us  2815 GB/s   94% of the ceiling, 98% of copy_'s speed
//   v2 backward                        95.4 us              the same kernel with -sin
//   q and k, v2 (two launches)        188.6 us
//   q and k, v3 (one launch)          184.9 us  2903 GB/s   1.94x one tensor
//   eager rotate_half                 1392 us              ~6 full passes, several in fp32
//   torch.compile                      96.4 us (forward, an earlier run), 182.5 us (q and k), 264 us (backward)
// Heads per thread 1, 2, 4, 8: 95.5, 95.4, 96.4, 98.0 us. Sharing the cos/sin row across heads buys nothing here
// (L1 and L2 presumably serve the repeated table reads already), and 4 or 8 heads cost registers (78, 128) and so
// occupancy. The 1.7% left to copy_'s time would be the table reads and the index arithmetic (not measured apart).
// For q and k, Inductor's fused kernel is 1.6% faster than v3 at seq 2048 (182.5 vs 185.4 us, same run) and 0.8%
// slower at seq 4096; bf16 tables were slower than fp32 ones (101.5 vs 95.5 us). Neither was investigated further
// (no device time left).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "lab_cuda.cuh"

namespace rope {

constexpr int kBlock = 256;

// ---- element types: fp32 arithmetic for fp32/fp16/bf16 tensors, fp64 for double ------------------------------
template <class T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ double to_acc(double v) { return v; }

template <class T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }

// One tensor's problem plus, for the one-launch version, a second tensor (k) of the same batch, seq and head_dim.
// heads1 == 0: no second tensor.
template <class T, class TC>
struct Problem {
  const T* x0;
  T* y0;
  const T* x1;
  T* y1;
  int64_t heads0, heads1;
  const TC* cos;       // (max_pos, D/2)
  const TC* sin;
  int64_t batch, seq, offset;
  int head_dim;
  bool bshd, interleaved;
  int sign;            // +1 forward, -1 backward
};

// ---------------------------------------------------------------------------------------------------------------
// v1: one thread per pair
// ---------------------------------------------------------------------------------------------------------------
template <class T, class TC>
__global__ void rope_v1(const Problem<T, TC> p) {
  using A = typename Acc<T>::type;
  const int64_t half = p.head_dim / 2;
  const int64_t pairs0 = p.batch * p.seq * p.heads0 * half;
  int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const T* x = p.x0;
  T* y = p.y0;
  int64_t heads = p.heads0;
  if (t >= pairs0) {  // the second tensor's pairs follow the first's in the flat index
    t -= pairs0;
    if (t >= p.batch * p.seq * p.heads1 * half) return;
    x = p.x1, y = p.y1, heads = p.heads1;
  }
  const int64_t row = t / half, i = t - row * half;  // rows are contiguous: row r starts at r * D
  const int64_t s = p.bshd ? (row / heads) % p.seq : row % p.seq;
  const int64_t pos = p.offset + s;
  const A c = to_acc(p.cos[pos * half + i]);
  const A sn = A(p.sign) * to_acc(p.sin[pos * half + i]);
  const int64_t ia = row * p.head_dim + (p.interleaved ? 2 * i : i);
  const int64_t ib = ia + (p.interleaved ? 1 : half);
  const A a = to_acc(x[ia]), b = to_acc(x[ib]);  // both read before either is written: in place is safe
  y[ia] = from_acc<T>(a * c - b * sn);
  y[ib] = from_acc<T>(b * c + a * sn);
}

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
// one block — took 99.1 us against 96.4 us in memory order, 4 heads per thread, bf16 (8, 32, 2048, 128), H100.)
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

template <class T, class TC>
cudaError_t launch_v1(const Problem<T, TC>& p, cudaStream_t stream) {
  const int64_t pairs = p.batch * p.seq * (p.heads0 + p.heads1) * (p.head_dim / 2);
  if (pairs == 0) return cudaSuccess;
  rope_v1<T, TC><<<unsigned(lab::ceil_div(pairs, kBlock)), kBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

// Heads per thread: 2 (the table is read once per 2 rows, 64 B of loads in flight per thread) unless that leaves
// too few threads to fill the GPU (decoding: batch * heads rows of one position), then 1. More heads per thread buy
// nothing (measured: see the header) and 4 or 8 cost registers and occupancy.
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

template <class T, class TC>
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
  return p.interleaved ? launch_v2_rows<T, TC, true>(p, rows, blocks, stream)
                       : launch_v2_rows<T, TC, false>(p, rows, blocks, stream);
}

template <class T, class TC>
cudaError_t launch(int version, Problem<T, TC> p, int rows, cudaStream_t stream) {
  if (version == 3) return launch_v2(p, rows, stream);  // both tensors, one grid
  // v1, v2: one launch per tensor
  Problem<T, TC> second = p;
  p.heads1 = 0;
  cudaError_t err = version == 1 ? launch_v1(p, stream) : launch_v2(p, rows, stream);
  if (err != cudaSuccess || second.heads1 == 0) return err;
  second.x0 = second.x1, second.y0 = second.y1, second.heads0 = second.heads1, second.heads1 = 0;
  return version == 1 ? launch_v1(second, stream) : launch_v2(second, rows, stream);
}

template <class T, class TC>
cudaError_t typed(int version, const void* q, void* q_out, int64_t q_heads, const void* k, void* k_out,
                  int64_t k_heads, const void* cos, const void* sin, int64_t batch, int64_t seq, int64_t head_dim,
                  int64_t offset, bool bshd, bool interleaved, bool inverse, int rows, cudaStream_t stream) {
  Problem<T, TC> p;
  p.x0 = static_cast<const T*>(q), p.y0 = static_cast<T*>(q_out), p.heads0 = q_heads;
  p.x1 = static_cast<const T*>(k), p.y1 = static_cast<T*>(k_out), p.heads1 = k ? k_heads : 0;
  p.cos = static_cast<const TC*>(cos), p.sin = static_cast<const TC*>(sin);
  p.batch = batch, p.seq = seq, p.offset = offset, p.head_dim = int(head_dim);
  p.bshd = bshd, p.interleaved = interleaved, p.sign = inverse ? -1 : 1;
  return launch(version, p, rows, stream);
}

}  // namespace rope

// The launcher cpp_src/rope.cpp calls. dtype codes (shared with rope.cpp): 0 float32, 1 float16, 2 bfloat16,
// 3 float64; the tables are float32 or the tensors' dtype. k may be null (one tensor). rows: heads per thread for
// v2/v3 (1, 2, 4, 8; 0 = choose). Shapes are checked on the C++ side before this is called.
cudaError_t rope_cuda(int version, int dtype, int table_dtype, const void* q, void* q_out, int64_t q_heads,
                      const void* k, void* k_out, int64_t k_heads, const void* cos, const void* sin, int64_t batch,
                      int64_t seq, int64_t head_dim, int64_t offset, bool bshd, bool interleaved, bool inverse,
                      int rows, cudaStream_t stream) {
  if (version < 1 || version > 3) return cudaErrorInvalidValue;
  const bool f32_tables = table_dtype == 0;
  if (!f32_tables && table_dtype != dtype) return cudaErrorInvalidValue;
#define LAB_ROPE_CALL(T, TC)                                                                                \
  rope::typed<T, TC>(version, q, q_out, q_heads, k, k_out, k_heads, cos, sin, batch, seq, head_dim, offset, \
                     bshd, interleaved, inverse, rows, stream)
  switch (dtype) {
    case 0: return LAB_ROPE_CALL(float, float);
    case 1: return f32_tables ? LAB_ROPE_CALL(__half, float) : LAB_ROPE_CALL(__half, __half);
    case 2: return f32_tables ? LAB_ROPE_CALL(__nv_bfloat16, float) : LAB_ROPE_CALL(__nv_bfloat16, __nv_bfloat16);
    case 3: return f32_tables ? LAB_ROPE_CALL(double, float) : LAB_ROPE_CALL(double, double);
    default: return cudaErrorInvalidValue;
  }
#undef LAB_ROPE_CALL
}
