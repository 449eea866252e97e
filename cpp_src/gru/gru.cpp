// gru/gru.cpp — the binding of the GRU family: torch-facing functions, named checks, and the calls of the launchers
// the units export (cuda_src/gru/*.cu for CUDA tensors, cpp_src/gru/cpu.cpp for CPU tensors), looked up by name
// (lab::launcher, lab_common.h). No kernel code here: editing a kernel never recompiles this file.
//
//   gru_forward(x, h0, params, out, h_n, version, config)  nn.GRU's forward: (seq_len, batch, input) -> out, h_n.
//       version 0: C++ on the CPU (cpp_src/gru/cpu.cpp); 1..6: cuda_src/gru/'s v1..v6 (see gru.cuh's header).
//       config: v5's warp grid (-1: the plan's choice; 0..7 force one), v6's most layers per launch (-1: the
//       plan's choice; 1..4), v3/v4's exchange between steps (-1: the plan's choice; 1 step counters, 2 tagged h
//       words); the other versions ignore it. grid_sync: v3..v6 meet at one grid-wide barrier a step
//       (cooperative_groups; v6: a wave) instead of per-batch-slice step counters (v1/v2 ignore it).
//   gru_gates(gi, gh, b_ih, b_hh, h_prev, h_out)   one GRU cell's pointwise half (gates + update), rows may be
//       strided: the seq2seq decoder writes h straight into its [emb | h] buffer.
//   decoder_prep(logits | tokens, tokens_out, emb, gi_table, gi_ctx, xh, gi)   the decoder step's token pick
//       (argmax) and gathers.
//   greedy_decode(ctx, gi_ctx, fc_ctx, emb, gi_table, w_hh, b_hh, w_fc, sos, eos, tokens)   every step of the
//       decoder's greedy loop in one call: one launch on the GPU (float32), a C++ loop on the CPU; tokens None: one
//       teacher-forced step (tokens_in -> logits, h_out) without the pick.
//   greedy_plan(batch, hidden, emb_dim, vocab)       whether and how the one-launch decoder runs on this GPU.
//   v3_plan(batch, hidden, dtype_code, version)      how v3/v4 split the work on this GPU (for the notebook).
//   v5_plan(batch, hidden, dtype_code, config)       how v5 splits it: its configuration, slices, shared memory.
//   v6_plan(batch, hidden, layers, seq_len, dtype_code, config)  how v6 splits a stack: layers per launch, slices.
//
// Every function writes into tensors the caller allocated (the lab poisons them with NaN before a check). CUDA
// versions run on the current stream; GEMMs go to cuBLAS through ATen: for fp16/bf16 with an fp32 output
// (at::mm's out_dtype), so gate pre-activations are never rounded to 16 bits.
//
// Launchers: "gru_gates" (cuda_src/gru/gates.cu), "gru_decoder_prep" (decoder.cu), per variant of greedy.cu
// "gru_greedy_plan@<wide>" / "gru_greedy@<wide>" (wide 0 / 1: the tile width), per variant of v3.cu
// "gru_v3_plan@<dtype>,<rb>" / "gru_v3@<dtype>,<rb>" (dtype f32/f16/bf16; rb 2 = v3, 1 = v3 at one batch row a
// block, 4 = v4), per variant of
// v5.cu "gru_v5_plan@<dtype>" / "gru_v5@<dtype>" (f32 multiplies in TF32), per variant of v6.cu
// "gru_v6_plan@<dtype>,<rb>" / "gru_v6@<dtype>,<rb>"; the CPU unit's
// "gru_layer_cpu_<dtype>", "gru_gates_cpu_<dtype>", "decoder_tokens_cpu_<dtype>", "decoder_gather_cpu_<dtype>",
// "greedy_decode_cpu_<dtype>" (f32, f64: float16/bfloat16 tensors are widened to float here, and the float result
// rounded back).
#include "lab_common.h"

#include <torch/version.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8),
              "gru.cpp needs torch >= 2.8 (at::mm with out_dtype for fp32 output from fp16/bf16 inputs)");

namespace {

#ifdef LAB_WITH_CUDA
using GatesCuda = cudaError_t (*)(int dtype, const void* gi, int64_t ldgi, const void* gh, int64_t ldgh,
                                  const void* b_ih, const void* b_hh, const void* h_prev, int64_t ldhp, void* h_out,
                                  int64_t ldho, int B, int H, cudaStream_t stream);
using ProjCuda = cudaError_t (*)(int dtype, const void* x, const void* w, float* out, int M, int N, int K, int* zero,
                                 int nzero, cudaStream_t stream);
using V3PlanCuda = int (*)(int B, int H, int* info);
using V3Cuda = cudaError_t (*)(const float* gi, const void* w_hh, const void* b_ih, const void* b_hh, const void* h0,
                               void* out, void* h_n, int T, int B, int H, int* counters, unsigned long long* hx,
                               bool early, cudaStream_t stream);
using V5PlanCuda = int (*)(int B, int H, int config, int* info);
using V6PlanCuda = int (*)(int B, int H, int L, int T, int config, int* info);
using V6Cuda = cudaError_t (*)(int L, const void* const* w_ih, const void* const* w_hh, const void* const* b_ih,
                               const void* const* b_hh, const void* const* h0, void* const* out,
                               void* const* h_n, float* const* gi, int T, int B, int H, int config, int* counters,
                               cudaStream_t stream);
using V5Cuda = cudaError_t (*)(const float* gi, const void* w_hh, const void* b_ih, const void* b_hh, const void* h0,
                               void* out, int T, int B, int H, int config, int* counters, cudaStream_t stream);
using DecoderPrepCuda = cudaError_t (*)(int dtype, const void* logits, int64_t ldl, int V, const int64_t* tok_in,
                                        int64_t* tok_out, const void* emb, int E, const void* gtab, const void* gctx,
                                        int G3, int vocab, void* xh, int64_t ldxh, void* gi, int B,
                                        cudaStream_t stream);
using GreedyPlanCuda = int (*)(int B, int H, int E, int V, int* info);
using GreedyCuda = cudaError_t (*)(const float* ctx, const float* gi_ctx, const float* fc_ctx, const float* emb,
                                   const float* gi_tab, const float* w_hh, const float* b_hh, const float* w_fc,
                                   float* hbuf, unsigned long long* keys, int64_t* toks, const int64_t* tok_in,
                                   float* logits, float* h_out, int64_t ld_ctx, int64_t ld_hout, int B, int H, int E,
                                   int V, int T, int sos, int eos, cudaStream_t stream);
#endif
template <class T>
using GreedyCpu = void (*)(const T* ctx, int64_t ld_ctx, const T* gi_ctx, const T* fc_ctx, const T* emb,
                           const T* gi_tab, const T* w_hh, const T* b_hh, const T* w_fc, int64_t* toks,
                           const int64_t* tok_in, T* logits, T* h_out, int64_t ld_hout, int64_t B, int64_t H,
                           int64_t E, int64_t V, int64_t steps, int64_t sos, int64_t eos);
template <class T>
using LayerCpu = void (*)(const T* x, const T* w_ih, const T* w_hh, const T* b_ih, const T* b_hh, const T* h0, T* out,
                          int64_t Tn, int64_t B, int64_t I, int64_t H);
template <class T>
using GatesCpu = void (*)(const T* gi, int64_t ldgi, const T* gh, int64_t ldgh, const T* b_ih, const T* b_hh,
                          const T* h_prev, int64_t ldhp, T* h_out, int64_t ldho, int64_t B, int64_t H);
template <class T>
using TokensCpu = void (*)(const T* logits, int64_t ldl, int64_t nl, const int64_t* tokens, int64_t* tok, int64_t B);
template <class T>
using GatherCpu = void (*)(const int64_t* tok, const T* emb, int64_t E, const T* gtab, const T* gctx, int64_t G,
                           T* xh, int64_t ldxh, T* gi, int64_t B);


constexpr int kMaxVersion = 6;

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    case at::kDouble: return 3;
    default: LAB_CHECK_TYPE(false, "unsupported dtype ", c10::toString(t));
  }
  return -1;
}

// The type gates are computed in: float for float/half/bfloat16, double for double.
at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

std::string param_name(size_t i) {
  static const char* kind[4] = {"w_ih", "w_hh", "b_ih", "b_hh"};
  return lab::cat("params[", i, "] (", kind[i % 4], " of layer ", i / 4, ")");
}

void check_like(const at::Tensor& t, const std::string& name, const at::Tensor& x) {
  lab::check_same_dtype(t, name.c_str(), x, "x");
  lab::check_same_device(t, name.c_str(), x, "x");
  lab::check_contiguous(t, name.c_str());
}

