// linear/v11.cu — v11, Hopper wgmma fed by TMA: TF32 on float32 tensors, bf16 on bfloat16 tensors; one kernel
// template, built once per dtype (the ladder: linear.cuh; the PTX wrappers: wgmma.cuh)
// lab:variants dtype=f32,bf16
#include "linear.cuh"
#include "tc.cuh"
#include "wgmma.cuh"

namespace linear {

// ---------------------------------------------------------------------------------------------------------------
// v11: Hopper. TMA writes each stage in the 128-B swizzled K-major layout (rows of 128 B = 32 fp32 or 64 bf16
// along K, 16-B chunks XOR-ed with row % 8); wgmma reads it through a shared-memory descriptor: start address,
// stride between 8-row groups (SBO = 1024 B), swizzle mode. One wgmma covers 32 bytes of K (k8 TF32, k16 bf16), so
// the k-th step of a stage starts 32·k bytes into the row (the swizzle is applied on the address, base 1024-aligned).
// Roles: warpgroup 0 is the producer (one thread issues the TMA loads; its registers are given back with
// setmaxnreg), warpgroups 1 and 2 each own 64 rows x BN columns of the 128 x BN tile, accumulators in registers.
// Barriers per stage: full (TMA bytes landed: expect_tx by the producer) and empty (8 consumer warps done reading).
// Consumers keep one wgmma group in flight: issue stage k, wait until stage k-1's group retired, release k-1.
// ---------------------------------------------------------------------------------------------------------------
namespace wg {
template <class T, int BN>
struct Cfg {
  static constexpr int BM = 128, ES = sizeof(T), BK = 128 / ES, KSTEP = 32 / ES;
  static constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128, STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int STAGES = BN == 256 ? 4 : 6;  // 192 KB of stages either way
  static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 /* alignment slack */ + 2 * STAGES * 8 /* barriers */;
};
}  // namespace wg

template <class T, int BN>
__global__ void __launch_bounds__(384, 1) v11_wgmma(const __grid_constant__ CUtensorMap tmx,
                                                    const __grid_constant__ CUtensorMap tmw, const T* __restrict__ b,
                                                    T* __restrict__ y, int M, int N, int K, bool vec_out) {
#ifdef LAB_SM90A
  using C = wg::Cfg<T, BN>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t s0 = (smem_u32(smem_raw) + 1023) & ~1023u;  // the swizzle pattern repeats every 1024 B
  const uint32_t full = s0 + C::STAGES * C::STAGE_BYTES, empty = full + C::STAGES * 8;
  const Tile tl = tile_of(blockIdx.x, int(lab::ceil_div(M, C::BM)), int(lab::ceil_div(N, BN)));
  const int nk = int(lab::ceil_div(K, C::BK));
  const int role = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(full + 8 * s, 1);   // the producer's arrive.expect_tx, then the TMA bytes
      mbar_init(empty + 8 * s, 8);  // one arrive per consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (role == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % C::STAGES;
        if (kt >= C::STAGES) mbar_wait(empty + 8 * s, ((kt / C::STAGES) + 1) & 1);  // consumers freed it
        mbar_expect_tx(full + 8 * s, C::STAGE_BYTES);  // the full box counts, zero-filled parts included
        const uint32_t sa = s0 + s * C::STAGE_BYTES;
        tma_load_2d(sa, &tmx, kt * C::BK, tl.m * C::BM, full + 8 * s);
        tma_load_2d(sa + C::A_BYTES, &tmw, kt * C::BK, tl.n * BN, full + 8 * s);
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int c = role - 1;  // rows 64c .. 64c+63 of the tile
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
    const int lane = threadIdx.x % 32;
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % C::STAGES;
      mbar_wait(full + 8 * s, (kt / C::STAGES) & 1);
      const uint32_t sa = s0 + s * C::STAGE_BYTES + c * 64 * 128, sb = s0 + s * C::STAGE_BYTES + C::A_BYTES;
      fence_regs<BN / 2>(d);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < C::BK / C::KSTEP; ++kk) wgmma_step<T, BN>(d, wg_desc(sa + 32 * kk), wg_desc(sb + 32 * kk));
      wgmma_commit();
      wgmma_wait<1>();  // the group of stage kt-1 has retired: its shared memory can be refilled
      fence_regs<BN / 2>(d);
      if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((kt - 1) % C::STAGES));
    }
    wgmma_wait<0>();
    fence_regs<BN / 2>(d);
    const int tid = threadIdx.x % 128;
    const int r = tl.m * C::BM + c * 64 + (tid / 32) * 16 + lane / 4;
    const int cb = tl.n * BN + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      store_pair<T>(y, b, M, N, r, cb + 8 * j, d[4 * j], d[4 * j + 1], vec_out);
      store_pair<T>(y, b, M, N, r + 8, cb + 8 * j, d[4 * j + 2], d[4 * j + 3], vec_out);
    }
  }
