// optim.cu — multi-tensor-apply Adam and AdamW: one kernel updates every parameter tensor of a model.
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
//       equal static slices — measured 72% of copy bandwidth against v3's 93% on GPT-2 small: an H100's SMs do not
//       drain HBM equally fast, and static slices leave the whole step waiting on the slowest SM.)
//
// The step count lives on the device and is read by the kernel, so a step can be captured in a CUDA graph and
// replayed. Who increments it? Every block reads s before updating; the last block to finish (an atomic ticket) adds
// 1 to the steps of the tensors whose last chunk was in this launch, then resets the ticket: no extra launch.
// lr is a captured constant, or (lr_ptr) read from device memory at run time so a schedule can change it between
// replays; β1, β2, eps, weight decay are captured constants.
//
// Napkin math: fp32 AdamW reads p, g, m, v and writes p, m, v: 28 B/param (bf16 params 22; amsgrad +8).
// GPT-2 small, 124,439,808 params in 148 tensors: 3.48 GB per step = 1.17 ms at the H100's ~2990 GB/s copy rate.
// ~15 flops/param against 28 bytes: memory-bound by far. With 2000 small tensors the work (93 MB) is ~31 us, and
// the cost is launches and the host: torch's foreach AdamW issues ~10 kernels per 36-tensor slice.
//
// Measured (H100 80GB HBM3, torch 2.11; median step, L2 flushed; GB/s = 28·params / time; torch.compile from an
// earlier run of the same session, the rest from one run):
//   GPT-2 small      torch for-loop 14.5 ms, foreach 3.82, fused 1.344 (87% of copy); torch.compile 1.266 (35 s to
//                    compile); v1 1.308 ms (89%, 6 launches), v2 1.258 (93%), v3 1.256 (93%), v4 1.229 (95%)
//   2000 tensors     torch foreach 21.1 ms, fused 10.4 (both host-bound); v4 0.334 ms (host-bound: 358 us of host
//                    per step); from a CUDA graph v3 81 us, v4 84 us, torch fused+capturable 514 us
// What is left on GPT-2 is the copy ceiling itself (v4 runs at 95% of a plain 1:1 copy). On 2000 tensors a replayed
// step is 2.7x the 31 us bandwidth floor; not yet broken down. Suspects: the graph re-writes the 128 KB pointer table
// (5 small launches) on every replay, and tensors of a few hundred quads leave a block's loads short of a full wave.
#include "lab_cuda.cuh"

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
// v1, v2: the pointer table passed by value, as many launches as it takes
// ---------------------------------------------------------------------------------------------------------------
template <int NPTR, int MAX_T, int MAX_B>
struct MetaByValue {
  static constexpr int kMaxT = MAX_T, kMaxB = MAX_B;
  const void* ptr[NPTR][MAX_T];   // p, g, m, v, step [, vmax] of each tensor slot
  int64_t numel[MAX_T];
  uint8_t finishes[MAX_T];        // 1: the tensor's last chunk is in this launch, so its step is incremented here
  int32_t chunk[MAX_B];           // per block: which chunk of its tensor
  uint8_t slot[MAX_B];            // per block: which tensor slot (MAX_T <= 256)
};

// Everything else the by-value kernel takes (Hyper, the chunk size, the ticket pointer), in bytes, padding included.
constexpr int kOtherArgs = 96;

// Kernel parameters sit in constant bank 0 after a 0x210-byte driver header. nvcc 13.0 encodes a load from that
// bank at a run-time index with a 16-bit signed displacement: an array that starts at bank offset 0x8000 or later
// gets a negative one (`LDC.U8 R0, c[0x0][R9+-0x7fd0]`) and reads the wrong bytes. Measured on the H100: with the
// struct filling all 32764 bytes, `finishes` (then last) read as 0 and v2 never advanced a step count. So the
// indexed struct ends below 0x8000: 32240 bytes; the scalar arguments after it are read at constant offsets, which
// work past 0x8000.
constexpr int kIndexableParamBytes = 0x8000 - 0x210;