// Validates x, h0, params, out, h_n; returns (num_layers, hidden).
std::pair<int64_t, int64_t> check_forward(const at::Tensor& x, const std::optional<at::Tensor>& h0,
                                          const std::vector<at::Tensor>& params, const at::Tensor& out,
                                          const at::Tensor& h_n) {
  lab::check_dim(x, "x", 3, "(seq_len, batch, input_size)");
  lab::check_dtype(x, "x", {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16});
  lab::check_contiguous(x, "x");
  const int64_t T = x.size(0), B = x.size(1), I = x.size(2);
  LAB_CHECK_VALUE(T >= 1 && B >= 1 && I >= 1, "x must have seq_len, batch and input_size >= 1, got shape ",
                    lab::shape_str(x.sizes()));
  LAB_CHECK_VALUE(!params.empty() && params.size() % 4 == 0, "params must hold 4 tensors per layer (w_ih, w_hh, "
                    "b_ih, b_hh, as nn.GRU's _flat_weights), got ", params.size());
  const int64_t L = int64_t(params.size() / 4);
  lab::check_dim(params[1], param_name(1).c_str(), 2, "(3*hidden, hidden)");
  const int64_t H = params[1].size(1);
  LAB_CHECK_VALUE(H >= 1, param_name(1), " must have hidden >= 1, got shape ", lab::shape_str(params[1].sizes()));
  for (int64_t l = 0; l < L; ++l) {
    const int64_t in = l == 0 ? I : H;
    for (int k = 0; k < 4; ++k) {
      const size_t i = size_t(4 * l + k);
      const std::string name = param_name(i);
      const at::Tensor& p = params[i];
      lab::check_defined(p, name.c_str());
      if (k == 0 && l == 0 && p.dim() == 2 && p.size(0) == 3 * H && p.size(1) != I)
        LAB_CHECK_VALUE(false, "input size mismatch: x has input_size ", I, " but ", name, " has shape ",
                          lab::shape_str(p.sizes()), " (expected (3*hidden, input_size) = (", 3 * H, ", ", I, "))");
      if (k == 0)
        lab::check_shape(p, name.c_str(), {3 * H, in}, l == 0 ? "(3*hidden, input_size)" : "(3*hidden, hidden)");
      else if (k == 1)
        lab::check_shape(p, name.c_str(), {3 * H, H}, "(3*hidden, hidden)");
      else
        lab::check_shape(p, name.c_str(), {3 * H}, "(3*hidden,)");
      check_like(p, name, x);
      lab::check_no_grad(p, name.c_str(), "gru");
    }
  }
  lab::check_no_grad(x, "x", "gru");
  if (h0 && h0->defined()) {
    lab::check_shape(*h0, "h0", {L, B, H}, "(num_layers, batch, hidden)");
    check_like(*h0, "h0", x);
    lab::check_no_grad(*h0, "h0", "gru");
  }
  lab::check_out(out, "out", x, {T, B, H}, "(seq_len, batch, hidden)");
  lab::check_out(h_n, "h_n", x, {L, B, H}, "(num_layers, batch, hidden)");
  // every step reads h and the weights while it writes out and h_n; a layer's out is the next layer's input
  for (const auto& [o, oname] : {std::pair<const at::Tensor&, const char*>{out, "out"}, {h_n, "h_n"}}) {
    lab::check_no_overlap(o, oname, x, "x");
    if (h0 && h0->defined()) lab::check_no_overlap(o, oname, *h0, "h0");
    for (size_t i = 0; i < params.size(); ++i)
      if (lab::same_storage(o, params[i])) lab::check_no_overlap(o, oname, params[i], param_name(i).c_str());
  }
  lab::check_no_overlap(h_n, "h_n", out, "out");
  return {L, H};
}