#endif
}

template <class T, int BN>
cudaError_t launch_wgmma_bn(const T* x, const T* w, const T* b, T* y, int M, int N, int K, bool vec_out,
                            cudaStream_t s) {
  using C = wg::Cfg<T, BN>;
  constexpr CUtensorMapDataType dt = sizeof(T) == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUtensorMap tmx, tmw;
  // (K, rows) row-major operands, (BM or BN rows, 128 B) boxes in the 128-B swizzle (lab_sm90.cuh)
  if (!lab::make_tensor_map(&tmx, x, dt, C::ES, K, M, C::BM) || !lab::make_tensor_map(&tmw, w, dt, C::ES, K, N, BN))
    return cudaErrorInvalidValue;
  return launch_opt_in_smem(v11_wgmma<T, BN>, tiles(M, N, C::BM, BN), 384, C::SMEM, s, tmx, tmw, b, y, M, N, K,
                            vec_out);
}

// v11: 128x256 tiles when they fill the GPU, else 128x128 (twice the blocks: fc_out at M = 128 has 24 tiles of
// 256 columns for 132 SMs). Where even 128x128 tiles leave SMs idle (1024^3: 8 x 8 = 64 tiles, one 384-thread block
// per SM for 132 SMs) Nsight Compute times Triton's TF32 kernel below this one (results/<device>/ncu.csv: its autotuner
// picks 64x128 tiles of 4 warps there, 128 programs). The next rung's target: 64-row tiles, or a split of K, wherever
// 128x128 tiles number fewer than the SMs. TMA needs 16-byte aligned rows: otherwise the mma.sync kernel of the same precision,
// which lives in its own unit (v10.cu): the binding sends such operands there (the same test, tma_ok in
// cpp_src/linear/linear.cpp), so this launcher refuses them.
template <class T>
cudaError_t launch_wgmma(const T* x, const T* w, const T* b, T* y, int M, int N, int K, bool vec_out,
                         cudaStream_t s) {
  if (device_major() != 9) return cudaErrorNotSupported;  // wgmma/TMA: Hopper (the module is built for sm_90a)
  const bool tma_ok = (int64_t(K) * sizeof(T)) % 16 == 0 && aligned(x, 16) && aligned(w, 16);
  if (!tma_ok) return cudaErrorInvalidValue;  // the binding calls v10's launcher (mma_sync@...) instead
  if (tiles(M, N, 128, 256) >= lab::sm_count()) return launch_wgmma_bn<T, 256>(x, w, b, y, M, N, K, vec_out, s);
  return launch_wgmma_bn<T, 128>(x, w, b, y, M, N, K, vec_out, s);
}

using T = VariantT;  // this build's dtype (tc.cuh): float (v11 on float32 tensors: TF32, the tensor core truncates
                     // the fp32 bits) or bf16

cudaError_t forward_wgmma(const T* x, const T* w, const T* b, T* y, int M, int N, int K, cudaStream_t s) {
  return launch_wgmma<T>(x, w, b, y, M, N, K, vec2_out(y, b, N), s);
}

}  // namespace linear

// registered as "wgmma@f32" and "wgmma@bf16" (v11 at either dtype; bf16 is at::BFloat16's 16-bit layout)
LAB_EXPORTS(LAB_EXPORT("wgmma", linear::forward_wgmma))
