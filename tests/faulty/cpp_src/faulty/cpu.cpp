// The CPU versions of the faulty test family: one right, two wrong on purpose.
#include <cstdint>

#include "lab_unit.h"

namespace {

void scale_ok(const float* x, float* y, int64_t n) {
  lab::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = 2.0f * x[i];
  });
}

void scale_crash(const float* x, float* y, int64_t n) {
  volatile float* wild = reinterpret_cast<volatile float*>(uintptr_t(64));  // unmapped page: SIGSEGV
  wild[0] = x[0];
  (void)y, (void)n;
}

void scale_hang(const float*, float*, int64_t) {
  volatile bool spin = true;
  while (spin) {
  }
}

}  // namespace

LAB_EXPORTS(LAB_EXPORT("scale_cpu_cpu", scale_ok), LAB_EXPORT("scale_cpu_crash", scale_crash),
            LAB_EXPORT("scale_cpu_hang", scale_hang))