// The CPU unit computes in float or double (cpp_src/gru/cpu.cpp): a float16/bfloat16 tensor goes in as a float copy
// (exact) and the float result is rounded back with copy_ (round to nearest even, as static_cast<at::Half> is).
at::Tensor widened(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

#ifdef LAB_WITH_CUDA
// The v3.cu variant that runs `version` for dtype_code (0 float32, 1 float16, 2 bfloat16): 4 runs rb 4; 3 runs
// rb 2, or rb 1 where the plan gives a block one batch row (rows_per_block; 0: not known yet, as for the plan, which
// every rb answers alike).
std::string v3_variant(const char* name, int64_t version, int dtype, int rows_per_block = 0) {
  static const char* dt[3] = {"f32", "f16", "bf16"};
  return lab::cat(name, "@", dt[dtype], ",", version == 4 ? "4" : rows_per_block == 1 ? "1" : "2");
}

int v3_plan_call(int64_t version, int dtype, int B, int H, int* info) {
  auto plan = lab::launcher<V3PlanCuda>(v3_variant("gru_v3_plan", version, dtype));
  return plan(B, H, info);
}

int v5_plan_call(int dtype, int B, int H, int config, int* info) {
  static const char* dt[3] = {"f32", "f16", "bf16"};
  return lab::launcher<V5PlanCuda>(lab::cat("gru_v5_plan@", dt[dtype]))(B, H, config, info);
}

std::string v5_plan_error(int status, const int* info, int64_t B, int64_t H, at::ScalarType dt, int64_t config) {
  std::string o = lab::cat("gru v5 cannot run batch ", B, ", hidden ", H, ", ", dt,
                           config >= 0 ? lab::cat(" with config ", config) : std::string(), " on this GPU: ");
  switch (status) {
    case 2: o += "no warp grid's W_hh slice, h chunk and gate buffers fit in one block's shared memory"; break;
    case 3: o += lab::cat("its blocks wait for each other every step, so all ", info[9], " must be co-resident (one "
                          "per SM), the GPU holds ", info[10], " at once"); break;
    case 4: o += "the device does not support cooperative launches"; break;
    case 6: o += "config must be -1 (automatic) or 0..7"; break;
    default:
      o += lab::cat("a CUDA error while planning the launch (", cudaGetErrorString(cudaGetLastError()), ")");
      break;
  }
  return o + (H > 1024 ? "; use v2" : "; use v3 or v2");
}

// x (M, K) @ w (N, K)^T -> (M, N) in the accumulate type (cuBLAS accumulates fp16/bf16 in fp32 and writes fp32).
at::Tensor proj(const at::Tensor& x, const at::Tensor& w) {
  if (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) return at::mm(x, w.t(), at::kFloat);
  return at::mm(x, w.t());
}

// The most rows of x (T*B) for which v3..v6's float32 input projection runs in proj.cu rather than cuBLAS's GEMM,
// measured on the H100 (proj.cu's header, input 256, hidden 512): its ring kernel is ahead of cuBLAS + fill up to
// ~120 rows (kRingProjRows), its bulk-copy kernel from there to 480 rows (the whole encoder faster at batch 8 and
// 16, T = 30), cuBLAS at 960. The bulk-copy kernel wants Hopper's bulk copies, K % 4 == 0 and 16-byte aligned rows;
// where one is missing the ring kernel would run, behind cuBLAS past ~120 rows, so cuBLAS does. cuBLAS's
// tensor-core GEMM is ahead at every size for float16/bfloat16, which never take proj.cu.
constexpr int64_t kRingProjRows = 128, kOwnProjRows = 512;

void launch_proj(const at::Tensor& x, const at::Tensor& w, at::Tensor& out, const at::Tensor& zero) {
  const ProjCuda gru_proj = lab::launcher<ProjCuda>("gru_proj");  // cuda_src/gru/proj.cu
  LAB_CUDA_CHECK(gru_proj(dtype_code(x.scalar_type()), x.data_ptr(), w.data_ptr(), out.data_ptr<float>(),
                          lab::check_int32(x.size(0), "rows of x"), lab::check_int32(w.size(0), "rows of w"),
                          lab::check_int32(x.size(1), "input size"), zero.defined() ? zero.data_ptr<int>() : nullptr,
                          zero.defined() ? lab::check_int32(zero.numel(), "counters") : 0, LAB_STREAM()),
                 "gru input projection kernel");
}

// v3..v6's input projection of every step, x (T*B, I) @ W_ih (3H, I)^T -> (T*B, 3H) fp32, and the step counters of
// the launch that follows zeroed (`zero`, int32; undefined: none). float32 up to kOwnProjRows rows (past
// kRingProjRows: where the bulk-copy kernel runs, with the tile's rows, I <= 512, in shared memory): one launch of
// proj.cu's kernel does both (cuBLAS would take a GEMM and a fill, with a gap between); otherwise cuBLAS's GEMM and
// a fill.
bool own_proj(const at::Tensor& x, const at::Tensor& w) {
  if (x.scalar_type() != at::kFloat || x.size(0) > kOwnProjRows) return false;
  if (x.size(0) <= kRingProjRows) return true;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
  const auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  return major == 9 && x.size(1) % 4 == 0 && x.size(1) <= 512 && aligned(x) && aligned(w);
}

at::Tensor input_proj(const at::Tensor& x, const at::Tensor& w, const at::Tensor& zero) {
  if (own_proj(x, w)) {
    at::Tensor out = at::empty({x.size(0), w.size(0)}, x.options().dtype(at::kFloat));
    launch_proj(x, w, out, zero);
    return out;
  }
  at::Tensor out = proj(x, w);
  if (zero.defined()) zero.zero_();
  return out;
}

std::string v3_plan_error(int64_t version, int status, const int* info, int64_t B, int64_t H, at::ScalarType dt) {
  std::string o = lab::cat("gru v", version, " cannot run batch ", B, ", hidden ", H, ", ", dt, " on this GPU: ");
  switch (status) {
    case 1: o += "it keeps W_hh in registers, at most 32 columns per lane over at most 32 lanes, so hidden <= 1024"; break;
    case 2: o += lab::cat("one block's batch slice (", info[5], " rows) and its gate buffers do not fit in shared memory"); break;
    case 3: o += lab::cat("its one-barrier-per-step design needs all ", info[8], " blocks co-resident, the GPU holds ",
                          info[9], " at once"); break;
    case 4: o += "the device does not support cooperative launches"; break;
    default: o += lab::cat("a CUDA error while planning the launch (", cudaGetErrorString(cudaGetLastError()), ")"); break;
  }
  return o + "; use v2";
}

// v6 (cuda_src/gru/v6.cu) is built per dtype and rows-per-pass like v3.cu; it takes v4's four rows a pass (rb 4)
// where a block has at least this many batch rows (v4 is ahead of v3 from 8 rows a block: batch 32 in v3's split),
// one row a pass (rb 1) where it has one, two between.
constexpr int kV6Rb4Rows = 4;

std::string v6_variant(const char* name, int dtype, int rb) {
  static const char* dt[3] = {"f32", "f16", "bf16"};
  return lab::cat(name, "@", dt[dtype], ",", rb);
}

int v6_plan_call(int dtype, int B, int H, int L, int T, int config, int* info, int* rb) {
  const int status = lab::launcher<V6PlanCuda>(v6_variant("gru_v6_plan", dtype, 2))(B, H, L, T, config, info);
  *rb = info[5] >= kV6Rb4Rows ? 4 : info[5] == 1 ? 1 : 2;
  if (status != 0 || *rb == 2) return status;
  return lab::launcher<V6PlanCuda>(v6_variant("gru_v6_plan", dtype, *rb))(B, H, L, T, config, info);
}

std::string v6_plan_error(int status, const int* info, int64_t B, int64_t H, int64_t L, at::ScalarType dt,
                          int64_t config) {
  std::string o = lab::cat("gru v6 cannot run batch ", B, ", hidden ", H, ", ", L, " layer(s), ", dt, " on this GPU: ");
  switch (status) {
    case 1: o += "it keeps W_hh in registers as v3 does, so hidden <= 1024"; break;
    case 2: o += lab::cat("one block's batch slice (", info[5], " rows) and its buffers do not fit in shared memory"); break;
    case 3: o += lab::cat("its blocks wait for each other, so all ", info[8], " must be co-resident, the GPU holds ",
                          info[9], " at once"); break;
    case 4: o += "the device does not support cooperative launches"; break;
    case 6: return lab::cat("gru v6: config is the most layers one launch runs: -1 (automatic) or 1..4, got ", config);
    default: o += lab::cat("a CUDA error while planning the launch (", cudaGetErrorString(cudaGetLastError()), ")"); break;
  }
  return o + "; use v2";
}

// v6: the stack in launches of the plan's layers each, every launch a wavefront of its layers (v6.cu's header).
void forward_v6(const at::Tensor& x, const at::Tensor& h0, const std::vector<at::Tensor>& params, at::Tensor& out,
                at::Tensor& h_n, int64_t config, bool grid_sync) {
  const int64_t L = int64_t(params.size()) / 4, Tn = x.size(0), B = x.size(1), H = params[1].size(1);
  const int dt = dtype_code(x.scalar_type());
  const int b = lab::check_int32(B, "batch"), h = lab::check_int32(H, "hidden"), tn = lab::check_int32(Tn, "seq_len");
  cudaStream_t st = LAB_STREAM();
  at::Tensor in = x;
  for (int64_t l0 = 0; l0 < L;) {
    int info[11], rb = 2;
    const int status = v6_plan_call(dt, b, h, int(L - l0), tn, int(config), info, &rb);
    LAB_CHECK_VALUE(status == 0, v6_plan_error(status, info, B, H, L - l0, x.scalar_type(), config));
    const int n = info[10], pb = info[4], ph = info[3];  // layers in this launch, batch and hidden slices
    const void *w_ih[4], *w_hh[4], *b_ih[4], *b_hh[4], *h0p[4];
    void* outp[4];
    float* gi[4];
    std::vector<at::Tensor> keep;  // the launch's buffers, alive until it is enqueued (the caching allocator's
                                   // stream semantics keep their memory for the stream)
    // every role's step counters, zeroed by the first layer's projection launch
    const at::Tensor counters =
        grid_sync ? at::Tensor() : at::empty({(2 * n - 1) * pb * ph}, x.options().dtype(at::kInt));
    for (int i = 0; i < n; ++i) {
      const int64_t l = l0 + i;
      w_ih[i] = params[size_t(4 * l)].data_ptr(), w_hh[i] = params[size_t(4 * l + 1)].data_ptr();
      b_ih[i] = params[size_t(4 * l + 2)].data_ptr(), b_hh[i] = params[size_t(4 * l + 3)].data_ptr();
      h0p[i] = h0.defined() ? h0.select(0, l).data_ptr() : nullptr;
      keep.push_back(l == L - 1 ? out : at::empty({Tn, B, H}, x.options()));  // layer l's output sequence
      outp[i] = keep.back().data_ptr();
      if (i == 0) {  // the first layer's input projection, as in v3 (it zeroes the counters)
        keep.push_back(input_proj(in.view({Tn * B, in.size(2)}), params[size_t(4 * l)], counters));
      } else {       // written by the launch's projection role
        keep.push_back(at::empty({Tn, B, 3 * H}, x.options().dtype(at::kFloat)));
      }
      gi[i] = keep.back().data_ptr<float>();
    }
    const V6Cuda gru_v6 = lab::launcher<V6Cuda>(v6_variant("gru_v6", dt, rb));
    void* hnp[4];  // each layer's h_n, written by the kernel at the last step (h_n is contiguous: checked)
    for (int i = 0; i < n; ++i) hnp[i] = h_n.select(0, l0 + i).data_ptr();
    LAB_CUDA_CHECK(gru_v6(n, w_ih, w_hh, b_ih, b_hh, h0p, outp, hnp, gi, tn, b, h, int(config),
                          grid_sync ? nullptr : counters.data_ptr<int>(), st),
                   "gru v6 persistent wavefront kernel (cooperative launch)");
    in = keep[size_t(2 * (n - 1))];
    l0 += n;
  }
}

// How v3..v5's blocks meet between steps (persistent.cuh): one grid.sync() (grid_sync=True), the per-batch-slice
// step counters, or (v3/v4) the tagged h words. v3/v4's plan choice (config -1): tagged where a block owns one batch
// row, counters above (what each costs at one, two and many rows a block, measured on the H100: v3.cu's header).
enum class Exchange { kGrid, kCounters, kTagged };

Exchange v3_exchange(bool grid_sync, int64_t config, int rows_per_block) {
  if (grid_sync) return Exchange::kGrid;
  if (config == 2 || (config == -1 && rows_per_block == 1)) return Exchange::kTagged;
  return Exchange::kCounters;
}

// Returns whether the kernel wrote h_n's layer slice hnl itself (v3, v4); else the caller copies the last step.
// rows_per_block: v3/v4's plan's (it picks v3's variant), 0 for the other versions.
bool layer_cuda(int64_t version, int64_t config, Exchange ex, int rows_per_block, const at::Tensor& in,
                const at::Tensor& w_ih, const at::Tensor& w_hh, const at::Tensor& b_ih, const at::Tensor& b_hh,
                const at::Tensor& h0l, at::Tensor& o, at::Tensor hnl) {
  const int64_t Tn = in.size(0), B = in.size(1), I = in.size(2), H = w_hh.size(1), G = 3 * H;
  const int dt = dtype_code(in.scalar_type());
  const int b = lab::check_int32(B, "batch"), h = lab::check_int32(H, "hidden");
  cudaStream_t st = LAB_STREAM();
  if (version == 1) {
    const GatesCuda gru_gates = lab::launcher<GatesCuda>("gru_gates");  // cuda_src/gru/gates.cu
    for (int64_t t = 0; t < Tn; ++t) {
      const at::Tensor gi = proj(in.select(0, t), w_ih);                        // (B, 3H) x_t W_ih^T
      const at::Tensor hp = t == 0 ? h0l : o.select(0, t - 1);                  // undefined: zeros
      const at::Tensor gh = hp.defined() ? proj(hp, w_hh) : at::Tensor();       // (B, 3H) h W_hh^T
      LAB_CUDA_CHECK(gru_gates(dt, gi.data_ptr(), G, gh.defined() ? gh.data_ptr() : nullptr, G, b_ih.data_ptr(),
                               b_hh.data_ptr(), hp.defined() ? hp.data_ptr() : nullptr, H, o.select(0, t).data_ptr(),
                               H, b, h, st),
                     "gru v1 gate kernel");
    }
    return false;
  }
  // v3..v5's exchange state, zeroed by the projection's launch: the per-batch-slice step counters (at most one slice
  // per batch row), or v3/v4's tagged h words, (2, B, H) 64-bit (persistent.cuh)
  const bool grid_sync = ex == Exchange::kGrid, tagged = ex == Exchange::kTagged;
  const at::Tensor xstate =
      version >= 3 && !grid_sync ? at::empty({tagged ? 4 * B * H : B}, in.options().dtype(at::kInt)) : at::Tensor();
  // (T*B, 3H): every step's input projection; v2: one cuBLAS GEMM, v3..v5: input_proj (few rows: proj.cu)
  const at::Tensor x2 = in.view({Tn * B, I});
  const at::Tensor gi = version == 2 ? proj(x2, w_ih) : input_proj(x2, w_ih, xstate);
  if (version == 2) {
    const GatesCuda gru_gates = lab::launcher<GatesCuda>("gru_gates");  // cuda_src/gru/gates.cu
    for (int64_t t = 0; t < Tn; ++t) {
      const at::Tensor hp = t == 0 ? h0l : o.select(0, t - 1);
      const at::Tensor gh = hp.defined() ? proj(hp, w_hh) : at::Tensor();
      LAB_CUDA_CHECK(gru_gates(dt, static_cast<const char*>(gi.data_ptr()) + t * B * G * gi.element_size(), G,
                               gh.defined() ? gh.data_ptr() : nullptr, G, b_ih.data_ptr(), b_hh.data_ptr(),
                               hp.defined() ? hp.data_ptr() : nullptr, H, o.select(0, t).data_ptr(), H, b, h, st),
                     "gru v2 gate kernel");
    }
    return false;
  }
  if (version == 5) {  // cuda_src/gru/v5.cu, the variant of this dtype
    static const char* dts[3] = {"f32", "f16", "bf16"};
    const V5Cuda gru_v5 = lab::launcher<V5Cuda>(lab::cat("gru_v5@", dts[dt]));
    LAB_CUDA_CHECK(gru_v5(gi.data_ptr<float>(), w_hh.data_ptr(), b_ih.data_ptr(), b_hh.data_ptr(),
                          h0l.defined() ? h0l.data_ptr() : nullptr, o.data_ptr(), lab::check_int32(Tn, "seq_len"), b,
                          h, int(config), grid_sync ? nullptr : xstate.data_ptr<int>(), st),
                   "gru v5 persistent tensor-core kernel (cooperative launch)");
    return false;
  }
  // cuda_src/gru/v3.cu, the variant of this version (rb 2 / 4) and dtype
  const V3Cuda gru_v3 = lab::launcher<V3Cuda>(v3_variant("gru_v3", version, dt, rows_per_block));
  LAB_CUDA_CHECK(gru_v3(gi.data_ptr<float>(), w_hh.data_ptr(), b_ih.data_ptr(), b_hh.data_ptr(),
                        h0l.defined() ? h0l.data_ptr() : nullptr, o.data_ptr(), hnl.data_ptr(),
                        lab::check_int32(Tn, "seq_len"), b, h,
                        grid_sync || tagged ? nullptr : xstate.data_ptr<int>(),
                        tagged ? reinterpret_cast<unsigned long long*>(xstate.data_ptr<int>()) : nullptr,
                        own_proj(x2, w_ih), st),  // early behind proj.cu's launch (v3.cu: gru_v3)
                 version == 3 ? "gru v3 persistent kernel (cooperative launch)"
                              : "gru v4 persistent kernel (cooperative launch)");
  return true;
}
#endif

// version 0: the CPU unit's loops (cpp_src/gru/cpu.cpp) on this layer's tensors.
template <class T>
void layer_cpu_call(const at::Tensor& in, const at::Tensor& w_ih, const at::Tensor& w_hh, const at::Tensor& b_ih,
                    const at::Tensor& b_hh, const at::Tensor& h0l, at::Tensor& o) {
  lab::launcher<LayerCpu<T>>(lab::cat("gru_layer_cpu_", lab::dtype_suffix<T>()))(
      in.data_ptr<T>(), w_ih.data_ptr<T>(), w_hh.data_ptr<T>(), b_ih.data_ptr<T>(), b_hh.data_ptr<T>(),
      h0l.defined() ? h0l.data_ptr<T>() : nullptr, o.data_ptr<T>(), in.size(0), in.size(1), in.size(2),
      w_hh.size(1));
}

void layer_cpu(const at::Tensor& in, const at::Tensor& w_ih, const at::Tensor& w_hh, const at::Tensor& b_ih,
               const at::Tensor& b_hh, const at::Tensor& h0l, at::Tensor& o) {
  if (in.scalar_type() == at::kDouble) return layer_cpu_call<double>(in, w_ih, w_hh, b_ih, b_hh, h0l, o);
  if (in.scalar_type() == at::kFloat) return layer_cpu_call<float>(in, w_ih, w_hh, b_ih, b_hh, h0l, o);
  // float16/bfloat16: the float loops on widened copies, the output rounded back
  at::Tensor of = at::empty(o.sizes(), o.options().dtype(at::kFloat));
  layer_cpu_call<float>(widened(in), widened(w_ih), widened(w_hh), widened(b_ih), widened(b_hh),
                        h0l.defined() ? widened(h0l) : at::Tensor(), of);
  o.copy_(of);
}

}  // namespace

