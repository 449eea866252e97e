// rope/cpu.cpp — the C++ CPU version of the rope family (version 0): plain pointers, no torch headers, its own unit,
// so editing it rebuilds this file alone. Rows run on torch's thread pool through lab::parallel_for.
//
// fp16 and bf16 arrive as their bits (the binding passes at::Half / at::BFloat16 storage); the conversions below are
// c10's portable ones (torch/headeronly/util/Half.h: fp16_ieee_to_fp32_value, fp16_ieee_from_fp32_value;
// BFloat16.h: f32_from_bits, round_to_nearest_even), copied so that the results are bit for bit what the
// at::Half / at::BFloat16 casts of the old single-file version gave: exact widening, round-to-nearest-even narrowing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lab_unit.h"

namespace {

struct Half { uint16_t x; };      // IEEE fp16 bits, laid out as at::Half
struct BFloat16 { uint16_t x; };  // bf16 bits (the top half of a float), laid out as at::BFloat16

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

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & UINT32_C(0x80000000);
  const uint32_t two_w = w + w;
  constexpr uint32_t exp_offset = UINT32_C(0xE0) << 23;
  const float exp_scale = fp32_from_bits((uint32_t)15 << 23);  // 0x1.0p-112f
  const float normalized_value = fp32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  constexpr uint32_t magic_mask = UINT32_C(126) << 23;
  constexpr float magic_bias = 0.5f;
  const float denormalized_value = fp32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
  constexpr uint32_t denormalized_cutoff = UINT32_C(1) << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? fp32_to_bits(denormalized_value) : fp32_to_bits(normalized_value));
  return fp32_from_bits(result);
}

inline uint16_t fp16_from_fp32(float f) {
  const float scale_to_inf = fp32_from_bits((uint32_t)239 << 23);   // 0x1.0p+112f
  const float scale_to_zero = fp32_from_bits((uint32_t)17 << 23);   // 0x1.0p-110f
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
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

inline uint16_t bf16_from_fp32(float f) {
  if (std::isnan(f)) return UINT16_C(0x7FC0);
  const uint32_t u = fp32_to_bits(f);
  const uint32_t rounding_bias = ((u >> 16) & 1) + UINT32_C(0x7FFF);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// widen: an element as the arithmetic type's input (exact); narrow<T>: round the result to T once.
inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(Half v) { return fp16_to_fp32(v.x); }
inline float widen(BFloat16 v) { return fp32_from_bits(uint32_t(v.x) << 16); }

template <class T> using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <class T> T narrow(Acc<T> v);
template <> float narrow<float>(float v) { return v; }
template <> double narrow<double>(double v) { return v; }
template <> Half narrow<Half>(float v) { return Half{fp16_from_fp32(v)}; }
template <> BFloat16 narrow<BFloat16>(float v) { return BFloat16{bf16_from_fp32(v)}; }

// ---- CPU version ------------------------------------------------------------------------------------------------
// Rows are independent: split them across threads; inside a row, one pair at a time in fp32 (fp64 for double).
template <class T, class TC>
void rope_cpu(const T* x, T* y, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim, const TC* cos,
              const TC* sin, int64_t offset, bool bshd, bool interleaved, bool inverse) {
  using A = Acc<T>;
  const int64_t half = head_dim / 2, rows = batch * heads * seq;
  const A sign = inverse ? A(-1) : A(1);
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / head_dim);  // ~16K elements per task
  lab::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t s = bshd ? (row / heads) % seq : row % seq;
      const TC* c = cos + (offset + s) * half;
      const TC* sn = sin + (offset + s) * half;
      const T* xr = x + row * head_dim;
      T* yr = y + row * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        const A a = static_cast<A>(widen(xr[ia])), b = static_cast<A>(widen(xr[ib]));
        const A cc = static_cast<A>(widen(c[i])), ss = sign * static_cast<A>(widen(sn[i]));
        yr[ia] = narrow<T>(a * cc - b * ss);
        yr[ib] = narrow<T>(b * cc + a * ss);
      }
    }
  });
}

// The launcher exported, one per (tensor, table) dtype pair: "rope_cpu_<T>_<TC>", e.g. "rope_cpu_bf16_f32". One
// tensor per call (the binding calls it for q, then for k); the tables are float32 or the tensor's dtype.
template <class T, class TC>
void rope_cpu_launch(const void* x, void* y, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                     const void* cos, const void* sin, int64_t offset, bool bshd, bool interleaved, bool inverse) {
  rope_cpu<T, TC>(static_cast<const T*>(x), static_cast<T*>(y), batch, heads, seq, head_dim,
                  static_cast<const TC*>(cos), static_cast<const TC*>(sin), offset, bshd, interleaved, inverse);
}

}  // namespace

LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("rope_cpu_f32_f32", rope_cpu_launch<float, float>),
            LAB_EXPORT("rope_cpu_f16_f32", rope_cpu_launch<Half, float>),
            LAB_EXPORT("rope_cpu_f16_f16", rope_cpu_launch<Half, Half>),
            LAB_EXPORT("rope_cpu_bf16_f32", rope_cpu_launch<BFloat16, float>),
            LAB_EXPORT("rope_cpu_bf16_bf16", rope_cpu_launch<BFloat16, BFloat16>),
            LAB_EXPORT("rope_cpu_f64_f32", rope_cpu_launch<double, float>),
            LAB_EXPORT("rope_cpu_f64_f64", rope_cpu_launch<double, double>))
