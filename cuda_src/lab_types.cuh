// lab_types.cuh — element types for device code: the accumulate type of a storage type (fp32 for fp32/fp16/bf16,
// fp64 for double) and the conversions to and from it (round to nearest even). Shared by the families' kernels
// (rope, embedding); the host side's conversions are cpp_src/lab_half.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lab {

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

}  // namespace lab