// ---- gru_forward ------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor> gru_forward(const at::Tensor& x, const std::optional<at::Tensor>& h0,
                                               const std::vector<at::Tensor>& params, at::Tensor out, at::Tensor h_n,
                                               int64_t version, int64_t config, bool grid_sync) {
  const std::pair<int64_t, int64_t> dims = check_forward(x, h0, params, out, h_n);
  const int64_t L = dims.first, H = dims.second;
  lab::check_version(x, "x", version, 1, kMaxVersion, "gru");
  LAB_CHECK_VALUE(config >= -1 && config < 8, "config must be -1 (automatic), 0..7 (v5's warp grids), 1..4 (v6's "
                  "layers per launch) or 1..2 (v3/v4's exchange: 1 step counters, 2 tagged h), got ",
                  config);
  LAB_CHECK_VALUE(!(version == 3 || version == 4) || config == -1 || config == 1 || config == 2, "gru v", version,
                  ": config is the exchange between steps: -1 (the plan's choice), 1 (step counters) or 2 (tagged h), "
                  "got ", config);
  const bool has_h0 = h0 && h0->defined();
  const int64_t Tn = x.size(0), B = x.size(1);
  if (version >= 3)
    LAB_CHECK_TYPE(x.scalar_type() != at::kDouble, "gru v", version, " supports Float, Half and BFloat16, got "
                     "Double (v1, v2 and the CPU version take float64)");
  if (version == 6 && x.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(x.device());
    forward_v6(x, has_h0 ? *h0 : at::Tensor(), params, out, h_n, config, grid_sync);
    return {out, h_n};
#else
    LAB_NO_CUDA_BUILD("gru_forward");
#endif
  }
  at::Tensor in = x;
  for (int64_t l = 0; l < L; ++l) {
    at::Tensor o = l == L - 1 ? out : at::empty({Tn, B, H}, x.options());  // layer l's output: layer l+1's input
    const at::Tensor &w_ih = params[size_t(4 * l)], &w_hh = params[size_t(4 * l + 1)],
                     &b_ih = params[size_t(4 * l + 2)], &b_hh = params[size_t(4 * l + 3)];
    const at::Tensor h0l = has_h0 ? h0->select(0, l) : at::Tensor();
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      Exchange ex = grid_sync ? Exchange::kGrid : Exchange::kCounters;
      int rows_per_block = 0;
      if (version == 5) {
        int info[12];
        const int status = v5_plan_call(dtype_code(x.scalar_type()), lab::check_int32(B, "batch"),
                                        lab::check_int32(H, "hidden"), int(config), info);
        LAB_CHECK_VALUE(status == 0, v5_plan_error(status, info, B, H, x.scalar_type(), config));
      } else if (version >= 3) {
        int info[10];
        const int status = v3_plan_call(version, dtype_code(x.scalar_type()), lab::check_int32(B, "batch"),
                                        lab::check_int32(H, "hidden"), info);
        LAB_CHECK_VALUE(status == 0, v3_plan_error(version, status, info, B, H, x.scalar_type()));
        ex = v3_exchange(grid_sync, config, info[5]);
        rows_per_block = info[5];
      }
      if (!layer_cuda(version, config, ex, rows_per_block, in, w_ih, w_hh, b_ih, b_hh, h0l, o, h_n.select(0, l)))
        h_n.select(0, l).copy_(o.select(0, Tn - 1));
#else
      LAB_NO_CUDA_BUILD("gru_forward");
#endif
    } else {
      layer_cpu(in, w_ih, w_hh, b_ih, b_hh, h0l, o);
      h_n.select(0, l).copy_(o.select(0, Tn - 1));
    }
    in = o;
  }
  return {out, h_n};
}

// ---- gru_gates: one cell's pointwise half, rows may be strided ---------------------------------------------------
namespace {
void check_rows(const at::Tensor& t, const char* name, int64_t rows, int64_t cols, const char* layout) {
  lab::check_dim(t, name, 2, layout);
  LAB_CHECK_VALUE(t.size(0) == rows && t.size(1) == cols, name, " must have shape ", layout, " = (", rows, ", ",
                    cols, "), got ", lab::shape_str(t.sizes()));
  LAB_CHECK_VALUE(t.stride(1) == 1 && t.stride(0) >= cols, name, " must have unit stride along its last dimension "
                    "(rows may be strided), got strides ", lab::shape_str(t.strides()));
}
}  // namespace

