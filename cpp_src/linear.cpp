// linear.cpp — torch-facing nn.Linear forward (y = x·Wᵀ + b) of the linear family, and its C++ CPU version.
//
// x: (..., in_features), contiguous; weight: (out_features, in_features) exactly as nn.Linear stores it (read in
// place: no transposed copy, on either device); bias: (out_features,) or None; out: (..., out_features), allocated by
// the caller (the lab poisons it before a check). version: 0 = the C++ CPU code (CPU tensors), 1..13 = the CUDA
// versions in cuda_src/linear.cu (float32, except 10 and 12: bfloat16; 9 and 11 multiply in TF32).
#include "lab_common.h"

#include <algorithm>

#ifdef LAB_WITH_CUDA
cudaError_t linear_forward_f32(int version, const float* x, const float* w, const float* b, float* y, int M, int N,
                               int K, cudaStream_t stream);
cudaError_t linear_forward_bf16(int version, const void* x, const void* w, const void* b, void* y, int M, int N,
                                int K, cudaStream_t stream);
#endif

namespace {

constexpr int64_t kMaxVersion = 13;

const char* version_label(int64_t v) {
  switch (v) {
    case 9: return "v9 (TF32 mma.sync)";
    case 10: return "v10 (bf16 mma.sync)";
    case 11: return "v11 (TF32 wgmma)";
    case 12: return "v12 (bf16 wgmma)";
    default: return nullptr;
  }
}

// ---- the C++ CPU version ----------------------------------------------------------------------------------------
// y[m, n] = b[n] + sum_k x[m, k]·w[n, k]. Both operands are K-contiguous, so the natural inner loop is a dot
// product; a plain float reduction does not vectorise (it would reorder the sum), so each dot product keeps kVL
// partial sums, one per vector lane, reduced once at the end. The micro-kernel computes a 2x4 block of y: every
// 8-wide x chunk it loads feeds 4 products, every W chunk 2 (6 vector loads per 8 vector FMAs).
// Cache blocking: parallel over 64x64 tiles of y; inside a tile K is swept in chunks of 512 (x and W slabs of
// 64 x 512 x 4 B = 128 KB each, L2-resident while the 2x4 micro-tiles sweep them).
constexpr int64_t kVL = 8, kMR = 2, kNR = 4, kTileM = 64, kTileN = 64, kKc = 512;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// One binary, the widest vectors the CPU has: GCC builds an AVX2+FMA clone and a baseline (SSE2) clone and picks one
// when the module loads.
#define LAB_CPU_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define LAB_CPU_CLONES
#endif

// acc[r][c] += dot(x_r[0:kc], w_c[0:kc]) for r < kMR, c < kNR (full micro-tile).
LAB_CPU_CLONES void micro_2x4(const float* x0, const float* x1, const float* w0, const float* w1, const float* w2,
                              const float* w3, int64_t kc, float* acc) {
  float s[kMR][kNR][kVL] = {};
  const float* xs[kMR] = {x0, x1};
  const float* ws[kNR] = {w0, w1, w2, w3};
  int64_t k = 0;
  for (; k + kVL <= kc; k += kVL)
    for (int r = 0; r < kMR; ++r)
      for (int c = 0; c < kNR; ++c)
        for (int l = 0; l < kVL; ++l) s[r][c][l] += xs[r][k + l] * ws[c][k + l];
  for (int r = 0; r < kMR; ++r)
    for (int c = 0; c < kNR; ++c) {
      float t = 0.f;
      for (int l = 0; l < kVL; ++l) t += s[r][c][l];
      for (int64_t kk = k; kk < kc; ++kk) t += xs[r][kk] * ws[c][kk];
      acc[r * kNR + c] += t;
    }
}

// One dot product (edges of a tile where a full 2x4 micro-tile does not fit).
LAB_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  float s[kVL] = {};
  int64_t k = 0;
  for (; k + kVL <= n; k += kVL)
    for (int l = 0; l < kVL; ++l) s[l] += a[k + l] * b[k + l];
  float t = 0.f;
  for (int l = 0; l < kVL; ++l) t += s[l];
  for (; k < n; ++k) t += a[k] * b[k];
  return t;
}

