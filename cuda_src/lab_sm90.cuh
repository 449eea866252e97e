// lab_sm90.cuh — what the Hopper (sm_90a) kernels share (linear v11, sparse24 v4, gru greedy): mbarrier, bulk
// copies, TMA (cp.async.bulk.tensor) and its tensor maps, the wgmma fences and the shared-memory matrix descriptor,
// setmaxnreg, and the operand lists of the 64- and 128-accumulator wgmma shapes. Each device wrapper compiles to
// nothing outside sm_90a (LAB_SM90A, lab_gemm.cuh); the instructions themselves are spelled where they are used
// (linear/wgmma.cuh, sparse24/v4.cu). Background: HOPPER.md in the tool library, and the PTX ISA's wgmma and
// cp.async.bulk(.tensor).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "lab_gemm.cuh"

namespace lab {

// ---- mbarrier: a stage's "full" (TMA bytes landed) and "empty" (consumers done) signals ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_fence_init() {
#ifdef LAB_SM90A
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef LAB_SM90A
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
#endif
}

// ---- bulk copy (cp.async.bulk, no tensor map): `bytes` contiguous bytes global -> shared at dst, completing on bar
// (its transaction count); dst, src and bytes multiples of 16. ----
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}

// ---- TMA: the box at (c0 along the contiguous dimension, c1 along rows) of the tensor map -> shared memory at dst;
// completes on bar (its transaction count). ----
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
#ifdef LAB_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}

// Fetch a tensor map (a kernel parameter) into the TMA unit's descriptor cache ahead of its first copy: the first
// copy through a map otherwise waits for that fetch (kron v5 at batch 32, L2 flushed: 0.1-0.2 us of a ~7.8 us call).
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
#ifdef LAB_SM90A
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// ---- TMA store: shared memory at src -> the box at (c0, c1) of the tensor map, in the calling thread's bulk group.
// The shared memory must be written (generic proxy) and fenced (fence.proxy.async) before; the thread then commits
// the group and waits for it to have read its source (bulk_wait_read) before that memory is written again. ----
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int c1, uint32_t src) {
#ifdef LAB_SM90A
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef LAB_SM90A
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {  // at most N groups still reading their shared source
#ifdef LAB_SM90A
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes to shared memory made visible to the async proxy (wgmma operands, TMA store sources).
__device__ __forceinline__ void fence_proxy_async_smem() {
#ifdef LAB_SM90A
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- wgmma's asynchronous window ----
__device__ __forceinline__ void wgmma_fence() {
#ifdef LAB_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef LAB_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef LAB_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keep the compiler from moving accumulator reads/writes across the asynchronous wgmma window.
template <int N>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- register budgets of producer and consumer warpgroups ----
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef LAB_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef LAB_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

// A 16-byte load from shared memory by its shared-window address: LDS.128, on the short scoreboard (a load through a
// generic pointer is an LD, which waits on the long one).
__device__ __forceinline__ uint4 lds_u32x4(uint32_t saddr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(saddr)
               : "memory");
  return v;
}

// 32-bit shared loads and stores by shared-window address (LDS / STS; kron v4 and v5's element-wise staging).
__device__ __forceinline__ uint32_t lds32(uint32_t saddr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(saddr) : "memory");
  return v;
}
__device__ __forceinline__ void sts32(uint32_t saddr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(saddr), "r"(v) : "memory");
}

// A barrier for `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is __syncthreads'), so that
// the consumer warpgroups can meet without the producer.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- the shared-memory matrix descriptor of a K-major operand in a swizzled layout ----
// Rows of `row_bytes` (128, 64 or 32: the swizzle mode) in groups of 8 rows (the stride between groups, SBO, is
// 8 · row_bytes); the start address in 16-B units; LBO unused for swizzled K-major layouts. The tile's base must be
// aligned to 8 rows (the pattern's repeat), and a k-step inside a row starts k · (step bytes) further.
template <int RowBytes>
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr) {
  static_assert(RowBytes == 128 || RowBytes == 64 || RowBytes == 32, "swizzle modes: 128, 64 or 32 B");
  constexpr uint64_t mode = RowBytes == 128 ? 1 : RowBytes == 64 ? 2 : 3;  // bits 62-63: 1 = 128 B, 2 = 64 B, 3 = 32 B
  return uint64_t((saddr & 0x3FFFF) >> 4)              // start address, 16-B units
         | (uint64_t(1) << 16)                         // leading-dimension byte offset (16 B; unused here)
         | (uint64_t((8 * RowBytes) >> 4) << 32)       // stride byte offset: 8 rows
         | (mode << 62);
}

