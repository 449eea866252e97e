// kron/v2_plan.cu — version 2's planner and launch: which block configuration and slice width c (plan_fused, a small
// cost model; kron.tune() times the alternatives), whether the fused kernel fits at all (where it does not, and for
// K = 1, the binding runs v1.cu's forward instead), and the kernel's arguments. The kernels themselves are v2.cu's
// builds, one per configuration, handed over by the binding (FusedKernels, kron.cuh).
// lab:variants dtype=f32,f64
#include "kron.cuh"
#include "plan_info.h"

#include <vector>

namespace kron {

// ---- v2 planning: which configuration and slice width c --------------------------------------------------------
struct FusedPlan {
  bool ok = false;
  int cfg = -1, c = 0, nslices = 0, buf_elems = 0, nbuf = 0, ldA = 0, ldB = 0, blocks_per_sm = 0;
  long smem = 0;
  double cost = 0;
};

// Shared memory and tiling of one (cfg, c) choice; ok = false when it does not fit.
template <class T> FusedPlan fused_layout(long N, const int* f, int K, int cfg, int c) {
  constexpr int KC = chunk_k<T>(), VW = Vec<T>::n;
  FusedPlan p;
  p.cfg = cfg;
  p.c = c;
  const CfgShape cs = cfg_shape<T>(cfg);
  const int th = cs.threads, tm = cs.tm, tn = cs.tn;
  const int fK = f[K - 1];
  const long S = (N / fK) * c;
  if (S > (1L << 28)) return p;
  const Layout L1 = make_layout(th, tm, tn, c);
  int bq = L1.bq;
  for (int s = 2; s <= K; ++s) bq = std::max(bq, make_layout(th, tm, tn, f[K - s]).bq);
  p.ldA = L1.bp + VW;
  p.ldB = bq + VW;
  p.nbuf = K >= 3 ? 2 : 1;
  p.buf_elems = int((S + kTile + 3) / 4 * 4);  // + slack: tile rows past the state's end are read, never stored
  p.nslices = cdiv(fK, c);
  p.smem = long(sizeof(T)) * (2L * KC * p.ldA + 2L * KC * p.ldB + long(p.nbuf) * p.buf_elems);
  p.ok = p.smem <= device_facts().smem_optin;
  return p;
}

// Estimated time (clock cycles) of a plan: the busiest SM's FMA slots (padding included, derated for small
// register tiles and few resident warps) against its share of L2 reads (each slice re-reads x[b] and the factors).
template <class T> double fused_cost(FusedPlan& p, long B, long N, const int* f, int K) {
  const DeviceFacts dev = device_facts();
  const CfgShape cs = cfg_shape<T>(p.cfg);
  const int th = cs.threads, tm = cs.tm, tn = cs.tn;
  const int fK = f[K - 1];
  const long P1 = N / fK;
  const long S = P1 * p.c;
  double work = 0;
  {
    const Layout L = make_layout(th, tm, tn, p.c);
    work += double(cdiv(int(P1), L.bp)) * cdiv(p.c, L.bq) * L.bp * L.bq * fK;
  }
  double wbytes = double(fK) * p.c;
  for (int s = 2; s <= K; ++s) {
    const int fs = f[K - s];
    const Layout L = make_layout(th, tm, tn, fs);
    work += double(cdiv(int(S / fs), L.bp)) * cdiv(fs, L.bq) * L.bp * L.bq * fs;
    wbytes += double(fs) * fs;
  }
  const long blocks = B * p.nslices;
  const long per_sm = (blocks + dev.sms - 1) / dev.sms;
  const long resident = std::min<long>(std::max(p.blocks_per_sm, 1), per_sm);
  const double warps = double(resident) * th / 32;
  const double eff = (tm * tn == 64 ? 1.0 : 0.75) * std::min(1.0, warps / 8.0);
  const double t_fma = double(per_sm) * work / (128.0 * eff);
  const double t_l2 = double(per_sm) * (double(N) + wbytes) * sizeof(T) / 24.0;  // ~24 B/clk/SM from L2
  return std::max(t_fma, t_l2);
}

// kern: the three configurations' kernels (v2.cu). Their addresses are part of the cache key: a rebuilt v2.cu is
// loaded at new addresses (and may use other registers, so other occupancy), and is planned afresh.
template <class T> FusedPlan search_fused(long B, long N, const int* f, int K, int force_cfg, int force_c,
                                          const FusedKernels<T>& kern) {
  FusedPlan best;
  if (K >= 2) {
    const int fK = f[K - 1];
    std::vector<int> cs;
    if (force_c > 0) {
      cs.push_back((force_c + 3) / 4 * 4);
    } else {
      for (int n = 1; n <= fK; n *= 2) {
        const int c = (cdiv(fK, n) + 3) / 4 * 4;
        if (cs.empty() || cs.back() != c) cs.push_back(c);
        if (c == 4) break;
      }
    }
    for (int cfg = 0; cfg < kConfigs; ++cfg) {
      if (force_cfg >= 0 && cfg != force_cfg) continue;
      for (int c : cs) {
        FusedPlan p = fused_layout<T>(N, f, K, cfg, c);
        if (!p.ok) continue;
        const int bps = kern.occupancy[cfg](size_t(p.smem));  // opts the kernel into the full shared memory first
        if (bps <= 0) continue;
        p.blocks_per_sm = bps;
        p.cost = fused_cost<T>(p, B, N, f, K);
        if (!best.ok || p.cost < best.cost * 0.999) best = p;
      }
    }
  }
  return best;
}
template <class T> FusedPlan plan_fused(long B, long N, const int* f, int K, int force_cfg, int force_c,
                                        const FusedKernels<T>& kern) {
  static PlanCache<FusedPlan> cache;
  std::vector<long> key = {long(sizeof(T)), B, N, K, force_cfg, force_c};
  key.insert(key.end(), f, f + K);
  for (int cfg = 0; cfg < kConfigs; ++cfg) key.push_back(long(reinterpret_cast<uintptr_t>(kern.occupancy[cfg])));
  return cache.get(std::move(key), [&] { return search_fused<T>(B, N, f, K, force_cfg, force_c, kern); });
}

template <class T>
cudaError_t fused(const T* x, T* y, const T* const* w, const int* f, int K, long B, long N, T* const* states,
                  const FusedPlan& p, const FusedKernels<T>& kern, cudaStream_t s) {
  constexpr int VW = Vec<T>::n;
  FusedArgs<T> a{};
  a.x = x;
  a.y = y;
  a.N = N;
  a.K = K;
  a.c = p.c;
  a.nslices = p.nslices;
  a.buf_elems = p.buf_elems;
  a.ldA = p.ldA;
  a.ldB = p.ldB;
  a.wvec = 0;
  for (int k = 0; k < K; ++k) {
    a.w[k] = w[k];
    a.f[k] = f[k];
    if (f[k] % VW == 0 && aligned16(w[k])) a.wvec |= 1u << k;
  }
  // save[s] = F_{K-s} = states[K-s-1]
  for (int st = 1; st < K; ++st) a.save[st] = states ? states[K - st - 1] : nullptr;
  const long P1 = N / f[K - 1];
  a.vec_x = P1 % VW == 0 && N % VW == 0 && aligned16(x);
  a.vec_y = f[0] % VW == 0 && aligned16(y);
  const long blocks = B * p.nslices;
  if (blocks > 0x7fffffffL) return cudaErrorInvalidConfiguration;
  return kern.launch[p.cfg](&a, unsigned(blocks), size_t(p.smem), s);  // cfg_shape<T>(p.cfg).threads threads
}

// The forward of version 2 where plan_fused says it fits (the binding asks kron_fused_plan first and runs v1.cu's
// forward where it does not); states: null, or the K-1 intermediate states to save for the backward.
template <class T>
cudaError_t fused_forward(const T* x, T* y, const T* const* w, const int* f, int K, long B, long N, T* const* states,
                          int cfg, int cols, const FusedKernels<T>* kern, cudaStream_t s) {
  if (B == 0 || N == 0) return cudaSuccess;
  const FusedPlan p = plan_fused<T>(B, N, f, K, cfg, cols, *kern);
  if (!p.ok) return cudaErrorInvalidConfiguration;
  return fused(x, y, w, f, K, B, N, states, p, *kern, s);
}

// What v2 would launch, as the kPlanFields numbers the binding's fused_plan returns by name (plan_info.h).
template <class T>
void fused_plan_info(int64_t B, int64_t N, const int* f, int K, int cfg, int cols, const FusedKernels<T>* kern,
                     int64_t* info) {
  const FusedPlan p = plan_fused<T>(B, N, f, K, cfg, cols, *kern);
  const CfgShape cs = cfg_shape<T>(p.ok ? p.cfg : 0);
  info[kFits] = p.ok;
  info[kCfg] = p.cfg;
  info[kC] = p.c;
  info[kSlices] = p.nslices;
  info[kSmemBytes] = p.smem;
  info[kBlocksPerSm] = p.blocks_per_sm;
  info[kThreads] = cs.threads;
  info[kTM] = cs.tm;
  info[kTN] = cs.tn;
  info[kCost] = int64_t(p.cost);
  info[kSmemLimit] = device_facts().smem_optin;
  info[kStages] = 2;
}

}  // namespace kron

// ---- the launchers cpp_src/kron/kron.cpp calls ("kron_v2_forward@f32", ...) -----------------------------------------
//   kron_v2_forward: cudaError_t (const T* x, T* y, const T* const* w, const int* f, int K, int64_t B, int64_t N,
//                                 T* const* states, int cfg, int cols, const FusedKernels<T>* kern, cudaStream_t)
//   kron_fused_plan: void (int64_t B, int64_t N, const int* f, int K, int cfg, int cols, const FusedKernels<T>* kern,
//                          int64_t* info /* [kPlanFields] */)
LAB_EXPORTS(LAB_EXPORT("kron_v2_forward", kron::fused_forward<kron::Real>),
            LAB_EXPORT("kron_fused_plan", kron::fused_plan_info<kron::Real>))
