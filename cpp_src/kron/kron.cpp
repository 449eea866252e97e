// kron/kron.cpp — the binding of the Kronecker layer y = x · (W_K ⊗ … ⊗ W_1): torch-facing functions and their input
// checks. No kernel code here: it calls the launchers the units export (lab::launcher, lab_common.h), so editing a
// kernel never recompiles this file.
//
// factors = [W_1, …, W_K], W_k (f_k, f_k); x (batch, N) with N = f_1·…·f_K. Outputs and the intermediate states are
// tensors the caller allocates (the lab poisons them with NaN before a check). version: 0 = the C++ CPU code (CPU
// tensors: cpp_src/kron/cpu.cpp); 1 = one CUDA kernel per factor (cuda_src/kron/v1.cu); 2 = the fused CUDA kernel
// (cuda_src/kron/v2.cu, planned and launched by v2_plan.cu; v1 where it does not fit); 3 = v2's fusion on tensor
// cores (cuda_src/kron/v3.cu: TF32 on Float tensors, bf16 on BFloat16 ones); 4 = two factors on wgmma
// (cuda_src/kron/v4.cu; v3 where it does not apply); 5 = v4's steps fed by TMA (cuda_src/kron/v5.cu; v3 where it
// does not apply); 6 = version 2 for two factors in strict fp32 with every operand of a block in flight from its
// start (cuda_src/kron/v6.cu; version 2 where it does not apply, Double tensors included). The backward of 1, 2 and 6
// is cuda_src/kron/backward.cu (on the states their forward saved); version 6 runs its own, backward_v6.cu, where it
// applies (two factors, multiples of 32, small batches); that of 3-5 is cuda_src/kron/backward_tc.cu (at
// their precision, the states recomputed). The CPU code computes the same
// steps as the CUDA code (see the header of cuda_src/kron/kron.cuh for the algebra):
//   forward   F-step  y[b] (P, f) = x[b]ᵀ (f, P)ᵀ · W          — for W_K, …, W_1 in turn
//   backward  dW_k = Σ_b F_k[b] · dF_{k-1}[b];  dF_k[b] = W_k · dF_{k-1}[b]ᵀ;  dx = dF_K
#include "lab_common.h"
#include "kron/plan_info.h"

#include <torch/csrc/autograd/custom_function.h>  // torch::autograd::Function (KronAutograd)
#include <torch/csrc/autograd/functions/basic_ops.h>  // DelayedError: once-differentiable gradients
#include <torch/csrc/autograd/python_variable.h>  // THPVariable_Check / THPVariable_Unpack

#include <algorithm>
#include <cstdio>


namespace {

namespace py = pybind11;

constexpr int kMaxFactors = 16;  // as in cuda_src/kron/kron.cuh
constexpr int64_t kLastVersion = 6;

// versions 3-5 run on tensor cores (TF32 / bf16), save no states and have their own backward
bool tensor_cores(int64_t version) { return version >= 3 && version <= 5; }

// Lists of tensors arrive as Python sequences and are unpacked here, element by element, so a wrong element is
// reported by position. Names are built with snprintf, not std::string: on the H100 box (torch 2.11, gcc 13.3) a
// function that built a std::string with std::to_string and operator+ segfaulted on its first call, while the same
// module's other functions (std::vector arguments included) ran; the first version of this file did that in every
// call.
std::vector<at::Tensor> tensors(const py::sequence& seq, const char* what) {
  std::vector<at::Tensor> out;
  const size_t n = py::len(seq);
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    py::object item = seq[i];
    LAB_CHECK_TYPE(THPVariable_Check(item.ptr()), what, "[", i, "] must be a tensor, got ",
                     Py_TYPE(item.ptr())->tp_name);
    out.push_back(THPVariable_Unpack(item.ptr()));
  }
  return out;
}

struct Sizes {
  std::vector<int> f;
  int64_t B = 0, N = 0;
};

// x (batch, N) contiguous, Float or Double (versions 3-5, the tensor-core kernels: Float or BFloat16); factors a
// non-empty list of square matrices of x's dtype and device whose sizes multiply to N.
Sizes check_layer(const at::Tensor& x, const std::vector<at::Tensor>& factors, int64_t version = 0) {
  if (tensor_cores(version)) {
    lab::check_dtype(x, "x", {at::kFloat, at::kBFloat16});
  } else {
    lab::check_defined(x, "x");
    LAB_CHECK_TYPE(x.scalar_type() != at::kBFloat16, "kron: x is BFloat16, which only versions 3, 4 and 5 (tensor "
                   "cores) take; versions 0-2 and 6 take Float or Double");
    lab::check_dtype(x, "x", {at::kFloat, at::kDouble});
  }
  lab::check_dim(x, "x", 2, "(batch, N)");
  lab::check_contiguous(x, "x");
  LAB_CHECK_VALUE(!factors.empty(), "factors must be a non-empty list of square matrices, got an empty list");
  LAB_CHECK_VALUE(factors.size() <= size_t(kMaxFactors), "at most ", kMaxFactors, " factors are supported, got ",
                    factors.size());
  Sizes s;
  s.B = x.size(0);
  s.N = x.size(1);
  int64_t prod = 1;
  for (size_t i = 0; i < factors.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "factors[%zu]", i);
    const at::Tensor& w = factors[i];
    lab::check_defined(w, name);
    lab::check_same_dtype(w, name, x, "x");
    lab::check_same_device(w, name, x, "x");
    lab::check_dim(w, name, 2, "(f, f)");
    LAB_CHECK_VALUE(w.size(0) == w.size(1), name, " must be square (f, f), got ", lab::shape_str(w.sizes()));
    LAB_CHECK_VALUE(w.size(0) >= 1, name, " must not be empty, got ", lab::shape_str(w.sizes()));
    lab::check_contiguous(w, name);
    LAB_CHECK_VALUE(w.size(0) <= INT32_MAX, name, " is too large for the kernels' 32-bit sizes");
    s.f.push_back(static_cast<int>(w.size(0)));
    prod = prod > (int64_t(1) << 40) ? prod : prod * w.size(0);
  }
  if (prod != s.N) {
    char dims[16 * 14];
    int n = 0;
    dims[0] = '\0';
    for (size_t i = 0; i < s.f.size() && n < int(sizeof(dims)) - 16; ++i)
      n += std::snprintf(dims + n, sizeof(dims) - size_t(n), "%s%d", i ? " x " : "", s.f[i]);
    LAB_CHECK_VALUE(false, "the factor sizes ", dims, " multiply to ", prod, ", but x has N = ", s.N,
                      " columns; x must be (batch, f_1*...*f_K)");
  }
  return s;
}

