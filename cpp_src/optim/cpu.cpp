// optim/cpu.cpp — the C++ CPU version of the optim family (version 0): plain pointers, no torch headers, its own
// unit, so editing it rebuilds this file alone. The binding (optim.cpp) checks and packs the tensors, reads a tensor
// lr, and calls "adam_cpu_f32" / "adam_cpu_bf16" / "adam_cpu_f16" with one param dtype's pointers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "lab_half.h"
#include "lab_unit.h"

namespace {

enum Slot { kP = 0, kG, kM, kV, kS, kVmax, kNPtr };  // ptrs: n x kNPtr, as the binding packs them

// bf16 and fp16 params as 16-bit words, converted exactly as c10::BFloat16 / c10::Half convert on the host
// (lab_half.h), so results match the at:: types bit for bit.
using Bf16 = lab::BFloat16;
using F16 = lab::Half;

template <class P> inline float to_float(const P& x) { return static_cast<float>(x); }
template <class P> inline void store(P& d, float x) { d = x; }

// ---- the C++ CPU version ----------------------------------------------------------------------------------------
// Same arithmetic as the kernels, in float with IEEE sqrt and division; the bias corrections in double as torch's
// for-loop computes them. Parallel over 64K-element chunks of all tensors; steps are read before and incremented after.
// ptrs: n x kNPtr (p, g, m, v, step, vmax; vmax null without amsgrad); lr: the value (the binding reads a tensor lr).
template <class P>
void adam_cpu(const void* const* ptrs, const int64_t* numel, int n, bool ams, double lr, double beta1, double beta2,
              double eps_d, double wd_d, bool decoupled, bool maximize, int64_t chunk) {
  struct Coef { float step_size, bc2_sqrt, decay; };
  std::vector<Coef> coef(static_cast<size_t>(n));
  std::vector<std::pair<int, int64_t>> work;
  for (int t = 0; t < n; ++t) {
    const double step = double(*static_cast<const float*>(ptrs[size_t(t) * kNPtr + kS])) + 1.0;
    coef[size_t(t)] = {float(lr / (1.0 - std::pow(beta1, step))), float(std::sqrt(1.0 - std::pow(beta2, step))),
                       float(1.0 - lr * wd_d)};
    for (int64_t b = 0; b < numel[t]; b += chunk) work.emplace_back(t, b);
  }
  const float omb1 = float(1.0 - beta1), b2 = float(beta2), omb2 = float(1.0 - beta2), eps = float(eps_d),
              wd = float(wd_d);
  lab::parallel_for(0, int64_t(work.size()), 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int t = work[size_t(w)].first;
      const void* const* ptr = &ptrs[size_t(t) * kNPtr];
      P* p = static_cast<P*>(const_cast<void*>(ptr[kP]));
      const P* g = static_cast<const P*>(ptr[kG]);
      float* m = static_cast<float*>(const_cast<void*>(ptr[kM]));
      float* v = static_cast<float*>(const_cast<void*>(ptr[kV]));
      float* vm = static_cast<float*>(const_cast<void*>(ptr[kVmax]));
      const Coef c = coef[size_t(t)];
      const int64_t begin = work[size_t(w)].second, end = std::min(numel[t], begin + chunk);
      for (int64_t i = begin; i < end; ++i) {
        float gi = to_float(g[i]), pi = to_float(p[i]);
        if (maximize) gi = -gi;
        if (decoupled) {
          pi *= c.decay;
        } else if (wd != 0.f) {
          gi += wd * pi;
        }
        const float mi = m[i] + omb1 * (gi - m[i]);
        const float vi = v[i] * b2 + omb2 * (gi * gi);
        float s = vi;
        if (ams) {
          vm[i] = std::max(vm[i], vi);
          s = vm[i];
        }
        const float denom = std::sqrt(s) / c.bc2_sqrt + eps;
        store(p[i], pi - c.step_size * (mi / denom));
        m[i] = mi;
        v[i] = vi;
      }
    }
  });
  for (int t = 0; t < n; ++t) *static_cast<float*>(const_cast<void*>(ptrs[size_t(t) * kNPtr + kS])) += 1.f;
}

}  // namespace

LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("adam_cpu_f32", adam_cpu<float>), LAB_EXPORT("adam_cpu_bf16", adam_cpu<Bf16>),
            LAB_EXPORT("adam_cpu_f16", adam_cpu<F16>))