// ---- tensor maps (host) ----
// cuTensorMapEncodeTiled lives in the driver (libcuda); fetched through the runtime so the module needs no -lcuda.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return EncodeTiled(nullptr);
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A (rows, cols) row-major matrix of elem_size-byte elements as a 2-D tensor map with a (box_rows, box_bytes) box,
// box_bytes (128, 64 or 32) also the swizzle mode; zeros out of bounds. The row stride (cols · elem_size) must be a
// multiple of 16 B and the base 16-B aligned (TMA's rules): false if the driver refuses.
inline bool make_tensor_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int elem_size, int64_t cols,
                            int64_t rows, int box_rows, int box_bytes = 128) {
  const EncodeTiled encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * elem_size};  // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(box_bytes / elem_size), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUtensorMapSwizzle sw = box_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                : box_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                  : CU_TENSOR_MAP_SWIZZLE_32B;
  return encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// make_tensor_map through a small cache: cuTensorMapEncodeTiled costs the host microseconds a call (kron v5 needs
// four a launch: at batch 32 its eager call was host-bound, 40 us against 22.6 us with this cache). A map is a pure
// function of its arguments, so an entry is never stale: a different tensor at a cached address has the same map.
// (linear v11 and sparse24 v4 still encode theirs on every call.)
inline bool cached_tensor_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int elem_size,
                              int64_t cols, int64_t rows, int box_rows, int box_bytes = 128) {
  struct Entry {
    CUtensorMap map;
    const void* base;
    int64_t cols, rows;
    int dtype, elem_size, box_rows, box_bytes, dev;
  };
  constexpr int kEntries = 32;
  static std::mutex mu;
  static Entry cache[kEntries];
  static int used = 0, next = 0;
  int dev = 0;
  cudaGetDevice(&dev);
  {
    std::lock_guard<std::mutex> g(mu);
    for (int i = 0; i < used; ++i) {
      const Entry& e = cache[i];
      if (e.base == base && e.cols == cols && e.rows == rows && e.dtype == int(dtype) && e.elem_size == elem_size &&
          e.box_rows == box_rows && e.box_bytes == box_bytes && e.dev == dev) {
        *map = e.map;
        return true;
      }
    }
  }
  if (!make_tensor_map(map, base, dtype, elem_size, cols, rows, box_rows, box_bytes)) return false;
  std::lock_guard<std::mutex> g(mu);
  cache[next] = Entry{*map, base, cols, rows, int(dtype), elem_size, box_rows, box_bytes, dev};
  next = (next + 1) % kEntries;
  used = used < kEntries ? used + 1 : kEntries;
  return true;
}

}  // namespace lab

// ---- operand lists of the wgmma asm statements: R accumulators "+f"(d[0..R-1]) named %0..%R-1 (R = 64 or 128); the
// operands after them are numbered from %R on. ----
#define LAB_WG_ACC8(d, i)                                                                                            \
  "+f"((d)[(i) + 0]), "+f"((d)[(i) + 1]), "+f"((d)[(i) + 2]), "+f"((d)[(i) + 3]),                                    \
  "+f"((d)[(i) + 4]), "+f"((d)[(i) + 5]), "+f"((d)[(i) + 6]), "+f"((d)[(i) + 7])
#define LAB_WG_ACC64(d)                                                                                              \
  LAB_WG_ACC8(d, 0), LAB_WG_ACC8(d, 8), LAB_WG_ACC8(d, 16), LAB_WG_ACC8(d, 24),                                      \
  LAB_WG_ACC8(d, 32), LAB_WG_ACC8(d, 40), LAB_WG_ACC8(d, 48), LAB_WG_ACC8(d, 56)
#define LAB_WG_ACC128(d) LAB_WG_ACC64(d), LAB_WG_ACC64((d) + 64)
#define LAB_WG_REGS64                                                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LAB_WG_REGS128                                                                                               \
  LAB_WG_REGS64                                                                                                      \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                     \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