void check_like(const at::Tensor& t, const char* name, const at::Tensor& x, at::IntArrayRef shape,
                const char* layout) {
  lab::check_out(t, name, x, shape, layout);
}

void check_states(const std::vector<at::Tensor>& states, const at::Tensor& x, const Sizes& s, bool required) {
  const size_t K = s.f.size();
  if (states.empty() && !required) return;
  LAB_CHECK_VALUE(states.size() == K - 1, "states must be a list of K-1 = ", K - 1,
                    " tensors of shape (batch, N) (the intermediate states), got ", states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "states[%zu]", i);
    check_like(states[i], name, x, {s.B, s.N}, "(batch, N)");
  }
}

// No output may share memory with an input or with another output: every kernel reads its inputs while it writes
// (a block of the fused versions writes its columns of y[b] while other blocks still read all of x[b]). A tensor's
// name is base, or base[index] for an element of a list (index >= 0); it is built only for an overlap to report.
void check_apart(const at::Tensor& out, const char* out_base, int64_t out_index, const at::Tensor& in,
                 const char* in_base, int64_t in_index) {
  if (!lab::same_storage(out, in)) return;
  const auto name = [](const char* base, int64_t i) { return i < 0 ? std::string(base) : lab::cat(base, "[", i, "]"); };
  lab::check_no_overlap(out, name(out_base, out_index).c_str(), in, name(in_base, in_index).c_str());
}
// an output against x, every factor and the first `n_states` states
void check_apart_from_layer(const at::Tensor& out, const char* base, int64_t index, const at::Tensor& x,
                            const std::vector<at::Tensor>& factors, const std::vector<at::Tensor>& states,
                            size_t n_states) {
  check_apart(out, base, index, x, "x", -1);
  for (size_t k = 0; k < factors.size(); ++k) check_apart(out, base, index, factors[k], "factors", int64_t(k));
  for (size_t k = 0; k < n_states && k < states.size(); ++k)
    check_apart(out, base, index, states[k], "states", int64_t(k));
}

// ---- launchers: what the units export (names: kname below) --------------------------------------------------------
#ifdef LAB_WITH_CUDA
// cuda_src/kron/v1.cu, v2_plan.cu, backward.cu, each built once per dtype: "kron_v1_forward@f32", ...
template <class T> using V1Forward = cudaError_t (*)(int version, const T* x, T* y, const T* const* w, const int* f,
                                                     int K, int64_t B, int64_t N, T* const* states, T* scratch,
                                                     int cfg, cudaStream_t);
using ForwardScratch = int64_t (*)(int64_t B, int64_t N, int K);
template <class T> using V2Forward = cudaError_t (*)(const T* x, T* y, const T* const* w, const int* f, int K,
                                                     int64_t B, int64_t N, T* const* states, int cfg, int cols,
                                                     const void* kernels, cudaStream_t);
using FusedPlanFn = void (*)(int64_t B, int64_t N, const int* f, int K, int cfg, int cols, const void* kernels,
                             int64_t* info);
template <class T> using Backward = cudaError_t (*)(const T* g, const T* x, const T* const* w, const int* f, int K,
                                                    int64_t B, int64_t N, const T* const* states, T* dx,
                                                    T* const* dw, T* ws, cudaStream_t);
using BackwardWorkspace = int64_t (*)(int64_t B, int64_t N, const int* f, int K);
// cuda_src/kron/backward_tc.cu, built per dtype (f32 = TF32 multiplies, bf16): the backward of versions 3-5; its
// workspace is in bytes
using TcBackward = cudaError_t (*)(const void* g, const void* x, const void* const* w, const int* f, int K, int64_t B,
                                   int64_t N, void* dx, void* const* dw, void* ws, cudaStream_t);

// v2.cu is built once per dtype and block configuration; v2_plan.cu takes its kernels as FusedKernels<T>
// (cuda_src/kron/kron.cuh): the three configurations' occupancy functions, then their launch functions. The binding
// only looks them up ("kron_v2_occupancy@f32,0", ...) and passes them on, so here they are plain addresses.
struct FusedKernels {
  void* occupancy[3];
  void* launch[3];
};
FusedKernels fused_kernels(at::ScalarType t) {
  static const auto names = [](const char* d) {
    std::vector<std::string> v;
    for (const char* what : {"kron_v2_occupancy@", "kron_v2_launch@"})
      for (int cfg = 0; cfg < 3; ++cfg) v.push_back(lab::cat(what, d, ",", cfg));
    return v;
  };
  static const std::vector<std::string> f32 = names("f32"), f64 = names("f64");
  const std::vector<std::string>& n = t == at::kDouble ? f64 : f32;
  FusedKernels k;
  for (int cfg = 0; cfg < 3; ++cfg) {
    k.occupancy[cfg] = lab::launcher<void*>(n[cfg]);
    k.launch[cfg] = lab::launcher<void*>(n[3 + cfg]);
  }
  return k;
}
// cuda_src/kron/v3.cu, built per dtype (f32 = TF32 multiplies, bf16) and configuration (0: 8 warps, 1: 4 warps)
using V3Plan = void (*)(int64_t B, int64_t N, const int* f, int K, int cols, int64_t* info);
using V3Forward = cudaError_t (*)(const void* x, void* y, const void* const* w, const int* f, int K, int64_t B,
                                  int64_t N, int cols, cudaStream_t);
