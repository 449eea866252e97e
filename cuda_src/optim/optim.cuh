// optim/optim.cuh — multi-tensor-apply Adam and AdamW: one kernel updates every parameter tensor of a model.
//
// For each tensor (param p, grad g of p's dtype; fp32 state m, v [, vmax]; fp32 step count s on the device):
//   t = s + 1;   g = maximize ? -g : g
//   AdamW: p *= 1 - lr·wd                      Adam: g += wd·p   (when wd != 0)
//   m = m + (1-β1)(g - m)                      v = β2·v + (1-β2)·g²          amsgrad: vmax = max(vmax, v), use vmax
//   p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps);   s = t
// Reference: torch.optim.AdamW / Adam (their for-loop implementation), and adam_ref in lab/kernels/optim.py (float64).
// Params may be fp32, bf16 or fp16; the state is always fp32 (bf16/fp16 params are rounded once per step).
//
// The problem is the list. A kernel takes plain arguments; how do 148 (or 2000) tensor addresses reach it?
//   v1: a metadata struct of pointers and a block->(tensor, chunk) map passed BY VALUE, sized to the classic 4 KB
//       kernel-parameter limit (36 tensors, 416 chunks of 64K elements per launch): as many launches as it takes.
//       This is torch's multi_tensor_apply scheme.
//   v2: the same struct sized to the 32764-byte limit of CUDA 12.1+ on Volta and newer (nvcc rejects one byte more),
//       less 524 bytes (see kIndexableParamBytes): 256 tensors, 3936 chunks per launch; GPT-2 small: 1 launch, not 6.
//   v3: the table in device memory (the notes' "revisit attempt 2"): one launch for any list, one 512-thread block per
//       64K-element chunk as before. The table is written by a small kernel whose argument is the table itself (by
//       value, 32000 bytes at a time), so the upload is stream-ordered and can be captured in a CUDA graph.
//   v4: flat: the tensors laid end to end as one index space of 4-element quads; each block takes Q·512 consecutive
//       quads, whatever tensors they belong to, and each thread finds its tensor by walking forward. No block idles
//       on a 64-element tensor, and the hardware still balances blocks over SMs. (A persistent variant — one wave,
//       equal static slices — was clearly slower than v3 on GPT-2 small: an H100's SMs do not drain HBM equally
//       fast, and static slices leave the whole step waiting on the slowest SM.)
//
// The step count lives on the device and is read by the kernel, so a step can be captured in a CUDA graph and
// replayed. Who increments it? Every block reads s before updating; the last block to finish (an atomic ticket) adds
// 1 to the steps of the tensors whose last chunk was in this launch, then resets the ticket: no extra launch.
// lr is a captured constant, or (lr_ptr) read from device memory at run time so a schedule can change it between
// replays; β1, β2, eps, weight decay are captured constants.
//
// Napkin math: fp32 AdamW reads p, g, m, v and writes p, m, v: 28 B/param (bf16 params 22; amsgrad +8).
// GPT-2 small, 124,439,808 params in 148 tensors: 3.48 GB per step = 1.04 ms at the datasheet's 3.35 TB/s (the
// lab's measured copy ceiling, lower, is printed beside every timing). ~15 flops/param against 28 bytes:
// memory-bound by far. With 2000 small tensors (3,312,540 params) the work (93 MB) is ~28 us at 3.35 TB/s, and the
// cost is launches and the host: torch's foreach AdamW issues ~10 kernels per 36-tensor slice.
//
// Timings (GPT-2 small and 2000 tensors; torch's for-loop, foreach, fused and compiled AdamW, v1-v4, eager and
// replayed from a CUDA graph) and each one's fraction of the copy ceiling: results/<device>/results.csv and
// notebook 06. What they show:
//   GPT-2 small      every version beats torch's fused AdamW, v1 (6 launches) by the least, and v4 is the fastest,
//                    close to a plain 1:1 copy; torch.compile of the foreach step (a long compile) beats eager
//                    foreach, and where it lands against fused differs between runs (notebook 06 prints it).
//   2000 tensors     torch's foreach and fused steps are host-bound, and so is v4 run eagerly; replayed from a CUDA
//                    graph, v3 and v4 are several times faster than torch's fused AdamW with capturable=True.
// What is left on GPT-2 is the copy ceiling itself. On 2000 tensors a replayed step is still well above the
// bandwidth floor; not yet broken down. Suspects: the graph re-writes the 128 KB pointer table (5 small launches) on
// every replay, and tensors of a few hundred quads leave a block's loads short of a full wave.
//
// Units (each its own build; this header holds what they share: the per-element update, the quad loads, the
// last-block ticket, the table layout):
//   byvalue.cu  v1, v2: one kernel template, built once per version (// lab:variants version=v1,v2)
//   v3.cu       v3: the table kernel, built once per param dtype (// lab:variants dtype=f32,bf16,f16)
//   v4.cu       v4: the flat kernel, built once per param dtype (// lab:variants dtype=f32,bf16,f16)
//   table.cu    the table upload (write_words_kernel), shared by v3 and v4
// The binding, cpp_src/optim/optim.cpp, finds the launchers by name: "adam_byvalue@v1", "adam_v4@bf16", ...
// The C++ CPU version (version 0) is cpp_src/optim/cpu.cpp.
#pragma once

