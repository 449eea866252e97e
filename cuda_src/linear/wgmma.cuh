// linear/wgmma.cuh — the PTX wrappers of v11 (the ladder: linear.cuh): mbarrier, TMA (cp.async.bulk.tensor),
// wgmma, setmaxnreg, the shared-memory matrix descriptor; each compiles to nothing outside sm_90a (LAB_SM90A,
// linear.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched from the driver at run time)

#include "linear.cuh"

namespace linear {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_fence_init() {
#ifdef LAB_SM90A
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef LAB_SM90A
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
#endif
}
// TMA: the box at (c0 along K, c1 along rows) of the tensor map -> shared memory at dst; completes on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#ifdef LAB_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef LAB_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef LAB_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef LAB_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef LAB_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
// Keep the compiler from moving accumulator reads/writes across the asynchronous wgmma window.
template <int N>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor: K-major operand in the 128-B swizzle layout.
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4)  // start address, 16-B units
         | (uint64_t(16 >> 4) << 16)       // leading-dimension byte offset (unused for swizzled K-major)
         | (uint64_t(1024 >> 4) << 32)     // stride byte offset: 8 rows x 128 B
         | (uint64_t(1) << 62);            // 128-B swizzle
}

// The wgmma instructions: D (64 x N, fp32 registers, 128 threads) += A (64 x k, smem) · B (k x N, smem as N x k).
// Register d[4j + {0,1,2,3}] of a thread (warp w, lane l) is D[16w + l/4 + {0,0,8,8}][8j + 2(l%4) + {0,1,0,1}].
//
// The four shapes v11 uses differ only in the instruction's name, the accumulator count R (N/2: 128 or 64 registers
// a thread) and the immediates after the predicate (scale-a, scale-b; bf16 adds the transposes of A and B, which
// tf32 does not take). So one macro, LAB_WGMMA, writes all four asm statements, and the R "+f" operands and their
// %-names are spelled once here instead of once per shape. Operands: %0..%R-1 the accumulators d[0..R-1], %R and
// %R+1 the descriptors of A and B, %R+2 scale_d (0: D = A·B, else D += A·B). The PTX text is the same as when each
// wrapper spelled it out.
#define LAB_WG_ACC8(d, i)                                                                                            \
  "+f"((d)[(i) + 0]), "+f"((d)[(i) + 1]), "+f"((d)[(i) + 2]), "+f"((d)[(i) + 3]),                                    \
  "+f"((d)[(i) + 4]), "+f"((d)[(i) + 5]), "+f"((d)[(i) + 6]), "+f"((d)[(i) + 7])
#define LAB_WG_ACC64(d)                                                                                              \
  LAB_WG_ACC8(d, 0), LAB_WG_ACC8(d, 8), LAB_WG_ACC8(d, 16), LAB_WG_ACC8(d, 24),                                      \
  LAB_WG_ACC8(d, 32), LAB_WG_ACC8(d, 40), LAB_WG_ACC8(d, 48), LAB_WG_ACC8(d, 56)
#define LAB_WG_ACC128(d) LAB_WG_ACC64(d), LAB_WG_ACC64((d) + 64)
#define LAB_WG_REGS64                                                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LAB_WG_REGS128                                                                                               \
  LAB_WG_REGS64                                                                                                      \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                     \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define LAB_WG_AB64 "%64, %65"
#define LAB_WG_AB128 "%128, %129"
#define LAB_WG_SCALE64 "%66"
#define LAB_WG_SCALE128 "%130"
#ifdef LAB_SM90A
#define LAB_WGMMA(shape_types, R, imm, d, da, db, scale_d)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " LAB_WG_SCALE##R ", 0;\n"                                          \
               "wgmma.mma_async.sync.aligned." shape_types " {" LAB_WG_REGS##R " }, " LAB_WG_AB##R ", p, " imm       \
               ";\n}\n"                                                                                              \
               : LAB_WG_ACC##R(d)                                                                                    \
               : "l"(da), "l"(db), "r"(scale_d))
#else
#define LAB_WGMMA(shape_types, R, imm, d, da, db, scale_d)  // nothing outside sm_90a, as every wrapper here
#endif

__device__ __forceinline__ void wgmma_m64n256k16_bf16(float* d, uint64_t da, uint64_t db, int scale_d) {
  LAB_WGMMA("m64n256k16.f32.bf16.bf16", 128, "1, 1, 0, 0", d, da, db, scale_d);
}
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float* d, uint64_t da, uint64_t db, int scale_d) {
  LAB_WGMMA("m64n128k16.f32.bf16.bf16", 64, "1, 1, 0, 0", d, da, db, scale_d);
}
__device__ __forceinline__ void wgmma_m64n256k8_tf32(float* d, uint64_t da, uint64_t db, int scale_d) {
  LAB_WGMMA("m64n256k8.f32.tf32.tf32", 128, "1, 1", d, da, db, scale_d);
}
__device__ __forceinline__ void wgmma_m64n128k8_tf32(float* d, uint64_t da, uint64_t db, int scale_d) {
  LAB_WGMMA("m64n128k8.f32.tf32.tf32", 64, "1, 1", d, da, db, scale_d);
}
#undef LAB_WGMMA
#undef LAB_WG_SCALE128
#undef LAB_WG_SCALE64
#undef LAB_WG_AB128
#undef LAB_WG_AB64
#undef LAB_WG_REGS128
#undef LAB_WG_REGS64
#undef LAB_WG_ACC128
#undef LAB_WG_ACC64
#undef LAB_WG_ACC8

template <class T, int BN>
__device__ __forceinline__ void wgmma_step(float* d, uint64_t da, uint64_t db) {
  if constexpr (sizeof(T) == 2) {
    if constexpr (BN == 256) wgmma_m64n256k16_bf16(d, da, db, 1);
    else wgmma_m64n128k16_bf16(d, da, db, 1);
  } else {
    if constexpr (BN == 256) wgmma_m64n256k8_tf32(d, da, db, 1);
    else wgmma_m64n128k8_tf32(d, da, db, 1);
  }
}

}  // namespace linear
