// gru/proj.cu — the input projection x W_ih^T of v3..v6 when it has few rows (the fp32 encoder at batch 1..4: T*B
// rows of x), with the persistent kernels' step counters zeroed in the same launch ("gru_proj").
//
// Why a kernel of our own for a GEMM cuBLAS already does: at batch 1 (x: 30 x 256, W_ih: 1536 x 256, fp32) the
// whole projection is 11.8 MFLOP and 1.6 MB of W_ih, ~0.4 us of the chip's FMA pipes and ~0.5 us of HBM, but
// cuBLAS runs it as a 32x32-tile GEMM split over K plus a separate reduction kernel (~3.9 + ~2.8 us under Nsight
// Compute, results/<device>/ncu.csv), and the counters' fill is a third kernel (~1 us) before the persistent one;
// in a CUDA graph each kernel boundary adds a gap of its own (73.4 us of kernels, ~80 us replayed). One kernel that
// splits K inside the block (no second pass) and zeroes the counters removes two kernels and their gaps.
//
// The tiling (napkin math for the batch-1 encoder, M = 30, N = 1536, K = 256):
//   - a block owns a 32 x 32 output tile: N/32 = 48 blocks at batch 1, (M/32) x 48 = 192 at batch 4 (M = 120).
//   - K goes in chunks of 32 through a ring of 8 in shared memory, filled with cp.async (16-byte copies where rows
//     are 16-byte aligned; element loads otherwise): K = 256 is in flight at once, one wait and one barrier.
//   - the 512 threads are 8 k-groups of 64; group g takes k quad g of every chunk and each thread 4 x 4 outputs.
//     Per quad a thread does 8 shared loads (16 bytes each) for 64 FMAs.
//   - the groups' partial sums meet in shared memory (32 KB, over the ring) and are added in a fixed order: the
//     result does not depend on timing. Each output is a sum of 8 fp32 FMA chains of K/8 terms.
// What the H100 measured (graph replay of the projection alone, L2 flushed, against cuBLAS's GEMM plus the fill it
// replaces; ncu at base clocks):
//   - with two buffers instead of the ring (one memory round trip a chunk): 9.6 us at batch 1; the ring: 8.6 us,
//     against cuBLAS + fill 12.5 us. Ahead of cuBLAS up to M ~ 120, behind from M = 240 (17.7 against 16.0 us).
//   - ncu, batch 1: the 48 busy SMs' L1/shared pipe is saturated (L1/TEX throughput 45% of the whole chip's with
//     48 of 132 SMs busy): at 4 x 4 outputs a thread, 2 FMAs per float read from shared memory, the LDS
//     wavefronts, not the FMAs, bound a block. 32 x 16 tiles (96 blocks, 16 k-groups of one warp) tied at batch 1
//     (8.5 us; ncu 7.9 against 9.3 us) and lost from M = 60 (10.8 against 9.0 us): the same LDS work per output.
//   - fp16/bf16: cuBLAS's tensor-core GEMM plus the fill takes 7.2-7.9 us at every M up to 480, ahead of this
//     kernel everywhere (8.1-9.4 us at batch 1), so the binding keeps cuBLAS for them.
// The binding (cpp_src/gru/gru.cpp, kOwnProjRows) uses this kernel for float32 up to 128 rows and cuBLAS otherwise.
#include "gru.cuh"
#include "lab_gemm.cuh"

