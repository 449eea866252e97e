// harness/harness.cpp — the binding of the harness's own kernels: probes lab.bench runs to measure this GPU's
// ceilings (cuda_src/harness/fma_peak.cu: the FP32 FMA rate). Not a family: nothing here is checked against a
// reference or benchmarked as a version; lab.bench.fma_peak_tflops calls it.
#include "lab_common.h"

namespace {
#ifdef LAB_WITH_CUDA
using FmaPeakCuda = cudaError_t (*)(float*, int, int, int, cudaStream_t);
#endif
}  // namespace

// FP32 FMA throughput probe: out has one float per thread (blocks * threads); returns out.
at::Tensor fma_peak(at::Tensor out, int64_t blocks, int64_t threads, int64_t iters) {
  lab::check_dtype(out, "out", {at::kFloat});
  lab::check_contiguous(out, "out");
  LAB_CHECK_VALUE(out.numel() == blocks * threads, "out must have blocks * threads = ", blocks * threads,
                  " elements, got ", out.numel());
  LAB_CHECK_VALUE(threads >= 32 && threads <= 1024 && threads % 32 == 0, "threads must be a multiple of 32 in "
                  "[32, 1024], got ", threads);
  LAB_CHECK_VALUE(out.is_cuda(), "fma_peak: out must be a CUDA tensor, got ", out.device().str());
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(out.device());
  LAB_CUDA_CHECK(lab::launcher<FmaPeakCuda>("fma_peak")(out.data_ptr<float>(), lab::check_int32(blocks, "blocks"),
                                                        int(threads), lab::check_int32(iters, "iters"),
                                                        LAB_STREAM()),
                 "fma_peak kernel");
#else
  LAB_NO_CUDA_BUILD("fma_peak");
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "the harness's probes: fma_peak (the FP32 FMA rate behind the 'fma' compute ceiling)";
  m.def("fma_peak", lab::bind(fma_peak), "fma_peak(out, blocks, threads, iters): FP32 FMA probe");
  LAB_BIND_UNITS(m);
}
