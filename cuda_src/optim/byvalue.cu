// optim/byvalue.cu — v1, v2: the pointer table passed by value, as many launches as it takes (the ladder and the
// napkin math: optim.cuh). One kernel template; this unit is built once per version, so each build instantiates
// one struct size (3 param dtypes x amsgrad).
// lab:variants version=v1,v2
#include "optim.cuh"

namespace optim {

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

#if defined(LAB_VARIANT_version_v1)
constexpr int kLimit = 4096;    // v1: the classic 4 KB kernel-parameter limit
#elif defined(LAB_VARIANT_version_v2)
constexpr int kLimit = 32764;   // v2: the limit of CUDA 12.1+ on Volta and newer
#else
#error "byvalue.cu is built once per version: // lab:variants version=v1,v2"
#endif

// ---- the launchers cpp_src/optim/optim.cpp calls (as "adam_byvalue@v1", "byvalue_caps@v2", ...) -----------------
// ptrs: n x 6 host array (p, g, m, v, step, vmax); numel: n; all tensors of one param dtype, on the current device.

// v1 (4 KB struct) or v2 (32764-byte struct), by value; *launches counts the kernels issued.
cudaError_t adam_byvalue(int dtype, bool amsgrad, const void* const* ptrs, const int64_t* numel, int n,
                         int64_t chunk, float lr, const float* lr_ptr, double beta1, double beta2, float eps, float wd,
                         bool decoupled, bool maximize, int* counter, cudaStream_t stream, int* launches) {
  const Hyper h = make_hyper(lr, lr_ptr, beta1, beta2, eps, wd, decoupled, maximize);
  return dispatch(dtype, amsgrad, [&](auto p, auto ams) {
    using P = decltype(p);
    constexpr bool A = decltype(ams)::value;
    return launch_byvalue<P, A, kLimit>(ptrs, numel, n, chunk, h, counter, stream, launches);
  });
}

// The by-value struct of this version: bytes, tensor slots and block slots per launch (for the notebook and tests).
void byvalue_caps(bool amsgrad, int64_t* bytes, int64_t* max_tensors, int64_t* max_blocks) {
  auto set = [&](auto caps) {
    using C = decltype(caps);
    *bytes = sizeof(typename C::Meta);
    *max_tensors = C::kMaxT;
    *max_blocks = C::kMaxB;
  };
  amsgrad ? set(Caps<kLimit, true>{}) : set(Caps<kLimit, false>{});
}

}  // namespace optim

LAB_EXPORTS(LAB_EXPORT("adam_byvalue", optim::adam_byvalue), LAB_EXPORT("byvalue_caps", optim::byvalue_caps))