#include "lab_cuda.cuh"
#include "lab_unit.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace optim {

// 512 threads, at least 3 blocks per SM (<= 40 registers; 2 with amsgrad's extra stream): 1536 threads each with 4
// independent 16-byte loads in flight is ~96 KB per SM, several times what HBM3 needs to stay busy (~25 KB).
constexpr int kBlock = 512;
constexpr int kNPtr = 6;                           // per tensor: p, g, m, v, step, vmax (null without amsgrad)
enum Slot { kP = 0, kG, kM, kV, kS, kVmax };
enum Dtype { kF32 = 0, kBF16 = 1, kF16 = 2 };      // the param (and grad) dtype
enum Flags { kMaximize = 1, kDecoupled = 2 };

// Hyperparameters, passed by value to every launch (a CUDA graph captures them as constants).
struct Hyper {
  float lr;
  const float* lr_ptr;    // not null: lr is read from device memory when the kernel runs
  float log_b1, log_b2;   // log(β): 1 - β^t = -expm1(t·log β), accurate even at t = 1 where 1 - β2 = 1e-3
  float omb1, b2, omb2;   // 1 - β1, β2, 1 - β2, rounded from double as torch rounds them
  float eps, wd, decay;   // decay = 1 - lr·wd (AdamW), recomputed on the device when lr_ptr is set
  int flags;
};

// Per tensor and step: the bias-corrected step size and 1/sqrt(1 - β2^t).
struct Coef {
  float step_size, inv_bc2_sqrt, decay;
};

__device__ __forceinline__ Coef coef_for(const Hyper& h, float step_prev) {
  const float t = step_prev + 1.f;
  const float lr = h.lr_ptr ? __ldg(h.lr_ptr) : h.lr;
  Coef c;
  // IEEE division and square root even under --use_fast_math: these feed every element of the tensor
  c.step_size = __fdiv_rn(lr, -expm1f(t * h.log_b1));
  c.inv_bc2_sqrt = __frcp_rn(__fsqrt_rn(-expm1f(t * h.log_b2)));
  c.decay = h.lr_ptr ? 1.f - lr * h.wd : h.decay;
  return c;
}