// The struct for a kernel-parameter limit of LIMIT bytes: MAX_T tensor slots, and as many block slots as still fit.
template <int LIMIT, bool AMS>
struct Caps {
  static constexpr int kNPtrUsed = AMS ? 6 : 5;
  static constexpr int kMaxT = LIMIT <= 4096 ? 36 : 256;
  static constexpr int kPerT = kNPtrUsed * 8 + 8 + 1;
  static constexpr int kBudget = LIMIT <= 4096 ? LIMIT - kOtherArgs : kIndexableParamBytes;
  static constexpr int kMaxB = ((kBudget - kMaxT * kPerT - 16) / 5) / 32 * 32;
  using Meta = MetaByValue<kNPtrUsed, kMaxT, kMaxB>;
  static_assert(sizeof(Meta) + kOtherArgs <= LIMIT, "metadata struct over the kernel-parameter limit");
  static_assert(sizeof(Meta) <= kIndexableParamBytes, "indexed metadata must end below constant-bank offset 0x8000");
};
static_assert(sizeof(Hyper) + 16 <= kOtherArgs, "kOtherArgs too small");

template <class P, bool AMS, class Meta>
__global__ void __launch_bounds__(kBlock, AMS ? 2 : 3) adam_byvalue_kernel(const __grid_constant__ Meta meta, const Hyper h,
                                                              const int64_t chunk, int* counter) {
  const int s = meta.slot[blockIdx.x];
  const void* ptr[kNPtr] = {};
#pragma unroll
  for (int k = 0; k < (AMS ? 6 : 5); ++k) ptr[k] = meta.ptr[k][s];
  const int64_t begin = int64_t(meta.chunk[blockIdx.x]) * chunk;
  const int64_t end = min(meta.numel[s], begin + chunk);
  const Coef c = coef_for(h, *static_cast<const float*>(ptr[kS]));
  update_range<P, AMS>(ptr, begin, end, h, c);
  if (last_block_done(counter)) {
    for (int i = threadIdx.x; i < Meta::kMaxT; i += blockDim.x)
      if (meta.finishes[i]) *static_cast<float*>(const_cast<void*>(meta.ptr[kS][i])) += 1.f;
  }
}

template <class P, bool AMS, int LIMIT>
cudaError_t launch_byvalue(const void* const* ptrs, const int64_t* numel, int n, int64_t chunk, const Hyper& h,
                           int* counter, cudaStream_t stream, int* launches) {
  using C = Caps<LIMIT, AMS>;
  using Meta = typename C::Meta;
  auto meta = std::make_unique<Meta>();  // up to 32 KB: off the stack
  std::memset(meta.get(), 0, sizeof(Meta));
  int nt = 0, nb = 0;                    // tensor slots and blocks used in the launch being filled
  auto launch = [&]() -> cudaError_t {
    adam_byvalue_kernel<P, AMS, Meta><<<nb, kBlock, 0, stream>>>(*meta, h, chunk, counter);
    ++*launches;
    std::memset(meta->finishes, 0, sizeof(meta->finishes));
    nb = 0;
    return cudaGetLastError();
  };
  for (int t = 0; t < n; ++t) {
    for (int k = 0; k < C::kNPtrUsed; ++k) meta->ptr[k][nt] = ptrs[int64_t(t) * kNPtr + k];
    meta->numel[nt] = numel[t];
    const int64_t nchunks = std::max<int64_t>(1, lab::ceil_div(numel[t], chunk));  // an empty tensor still steps
    for (int64_t c = 0; c < nchunks; ++c) {
      const bool last_chunk = c == nchunks - 1;
      meta->slot[nb] = uint8_t(nt);
      meta->chunk[nb] = int32_t(c);
      ++nb;
      if (last_chunk) meta->finishes[nt] = 1;
      const bool blocks_full = nb == C::kMaxB;
      const bool slots_full = last_chunk && nt + 1 == C::kMaxT;
      if (blocks_full || slots_full) {
        if (cudaError_t e = launch(); e != cudaSuccess) return e;
        if (!last_chunk) {  // the tensor goes on in the next launch, in slot 0
          for (int k = 0; k < C::kNPtrUsed; ++k) meta->ptr[k][0] = meta->ptr[k][nt];
          meta->numel[0] = meta->numel[nt];
          nt = 0;
        } else {
          nt = -1;          // the next tensor starts at slot 0
        }
      }
    }
    ++nt;
  }
  if (nb > 0) return launch();
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------------------------
// v3, v4: the table in device memory
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

template <class P, bool AMS>
__global__ void __launch_bounds__(kBlock, AMS ? 2 : 3) adam_table_kernel(const Rec* __restrict__ recs,
                                                            const int2* __restrict__ blocks, int n, int64_t chunk,
                                                            const Hyper h, int* counter) {
  const int2 b = blocks[blockIdx.x];
  const Rec* r = recs + b.x;
  const void* ptr[kNPtr];
#pragma unroll
  for (int k = 0; k < kNPtr; ++k) ptr[k] = r->ptr[k];
  const int64_t begin = int64_t(b.y) * chunk;
  const int64_t end = min(r->numel, begin + chunk);
  const Coef c = coef_for(h, *static_cast<const float*>(ptr[kS]));
  update_range<P, AMS>(ptr, begin, end, h, c);
  if (last_block_done(counter)) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) *static_cast<float*>(const_cast<void*>(recs[i].ptr[kS])) += 1.f;
  }
}

