// gru.cpp — torch-facing functions of the GRU family, and their C++ CPU versions.
//
//   gru_forward(x, h0, params, out, h_n, version)  nn.GRU's forward: (seq_len, batch, input) -> out, h_n.
//       version 0: C++ on the CPU (at::parallel_for); 1..4: cuda_src/gru.cu's v1..v4 (see its header).
//   gru_gates(gi, gh, b_ih, b_hh, h_prev, h_out)   one GRU cell's pointwise half (gates + update), rows may be
//       strided: the seq2seq decoder writes h straight into its [emb | h] buffer.
//   decoder_prep(logits | tokens, tokens_out, emb, gi_table, gi_ctx, xh, gi)   the decoder step's token pick
//       (argmax) and gathers.
//   v3_plan(batch, hidden, dtype_code, version)      how v3/v4 split the work on this GPU (for the notebook).
//
// Every function writes into tensors the caller allocated (the lab poisons them with NaN before a check). CUDA
// versions run on the current stream; GEMMs go to cuBLAS through ATen: for fp16/bf16 with an fp32 output
// (at::mm's out_dtype), so gate pre-activations are never rounded to 16 bits.
#include "lab_common.h"

#include <ATen/OpMathType.h>
#include <torch/version.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8),
              "gru.cpp needs torch >= 2.8 (at::mm with out_dtype for fp32 output from fp16/bf16 inputs)");

#ifdef LAB_WITH_CUDA
cudaError_t gru_gates(int dtype, const void* gi, int64_t ldgi, const void* gh, int64_t ldgh, const void* b_ih,
                      const void* b_hh, const void* h_prev, int64_t ldhp, void* h_out, int64_t ldho, int B, int H,
                      cudaStream_t stream);
int gru_v3_plan(int version, int dtype, int B, int H, int* info);
cudaError_t gru_v3(int version, int dtype, const float* gi, const void* w_hh, const void* b_ih, const void* b_hh,
                   const void* h0, void* out, int T, int B, int H, cudaStream_t stream);
cudaError_t gru_decoder_prep(int dtype, const void* logits, int64_t ldl, int V, const int64_t* tok_in,
                             int64_t* tok_out, const void* emb, int E, const void* gtab, const void* gctx, int G3,
                             int vocab, void* xh, int64_t ldxh, void* gi, int B, cudaStream_t stream);
#endif

namespace {

constexpr int kMaxVersion = 4;

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
    }
  }
  if (h0 && h0->defined()) {
    lab::check_shape(*h0, "h0", {L, B, H}, "(num_layers, batch, hidden)");
    check_like(*h0, "h0", x);
  }
  lab::check_out(out, "out", x, {T, B, H}, "(seq_len, batch, hidden)");
  lab::check_out(h_n, "h_n", x, {L, B, H}, "(num_layers, batch, hidden)");
  return {L, H};
}