at::Tensor gru_gates_op(const at::Tensor& gi, const std::optional<at::Tensor>& gh,
                        const std::optional<at::Tensor>& b_ih, const at::Tensor& b_hh,
                        const std::optional<at::Tensor>& h_prev, at::Tensor h_out) {
  lab::check_dim(h_out, "h_out", 2, "(batch, hidden)");
  lab::check_dtype(h_out, "h_out", {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16});
  const int64_t B = h_out.size(0), H = h_out.size(1);
  check_rows(h_out, "h_out", B, H, "(batch, hidden)");
  const at::ScalarType T = h_out.scalar_type(), A = acc_type(T);
  check_rows(gi, "gi", B, 3 * H, "(batch, 3*hidden)");
  LAB_CHECK_TYPE(gi.scalar_type() == A, "gi must be ", c10::toString(A), " (the accumulate type of h_out's ",
                   c10::toString(T), "), got ", c10::toString(gi.scalar_type()));
  lab::check_same_device(gi, "gi", h_out, "h_out");
  const bool has_gh = gh && gh->defined(), has_bih = b_ih && b_ih->defined(), has_hp = h_prev && h_prev->defined();
  if (has_gh) {
    check_rows(*gh, "gh", B, 3 * H, "(batch, 3*hidden)");
    LAB_CHECK_TYPE(gh->scalar_type() == A, "gh must be ", c10::toString(A), ", got ",
                     c10::toString(gh->scalar_type()));
    lab::check_same_device(*gh, "gh", h_out, "h_out");
  }
  using Named = std::pair<const at::Tensor*, const char*>;
  for (const Named& nt : {Named{has_bih ? &*b_ih : nullptr, "b_ih"}, Named{&b_hh, "b_hh"}}) {
    const at::Tensor* t = nt.first;
    const char* name = nt.second;
    if (!t) continue;
    lab::check_shape(*t, name, {3 * H}, "(3*hidden,)");
    lab::check_same_dtype(*t, name, h_out, "h_out");
    lab::check_same_device(*t, name, h_out, "h_out");
    lab::check_contiguous(*t, name);
  }
  if (has_hp) {
    check_rows(*h_prev, "h_prev", B, H, "(batch, hidden)");
    lab::check_same_dtype(*h_prev, "h_prev", h_out, "h_out");
    lab::check_same_device(*h_prev, "h_prev", h_out, "h_out");
    // elementwise in (b, j): h_out may be h_prev itself (a step in place), but no other overlap
    lab::check_no_overlap(h_out, "h_out", *h_prev, "h_prev", /*in_place_ok=*/true);
  }
  lab::check_no_overlap(h_out, "h_out", gi, "gi");  // h_out[b, j] reads gi[b, j], gi[b, H + j] and gi[b, 2H + j]
  if (has_gh) lab::check_no_overlap(h_out, "h_out", *gh, "gh");
  if (has_bih) lab::check_no_overlap(h_out, "h_out", *b_ih, "b_ih");
  lab::check_no_overlap(h_out, "h_out", b_hh, "b_hh");
  if (h_out.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(h_out.device());
    const GatesCuda gru_gates = lab::launcher<GatesCuda>("gru_gates");  // cuda_src/gru/gates.cu
    LAB_CUDA_CHECK(gru_gates(dtype_code(T), gi.data_ptr(), gi.stride(0), has_gh ? gh->data_ptr() : nullptr,
                             has_gh ? gh->stride(0) : 0, has_bih ? b_ih->data_ptr() : nullptr, b_hh.data_ptr(),
                             has_hp ? h_prev->data_ptr() : nullptr, has_hp ? h_prev->stride(0) : 0, h_out.data_ptr(),
                             h_out.stride(0), lab::check_int32(B, "batch"), lab::check_int32(H, "hidden"),
                             LAB_STREAM()),
                   "gru gate kernel");
#else
    LAB_NO_CUDA_BUILD("gru_gates");
#endif
    return h_out;
  }
  if (T == at::kFloat || T == at::kDouble) {
    AT_DISPATCH_FLOATING_TYPES(T, "gru_gates_cpu", [&] {
      lab::launcher<GatesCpu<scalar_t>>(lab::cat("gru_gates_cpu_", lab::dtype_suffix<scalar_t>()))(
          gi.data_ptr<scalar_t>(), gi.stride(0), has_gh ? gh->data_ptr<scalar_t>() : nullptr,
          has_gh ? gh->stride(0) : 0, has_bih ? b_ih->data_ptr<scalar_t>() : nullptr, b_hh.data_ptr<scalar_t>(),
          has_hp ? h_prev->data_ptr<scalar_t>() : nullptr, has_hp ? h_prev->stride(0) : 0,
          h_out.data_ptr<scalar_t>(), h_out.stride(0), B, H);
    });
    return h_out;
  }
  // float16/bfloat16 (gi, gh are float): the float loop on widened biases and h_prev, the result rounded into h_out
  const at::Tensor bi = has_bih ? widened(*b_ih) : at::Tensor(), bh = widened(b_hh),
                   hp = has_hp ? widened(*h_prev) : at::Tensor();
  at::Tensor ho = at::empty({B, H}, h_out.options().dtype(at::kFloat));
  lab::launcher<GatesCpu<float>>("gru_gates_cpu_f32")(
      gi.data_ptr<float>(), gi.stride(0), has_gh ? gh->data_ptr<float>() : nullptr, has_gh ? gh->stride(0) : 0,
      has_bih ? bi.data_ptr<float>() : nullptr, bh.data_ptr<float>(), has_hp ? hp.data_ptr<float>() : nullptr, H,
      ho.data_ptr<float>(), H, B, H);
  h_out.copy_(ho);
  return h_out;
}

// ---- input_projection: proj.cu's kernel on its own (what v3..v6 run for few rows; the tests and the benchmark) ----
at::Tensor input_projection(const at::Tensor& x, const at::Tensor& w, at::Tensor out,
                            const std::optional<at::Tensor>& zero) {
  lab::check_dim(x, "x", 2, "(rows, input)");
  lab::check_dtype(x, "x", {at::kFloat, at::kHalf, at::kBFloat16});
  lab::check_contiguous(x, "x");
  lab::check_dim(w, "w", 2, "(3*hidden, input)");
  lab::check_same_dtype(w, "w", x, "x");
  lab::check_same_device(w, "w", x, "x");
  lab::check_contiguous(w, "w");
  LAB_CHECK_VALUE(w.size(1) == x.size(1), "w must have as many columns as x (the input size ", x.size(1), "), got ",
                  lab::shape_str(w.sizes()));
  lab::check_shape(out, "out", {x.size(0), w.size(0)}, "(rows, 3*hidden)");
  LAB_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be Float (fp32 accumulation and output), got ",
                 c10::toString(out.scalar_type()));
  lab::check_same_device(out, "out", x, "x");
  lab::check_contiguous(out, "out");
  lab::check_no_overlap(out, "out", x, "x");  // a GEMM: every output tile reads whole rows of x and w
  lab::check_no_overlap(out, "out", w, "w");
  const bool has_zero = zero && zero->defined();
  if (has_zero) {
    lab::check_dtype(*zero, "zero", {at::kInt});
    lab::check_same_device(*zero, "zero", x, "x");
    lab::check_contiguous(*zero, "zero");
    lab::check_no_overlap(*zero, "zero", out, "out");
  }
  LAB_CHECK_VALUE(x.is_cuda(), "input_projection is proj.cu's CUDA kernel: x must be a CUDA tensor, got ", x.device());
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  launch_proj(x, w, out, has_zero ? *zero : at::Tensor());
#else
  LAB_NO_CUDA_BUILD("input_projection");
#endif
  return out;
}

