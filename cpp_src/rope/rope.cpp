// rope/rope.cpp — the binding of the rotary-position-embedding family: torch-facing functions and named input checks,
// then a call of the launcher a unit exports (cuda_src/rope/v1.cu, v2.cu for CUDA tensors; cpp_src/rope/cpu.cpp for
// CPU tensors), looked up by name (lab::launcher, lab_common.h). No kernel code here: editing a kernel never
// recompiles this file.
//
// rope(x, ...) rotates one tensor; rope_qk(q, k, ...) rotates queries and keys (k may have fewer heads: grouped-query
// attention) — one launch for both from v3 on. Both write into outputs the caller allocated (the lab poisons them
// before a check). layout: 0 = (batch, heads, seq, head_dim), 1 = (batch, seq, heads, head_dim). inverse: rotate by
// -angle (the backward). version: 0 = the C++ CPU code (CPU tensors), 1..3 = the CUDA versions in cuda_src/rope/.
// rows_per_thread: heads per thread for v2/v3 (1, 2, 4 or 8; 0 = let the launcher choose).
#include "lab_common.h"

namespace {

constexpr int64_t kMaxVersion = 3;

const char* layout_str(int64_t layout) {
  return layout == 0 ? "(batch, heads, seq, head_dim)" : "(batch, seq, heads, head_dim)";
}

// The name a unit exports the launcher for these dtypes under: "rope_v1_bf16_f32" (v1.cu), "rope_v2@bf16_f32,half" /
// "rope_v3@bf16_f32,interleaved" (v2.cu, built once per (tensor, table) dtype pair and pairing), "rope_cpu_bf16_f32"
// (cpu.cpp).
std::string kname(int64_t version, const at::Tensor& x, const at::Tensor& table, bool interleaved) {
  const std::string types = lab::cat(lab::dtype_suffix(x.scalar_type()), "_", lab::dtype_suffix(table.scalar_type()));
  if (!x.is_cuda()) return lab::cat("rope_cpu_", types);
  if (version == 1) return lab::cat("rope_v1_", types);
  return lab::cat("rope_v", version, "@", types, interleaved ? ",interleaved" : ",half");
}

#ifdef LAB_WITH_CUDA
// Every CUDA version's launcher (cuda_src/rope/rope.cuh); k may be null (one tensor).
using RopeCuda = cudaError_t (*)(const void* q, void* q_out, int64_t q_heads, const void* k, void* k_out,
                                 int64_t k_heads, const void* cos, const void* sin, int64_t batch, int64_t seq,
                                 int64_t head_dim, int64_t offset, bool bshd, bool interleaved, bool inverse,
                                 int rows, cudaStream_t stream);
#endif
// The CPU version's launcher (cpp_src/rope/cpu.cpp): one tensor per call.
using RopeCpu = void (*)(const void* x, void* y, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                         const void* cos, const void* sin, int64_t offset, bool bshd, bool interleaved,
                         bool inverse);

// A (batch, heads, seq, head_dim) or (batch, seq, heads, head_dim) tensor of rows to rotate.
void check_rows(const at::Tensor& x, const char* name, int64_t layout) {
  lab::check_dtype(x, name, {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble});
  lab::check_dim(x, name, 4, layout_str(layout));
  lab::check_contiguous(x, name);
  LAB_CHECK_VALUE(x.size(3) % 2 == 0, "head_dim = ", name, ".size(3) must be even (features rotate in pairs), got ",
                    x.size(3), " (shape ", lab::shape_str(x.sizes()), ")");
}

// cos/sin: (max_pos, head_dim / 2), float32 or x's dtype, long enough for positions offset .. offset + seq - 1.
void check_tables(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& x, const char* x_name,
                  int64_t seq, int64_t offset) {
  lab::check_defined(cos, "cos");
  lab::check_defined(sin, "sin");
  LAB_CHECK_TYPE(cos.scalar_type() == at::kFloat || cos.scalar_type() == x.scalar_type(),
                   "cos must be Float or the dtype of ", x_name, " (", c10::toString(x.scalar_type()), "), got ",
                   c10::toString(cos.scalar_type()));
  lab::check_same_dtype(sin, "sin", cos, "cos");
  const int64_t half = x.size(3) / 2;
  LAB_CHECK_VALUE(cos.dim() == 2 && cos.size(1) == half, "cos must have shape (max_pos, head_dim / 2) with "
                    "head_dim / 2 = ", half, ", got ", lab::shape_str(cos.sizes()),
                    cos.dim() == 2 && cos.size(1) == 2 * half
                        ? " (a (max_pos, head_dim) rotate_half table repeats its first half: pass "
                          "cos[:, :head_dim // 2].contiguous())"
                        : "");
  LAB_CHECK_VALUE(sin.sizes() == cos.sizes(), "sin must have the same shape as cos = ",
                    lab::shape_str(cos.sizes()), ", got ", lab::shape_str(sin.sizes()));
  lab::check_contiguous(cos, "cos");
  lab::check_contiguous(sin, "sin");
  lab::check_same_device(cos, "cos", x, x_name);
  lab::check_same_device(sin, "sin", x, x_name);
  LAB_CHECK_VALUE(offset >= 0, "offset must be >= 0, got ", offset);
  LAB_CHECK_VALUE(offset + seq <= cos.size(0), "cos/sin have ", cos.size(0), " positions (rows), but positions ",
                    offset, " .. ", offset + seq - 1, " are needed (offset + seq = ", offset, " + ", seq, " = ",
                    offset + seq, "): build longer tables");
}

// Shared by rope and rope_qk: k / k_out undefined for one tensor.
void run(const at::Tensor& q, const char* q_name, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
         at::Tensor& q_out, at::Tensor& k_out, int64_t offset, int64_t layout, bool interleaved, bool inverse,
         int64_t version, int64_t rows_per_thread, const char* op) {
  LAB_CHECK_VALUE(layout == 0 || layout == 1, op, ": layout must be 0 (batch, heads, seq, head_dim) or 1 "
                    "(batch, seq, heads, head_dim), got ", layout);
  check_rows(q, q_name, layout);
  const bool bshd = layout == 1;
  const int64_t batch = q.size(0), seq = q.size(bshd ? 1 : 2), head_dim = q.size(3);
  const int64_t q_heads = q.size(bshd ? 2 : 1);
  int64_t k_heads = 0;
  if (k.defined()) {
    lab::check_same_dtype(k, "k", q, q_name);
    lab::check_dim(k, "k", 4, layout_str(layout));
    k_heads = k.size(bshd ? 2 : 1);
    const bool same = k.size(0) == batch && k.size(bshd ? 1 : 2) == seq && k.size(3) == head_dim;
    LAB_CHECK_VALUE(same, "k must have shape ", bshd ? "(batch, seq, kv_heads, head_dim)" :
                      "(batch, kv_heads, seq, head_dim)", " with batch = ", batch, ", seq = ", seq, ", head_dim = ",
                      head_dim, " as in ", q_name, ", got ", lab::shape_str(k.sizes()));
    lab::check_contiguous(k, "k");
    lab::check_same_device(k, "k", q, q_name);
  }
  check_tables(cos, sin, q, q_name, seq, offset);
  const char* q_out_name = k.defined() ? "q_out" : "out";
  lab::check_out(q_out, q_out_name, q, q.sizes(), layout_str(layout));
  if (k.defined()) lab::check_out(k_out, "k_out", k, k.sizes(), layout_str(layout));
  // a thread reads a pair and writes the same pair: in place (out = the input itself) is fine, any other sharing not
  lab::check_no_overlap(q_out, q_out_name, q, q_name, /*in_place_ok=*/true);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{cos, "cos"}, {sin, "sin"}, {k, "k"}})
    lab::check_no_overlap(q_out, q_out_name, t, name);
  if (k.defined()) {
    lab::check_no_overlap(k_out, "k_out", k, "k", /*in_place_ok=*/true);
    for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{cos, "cos"}, {sin, "sin"}, {q, q_name},
                                  {q_out, q_out_name}})
      lab::check_no_overlap(k_out, "k_out", t, name);
  }
  lab::check_version(q, q_name, version, 1, kMaxVersion, op);
  LAB_CHECK_VALUE(rows_per_thread == 0 || rows_per_thread == 1 || rows_per_thread == 2 || rows_per_thread == 4 ||
                    rows_per_thread == 8, op, ": rows_per_thread must be 1, 2, 4, 8 or 0 (choose), got ",
                    rows_per_thread);

  const std::string name = kname(version, q, cos, interleaved);
  if (q.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(q.device());
    auto fn = lab::launcher<RopeCuda>(name);
    LAB_CUDA_CHECK(fn(q.data_ptr(), q_out.data_ptr(), q_heads, k.defined() ? k.data_ptr() : nullptr,
                      k.defined() ? k_out.data_ptr() : nullptr, k_heads, cos.data_ptr(), sin.data_ptr(), batch,
                      seq, head_dim, offset, bshd, interleaved, inverse, int(rows_per_thread), LAB_STREAM()),
                   "rope kernel");
#else
    LAB_NO_CUDA_BUILD(op);
#endif
    return;
  }
  auto cpu = lab::launcher<RopeCpu>(name);
  cpu(q.data_ptr(), q_out.data_ptr(), batch, q_heads, seq, head_dim, cos.data_ptr(), sin.data_ptr(), offset, bshd,
      interleaved, inverse);
  if (k.defined())
    cpu(k.data_ptr(), k_out.data_ptr(), batch, k_heads, seq, head_dim, cos.data_ptr(), sin.data_ptr(), offset, bshd,
        interleaved, inverse);
}

}  // namespace