// =================================================================================================================
// C++ CPU version: the input projection of all steps first (parallel over (t, b) rows, blocks of 64 weight rows
// kept hot), then per step the recurrent dot products + gates, parallel over hidden units (each task streams its 3
// rows of W_hh once per step and sweeps the batch). Accumulates in A (float, or double for double); the state h
// stays in A across steps, outputs are rounded to T.
// =================================================================================================================
template <class A>
inline A dot(const A* a, const A* b, int64_t n) {
  A s[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 independent sums: the compiler turns the inner loop into vector FMAs
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int i = 0; i < 8; ++i) s[i] += a[k + i] * b[k + i];
  A tail = 0;
  for (; k < n; ++k) tail += a[k] * b[k];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

template <class A> inline A sigmoid(A v) { return A(1) / (A(1) + std::exp(-v)); }

template <class T, class A>
std::vector<A> widen(const T* p, int64_t n) {
  std::vector<A> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = static_cast<A>(p[i]);
  return v;
}

template <class T, class A>
void gru_layer_cpu(const T* x, const T* w_ih_, const T* w_hh_, const T* b_ih_, const T* b_hh_, const T* h0, T* out,
                   int64_t Tn, int64_t B, int64_t I, int64_t H) {
  const int64_t G = 3 * H;
  const std::vector<A> xa = widen<T, A>(x, Tn * B * I), wih = widen<T, A>(w_ih_, G * I),
                       whh = widen<T, A>(w_hh_, G * H), bih = widen<T, A>(b_ih_, G), bhh = widen<T, A>(b_hh_, G);
  // 1. gi[(t*B + b), n] = x[t, b] . w_ih[n] + b_ih[n]
  std::vector<A> gi(size_t(Tn * B * G));
  at::parallel_for(0, Tn * B, std::max<int64_t>(1, 16384 / (G * I)), [&](int64_t r0, int64_t r1) {
    for (int64_t n0 = 0; n0 < G; n0 += 64)
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t n = n0; n < std::min(G, n0 + 64); ++n)
          gi[size_t(r * G + n)] = dot(xa.data() + r * I, wih.data() + n * I, I) + bih[size_t(n)];
  });
  // 2. the recurrence
  std::vector<A> h(size_t(B * H)), hn(size_t(B * H));
  for (int64_t i = 0; i < B * H; ++i) h[size_t(i)] = h0 ? static_cast<A>(h0[i]) : A(0);
  for (int64_t t = 0; t < Tn; ++t) {
    at::parallel_for(0, H, std::max<int64_t>(1, 16384 / (G * B)), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const A* wr = whh.data() + j * H;
        const A* wz = whh.data() + (H + j) * H;
        const A* wn = whh.data() + (2 * H + j) * H;
        for (int64_t b = 0; b < B; ++b) {
          const A* hb = h.data() + b * H;
          const A* g = gi.data() + (t * B + b) * G;
          const A r = sigmoid(g[j] + dot(hb, wr, H) + bhh[size_t(j)]);
          const A z = sigmoid(g[H + j] + dot(hb, wz, H) + bhh[size_t(H + j)]);
          const A n = std::tanh(g[2 * H + j] + r * (dot(hb, wn, H) + bhh[size_t(2 * H + j)]));
          const A v = n + z * (hb[j] - n);
          hn[size_t(b * H + j)] = v;
          out[(t * B + b) * H + j] = static_cast<T>(v);
        }
      }
    });
    std::swap(h, hn);
  }
}

#ifdef LAB_WITH_CUDA
// x (M, K) @ w (N, K)^T -> (M, N) in the accumulate type (cuBLAS accumulates fp16/bf16 in fp32 and writes fp32).
at::Tensor proj(const at::Tensor& x, const at::Tensor& w) {
  if (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) return at::mm(x, w.t(), at::kFloat);
  return at::mm(x, w.t());
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

void layer_cuda(int64_t version, const at::Tensor& in, const at::Tensor& w_ih, const at::Tensor& w_hh,
                const at::Tensor& b_ih, const at::Tensor& b_hh, const at::Tensor& h0l, at::Tensor& o) {
  const int64_t Tn = in.size(0), B = in.size(1), I = in.size(2), H = w_hh.size(1), G = 3 * H;
  const int dt = dtype_code(in.scalar_type());
  const int b = lab::check_int32(B, "batch"), h = lab::check_int32(H, "hidden");
  cudaStream_t st = LAB_STREAM();
  if (version == 1) {
    for (int64_t t = 0; t < Tn; ++t) {
      const at::Tensor gi = proj(in.select(0, t), w_ih);                        // (B, 3H) x_t W_ih^T
      const at::Tensor hp = t == 0 ? h0l : o.select(0, t - 1);                  // undefined: zeros
      const at::Tensor gh = hp.defined() ? proj(hp, w_hh) : at::Tensor();       // (B, 3H) h W_hh^T
      LAB_CUDA_CHECK(gru_gates(dt, gi.data_ptr(), G, gh.defined() ? gh.data_ptr() : nullptr, G, b_ih.data_ptr(),
                               b_hh.data_ptr(), hp.defined() ? hp.data_ptr() : nullptr, H, o.select(0, t).data_ptr(),
                               H, b, h, st),
                     "gru v1 gate kernel");
    }
    return;
  }
  const at::Tensor gi = proj(in.view({Tn * B, I}), w_ih);  // (T*B, 3H): every step's input projection, one GEMM
  if (version == 2) {
    for (int64_t t = 0; t < Tn; ++t) {
      const at::Tensor hp = t == 0 ? h0l : o.select(0, t - 1);
      const at::Tensor gh = hp.defined() ? proj(hp, w_hh) : at::Tensor();
      LAB_CUDA_CHECK(gru_gates(dt, static_cast<const char*>(gi.data_ptr()) + t * B * G * gi.element_size(), G,
                               gh.defined() ? gh.data_ptr() : nullptr, G, b_ih.data_ptr(), b_hh.data_ptr(),
                               hp.defined() ? hp.data_ptr() : nullptr, H, o.select(0, t).data_ptr(), H, b, h, st),
                     "gru v2 gate kernel");
    }
    return;
  }
  LAB_CUDA_CHECK(gru_v3(int(version), dt, gi.data_ptr<float>(), w_hh.data_ptr(), b_ih.data_ptr(), b_hh.data_ptr(),
                        h0l.defined() ? h0l.data_ptr() : nullptr, o.data_ptr(), lab::check_int32(Tn, "seq_len"), b, h,
                        st),
                 version == 3 ? "gru v3 persistent kernel (cooperative launch)"
                              : "gru v4 persistent kernel (cooperative launch)");
}
#endif

}  // namespace

