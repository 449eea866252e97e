// basics — the first CUDA lessons, each as a ladder of versions. This header holds what the units share; each op is
// its own unit (square.cu, vector_add.cu, stencil_1d.cu, matmul.cu), so an edit of one rebuilds one.
//
//   square      y = x * x                       reference: torch.square
//   vector_add  z = a + b                       reference: torch.add
//   stencil_1d  y[i] = sum_{|j|<=3} x[i+j]      reference: F.conv1d with a ones(7) filter, zero padding
//   matmul      C = A @ B   (M,K) @ (K,N)       reference: torch.mm
//
// Versions (each adds one idea to the one before):
//   square/vector_add v1: one thread per element — the classic first kernel.
//   square/vector_add v2: 16-byte loads (float4/double2) in a grid-stride loop — fewer, wider memory instructions
//                         and no block-launch tail; the scalar v1 path takes misaligned pointers.
//   vector_add v3: the grid fills every thread slot of every SM (v2 caps it at half) and each thread has two 16-byte
//                  loads per operand in flight — the target set by Triton's faster kernel (notebook 01).
//   vector_add v4: no grid-stride loop: one 128-thread block per contiguous 1024-float tile, two 16-byte loads per
//                  operand per thread (Triton's and torch.add's shape; v3 showed resident threads were not the bound).
//   stencil_1d v1: each thread reads its 7 inputs from global memory (L1/L2 absorb the 7x re-read).
//   stencil_1d v2: the block stages its input tile plus a 3-wide halo on each side in shared memory once;
//                  the 7 reads per output then hit shared memory (__syncthreads between load and use).
//   matmul v1: one thread per C element, K-loop from global memory: 2 loads per FMA, memory-bound.
//   matmul v2: 32x32 shared-memory tiles: each loaded element is reused 32 times, so 2/32 loads per FMA.
//
// Napkin math (H100, ~3 TB/s measured copy bandwidth): square on 2^26 floats moves 512 MiB (read + write):
// 0.18 ms at copy speed. vector_add moves 768 MiB: 0.27 ms. These two are pure bandwidth; the goal is >= 90% of copy.
//
// Launchers (exported to cpp_src/basics/basics.cpp, one per dtype: "square_f32", "square_f64", ...):
//   cudaError_t (int version, const T* in..., T* out, sizes..., cudaStream_t)
#pragma once

#include "lab_cuda.cuh"
#include "lab_unit.h"

namespace basics {

constexpr int kBlock = 256;
constexpr int kRadius = 3;
constexpr int kTile = 32;

template <class T> struct Vec;                      // the 16-byte vector of T
template <> struct Vec<float> { using type = float4; static constexpr int n = 4; };
template <> struct Vec<double> { using type = double2; static constexpr int n = 2; };

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace basics