// v4 (2 blocks of 512 per SM: the tensor walk needs more than 40 registers; 1024 threads with one 64-byte quad in
// flight each is still over twice what HBM needs per SM). Block b owns quads [b·Q·512, (b+1)·Q·512) of the concatenation of all tensors (a quad = 4 elements; every
// tensor starts on a quad). Thread x takes quads b·Q·512 + k·512 + x, k < Q: consecutive threads read consecutive
// addresses, a block may span many small tensors (no idle threads), and the hardware hands out blocks as SMs free up.
// Each thread walks forward through the tensors from the block's first one (precomputed) and reloads a tensor's
// record only when it crosses into the next.
template <class P, bool AMS>
__global__ void __launch_bounds__(kBlock, 2) adam_flat_kernel(const Rec* __restrict__ recs, const int* __restrict__ first,
                                                              int n, int64_t total_quads, int q_per_thread,
                                                              const Hyper h, int* counter) {
  const int64_t base = int64_t(blockIdx.x) * q_per_thread * kBlock;
  int t = first[blockIdx.x] - 1;
  int64_t start = 0, end = 0, numel = 0;   // the current tensor: quads [start, end), numel elements
  P* p = nullptr;
  const P* g = nullptr;
  float *m = nullptr, *v = nullptr, *vm = nullptr;
  bool vec = false;
  float cached_step = -1.f;
  Coef c{};
  for (int k = 0; k < q_per_thread; ++k) {
    const int64_t q = base + int64_t(k) * kBlock + threadIdx.x;
    if (q >= total_quads) break;
    if (q >= end) {
      do {                                  // empty tensors have start == end and are stepped over
        ++t;
        start = recs[t].start;
        numel = recs[t].numel;
        end = start + ((numel + 3) >> 2);
      } while (q >= end);
      const Rec* r = recs + t;
      p = static_cast<P*>(const_cast<void*>(r->ptr[kP]));
      g = static_cast<const P*>(r->ptr[kG]);
      m = static_cast<float*>(const_cast<void*>(r->ptr[kM]));
      v = static_cast<float*>(const_cast<void*>(r->ptr[kV]));
      if (AMS) vm = static_cast<float*>(const_cast<void*>(r->ptr[kVmax]));
      vec = quads_aligned<P, AMS>(p, g, m, v, vm);
      const float st = *static_cast<const float*>(r->ptr[kS]);
      if (st != cached_step) {
        c = coef_for(h, st);
        cached_step = st;
      }
    }
    const int64_t i = 4 * (q - start);
    if (vec && i + 4 <= numel) {
      update4<P, AMS>(p, g, m, v, vm, i, h, c);
    } else {                                // a misaligned tensor, or the last, partial quad of one
      for (int64_t j = i; j < i + 4 && j < numel; ++j) {
        update1<P, AMS>(p, g, m, v, vm, j, h, c);
      }
    }
  }
  if (last_block_done(counter)) {
    for (int j = threadIdx.x; j < n; j += blockDim.x) *static_cast<float*>(const_cast<void*>(recs[j].ptr[kS])) += 1.f;
  }
}

