// linear/linear.cpp — the binding of the linear family: torch-facing nn.Linear forward (y = x·Wᵀ + b) for its two ops,
// linear (the GEMM ladder) and gemv (a few rows: the memory-bound GEMV), named input checks, then a call of the
// launcher that a unit exports (cuda_src/linear/<unit>.cu for CUDA tensors, cpp_src/linear/cpu.cpp for CPU tensors),
// looked up by name (lab::launcher, lab_common.h). No kernel code here: editing a kernel never recompiles this file.
//
// x: (..., in_features), contiguous; weight: (out_features, in_features) exactly as nn.Linear stores it (read in
// place: no transposed copy, on either device); bias: (out_features,) or None; out: (..., out_features), allocated by
// the caller (the lab poisons it before a check). version: 0 = the C++ CPU code (CPU tensors, float32; both ops);
// linear: 1..12 = the CUDA versions in cuda_src/linear/ (1..9 and 12 float32; 10 and 11 float32, multiplying in
// TF32, or bfloat16: the dtype of the tensors picks the build); gemv: 1 = cuda_src/linear/gemv_v1.cu (float32).
#include "lab_common.h"

#include <type_traits>

namespace {

constexpr int64_t kLinearVersions = 12;  // the GEMM ladder: v1..v12
constexpr int64_t kGemvVersions = 1;     // gemv: v1

using LinearCpu = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);