void linear_cpu(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t tiles_m = lab::ceil_div(M, kTileM), tiles_n = lab::ceil_div(N, kTileN);
  at::parallel_for(0, tiles_m * tiles_n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = (t / tiles_n) * kTileM, m1 = std::min(M, m0 + kTileM);
      const int64_t n0 = (t % tiles_n) * kTileN, n1 = std::min(N, n0 + kTileN);
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t n = n0; n < n1; ++n) y[m * N + n] = b ? b[n] : 0.f;
      for (int64_t k0 = 0; k0 < K; k0 += kKc) {
        const int64_t kc = std::min(kKc, K - k0);
        for (int64_t m = m0; m < m1; m += kMR) {
          for (int64_t n = n0; n < n1; n += kNR) {
            if (m + kMR <= m1 && n + kNR <= n1) {
              float acc[kMR * kNR] = {};
              const float* xr = x + m * K + k0;
              const float* wr = w + n * K + k0;
              micro_2x4(xr, xr + K, wr, wr + K, wr + 2 * K, wr + 3 * K, kc, acc);
              for (int r = 0; r < kMR; ++r)
                for (int c = 0; c < kNR; ++c) y[(m + r) * N + n + c] += acc[r * kNR + c];
            } else {
              for (int64_t r = m; r < std::min(m + kMR, m1); ++r)
                for (int64_t c = n; c < std::min(n + kNR, n1); ++c)
                  y[r * N + c] += dot(x + r * K + k0, w + c * K + k0, kc);
            }
          }
        }
      }
    }
  });
}

}  // namespace

// ---- torch-facing function --------------------------------------------------------------------------------------
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor out,
                  int64_t version) {
  lab::check_dtype(x, "x", {at::kFloat, at::kBFloat16});
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have shape (..., in_features), got a 0-D tensor");
  lab::check_contiguous(x, "x");
  lab::check_dim(weight, "weight", 2, "(out_features, in_features)");
  lab::check_same_dtype(weight, "weight", x, "x");
  lab::check_same_device(weight, "weight", x, "x");
  const int64_t K = x.size(-1), N = weight.size(0);
  TORCH_CHECK_VALUE(weight.size(1) == K, "weight must have shape (out_features, in_features) with in_features = "
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

  if (x.is_cuda()) {
    TORCH_CHECK_VALUE(version >= 1 && version <= kMaxVersion, "linear: CUDA versions are 1..", kMaxVersion, ", got ",
                      version);
    const bool wants_bf16 = version == 10 || version == 12;
    TORCH_CHECK_TYPE(wants_bf16 == (x.scalar_type() == at::kBFloat16), "linear: version ", version, " takes ",
                     wants_bf16 ? "BFloat16" : "Float", " tensors (x, weight, bias, out), got ",
                     c10::toString(x.scalar_type()));
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(x.device());
    if (version == 11 || version == 12) {
      int major = 0, minor = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, x.get_device());
      TORCH_CHECK_VALUE(major == 9, "linear: ", version_label(version), " uses Hopper's wgmma and TMA (sm_90); this "
                        "GPU is sm_", major, minor, " (use v9/v10, the mma.sync versions)");
    }
    const int m = lab::check_int32(M, "M (rows of x)"), n = lab::check_int32(N, "out_features"),
              k = lab::check_int32(K, "in_features");
    const std::string what = "linear v" + std::to_string(version) + " kernel";
    if (x.scalar_type() == at::kFloat) {
      LAB_CUDA_CHECK(linear_forward_f32(int(version), x.data_ptr<float>(), weight.data_ptr<float>(),
                                        b ? b->data_ptr<float>() : nullptr, out.data_ptr<float>(), m, n, k,
                                        LAB_STREAM()),
                     what);
    } else {
      LAB_CUDA_CHECK(linear_forward_bf16(int(version), x.data_ptr(), weight.data_ptr(), b ? b->data_ptr() : nullptr,
                                         out.data_ptr(), m, n, k, LAB_STREAM()),
                     what);
    }
#else
    LAB_NO_CUDA_BUILD("linear");
#endif
  } else {
    TORCH_CHECK_VALUE(x.device().is_cpu(), "linear: x must be on cpu or cuda, got ", x.device().str());
    TORCH_CHECK_VALUE(version == 0, "linear: version ", version, " is a CUDA kernel but x is on the CPU (use version "
                      "0, the C++ CPU code)");
    TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "linear: the C++ CPU version takes Float tensors, got ",
                     c10::toString(x.scalar_type()));
    linear_cpu(x.data_ptr<float>(), weight.data_ptr<float>(), b ? b->data_ptr<float>() : nullptr,
               out.data_ptr<float>(), M, N, K);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nn.Linear forward y = x @ weight.T + bias: SGEMM ladder v1..v8, tensor cores v9..v12, GEMV v13; "
            "version 0 = C++ CPU code";
  m.def("linear", lab::bind(linear),
        "linear(x, weight, bias, out, version) -> out = x @ weight.T + bias (weight as nn.Linear stores it)");
}
