// faulty — a family that lives in the tests, not in the lab: versions that are wrong on purpose (a CPU version that
// dies with SIGSEGV, one that never returns, a kernel that writes out of bounds, one that spins forever) beside a
// correct one, so the tests can show that lab.isolate reports each as that version's result and the caller lives.
#include "lab_common.h"

at::Tensor scale(const at::Tensor& x, at::Tensor out, const std::string& version) {
  lab::check_dtype(x, "x", {at::kFloat});
  lab::check_contiguous(x, "x");
  lab::check_out(out, "out", x, x.sizes(), "like x");
  if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(x.device());
    auto fn = lab::launcher<cudaError_t (*)(const float*, float*, int64_t, cudaStream_t)>("scale_" + version);
    LAB_CUDA_CHECK(fn(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), LAB_STREAM()), "scale kernel");
#else
    LAB_NO_CUDA_BUILD("scale");
#endif
  } else {
    auto fn = lab::launcher<void (*)(const float*, float*, int64_t)>("scale_cpu_" + version);
    fn(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale", lab::bind(scale), "scale(x, out, version) -> out = 2 x (or a deliberate fault)");
  LAB_BIND_UNITS(m);
}
