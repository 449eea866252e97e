// sparse24/sparse24.cpp — the binding of the sparse24 family: nn.Linear's forward with a 2:4-sparse weight held in the
// lab's compressed format (values, meta: cuda_src/sparse24/sparse24.cuh), and the compression itself. Named input
// checks, then a call of the launcher a unit exports (cuda_src/sparse24/<unit>.cu for CUDA tensors,
// cpp_src/sparse24/cpu.cpp for CPU tensors), looked up by name. No kernel code here.
//
// compress(w, values, meta): w (out_features, in_features) bf16/fp16, contiguous, already 2:4 along in_features
//   (lab.kernels.sparse24.prune makes it so); values (N, Kp/2) and meta (N, Kp/32) int32 are written, Kp = K rounded
//   up to 32. A group of 4 with more than 2 nonzeros is a ValueError naming its row and columns.
// linear(x, values, meta, in_features, bias, out, version): out (..., N) = x @ W.T + bias. version 0 = the C++ CPU
//   code, 1 = v1 (SIMT GEMV), 2 = v2 (mma.sp tensor cores), 3 = v3 (v1 with two rows per warp), 4 = v4 (wgmma.sp
//   fed by TMA; where TMA cannot take x (in_features % 8 != 0, a misaligned base) or the GPU is not a Hopper, v2).
#include "lab_common.h"

namespace {

constexpr int64_t kVersions = 4;

int64_t padded_k(int64_t K) { return (K + 31) / 32 * 32; }

template <class T> using CompressCpu = int64_t (*)(const T*, T*, int32_t*, int64_t, int64_t);
template <class T>
using LinearCpu = void (*)(const T*, const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t);
#ifdef LAB_WITH_CUDA
using CompressCuda = cudaError_t (*)(const void*, void*, int32_t*, int, int, unsigned long long*, cudaStream_t);
using LinearCuda = cudaError_t (*)(const void*, const void*, const int32_t*, const void*, void*, int, int, int,
                                   cudaStream_t);
#endif

// The compressed weight's two tensors, as compress writes them for an (N, K) weight.
void check_packed(const at::Tensor& values, const at::Tensor& meta, int64_t N, int64_t K, const at::Tensor& like,
                  const char* like_name) {
  const int64_t Kp = padded_k(K);
  lab::check_dim(values, "values", 2, "(out_features, in_features padded to 32 / 2)");
  lab::check_same_dtype(values, "values", like, like_name);
  lab::check_same_device(values, "values", like, like_name);
  LAB_CHECK_VALUE(values.size(1) == Kp / 2, "values must have shape (out_features, ceil(in_features / 32) * 16) = (",
                  values.size(0), ", ", Kp / 2, ") for in_features = ", K, ", got ", lab::shape_str(values.sizes()));
  if (N >= 0) lab::check_shape(values, "values", {N, Kp / 2}, "(out_features, ceil(in_features / 32) * 16)");
  lab::check_contiguous(values, "values");
  LAB_CHECK_VALUE(reinterpret_cast<uintptr_t>(values.data_ptr()) % 16 == 0, "values must be 16-byte aligned (as "
                  "compress allocates it), got a tensor at an offset of ", values.storage_offset(), " elements");
  lab::check_dtype(meta, "meta", {at::kInt});
  lab::check_same_device(meta, "meta", like, like_name);
  lab::check_shape(meta, "meta", {values.size(0), Kp / 32}, "(out_features, ceil(in_features / 32))");
  lab::check_contiguous(meta, "meta");
}

void raise_not_24(int64_t position, int64_t K, const char* what) {
  const int64_t groups = padded_k(K) / 4, row = position / groups, c = (position % groups) * 4;
  LAB_CHECK_VALUE(false, what, " is not 2:4 sparse: row ", row, ", columns ", c, "..", c + 3, " hold more than 2 "
                  "nonzero elements (2:4 allows at most 2 in every aligned group of 4 along in_features); prune it "
                  "first (lab.kernels.sparse24.prune keeps the 2 largest magnitudes of each group)");
}

}  // namespace

// ---- torch-facing functions ------------------------------------------------------------------------------------
void compress(const at::Tensor& w, at::Tensor values, at::Tensor meta) {
  lab::check_dtype(w, "weight", {at::kBFloat16, at::kHalf});
  lab::check_dim(w, "weight", 2, "(out_features, in_features)");
  lab::check_contiguous(w, "weight");
  const int64_t N = w.size(0), K = w.size(1);
  check_packed(values, meta, N, K, w, "weight");
  if (N == 0 || K == 0) {
    meta.fill_(0x44444444);   // every (empty) group keeps columns 0 and 1: still valid metadata
    values.zero_();
    return;
  }
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  if (!w.is_cuda()) {
    const int64_t bad = bf16 ? lab::launcher<CompressCpu<at::BFloat16>>("compress_cpu_bf16")(
                                   w.data_ptr<at::BFloat16>(), values.data_ptr<at::BFloat16>(),
                                   meta.data_ptr<int32_t>(), N, K)
                             : lab::launcher<CompressCpu<at::Half>>("compress_cpu_f16")(
                                   w.data_ptr<at::Half>(), values.data_ptr<at::Half>(), meta.data_ptr<int32_t>(), N, K);
    if (bad >= 0) raise_not_24(bad, K, "weight");
    return;
  }
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(w.device());
  const int n = lab::check_int32(N, "out_features"), k = lab::check_int32(K, "in_features");
  at::Tensor bad = at::full({1}, INT64_MAX, w.options().dtype(at::kLong));   // first bad group (atomicMin)
  LAB_CUDA_CHECK(lab::launcher<CompressCuda>(bf16 ? "compress@bf16" : "compress@f16")(
                     w.data_ptr(), values.data_ptr(), meta.data_ptr<int32_t>(), n, k,
                     reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>()), LAB_STREAM()),
                 "sparse24 compress kernel");
  const int64_t first = bad.item<int64_t>();   // syncs: compression happens once per weight, not per call
  if (first != INT64_MAX) raise_not_24(first, K, "weight");
