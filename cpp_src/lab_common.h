// lab_common.h — what every cpp_src/<family>.cpp shares: the torch headers it needs, named input checks, and the
// plumbing to call a CUDA launcher on the current stream and check what it returns, and lab::bind for m.def.
//
// Why not <torch/extension.h>: it pulls in the whole C++ frontend (torch/all.h) and doubles the compile time of a
// binding (41 s -> 20 s on a 2-core box). We need tensors, at::parallel_for, pybind11 and torch's exception mapping.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 casters for at::Tensor

#include "lab_unit.h"

#include <cstdint>
#include <initializer_list>
#include <unordered_map>
#include <optional>
#include <cstdio>
#include <type_traits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#ifdef LAB_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace lab {
template <class... Args>
std::string cat(const Args&... args);
}  // namespace lab

#define LAB_CHECK_VALUE(cond, ...) \
  do {                              \
    if (!(cond)) throw ::pybind11::value_error(::lab::cat(__VA_ARGS__)); \
  } while (0)
#define LAB_CHECK_TYPE(cond, ...) \
  do {                             \
    if (!(cond)) throw ::pybind11::type_error(::lab::cat(__VA_ARGS__)); \
  } while (0)
#define LAB_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) throw ::std::runtime_error(::lab::cat(__VA_ARGS__)); \
  } while (0)

namespace lab {

// Text for messages, built with snprintf and std::string appends only (no iostreams, no std::to_string): on the
// H100 box (torch 2.11, g++ 13.3) integer formatting through iostreams inside an extension, and std::to_string +
// operator+, crashed the process (see "binding" below).
inline std::string num(long long v) {
  char b[32];
  std::snprintf(b, sizeof b, "%lld", v);
  return b;
}
inline std::string num(double v) {
  char b[48];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

inline std::string shape_str(at::IntArrayRef s) {
  std::string o = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) o += ", ";
    o += num(static_cast<long long>(s[i]));
  }
  o += (s.size() == 1 ? ",)" : ")");
  return o;
}

// ---- named checks: each message names the argument and says what was expected --------------------------------
inline void check_defined(const at::Tensor& t, const char* name) {
  LAB_CHECK_VALUE(t.defined(), name, " must be a tensor, got None");
}

inline void check_dtype(const at::Tensor& t, const char* name, std::initializer_list<at::ScalarType> ok) {
  check_defined(t, name);
  for (auto d : ok)
    if (t.scalar_type() == d) return;
  std::string o;
  for (auto d : ok) {
    if (!o.empty()) o += " or ";
    o += c10::toString(d);
  }
  LAB_CHECK_TYPE(false, name, " must be ", o, ", got ", c10::toString(t.scalar_type()));
}

inline void check_same_dtype(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  LAB_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), name, " must have the same dtype as ", ref_name, " (",
                   c10::toString(ref.scalar_type()), "), got ", c10::toString(t.scalar_type()));
}

inline void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  LAB_CHECK_VALUE(t.device() == ref.device(), name, " must be on the same device as ", ref_name, " (",
                    ref.device().str(), "), got ", t.device().str());
}

// A forward-only op given a tensor that requires grad, with grad mode on: its output would silently not require
// grad, and a training loop would quietly stop learning. An error names it instead.
// `instead`: what to use for training, where the family has a differentiable wrapper (default: PyTorch's module).
inline void check_no_grad(const at::Tensor& t, const char* name, const char* op,
                          const char* instead = "the PyTorch module") {
  LAB_CHECK_VALUE(!(t.defined() && t.requires_grad() && c10::GradMode::is_enabled()), op, ": ", name,
                  " requires grad, but this kernel has no backward (its output would silently not require grad); "
                  "call it under torch.no_grad() for inference, or train with ", instead);
}

inline void check_contiguous(const at::Tensor& t, const char* name) {
  LAB_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous (call .contiguous()), got strides ",
                    shape_str(t.strides()), " for shape ", shape_str(t.sizes()));
}