// The checks both ops share: shapes, dtypes, devices, contiguity. Returns M (rows of x, leading dims flattened), N, K
// and the bias (nullptr when None).
struct Problem {
  int64_t M = 1, N = 0, K = 0;
  const at::Tensor* b = nullptr;
};
Problem check_problem(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, const at::Tensor& out) {
  lab::check_dtype(x, "x", {at::kFloat, at::kBFloat16});
  LAB_CHECK_VALUE(x.dim() >= 1, "x must have shape (..., in_features), got a 0-D tensor");
  lab::check_contiguous(x, "x");
  lab::check_dim(weight, "weight", 2, "(out_features, in_features)");
  lab::check_same_dtype(weight, "weight", x, "x");
  lab::check_same_device(weight, "weight", x, "x");
  Problem p;
  p.K = x.size(-1);
  p.N = weight.size(0);
  LAB_CHECK_VALUE(weight.size(1) == p.K, "weight must have shape (out_features, in_features) with in_features = "
                    "x.size(-1) = ", p.K, ", got ", lab::shape_str(weight.sizes()));
  lab::check_contiguous(weight, "weight");
  p.b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  if (p.b) {
    lab::check_same_dtype(*p.b, "bias", x, "x");
    lab::check_same_device(*p.b, "bias", x, "x");
    lab::check_shape(*p.b, "bias", {p.N}, "(out_features,)");
    lab::check_contiguous(*p.b, "bias");
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = p.N;
  lab::check_out(out, "out", x, out_shape, "(..., out_features)");
  lab::check_no_overlap(out, "out", x, "x");  // every output tile reads whole rows of x and of weight
  lab::check_no_overlap(out, "out", weight, "weight");
  if (p.b) lab::check_no_overlap(out, "out", *p.b, "bias");
  for (int64_t i = 0; i + 1 < x.dim(); ++i) p.M *= x.size(i);
  return p;
}

// No backward: an input that requires grad (under grad mode) is refused, not given an output that silently does not.
void check_no_grad(const char* op, const at::Tensor& x, const at::Tensor& weight, const Problem& p) {
  lab::check_no_grad(x, "x", op);
  lab::check_no_grad(weight, "weight", op);
  if (p.b) lab::check_no_grad(*p.b, "bias", op);
}

void run_cpu(const char* op, const at::Tensor& x, const at::Tensor& weight, const Problem& p, at::Tensor& out) {
  LAB_CHECK_TYPE(x.scalar_type() == at::kFloat, op, ": the C++ CPU version takes Float tensors, got ",
                   c10::toString(x.scalar_type()));
  lab::launcher<LinearCpu>("linear_cpu")(x.data_ptr<float>(), weight.data_ptr<float>(),
                                        p.b ? p.b->data_ptr<float>() : nullptr, out.data_ptr<float>(), p.M, p.N, p.K);
}

// What both ops do first, in this order: the input checks, the version's range (1..versions on CUDA, 0 on the CPU),
// no grad; then version 0 runs here on CPU tensors. Sets cpu_done when it did (out is written: the op returns it).
Problem prologue(const char* op, int64_t versions, const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t version, bool& cpu_done) {
  const Problem p = check_problem(x, weight, bias, out);
  lab::check_version(x, "x", version, 1, versions, op);
  check_no_grad(op, x, weight, p);
  cpu_done = !x.is_cuda();
  if (cpu_done) run_cpu(op, x, weight, p, out);
  return p;
}

#ifdef LAB_WITH_CUDA
// The CUDA launchers take T = float or at::BFloat16 (the units' __nv_bfloat16: the same 16-bit layout).
template <class T> using ForwardCuda = cudaError_t (*)(const T*, const T*, const T*, T*, int, int, int, cudaStream_t);
template <class T> using FillCuda = cudaError_t (*)(const T*, T*, int, int, cudaStream_t);

// M, N, K as the kernels' 32-bit ints (both ops' CUDA paths).
struct Dims32 {
  int m, n, k;
};
Dims32 dims32(const Problem& p) {
  return {lab::check_int32(p.M, "M (rows of x)"), lab::check_int32(p.N, "out_features"),
          lab::check_int32(p.K, "in_features")};
}

// The name each GEMM version's launcher is exported under; "name@variant" is one build of a unit built once per
// variant (// lab:variants in v8_v9.cu, v10.cu, v11.cu: v10 and v11 once per dtype). cuda_src/linear/linear.cuh lists
// the units.
const char* linear_launcher(int64_t v, bool bf16) {
  switch (v) {
    case 1: return "v1";
    case 2: return "v2";
    case 3: return "v3";
    case 4: return "v4";
    case 5: return "v5";
    case 6: return "v6";
    case 7: return "v7";
    case 8: return "async_warptile@v8";
    case 9: return "async_warptile@v9";
    case 10: return bf16 ? "mma_sync@bf16" : "mma_sync@f32";
    case 11: return bf16 ? "wgmma@bf16" : "wgmma@f32";
    case 12: return "splitk";
    default: return "(no such version)";
  }
}

// What both ops do before their version's launcher: an empty y needs nothing; K == 0 is y = b (or zeros), by the fill
// unit.
template <class T>
cudaError_t launch(const char* name, const T* x, const T* w, const T* b, T* y, int M, int N, int K, cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  if (K == 0) return lab::launcher<FillCuda<T>>(std::is_same_v<T, float> ? "fill_f32" : "fill_bf16")(b, y, M, N, s);
  return lab::launcher<ForwardCuda<T>>(name)(x, w, b, y, M, N, K, s);
}

// v11 on operands TMA cannot take (rows not a multiple of 16 bytes, or bases not 16-byte aligned) runs v10's
// mma.sync kernel of the same dtype, whose launcher then picks its element-wise loads (its vec_in is this same test).
template <class T>
cudaError_t linear_cuda(int64_t version, const T* x, const T* w, const T* b, T* y, int M, int N, int K,
                        cudaStream_t s) {
  const bool tma_ok = (int64_t(K) * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (version == 11 && !tma_ok) version = 10;
  return launch<T>(linear_launcher(version, !std::is_same_v<T, float>), x, w, b, y, M, N, K, s);
}

template <class T> T* ptr(const at::Tensor& t) { return t.data_ptr<T>(); }
template <class T> const T* ptr_or_null(const at::Tensor* t) { return t ? t->data_ptr<T>() : nullptr; }
#endif

}  // namespace

// ---- torch-facing functions ------------------------------------------------------------------------------------
// op linear: the GEMM ladder. version 0 (CPU) or 1..12; the tensors' dtype picks float32 (TF32 for 10, 11) or
// bfloat16 for 10 and 11.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor out,
                  int64_t version) {
  bool cpu_done = false;
  [[maybe_unused]] const Problem p =  // unused where the CUDA path is compiled out (a CPU-only build)
      prologue("linear", kLinearVersions, x, weight, bias, out, version, cpu_done);
  if (cpu_done) return out;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  // (not version >= 10: v12 is float32 only, and its launcher would read bfloat16 data as floats)
  LAB_CHECK_TYPE(!bf16 || version == 10 || version == 11, "linear: version ", version, " takes Float tensors (x, "
                   "weight, bias, out), got BFloat16 (the bfloat16 versions are 10 and 11)");
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  if (version == 11) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, x.get_device());
    LAB_CHECK_VALUE(major == 9, "linear: v11 uses Hopper's wgmma and TMA (sm_90); this GPU is sm_", major, minor,
                      " (use v10, the mma.sync version)");
  }
  if (version == 12) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
    LAB_CHECK_VALUE(major >= 9, "linear: v12 splits K over a thread-block cluster (sm_90+); this GPU is sm_", major,
                    "x (use v8)");
  }
  const auto [m, n, k] = dims32(p);
  const std::string what = lab::cat("linear v", version, " kernel");
  if (bf16) {
    using T = at::BFloat16;
    LAB_CUDA_CHECK(linear_cuda<T>(version, ptr<T>(x), ptr<T>(weight), ptr_or_null<T>(p.b), ptr<T>(out), m, n, k,
                                  LAB_STREAM()),
                   what);
  } else {
    LAB_CUDA_CHECK(linear_cuda<float>(version, ptr<float>(x), ptr<float>(weight), ptr_or_null<float>(p.b),
                                      ptr<float>(out), m, n, k, LAB_STREAM()),
                   what);
  }
