// lab_half.h — fp16 and bf16 on the host without torch headers, for the CPU units (cpp_src/<family>/cpu.cpp).
//
// The binding hands the CPU units at::Half / at::BFloat16 storage as plain pointers; these two structs have the same
// layout (16-bit words) and convert exactly as c10's host code does, so a CPU unit's results are bit for bit those
// of the at:: types: widening is exact, narrowing rounds to nearest even. The fp16 conversions are c10's portable
// ones (torch/headeronly/util/Half.h: fp16_ieee_to_fp32_value, fp16_ieee_from_fp32_value), the bf16 ones c10's
// BFloat16.h (f32_from_bits, round_to_nearest_even, NaN to the canonical quiet NaN).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace lab {

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
  const uint32_t w = uint32_t(h) << 16;
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

inline uint16_t fp16_from_fp32(float f) {
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
  return uint16_t((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

inline float bf16_to_fp32(uint16_t b) { return fp32_from_bits(uint32_t(b) << 16); }

inline uint16_t bf16_from_fp32(float f) {
  if (std::isnan(f)) return UINT16_C(0x7FC0);
  const uint32_t u = fp32_to_bits(f);
  const uint32_t rounding_bias = ((u >> 16) & 1) + UINT32_C(0x7FFF);
  return uint16_t((u + rounding_bias) >> 16);
}

// The 16-bit element types: read as float (exact), assigned from float (rounded once).
struct Half {
  uint16_t x;
  operator float() const { return fp16_to_fp32(x); }
  Half& operator=(float f) {
    x = fp16_from_fp32(f);
    return *this;
  }
};
struct BFloat16 {
  uint16_t x;
  operator float() const { return bf16_to_fp32(x); }
  BFloat16& operator=(float f) {
    x = bf16_from_fp32(f);
    return *this;
  }
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "laid out as at::Half / at::BFloat16");

}  // namespace lab