// layout names the axes, e.g. "(rows, cols)"; it goes into the message.
inline void check_dim(const at::Tensor& t, const char* name, int64_t ndim, const char* layout) {
  check_defined(t, name);
  LAB_CHECK_VALUE(t.dim() == ndim, name, " must be ", ndim, "-D ", layout, ", got ", t.dim(), "-D tensor of shape ",
                    shape_str(t.sizes()));
}

inline void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef expected, const char* layout) {
  check_defined(t, name);
  LAB_CHECK_VALUE(t.sizes() == expected, name, " must have shape ", layout, " = ", shape_str(expected), ", got ",
                    shape_str(t.sizes()));
}

// An output buffer the caller passed in: right shape, dtype and device, contiguous. Whether it may share memory with
// an input is the op's to say: check_no_overlap.
inline void check_out(const at::Tensor& out, const char* name, const at::Tensor& like, at::IntArrayRef shape,
                      const char* layout) {
  check_shape(out, name, shape, layout);
  check_same_dtype(out, name, like, "the input");
  check_same_device(out, name, like, "the input");
  check_contiguous(out, name);
}

// Whether two non-empty tensors are views of one allocation (the cheap test before an overlap is worked out).
inline bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.numel() > 0 && b.numel() > 0 && a.has_storage() && b.has_storage() &&
         a.storage().is_alias_of(b.storage());
}

// An output must not share memory with an input the kernel still reads while it writes (a stencil's neighbours, a
// GEMM's rows, a sample another block reads): the answer would depend on the order the threads run in, i.e. be
// silently wrong. in_place_ok: the op reads each element before it writes the same element in the same thread
// (elementwise), so out may be exactly `in` (same data, sizes and strides), but no other overlap.
inline void check_no_overlap(const at::Tensor& out, const char* name, const at::Tensor& in, const char* in_name,
                             bool in_place_ok = false) {
  if (!same_storage(out, in)) return;
  at::MemOverlapStatus st = at::get_overlap_status(out, in);
  if (st == at::MemOverlapStatus::TooHard) {
    // a strided view (rows of a wider buffer), which ATen does not decide. The same view is Full; two views over
    // the same address span in different layouts (a matrix and its transpose) overlap. Views whose spans differ
    // (columns 0..H and H..2H of one buffer: interleaved, disjoint) cannot be told from a true overlap without
    // walking the elements, so they pass: only a proven overlap is refused.
    const auto span = [](const at::Tensor& t) {
      const auto* p = static_cast<const char*>(t.data_ptr());
      int64_t last = 0;
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
      return std::pair<const char*, const char*>{p, p + (last + 1) * t.element_size()};
    };
    if (out.data_ptr() == in.data_ptr() && out.sizes() == in.sizes() && out.strides() == in.strides())
      st = at::MemOverlapStatus::Full;
    else
      st = span(out) == span(in) ? at::MemOverlapStatus::Partial : at::MemOverlapStatus::No;
  }
  if (st == at::MemOverlapStatus::No || (in_place_ok && st == at::MemOverlapStatus::Full)) return;
  if (in_place_ok)
    LAB_CHECK_VALUE(false, name, " overlaps ", in_name, " without being exactly it: to run in place pass ", in_name,
                    " itself as ", name, ", otherwise a tensor that shares no memory with it");
  LAB_CHECK_VALUE(false, name, " shares memory with ", in_name, ": the kernel reads ", in_name, " while it writes ",
                  name, ", so the result would be wrong; pass an ", name, " that shares no memory with it, or none");
}

// Which implementation runs: version 0 is the C++ CPU code and takes CPU tensors; lo..hi are CUDA kernels and take
// CUDA tensors. A mismatch is the caller's mistake, named as such. who: what sits on dev, with its verb ("x is",
// "the params are").
inline void check_version(const c10::Device& dev, const char* who, int64_t version, int64_t lo, int64_t hi,
                          const char* op) {
  if (dev.is_cuda()) {
    LAB_CHECK_VALUE(version != 0, op, ": version 0 is the C++ CPU code but ", who, " on ", dev.str(),
                    " (move to the CPU, or use a CUDA version ", lo, "..", hi, ": 'v", lo, "'..'v", hi,
                    "' in lab's wrappers)");
    LAB_CHECK_VALUE(version >= lo && version <= hi, op, ": CUDA versions are ", lo, "..", hi, ", got ", version);
  } else {
    LAB_CHECK_VALUE(dev.is_cpu(), op, ": ", who, " on ", dev.str(), " (the lab runs on cpu or cuda)");
    LAB_CHECK_VALUE(version == 0, op, ": version ", version, " is a CUDA kernel but ", who,
                    " on the CPU (use version 0, 'cpu' in lab's wrappers: the C++ CPU code)");
  }
}
inline void check_version(const at::Tensor& x, const char* name, int64_t version, int64_t lo, int64_t hi,
                          const char* op) {
  check_version(x.device(), cat(name, " is").c_str(), version, lo, hi, op);
}

