// rope — rotary position embedding (RoPE) of queries and keys, forward and backward. This header holds what the
// units share; each version is its own unit (see "Units" below), so an edit of one rebuilds that one.
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
// are 2048 x 64 x 4 B x 2 = 1 MB and stay in L2. At the datasheet's 3.35 TB/s that is 80 us: the floor (the lab's
// measured copy ceiling, lower, is printed beside every timing). Arithmetic: 3 FLOP per element, 0.2 GFLOP, ~3 us at
// the datasheet's 66.9 TFLOP/s FP32: irrelevant. So the game is bytes in flight per SM and memory instructions per
// byte:
//   v1 issues 6 memory instructions per 4 bytes of tensor read (2-byte loads, 4-byte table loads, 2-byte stores);
//   v2 issues 4 per 32 bytes (two 16-byte loads, two 16-byte stores), plus the table once per kRows heads.
//
// Timings (every version, forward and backward, one tensor and q and k, against copy_ of the same bytes, eager
// rotate_half and torch.compile) and each one's fraction of the copy ceiling: notebook 07. What they show:
//   v1 reaches less than half of the copy ceiling (2-byte accesses).
//   v2 (2 heads per thread) reaches nearly the copy ceiling, close to copy_ of the same bytes; v2 backward (the same
//   kernel with -sin) takes the same time.
//   q and k: v3 (one launch) is a little faster than v2's two launches, and takes nearly twice one tensor's time.
//   eager rotate_half is many times slower (~6 full passes, several in fp32); torch.compile runs level with v2
//   forward and with v3 on q and k, and its backward is slower than v2's.
// Heads per thread 1 and 2 take the same time, 4 and 8 are slower. Sharing the cos/sin row across heads buys nothing
// here (L1 and L2 presumably serve the repeated table reads already), and 4 or 8 heads cost registers (78, 128) and
// so occupancy. What is left to copy_'s time would be the table reads and the index arithmetic (not measured apart).
// For q and k, Inductor's fused kernel is slightly faster than v3 at seq 2048 and slightly slower at seq 4096; bf16
// tables were slower than fp32 ones. Neither was investigated further (no device time left).
//
// Units (each its own nvcc build; lab/build.py):
//   rope.cuh  element types, Problem, the v1 kernel and its launcher (v2 and v3 fall back to v1's path), and the
//             two host helpers every version's launcher uses (problem: plain-C arguments -> Problem; per_tensor).
//   v1.cu     v1: one launch of rope_v1 per tensor.
//   v2.cu     v2 and v3: the vector kernel rope_v2, v2 = one launch per tensor, v3 = q and k in one grid (the same
//             kernel). Built once per (tensor dtype, table dtype) pair and pairing (// lab:variants types=...
//             pairs=half,interleaved): each build instantiates 4 rope_v2 kernels (kRows 1, 2, 4, 8) instead of 56.
//
// Launchers (exported to cpp_src/rope/rope.cpp; v1.cu: "rope_v1_<T>_<TC>" for each (tensor, table) dtype pair, e.g.
// "rope_v1_bf16_f32"; v2.cu: "rope_v2" and "rope_v3", registered per variant as "rope_v2@bf16_f32,half", ...):
//   cudaError_t (const void* q, void* q_out, int64_t q_heads, const void* k, void* k_out, int64_t k_heads,
//                const void* cos, const void* sin, int64_t batch, int64_t seq, int64_t head_dim, int64_t offset,
//                bool bshd, bool interleaved, bool inverse, int rows, cudaStream_t stream)
// k may be null (one tensor). rows: heads per thread for v2/v3 (1, 2, 4, 8; 0 = choose); v1 ignores it. The tables
// are float32 or the tensors' dtype. Shapes, dtypes and devices are checked on the C++ side before a call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "lab_cuda.cuh"
#include "lab_types.cuh"
#include "lab_unit.h"

namespace rope {

constexpr int kBlock = 256;

// ---- element types (lab_types.cuh): fp32 arithmetic for fp32/fp16/bf16 tensors, fp64 for double ------------
using lab::Acc;
using lab::from_acc;
using lab::to_acc;

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
// launcher helpers: v1's launch (also v2's and v3's fallback), and what every version's exported launcher shares
// ---------------------------------------------------------------------------------------------------------------
template <class T, class TC>
cudaError_t launch_v1(const Problem<T, TC>& p, cudaStream_t stream) {
  const int64_t pairs = p.batch * p.seq * (p.heads0 + p.heads1) * (p.head_dim / 2);
  if (pairs == 0) return cudaSuccess;
  rope_v1<T, TC><<<unsigned(lab::ceil_div(pairs, kBlock)), kBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

// v1, v2: one launch per tensor; launch_one(p) launches a problem of one tensor.
template <class T, class TC, class F>
cudaError_t per_tensor(Problem<T, TC> p, F launch_one) {
  Problem<T, TC> second = p;
  p.heads1 = 0;
  cudaError_t err = launch_one(p);
  if (err != cudaSuccess || second.heads1 == 0) return err;
  second.x0 = second.x1, second.y0 = second.y1, second.heads0 = second.heads1, second.heads1 = 0;
  return launch_one(second);
}

// The Problem a launcher's plain-C arguments describe (k null: one tensor).
template <class T, class TC>
Problem<T, TC> problem(const void* q, void* q_out, int64_t q_heads, const void* k, void* k_out, int64_t k_heads,
                       const void* cos, const void* sin, int64_t batch, int64_t seq, int64_t head_dim,
                       int64_t offset, bool bshd, bool interleaved, bool inverse) {
  Problem<T, TC> p;
  p.x0 = static_cast<const T*>(q), p.y0 = static_cast<T*>(q_out), p.heads0 = q_heads;
  p.x1 = static_cast<const T*>(k), p.y1 = static_cast<T*>(k_out), p.heads1 = k ? k_heads : 0;
  p.cos = static_cast<const TC*>(cos), p.sin = static_cast<const TC*>(sin);
  p.batch = batch, p.seq = seq, p.offset = offset, p.head_dim = int(head_dim);
  p.bshd = bshd, p.interleaved = interleaved, p.sign = inverse ? -1 : 1;
  return p;
}

}  // namespace rope