namespace gru {

constexpr int kPM = 32, kPN = 32;      // output tile: kPM rows of x by kPN rows of W
constexpr int kPThreads = 512;
constexpr int kPGroup = (kPM / 4) * (kPN / 4);  // threads of one k-group, 4 x 4 outputs each: 64, two warps
constexpr int kPG = kPThreads / kPGroup;        // k-groups, one 4-wide k quad of each chunk apiece: 8
constexpr int kPK = 4 * kPG;                    // chunk of K: 32
constexpr int kPStages = 256 / kPK;             // chunks in flight: K = 256 at once

// Row stride of a tile in elements: one 16-byte copy of padding, so row r starts 4 (fp32: 36 floats) or 20 (16-bit:
// 40 elements, 80 bytes) banks after row r-1 and keeps 16-byte alignment for cp.async.
template <class T> constexpr int proj_ld() { return kPK + 16 / int(sizeof(T)); }
// Dynamic shared memory: the ring of kPStages (x, w) tile pairs, or the groups' partial sums (kPG x kPM x kPN fp32)
// after the last chunk, whichever is larger (fp32: 73.7 KB of tiles; 16-bit: 40.9 KB; sums: 32 KB).
template <class T> constexpr int proj_smem() {
  return kPStages * (kPM + kPN) * proj_ld<T>() * int(sizeof(T)) > kPG * kPM * kPN * 4
             ? kPStages * (kPM + kPN) * proj_ld<T>() * int(sizeof(T))
             : kPG * kPM * kPN * 4;
}

// One chunk of K (k0 .. k0 + kPK) of x's tile rows and W's tile rows into tiles xs / ws. Out-of-range rows and k
// are zeros, so the tail chunk and the edge tiles need no other guard.
template <class T, bool Vec>
__device__ __forceinline__ void proj_load(T* xs, T* ws, const T* x, const T* w, int m0, int n0, int M, int N, int K,
                                          int k0) {
  constexpr int ld = proj_ld<T>();
  if constexpr (Vec) {  // K % E == 0 and both bases 16-byte aligned: every copy is all in or all out
    constexpr int E = 16 / int(sizeof(T)), CPR = kPK / E;  // elements a copy, copies a row
    for (int c = threadIdx.x; c < (kPM + kPN) * CPR; c += kPThreads) {
      const bool isw = c >= kPM * CPR;
      const int r = isw ? c / CPR - kPM : c / CPR, q = c % CPR, row = (isw ? n0 : m0) + r, k = k0 + q * E;
      const T* base = isw ? w : x;
      const bool in = row < (isw ? N : M) && k < K;
      lab::cp_async16(lab::smem_u32((isw ? ws : xs) + r * ld + q * E), in ? base + int64_t(row) * K + k : base,
                      in ? 16 : 0);
    }
  } else {  // element by element, synchronous (odd K or unaligned views)
    for (int e = threadIdx.x; e < (kPM + kPN) * kPK; e += kPThreads) {
      const bool isw = e >= kPM * kPK;
      const int r = isw ? e / kPK - kPM : e / kPK, kk = e % kPK, row = (isw ? n0 : m0) + r, k = k0 + kk;
      const T* base = isw ? w : x;
      (isw ? ws : xs)[r * ld + kk] = row < (isw ? N : M) && k < K ? base[int64_t(row) * K + k] : from_f<T>(0.f);
    }
  }
}

// out (M, N) fp32 = x (M, K) @ w (N, K)^T; zero[0 .. nzero) = 0.
template <class T, bool Vec>
__global__ void __launch_bounds__(kPThreads) proj_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                         float* __restrict__ out, int M, int N, int K,
                                                         int* __restrict__ zero, int nzero) {
  constexpr int ld = proj_ld<T>(), kStage = (kPM + kPN) * ld;
  extern __shared__ float4 proj_smem4[];
  T* tiles = reinterpret_cast<T*>(proj_smem4);  // [kPStages][kPM rows of x, then kPN rows of W][ld]
  const int tid = threadIdx.x;
  // The persistent kernel launched after this one (early: cooperative.cuh) may start now, on the SMs this grid leaves
  // free, and load its weights; it reads out and zero only after this grid has finished (griddepcontrol.wait).
  lab::pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * kPThreads + tid; i < nzero; i += int64_t(gridDim.x) * kPThreads) zero[i] = 0;

  const int tiles_n = max(1, int(lab::ceil_div(N, kPN)));
  const int m0 = int(blockIdx.x / tiles_n) * kPM, n0 = int(blockIdx.x % tiles_n) * kPN;
  // k-group g is warps 2g, 2g+1; a thread owns rows tm + 8i of x and tn + 8j of W (i, j < 4): a warp's reads of
  // one k quad hit 4 rows of x and 8 of W, 4 banks apart, one wavefront each
  const int g = tid / kPGroup, tm = (tid % kPGroup) / (kPN / 4), tn = tid % (kPN / 4);
  float acc[4][4] = {};

  // A ring of kPStages chunks: all of them are requested before the first is multiplied, so the block pays one
  // memory latency rather than one a chunk (with two buffers, 8 chunks cost ~8 round trips: 9.6 us at batch 1).
  // One commit group a chunk (empty past the end): at chunk c, the groups of c .. c+kPStages-1 are outstanding.
  const int nc = int(lab::ceil_div(K, kPK));
  for (int c = 0; c < kPStages; ++c) {
    if (c < nc) proj_load<T, Vec>(tiles + c * kStage, tiles + c * kStage + kPM * ld, x, w, m0, n0, M, N, K, c * kPK);
    lab::cp_async_commit();
  }
  const bool ring = nc > kPStages;  // else every chunk has its own slot: one wait and one barrier for all of them
  for (int c = 0; c < nc; ++c) {
    const T* xs = tiles + (c % kPStages) * kStage;
    if (ring) {
      lab::cp_async_wait<kPStages - 1>();  // chunk c has landed
      __syncthreads();
    } else if (c == 0) {
      lab::cp_async_wait<0>();
      __syncthreads();
    }
    float4 a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = ld4(xs + (tm + 8 * i) * ld + 4 * g);
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = ld4(xs + (kPM + tn + (kPN / 4) * j) * ld + 4 * g);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
        acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
        acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
        acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
      }
    if (ring) {
      __syncthreads();  // every group is done with this slot before chunk c + kPStages's copies overwrite it
      if (c + kPStages < nc) {
        T* nx = tiles + (c % kPStages) * kStage;
        proj_load<T, Vec>(nx, nx + kPM * ld, x, w, m0, n0, M, N, K, (c + kPStages) * kPK);
      }
      lab::cp_async_commit();
    }
  }
  lab::cp_async_wait<0>();  // (only empty groups are left)
  __syncthreads();          // all reads of the ring are done before the partial sums overwrite it
  float* red = reinterpret_cast<float*>(proj_smem4);  // [kPG][kPM][kPN], over the ring (its reads are done)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) red[(g * kPM + tm + 8 * i) * kPN + tn + (kPN / 4) * j] = acc[i][j];
  __syncthreads();
  for (int o = tid; o < kPM * kPN; o += kPThreads) {
    const int m = m0 + o / kPN, n = n0 + o % kPN;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < kPG; ++q) s += red[q * kPM * kPN + o];
    if (m < M && n < N) out[int64_t(m) * N + n] = s;
  }
}