// Sizes that reach a kernel as 32-bit ints.
inline int check_int32(int64_t v, const char* what) {
  LAB_CHECK_VALUE(v >= 0 && v <= INT32_MAX, what, " = ", v, " does not fit the kernel's 32-bit index");
  return static_cast<int>(v);
}

// ---- binding ------------------------------------------------------------------------------------------------
// Checks throw pybind11's own exception types (LAB_CHECK_VALUE -> ValueError, LAB_CHECK_TYPE -> TypeError,
// LAB_CHECK -> RuntimeError) with messages built by lab::cat (snprintf + std::string appends). Why not
// TORCH_CHECK_*: on the H100 box (torch 2.11, g++ 13.3) a failing TORCH_CHECK_VALUE with an integer in its message
// killed the process with SIGSEGV — through lab::bind and through a plain load_inline module alike — while the same
// check with a string-only message, std::runtime_error and pybind11's exceptions raised cleanly; std::to_string with
// operator+ crashed there too. The common factor is integer-to-text conversion inside the extension; the cause is
// not established (all of it works with torch 2.14 / g++ 12 here). Probe runs, 2026-11-22.
// bind(f) still maps a c10 error that escapes from ATen itself to the matching Python exception.
inline std::string cat_layout_other(c10::Layout v) {
  std::string s = "layout ";
  s += num(static_cast<long long>(v));
  return s;
}
inline void cat_one(std::string& s, const char* v) { s += v; }
inline void cat_one(std::string& s, const std::string& v) { s += v; }
inline void cat_one(std::string& s, char v) { s += v; }
inline void cat_one(std::string& s, bool v) { s += v ? "true" : "false"; }
inline void cat_one(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void cat_one(std::string& s, const c10::Device& v) { s += v.str(); }
inline void cat_one(std::string& s, at::IntArrayRef v) { s += shape_str(v); }
inline void cat_one(std::string& s, c10::Layout v) {
  s += v == c10::kStrided ? "Strided" : v == c10::kSparse ? "Sparse" : v == c10::kSparseCsr ? "SparseCsr"
       : lab::cat_layout_other(v);
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void cat_one(std::string& s, T v) { s += num(static_cast<long long>(v)); }
template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
inline void cat_one(std::string& s, T v) { s += num(static_cast<double>(v)); }

template <class... Args>
std::string cat(const Args&... args) {
  std::string s;
  (cat_one(s, args), ...);
  return s;
}

template <class R, class... A>
auto bind(R (*f)(A...)) {
  return [f](A... args) -> R {
    try {
      return f(std::forward<A>(args)...);
    } catch (const c10::TypeError& e) {
      throw pybind11::type_error(e.what_without_backtrace());
    } catch (const c10::ValueError& e) {
      throw pybind11::value_error(e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      throw pybind11::index_error(e.what_without_backtrace());
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
  };
}

// ---- units: launchers built apart, handed over as function pointers (lab_unit.h) -------------------------------
// name -> function, filled by lab/build.py through _lab_register each time a unit is (re)built or loaded.
// One table per binding, hence the unnamed namespace: a function-local static of an `inline` function is emitted by
// g++ as a STB_GNU_UNIQUE symbol, which the dynamic linker merges across every module of the process (RTLD_LOCAL
// notwithstanding) — every family's binding would then share one table, and a second family's _lab_register(clear)
// would wipe the first's launchers (seen in CI: gru's binding looked up 'gru_layer_cpu_f32' in rope's table).
namespace {
[[maybe_unused]] std::unordered_map<std::string, void*>& launchers() {
  static std::unordered_map<std::string, void*> table;
  return table;
}

// The launcher registered under `name` ("square_f32", or "gru_v3@f32" for a unit built per variant), cast to its
// signature. ~50 ns a lookup. A missing one is a clear error, not a null call.
template <class Fn>
Fn launcher(const std::string& name) {
  auto& t = launchers();
  auto it = t.find(name);
  if (it == t.end()) {
    std::string have;
    int shown = 0;
    for (const auto& kv : t) {
      if (kv.first.rfind("lab_", 0) == 0) continue;
      if (shown++ < 12) have += (have.empty() ? "" : ", ") + kv.first;
    }
    if (shown > 12) have += ", ...";
    throw std::runtime_error(cat("kernel '", name, "' is not loaded: no unit of this family exports it (loaded: ",
                                 have.empty() ? std::string("none") : have,
                                 "). Was its unit filtered out by LAB_ONLY / only=, or did its build fail?"));
  }
  return reinterpret_cast<Fn>(it->second);
}
}  // namespace

// The dtype part of a launcher's name: "f32", "f64", "f16", "bf16".
inline const char* dtype_suffix(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    default: return "unsupported";
  }
}
template <class T> inline const char* dtype_suffix() { return dtype_suffix(c10::CppTypeToScalarType<T>::value); }

inline void at_parallel_for(int64_t begin, int64_t end, int64_t grain, lab_range_fn fn, void* ctx) {
  at::parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) { fn(ctx, lo, hi); });
}
// The runtime the CPU units get (lab_unit.h): torch's thread pool.
inline const LabCpuRuntime* cpu_runtime() {
  static const LabCpuRuntime rt{&at_parallel_for};
  return &rt;
}

}  // namespace lab

