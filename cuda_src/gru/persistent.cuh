// gru/persistent.cuh — what the two persistent units (v3.cu: v3/v4, v5.cu: v5) share: the storage type of the
// variant being built, coherent loads of h, and (cooperative.cuh) the host side of a cooperative launch. Apart from
// gru.cuh so the gate and decoder units do not compile it.
#pragma once

#include "cooperative.cuh"

namespace gru {

// This build's storage type (// lab:variants dtype=f32,f16,bf16 in both units): float (v5: multiplied in TF32),
// __half or __nv_bfloat16.
#if defined(LAB_VARIANT_dtype_f32)
using VT = float;
constexpr int kDtype = kF32;
#elif defined(LAB_VARIANT_dtype_f16)
using VT = __half;
constexpr int kDtype = kF16;
#elif defined(LAB_VARIANT_dtype_bf16)
using VT = __nv_bfloat16;
constexpr int kDtype = kBF16;
#else
#error "the persistent GRU units are built per variant: -DLAB_VARIANT_dtype_f32, _f16 or _bf16"
#endif

// L2-only loads (ld.global.cg): h_{t-1} was written by other SMs during this launch; L1 is not coherent.
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ __half ldcg(const __half* p) {
  return __ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ __nv_bfloat16 ldcg(const __nv_bfloat16* p) {
  return __ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}

}  // namespace gru