// ---- torch-facing functions ---------------------------------------------------------------------------------
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor out, int64_t offset,
                int64_t layout, bool interleaved, bool inverse, int64_t version, int64_t rows_per_thread) {
  at::Tensor none;
  run(x, "x", none, cos, sin, out, none, offset, layout, interleaved, inverse, version, rows_per_thread, "rope");
  return out;
}

std::vector<at::Tensor> rope_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                const at::Tensor& sin, at::Tensor q_out, at::Tensor k_out, int64_t offset,
                                int64_t layout, bool interleaved, bool inverse, int64_t version,
                                int64_t rows_per_thread) {
  lab::check_defined(k, "k");
  run(q, "q", k, cos, sin, q_out, k_out, offset, layout, interleaved, inverse, version, rows_per_thread, "rope_qk");
  return {q_out, k_out};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Rotary position embedding: rope (one tensor), rope_qk (queries and keys); version 0 = C++ CPU code";
  m.def("rope", lab::bind(rope),
        "rope(x, cos, sin, out, offset, layout, interleaved, inverse, version, rows_per_thread) -> out");
  m.def("rope_qk", lab::bind(rope_qk),
        "rope_qk(q, k, cos, sin, q_out, k_out, offset, layout, interleaved, inverse, version, rows_per_thread) "
        "-> [q_out, k_out]");
  LAB_BIND_UNITS(m);
}