#ifdef LAB_WITH_CUDA
// Launchers return the launch's cudaError_t (cudaGetLastError right after <<<>>>); a failure becomes a Python
// RuntimeError naming the kernel.
#define LAB_CUDA_CHECK(expr, what)                                                                      \
  do {                                                                                                  \
    cudaError_t lab_err_ = (expr);                                                                      \
    LAB_CHECK(lab_err_ == cudaSuccess, what, " failed: ", cudaGetErrorName(lab_err_), ": ",           \
                cudaGetErrorString(lab_err_));                                                          \
  } while (0)
#define LAB_STREAM() (c10::cuda::getCurrentCUDAStream().stream())
#define LAB_NO_CUDA_BUILD(what)

namespace lab {
// Whether `stream` is being captured into a CUDA graph. What a binding must not do then: copy to the host (a check
// that reads a result: embedding's index checks) or reuse a buffer across calls (a graph keeps what it was captured
// with: the optimizer's tables and tickets). One helper, so every binding asks the same question the same way.
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  LAB_CUDA_CHECK(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}
}  // namespace lab
#else
#define LAB_NO_CUDA_BUILD(what) \
  LAB_CHECK(false, what, ": this module was built without CUDA (lab.build.load(..., flavor='cuda') needs a GPU)")
#endif

// In every binding's PYBIND11_MODULE: what lab/build.py uses to hand the units' launchers over.
#define LAB_BIND_UNITS(m)                                                                                        \
  do {                                                                                                           \
    (m).def("_lab_register", [](const std::unordered_map<std::string, uintptr_t>& fns, bool clear) {            \
      if (clear) ::lab::launchers().clear();                                                                     \
      for (const auto& kv : fns) ::lab::launchers()[kv.first] = reinterpret_cast<void*>(kv.second);             \
    }, "register {name: address} of unit launchers (clear=True drops the old table first)");                   \
    (m).def("_lab_launchers", [] {                                                                               \
      std::vector<std::string> names;                                                                            \
      for (const auto& kv : ::lab::launchers()) names.push_back(kv.first);                                       \
      return names;                                                                                              \
    }, "names of the registered launchers");                                                                     \
    (m).def("_lab_cpu_runtime", [] { return reinterpret_cast<uintptr_t>(::lab::cpu_runtime()); },               \
            "address of the LabCpuRuntime handed to CPU units");                                                 \
  } while (0)
