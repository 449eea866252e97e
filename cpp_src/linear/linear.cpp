// linear/linear.cpp — the binding of the linear family: torch-facing nn.Linear forward (y = x·Wᵀ + b), named input
// checks, then a call of the launcher that a unit exports (cuda_src/linear/<unit>.cu for CUDA tensors,
// cpp_src/linear/cpu.cpp for CPU tensors), looked up by name (lab::launcher, lab_common.h). No kernel code here:
// editing a kernel never recompiles this file.
//
// x: (..., in_features), contiguous; weight: (out_features, in_features) exactly as nn.Linear stores it (read in
// place: no transposed copy, on either device); bias: (out_features,) or None; out: (..., out_features), allocated by
// the caller (the lab poisons it before a check). version: 0 = the C++ CPU code (CPU tensors), 1..14 = the CUDA
// versions in cuda_src/linear/ (float32, except 11 and 13: bfloat16; 10 and 12 multiply in TF32).
#include "lab_common.h"

#include <type_traits>

namespace {

constexpr int64_t kMaxVersion = 14;

const char* version_label(int64_t v) {
  switch (v) {
    case 10: return "v10 (TF32 mma.sync)";
    case 11: return "v11 (bf16 mma.sync)";
    case 12: return "v12 (TF32 wgmma)";
    case 13: return "v13 (bf16 wgmma)";
    default: return nullptr;
  }
}

using LinearCpu = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);

#ifdef LAB_WITH_CUDA
// The CUDA launchers take T = float or at::BFloat16 (the units' __nv_bfloat16: the same 16-bit layout).
template <class T> using ForwardCuda = cudaError_t (*)(const T*, const T*, const T*, T*, int, int, int, cudaStream_t);
template <class T> using FillCuda = cudaError_t (*)(const T*, T*, int, int, cudaStream_t);

// The name each CUDA version's launcher is exported under; "name@variant" is one build of a unit built once per
// variant (// lab:variants in v8_v9.cu, v10_v11.cu, v12_v13.cu). cuda_src/linear/linear.cuh lists the units.
const char* launcher_name(int64_t v) {
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
    case 10: return "mma_sync@f32";
    case 11: return "mma_sync@bf16";
    case 12: return "wgmma@f32";
    case 13: return "wgmma@bf16";
    case 14: return "v14";
    default: return "(no such version)";
  }
}

// The choices that cross units (the old forward_f32 / forward_bf16 and launch_wgmma made them in one file): an
// empty y needs nothing; K == 0 is y = b (or zeros), by the fill unit; v12/v13 on operands TMA cannot take (rows not
// a multiple of 16 bytes, or bases not 16-byte aligned) run v10/v11's mma.sync kernel of the same precision, whose
// launcher then picks its element-wise loads (its vec_in is this same test), as launch_wgmma did; else the
// version's own launcher.
template <class T>
cudaError_t forward_cuda(int64_t version, const T* x, const T* w, const T* b, T* y, int M, int N, int K,
                         cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  if (K == 0) return lab::launcher<FillCuda<T>>(std::is_same_v<T, float> ? "fill_f32" : "fill_bf16")(b, y, M, N, s);
  const bool tma_ok = (int64_t(K) * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if ((version == 12 || version == 13) && !tma_ok) version -= 2;
  return lab::launcher<ForwardCuda<T>>(launcher_name(version))(x, w, b, y, M, N, K, s);
}
#endif

}  // namespace

// ---- torch-facing function --------------------------------------------------------------------------------------
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor out,
                  int64_t version) {
  lab::check_dtype(x, "x", {at::kFloat, at::kBFloat16});
  LAB_CHECK_VALUE(x.dim() >= 1, "x must have shape (..., in_features), got a 0-D tensor");
  lab::check_contiguous(x, "x");
  lab::check_dim(weight, "weight", 2, "(out_features, in_features)");
  lab::check_same_dtype(weight, "weight", x, "x");
  lab::check_same_device(weight, "weight", x, "x");
  const int64_t K = x.size(-1), N = weight.size(0);
  LAB_CHECK_VALUE(weight.size(1) == K, "weight must have shape (out_features, in_features) with in_features = "
                    "x.size(-1) = ", K, ", got ", lab::shape_str(weight.sizes()));
  lab::check_contiguous(weight, "weight");
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  if (b) {
    lab::check_same_dtype(*b, "bias", x, "x");
    lab::check_same_device(*b, "bias", x, "x");
    lab::check_shape(*b, "bias", {N}, "(out_features,)");
    lab::check_contiguous(*b, "bias");
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  lab::check_out(out, "out", x, out_shape, "(..., out_features)");
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);

  lab::check_version(x, "x", version, 1, kMaxVersion, "linear");
  lab::check_no_grad(x, "x", "linear");
  lab::check_no_grad(weight, "weight", "linear");
  if (b) lab::check_no_grad(*b, "bias", "linear");
  if (x.is_cuda()) {
    const bool wants_bf16 = version == 11 || version == 13;
    LAB_CHECK_TYPE(wants_bf16 == (x.scalar_type() == at::kBFloat16), "linear: version ", version, " takes ",
                     wants_bf16 ? "BFloat16" : "Float", " tensors (x, weight, bias, out), got ",
                     c10::toString(x.scalar_type()));
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(x.device());
    if (version == 12 || version == 13) {
      int major = 0, minor = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, x.get_device());
      LAB_CHECK_VALUE(major == 9, "linear: ", version_label(version), " uses Hopper's wgmma and TMA (sm_90); this "
                        "GPU is sm_", major, minor, " (use v10/v11, the mma.sync versions)");
    }
    const int m = lab::check_int32(M, "M (rows of x)"), n = lab::check_int32(N, "out_features"),
              k = lab::check_int32(K, "in_features");
    const std::string what = lab::cat("linear v", version, " kernel");
    if (x.scalar_type() == at::kFloat) {
      LAB_CUDA_CHECK(forward_cuda<float>(version, x.data_ptr<float>(), weight.data_ptr<float>(),
                                         b ? b->data_ptr<float>() : nullptr, out.data_ptr<float>(), m, n, k,
                                         LAB_STREAM()),
                     what);
    } else {
      LAB_CUDA_CHECK(forward_cuda<at::BFloat16>(version, x.data_ptr<at::BFloat16>(), weight.data_ptr<at::BFloat16>(),
                                                b ? b->data_ptr<at::BFloat16>() : nullptr,
                                                out.data_ptr<at::BFloat16>(), m, n, k, LAB_STREAM()),
                     what);
    }
#else
    LAB_NO_CUDA_BUILD("linear");
#endif
  } else {
    LAB_CHECK_TYPE(x.scalar_type() == at::kFloat, "linear: the C++ CPU version takes Float tensors, got ",
                     c10::toString(x.scalar_type()));
    lab::launcher<LinearCpu>("linear_cpu")(x.data_ptr<float>(), weight.data_ptr<float>(),
                                          b ? b->data_ptr<float>() : nullptr, out.data_ptr<float>(), M, N, K);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nn.Linear forward y = x @ weight.T + bias: SGEMM ladder v1..v9, tensor cores v10..v13, GEMV v14; "
            "version 0 = C++ CPU code";
  m.def("linear", lab::bind(linear),
        "linear(x, weight, bias, out, version) -> out = x @ weight.T + bias (weight as nn.Linear stores it)");
  LAB_BIND_UNITS(m);
}