// ---- gru_forward ------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor> gru_forward(const at::Tensor& x, const std::optional<at::Tensor>& h0,
                                               const std::vector<at::Tensor>& params, at::Tensor out, at::Tensor h_n,
                                               int64_t version) {
  const std::pair<int64_t, int64_t> dims = check_forward(x, h0, params, out, h_n);
  const int64_t L = dims.first, H = dims.second;
  lab::check_version(x, "x", version, 1, kMaxVersion, "gru");
  const bool has_h0 = h0 && h0->defined();
  const int64_t Tn = x.size(0), B = x.size(1);
  if (version >= 3)
    LAB_CHECK_TYPE(x.scalar_type() != at::kDouble, "gru v", version, " supports Float, Half and BFloat16, got "
                     "Double (v1, v2 and the CPU version take float64)");
  at::Tensor in = x;
  for (int64_t l = 0; l < L; ++l) {
    at::Tensor o = l == L - 1 ? out : at::empty({Tn, B, H}, x.options());  // layer l's output: layer l+1's input
    const at::Tensor &w_ih = params[size_t(4 * l)], &w_hh = params[size_t(4 * l + 1)],
                     &b_ih = params[size_t(4 * l + 2)], &b_hh = params[size_t(4 * l + 3)];
    const at::Tensor h0l = has_h0 ? h0->select(0, l) : at::Tensor();
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      if (version >= 3) {
        int info[10];
        const int status = gru_v3_plan(int(version), dtype_code(x.scalar_type()), lab::check_int32(B, "batch"),
                                       lab::check_int32(H, "hidden"), info);
        LAB_CHECK_VALUE(status == 0, v3_plan_error(version, status, info, B, H, x.scalar_type()));
      }
      layer_cuda(version, in, w_ih, w_hh, b_ih, b_hh, h0l, o);
      h_n.select(0, l).copy_(o.select(0, Tn - 1));
#else
      LAB_NO_CUDA_BUILD("gru_forward");
#endif
    } else {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gru_forward_cpu", [&] {
        using A = at::opmath_type<scalar_t>;
        gru_layer_cpu<scalar_t, A>(in.data_ptr<scalar_t>(), w_ih.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(),
                                   b_ih.data_ptr<scalar_t>(), b_hh.data_ptr<scalar_t>(),
                                   has_h0 ? h0l.data_ptr<scalar_t>() : nullptr, o.data_ptr<scalar_t>(), Tn, B,
                                   in.size(2), H);
      });
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
  }
  if (h_out.is_cuda()) {
#ifdef LAB_WITH_CUDA
    c10::cuda::CUDAGuard guard(h_out.device());
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, T, "gru_gates_cpu", [&] {
    using Acc = at::opmath_type<scalar_t>;
    const Acc* gip = gi.data_ptr<Acc>();
    const Acc* ghp = has_gh ? gh->data_ptr<Acc>() : nullptr;
    const scalar_t* bi = has_bih ? b_ih->data_ptr<scalar_t>() : nullptr;
    const scalar_t* bh = b_hh.data_ptr<scalar_t>();
    const scalar_t* hp = has_hp ? h_prev->data_ptr<scalar_t>() : nullptr;
    scalar_t* ho = h_out.data_ptr<scalar_t>();
    const int64_t ldgi = gi.stride(0), ldgh = has_gh ? gh->stride(0) : 0, ldhp = has_hp ? h_prev->stride(0) : 0,
                  ldho = h_out.stride(0);
    at::parallel_for(0, B * H, 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / H, j = i % H;
        const Acc* x = gip + b * ldgi;
        Acc ir = x[j], iz = x[H + j], in = x[2 * H + j];
        if (bi) ir += Acc(bi[j]), iz += Acc(bi[H + j]), in += Acc(bi[2 * H + j]);
        Acc hr = Acc(bh[j]), hz = Acc(bh[H + j]), hn = Acc(bh[2 * H + j]);
        if (ghp) hr += ghp[b * ldgh + j], hz += ghp[b * ldgh + H + j], hn += ghp[b * ldgh + 2 * H + j];
        const Acc r = sigmoid(ir + hr), z = sigmoid(iz + hz), n = std::tanh(in + r * hn);
        const Acc h = hp ? Acc(hp[b * ldhp + j]) : Acc(0);
        ho[b * ldho + j] = static_cast<scalar_t>(n + z * (h - n));  // read before write: in place is fine
      }
    });
  });
  return h_out;
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
    std::vector<int64_t> tok(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      if (has_logits) {  // torch.argmax order: NaN is largest, the first maximum wins
        const scalar_t* row = logits->data_ptr<scalar_t>() + b * ldl;
        int64_t bi = 0;
        for (int64_t i = 1; i < nl; ++i) {
          const scalar_t v = row[i], bv = row[bi];
          if (std::isnan(bv)) break;
          if (std::isnan(v) || v > bv) bi = i;
        }
        tok[size_t(b)] = bi;
      } else {
        tok[size_t(b)] = tokens->data_ptr<int64_t>()[b];
        LAB_CHECK_VALUE(tok[size_t(b)] >= 0 && tok[size_t(b)] < V, "tokens[", b, "] = ", tok[size_t(b)],
                          " is outside the vocabulary [0, ", V, ")");
      }
      LAB_CHECK_VALUE(tok[size_t(b)] < V, "argmax of logits[", b, "] = ", tok[size_t(b)], " is outside the "
                        "vocabulary of emb [0, ", V, ")");
      if (tok_out) tok_out[b] = tok[size_t(b)];
    }
    const scalar_t* e = emb.data_ptr<scalar_t>();
    const scalar_t* gt = gi_table.data_ptr<scalar_t>();
    const scalar_t* gc = gi_ctx.data_ptr<scalar_t>();
    scalar_t* xp = xh.data_ptr<scalar_t>();
    scalar_t* gp = gi.data_ptr<scalar_t>();
    const int64_t ldx = xh.stride(0);
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t t = tok[size_t(b)];
        for (int64_t k = 0; k < E; ++k) xp[b * ldx + k] = e[t * E + k];
        for (int64_t k = 0; k < G; ++k) gp[b * G + k] = gt[t * G + k] + gc[b * G + k];
      }
    });
  });
}

