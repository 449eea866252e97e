// kron/backward_tc.cu — the backward of the tensor-core versions (3, 4, 5): TF32 on float32 tensors, bf16 with fp32
// accumulators on bfloat16 ones. One mma.sync GEMM kernel, instantiated for the three kinds of step (kron.cuh has
// the algebra; F_K = x, F_{k-1} = F_kᵀ·W_k, dF_0 = dy):
//   F-step  F_{k-1}[b] (P, f) = F_k[b]ᵀ · W_k     rows (b, p), columns j, contraction i — recomputes the states
//   R-step  dF_k[b] (f, P)    = W_k · dF_{k-1}[b]ᵀ rows (b, p), columns i, contraction j
//   dW      dW_k (f, f)       = Σ_b F_k[b] · dF_{k-1}[b]   rows i, columns j, contraction (b, p), split over blocks
// The forward kernels of v3-v5 keep their states on chip and save none, so the backward recomputes F_{K-1} … F_1
// (K-1 F-steps, the forward's cost without its fusion) before the K R-steps and K dW GEMMs. Every dW is split over the
// contraction into per-block fp32 partials, summed in a fixed order by one reduce launch (deterministic, as
// backward.cu). Intermediates are stored in the tensor's dtype (bf16 rounds each state and dF, as cuBLAS-factorwise
// does between its GEMMs; the TF32 build keeps them in fp32 and rounds operands as it stages them).
//
// The kernel: a block owns a BM × BN output tile (128 × 128 with 8 warps of 64 × 32, or 64 × 64 with 4 warps of 32 ×
// 32 where the large tile leaves SMs idle); both operands go through shared memory k-major (A(m, k) at s[k·ld + m], the
// layout mma_sync.cuh's fragment loads take), double-buffered with the next chunk's global loads held in registers
// while the current chunk is multiplied: one barrier per 64-byte-deep chunk. An operand whose memory layout is
// contiguous along m (or n) is copied in 16-byte vectors; one contiguous along k (the R-step's both, dW's A) is
// transposed as it is stored: each thread holds a run of k for one row, and consecutive threads write consecutive
// rows (no bank conflicts). Odd sizes (a dimension not a multiple of the vector, a misaligned view) take element
// loads with per-element bounds; tiles past an edge are zero-filled.
//
// Napkin math (factors 128 × 128, batch 1024, N = 16384): forward + backward = 3 forward-equivalents of FLOPs
// (25.8 GFLOP, 52 us at the dense TF32 rate; bf16 26 us) plus the recomputed state (1 more F-step, 4.3 GFLOP); bytes:
// every step reads and writes a (B, N) tensor: ~7 passes over 67 MB (TF32) — 155 us at the 3.0 TB/s copy probe, so the
// per-step backward is memory-bound at large batch; the fused forward's single pass (v5) does not carry over.
// lab:variants dtype=f32,bf16
#include "kron.cuh"
#include "mma_sync.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace kron {
namespace tcb {

#if defined(LAB_VARIANT_dtype_bf16)
using Elem = __nv_bfloat16;
__device__ __forceinline__ Elem to_elem(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ Elem elem_zero() { return __float2bfloat16_rn(0.f); }
#else
using Elem = float;  // multiplied in TF32
__device__ __forceinline__ Elem to_elem(float v) { return v; }
__device__ __forceinline__ Elem elem_zero() { return 0.f; }
#endif
using M = tc::Mma<Elem>;
constexpr int KS = M::KS, KC = M::KC;        // k per mma (8 TF32, 16 bf16), k per chunk (64 bytes of a row)
constexpr int VW = 16 / int(sizeof(Elem));   // elements per 16-byte vector
constexpr int kPad = 8;                      // row padding of the shared tiles: ld ≡ 8 (mod 32) words (TF32's
                                             // scalar fragment loads), 16 (mod 128) bytes (bf16's ldmatrix rows)

enum Mode { kFStep = 0, kRStep = 1, kDW = 2 };

template <int BM_, int BN_, int WM_, int WN_> struct TileCfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;  // block tile; WM × WN warps
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int MI = BM / WM / 16, NI = BN / WN / 8;     // m16 and n8 tiles per warp
};
using Big = TileCfg<128, 128, 2, 4>;   // warp tile 64 × 32, 64 accumulators a thread
using Small = TileCfg<64, 64, 2, 2>;   // warp tile 32 × 32

struct StepArgs {
  const Elem* a;  // F-step: F_k; R-step: dF_{k-1}; dW: F_k
  const Elem* b;  // F-step, R-step: W_k; dW: dF_{k-1}
  void* c;        // F-step: F_{k-1}; R-step: dF_k (Elem); dW: the partials (float, splits × f × f)
  long rows;      // the GEMM's M: B·P (F-, R-step) or f (dW)
  int cols;       // N: f
  long depth;     // K: f (F-, R-step) or B·P (dW)
  long n;         // elements of a sample, N = f·P
  int f, p;       // the factor's size and P = N / f
  int tiles_n, tiles, splits;
  bool vec_a, vec_b;
};

// Where an operand's element lies. A(r, k): r < rows, k < depth; B(k, j): j < cols. `smp` is a (b, i, q) address of a
// (B, f, P) tensor with (b, q) flattened into one index: F_k read as (f, P) per sample.
__device__ __forceinline__ long smp(long bq, long i, const StepArgs& a) {
  return (bq / a.p) * a.n + i * a.p + bq % a.p;
}
template <int MODE> __device__ __forceinline__ long a_at(long r, long k, const StepArgs& a) {
  if constexpr (MODE == kFStep) return smp(r, k, a);  // F_k[b][i = k][p]: contiguous along r
  else if constexpr (MODE == kRStep) return r * a.f + k;  // dF[b][p][j = k]: contiguous along k
  else return smp(k, r, a);  // F_k[b][i = r][p], k = (b, p): contiguous along k
}
template <int MODE> __device__ __forceinline__ long b_at(long k, long j, const StepArgs& a) {
  if constexpr (MODE == kRStep) return j * a.f + k;  // W[i = j][k]: contiguous along k
  else return k * a.f + j;  // W[k][j] (F-step), dF[b][p][j] with k = (b, p) (dW): contiguous along j
}
template <int MODE> __host__ __device__ constexpr bool a_mn_contig() { return MODE == kFStep; }
template <int MODE> __host__ __device__ constexpr bool b_mn_contig() { return MODE != kRStep; }

// One operand's share of a chunk (R rows × KC of k), held in registers between its global loads and its shared
// stores. Run q of VW elements: along m/n (MN) or along k.
template <int R, int THREADS, bool MN> struct Stager {
  static constexpr int RUNS = R * KC / VW / THREADS;
  static_assert(RUNS * VW * THREADS == R * KC, "a chunk splits evenly into runs");
  uint4 v[RUNS];
  __device__ __forceinline__ static void pos(int i, int& mm, int& kk) {
    const int q = int(threadIdx.x) + i * THREADS;
    if constexpr (MN) kk = q / (R / VW), mm = (q % (R / VW)) * VW;
    else mm = q % R, kk = (q / R) * VW;
  }
  // at(row, k) -> element offset; rows below mn_lim and k below k_lim are inside
  template <class At>
  __device__ __forceinline__ void load(const Elem* base, At&& at, long mn0, long mn_lim, long k0, long k_lim,
                                       bool vec) {
#pragma unroll
    for (int i = 0; i < RUNS; ++i) {
      int mm, kk;
      pos(i, mm, kk);
      const long gm = mn0 + mm, gk = k0 + kk;
      if (vec) {  // the run is all inside or all outside (the limits are multiples of VW), 16-byte aligned
        v[i] = (gm < mn_lim && gk < k_lim) ? __ldg(reinterpret_cast<const uint4*>(base + at(gm, gk)))
                                           : make_uint4(0, 0, 0, 0);
      } else {
        Elem* e = reinterpret_cast<Elem*>(&v[i]);
#pragma unroll
        for (int j = 0; j < VW; ++j) {
          const long em = gm + (MN ? j : 0), ek = gk + (MN ? 0 : j);
          e[j] = (em < mn_lim && ek < k_lim) ? base[at(em, ek)] : elem_zero();
        }
      }
    }
  }
  __device__ __forceinline__ void store(Elem* s, int ld) const {
#pragma unroll
    for (int i = 0; i < RUNS; ++i) {
      int mm, kk;
      pos(i, mm, kk);
      if constexpr (MN) {
        *reinterpret_cast<uint4*>(s + kk * ld + mm) = v[i];
      } else {
        const Elem* e = reinterpret_cast<const Elem*>(&v[i]);
#pragma unroll
        for (int j = 0; j < VW; ++j) s[(kk + j) * ld + mm] = e[j];
      }
    }
  }
};

template <int MODE, class TL>
__global__ void __launch_bounds__(TL::THREADS) step_kernel(const __grid_constant__ StepArgs a) {
  constexpr int BM = TL::BM, BN = TL::BN, LDA = BM + kPad, LDB = BN + kPad, MI = TL::MI, NI = TL::NI;
  __shared__ __align__(16) Elem As[2][KC * LDA];
  __shared__ __align__(16) Elem Bs[2][KC * LDB];
  const int z = int(blockIdx.x) / a.tiles, tile = int(blockIdx.x) % a.tiles;
  const long m0 = long(tile / a.tiles_n) * BM;
  const int n0 = (tile % a.tiles_n) * BN;
  const long nchunks = (a.depth + KC - 1) / KC;
  const long c_lo = nchunks * z / a.splits, c_hi = nchunks * (z + 1) / a.splits;  // this split's chunks
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm = warp / TL::WN, wn = warp % TL::WN;

  auto at_a = [&](long r, long k) { return a_at<MODE>(r, k, a); };
  auto at_b = [&](long j, long k) { return b_at<MODE>(k, j, a); };  // (n, k) like A's (m, k)
  Stager<BM, TL::THREADS, a_mn_contig<MODE>()> sa;
  Stager<BN, TL::THREADS, b_mn_contig<MODE>()> sb;
  auto load = [&](long c) {
    sa.load(a.a, at_a, m0, a.rows, c * KC, a.depth, a.vec_a);
    sb.load(a.b, at_b, n0, a.cols, c * KC, a.depth, a.vec_b);
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  if (c_lo < c_hi) {
    load(c_lo);
    sa.store(As[0], LDA);
    sb.store(Bs[0], LDB);
  }
  __syncthreads();
  for (long c = c_lo; c < c_hi; ++c) {
    const int s = int(c - c_lo) & 1;
    const bool more = c + 1 < c_hi;
    if (more) load(c + 1);  // in flight while this chunk is multiplied
#pragma unroll
    for (int ks = 0; ks < KC; ks += KS) {
      uint32_t af[MI][4], bf[NI / 2][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) M::template load_a<true>(af[i], As[s], LDA, wm * MI * 16 + i * 16, ks, lane);
#pragma unroll
      for (int j = 0; j < NI / 2; ++j) M::load_b2(bf[j], Bs[s], LDB, wn * NI * 8 + j * 16, ks, lane);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) M::mma(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
    }
    if (more) {  // the other stage: every warp finished with it before the last barrier
      sa.store(As[s ^ 1], LDA);
      sb.store(Bs[s ^ 1], LDB);
    }
    __syncthreads();
  }

  // D fragment: c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1) of each 16 × 8 tile
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long r = m0 + wm * MI * 16 + i * 16 + h * 8 + g;
      if (r >= a.rows) continue;
      long base;  // the output row's offset; column j adds j (F-step, dW) or j·P (R-step)
      if constexpr (MODE == kFStep) base = r * a.f;
      else if constexpr (MODE == kRStep) base = smp(r, 0, a);
      else base = long(z) * a.f * a.f + r * a.f;
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + wn * NI * 8 + j * 8 + 2 * t + e;
          if (col >= a.cols) continue;
          const float v = acc[i][j][h * 2 + e];
          if constexpr (MODE == kDW) static_cast<float*>(a.c)[base + col] = v;
          else if constexpr (MODE == kRStep) static_cast<Elem*>(a.c)[base + long(col) * a.p] = to_elem(v);
          else static_cast<Elem*>(a.c)[base + col] = to_elem(v);
        }
    }
}

