// lab_gemm.cuh — what the tiled matrix-product families share (linear, sparse24): the PTX wrappers for shared-memory
// addresses, cp.async (sm_80+) and ldmatrix, and the grouped order in which a 1-D grid visits output tiles. Device
// code only, no torch headers.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LAB_SM80 1
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LAB_SM90A 1
#endif

namespace lab {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; bytes < 16 zero-fills the rest (0: all zeros, nothing read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
#ifdef LAB_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}
// 4-byte async copy (cp.async.ca: the only variant for sizes 4 and 8); bytes = 0 writes a zero.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int bytes) {
#ifdef LAB_SM80
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef LAB_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef LAB_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four 8x8 matrices of 16-bit elements (8 rows of 16 B each); lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#ifdef LAB_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// cvt.rna: float32 -> TF32 (round to nearest, ties away), returned as the 32-bit pattern an mma operand takes. The
// mma itself would truncate the low 13 bits: a bias of half an ulp of TF32 on every product.
__device__ __forceinline__ uint32_t round_tf32(float f) {
  uint32_t r = __float_as_uint(f);
#ifdef LAB_SM80
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
#endif
  return r;
}

// D (16x8, fp32) += A (16 x k) · B (k x 8), A row-major and B column-major fragments (g = lane/4, t = lane%4):
// c0,c1 = D[g][2t..2t+1], c2,c3 = D[g+8][2t..2t+1]. k = 16 for the 16-bit types, 8 for TF32.
#define LAB_MMA_16x8(NAME, SHAPE_TYPES)                                                                           \
  __device__ __forceinline__ void NAME(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {        \
    asm volatile("mma.sync.aligned." SHAPE_TYPES " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "               \
                 "{%0, %1, %2, %3};\n"                                                                           \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                 \
  }
#ifdef LAB_SM80
LAB_MMA_16x8(mma_tf32_16x8x8, "m16n8k8.row.col.f32.tf32.tf32.f32")
LAB_MMA_16x8(mma_f16_16x8x16, "m16n8k16.row.col.f32.f16.f16.f32")
LAB_MMA_16x8(mma_bf16_16x8x16, "m16n8k16.row.col.f32.bf16.bf16.f32")
#else
__device__ __forceinline__ void mma_tf32_16x8x8(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {}
__device__ __forceinline__ void mma_f16_16x8x16(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {}
__device__ __forceinline__ void mma_bf16_16x8x16(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {}
#endif
#undef LAB_MMA_16x8

// Tile t of a 1-D grid -> (tile row, tile column), grouped 8 tile-rows at a time: the blocks resident together
// cover 8 row-tiles of one operand and a band of the other, so both stay in L2 (Triton's "grouped ordering").
struct Tile { int m, n; };
__device__ __forceinline__ Tile tile_of(int t, int tiles_m, int tiles_n) {
  constexpr int G = 8;
  const int per_group = G * tiles_n;
  const int group = t / per_group;
  const int first = group * G;
  const int rows = min(tiles_m - first, G);
  const int r = t - group * per_group;
  return {first + r % rows, r / rows};
}

}  // namespace lab
