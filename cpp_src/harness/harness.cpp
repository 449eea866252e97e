// harness/harness.cpp — the binding of the harness's own kernels: probes that measure this GPU's ceilings and floors
// (cuda_src/harness/fma_peak.cu: the FP32 FMA rate; smem_fill.cu: how long a grid takes to fill its shared memory
// from HBM). Not a family: nothing here is checked against a reference or benchmarked as a version;
// lab.ceilings.fma_peak_tflops and lab.ceilings.smem_fill call it.
#include "lab_common.h"

namespace {
#ifdef LAB_WITH_CUDA
using FmaPeakCuda = cudaError_t (*)(float*, int, int, int, cudaStream_t);
using SmemFillCuda = cudaError_t (*)(const void*, int, int, void*, cudaStream_t);
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

// Shared-memory fill probe: `blocks` blocks each copy bytes_per_block bytes of src (uint8, blocks * bytes_per_block
// of them) into shared memory; sink (blocks, 4) int32 gets each block's last 16 bytes back. Returns sink.
at::Tensor smem_fill(const at::Tensor& src, int64_t blocks, int64_t bytes_per_block, at::Tensor sink) {
  lab::check_dtype(src, "src", {at::kByte});
  lab::check_dtype(sink, "sink", {at::kInt});
  lab::check_contiguous(src, "src");
  lab::check_contiguous(sink, "sink");
  LAB_CHECK_VALUE(blocks >= 1, "blocks must be at least 1, got ", blocks);
  LAB_CHECK_VALUE(bytes_per_block >= 16 && bytes_per_block % 16 == 0, "bytes_per_block must be a positive multiple "
                  "of 16 (the copies move 16-byte pieces), got ", bytes_per_block);
  LAB_CHECK_VALUE(src.numel() >= blocks * bytes_per_block, "src must hold blocks * bytes_per_block = ",
                  blocks * bytes_per_block, " bytes, got ", src.numel());
  lab::check_shape(sink, "sink", {blocks, 4}, "(blocks, 4)");
  LAB_CHECK_VALUE(src.is_cuda() && sink.is_cuda(), "smem_fill: src and sink must be CUDA tensors, got ",
                  src.device().str(), " and ", sink.device().str());
  lab::check_same_device(sink, "sink", src, "src");
  LAB_CHECK_VALUE(reinterpret_cast<uintptr_t>(src.data_ptr()) % 16 == 0, "src must be 16-byte aligned");
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(src.device());
  LAB_CUDA_CHECK(lab::launcher<SmemFillCuda>("smem_fill")(src.data_ptr(), lab::check_int32(blocks, "blocks"),
                                                          lab::check_int32(bytes_per_block, "bytes_per_block"),
                                                          sink.data_ptr(), LAB_STREAM()),
                 "smem_fill kernel (bytes_per_block within the block's opt-in shared memory?)");
#else
  LAB_NO_CUDA_BUILD("smem_fill");
#endif
  return sink;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "the harness's probes: fma_peak (the FP32 FMA rate behind the 'fma' compute ceiling), smem_fill (a "
            "grid filling its shared memory from HBM)";
  m.def("fma_peak", lab::bind(fma_peak), "fma_peak(out, blocks, threads, iters): FP32 FMA probe");
  m.def("smem_fill", lab::bind(smem_fill), "smem_fill(src, blocks, bytes_per_block, sink): shared-memory fill probe");
  LAB_BIND_UNITS(m);
}