// cuda_src/kron/v6.cu (Float only): plan as V5Plan below (cfg 0: 4x4 tiles, 1, 2: 8x4 with k split in two or four);
// forward with the state F_1 to save (or nullptr)
using V6Forward = cudaError_t (*)(const float* x, float* y, const float* const* w, const int* f, int K, int64_t B,
                                  int64_t N, float* save, int cfg, int cols, cudaStream_t);
// cuda_src/kron/v5.cu: the same with the schedule (cfg: -1 automatic, 0 split, 1 ping-pong, 2 split with W_1 in
// registers: TF32, f_1 <= 128)
using V5Plan = void (*)(int64_t B, int64_t N, const int* f, int K, int cfg, int cols, int64_t* info);
using V5Forward = cudaError_t (*)(const void* x, void* y, const void* const* w, const int* f, int K, int64_t B,
                                  int64_t N, int cfg, int cols, cudaStream_t);
#endif
// cpp_src/kron/cpu.cpp: "kron_cpu_forward_f32", ...
template <class T> using CpuForward = void (*)(const T* x, T* y, const T* const* w, const int* f, int K, int64_t B,
                                               int64_t N, T* const* states);
template <class T> using CpuBackward = void (*)(const T* g, const T* x, const T* const* w, const int* f, int K,
                                                int64_t B, int64_t N, const T* const* states, T* dx, T* const* dws);

// "kron_v1_forward@f32" (a CUDA unit's variant) or "kron_cpu_forward_f32" (the CPU unit)
std::string kname(const char* name, at::ScalarType t) { return lab::cat(name, "@", lab::dtype_suffix(t)); }
std::string cpu_name(const char* name, at::ScalarType t) { return lab::cat(name, "_", lab::dtype_suffix(t)); }

template <class T> std::vector<const T*> cptrs(const std::vector<at::Tensor>& ts) {
  std::vector<const T*> v;
  for (const auto& t : ts) v.push_back(t.data_ptr<T>());
  return v;
}
template <class T> std::vector<T*> ptrs(const std::vector<at::Tensor>& ts) {
  std::vector<T*> v;
  for (const auto& t : ts) v.push_back(t.data_ptr<T>());
  return v;
}

}  // namespace

// ---- torch-facing functions ---------------------------------------------------------------------------------
// y = x · (W_K ⊗ … ⊗ W_1) into out. states: [] or the K-1 intermediate states F_1..F_{K-1} (each (batch, N)), written
// when given (the backward needs them). cfg/cols: -1/0 = automatic; else force the CUDA block configuration (0..2)
// and v2's slice width (for kron.tune()).
#ifdef LAB_WITH_CUDA
// Version 3's plan: each configuration's build plans its own slice width and cost (kPlanFields, plan_info.h); the
// cheaper that fits wins (cfg >= 0 forces one). info[kFits] = 0: neither fits.
void v3_plan(at::ScalarType dt, const Sizes& s, int64_t cfg, int64_t cols, int64_t* info) {
  int64_t best[kron::kPlanFields] = {0};
  for (int c = 0; c < 2; ++c) {
    if (cfg >= 0 && c != cfg) continue;
    int64_t i[kron::kPlanFields] = {0};
    lab::launcher<V3Plan>(lab::cat("kron_v3_plan@", lab::dtype_suffix(dt), ",", c))(s.B, s.N, s.f.data(),
                                                                                      int(s.f.size()), int(cols), i);
    if (i[kron::kFits] && (!best[kron::kFits] || i[kron::kCost] < best[kron::kCost])) std::copy(i, i + kron::kPlanFields, best);
    if (!best[kron::kFits] && !i[kron::kFits]) std::copy(i, i + kron::kPlanFields, best);  // the limits, for the report
  }
  std::copy(best, best + kron::kPlanFields, info);
}
#endif

at::Tensor forward_impl(const at::Tensor& x, const std::vector<at::Tensor>& factors, at::Tensor out,
                        const std::vector<at::Tensor>& states, int64_t version, int64_t cfg, int64_t cols);

// Version 4 (wgmma, two factors that are multiples of 64): its plan, or fits = 0 where it does not apply.
#ifdef LAB_WITH_CUDA
void v4_plan(at::ScalarType dt, const Sizes& s, int64_t cols, int64_t* info) {
  lab::launcher<V3Plan>(lab::cat("kron_v4_plan@", lab::dtype_suffix(dt)))(s.B, s.N, s.f.data(), int(s.f.size()),
                                                                          int(cols), info);
}
// Version 5 (TMA-fed wgmma): its plan, or fits = 0 where it does not apply.
void v5_plan(at::ScalarType dt, const Sizes& s, int64_t cfg, int64_t cols, int64_t* info) {
  lab::launcher<V5Plan>(lab::cat("kron_v5_plan@", lab::dtype_suffix(dt)))(s.B, s.N, s.f.data(), int(s.f.size()),
                                                                          int(cfg), int(cols), info);
}
#endif

