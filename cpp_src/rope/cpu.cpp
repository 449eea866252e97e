// rope/cpu.cpp — the C++ CPU version of the rope family (version 0): plain pointers, no torch headers, its own unit,
// so editing it rebuilds this file alone. Rows run on torch's thread pool through lab::parallel_for.
//
// fp16 and bf16 arrive as their bits (the binding passes at::Half / at::BFloat16 storage); lab_half.h converts them
// as c10 does on the host, so the results are bit for bit what the at::Half / at::BFloat16 casts gave.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lab_half.h"
#include "lab_unit.h"

namespace {

using lab::BFloat16;
using lab::Half;

// widen: an element as the arithmetic type's input (exact); narrow<T>: round the result to T once.
inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(Half v) { return v; }
inline float widen(BFloat16 v) { return v; }

template <class T> using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <class T> T narrow(Acc<T> v);
template <> float narrow<float>(float v) { return v; }
template <> double narrow<double>(double v) { return v; }
template <> Half narrow<Half>(float v) { return Half{lab::fp16_from_fp32(v)}; }
template <> BFloat16 narrow<BFloat16>(float v) { return BFloat16{lab::bf16_from_fp32(v)}; }

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