// One element, in the order torch's for-loop AdamW computes it (so fp32 results agree to rounding).
template <bool AMS>
__device__ __forceinline__ void adam_update(float& p, float g, float& m, float& v, float& vmax, const Hyper& h,
                                            const Coef& c) {
  if (h.flags & kMaximize) g = -g;
  if (h.flags & kDecoupled) {
    p *= c.decay;
  } else if (h.wd != 0.f) {
    g += h.wd * p;
  }
  m += h.omb1 * (g - m);                    // exp_avg.lerp_(grad, 1 - β1)
  v = v * h.b2 + h.omb2 * (g * g);          // exp_avg_sq.mul_(β2).addcmul_(grad, grad, value=1 - β2)
  float s = v;
  if (AMS) {
    vmax = fmaxf(vmax, v);
    s = vmax;
  }
  const float denom = __fsqrt_rn(s) * c.inv_bc2_sqrt + h.eps;  // torch on CUDA also multiplies by the reciprocal
  p -= c.step_size * __fdiv_rn(m, denom);   // param.addcdiv_(exp_avg, denom, value=-step_size)
}

// 4 consecutive elements <-> 4 floats: one 16-byte access for fp32, one 8-byte access for bf16/fp16. Every byte is
// touched once per step, so loads and stores are streaming (evict-first); they also name the global space, where
// pointers read from a table would otherwise give generic loads.
template <class P> struct Io;
template <> struct Io<float> {
  static constexpr int kAlign = 16;
  __device__ static void load4(const float* s, float (&x)[4]) {
    const float4 t = __ldcs(reinterpret_cast<const float4*>(s));
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
  }
  __device__ static void store4(float* d, const float (&x)[4]) {
    __stcs(reinterpret_cast<float4*>(d), make_float4(x[0], x[1], x[2], x[3]));
  }
  __device__ static float load1(const float* s) { return __ldcs(s); }
  __device__ static void store1(float* d, float x) { __stcs(d, x); }
};
template <> struct Io<__nv_bfloat16> {
  static constexpr int kAlign = 8;
  __device__ static void load4(const __nv_bfloat16* s, float (&x)[4]) {
    const uint2 raw = __ldcs(reinterpret_cast<const uint2*>(s));
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
  }
  __device__ static void store4(__nv_bfloat16* d, const float (&x)[4]) {
    __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]), b = __floats2bfloat162_rn(x[2], x[3]);
    uint2 raw;
    raw.x = *reinterpret_cast<unsigned*>(&a);
    raw.y = *reinterpret_cast<unsigned*>(&b);
    __stcs(reinterpret_cast<uint2*>(d), raw);
  }
  __device__ static float load1(const __nv_bfloat16* s) { return __bfloat162float(__ldcs(s)); }
  __device__ static void store1(__nv_bfloat16* d, float x) { __stcs(d, __float2bfloat16_rn(x)); }
};
template <> struct Io<__half> {
  static constexpr int kAlign = 8;
  __device__ static void load4(const __half* s, float (&x)[4]) {
    const uint2 raw = __ldcs(reinterpret_cast<const uint2*>(s));
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
  }
  __device__ static void store4(__half* d, const float (&x)[4]) {
    __half2 a = __floats2half2_rn(x[0], x[1]), b = __floats2half2_rn(x[2], x[3]);
    uint2 raw;
    raw.x = *reinterpret_cast<unsigned*>(&a);
    raw.y = *reinterpret_cast<unsigned*>(&b);
    __stcs(reinterpret_cast<uint2*>(d), raw);
  }
  __device__ static float load1(const __half* s) { return __half2float(__ldcs(s)); }
  __device__ static void store1(__half* d, float x) { __stcs(d, __float2half_rn(x)); }
};