#else
  LAB_NO_CUDA_BUILD("linear");
#endif
  return out;
}

// op gemv: the same layer at a few rows. version 0 (CPU: the same C++ code as linear's) or 1 (float32).
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor out,
                int64_t version) {
  bool cpu_done = false;
  [[maybe_unused]] const Problem p =  // unused where the CUDA path is compiled out (a CPU-only build)
      prologue("gemv", kGemvVersions, x, weight, bias, out, version, cpu_done);
  if (cpu_done) return out;
  LAB_CHECK_TYPE(x.scalar_type() == at::kFloat, "gemv: version ", version, " takes Float tensors (x, weight, bias, "
                   "out), got ", c10::toString(x.scalar_type()), " (for bfloat16 use the linear op's v10 or v11)");
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  const auto [m, n, k] = dims32(p);
  LAB_CUDA_CHECK(launch<float>("gemv_v1", ptr<float>(x), ptr<float>(weight), ptr_or_null<float>(p.b),
                               ptr<float>(out), m, n, k, LAB_STREAM()),
                 lab::cat("gemv v", version, " kernel"));
#else
  LAB_NO_CUDA_BUILD("gemv");
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nn.Linear forward y = x @ weight.T + bias: op linear (SGEMM ladder v1..v9, tensor cores v10..v11 in "
            "TF32 or bf16 by the tensors' dtype) and op gemv (v1, a few rows); version 0 = C++ CPU code";
  m.def("linear", lab::bind(linear),
        "linear(x, weight, bias, out, version) -> out = x @ weight.T + bias (weight as nn.Linear stores it)");
  m.def("gemv", lab::bind(gemv),
        "gemv(x, weight, bias, out, version) -> out = x @ weight.T + bias for a few rows of x (the GEMV op)");
  LAB_BIND_UNITS(m);
}
