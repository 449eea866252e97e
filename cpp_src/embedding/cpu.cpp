// embedding/cpu.cpp — the C++ CPU version of the embedding family (version 0): plain pointers, no torch headers, its
// own unit, so editing it rebuilds this file alone. Work runs on torch's thread pool through lab::parallel_for.
//
// forward: out[t, :] = weight[idx[t], :], rows split across threads (a row copy is a memcpy: the bits of weight,
// bf16 included, so the output is exact).
// backward: deterministic, in token order: every grad_weight row is owned by one thread (the vocabulary is split in
// ranges), which scans all the indices in order and adds the rows of the tokens that hit its range. Each element is
// a sum in token order in fp32 (fp64 for double), rounded once: the same bits at every thread count.
// bf16 arrives as its bits (at::BFloat16 storage); lab_half.h converts as c10 does.
// The binding checks every index is in [0, V) first; the loops still skip a bad index (NaN row in the forward).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "lab_half.h"
#include "lab_unit.h"

namespace {

using lab::BFloat16;

template <class T> using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <class T> inline Acc<T> widen(T v) { return static_cast<Acc<T>>(static_cast<float>(v)); }
template <> inline double widen<double>(double v) { return v; }
template <class T> inline T narrow(Acc<T> v) { return static_cast<T>(v); }
template <> inline BFloat16 narrow<BFloat16>(float v) { return BFloat16{lab::bf16_from_fp32(v)}; }

template <class I>
inline bool in_range(I n, int64_t num_embeddings) { return n >= 0 && int64_t(n) < num_embeddings; }

// ---- forward ----------------------------------------------------------------------------------------------------
template <class T, class I>
void fwd_cpu(const void* idx_, const void* weight_, void* out_, int64_t tokens, int64_t dim, int64_t num_embeddings) {
  const I* idx = static_cast<const I*>(idx_);
  const T* weight = static_cast<const T*>(weight_);
  T* out = static_cast<T*>(out_);
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(dim, 1));  // ~16K elements per task
  lab::parallel_for(0, tokens, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const I n = idx[t];
      if (in_range(n, num_embeddings)) {
        std::memcpy(out + t * dim, weight + int64_t(n) * dim, size_t(dim) * sizeof(T));
      } else {
        for (int64_t c = 0; c < dim; ++c) out[t * dim + c] = narrow<T>(std::numeric_limits<Acc<T>>::quiet_NaN());
      }
    }
  });
}

// ---- backward ---------------------------------------------------------------------------------------------------
// A thread's range of rows [n0, n1) is accumulated in an Acc buffer of (n1 - n0, dim) (grad_weight itself for fp32
// and fp64), then rounded into grad_weight once.
template <class T, class I>
void bwd_cpu(const void* grad_, const void* idx_, void* gw_, int64_t tokens, int64_t dim, int64_t num_embeddings,
             int64_t padding_idx) {
  using A = Acc<T>;
  const T* grad = static_cast<const T*>(grad_);
  const I* idx = static_cast<const I*>(idx_);
  T* gw = static_cast<T*>(gw_);
  // Each task scans all `tokens` indices; rows per task so that there are at most ~64 tasks (every thread busy, the
  // repeated index scans a small cost beside the row adds).
  const int64_t grain = std::max<int64_t>(1, num_embeddings / 64);
  lab::parallel_for(0, num_embeddings, grain, [&](int64_t n0, int64_t n1) {
    std::vector<A> buf;
    A* acc;
    if constexpr (std::is_same_v<A, T>) {
      acc = gw + n0 * dim;
    } else {
      buf.resize(size_t((n1 - n0) * dim));
      acc = buf.data();
    }
    std::fill(acc, acc + (n1 - n0) * dim, A(0));
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t n = int64_t(idx[t]);
      if (n < n0 || n >= n1 || n == padding_idx) continue;
      A* dst = acc + (n - n0) * dim;
      const T* src = grad + t * dim;
      for (int64_t c = 0; c < dim; ++c) dst[c] += widen(src[c]);
    }
    if constexpr (!std::is_same_v<A, T>) {
      for (int64_t e = 0; e < (n1 - n0) * dim; ++e) gw[n0 * dim + e] = narrow<T>(acc[e]);
    }
  });
}

}  // namespace

#define EMBEDDING_CPU_EXPORTS(fn, prefix)                                                                  \
  LAB_EXPORT(prefix "_f32_i64", fn<float, int64_t>), LAB_EXPORT(prefix "_f32_i32", fn<float, int32_t>),   \
  LAB_EXPORT(prefix "_bf16_i64", fn<BFloat16, int64_t>), LAB_EXPORT(prefix "_bf16_i32", fn<BFloat16, int32_t>), \
  LAB_EXPORT(prefix "_f64_i64", fn<double, int64_t>), LAB_EXPORT(prefix "_f64_i32", fn<double, int32_t>)

// "embedding_fwd_cpu_<T>_<I>": (idx, weight, out, tokens, dim, num_embeddings)
// "embedding_bwd_cpu_<T>_<I>": (grad_out, idx, grad_weight, tokens, dim, num_embeddings, padding_idx (-1: none))
LAB_CPU_UNIT()
LAB_EXPORTS(EMBEDDING_CPU_EXPORTS(fwd_cpu, "embedding_fwd_cpu"), EMBEDDING_CPU_EXPORTS(bwd_cpu, "embedding_bwd_cpu"))