// One element, and one quad i..i+3 (all loads before any math), of one tensor: the step both v3 (a block walks a
// range) and v4 (a thread walks a flat quad index) take.
template <class P, bool AMS>
__device__ __forceinline__ void update1(P* __restrict__ p, const P* __restrict__ g, float* __restrict__ m,
                                        float* __restrict__ v, float* __restrict__ vm, int64_t i, const Hyper& h,
                                        const Coef& c) {
  float xp = Io<P>::load1(p + i), xm = m[i], xv = v[i], xx = AMS ? vm[i] : 0.f;
  adam_update<AMS>(xp, Io<P>::load1(g + i), xm, xv, xx, h, c);
  Io<P>::store1(p + i, xp);
  m[i] = xm;
  v[i] = xv;
  if (AMS) vm[i] = xx;
}
template <class P, bool AMS>
__device__ __forceinline__ void update4(P* __restrict__ p, const P* __restrict__ g, float* __restrict__ m,
                                        float* __restrict__ v, float* __restrict__ vm, int64_t i, const Hyper& h,
                                        const Coef& c) {
  float xp[4], xg[4], xm[4], xv[4], xx[4];
  Io<P>::load4(p + i, xp);
  Io<P>::load4(g + i, xg);
  Io<float>::load4(m + i, xm);
  Io<float>::load4(v + i, xv);
  if (AMS) Io<float>::load4(vm + i, xx);
#pragma unroll
  for (int k = 0; k < 4; ++k) adam_update<AMS>(xp[k], xg[k], xm[k], xv[k], xx[k], h, c);
  Io<P>::store4(p + i, xp);
  Io<float>::store4(m + i, xm);
  Io<float>::store4(v + i, xv);
  if (AMS) Io<float>::store4(vm + i, xx);
}
// Quads of a tensor take vector accesses only when every base pointer is aligned for them (16 B for the fp32 state,
// Io<P>::kAlign for param and grad): a param that is a view into a flat buffer may not be.
template <class P, bool AMS>
__device__ __forceinline__ bool quads_aligned(const P* p, const P* g, const float* m, const float* v,
                                              const float* vm) {
  const uintptr_t pa = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g);
  const uintptr_t sa = reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v) |
                       (AMS ? reinterpret_cast<uintptr_t>(vm) : 0);
  return pa % Io<P>::kAlign == 0 && sa % 16 == 0;
}

// Elements [begin, end) of one tensor, spread over the block's threads. begin is a multiple of 4, so when the base
// pointers are aligned every quad is: 16-byte (fp32) / 8-byte (bf16, fp16) accesses, all loads before any math.
// Misaligned views (a param that is a slice of a flat buffer) take the scalar loop.
template <class P, bool AMS>
__device__ __forceinline__ void update_range(const void* const* ptr, int64_t begin, int64_t end, const Hyper& h,
                                             const Coef& c) {
  P* __restrict__ p = static_cast<P*>(const_cast<void*>(ptr[kP]));
  const P* __restrict__ g = static_cast<const P*>(ptr[kG]);
  float* __restrict__ m = static_cast<float*>(const_cast<void*>(ptr[kM]));
  float* __restrict__ v = static_cast<float*>(const_cast<void*>(ptr[kV]));
  float* __restrict__ vm = AMS ? static_cast<float*>(const_cast<void*>(ptr[kVmax])) : nullptr;
  int64_t i0 = begin;
  if (quads_aligned<P, AMS>(p, g, m, v, vm)) {
    const int64_t nq = (end - begin) >> 2;
    for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
      const int64_t i = begin + 4 * q;
      update4<P, AMS>(p, g, m, v, vm, i, h, c);
    }
    i0 = begin + 4 * nq;
  }
  for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
    update1<P, AMS>(p, g, m, v, vm, i, h, c);
  }
}

// True in the one block that finishes last. Every block read its steps before its ticket (the fence orders that
// read before the atomic), so the last block may increment them. It also resets the ticket for the next launch.
__device__ __forceinline__ bool last_block_done(int* counter) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1) == int(gridDim.x) - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  return last;
}