// Versions 3, 4 and 5 (tensor cores: TF32 on Float, bf16 on BFloat16). Versions 4 and 5 run where their plans fit,
// else version 3; where no configuration of version 3 fits in shared memory it runs version 2: on Float tensors as
// they are (strict fp32, more precise than asked), on BFloat16 ones through Float copies (rounded back once, at the
// end).
at::Tensor forward_tc(const at::Tensor& x, const std::vector<at::Tensor>& factors, at::Tensor out, const Sizes& s,
                      int64_t version, int64_t cfg, int64_t cols) {
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  const at::ScalarType dt = x.scalar_type();
  const int K = int(s.f.size());
  int64_t info[kron::kPlanFields];
  std::vector<const void*> w;
  for (const auto& t : factors) w.push_back(t.data_ptr());
  // v4 and v5 read and write 16-byte vectors (TMA boxes in v5): an operand off that alignment (a view into a larger
  // buffer) goes to v3, which has element paths for it
  auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool aligned = a16(x.data_ptr()) && a16(out.data_ptr());
  for (const void* p : w) aligned = aligned && a16(p);
  if ((version == 4 || version == 5) && aligned) {
    if (version == 4)
      v4_plan(dt, s, cols, info);
    else
      v5_plan(dt, s, cfg, cols, info);
    if (info[kron::kFits] && version == 4) {
      auto fn = lab::launcher<V3Forward>(lab::cat("kron_v4_forward@", lab::dtype_suffix(dt)));
      LAB_CUDA_CHECK(fn(x.data_ptr(), out.data_ptr(), w.data(), s.f.data(), K, s.B, s.N, int(cols), LAB_STREAM()),
                     "kron v4 forward kernel");
      return out;
    }
    if (info[kron::kFits]) {
      auto fn = lab::launcher<V5Forward>(lab::cat("kron_v5_forward@", lab::dtype_suffix(dt)));
      LAB_CUDA_CHECK(fn(x.data_ptr(), out.data_ptr(), w.data(), s.f.data(), K, s.B, s.N, int(cfg), int(cols),
                        LAB_STREAM()),
                     "kron v5 forward kernel");
      return out;
    }
    cols = 0;  // a wgmma version's slice width and schedule mean nothing to v3
    cfg = -1;
  }
  v3_plan(dt, s, cfg, cols, info);
  if (!info[kron::kFits]) {
    if (dt == at::kFloat) return forward_impl(x, factors, out, {}, 2, -1, 0);
    std::vector<at::Tensor> wf;
    for (const auto& w : factors) wf.push_back(w.to(at::kFloat));
    out.copy_(forward_impl(x.to(at::kFloat), wf, at::empty({s.B, s.N}, x.options().dtype(at::kFloat)), {}, 2, -1, 0));
    return out;
  }
  auto fn = lab::launcher<V3Forward>(lab::cat("kron_v3_forward@", lab::dtype_suffix(dt), ",", info[kron::kCfg]));
  LAB_CUDA_CHECK(fn(x.data_ptr(), out.data_ptr(), w.data(), s.f.data(), K, s.B, s.N, int(cols), LAB_STREAM()),
                 "kron v3 forward kernel");
  return out;
#else
  (void)x, (void)factors, (void)s, (void)version, (void)cfg, (void)cols;
  LAB_NO_CUDA_BUILD("kron forward");
  return out;
#endif
}

#ifdef LAB_WITH_CUDA
// Version 6 (Float tensors): launches v6.cu's kernel and returns true where its plan fits (two factors, multiples of
// 4, ...) and every tensor is 16-byte aligned; false: the caller runs version 2.
bool forward_v6(const at::Tensor& x, const std::vector<at::Tensor>& factors, at::Tensor& out,
                const std::vector<at::Tensor>& states, const Sizes& s, int64_t cfg, int64_t cols) {
  c10::cuda::CUDAGuard guard(x.device());
  const int K = int(s.f.size());
  int64_t info[kron::kPlanFields];
  lab::launcher<V5Plan>("kron_v6_plan@f32")(s.B, s.N, s.f.data(), K, int(cfg), int(cols), info);
  auto a16 = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  bool aligned = a16(x) && a16(out);
  for (const auto& t : factors) aligned = aligned && a16(t);
  for (const auto& t : states) aligned = aligned && a16(t);
  if (!info[kron::kFits] || !aligned) return false;
  const std::vector<const float*> w = cptrs<float>(factors);
  auto fn = lab::launcher<V6Forward>("kron_v6_forward@f32");
  LAB_CUDA_CHECK(fn(x.data_ptr<float>(), out.data_ptr<float>(), w.data(), s.f.data(), K, s.B, s.N,
                    states.empty() ? nullptr : states[0].data_ptr<float>(), int(cfg), int(cols), LAB_STREAM()),
                 "kron v6 forward kernel");
  return true;
}
#endif

at::Tensor forward(const at::Tensor& x, py::sequence factors_, at::Tensor out, py::sequence states_,
                   int64_t version, int64_t cfg, int64_t cols) {
  return forward_impl(x, tensors(factors_, "factors"), out, tensors(states_, "states"), version, cfg, cols);
}