// Uploads the table through kernel arguments: stream-ordered like any launch, capturable in a CUDA graph (where
// the graph keeps the bytes), and no pinned staging buffer to keep alive.
constexpr int kWords = 4000;  // 32000 bytes per launch: indexed, so it must end below bank offset 0x8000 (as above)
struct Words {
  unsigned long long w[kWords];
};
__global__ void write_words_kernel(const __grid_constant__ Words src, unsigned long long* __restrict__ dst, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.w[i];
}

// v4: quads per thread, so that there are at least ~2 waves of blocks (room for the hardware to balance the SMs)
// and at most 8 quads (128 B of each fp32 stream) per thread.
template <class P, bool AMS>
int flat_quads_per_thread(int64_t total_quads) {
  static int per_sm = 0;  // resident blocks per SM, asked once per kernel instance
  if (!per_sm) {
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adam_flat_kernel<P, AMS>, kBlock, 0);
    per_sm = std::max(per_sm, 1);
  }
  const int64_t waves2 = 2 * int64_t(lab::sm_count()) * per_sm * kBlock;
  return int(std::clamp<int64_t>(total_quads / waves2, 1, 8));
}

template <class P, bool AMS>
int64_t table_blocks(int version, const int64_t* numel, int n, int64_t chunk, int64_t* total_quads, int* qpt) {
  int64_t quads = 0, chunks = 0;
  for (int t = 0; t < n; ++t) {
    quads += (numel[t] + 3) / 4;
    chunks += std::max<int64_t>(1, lab::ceil_div(numel[t], chunk));
  }
  if (total_quads) *total_quads = quads;
  if (version == 3) return chunks;
  const int q = flat_quads_per_thread<P, AMS>(quads);
  if (qpt) *qpt = q;
  return std::max<int64_t>(1, lab::ceil_div(quads, int64_t(q) * kBlock));
}

template <class P, bool AMS>
cudaError_t launch_table(const void* dev, const void* host, const Hyper& h, cudaStream_t stream) {
  const TableHeader* hd = static_cast<const TableHeader*>(host);
  const char* base = static_cast<const char*>(dev);
  const Rec* recs = reinterpret_cast<const Rec*>(base + sizeof(TableHeader));
  const char* tail = base + sizeof(TableHeader) + int64_t(hd->n) * sizeof(Rec);
  int* counter = reinterpret_cast<int*>(const_cast<char*>(base));
  if (hd->version == 3)
    adam_table_kernel<P, AMS><<<hd->blocks, kBlock, 0, stream>>>(recs, reinterpret_cast<const int2*>(tail), hd->n,
                                                                  hd->chunk, h, counter);
  else
    adam_flat_kernel<P, AMS><<<hd->blocks, kBlock, 0, stream>>>(recs, reinterpret_cast<const int*>(tail), hd->n,
                                                                 hd->total_quads, hd->q_per_thread, h, counter);
  return cudaGetLastError();
}

Hyper make_hyper(float lr, const float* lr_ptr, double beta1, double beta2, float eps, float wd, bool decoupled,
                 bool maximize) {
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

}  // namespace optim

// ---- the launchers cpp_src/optim.cpp calls -------------------------------------------------------------------
// ptrs: n x 6 host array (p, g, m, v, step, vmax); numel: n; all tensors of one param dtype, on the current device.