// ---------------------------------------------------------------------------------------------------------------
// v3, v4: the table in device memory (layout; the kernels are in v3.cu and v4.cu, the upload in table.cu)
// ---------------------------------------------------------------------------------------------------------------
struct Rec {                       // one tensor, 64 bytes
  const void* ptr[kNPtr];
  int64_t numel;
  int64_t start;                   // v4: first quad (4 elements) of this tensor in the concatenation of all of them
};
struct TableHeader {               // 64 bytes at the start of the table
  int32_t counter;                 // the last-block ticket; the upload writes 0, the last block resets it to 0
  int32_t n;                       // tensors
  int32_t blocks;                  // grid size
  int32_t version;
  int64_t chunk;                   // v3: elements per block
  int64_t total_quads;             // v4
  int32_t q_per_thread;            // v4: quads per thread (the block covers q_per_thread · 512 quads)
  int32_t pad0;
  int64_t pad[3];
};
static_assert(sizeof(Rec) == 64 && sizeof(TableHeader) == 64, "table layout");
// v3 layout: header | Rec[n] | int2 blocks[blocks] (tensor, chunk)
// v4 layout: header | Rec[n] | int32 first[blocks] (the tensor holding the block's first quad)

inline Hyper make_hyper(float lr, const float* lr_ptr, double beta1, double beta2, float eps, float wd,
                        bool decoupled, bool maximize) {
  Hyper h;
  h.lr = lr;
  h.lr_ptr = lr_ptr;
  h.log_b1 = float(std::log(beta1));  // -inf for β = 0: expm1(-inf) = -1, so 1 - 0^t = 1
  h.log_b2 = float(std::log(beta2));
  h.omb1 = float(1.0 - beta1);
  h.b2 = float(beta2);
  h.omb2 = float(1.0 - beta2);
  h.eps = eps;
  h.wd = wd;
  h.decay = float(1.0 - double(lr) * double(wd));
  h.flags = (maximize ? kMaximize : 0) | (decoupled ? kDecoupled : 0);
  return h;
}

// dispatch on (param dtype, amsgrad)
template <class F>
auto dispatch(int dtype, bool amsgrad, F&& f) {
  switch (dtype) {
    case kBF16: return amsgrad ? f(__nv_bfloat16{}, std::true_type{}) : f(__nv_bfloat16{}, std::false_type{});
    case kF16: return amsgrad ? f(__half{}, std::true_type{}) : f(__half{}, std::false_type{});
    default: return amsgrad ? f(float{}, std::true_type{}) : f(float{}, std::false_type{});
  }
}

// A unit built once per param dtype (`// lab:variants dtype=f32,bf16,f16`: v3.cu, v4.cu) instantiates its kernel
// for VariantParam only, and dispatches on amsgrad alone.
#if defined(LAB_VARIANT_dtype_f32)
using VariantParam = float;
#elif defined(LAB_VARIANT_dtype_bf16)
using VariantParam = __nv_bfloat16;
#elif defined(LAB_VARIANT_dtype_f16)
using VariantParam = __half;
#endif

template <class F>
auto dispatch_ams(bool amsgrad, F&& f) {
  return amsgrad ? f(std::true_type{}) : f(std::false_type{});
}

// ---- the table's host side, shared by v3.cu and v4.cu (each computes its own grid: `blocks`, and for v4 the
// quads per thread) --------------------------------------------------------------------------------------------
// Quads (every tensor starts on a quad) and chunks (at least one per tensor: an empty tensor still steps).
inline void count_quads_chunks(const int64_t* numel, int n, int64_t chunk, int64_t* quads, int64_t* chunks) {
  int64_t q = 0, c = 0;
  for (int t = 0; t < n; ++t) {
    q += (numel[t] + 3) / 4;
    c += std::max<int64_t>(1, lab::ceil_div(numel[t], chunk));
  }
  *quads = q;
  *chunks = c;
}

// Size in bytes of the device table (a multiple of 8).
inline int64_t table_bytes(int version, int n, int64_t blocks) {
  const int64_t tail = version == 3 ? blocks * 8 : blocks * 4;
  return lab::ceil_div(int64_t(sizeof(TableHeader)) + n * int64_t(sizeof(Rec)) + tail, 8) * 8;
}

