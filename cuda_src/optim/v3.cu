// optim/v3.cu — v3: the pointer table in device memory, one 512-thread block per 64K-element chunk (the ladder and
// the napkin math: optim.cuh; the table layout and its host side: optim.cuh; the upload: table.cu).
// Built once per param dtype, so an edit recompiles one kernel pair (amsgrad off/on) per build.
// lab:variants dtype=f32,bf16,f16
#include "optim.cuh"

namespace optim {

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

// v3: one block per chunk
int64_t v3_blocks(const int64_t* numel, int n, int64_t chunk, int64_t* total_quads) {
  int64_t chunks = 0;
  count_quads_chunks(numel, n, chunk, total_quads, &chunks);
  return chunks;
}

// ---- the launchers cpp_src/optim/optim.cpp calls (as "adam_v3@f32", "adam_v3@bf16", ...) --------
// ptrs: n x 6 host array (p, g, m, v, step, vmax); numel: n; all tensors of this unit's param dtype.

// Size in bytes of the device table (a multiple of 8).
int64_t table_bytes_v3(bool amsgrad, const int64_t* numel, int n, int64_t chunk) {
  (void)amsgrad;  // v3's table does not depend on it
  int64_t total_quads = 0;
  return table_bytes(3, n, v3_blocks(numel, n, chunk, &total_quads));
}

// Fill the host image of the table (table_bytes_v3 bytes).
void table_fill_v3(bool amsgrad, const void* const* ptrs, const int64_t* numel, int n, int64_t chunk, void* host) {
  (void)amsgrad;
  int64_t total_quads = 0;
  const int64_t blocks = v3_blocks(numel, n, chunk, &total_quads);
  table_fill(3, ptrs, numel, n, chunk, blocks, total_quads, 1, host);
}

// The step, reading the table at `dev` (uploaded from the image `host`): adam_table (optim.cuh) with v3's kernel.
struct TableKernel {
  template <bool AMS> static void launch(const TableView& tv, const Hyper& h, cudaStream_t stream) {
    adam_table_kernel<VariantParam, AMS><<<tv.hd->blocks, kBlock, 0, stream>>>(
        tv.recs, reinterpret_cast<const int2*>(tv.tail), tv.hd->n, tv.hd->chunk, h, tv.counter);
  }
};

}  // namespace optim

LAB_EXPORTS(LAB_EXPORT("table_bytes_v3", optim::table_bytes_v3), LAB_EXPORT("table_fill_v3", optim::table_fill_v3),
            LAB_EXPORT("adam_v3", optim::adam_table<optim::TableKernel>))