// v1 (4 KB struct) or v2 (32764-byte struct), by value; *launches counts the kernels issued.
cudaError_t optim_adam_byvalue(int version, int dtype, bool amsgrad, const void* const* ptrs, const int64_t* numel,
                               int n, int64_t chunk, float lr, const float* lr_ptr, double beta1, double beta2,
                               float eps, float wd, bool decoupled, bool maximize, int* counter, cudaStream_t stream,
                               int* launches) {
  const optim::Hyper h = optim::make_hyper(lr, lr_ptr, beta1, beta2, eps, wd, decoupled, maximize);
  return optim::dispatch(dtype, amsgrad, [&](auto p, auto ams) {
    using P = decltype(p);
    constexpr bool A = decltype(ams)::value;
    return version == 1 ? optim::launch_byvalue<P, A, 4096>(ptrs, numel, n, chunk, h, counter, stream, launches)
                        : optim::launch_byvalue<P, A, 32764>(ptrs, numel, n, chunk, h, counter, stream, launches);
  });
}

// v3/v4: size in bytes of the device table (a multiple of 8).
int64_t optim_table_bytes(int version, int dtype, bool amsgrad, const int64_t* numel, int n, int64_t chunk) {
  const int64_t blocks = optim::dispatch(dtype, amsgrad, [&](auto p, auto ams) {
    return optim::table_blocks<decltype(p), decltype(ams)::value>(version, numel, n, chunk, nullptr, nullptr);
  });
  const int64_t tail = version == 3 ? blocks * 8 : blocks * 4;
  return lab::ceil_div(int64_t(sizeof(optim::TableHeader)) + n * int64_t(sizeof(optim::Rec)) + tail, 8) * 8;
}

// v3/v4: fill the host image of the table (optim_table_bytes bytes).
void optim_table_fill(int version, int dtype, bool amsgrad, const void* const* ptrs, const int64_t* numel, int n,
                      int64_t chunk, void* host) {
  using namespace optim;
  int64_t total_quads = 0;
  int qpt = 1;
  const int64_t blocks = dispatch(dtype, amsgrad, [&](auto p, auto ams) {
    return table_blocks<decltype(p), decltype(ams)::value>(version, numel, n, chunk, &total_quads, &qpt);
  });
  std::memset(host, 0, size_t(optim_table_bytes(version, dtype, amsgrad, numel, n, chunk)));
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

// Write `bytes` (a multiple of 8) of host data to device memory with kernel launches on `stream`.
cudaError_t optim_table_upload(void* dev, const void* host, int64_t bytes, cudaStream_t stream, int* launches) {
  using namespace optim;
  const auto* src = static_cast<const unsigned long long*>(host);
  auto* dst = static_cast<unsigned long long*>(dev);
  const int64_t words = bytes / 8;
  auto w = std::make_unique<Words>();
  for (int64_t off = 0; off < words; off += kWords) {
    const int cnt = int(std::min<int64_t>(kWords, words - off));
    std::memcpy(w->w, src + off, size_t(cnt) * 8);
    write_words_kernel<<<1, 1024, 0, stream>>>(*w, dst + off, cnt);
    ++*launches;
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// v3/v4: the step, reading the table at `dev` (uploaded from the image `host`).
cudaError_t optim_adam_table(int dtype, bool amsgrad, const void* dev, const void* host, float lr,
                             const float* lr_ptr, double beta1, double beta2, float eps, float wd, bool decoupled,
                             bool maximize, cudaStream_t stream, int* launches) {
  const optim::Hyper h = optim::make_hyper(lr, lr_ptr, beta1, beta2, eps, wd, decoupled, maximize);
  ++*launches;
  return optim::dispatch(dtype, amsgrad, [&](auto p, auto ams) {
    return optim::launch_table<decltype(p), decltype(ams)::value>(dev, host, h, stream);
  });
}

// The by-value struct of a version: bytes, tensor slots and block slots per launch (for the notebook and tests).
void optim_byvalue_caps(int version, bool amsgrad, int64_t* bytes, int64_t* max_tensors, int64_t* max_blocks) {
  auto set = [&](auto caps) {
    using C = decltype(caps);
    *bytes = sizeof(typename C::Meta);
    *max_tensors = C::kMaxT;
    *max_blocks = C::kMaxB;
  };
  if (version == 1)
    amsgrad ? set(optim::Caps<4096, true>{}) : set(optim::Caps<4096, false>{});
  else
    amsgrad ? set(optim::Caps<32764, true>{}) : set(optim::Caps<32764, false>{});
}