struct ReduceArgs {
  const float* part[kMaxFactors];
  Elem* out[kMaxFactors];
  int ff[kMaxFactors];  // f_k²
  int splits[kMaxFactors];
};
// dW_k[e] = Σ_z part_k[z][e], z in order (fp32), rounded once to the dtype. grid.y = factor.
__global__ void reduce_kernel(const __grid_constant__ ReduceArgs a) {
  const int k = blockIdx.y, ff = a.ff[k], splits = a.splits[k];
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < ff; e += gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int z = 0; z < splits; ++z) s += a.part[k][long(z) * ff + e];
    a.out[k][e] = to_elem(s);
  }
}

// ---- planning: which tile and how many dW splits (the same answer for the workspace and the launch) --------------
struct StepPlan {
  bool big;
  int tiles_n, tiles, splits;
};
template <class TL> long tiles_of(long rows, int cols) { return ((rows + TL::BM - 1) / TL::BM) * cdiv(cols, TL::BN); }
// F- and R-steps: the 128 × 128 tile where it fills every SM and the factor has more than 64 columns
inline StepPlan plan_step(long rows, int cols, int sms) {
  const bool big = cols > 64 && tiles_of<Big>(rows, cols) >= sms;
  const int bn = big ? Big::BN : Small::BN;
  return {big, cdiv(cols, bn), int(big ? tiles_of<Big>(rows, cols) : tiles_of<Small>(rows, cols)), 1};
}
// dW: split the contraction so that tiles × splits blocks fill two waves, each split at least 4 chunks deep
inline StepPlan plan_dw(long depth, int f, int sms) {
  const long chunks = (depth + KC - 1) / KC;
  auto splits_for = [&](long tiles) {
    long s = (2L * sms + tiles - 1) / tiles;
    s = std::min(s, std::max(1L, chunks / 4));
    return int(std::max(1L, std::min(s, 1024L)));
  };
  const long tb = tiles_of<Big>(f, f), ts = tiles_of<Small>(f, f);
  const bool big = f > 64 && tb * splits_for(tb) >= sms;
  const long tiles = big ? tb : ts;
  return {big, cdiv(f, big ? Big::BN : Small::BN), int(tiles), splits_for(tiles)};
}

