// rope/v1.cu — v1: one thread per pair, one launch per tensor (the ladder and the napkin math: rope.cuh). The kernel
// and its launch (rope_v1, launch_v1) live in rope.cuh because v2 and v3 fall back to them; this unit is v1's entry.
#include "rope.cuh"

namespace rope {

// The launcher exported (signature: rope.cuh); rows (heads per thread) is v2's and v3's knob: v1 ignores it.
template <class T, class TC>
cudaError_t launch(const void* q, void* q_out, int64_t q_heads, const void* k, void* k_out, int64_t k_heads,
                   const void* cos, const void* sin, int64_t batch, int64_t seq, int64_t head_dim, int64_t offset,
                   bool bshd, bool interleaved, bool inverse, int /*rows*/, cudaStream_t stream) {
  const Problem<T, TC> p = problem<T, TC>(q, q_out, q_heads, k, k_out, k_heads, cos, sin, batch, seq, head_dim,
                                          offset, bshd, interleaved, inverse);
  // v1: one launch per tensor
  return per_tensor(p, [&](const Problem<T, TC>& one) { return launch_v1(one, stream); });
}

}  // namespace rope

LAB_EXPORTS(LAB_EXPORT("rope_v1_f32_f32", rope::launch<float, float>),
            LAB_EXPORT("rope_v1_f16_f32", rope::launch<__half, float>),
            LAB_EXPORT("rope_v1_f16_f16", rope::launch<__half, __half>),
            LAB_EXPORT("rope_v1_bf16_f32", rope::launch<__nv_bfloat16, float>),
            LAB_EXPORT("rope_v1_bf16_bf16", rope::launch<__nv_bfloat16, __nv_bfloat16>),
            LAB_EXPORT("rope_v1_f64_f32", rope::launch<double, float>),
            LAB_EXPORT("rope_v1_f64_f64", rope::launch<double, double>))
