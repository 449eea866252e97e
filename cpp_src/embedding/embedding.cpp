// embedding/embedding.cpp — the binding of the embedding family: torch-facing functions and named input checks, then
// a call of the launcher a unit exports (cuda_src/embedding/v1.cu, v2.cu for CUDA tensors; cpp_src/embedding/cpu.cpp
// for CPU tensors), looked up by name (lab::launcher, lab_common.h). No kernel code here.
//
// embedding_forward(idx, weight, out, ...) gathers rows; embedding_backward(grad_out, idx, num_embeddings, ...,
// grad_weight, ...) is the dense weight gradient. Both write into outputs the caller allocated (the lab poisons them
// before a check). padding_idx: has_padding = false means none (padding_idx=None in torch); else padding_idx counts
// from the end when negative, as torch's. version: 0 = the C++ CPU code (CPU tensors), 1..4 = the CUDA versions.
// check_indices: every index is checked to lie in [0, num_embeddings) — on the CPU by a loop over them before the
// work; on CUDA, v1/v2 by at::aminmax and a copy of two numbers to the host before the launch, forward v3/v4 by the
// kernel itself (it records the first bad position; one 8-byte copy after it), backward v3/v4 by reading the two ends of
// the sorted indices they make anyway. Each CUDA check is a synchronisation: the price of a ValueError instead of NaN
// rows. Under CUDA-graph capture there is no check (a capture cannot copy to the host); the kernels never read out of
// bounds either way (embedding.cuh).
#include "lab_common.h"

namespace {

constexpr int64_t kMaxForward = 4, kMaxBackward = 4;

const char* idx_suffix(const at::Tensor& idx) { return idx.scalar_type() == at::kInt ? "i32" : "i64"; }

#ifdef LAB_WITH_CUDA
// The CUDA launchers (cuda_src/embedding/embedding.cuh).
using FwdCuda = cudaError_t (*)(const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
                                int64_t num_embeddings, cudaStream_t stream);
using BwdV1Cuda = cudaError_t (*)(const void* grad_out, const void* idx, void* grad_weight, void* acc,
                                  int64_t tokens, int64_t dim, int64_t num_embeddings, int64_t padding_idx,
                                  cudaStream_t stream);
using BwdV2Cuda = cudaError_t (*)(const void* grad_out, const int64_t* sorted, const int64_t* perm,
                                  void* grad_weight, int64_t tokens, int64_t dim, int64_t num_embeddings,
                                  int64_t padding_idx, cudaStream_t stream);
using FwdV3Cuda = cudaError_t (*)(const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
                                  int64_t num_embeddings, unsigned long long* bad_pos, cudaStream_t stream);
using BwdV3Cuda = cudaError_t (*)(const void* grad_out, const int64_t* sorted, const int64_t* perm,
                                  void* grad_weight, int64_t tokens, int64_t dim, int64_t num_embeddings,
                                  int64_t padding_idx, void* workspace, cudaStream_t stream);
using BwdWorkspace = int64_t (*)(int64_t tokens, int64_t dim, int64_t num_embeddings);
using Sort32Cuda = cudaError_t (*)(const void* idx, int64_t tokens, int64_t num_embeddings, void* workspace,
                                   uint32_t* keys, int32_t* pos, int64_t* ends, cudaStream_t stream);
using Sort32Workspace = int64_t (*)(int64_t tokens, int64_t num_embeddings);
using BwdV4Cuda = cudaError_t (*)(const void* grad_out, const uint32_t* keys, const int32_t* pos, void* grad_weight,
                                  int64_t tokens, int64_t dim, int64_t num_embeddings, int64_t padding_idx,
                                  void* workspace, cudaStream_t stream);

// v1's and v2's stable sort of the indices (int64) into (sorted, perm): equal indices in runs, in token order.
std::pair<at::Tensor, at::Tensor> sort_indices(const at::Tensor& idx) {
  auto sp = at::sort(idx.reshape({-1}).to(at::kLong), /*stable=*/true, /*dim=*/0, /*descending=*/false);
  return {std::get<0>(sp).contiguous(), std::get<1>(sp).contiguous()};
}
#endif
// The CPU launchers (cpp_src/embedding/cpu.cpp).
using FwdCpu = void (*)(const void* idx, const void* weight, void* out, int64_t tokens, int64_t dim,
                        int64_t num_embeddings);
using BwdCpu = void (*)(const void* grad_out, const void* idx, void* grad_weight, int64_t tokens, int64_t dim,
                        int64_t num_embeddings, int64_t padding_idx);

void check_idx(const at::Tensor& idx) {
  lab::check_defined(idx, "idx");
  LAB_CHECK_TYPE(idx.scalar_type() == at::kLong || idx.scalar_type() == at::kInt,
                 "idx must be an integer tensor (Long or Int), got ", c10::toString(idx.scalar_type()));
  lab::check_contiguous(idx, "idx");
}

void raise_bad_index(int64_t position, int64_t value, int64_t num_embeddings, const char* op) {
  LAB_CHECK_VALUE(false, op, ": index out of range: idx.flatten()[", position, "] = ", value,
                  ", but indices must be in [0, num_embeddings) = [0, ", num_embeddings, ")",
                  value < 0 ? " (a negative index does not count from the end here, as in torch)" : "");
}

// Every index in [0, num_embeddings): a ValueError naming the first bad one (CPU) or the smallest / largest (CUDA).
template <class I>
void check_range_cpu(const I* p, int64_t n, int64_t num_embeddings, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = int64_t(p[i]);
    if (v < 0 || v >= num_embeddings) raise_bad_index(i, v, num_embeddings, op);
  }
}