// ---- the v3 plan, for the notebook ------------------------------------------------------------------------------
// [status, kpt, s, hb, ph, pb, bb, bc, smem, blocks, max_coresident]; dtype_code: 0 float32, 1 float16, 2 bfloat16
std::vector<int64_t> v3_plan(int64_t batch, int64_t hidden, int64_t dtype_code_, int64_t version) {
  LAB_CHECK_VALUE(dtype_code_ >= 0 && dtype_code_ <= 2, "dtype_code must be 0 (float32), 1 (float16) or 2 "
                    "(bfloat16), got ", dtype_code_);
  LAB_CHECK_VALUE(version == 3 || version == 4, "version must be 3 or 4, got ", version);
  LAB_CHECK_VALUE(batch >= 1 && hidden >= 1, "batch and hidden must be >= 1, got ", batch, ", ", hidden);
#ifdef LAB_WITH_CUDA
  int info[10];
  const int status = gru_v3_plan(int(version), int(dtype_code_), lab::check_int32(batch, "batch"),
                                 lab::check_int32(hidden, "hidden"), info);
  std::vector<int64_t> out{status};
  for (int i = 0; i < 10; ++i) out.push_back(info[i]);
  return out;
#else
  LAB_NO_CUDA_BUILD("v3_plan");
  return {};
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "GRU family: nn.GRU forward (version 0 = C++ CPU, 1..3 = CUDA), the decoder step's pieces";
  m.def("gru_forward", lab::bind(gru_forward),
        "gru_forward(x, h0|None, params, out, h_n, version) -> (out, h_n)");
  m.def("gru_gates", lab::bind(gru_gates_op),
        "gru_gates(gi, gh|None, b_ih|None, b_hh, h_prev|None, h_out) -> h_out");
  m.def("decoder_prep", lab::bind(decoder_prep),
        "decoder_prep(logits|None, tokens|None, tokens_out|None, emb, gi_table, gi_ctx, xh, gi)");
  m.def("v3_plan", lab::bind(v3_plan),
        "v3_plan(batch, hidden, dtype_code, version) -> [status, kpt, s, hb, ph, pb, bb, bc, smem, blocks, "
        "max_coresident]");
}