at::Tensor forward_impl(const at::Tensor& x, const std::vector<at::Tensor>& factors, at::Tensor out,
                        const std::vector<at::Tensor>& states, int64_t version, int64_t cfg, int64_t cols) {
  const Sizes s = check_layer(x, factors, version);
  check_like(out, "out", x, {s.B, s.N}, "(batch, N)");
  check_states(states, x, s, false);
  check_apart_from_layer(out, "out", -1, x, factors, states, states.size());
  for (size_t k = 0; k < states.size(); ++k)  // the states are outputs too
    check_apart_from_layer(states[k], "states", int64_t(k), x, factors, states, k);
  lab::check_version(x, "x", version, 1, kLastVersion, "kron");
  LAB_CHECK_VALUE(cfg >= -1 && cfg <= 2, "kron: cfg must be -1 (automatic) or 0..2, got ", cfg);
  LAB_CHECK_VALUE(cols >= 0 && cols <= 1 << 20, "kron: cols must be 0 (automatic) or a slice width, got ", cols);
  if (tensor_cores(version)) {
    LAB_CHECK_VALUE(states.empty(), "kron: version ", version, " (tensor cores) saves no states (its backward "
                    "recomputes them); pass states=[]");
    LAB_CHECK_VALUE(cfg <= 1 || version == 5, "kron: versions 3 and 4 have configurations 0 and 1 (v3: 8 or 4 "
                    "warps), got cfg ", cfg);
    return forward_tc(x, factors, out, s, version, cfg, cols);
  }
  const int K = int(s.f.size());
#ifdef LAB_WITH_CUDA
  if (version == 6) {
    LAB_CHECK_VALUE(cfg <= 2, "kron: version 6 has configurations 0, 1 and 2 (4x4 outputs a thread, 8x4 with k split "
                    "in two or four), got cfg ", cfg);
    if (x.is_cuda() && x.scalar_type() == at::kFloat && forward_v6(x, factors, out, states, s, cfg, cols))
      return out;
    cfg = -1, cols = 0;  // v6's configuration and slice width mean nothing to v2's planner
  }
#endif
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kron_forward", [&] {
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      const at::ScalarType dt = x.scalar_type();
      const auto w = cptrs<scalar_t>(factors);
      auto st = ptrs<scalar_t>(states);
      // version 2 (and 6 where it does not apply) runs v2.cu's fused kernel where its plan fits, else (and for
      // K = 1) v1.cu's per-factor forward
      bool fused_fits = false;
      FusedKernels kern{};
      if (version == 2 || version == 6) {
        kern = fused_kernels(dt);
        int64_t info[kron::kPlanFields];
        lab::launcher<FusedPlanFn>(kname("kron_fused_plan", dt))(s.B, s.N, s.f.data(), K, int(cfg), int(cols), &kern,
                                                                 info);
        fused_fits = info[0] != 0;
      }
      if (fused_fits) {
        auto fn = lab::launcher<V2Forward<scalar_t>>(kname("kron_v2_forward", dt));
        LAB_CUDA_CHECK(fn(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), w.data(), s.f.data(), K, s.B, s.N,
                          st.empty() ? nullptr : st.data(), int(cfg), int(cols), &kern, LAB_STREAM()),
                       "kron forward kernel");
      } else {
        at::Tensor scratch;
        if (states.empty() && K > 1)
          scratch = at::empty({lab::launcher<ForwardScratch>(kname("kron_forward_scratch", dt))(s.B, s.N, K)},
                              x.options());
        auto fn = lab::launcher<V1Forward<scalar_t>>(kname("kron_v1_forward", dt));
        LAB_CUDA_CHECK(fn(int(version), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), w.data(), s.f.data(), K,
                          s.B, s.N, st.empty() ? nullptr : st.data(),
                          scratch.defined() ? scratch.data_ptr<scalar_t>() : nullptr, int(cfg), LAB_STREAM()),
                       "kron forward kernel");
      }
#else
      LAB_NO_CUDA_BUILD("kron forward");
#endif
    } else {
      const auto w = cptrs<scalar_t>(factors);
      auto st = ptrs<scalar_t>(states);
      lab::launcher<CpuForward<scalar_t>>(cpu_name("kron_cpu_forward", x.scalar_type()))(
          x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), w.data(), s.f.data(), K, s.B, s.N,
          st.empty() ? nullptr : st.data());
    }
  });
  return out;
}

// The backward of versions 3-5 (cuda_src/kron/backward_tc.cu): TF32 on Float tensors, bf16 on BFloat16 ones, the
// states recomputed into the workspace.
at::Tensor backward_tc(const at::Tensor& g, const at::Tensor& x, const std::vector<at::Tensor>& factors,
                       at::Tensor dx, const std::vector<at::Tensor>& dws, const Sizes& s) {
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  const at::ScalarType dt = x.scalar_type();
  const int K = int(s.f.size());
  const char* d = lab::dtype_suffix(dt);
  const int64_t n = lab::launcher<BackwardWorkspace>(lab::cat("kron_tc_backward_workspace@", d))(s.B, s.N,
                                                                                                 s.f.data(), K);
  at::Tensor ws = at::empty({std::max<int64_t>(n, 1)}, x.options().dtype(at::kByte));
  std::vector<const void*> w;
  std::vector<void*> dw;
  for (const auto& t : factors) w.push_back(t.data_ptr());
  for (const auto& t : dws) dw.push_back(t.data_ptr());
  auto fn = lab::launcher<TcBackward>(lab::cat("kron_tc_backward@", d));
  LAB_CUDA_CHECK(fn(g.data_ptr(), x.data_ptr(), w.data(), s.f.data(), K, s.B, s.N, dx.data_ptr(), dw.data(),
                    ws.data_ptr(), LAB_STREAM()),
                 "kron tensor-core backward kernels");
#else
  (void)g, (void)x, (void)factors, (void)dws, (void)s;
  LAB_NO_CUDA_BUILD("kron backward");
#endif
  return dx;
}