void check_range(const at::Tensor& idx, int64_t num_embeddings, const char* op) {
  if (idx.numel() == 0) return;
  if (!idx.is_cuda()) {
    if (idx.scalar_type() == at::kInt) check_range_cpu(idx.data_ptr<int32_t>(), idx.numel(), num_embeddings, op);
    else check_range_cpu(idx.data_ptr<int64_t>(), idx.numel(), num_embeddings, op);
    return;
  }
  auto mm = at::aminmax(idx.reshape({-1}));
  const at::Tensor both = at::stack({std::get<0>(mm), std::get<1>(mm)}).to(at::kLong).cpu();  // syncs
  const int64_t lo = both.data_ptr<int64_t>()[0], hi = both.data_ptr<int64_t>()[1];
  LAB_CHECK_VALUE(lo >= 0, op, ": index out of range: idx contains ", lo,
                  " (its smallest), but indices must be in [0, num_embeddings) = [0, ", num_embeddings,
                  ") (a negative index does not count from the end here, as in torch)");
  LAB_CHECK_VALUE(hi < num_embeddings, op, ": index out of range: idx contains ", hi,
                  " (its largest), but indices must be in [0, num_embeddings) = [0, ", num_embeddings, ")");
}

// torch's rule: padding_idx in [-num_embeddings, num_embeddings), a negative one counted from the end. Returns the
// row, or -1 for none.
int64_t resolve_padding(bool has_padding, int64_t padding_idx, int64_t num_embeddings, const char* op) {
  if (!has_padding) return -1;
  LAB_CHECK_VALUE(padding_idx >= -num_embeddings && padding_idx < num_embeddings, op, ": padding_idx must be "
                  "within num_embeddings: in [-", num_embeddings, ", ", num_embeddings, "), got ", padding_idx);
  return padding_idx < 0 ? padding_idx + num_embeddings : padding_idx;
}

std::vector<int64_t> out_shape(const at::Tensor& idx, int64_t dim) {
  std::vector<int64_t> s(idx.sizes().begin(), idx.sizes().end());
  s.push_back(dim);
  return s;
}

}  // namespace