// ---- decoder_prep: the decoder step's token pick and gathers ----------------------------------------------------
void decoder_prep(const std::optional<at::Tensor>& logits, const std::optional<at::Tensor>& tokens,
                  const std::optional<at::Tensor>& tokens_out, const at::Tensor& emb, const at::Tensor& gi_table,
                  const at::Tensor& gi_ctx, at::Tensor xh, at::Tensor gi) {
  const bool has_logits = logits && logits->defined(), has_tok = tokens && tokens->defined();
  LAB_CHECK_VALUE(has_logits != has_tok, "decoder_prep takes exactly one of logits (greedy: argmax) and tokens "
                    "(given ids), got ", has_logits ? "both" : "neither");
  lab::check_dim(emb, "emb", 2, "(vocab, emb_dim)");
  lab::check_dtype(emb, "emb", {at::kFloat, at::kDouble});
  lab::check_contiguous(emb, "emb");
  const int64_t V = emb.size(0), E = emb.size(1);
  lab::check_dim(gi_table, "gi_table", 2, "(vocab, 3*hidden)");
  const int64_t G = gi_table.size(1);
  lab::check_shape(gi_table, "gi_table", {V, G}, "(vocab, 3*hidden)");
  lab::check_dim(gi_ctx, "gi_ctx", 2, "(batch, 3*hidden)");
  const int64_t B = gi_ctx.size(0);
  lab::check_shape(gi_ctx, "gi_ctx", {B, G}, "(batch, 3*hidden)");
  lab::check_shape(gi, "gi", {B, G}, "(batch, 3*hidden)");
  lab::check_dim(xh, "xh", 2, "(batch, emb_dim + hidden)");
  LAB_CHECK_VALUE(xh.size(0) == B && xh.size(1) >= E && xh.stride(1) == 1, "xh must be (batch, >= emb_dim) = (", B,
                    ", >= ", E, ") with unit stride along its last dimension, got shape ", lab::shape_str(xh.sizes()),
                    " strides ", lab::shape_str(xh.strides()));
  using Named = std::pair<const at::Tensor*, const char*>;
  for (const Named& nt : {Named{&gi_table, "gi_table"}, Named{&gi_ctx, "gi_ctx"}, Named{&gi, "gi"}}) {
    const at::Tensor* t = nt.first;
    const char* name = nt.second;
    lab::check_same_dtype(*t, name, emb, "emb");
    lab::check_same_device(*t, name, emb, "emb");
    lab::check_contiguous(*t, name);
  }
  lab::check_same_dtype(xh, "xh", emb, "emb");
  lab::check_same_device(xh, "xh", emb, "emb");
  int64_t ldl = 0, nl = 0;
  if (has_logits) {
    lab::check_dim(*logits, "logits", 2, "(batch, vocab_out)");
    LAB_CHECK_VALUE(logits->size(0) == B && logits->size(1) >= 1 && logits->stride(1) == 1, "logits must be (batch, "
                      "vocab_out) = (", B, ", n >= 1) with unit stride along its last dimension, got shape ",
                      lab::shape_str(logits->sizes()));
    lab::check_same_dtype(*logits, "logits", emb, "emb");
    lab::check_same_device(*logits, "logits", emb, "emb");
    ldl = logits->stride(0), nl = logits->size(1);
  } else {
    lab::check_shape(*tokens, "tokens", {B}, "(batch,)");
    lab::check_dtype(*tokens, "tokens", {at::kLong});
    lab::check_same_device(*tokens, "tokens", emb, "emb");
    lab::check_contiguous(*tokens, "tokens");
  }
  if (tokens_out && tokens_out->defined()) {
    lab::check_shape(*tokens_out, "tokens_out", {B}, "(batch,)");
    lab::check_dtype(*tokens_out, "tokens_out", {at::kLong});
    lab::check_same_device(*tokens_out, "tokens_out", emb, "emb");
    lab::check_contiguous(*tokens_out, "tokens_out");
  }
  int64_t* tok_out = tokens_out && tokens_out->defined() ? tokens_out->data_ptr<int64_t>() : nullptr;
  if (emb.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(emb.device());
    const DecoderPrepCuda gru_decoder_prep = lab::launcher<DecoderPrepCuda>("gru_decoder_prep");  // gru/decoder.cu
    LAB_CUDA_CHECK(gru_decoder_prep(dtype_code(emb.scalar_type()), has_logits ? logits->data_ptr() : nullptr, ldl,
                                    lab::check_int32(nl, "vocab_out"), has_tok ? tokens->data_ptr<int64_t>() : nullptr,
                                    tok_out, emb.data_ptr(), lab::check_int32(E, "emb_dim"), gi_table.data_ptr(),
                                    gi_ctx.data_ptr(), lab::check_int32(G, "3*hidden"), lab::check_int32(V, "vocab"),
                                    xh.data_ptr(), xh.stride(0), gi.data_ptr(), lab::check_int32(B, "batch"),
                                    LAB_STREAM()),
                   "gru decoder_prep kernel");
#else
    LAB_NO_CUDA_BUILD("decoder_prep");
#endif
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(emb.scalar_type(), "decoder_prep_cpu", [&] {
    const char* sfx = lab::dtype_suffix<scalar_t>();
    std::vector<int64_t> tok(static_cast<size_t>(B));
    lab::launcher<TokensCpu<scalar_t>>(lab::cat("decoder_tokens_cpu_", sfx))(
        has_logits ? logits->data_ptr<scalar_t>() : nullptr, ldl, nl,
        has_tok ? tokens->data_ptr<int64_t>() : nullptr, tok.data(), B);
    for (int64_t b = 0; b < B; ++b) {
      if (!has_logits)
        LAB_CHECK_VALUE(tok[size_t(b)] >= 0 && tok[size_t(b)] < V, "tokens[", b, "] = ", tok[size_t(b)],
                          " is outside the vocabulary [0, ", V, ")");
      LAB_CHECK_VALUE(tok[size_t(b)] < V, "argmax of logits[", b, "] = ", tok[size_t(b)], " is outside the "
                        "vocabulary of emb [0, ", V, ")");
      if (tok_out) tok_out[b] = tok[size_t(b)];
    }
    lab::launcher<GatherCpu<scalar_t>>(lab::cat("decoder_gather_cpu_", sfx))(
        tok.data(), emb.data_ptr<scalar_t>(), E, gi_table.data_ptr<scalar_t>(), gi_ctx.data_ptr<scalar_t>(), G,
        xh.data_ptr<scalar_t>(), xh.stride(0), gi.data_ptr<scalar_t>(), B);
  });
}

// ---- greedy_decode: every step of the seq2seq decoder's greedy loop in one call ----------------------------------
// CUDA: one cooperative launch (cuda_src/gru/greedy.cu), float32; CPU: cpp_src/gru/cpu.cpp's loop, float32/float64.
#ifdef LAB_WITH_CUDA
// greedy.cu's info[] order
constexpr int kGreedyInfo = 16;
static const char* kGreedyInfoNames[kGreedyInfo] = {
    "blocks", "units_per_block", "rows_per_block", "smem_bytes", "smem_optin", "max_coresident",
    "a_rows_per_thread", "a_k_lanes", "a_batch_tile", "a_k_chunk", "b_rows_per_thread", "b_k_lanes", "b_batch_tile",
    "b_k_chunk", "a_weight_rows_per_thread", "b_weight_rows_per_thread"};

// cuda_src/gru/greedy.cu is built once per tile width (// lab:variants wide=0,1): the plan of the unit whose width
// the batch takes answers, the other returns kGreedyOtherUnit. *unit: 0 narrow, 1 wide (its launcher's suffix).
constexpr int kGreedyOtherUnit = 6;
int greedy_plan_cuda(int b, int h, int e, int v, int* info, int* unit) {
  int status = kGreedyOtherUnit;
  for (int w = 0; w < 2 && status == kGreedyOtherUnit; ++w) {
    status = lab::launcher<GreedyPlanCuda>(w ? "gru_greedy_plan@1" : "gru_greedy_plan@0")(b, h, e, v, info);
    *unit = w;
  }
  return status;  // (kGreedyOtherUnit from both cannot happen: one of the two widths takes every batch)
}

std::string greedy_plan_error(int status, const int* info, int64_t B, int64_t H, int64_t E, int64_t V) {
  std::string o = lab::cat("the one-launch greedy decoder cannot run batch ", B, ", hidden ", H, ", emb ", E,
                           ", vocab ", V, " on this GPU: ");
  switch (status) {
    case 1: o += lab::cat("it keeps every row's token in shared memory, so batch <= 1024"); break;
    case 2: o += lab::cat("it keeps the decoder's weights in shared memory: a block's ", info[1], " units of W_hh and ",
                          info[2], " rows of fc_out (", info[3], " bytes with the staging buffers) against ", info[4],
                          " bytes a block may have"); break;
    case 3: o += lab::cat("its blocks wait for each other every step, so all ", info[0], " must be co-resident (one "
                          "per SM), the GPU holds ", info[5], " at once"); break;
    case 4: o += "the device does not support cooperative launches"; break;
    default:
      o += lab::cat("a CUDA error while planning the launch (", cudaGetErrorString(cudaGetLastError()), ")");
      break;
  }
  return o + "; decode step by step instead (LabSeq2Seq.greedy(src, fused=False))";
}
#endif

// tokens_in (batch,): step 0's input instead of sos (a token outside the vocabulary poisons its row with NaN: no
// device-side check); logits (batch, vocab): the last step's; h_out (batch, hidden), unit inner stride, may be ctx
// itself: the last step's h (needs eos = -1: a decode that stops early has no last step for every row).
void greedy_decode(const at::Tensor& ctx, const at::Tensor& gi_ctx, const at::Tensor& fc_ctx, const at::Tensor& emb,
                   const at::Tensor& gi_table, const at::Tensor& w_hh, const at::Tensor& b_hh,
                   const at::Tensor& w_fc, int64_t sos, int64_t eos, const std::optional<at::Tensor>& tokens_out,
                   const std::optional<at::Tensor>& tokens_in, const std::optional<at::Tensor>& logits,
                   const std::optional<at::Tensor>& h_out) {
  lab::check_dim(ctx, "ctx", 2, "(batch, hidden)");
  lab::check_dim(emb, "emb", 2, "(vocab, emb_dim)");
  // tokens None: one teacher-forced step that writes logits (and h_out) without picking the next token
  const bool has_tokens = tokens_out && tokens_out->defined();
  if (has_tokens) lab::check_dim(*tokens_out, "tokens", 2, "(steps, batch)");
  const int64_t B = ctx.size(0), H = ctx.size(1), V = emb.size(0), E = emb.size(1),
                Tn = has_tokens ? tokens_out->size(0) : 1;
  lab::check_dtype(ctx, "ctx", {at::kFloat, at::kDouble});
  using Spec = std::tuple<const at::Tensor*, const char*, std::vector<int64_t>, const char*>;
  for (const Spec& sp : {Spec{&gi_ctx, "gi_ctx", {B, 3 * H}, "(batch, 3*hidden)"},
                         Spec{&fc_ctx, "fc_ctx", {B, V}, "(batch, vocab)"},
                         Spec{&emb, "emb", {V, E}, "(vocab, emb_dim)"},
                         Spec{&gi_table, "gi_table", {V, 3 * H}, "(vocab, 3*hidden)"},
                         Spec{&w_hh, "w_hh", {3 * H, H}, "(3*hidden, hidden)"},
                         Spec{&b_hh, "b_hh", {3 * H}, "(3*hidden,)"},
                         Spec{&w_fc, "w_fc", {V, E + H}, "(vocab, emb_dim + hidden)"}}) {
    const at::Tensor& t = *std::get<0>(sp);
    const char* name = std::get<1>(sp);
    lab::check_shape(t, name, std::get<2>(sp), std::get<3>(sp));
    lab::check_same_dtype(t, name, ctx, "ctx");
    lab::check_same_device(t, name, ctx, "ctx");
    lab::check_contiguous(t, name);
  }
  LAB_CHECK_VALUE(ctx.stride(1) == 1 && (B <= 1 || ctx.stride(0) >= H), "ctx must have unit stride along its last "
                  "dimension and rows at least hidden apart, got strides ", lab::shape_str(ctx.strides()));
  if (has_tokens) {
    const at::Tensor& tokens = *tokens_out;
    lab::check_shape(tokens, "tokens", {Tn, B}, "(steps, batch)");
    lab::check_dtype(tokens, "tokens", {at::kLong});
    lab::check_same_device(tokens, "tokens", ctx, "ctx");
    lab::check_contiguous(tokens, "tokens");
  }
  LAB_CHECK_VALUE(V >= 1, "emb must have at least one row (the vocabulary), got shape ", lab::shape_str(emb.sizes()));
  LAB_CHECK_VALUE(sos >= 0 && sos < V, "sos = ", sos, " is outside the vocabulary [0, ", V, ")");
  LAB_CHECK_VALUE(eos >= -1 && eos < V, "eos = ", eos, " must be -1 (none) or inside the vocabulary [0, ", V, ")");
  const bool has_tin = tokens_in && tokens_in->defined(), has_logits = logits && logits->defined(),
             has_hout = h_out && h_out->defined();
  LAB_CHECK_VALUE(has_tokens || (has_tin && has_logits), "tokens=None runs one teacher-forced step without the pick: "
                  "it needs tokens_in and logits");
  if (has_tin) {
    lab::check_shape(*tokens_in, "tokens_in", {B}, "(batch,)");
    lab::check_dtype(*tokens_in, "tokens_in", {at::kLong});
    lab::check_same_device(*tokens_in, "tokens_in", ctx, "ctx");
    lab::check_contiguous(*tokens_in, "tokens_in");
  }
  if (has_logits) {
    lab::check_shape(*logits, "logits", {B, V}, "(batch, vocab)");
    lab::check_same_dtype(*logits, "logits", ctx, "ctx");
    lab::check_same_device(*logits, "logits", ctx, "ctx");
    lab::check_contiguous(*logits, "logits");
  }
  if (has_hout) {
    lab::check_shape(*h_out, "h_out", {B, H}, "(batch, hidden)");
    lab::check_same_dtype(*h_out, "h_out", ctx, "ctx");
    lab::check_same_device(*h_out, "h_out", ctx, "ctx");
    LAB_CHECK_VALUE(h_out->stride(1) == 1, "h_out must have unit stride along its last dimension, got strides ",
                    lab::shape_str(h_out->strides()));
    LAB_CHECK_VALUE(eos == -1, "h_out needs eos = -1 (a decode that stops at <eos> has no last step for every row), "
                    "got eos = ", eos);
  }
  if (B == 0 || Tn == 0) return;
  if (ctx.is_cuda()) {
#ifdef LAB_WITH_CUDA
    LAB_CHECK_VALUE(ctx.scalar_type() == at::kFloat, "the one-launch greedy decoder runs float32 on the GPU, got ",
                    ctx.scalar_type(), "; decode step by step instead (LabSeq2Seq.greedy(src, fused=False))");
    c10::cuda::CUDAGuard guard(ctx.device());
    const int b = lab::check_int32(B, "batch"), h = lab::check_int32(H, "hidden"), e = lab::check_int32(E, "emb_dim"),
              v = lab::check_int32(V, "vocab");
    lab::check_int32(3 * H * V, "3*hidden*vocab");
    lab::check_int32((E + H) * V, "(emb_dim + hidden)*vocab");
    int info[kGreedyInfo], unit = 0;
    const int status = greedy_plan_cuda(b, h, e, v, info, &unit);
    LAB_CHECK_VALUE(status == 0, greedy_plan_error(status, info, B, H, E, V));
    // The kernel copies rows of h, ctx and emb 16 bytes at a time: H and E padded to multiples of 4 with zero columns
    // (copies, only for such sizes or for misaligned tensors), h's workspace zeroed so its pad columns are.
    const int64_t Hp = (H + 3) / 4 * 4, Ep = (E + 3) / 4 * 4;
    auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
    const bool pad = Hp != H || Ep != E || !aligned(ctx) || !aligned(emb) || !aligned(w_hh) || !aligned(w_fc) ||
                     (B > 1 && ctx.stride(0) % 4 != 0);
    at::Tensor ctx_p = ctx, emb_p = emb, w_hh_p = w_hh, w_fc_p = w_fc;
    if (pad) {  // (ctx's rows then Hp apart)
      ctx_p = at::zeros({B, Hp}, ctx.options());
      ctx_p.narrow(1, 0, H).copy_(ctx);
      emb_p = at::zeros({V, Ep}, ctx.options());
      emb_p.narrow(1, 0, E).copy_(emb);
      w_hh_p = at::zeros({3 * H, Hp}, ctx.options());
      w_hh_p.narrow(1, 0, H).copy_(w_hh);
      w_fc_p = at::zeros({V, Ep + Hp}, ctx.options());
      w_fc_p.narrow(1, 0, E).copy_(w_fc.narrow(1, 0, E));
      w_fc_p.narrow(1, Ep, H).copy_(w_fc.narrow(1, E, H));
    }
    at::Tensor hbuf = pad ? at::zeros({2, B, Hp}, ctx.options()) : at::empty({2, B, Hp}, ctx.options());  // h_t
    at::Tensor keys = at::empty({2, B}, ctx.options().dtype(at::kLong));  // the argmax merges (reset in-kernel)
    LAB_CUDA_CHECK(lab::launcher<GreedyCuda>(unit ? "gru_greedy@1" : "gru_greedy@0")(
                       ctx_p.data_ptr<float>(), gi_ctx.data_ptr<float>(), fc_ctx.data_ptr<float>(),
                       emb_p.data_ptr<float>(), gi_table.data_ptr<float>(), w_hh_p.data_ptr<float>(),
                       b_hh.data_ptr<float>(), w_fc_p.data_ptr<float>(), hbuf.data_ptr<float>(),
                       reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>()),
                       has_tokens ? tokens_out->data_ptr<int64_t>() : nullptr,
                       has_tin ? tokens_in->data_ptr<int64_t>() : nullptr,
                       has_logits ? logits->data_ptr<float>() : nullptr, has_hout ? h_out->data_ptr<float>() : nullptr,
                       pad ? Hp : ctx.stride(0), has_hout ? h_out->stride(0) : 0, b, h, e, v,
                       lab::check_int32(Tn, "steps"), int(sos), int(eos), LAB_STREAM()),
                   "gru greedy kernel");
#else
    LAB_NO_CUDA_BUILD("greedy_decode");
#endif
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(ctx.scalar_type(), "greedy_decode_cpu", [&] {
    lab::launcher<GreedyCpu<scalar_t>>(lab::cat("greedy_decode_cpu_", lab::dtype_suffix<scalar_t>()))(
        ctx.data_ptr<scalar_t>(), ctx.stride(0), gi_ctx.data_ptr<scalar_t>(), fc_ctx.data_ptr<scalar_t>(),
        emb.data_ptr<scalar_t>(), gi_table.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(),
        b_hh.data_ptr<scalar_t>(), w_fc.data_ptr<scalar_t>(), has_tokens ? tokens_out->data_ptr<int64_t>() : nullptr,
        has_tin ? tokens_in->data_ptr<int64_t>() : nullptr, has_logits ? logits->data_ptr<scalar_t>() : nullptr,
        has_hout ? h_out->data_ptr<scalar_t>() : nullptr, has_hout ? h_out->stride(0) : 0, B, H, E, V, Tn, sos, eos);
  });
}

// The one-launch decoder's plan on this GPU (for the notebook and the model's choice of path).
py::dict greedy_plan(int64_t batch, int64_t hidden, int64_t emb_dim, int64_t vocab) {
  LAB_CHECK_VALUE(batch >= 1 && hidden >= 1 && emb_dim >= 0 && vocab >= 1, "batch, hidden and vocab must be >= 1 and "
                  "emb_dim >= 0, got ", batch, ", ", hidden, ", ", vocab, ", ", emb_dim);
  py::dict d;
#ifdef LAB_WITH_CUDA
  int info[kGreedyInfo], unit = 0;
  const int status =
      greedy_plan_cuda(lab::check_int32(batch, "batch"), lab::check_int32(hidden, "hidden"),
                       lab::check_int32(emb_dim, "emb_dim"), lab::check_int32(vocab, "vocab"), info, &unit);
  d["status"] = status;  // 0 fits; 1 batch > 1024; 2 shared memory; 3 not co-resident; 4 no cooperative launch;
                         // 5 a CUDA error while asking
  d["reason"] = status == 0 ? std::string() : greedy_plan_error(status, info, batch, hidden, emb_dim, vocab);
  for (int i = 0; i < kGreedyInfo; ++i) d[kGreedyInfoNames[i]] = info[i];
#else
  LAB_NO_CUDA_BUILD("greedy_plan");
#endif
  return d;
}

// ---- the v3 plan, for the notebook ------------------------------------------------------------------------------
// A dict: the plan's status and its split, named here (v3.cu's gru_v3_plan fills info[] in the order of kInfoNames).
// dtype_code: 0 float32, 1 float16, 2 bfloat16.
py::dict v3_plan(int64_t batch, int64_t hidden, int64_t dtype_code_, int64_t version) {
  LAB_CHECK_VALUE(dtype_code_ >= 0 && dtype_code_ <= 2, "dtype_code must be 0 (float32), 1 (float16) or 2 "
                    "(bfloat16), got ", dtype_code_);
  LAB_CHECK_VALUE(version == 3 || version == 4, "version must be 3 or 4, got ", version);
  LAB_CHECK_VALUE(batch >= 1 && hidden >= 1, "batch and hidden must be >= 1, got ", batch, ", ", hidden);
  py::dict d;
#ifdef LAB_WITH_CUDA
  // v3.cu's order: kpt, s, hb, ph, pb, bb, bc, smem, blocks, max_coresident
  static const char* kInfoNames[10] = {"kpt", "lanes_per_unit", "units_per_block", "hidden_slices", "batch_slices",
                                       "rows_per_block", "rows_per_chunk", "smem_bytes", "blocks", "max_coresident"};
  int info[10];
  const int status = v3_plan_call(version, int(dtype_code_), lab::check_int32(batch, "batch"),
                                  lab::check_int32(hidden, "hidden"), info);
  d["status"] = status;  // 0 fits; 1 hidden too large; 2 batch slice too big for shared memory; 3 not co-resident;
                         // 4 no cooperative launch; 5 a CUDA error while asking
  for (int i = 0; i < 10; ++i) d[kInfoNames[i]] = info[i];
  // the exchange between steps gru() runs by default at this split (config -1, no grid_sync)
  d["exchange"] = v3_exchange(false, -1, info[5]) == Exchange::kTagged ? "tagged" : "counters";
#else
  LAB_NO_CUDA_BUILD("v3_plan");
#endif
  return d;
}

// v5's plan (cuda_src/gru/v5.cu's gru_v5_plan fills info[] in the order of kInfoNames). config -1: the plan's choice.
py::dict v5_plan(int64_t batch, int64_t hidden, int64_t dtype_code_, int64_t config) {
  LAB_CHECK_VALUE(dtype_code_ >= 0 && dtype_code_ <= 2, "dtype_code must be 0 (float32), 1 (float16) or 2 "
                    "(bfloat16), got ", dtype_code_);
  LAB_CHECK_VALUE(config >= -1 && config < 8, "config must be -1 (automatic) or 0..7, got ", config);
  LAB_CHECK_VALUE(batch >= 1 && hidden >= 1, "batch and hidden must be >= 1, got ", batch, ", ", hidden);
  py::dict d;
#ifdef LAB_WITH_CUDA
  static const char* kInfoNames[12] = {"config", "units_per_block", "rows_per_chunk", "k_split", "hidden_slices",
                                       "batch_slices", "rows_per_block", "k_padded", "smem_bytes", "blocks",
                                       "max_coresident", "cost_ns"};
  int info[12];
  const int status = v5_plan_call(int(dtype_code_), lab::check_int32(batch, "batch"),
                                  lab::check_int32(hidden, "hidden"), int(config), info);
  d["status"] = status;  // 0 fits; 2 shared memory; 3 not co-resident; 4 no cooperative launch; 5 CUDA error
  for (int i = 0; i < 12; ++i) d[kInfoNames[i]] = info[i];
#else
  LAB_NO_CUDA_BUILD("v5_plan");
#endif
  return d;
}

// v6's plan for a stack of `layers` (v6.cu's gru_v6_plan; the binding picks the rows-per-pass variant as
// forward_v6 does). "layers_per_launch": how many layers the first launch runs as a wavefront.
py::dict v6_plan(int64_t batch, int64_t hidden, int64_t layers, int64_t seq_len, int64_t dtype_code_,
                 int64_t config) {
  LAB_CHECK_VALUE(dtype_code_ >= 0 && dtype_code_ <= 2, "dtype_code must be 0 (float32), 1 (float16) or 2 "
                    "(bfloat16), got ", dtype_code_);
  LAB_CHECK_VALUE(batch >= 1 && hidden >= 1 && layers >= 1 && seq_len >= 1, "batch, hidden, layers and seq_len "
                  "must be >= 1, got ", batch, ", ", hidden, ", ", layers, ", ", seq_len);
  py::dict d;
#ifdef LAB_WITH_CUDA
  static const char* kInfoNames[11] = {"kpt", "lanes_per_unit", "units_per_block", "hidden_slices", "batch_slices",
                                       "rows_per_block", "rows_per_chunk", "smem_bytes", "blocks", "max_coresident",
                                       "layers_per_launch"};
  int info[11], rb = 2;
  const int status = v6_plan_call(int(dtype_code_), lab::check_int32(batch, "batch"),
                                  lab::check_int32(hidden, "hidden"), lab::check_int32(layers, "layers"),
                                  lab::check_int32(seq_len, "seq_len"), int(config), info, &rb);
  d["status"] = status;  // as v3_plan's, and 6: a bad config
  d["rows_per_pass"] = rb;
  for (int i = 0; i < 11; ++i) d[kInfoNames[i]] = info[i];
#else
  LAB_NO_CUDA_BUILD("v6_plan");
#endif
  return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "GRU family: nn.GRU forward (version 0 = C++ CPU, 1..6 = CUDA), the decoder step's pieces";
  m.def("gru_forward", lab::bind(gru_forward),
        "gru_forward(x, h0|None, params, out, h_n, version, config, grid_sync) -> (out, h_n)");
  m.def("gru_gates", lab::bind(gru_gates_op),
        "gru_gates(gi, gh|None, b_ih|None, b_hh, h_prev|None, h_out) -> h_out");
  m.def("decoder_prep", lab::bind(decoder_prep),
        "decoder_prep(logits|None, tokens|None, tokens_out|None, emb, gi_table, gi_ctx, xh, gi)");
  m.def("greedy_decode", lab::bind(greedy_decode),
        "greedy_decode(ctx, gi_ctx, fc_ctx, emb, gi_table, w_hh, b_hh, w_fc, sos, eos, tokens|None, tokens_in|None, "
        "logits|None, h_out|None) -> None: every step of a greedy decode (tokens: (steps, batch) out; None: one "
        "teacher-forced step from tokens_in into logits, no pick)");
  m.def("greedy_plan", lab::bind(greedy_plan),
        "greedy_plan(batch, hidden, emb_dim, vocab) -> {status, reason, blocks, units_per_block, rows_per_block, "
        "smem_bytes, smem_optin, max_coresident, a_/b_rows_per_thread (batch rows), a_/b_k_lanes, a_/b_batch_tile, "
        "a_/b_k_chunk, a_/b_weight_rows_per_thread}");
  m.def("input_projection", lab::bind(input_projection),
        "input_projection(x, w, out, zero|None) -> out: x (M, K) @ w (N, K)^T in fp32 by proj.cu (zero: int32, set "
        "to 0 in the same launch)");
  m.def("v3_plan", lab::bind(v3_plan),
        "v3_plan(batch, hidden, dtype_code, version) -> {status, kpt, lanes_per_unit, units_per_block, hidden_slices, "
        "batch_slices, rows_per_block, rows_per_chunk, smem_bytes, blocks, max_coresident, exchange}");
  m.def("v5_plan", lab::bind(v5_plan),
        "v5_plan(batch, hidden, dtype_code, config) -> {status, config, units_per_block, rows_per_chunk, k_split, "
        "hidden_slices, batch_slices, rows_per_block, k_padded, smem_bytes, blocks, max_coresident, cost_ns}");
  m.def("v6_plan", lab::bind(v6_plan),
        "v6_plan(batch, hidden, layers, seq_len, dtype_code, config) -> {status, rows_per_pass, kpt, lanes_per_unit, "
        "units_per_block, hidden_slices, batch_slices, rows_per_block, rows_per_chunk, smem_bytes, blocks, "
        "max_coresident, layers_per_launch}");
  LAB_BIND_UNITS(m);
}