template <int MODE, class TL> cudaError_t launch_step(const StepArgs& a, cudaStream_t s) {
  step_kernel<MODE, TL><<<unsigned(long(a.tiles) * a.splits), TL::THREADS, 0, s>>>(a);
  return cudaGetLastError();
}
template <int MODE> cudaError_t launch(StepArgs a, const StepPlan& p, cudaStream_t s) {
  a.tiles_n = p.tiles_n;
  a.tiles = p.tiles;
  a.splits = p.splits;
  return p.big ? launch_step<MODE, Big>(a, s) : launch_step<MODE, Small>(a, s);
}

inline bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline long pad256(long bytes) { return (bytes + 255) / 256 * 256; }

// Workspace bytes: the recomputed states F_1 … F_{K-1}, the dF ping-pong (at most 2), the dW partials.
int64_t workspace_bytes(int64_t B, int64_t N, const int* f, int K) {
  const int sms = device_facts().sms;
  const long state = pad256(B * N * long(sizeof(Elem)));
  long n = long(K - 1) * state + long(std::min(K - 1, 2)) * state;
  for (int k = 0; k < K; ++k) n += pad256(long(plan_dw(B * (N / f[k]), f[k], sms).splits) * f[k] * f[k] * 4);
  return n;
}

cudaError_t backward(const Elem* g, const Elem* x, const Elem* const* w, const int* f, int K, int64_t B, int64_t N,
                     Elem* dx, Elem* const* dw, void* ws, cudaStream_t s) {
  const int sms = device_facts().sms;
  char* p = static_cast<char*>(ws);
  const long state = pad256(B * N * long(sizeof(Elem)));
  Elem* F[kMaxFactors + 1] = {};  // F[k] = the state before W_k is applied (1-based): F[K] = x
  for (int k = 1; k < K; ++k, p += state) F[k] = reinterpret_cast<Elem*>(p);
  F[K] = const_cast<Elem*>(x);
  Elem* dF[2] = {reinterpret_cast<Elem*>(p), reinterpret_cast<Elem*>(p + (K >= 3 ? state : 0))};
  p += long(std::min(K - 1, 2)) * state;

  auto args = [&](const Elem* A, const Elem* Bop, void* C, int fk, bool vec_a, bool vec_b) {
    StepArgs a{};
    a.a = A, a.b = Bop, a.c = C, a.n = N, a.f = fk, a.p = int(N / fk), a.vec_a = vec_a, a.vec_b = vec_b;
    return a;
  };
  if (B > 0) {
    for (int k = K; k >= 2; --k) {  // F_{k-1} = F_kᵀ · W_k
      const int fk = f[k - 1];
      StepArgs a = args(F[k], w[k - 1], F[k - 1], fk, (N / fk) % VW == 0 && al16(F[k]), fk % VW == 0 && al16(w[k - 1]));
      a.rows = B * (N / fk), a.cols = fk, a.depth = fk;
      cudaError_t e = launch<kFStep>(a, plan_step(a.rows, fk, sms), s);
      if (e != cudaSuccess) return e;
    }
  }
  ReduceArgs ra{};
  int max_ff = 1;
  const Elem* D = g;
  for (int k = 1; k <= K; ++k) {
    const int fk = f[k - 1];
    const long P = N / fk;
    const StepPlan pd = plan_dw(B * P, fk, sms);
    ra.part[k - 1] = reinterpret_cast<const float*>(p);
    ra.out[k - 1] = dw[k - 1];
    ra.ff[k - 1] = fk * fk;
    ra.splits[k - 1] = B > 0 ? pd.splits : 0;
    max_ff = std::max(max_ff, fk * fk);
    if (B > 0) {
      StepArgs a = args(F[k], D, p, fk, P % VW == 0 && al16(F[k]), fk % VW == 0 && al16(D));
      a.rows = fk, a.cols = fk, a.depth = B * P;
      cudaError_t e = launch<kDW>(a, pd, s);
      if (e != cudaSuccess) return e;
      Elem* out = k == K ? dx : dF[(k - 1) & 1];
      StepArgs r = args(D, w[k - 1], out, fk, fk % VW == 0 && al16(D), fk % VW == 0 && al16(w[k - 1]));
      r.rows = B * P, r.cols = fk, r.depth = fk;
      e = launch<kRStep>(r, plan_step(r.rows, fk, sms), s);
      if (e != cudaSuccess) return e;
      D = out;
    }
    p += pad256(long(pd.splits) * fk * fk * 4);
  }
  dim3 grid(unsigned(std::min(cdiv(max_ff, 256), 4 * sms)), unsigned(K));
  reduce_kernel<<<grid, 256, 0, s>>>(ra);
  return cudaGetLastError();
}

}  // namespace tcb
}  // namespace kron

// ---- what the binding calls ("kron_tc_backward@f32", "kron_tc_backward@bf16", ...) ---------------------------------
//   kron_tc_backward: cudaError_t (const T* g, const T* x, const T* const* w, const int* f, int K, int64_t B,
//                                  int64_t N, T* dx, T* const* dw, void* ws, cudaStream_t)   (T: float (TF32), bf16)
//   kron_tc_backward_workspace: int64_t (int64_t B, int64_t N, const int* f, int K), in bytes
LAB_EXPORTS(LAB_EXPORT("kron_tc_backward", kron::tcb::backward),
            LAB_EXPORT("kron_tc_backward_workspace", kron::tcb::workspace_bytes))