#else
  LAB_NO_CUDA_BUILD("sparse24 compress");
#endif
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& values, const at::Tensor& meta, int64_t in_features,
                  const std::optional<at::Tensor>& bias, at::Tensor out, int64_t version) {
  const char* op = "sparse24.linear";
  lab::check_dtype(x, "x", {at::kBFloat16, at::kHalf});
  LAB_CHECK_VALUE(x.dim() >= 1, "x must have shape (..., in_features), got a 0-D tensor");
  lab::check_contiguous(x, "x");
  const int64_t K = in_features;
  LAB_CHECK_VALUE(x.size(-1) == K, "x must have shape (..., in_features) with in_features = ", K,
                  " (the compressed weight's), got ", lab::shape_str(x.sizes()));
  check_packed(values, meta, -1, K, x, "x");
  const int64_t N = values.size(0);
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
  lab::check_no_overlap(out, "out", x, "x");  // every output tile reads whole rows of x and of the weight
  lab::check_no_overlap(out, "out", values, "values");
  lab::check_no_overlap(out, "out", meta, "meta");
  if (b) lab::check_no_overlap(out, "out", *b, "bias");
  lab::check_version(x, "x", version, 1, kVersions, op);
  lab::check_no_grad(x, "x", op);
  lab::check_no_grad(values, "values", op);
  if (b) lab::check_no_grad(*b, "bias", op);
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  if (M == 0 || N == 0) return out;
  if (K == 0) {   // y = b (or 0): no kernel for an empty product
    if (b) out.copy_(b->expand_as(out));
    else out.zero_();
    return out;
  }
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  if (!x.is_cuda()) {
    if (bf16) {
      using T = at::BFloat16;
      lab::launcher<LinearCpu<T>>("linear_cpu_bf16")(x.data_ptr<T>(), values.data_ptr<T>(), meta.data_ptr<int32_t>(),
                                                      b ? b->data_ptr<T>() : nullptr, out.data_ptr<T>(), M, N, K);
    } else {
      using T = at::Half;
      lab::launcher<LinearCpu<T>>("linear_cpu_f16")(x.data_ptr<T>(), values.data_ptr<T>(), meta.data_ptr<int32_t>(),
                                                     b ? b->data_ptr<T>() : nullptr, out.data_ptr<T>(), M, N, K);
    }
    return out;
  }
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  const int m = lab::check_int32(M, "M (rows of x)"), n = lab::check_int32(N, "out_features"),
            k = lab::check_int32(K, "in_features");
  const auto run = [&](int64_t v) {
    return lab::launcher<LinearCuda>(lab::cat("v", v, bf16 ? "@bf16" : "@f16"))(
        x.data_ptr(), values.data_ptr(), meta.data_ptr<int32_t>(), b ? b->data_ptr() : nullptr, out.data_ptr(), m, n,
        k, LAB_STREAM());
  };
  cudaError_t e = run(version);
  if (version == 4 && (e == cudaErrorInvalidValue || e == cudaErrorNotSupported)) {
    (void)cudaGetLastError();   // (v4 launched nothing: it refused the operands or the GPU) -> v2, the same product
    e = run(2);
    version = 2;
  }
  LAB_CHECK_VALUE(!(version != 2 && e == cudaErrorInvalidValue), op, ": v", version, " stages a row of x "
                  "(in_features = ", K, ") in shared memory, and it does not fit on this GPU; use v2");
  LAB_CUDA_CHECK(e, lab::cat(op, " v", version, " kernel"));
#else
  LAB_NO_CUDA_BUILD(op);
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nn.Linear forward with a 2:4-sparse weight in the lab's compressed format (values, meta): compress, and "
            "linear v1 (SIMT GEMV) / v2 (mma.sp tensor cores) / v3 (v1, two rows a warp) / v4 (wgmma.sp, TMA); "
            "version 0 = C++ CPU code";
  m.def("compress", lab::bind(compress),
        "compress(weight, values, meta): a 2:4 weight (N, K) -> values (N, Kp/2), meta (N, Kp/32) int32, Kp = K "
        "rounded up to 32; ValueError if a group of 4 holds more than 2 nonzeros");
  m.def("linear", lab::bind(linear),
        "linear(x, values, meta, in_features, bias, out, version) -> out = x @ W.T + bias, W given by (values, meta)");
  LAB_BIND_UNITS(m);
}