// ---- torch-facing functions ---------------------------------------------------------------------------------
at::Tensor embedding_forward(const at::Tensor& idx, const at::Tensor& weight, at::Tensor out, bool has_padding,
                             int64_t padding_idx, int64_t version, bool check_indices) {
  const char* op = "embedding";
  check_idx(idx);
  lab::check_dtype(weight, "weight", {at::kFloat, at::kBFloat16, at::kDouble});
  lab::check_dim(weight, "weight", 2, "(num_embeddings, dim)");
  lab::check_contiguous(weight, "weight");
  lab::check_same_device(idx, "idx", weight, "weight");
  lab::check_no_grad(weight, "weight", op, "lab.kernels.embedding.apply_embedding (differentiable)");
  const int64_t V = weight.size(0), D = weight.size(1), T = idx.numel();
  resolve_padding(has_padding, padding_idx, V, op);  // the forward gathers the padding row too: checked, not used
  const auto shape = out_shape(idx, D);
  lab::check_out(out, "out", weight, shape, "idx.shape + (dim,)");
  lab::check_no_overlap(out, "out", weight, "weight");  // a gathered row may be one the kernel is writing
  lab::check_no_overlap(out, "out", idx, "idx");
  lab::check_version(weight, "weight", version, 1, kMaxForward, op);

  const std::string types = lab::cat(lab::dtype_suffix(weight.scalar_type()), "_", idx_suffix(idx));
  if (weight.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(weight.device());
    const cudaStream_t stream = LAB_STREAM();
    // under CUDA-graph capture a check cannot copy to the host (and would not run at replay anyway): the kernels
    // then only guarantee what they do without one (NaN rows for bad indices, never an out-of-bounds read)
    const bool check = check_indices && !lab::stream_capturing(stream);
    if (version < 3) {  // v1, v2: a reduction over idx and a copy of its min and max to the host, before the launch
      if (check) check_range(idx, V, op);
      auto fn = lab::launcher<FwdCuda>(lab::cat("embedding_fwd_v", version, "_", types));
      LAB_CUDA_CHECK(fn(idx.data_ptr(), weight.data_ptr(), out.data_ptr(), T, D, V, stream),
                     "embedding forward kernel");
      return out;
    }
    // v3, v4: the kernel records the first bad position in one word (set to all ones first); one 8-byte read after it
    at::Tensor bad = at::empty({1}, idx.options().dtype(at::kLong));
    LAB_CUDA_CHECK(cudaMemsetAsync(bad.data_ptr(), 0xff, sizeof(int64_t), stream), "cudaMemsetAsync");
    auto fn = lab::launcher<FwdV3Cuda>(lab::cat("embedding_fwd_v", version, "_", types));
    LAB_CUDA_CHECK(fn(idx.data_ptr(), weight.data_ptr(), out.data_ptr(), T, D, V,
                      reinterpret_cast<unsigned long long*>(bad.data_ptr()), stream),
                   "embedding forward kernel");
    if (check) {
      const int64_t pos = bad.item<int64_t>();  // syncs; all ones (-1 as int64) = no bad index
      if (pos >= 0) raise_bad_index(pos, idx.reshape({-1})[pos].item<int64_t>(), V, op);
    }
#else
    LAB_NO_CUDA_BUILD(op);
#endif
    return out;
  }
  if (check_indices) check_range(idx, V, op);
  lab::launcher<FwdCpu>(lab::cat("embedding_fwd_cpu_", types))(idx.data_ptr(), weight.data_ptr(), out.data_ptr(), T,
                                                                D, V);
  return out;
}

