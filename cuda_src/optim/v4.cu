// optim/v4.cu — v4: flat: the tensors laid end to end as one index space of quads; a block may span many small
// tensors (the ladder and the napkin math: optim.cuh; the table layout and its host side: optim.cuh; the upload:
// table.cu). Built once per param dtype, so an edit recompiles one kernel pair (amsgrad off/on) per build.
// lab:variants dtype=f32,bf16,f16
#include "optim.cuh"

namespace optim {

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

// v4: blocks of q_per_thread · 512 quads
template <class P, bool AMS>
int64_t v4_blocks(const int64_t* numel, int n, int64_t chunk, int64_t* total_quads, int* qpt) {
  int64_t quads = 0, chunks = 0;
  count_quads_chunks(numel, n, chunk, &quads, &chunks);
  if (total_quads) *total_quads = quads;
  const int q = flat_quads_per_thread<P, AMS>(quads);
  if (qpt) *qpt = q;
  return std::max<int64_t>(1, lab::ceil_div(quads, int64_t(q) * kBlock));
}

// ---- the launchers cpp_src/optim/optim.cpp calls (as "adam_v4@f32", "adam_v4@bf16", ...) --------
// ptrs: n x 6 host array (p, g, m, v, step, vmax); numel: n; all tensors of this unit's param dtype.

// Size in bytes of the device table (a multiple of 8).
int64_t table_bytes_v4(bool amsgrad, const int64_t* numel, int n, int64_t chunk) {
  const int64_t blocks = dispatch_ams(amsgrad, [&](auto ams) {
    return v4_blocks<VariantParam, decltype(ams)::value>(numel, n, chunk, nullptr, nullptr);
  });
  return table_bytes(4, n, blocks);
}

// Fill the host image of the table (table_bytes_v4 bytes).
void table_fill_v4(bool amsgrad, const void* const* ptrs, const int64_t* numel, int n, int64_t chunk, void* host) {
  int64_t total_quads = 0;
  int qpt = 1;
  const int64_t blocks = dispatch_ams(amsgrad, [&](auto ams) {
    return v4_blocks<VariantParam, decltype(ams)::value>(numel, n, chunk, &total_quads, &qpt);
  });
  table_fill(4, ptrs, numel, n, chunk, blocks, total_quads, qpt, host);
}

// The step, reading the table at `dev` (uploaded from the image `host`): adam_table (optim.cuh) with v4's kernel.
struct FlatKernel {
  template <bool AMS> static void launch(const TableView& tv, const Hyper& h, cudaStream_t stream) {
    adam_flat_kernel<VariantParam, AMS><<<tv.hd->blocks, kBlock, 0, stream>>>(
        tv.recs, reinterpret_cast<const int*>(tv.tail), tv.hd->n, tv.hd->total_quads, tv.hd->q_per_thread, h,
        tv.counter);
  }
};

}  // namespace optim

LAB_EXPORTS(LAB_EXPORT("table_bytes_v4", optim::table_bytes_v4), LAB_EXPORT("table_fill_v4", optim::table_fill_v4),
            LAB_EXPORT("adam_v4", optim::adam_table<optim::FlatKernel>))
