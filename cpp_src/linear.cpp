// linear.cpp — torch-facing nn.Linear forward (y = x·Wᵀ + b) of the linear family, and its C++ CPU version.
//
// x: (..., in_features), contiguous; weight: (out_features, in_features) exactly as nn.Linear stores it (read in
// place: no transposed copy, on either device); bias: (out_features,) or None; out: (..., out_features), allocated by
// the caller (the lab poisons it before a check). version: 0 = the C++ CPU code (CPU tensors), 1..14 = the CUDA
// versions in cuda_src/linear.cu (float32, except 11 and 13: bfloat16; 10 and 12 multiply in TF32).
#include "lab_common.h"

#include <algorithm>

#ifdef LAB_WITH_CUDA
cudaError_t linear_forward_f32(int version, const float* x, const float* w, const float* b, float* y, int M, int N,
                               int K, cudaStream_t stream);
cudaError_t linear_forward_bf16(int version, const void* x, const void* w, const void* b, void* y, int M, int N,
                                int K, cudaStream_t stream);
#endif

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

// ---- the C++ CPU version ----------------------------------------------------------------------------------------
// y[m, n] = b[n] + sum_k x[m, k]·w[n, k]. Both operands are K-contiguous, so the natural inner loop is a dot
// product; a float reduction does not auto-vectorise (that would reorder the sum), so each dot product keeps 8
// partial sums in one vector, one per lane, reduced once at the end (GCC vector extensions: AVX on x86, lowered to
// what the target has elsewhere). The micro-kernel computes a 2x4 block of y from 8 accumulator vectors: each x
// chunk it loads feeds 4 FMAs, each W chunk 2 (6 loads per 8 FMAs).
// Cache blocking: parallel over 64x64 tiles of y; inside a tile K is swept in chunks of 512 (x and W slabs of
// 64 x 512 x 4 B = 128 KB each, L2-resident while the 2x4 micro-tiles sweep them).
constexpr int64_t kMR = 2, kNR = 4, kTileM = 64, kTileN = 64, kKc = 512;
typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// One binary, the widest vectors the CPU has: an AVX2+FMA clone and a baseline (SSE2) clone, picked when the module
// loads; fp-contract lets the AVX2 clone fuse each multiply-add (ISO C++ mode turns contraction off).
#define LAB_CPU_CLONES __attribute__((target_clones("arch=haswell", "default"), optimize("fp-contract=fast")))
#else
#define LAB_CPU_CLONES
#endif
#define LAB_LOAD8(v, p) __builtin_memcpy(&(v), (p), sizeof(v8f))

// acc[r·4 + c] += dot(x_r[0:kc], w_c[0:kc]) for the full 2x4 micro-tile.
LAB_CPU_CLONES void micro_2x4(const float* x0, const float* x1, const float* w0, const float* w1, const float* w2,
                              const float* w3, int64_t kc, float* acc) {
  v8f s00{}, s01{}, s02{}, s03{}, s10{}, s11{}, s12{}, s13{}, a0, a1, b;
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    LAB_LOAD8(a0, x0 + k);
    LAB_LOAD8(a1, x1 + k);
    LAB_LOAD8(b, w0 + k); s00 += a0 * b; s10 += a1 * b;
    LAB_LOAD8(b, w1 + k); s01 += a0 * b; s11 += a1 * b;
    LAB_LOAD8(b, w2 + k); s02 += a0 * b; s12 += a1 * b;
    LAB_LOAD8(b, w3 + k); s03 += a0 * b; s13 += a1 * b;
  }
  const v8f* s[kMR][kNR] = {{&s00, &s01, &s02, &s03}, {&s10, &s11, &s12, &s13}};
  const float* xs[kMR] = {x0, x1};
  const float* ws[kNR] = {w0, w1, w2, w3};
  for (int r = 0; r < kMR; ++r)
    for (int c = 0; c < kNR; ++c) {
      float t = 0.f;
      for (int l = 0; l < 8; ++l) t += (*s[r][c])[l];
      for (int64_t kk = k; kk < kc; ++kk) t += xs[r][kk] * ws[c][kk];
      acc[r * kNR + c] += t;
    }
}

// One dot product (the edges of a tile, where a full 2x4 micro-tile does not fit).
LAB_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  v8f s{}, va, vb;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    LAB_LOAD8(va, a + k);
    LAB_LOAD8(vb, b + k);
    s += va * vb;
  }
  float t = 0.f;
  for (int l = 0; l < 8; ++l) t += s[l];
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
    LAB_CHECK_TYPE(x.scalar_type() == at::kFloat, "linear: the C++ CPU version takes Float tensors, got ",
                     c10::toString(x.scalar_type()));
    linear_cpu(x.data_ptr<float>(), weight.data_ptr<float>(), b ? b->data_ptr<float>() : nullptr,
               out.data_ptr<float>(), M, N, K);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nn.Linear forward y = x @ weight.T + bias: SGEMM ladder v1..v9, tensor cores v10..v13, GEMV v14; "
            "version 0 = C++ CPU code";
  m.def("linear", lab::bind(linear),
        "linear(x, weight, bias, out, version) -> out = x @ weight.T + bias (weight as nn.Linear stores it)");
}
