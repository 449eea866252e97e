// gru/persistent.cuh — what the two persistent units (v3.cu: v3/v4, v5.cu: v5) share: the storage type of the
// variant being built, coherent loads of h, the per-batch-slice step counters, and (cooperative.cuh) the host side of
// a cooperative launch. Apart from
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

// The step's exchange, per batch slice (v3/v4 and v5). A block needs h_{t-1} only for its own batch rows, which the
// Ph blocks of its slice write; so it waits for those Ph blocks, not for the whole grid. After its last h_t store a
// block's thread 0 counts the step done with a release add at GPU scope (slice_arrive: the block's stores, ordered
// before it by the __syncthreads, are visible to whoever acquires the count; cooperative_groups' grid.sync() pairs a
// barrier and a release the same way); before reading h_t,
// thread 0 of every block of the slice spins until the count reaches Ph * (t + 1) (slice_wait). Counts only grow, so
// no reset between steps; the counters are zeroed before the launch.
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void slice_wait(const int* counter, int target) {
  if (threadIdx.x == 0)
    while (ld_acquire(counter) < target) {
    }
  __syncthreads();
}
__device__ __forceinline__ void slice_arrive(int* counter) {
  __syncthreads();
  if (threadIdx.x == 0)  // a release add: MEMBAR.ALL.GPU and a fire-and-forget RED (__threadfence + atomicAdd would be
                         // MEMBAR.SC.GPU, an L1 invalidation and an atomic that returns a value nobody reads)
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Programmatic dependent launch (cooperative.cuh, launch_cooperative's early): the kernel launched before this one
// in the stream has finished and its writes are visible once this returns; a no-op when the launch was not early.
// Before it, a kernel may read only what was written before that earlier kernel started.
__device__ __forceinline__ void wait_for_prior_grid() { lab::pdl_wait(); }

// The tagged exchange (v3/v4, issue 14's cheaper exchange): h_t travels as 64-bit words, the value's fp32 bits in the
// low half and t + 1 in the high half, written with one relaxed 64-bit store (single-copy atomic: a reader sees the
// old word or the new one, never half of each). A reader of h_{t-1} spins on the words themselves until their tag
// reads t: the data is its own flag, so no fence before a count, no counter, no second round trip for the data.
// Double-buffered by step parity: a writer of h_{t+1} has read all of h_t, so every block of its slice has finished
// step t and read all of h_{t-1}, the words it overwrites. Tag 0 means never written (the buffer is zeroed before
// the launch), so a word of an earlier launch is never taken for this one's.
__device__ __forceinline__ void st_tagged(unsigned long long* p, float v, int t) {
  const unsigned long long w = (static_cast<unsigned long long>(static_cast<unsigned>(t + 1)) << 32) |
                               __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ld_tagged(const unsigned long long* p) {
  unsigned long long w;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(w) : "l"(p) : "memory");
  return w;
}

}  // namespace gru