template <class T>
cudaError_t proj_launch(const void* x, const void* w, float* out, int M, int N, int K, int* zero, int nzero,
                        cudaStream_t stream) {
  // One block at least, so the counters are zeroed even with nothing to multiply.
  const int64_t n = lab::ceil_div(M, kPM) * lab::ceil_div(N, kPN), tiles = n > 0 ? n : 1;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  const bool vec = K % (16 / int(sizeof(T))) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  const T *xp = static_cast<const T*>(x), *wp = static_cast<const T*>(w);
  constexpr int smem = proj_smem<T>();
  auto* kernel = vec ? proj_kernel<T, true> : proj_kernel<T, false>;
  static bool opted[2][64] = {};  // above 48 KB a kernel opts in, once per device
  int dev = 0;
  if (smem > 48 * 1024 && cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < 64 && !opted[vec][dev]) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    opted[vec][dev] = true;
  }
  kernel<<<unsigned(tiles), kPThreads, smem, stream>>>(xp, wp, out, M, N, K, zero, nzero);
  return cudaGetLastError();
}

}  // namespace gru

// Launcher (cpp_src/gru/gru.cpp): dtype 0 float32, 1 float16, 2 bfloat16 (x and w); out (M, N) fp32, contiguous;
// zero: nzero ints set to 0 (the step counters of the launch that follows), or nullptr.
cudaError_t gru_proj(int dtype, const void* x, const void* w, float* out, int M, int N, int K, int* zero, int nzero,
                     cudaStream_t stream) {
  using namespace gru;
  switch (dtype) {
    case kF32: return proj_launch<float>(x, w, out, M, N, K, zero, nzero, stream);
    case kF16: return proj_launch<__half>(x, w, out, M, N, K, zero, nzero, stream);
    case kBF16: return proj_launch<__nv_bfloat16>(x, w, out, M, N, K, zero, nzero, stream);
    default: return cudaErrorInvalidValue;
  }
}

LAB_EXPORTS(LAB_EXPORT("gru_proj", gru_proj))
