// optim/cpu.cpp — the C++ CPU version of the optim family (version 0): plain pointers, no torch headers, its own
// unit, so editing it rebuilds this file alone. The binding (optim.cpp) checks and packs the tensors, reads a tensor
// lr, and calls "adam_cpu_f32" / "adam_cpu_bf16" / "adam_cpu_f16" with one param dtype's pointers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "lab_unit.h"

namespace {

enum Slot { kP = 0, kG, kM, kV, kS, kVmax, kNPtr };  // ptrs: n x kNPtr, as the binding packs them

// bf16 and fp16 params as 16-bit words, converted exactly as c10::BFloat16 / c10::Half convert on the host (IEEE
// round to nearest even; the fp16 code is c10's portable fp16_ieee_*), so results match the at:: types bit for bit.
struct Bf16 {
  uint16_t x;
  operator float() const {
    const uint32_t w = uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &w, sizeof f);
    return f;
  }
  Bf16& operator=(float f) {
    if (std::isnan(f)) {
      x = UINT16_C(0x7FC0);
    } else {
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      const uint32_t rounding_bias = ((u >> 16) & 1) + UINT32_C(0x7FFF);
      x = uint16_t((u + rounding_bias) >> 16);
    }
    return *this;
  }
};

inline float fp32_from_bits(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
inline uint32_t fp32_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof w);
  return w;
}

struct F16 {
  uint16_t x;
  operator float() const {
    const uint32_t w = uint32_t(x) << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    constexpr uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = fp32_from_bits(uint32_t(15) << 23);  // 0x1.0p-112f
    const float normalized_value = fp32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    constexpr uint32_t magic_mask = UINT32_C(126) << 23;
    constexpr float magic_bias = 0.5f;
    const float denormalized_value = fp32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    constexpr uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? fp32_to_bits(denormalized_value) : fp32_to_bits(normalized_value));
    return fp32_from_bits(result);
  }
  F16& operator=(float f) {
    const float scale_to_inf = fp32_from_bits(uint32_t(239) << 23);   // 0x1.0p+112f
    const float scale_to_zero = fp32_from_bits(uint32_t(17) << 23);   // 0x1.0p-110f
    float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = fp32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = fp32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = fp32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    x = uint16_t((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
    return *this;
  }
};
static_assert(sizeof(Bf16) == 2 && sizeof(F16) == 2, "16-bit params");

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