#ifdef LAB_WITH_CUDA
// Version 6's backward (Float tensors): backward_v6.cu's fused kernel and reduce, where its plan applies (two factors,
// multiples of 32, a small batch) and every tensor is 16-byte aligned; false: the caller runs v1's kernels.
bool backward_v6(const at::Tensor& g, const at::Tensor& x, const std::vector<at::Tensor>& factors,
                 const std::vector<at::Tensor>& states, at::Tensor& dx, const std::vector<at::Tensor>& dws,
                 const Sizes& s) {
  c10::cuda::CUDAGuard guard(x.device());
  const int K = int(s.f.size());
  const int64_t n = lab::launcher<BackwardWorkspace>("kron_v6_backward_workspace@f32")(s.B, s.N, s.f.data(), K);
  auto a16 = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  bool aligned = a16(g) && a16(x) && a16(dx);
  for (const auto& t : factors) aligned = aligned && a16(t);
  for (const auto& t : states) aligned = aligned && a16(t);
  for (const auto& t : dws) aligned = aligned && a16(t);
  if (n <= 0 || states.size() != 1 || !aligned) return false;
  at::Tensor ws = at::empty({n}, x.options());
  const auto w = cptrs<float>(factors);
  const auto st = cptrs<float>(states);
  auto dw = ptrs<float>(dws);
  auto fn = lab::launcher<Backward<float>>("kron_v6_backward@f32");
  LAB_CUDA_CHECK(fn(g.data_ptr<float>(), x.data_ptr<float>(), w.data(), s.f.data(), K, s.B, s.N, st.data(),
                    dx.data_ptr<float>(), dw.data(), ws.data_ptr<float>(), LAB_STREAM()),
                 "kron v6 backward kernels");
  return true;
}
#endif

// Gradients of y = x · (W_K ⊗ … ⊗ W_1) for upstream gradient g: dx and dws[k] = dL/dW_{k+1}, written into the given
// tensors. states: the K-1 intermediate states the forward wrote.
at::Tensor backward_impl(const at::Tensor& g, const at::Tensor& x, const std::vector<at::Tensor>& factors,
                         const std::vector<at::Tensor>& states, at::Tensor dx, const std::vector<at::Tensor>& dws,
                         int64_t version) {
  const Sizes s = check_layer(x, factors, version);
  check_like(g, "g", x, {s.B, s.N}, "(batch, N)");
  // versions 3-5 save no states (their forwards keep them on chip): their backward recomputes them
  if (tensor_cores(version))
    LAB_CHECK_VALUE(states.empty(), "kron: version ", version, " (tensor cores) saves no states and its backward "
                    "recomputes them; pass states=[]");
  else
    check_states(states, x, s, true);
  check_like(dx, "dx", x, {s.B, s.N}, "(batch, N)");
  const int K = int(s.f.size());
  LAB_CHECK_VALUE(dws.size() == size_t(K), "dws must be a list of K = ", K, " tensors (one per factor), got ",
                    dws.size());
  for (int k = 0; k < K; ++k) {
    char name[32];
    std::snprintf(name, sizeof(name), "dws[%d]", k);
    check_like(dws[k], name, x, {s.f[k], s.f[k]}, "like factors[k]");
  }
  const auto apart = [&](const at::Tensor& out, const char* base, int64_t index, size_t n_dws) {
    check_apart_from_layer(out, base, index, x, factors, states, states.size());
    check_apart(out, base, index, g, "g", -1);
    for (size_t k = 0; k < n_dws; ++k) check_apart(out, base, index, dws[k], "dws", int64_t(k));
  };
  apart(dx, "dx", -1, dws.size());
  for (size_t k = 0; k < dws.size(); ++k) apart(dws[k], "dws", int64_t(k), k);
  lab::check_version(x, "x", version, 1, kLastVersion, "kron");
  if (tensor_cores(version)) return backward_tc(g, x, factors, dx, dws, s);
#ifdef LAB_WITH_CUDA
  if (version == 6 && x.is_cuda() && x.scalar_type() == at::kFloat && backward_v6(g, x, factors, states, dx, dws, s))
    return dx;
#endif
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kron_backward", [&] {
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      const at::ScalarType dt = x.scalar_type();
      const int64_t n = lab::launcher<BackwardWorkspace>(kname("kron_backward_workspace", dt))(s.B, s.N, s.f.data(), K);
      at::Tensor ws = at::empty({std::max<int64_t>(n, 1)}, x.options());
      const auto w = cptrs<scalar_t>(factors);
      const auto st = cptrs<scalar_t>(states);
      auto dw = ptrs<scalar_t>(dws);
      auto fn = lab::launcher<Backward<scalar_t>>(kname("kron_backward", dt));
      LAB_CUDA_CHECK(fn(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), w.data(), s.f.data(), K, s.B, s.N,
                        st.empty() ? nullptr : st.data(), dx.data_ptr<scalar_t>(), dw.data(), ws.data_ptr<scalar_t>(),
                        LAB_STREAM()),
                     "kron backward kernels");
#else
      LAB_NO_CUDA_BUILD("kron backward");
#endif
    } else {
      const auto w = cptrs<scalar_t>(factors);
      const auto st = cptrs<scalar_t>(states);
      auto dw = ptrs<scalar_t>(dws);
      lab::launcher<CpuBackward<scalar_t>>(cpu_name("kron_cpu_backward", x.scalar_type()))(
          g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), w.data(), s.f.data(), K, s.B, s.N,
          st.empty() ? nullptr : st.data(), dx.data_ptr<scalar_t>(), dw.data());
    }
  });
  return dx;
}

