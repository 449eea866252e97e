// linear/wgmma.cuh — the wgmma instructions of v11 (the ladder: linear.cuh). What Hopper kernels share (mbarrier,
// TMA and its tensor maps, the wgmma fences, setmaxnreg, the shared-memory descriptor, the accumulator operand lists)
// lives in cuda_src/lab_sm90.cuh (shared with sparse24 v4); each wrapper compiles to nothing outside sm_90a.
#pragma once

#include "lab_sm90.cuh"
#include "linear.cuh"

namespace linear {

using lab::fence_regs;
using lab::mbar_arrive;
using lab::mbar_expect_tx;
using lab::mbar_fence_init;
using lab::mbar_init;
using lab::mbar_wait;
using lab::setmaxnreg_dec;
using lab::setmaxnreg_inc;
using lab::tma_load_2d;
using lab::wgmma_commit;
using lab::wgmma_fence;
using lab::wgmma_wait;

// Shared-memory matrix descriptor: K-major operand in the 128-B swizzle layout (rows of 128 B, 8-row groups 1024 B
// apart).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) { return lab::smem_desc<128>(saddr); }

// The wgmma instructions: D (64 x N, fp32 registers, 128 threads) += A (64 x k, smem) · B (k x N, smem as N x k).
// Register d[4j + {0,1,2,3}] of a thread (warp w, lane l) is D[16w + l/4 + {0,0,8,8}][8j + 2(l%4) + {0,1,0,1}].
//
// The four shapes v11 uses differ only in the instruction's name, the accumulator count R (N/2: 128 or 64 registers
// a thread) and the immediates after the predicate (scale-a, scale-b; bf16 adds the transposes of A and B, which
// tf32 does not take). So one macro, LAB_WGMMA, writes all four asm statements, and the R "+f" operands and their
// %-names are spelled once (lab_sm90.cuh) instead of once per shape. Operands: %0..%R-1 the accumulators d[0..R-1],
// %R and
// %R+1 the descriptors of A and B, %R+2 scale_d (0: D = A·B, else D += A·B). The PTX text is the same as when each
// wrapper spelled it out.
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