at::Tensor embedding_backward(const at::Tensor& grad_out, const at::Tensor& idx, int64_t num_embeddings,
                              bool has_padding, int64_t padding_idx, at::Tensor grad_weight, int64_t version,
                              bool check_indices) {
  const char* op = "embedding_backward";
  check_idx(idx);
  lab::check_dtype(grad_out, "grad_out", {at::kFloat, at::kBFloat16, at::kDouble});
  LAB_CHECK_VALUE(grad_out.dim() == idx.dim() + 1 && grad_out.sizes().slice(0, idx.dim()) == idx.sizes(),
                  op, ": grad_out must have shape idx.shape + (dim,) with idx.shape = ", lab::shape_str(idx.sizes()),
                  ", got ", lab::shape_str(grad_out.sizes()));
  lab::check_contiguous(grad_out, "grad_out");
  lab::check_same_device(idx, "idx", grad_out, "grad_out");
  LAB_CHECK_VALUE(num_embeddings >= 0, op, ": num_embeddings must be >= 0, got ", num_embeddings);
  const int64_t V = num_embeddings, D = grad_out.size(-1), T = idx.numel();
  const int64_t pad = resolve_padding(has_padding, padding_idx, V, op);
  lab::check_out(grad_weight, "grad_weight", grad_out, {V, D}, "(num_embeddings, dim)");
  lab::check_no_overlap(grad_weight, "grad_weight", grad_out, "grad_out");  // it accumulates rows of grad_out
  lab::check_no_overlap(grad_weight, "grad_weight", idx, "idx");
  lab::check_version(grad_out, "grad_out", version, 1, kMaxBackward, op);
  if (check_indices && !grad_out.is_cuda()) check_range(idx, V, op);

  const char* dt = lab::dtype_suffix(grad_out.scalar_type());
  if (grad_out.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(grad_out.device());
    const cudaStream_t stream = LAB_STREAM();
    const bool check = check_indices && !lab::stream_capturing(stream);  // no check under capture (as the forward)
    if (check && version < 3) check_range(idx, V, op);
    if (version == 1) {
      // bf16 adds into an fp32 buffer (embedding.cuh); fp32 and fp64 add into grad_weight itself
      at::Tensor acc;
      if (grad_out.scalar_type() == at::kBFloat16) acc = at::empty({V, D}, grad_out.options().dtype(at::kFloat));
      auto fn = lab::launcher<BwdV1Cuda>(lab::cat("embedding_bwd_v1_", dt, "_", idx_suffix(idx)));
      LAB_CUDA_CHECK(fn(grad_out.data_ptr(), idx.data_ptr(), grad_weight.data_ptr(),
                        acc.defined() ? acc.data_ptr() : nullptr, T, D, V, pad, stream),
                     "embedding backward v1 kernel");
    } else if (version == 2) {
      // v2: equal indices in runs, in token order (a stable sort), for the deterministic kernel
      const auto [sorted, perm] = sort_indices(idx);
      auto fn = lab::launcher<BwdV2Cuda>(lab::cat("embedding_bwd_v2_", dt));
      LAB_CUDA_CHECK(fn(grad_out.data_ptr(), sorted.data_ptr<int64_t>(), perm.data_ptr<int64_t>(),
                        grad_weight.data_ptr(), T, D, V, pad, stream),
                     "embedding backward v2 kernel");
    } else if (version == 3) {
      // v3: the same sort; its ends are the smallest and largest index, so the check reads two numbers, no reduction
      LAB_CHECK_VALUE(D <= 128 * 65535, op, ": v3 handles dim <= ", 128 * 65535, " (one grid row of column tiles), "
                      "got ", D, "; use version 'v1' or 'v2'");
      LAB_CHECK_VALUE(V <= 0x7fffffff, op, ": v3 handles num_embeddings < 2^31, got ", V);
      const auto [sorted, perm] = sort_indices(idx);
      const int64_t bytes = lab::launcher<BwdWorkspace>(lab::cat("embedding_bwd_v3_workspace_", dt))(T, D, V);
      const at::Tensor workspace = at::empty({bytes}, grad_out.options().dtype(at::kByte));
      auto fn = lab::launcher<BwdV3Cuda>(lab::cat("embedding_bwd_v3_", dt));
      LAB_CUDA_CHECK(fn(grad_out.data_ptr(), sorted.data_ptr<int64_t>(), perm.data_ptr<int64_t>(),
                        grad_weight.data_ptr(), T, D, V, pad, workspace.data_ptr(), stream),
                     "embedding backward v3 kernels");
      // after the launches: the kernels skip bad keys (they own no row), so the check's sync waits for work already
      // queued instead of leaving the GPU idle while the host launches it
      if (check && T > 0) {
        const at::Tensor ends = at::stack({sorted[0], sorted[T - 1]}).cpu();  // syncs
        const int64_t lo = ends.data_ptr<int64_t>()[0], hi = ends.data_ptr<int64_t>()[1];
        LAB_CHECK_VALUE(lo >= 0, op, ": index out of range: idx contains ", lo, " (its smallest), but indices must be "
                        "in [0, num_embeddings) = [0, ", V, ") (a negative index does not count from the end here, "
                        "as in torch)");
        LAB_CHECK_VALUE(hi < V, op, ": index out of range: idx contains ", hi, " (its largest), but indices must be in "
                        "[0, num_embeddings) = [0, ", V, ")");
      }
    } else {
      // v4: 32-bit keys sorted on the bits V needs (sort.cu, cub), then rows.cuh's kernels on them (v4.cu)
      LAB_CHECK_VALUE(D <= 128 * 65535, op, ": v4 handles dim <= ", 128 * 65535, " (one grid row of column tiles), "
                      "got ", D, "; use version 'v1' or 'v2'");
      LAB_CHECK_VALUE(V < 0x7fffffff && T <= 0x7fffffff, op, ": v4 sorts 32-bit keys and positions: it handles "
                      "num_embeddings < 2^31 - 1 and fewer than 2^31 tokens, got ", V, " and ", T, "; use version 'v3'");
      const auto bytes_of = [&](int64_t n) { return at::empty({n}, grad_out.options().dtype(at::kByte)); };
      const at::Tensor sort_ws = bytes_of(lab::launcher<Sort32Workspace>("embedding_sort32_workspace")(T, V));
      const at::Tensor keys = at::empty({T}, grad_out.options().dtype(at::kInt));   // uint32 bits
      const at::Tensor pos = at::empty({T}, grad_out.options().dtype(at::kInt));
      const at::Tensor ends = at::empty({2}, grad_out.options().dtype(at::kLong));
      auto* keys_ptr = reinterpret_cast<uint32_t*>(keys.data_ptr<int32_t>());
      LAB_CUDA_CHECK(lab::launcher<Sort32Cuda>(lab::cat("embedding_sort32_", idx_suffix(idx)))(
                         idx.data_ptr(), T, V, sort_ws.data_ptr(), keys_ptr, pos.data_ptr<int32_t>(),
                         ends.data_ptr<int64_t>(), stream),
                     "embedding backward v4 sort");
      const at::Tensor rows_ws =
          bytes_of(lab::launcher<BwdWorkspace>(lab::cat("embedding_bwd_v4_workspace_", dt))(T, D, V));
      LAB_CUDA_CHECK(lab::launcher<BwdV4Cuda>(lab::cat("embedding_bwd_v4_", dt))(
                         grad_out.data_ptr(), keys_ptr, pos.data_ptr<int32_t>(), grad_weight.data_ptr(), T, D, V, pad,
                         rows_ws.data_ptr(), stream),
                     "embedding backward v4 kernels");
      if (check && T > 0) {  // after the launches, as v3; a bad end names the real smallest/largest index
        const at::Tensor e = ends.cpu();  // syncs
        if (e.data_ptr<int64_t>()[0] < 0 || e.data_ptr<int64_t>()[1] >= V) check_range(idx, V, op);
      }
    }
#else
    LAB_NO_CUDA_BUILD(op);
#endif
    return grad_weight;
  }
  lab::launcher<BwdCpu>(lab::cat("embedding_bwd_cpu_", dt, "_", idx_suffix(idx)))(
      grad_out.data_ptr(), idx.data_ptr(), grad_weight.data_ptr(), T, D, V, pad);
  return grad_weight;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "nn.Embedding forward (row gather) and backward (dense weight gradient); version 0 = C++ CPU code";
  m.def("embedding_forward", lab::bind(embedding_forward),
        "embedding_forward(idx, weight, out, has_padding, padding_idx, version, check_indices) -> out");
  m.def("embedding_backward", lab::bind(embedding_backward),
        "embedding_backward(grad_out, idx, num_embeddings, has_padding, padding_idx, grad_weight, version, "
        "check_indices) -> grad_weight");
  LAB_BIND_UNITS(m);
}