at::Tensor backward(const at::Tensor& g, const at::Tensor& x, py::sequence factors_, py::sequence states_,
                    at::Tensor dx, py::sequence dws_, int64_t version) {
  return backward_impl(g, x, tensors(factors_, "factors"), tensors(states_, "states"), dx, tensors(dws_, "dws"),
                       version);
}

// ---- autograd: the layer as a C++ autograd Function -----------------------------------------------------------------
// Why C++ and not a torch.autograd.Function in Python (the design before this one): on CUDA the autograd engine runs
// the backward on its device thread, and a Python Function's backward (and the release of its Python context) takes
// the GIL there while the caller's thread, woken when the gradients are ready, is already running the next step's
// Python. A/B on the H100 box (bf16, batch 1024, 128x128, v5; one step = kron + torch.autograd.grad, GPU ~250 us, its
// CUDA-graph replay ~243 us): the Python Function's eager step cost 946 us of host time (forward call 293, grad 569),
// this one 561 us (128, 284). With the backward on the calling thread (set_multithreading_enabled(False)) both cost
// ~380-390 us: what is left of the gap is autograd's hand-off to its device thread, and the host's per-op costs.
// Measured per version in notebook 05, section 6d.
//
// Inputs: x (batch, N) and factors W_1..W_K, differentiable; version, cfg, cols as in forward. cpu/v1/v2 save the
// K-1 intermediate states for their backward (backward.cu / cpu.cpp), v3-v5 save none (backward_tc.cu recomputes
// them at their precision). The backward's kernels are not themselves differentiable; as with Python's
// @once_differentiable, a backward run with create_graph=True returns its gradients behind a node that raises if a
// second backward reaches it (double backward needs a baseline, e.g. version='torch.bmm').
struct KronAutograd : public torch::autograd::Function<KronAutograd> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_, int64_t version,
                            int64_t cfg, int64_t cols, bool need_grad, at::TensorList factors_) {
    const at::Tensor x = x_.contiguous();
    std::vector<at::Tensor> factors;
    factors.reserve(factors_.size());
    for (const auto& w : factors_) factors.push_back(w.contiguous());
    std::vector<at::Tensor> states;
    if (need_grad && !tensor_cores(version) && x.dim() == 2)
      for (size_t k = 1; k < factors.size(); ++k) states.push_back(at::empty_like(x));
    at::Tensor y = forward_impl(x, factors, at::empty_like(x), states, version, cfg, cols);
    if (need_grad) {
      std::vector<at::Tensor> save{x};
      save.insert(save.end(), factors.begin(), factors.end());
      save.insert(save.end(), states.begin(), states.end());
      ctx->save_for_backward(save);
      ctx->saved_data["K"] = static_cast<int64_t>(factors.size());
      ctx->saved_data["version"] = version;
    }
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t K = ctx->saved_data["K"].toInt(), version = ctx->saved_data["version"].toInt();
    const at::Tensor& x = saved[0];
    const std::vector<at::Tensor> factors(saved.begin() + 1, saved.begin() + 1 + K),
        states(saved.begin() + 1 + K, saved.end());
    std::vector<at::Tensor> dws;
    for (const auto& w : factors) dws.push_back(at::empty_like(w));
    at::Tensor dx = backward_impl(grads[0].contiguous(), x, factors, states, at::empty_like(x), dws, version);
    // one gradient per forward argument: x, then version, cfg, cols, need_grad (none), then each factor
    torch::autograd::variable_list out(5 + size_t(K));
    if (ctx->needs_input_grad(0)) out[0] = dx;
    for (int64_t k = 0; k < K; ++k)
      if (ctx->needs_input_grad(size_t(1 + k))) out[size_t(5 + k)] = dws[size_t(k)];
    return c10::GradMode::is_enabled() ? once_differentiable(std::move(out)) : out;
  }

  // create_graph=True: the defined gradients come back behind an Error node (what Python's @once_differentiable does,
  // through the same DelayedError: identity forward, its outputs' grad_fn raises), so a second backward through them
  // raises instead of treating them as constants
  static torch::autograd::variable_list once_differentiable(torch::autograd::variable_list grads) {
    torch::autograd::variable_list leaves;
    std::vector<size_t> at;
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) leaves.push_back(grads[i].detach().requires_grad_(true)), at.push_back(i);
    if (leaves.empty()) return grads;
    torch::autograd::DelayedError err(
        "kron: the backward of the compiled versions is not differentiable (a second backward reached it); for "
        "higher derivatives use version='torch.bmm'",
        static_cast<int64_t>(leaves.size()));
    const torch::autograd::variable_list wrapped = err.apply(std::move(leaves));
    for (size_t j = 0; j < at.size(); ++j) grads[at[j]] = wrapped[j];
    return grads;
  }
};

// y = x · (W_K ⊗ … ⊗ W_1) with autograd (kron.kron in Python): what KronLinear calls.
at::Tensor apply(const at::Tensor& x, py::sequence factors_, int64_t version, int64_t cfg, int64_t cols) {
  const std::vector<at::Tensor> factors = tensors(factors_, "factors");
  bool need = c10::GradMode::is_enabled() && x.requires_grad();
  for (const auto& w : factors) need = need || (c10::GradMode::is_enabled() && w.requires_grad());
  return KronAutograd::apply(x, version, cfg, cols, need, at::TensorList(factors));
}

// Factor sizes from Python (fused_plan, backward_kernels): 1..kMaxFactors positive 32-bit sizes; *N = their product
std::vector<int> factor_sizes(py::sequence sizes, int64_t* N) {
  const size_t nf = py::len(sizes);
  LAB_CHECK_VALUE(nf >= 1 && nf <= size_t(kMaxFactors), "sizes must list 1..", kMaxFactors, " factor sizes, got ",
                  nf);
  std::vector<int> f;
  *N = 1;
  for (size_t i = 0; i < nf; ++i) {
    const int64_t v = py::cast<int64_t>(sizes[i]);
    LAB_CHECK_VALUE(v >= 1 && v <= INT32_MAX, "sizes must be positive 32-bit integers, got ", v);
    f.push_back(static_cast<int>(v));
    *N *= v;
  }
  return f;
}

