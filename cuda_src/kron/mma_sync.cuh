// kron/mma_sync.cuh — the mma.sync operands the tensor-core units share (v3.cu's fused forward, backward_tc.cu's
// per-factor backward): TF32 m16n8k8 on float, bf16 m16n8k16 on __nv_bfloat16, both with fp32 accumulators, and
// their fragment loads from k-major shared tiles. Device code only.
#pragma once

#include "kron.cuh"
#include "lab_gemm.cuh"

#include <cuda_bf16.h>

namespace kron {
namespace tc {

// ---- the mma and its fragments, per element type ------------------------------------------------------------------
// Shared-memory operands are k-major: A(m, k) at s[k·ld + m], B(k, n) at s[k·ld + n]. g = lane/4, t = lane%4.
template <class T> struct Mma;

// fp32 -> TF32, rounded to nearest (ties away). The tensor core would truncate the low 13 bits instead: a bias of
// half a TF32 ulp toward zero in every operand that, over a 128-term sum and two factors, measured 3.5e-3 relative
// error on the H100 (over TF32's 3e-3 tolerance); rounded, the errors cancel.
__device__ __forceinline__ uint32_t tf32(float v) { return lab::round_tf32(v); }

template <> struct Mma<float> {  // m16n8k8 TF32
  static constexpr int KS = 8;   // k per mma
  static constexpr int KC = 16;  // k per pipeline stage (64 bytes of a row)
  // a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4). ROUND: the operand is raw fp32 (x, W), not a state this
  // kernel already rounded to TF32
  template <bool ROUND>
  __device__ __forceinline__ static void load_a(uint32_t (&a)[4], const float* s, int ld, int m0, int k0, int lane) {
    const float* p = s + (k0 + (lane & 3)) * ld + m0 + (lane >> 2);
    const float v[4] = {p[0], p[8], p[4 * ld], p[4 * ld + 8]};
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = ROUND ? tf32(v[i]) : __float_as_uint(v[i]);
  }
  // two n8 tiles at n0 and n0 + 8: b0 (t, g), b1 (t+4, g) of each (W: always rounded)
  __device__ __forceinline__ static void load_b2(uint32_t (&b)[4], const float* s, int ld, int n0, int k0,
                                                 int lane) {
    const float* p = s + (k0 + (lane & 3)) * ld + n0 + (lane >> 2);
    b[0] = tf32(p[0]);
    b[1] = tf32(p[4 * ld]);
    b[2] = tf32(p[8]);
    b[3] = tf32(p[4 * ld + 8]);
  }
  // The same fragments from operands stored with k contiguous ("rows": A(m, k) at s[m·ld + k], B(k, n) at s[n·ld + k]),
  // rounded; ld an odd multiple of 4 words (backward_tc.cu: 20) keeps the 32 lanes on distinct banks
  __device__ __forceinline__ static void load_a_rows(uint32_t (&a)[4], const float* s, int ld, int m0, int k0,
                                                     int lane) {
    const float* p = s + (m0 + (lane >> 2)) * ld + k0 + (lane & 3);
    a[0] = tf32(p[0]);
    a[1] = tf32(p[8 * ld]);
    a[2] = tf32(p[4]);
    a[3] = tf32(p[8 * ld + 4]);
  }
  __device__ __forceinline__ static void load_b2_rows(uint32_t (&b)[4], const float* s, int ld, int n0, int k0,
                                                      int lane) {
    const float* p = s + (n0 + (lane >> 2)) * ld + k0 + (lane & 3);
    b[0] = tf32(p[0]);
    b[1] = tf32(p[4]);
    b[2] = tf32(p[8 * ld]);
    b[3] = tf32(p[8 * ld + 4]);
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// without .trans: lane (g, t) gets row g, columns 2t and 2t + 1 of each 8×8 matrix
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

template <> struct Mma<__nv_bfloat16> {  // m16n8k16 bf16
  static constexpr int KS = 16;
  static constexpr int KC = 32;
  // ldmatrix .trans hands lane (g, t) the elements (rows 2t, 2t+1; column g) of each stored 8×8 matrix: with rows = k
  // that is an mma fragment register. Lane l addresses row l%8 of matrix l/8.
  // A: matrices (k 0-7, m 0-7) -> a0, (k 0-7, m 8-15) -> a1, (k 8-15, m 0-7) -> a2, (k 8-15, m 8-15) -> a3
  template <bool ROUND>
  __device__ __forceinline__ static void load_a(uint32_t (&a)[4], const __nv_bfloat16* s, int ld, int m0, int k0,
                                                int lane) {
    const int j = lane >> 3, r = lane & 7;
    ldsm_x4_trans(a, s + (k0 + (j >> 1) * 8 + r) * ld + m0 + (j & 1) * 8);
  }
  // B: (k 0-7, n 0-7) -> b0 and (k 8-15, n 0-7) -> b1 of tile n0; the same at n0 + 8 -> b2, b3
  __device__ __forceinline__ static void load_b2(uint32_t (&b)[4], const __nv_bfloat16* s, int ld, int n0, int k0,
                                                 int lane) {
    const int j = lane >> 3, r = lane & 7;
    ldsm_x4_trans(b, s + (k0 + (j & 1) * 8 + r) * ld + n0 + (j >> 1) * 8);
  }
  // The same fragments from operands stored with k contiguous (A(m, k) at s[m·ld + k], B(k, n) at s[n·ld + k]), by
  // ldmatrix without .trans: A (m 0-7, k 0-7) -> a0, (m 8-15, k 0-7) -> a1, (m 0-7, k 8-15) -> a2, (m 8-15, k 8-15)
  // -> a3; B (n 0-7, k 0-7) -> b0, (n 0-7, k 8-15) -> b1, the same at n0 + 8 -> b2, b3. A row of ld·2 bytes, an odd
  // multiple of 16 (backward_tc.cu: 80), puts an ldmatrix's 8 row addresses on distinct banks
  __device__ __forceinline__ static void load_a_rows(uint32_t (&a)[4], const __nv_bfloat16* s, int ld, int m0,
                                                     int k0, int lane) {
    const int j = lane >> 3, r = lane & 7;
    ldsm_x4(a, s + (m0 + (j & 1) * 8 + r) * ld + k0 + (j >> 1) * 8);
  }
  __device__ __forceinline__ static void load_b2_rows(uint32_t (&b)[4], const __nv_bfloat16* s, int ld, int n0,
                                                      int k0, int lane) {
    const int j = lane >> 3, r = lane & 7;
    ldsm_x4(b, s + (n0 + (j >> 1) * 8 + r) * ld + k0 + (j & 1) * 8);
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// one fp32 value stored as the element type (bf16: rounded to nearest), and the element type's zero (torch builds
// with __CUDA_NO_BFLOAT16_CONVERSIONS__: no implicit float -> bf16)
__device__ __forceinline__ void store_one(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_one(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
template <class T> __device__ __forceinline__ T elem_zero() { return T(0.f); }
template <> __device__ __forceinline__ __nv_bfloat16 elem_zero<__nv_bfloat16>() {
  return __float2bfloat16_rn(0.f);
}

// two adjacent accumulators (an mma D fragment's c0, c1) stored as one 8-byte (fp32) or 4-byte (bf16) word
__device__ __forceinline__ void store_pair(float* p, float v0, float v1) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
}

// ---- an ns-stage cp.async pipeline, one barrier per chunk ---------------------------------------------------------
// ns - 1 chunks are in flight while one is multiplied (v2's pipeline keeps one in flight, behind two barriers: at
// batch 32 a chunk then cost ~1.3 us, mostly waiting). Chunk c + ns - 1 goes into the stage chunk c - 1 used, right
// after the barrier that every warp passes only when done with chunk c - 1.
__device__ __forceinline__ void cp_async_wait_upto(int n) {  // wait_group takes an immediate
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
  }
}
constexpr int kMaxStages = 8;

template <class Issue, class Compute>
__device__ __forceinline__ void pipeline_ns(int nchunks, int ns, Issue&& issue, Compute&& compute) {
  for (int c = 0; c < ns - 1; ++c) {
    if (c < nchunks) issue(c, c);
    cp_async_commit();
  }
  for (int c = 0; c < nchunks; ++c) {
    cp_async_wait_upto(ns - 2);  // this thread's copies of chunk c have landed
    __syncthreads();             // everyone's have, and every warp is done with chunk c - 1
    const int nx = c + ns - 1;
    if (nx < nchunks) issue(nx % ns, nx);
    cp_async_commit();  // possibly empty: keeps the group count uniform
    compute(c % ns, c);
  }
  __syncthreads();  // the stages are free for the next tile
}

}  // namespace tc
}  // namespace kron
