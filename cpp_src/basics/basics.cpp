// basics/basics.cpp — the binding of the CUDA-basics family: named input checks, then a call of the launcher that
// the units export (cuda_src/basics/<op>.cu for CUDA tensors, cpp_src/basics/cpu.cpp for CPU tensors), looked up by
// name (lab::launcher, lab_common.h). No kernel code here: editing a kernel never recompiles this file.
//
// Every function writes into an `out` tensor the caller allocated (the lab poisons it with NaN before a check, so
// an element the kernel forgot to write fails the check). version: 0 = the C++ CPU code (CPU tensors),
// 1.. = the CUDA versions (CUDA tensors).
#include "lab_common.h"

namespace {

void check_float(const at::Tensor& t, const char* name) {
  lab::check_dtype(t, name, {at::kFloat, at::kDouble});
  lab::check_contiguous(t, name);
}

// The name a unit exports the launcher of `op` under: "<op>_f32" (CUDA units) or "<op>_cpu_f32" (the CPU unit).
std::string kname(const char* op, const at::Tensor& t) {
  return lab::cat(op, t.is_cuda() ? "_" : "_cpu_", lab::dtype_suffix(t.scalar_type()));
}

#ifdef LAB_WITH_CUDA
template <class T> using UnaryCuda = cudaError_t (*)(int, const T*, T*, int64_t, cudaStream_t);
template <class T> using BinaryCuda = cudaError_t (*)(int, const T*, const T*, T*, int64_t, cudaStream_t);
template <class T> using MatmulCuda = cudaError_t (*)(int, const T*, const T*, T*, int, int, int, cudaStream_t);
#endif
template <class T> using UnaryCpu = void (*)(const T*, T*, int64_t);
template <class T> using BinaryCpu = void (*)(const T*, const T*, T*, int64_t);
template <class T> using MatmulCpu = void (*)(const T*, const T*, T*, int64_t, int64_t, int64_t);

}  // namespace

// ---- torch-facing functions ---------------------------------------------------------------------------------
at::Tensor square(const at::Tensor& x, at::Tensor out, int64_t version) {
  check_float(x, "x");
  lab::check_out(out, "out", x, x.sizes(), "like x");
  lab::check_no_overlap(out, "out", x, "x", /*in_place_ok=*/true);  // elementwise
  lab::check_version(x, "x", version, 1, 2, "square");
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "square", [&] {
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      LAB_CUDA_CHECK(lab::launcher<UnaryCuda<scalar_t>>(kname("square", x))(
                         int(version), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, LAB_STREAM()),
                     "square kernel");
#else
      LAB_NO_CUDA_BUILD("square");
#endif
    } else {
      lab::launcher<UnaryCpu<scalar_t>>(kname("square", x))(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n);
    }
  });
  return out;
}

at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b, at::Tensor out, int64_t version) {
  check_float(a, "a");
  check_float(b, "b");
  lab::check_same_dtype(b, "b", a, "a");
  lab::check_same_device(b, "b", a, "a");
  LAB_CHECK_VALUE(a.sizes() == b.sizes(), "b must have the same shape as a = ", lab::shape_str(a.sizes()),
                    ", got ", lab::shape_str(b.sizes()), " (vector_add does not broadcast)");
  lab::check_out(out, "out", a, a.sizes(), "like a");
  lab::check_no_overlap(out, "out", a, "a", /*in_place_ok=*/true);  // elementwise
  lab::check_no_overlap(out, "out", b, "b", /*in_place_ok=*/true);
  lab::check_version(a, "a", version, 1, 4, "vector_add");
  const int64_t n = a.numel();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "vector_add", [&] {
    if (a.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(a.device());
      LAB_CUDA_CHECK(lab::launcher<BinaryCuda<scalar_t>>(kname("vector_add", a))(
                         int(version), a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n,
                         LAB_STREAM()),
                     "vector_add kernel");
#else
      LAB_NO_CUDA_BUILD("vector_add");
#endif
    } else {
      lab::launcher<BinaryCpu<scalar_t>>(kname("vector_add", a))(a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                                                                 out.data_ptr<scalar_t>(), n);
    }
  });
  return out;
}

at::Tensor stencil_1d(const at::Tensor& x, at::Tensor out, int64_t version) {
  check_float(x, "x");
  lab::check_dim(x, "x", 1, "(n,)");
  lab::check_out(out, "out", x, x.sizes(), "(n,)");
  lab::check_no_overlap(out, "out", x, "x");  // out[i] reads x[i - R .. i + R]
  lab::check_version(x, "x", version, 1, 2, "stencil_1d");
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "stencil_1d", [&] {
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      LAB_CUDA_CHECK(lab::launcher<UnaryCuda<scalar_t>>(kname("stencil_1d", x))(
                         int(version), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, LAB_STREAM()),
                     "stencil_1d kernel");
#else
      LAB_NO_CUDA_BUILD("stencil_1d");
#endif
    } else {
      lab::launcher<UnaryCpu<scalar_t>>(kname("stencil_1d", x))(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n);
    }
  });
  return out;
}

at::Tensor matmul(const at::Tensor& A, const at::Tensor& B, at::Tensor out, int64_t version) {
  check_float(A, "A");
  check_float(B, "B");
  lab::check_dim(A, "A", 2, "(M, K)");
  lab::check_dim(B, "B", 2, "(K, N)");
  lab::check_same_dtype(B, "B", A, "A");
  lab::check_same_device(B, "B", A, "A");
  LAB_CHECK_VALUE(B.size(0) == A.size(1), "B must have shape (K, N) with K = A.size(1) = ", A.size(1), ", got ",
                    lab::shape_str(B.sizes()));
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  lab::check_out(out, "out", A, {M, N}, "(M, N)");
  lab::check_no_overlap(out, "out", A, "A");
  lab::check_no_overlap(out, "out", B, "B");
  lab::check_version(A, "A", version, 1, 2, "matmul");
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "matmul", [&] {
    if (A.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(A.device());
      const int m = lab::check_int32(M, "M"), n = lab::check_int32(N, "N"), k = lab::check_int32(K, "K");
      LAB_CHECK_VALUE(lab::ceil_div(M, 32) <= 65535, "matmul: M = ", M, " needs more than 65535 block rows");
      LAB_CUDA_CHECK(lab::launcher<MatmulCuda<scalar_t>>(kname("matmul", A))(
                         int(version), A.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), m,
                         n, k, LAB_STREAM()),
                     "matmul kernel");
#else
      LAB_NO_CUDA_BUILD("matmul");
#endif
    } else {
      lab::launcher<MatmulCpu<scalar_t>>(kname("matmul", A))(A.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(),
                                                             out.data_ptr<scalar_t>(), M, N, K);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA basics: square, vector_add, stencil_1d (radius 3), matmul; version 0 = C++ CPU code";
  m.def("square", lab::bind(square), "square(x, out, version) -> out = x * x");
  m.def("vector_add", lab::bind(vector_add), "vector_add(a, b, out, version) -> out = a + b");
  m.def("stencil_1d", lab::bind(stencil_1d),
        "stencil_1d(x, out, version) -> out[i] = sum of x[i-3..i+3], zeros outside");
  m.def("matmul", lab::bind(matmul), "matmul(A, B, out, version) -> out = A @ B");
  LAB_BIND_UNITS(m);
}
