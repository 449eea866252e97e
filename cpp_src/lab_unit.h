// lab_unit.h — what a unit of compilation exports to its family's binding. No torch headers: it is included by the
// CUDA units in cuda_src/<family>/*.cu and by the CPU units in cpp_src/<family>/*.cpp, which must compile in a
// second or two.
//
// Why units: load_inline compiles all of a call's sources as one module, so inside one module every edit recompiled
// the whole family (gru.cu, every version, dtype and template configuration: 25 s on the H100 machine). Now each
// unit (one version, or a few that share a kernel) is its own small load_inline build, loaded with ctypes as a plain
// shared library. It hands its launchers to the family's binding as function pointers through one table:
//
//   LAB_EXPORTS(
//       LAB_EXPORT("square_f32", (basics::square_launch<float>)),
//       LAB_EXPORT("square_f64", (basics::square_launch<double>)))
//
// lab/build.py reads the table (lab_exports), and registers every entry in the binding under its name, or under
// "name@variant" when the unit is built once per variant (see "Variants" below); the binding looks a launcher up by
// that name at the call (lab::launcher<Fn>(name) in lab_common.h). After an edit only the edited unit is rebuilt and
// its new pointers replace the old ones; the binding module and every other unit stay loaded.
//
// Variants: a line `// lab:variants dtype=f32,f16,bf16` in a unit builds it once per value (in parallel), each
// with -DLAB_VARIANT_dtype_f32 (etc.) defined, so one edit recompiles one instantiation per build, not all of them.
// Several axes give their product: `// lab:variants dtype=f32,bf16 rb=2,4` registers "name@f32,2", ...
//
// CPU units: plain C++ on plain pointers. lab::parallel_for below runs a loop on torch's intra-op thread pool (the
// binding hands its at::parallel_for over as a function pointer when the unit is loaded: same threads, same
// torch.set_num_threads), so CPU code needs no ATen header either.
#pragma once

#include <cstdint>

// Shared by every unit and binding, CPU and CUDA alike (nvcc compiles it for host and device).
#if defined(__CUDACC__)
#define LAB_HOST_DEVICE __host__ __device__
#else
#define LAB_HOST_DEVICE
#endif
namespace lab {
LAB_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace lab

extern "C" {
struct LabExport {
  const char* name;
  void* fn;
};

typedef void (*lab_range_fn)(void* ctx, int64_t begin, int64_t end);
// What the binding provides to CPU units. parallel_for runs fn(ctx, lo, hi) over [begin, end) in chunks of at
// least `grain`, on torch's thread pool.
struct LabCpuRuntime {
  void (*parallel_for)(int64_t begin, int64_t end, int64_t grain, lab_range_fn fn, void* ctx);
};
}

#define LAB_UNIT_API extern "C" __attribute__((visibility("default")))

// The export table; entries are LAB_EXPORT("name", function). Every entry's function is a plain-C-typed launcher.
#define LAB_EXPORT(name, ...) LabExport{name, reinterpret_cast<void*>(&__VA_ARGS__)}
// It also defines the hook lab/build.py calls with the binding's CPU runtime right after loading the unit.
#define LAB_EXPORTS(...)                                                                    \
  LAB_UNIT_API int lab_exports(const LabExport** out) {                                     \
    static const LabExport table[] = {__VA_ARGS__};                                         \
    *out = table;                                                                           \
    return int(sizeof(table) / sizeof(table[0]));                                           \
  }                                                                                         \
  LAB_UNIT_API void lab_set_cpu_runtime(const LabCpuRuntime* rt) { lab::cpu_runtime_slot() = rt; }

namespace lab {

// Per unit (unnamed namespace, not a GNU-unique inline static shared by every unit in the process): see launchers()
// in lab_common.h.
namespace {
[[maybe_unused]] const LabCpuRuntime*& cpu_runtime_slot() {
  static const LabCpuRuntime* rt = nullptr;
  return rt;
}
}  // namespace

// f(lo, hi) over [begin, end), on torch's thread pool once the binding handed it over; serially before that.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const LabCpuRuntime* rt = cpu_runtime_slot();
  if (!rt) {
    f(begin, end);
    return;
  }
  rt->parallel_for(
      begin, end, grain, [](void* ctx, int64_t lo, int64_t hi) { (*static_cast<const F*>(ctx))(lo, hi); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace lab

// Marks a CPU unit (documentation only: LAB_EXPORTS defines the runtime hook for every unit).
#define LAB_CPU_UNIT()