// Fill the host image of the table (table_bytes bytes).
inline void table_fill(int version, const void* const* ptrs, const int64_t* numel, int n, int64_t chunk,
                       int64_t blocks, int64_t total_quads, int qpt, void* host) {
  std::memset(host, 0, size_t(table_bytes(version, n, blocks)));
  auto* hd = static_cast<TableHeader*>(host);
  hd->counter = 0;
  hd->n = n;
  hd->blocks = int32_t(blocks);
  hd->version = version;
  hd->chunk = chunk;
  hd->total_quads = total_quads;
  hd->q_per_thread = qpt;
  Rec* recs = reinterpret_cast<Rec*>(static_cast<char*>(host) + sizeof(TableHeader));
  int64_t start = 0;
  for (int t = 0; t < n; ++t) {
    for (int k = 0; k < kNPtr; ++k) recs[t].ptr[k] = ptrs[int64_t(t) * kNPtr + k];
    recs[t].numel = numel[t];
    recs[t].start = start;
    start += (numel[t] + 3) / 4;
  }
  char* tail = reinterpret_cast<char*>(recs + n);
  if (version == 3) {
    int2* bl = reinterpret_cast<int2*>(tail);
    int64_t b = 0;
    for (int t = 0; t < n; ++t) {
      const int64_t nchunks = std::max<int64_t>(1, lab::ceil_div(numel[t], chunk));
      for (int64_t c = 0; c < nchunks; ++c) bl[b++] = make_int2(t, int(c));
    }
  } else {
    // block i starts at quad i·Q·512; its first tensor is the last one starting at or before that quad (threads
    // step over empty tensors themselves)
    int* first = reinterpret_cast<int*>(tail);
    int t = 0;
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t q0 = i * int64_t(qpt) * kBlock;
      while (t + 1 < n && recs[t + 1].start <= q0) ++t;
      first[i] = t;
    }
  }
}

// The device table at `dev` as a kernel sees it, read off the host image `host` it was uploaded from.
struct TableView {
  const TableHeader* hd;   // host copy
  const Rec* recs;         // device
  const char* tail;        // device: v3 int2 blocks[], v4 int32 first[]
  int* counter;            // device: the last-block ticket
};
inline TableView table_view(const void* dev, const void* host) {
  const TableHeader* hd = static_cast<const TableHeader*>(host);
  const char* base = static_cast<const char*>(dev);
  const Rec* recs = reinterpret_cast<const Rec*>(base + sizeof(TableHeader));
  const char* tail = base + sizeof(TableHeader) + int64_t(hd->n) * sizeof(Rec);
  int* counter = reinterpret_cast<int*>(const_cast<char*>(base));
  return {hd, recs, tail, counter};
}

// The step of a table version, exported by v3.cu and v4.cu as "adam_v3" / "adam_v4" (the binding calls it as an
// AdamTableFn): the hyper-parameters, the device table at `dev` as the kernel sees it (read off the host image `host`
// it was uploaded from), one launch counted, the amsgrad dispatch. The two versions differ only in their kernel:
// Kernel::launch<AMS>(tv, h, stream) launches the unit's own. Written once here so their launchers cannot drift.
template <class Kernel>
cudaError_t adam_table(bool amsgrad, const void* dev, const void* host, float lr, const float* lr_ptr, double beta1,
                       double beta2, float eps, float wd, bool decoupled, bool maximize, cudaStream_t stream,
                       int* launches) {
  const Hyper h = make_hyper(lr, lr_ptr, beta1, beta2, eps, wd, decoupled, maximize);
  const TableView tv = table_view(dev, host);
  ++*launches;
  return dispatch_ams(amsgrad, [&](auto ams) {
    Kernel::template launch<decltype(ams)::value>(tv, h, stream);
    return cudaGetLastError();
  });
}

}  // namespace optim