// What v2 would launch for a batch and factor sizes (x: any CUDA tensor of the dtype, for dtype and device):
// (fits, cfg, c, slices per sample, shared bytes per block, blocks per SM, threads, TM, TN, cost, device smem limit)
// version 3: (x Float or BFloat16) what v3 would launch; cfg 0..1 forces a configuration; 4, 5: theirs; 6 (Float):
// v6's configuration (0-2) and slice width
py::dict fused_plan(const at::Tensor& x, int64_t batch, py::sequence sizes, int64_t cfg, int64_t cols,
                    int64_t version) {
  LAB_CHECK_VALUE(version >= 2 && version <= kLastVersion, "fused_plan: version must be 2, 3, 4, 5 or 6, got ",
                  version);
  if (tensor_cores(version))
    lab::check_dtype(x, "x", {at::kFloat, at::kBFloat16});
  else
    lab::check_dtype(x, "x", {at::kFloat, at::kDouble});
  LAB_CHECK_VALUE(x.is_cuda(), "fused_plan: x must be a CUDA tensor (it names the device and dtype), got ",
                    x.device().str());
  int64_t N = 1;
  const std::vector<int> f = factor_sizes(sizes, &N);
  LAB_CHECK_VALUE(cfg >= -1 && cfg <= 2, "fused_plan: cfg must be -1 (automatic) or 0..2, got ", cfg);
  std::vector<int64_t> info(kron::kPlanFields, 0);
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  if (version == 6) {  // fits = 0: v6 does not apply (Double tensors, K != 2, ...) and runs v2
    if (x.scalar_type() == at::kFloat)
      lab::launcher<V5Plan>("kron_v6_plan@f32")(batch, N, f.data(), int(f.size()), int(cfg), int(cols),
                                                info.data());
  } else if (version >= 3) {
    Sizes s;
    s.B = batch;
    s.N = N;
    s.f = f;
    if (version == 4)
      v4_plan(x.scalar_type(), s, cols, info.data());  // fits = 0: v4 does not apply and runs v3
    else if (version == 5)
      v5_plan(x.scalar_type(), s, cfg, cols, info.data());  // the same for v5
    else
      v3_plan(x.scalar_type(), s, cfg, cols, info.data());
  } else {
    const FusedKernels kern = fused_kernels(x.scalar_type());
    lab::launcher<FusedPlanFn>(kname("kron_fused_plan", x.scalar_type()))(batch, N, f.data(), int(f.size()),
                                                                         int(cfg), int(cols), &kern, info.data());
  }
#else
  LAB_NO_CUDA_BUILD("fused_plan");
#endif
  py::dict d;
  for (int i = 0; i < kron::kPlanFields; ++i) d[kron::kPlanFieldNames[i]] = py::int_(info[size_t(i)]);
  return d;
}

// Which backward a compiled version runs for a batch and factor sizes on x's device and dtype (16-byte aligned tensors
// assumed): "backward_tc.cu" (versions 3-5), "backward_v6.cu" (version 6, Float, where its fused kernel's plan applies)
// or "backward.cu" (versions 1, 2, and 6 elsewhere); "cpu.cpp" on the CPU.
std::string backward_kernels(const at::Tensor& x, int64_t batch, py::sequence sizes, int64_t version) {
  lab::check_version(x, "x", version, 1, kLastVersion, "kron");
  int64_t N = 1;
  const std::vector<int> f = factor_sizes(sizes, &N);
  if (!x.is_cuda()) return "cpu.cpp";
  if (tensor_cores(version)) return "backward_tc.cu";
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  if (version == 6 && x.scalar_type() == at::kFloat &&
      lab::launcher<BackwardWorkspace>("kron_v6_backward_workspace@f32")(batch, N, f.data(), int(f.size())) > 0)
    return "backward_v6.cu";
#endif
  return "backward.cu";
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Kronecker-factored linear layer y = x (W_K kron ... kron W_1); version 0 = C++ CPU code, 1 = per-factor "
            "CUDA kernels, 2 = fused CUDA kernel, 3 = fused on tensor cores (TF32 / bf16), 4 = two factors on wgmma, "
            "5 = wgmma fed by TMA, 6 = two factors in strict fp32 with every operand in flight";
  m.def("forward", lab::bind(forward),
        "forward(x, factors, out, states, version, cfg, cols) -> out = x (W_K kron ... kron W_1)");
  m.def("backward", lab::bind(backward),
        "backward(g, x, factors, states, dx, dws, version) -> dx; dws[k] = dL/dfactors[k]");
  m.def("apply", lab::bind(apply),
        "apply(x, factors, version, cfg, cols) -> y = x (W_K kron ... kron W_1), differentiable in x and every factor "
        "(a C++ autograd Function: its backward runs the backward above without the GIL)");
  m.def("fused_plan", lab::bind(fused_plan),
        "fused_plan(x, batch, sizes, cfg, cols, version) -> {fits, cfg, c, slices, smem_bytes, blocks_per_sm, threads, TM, TN, "
        "cost, smem_limit} (cuda_src/kron/plan_info.h)");
  m.def("backward_kernels", lab::bind(backward_kernels),
        "backward_kernels(x, batch, sizes, version) -> the source file whose kernels that version's backward runs");
  LAB_BIND_UNITS(m);
}
