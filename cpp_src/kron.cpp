// kron.cpp — torch-facing functions of the Kronecker layer y = x · (W_K ⊗ … ⊗ W_1), and its C++ CPU version.
//
// factors = [W_1, …, W_K], W_k (f_k, f_k); x (batch, N) with N = f_1·…·f_K. Outputs and the intermediate states are
// tensors the caller allocates (the lab poisons them with NaN before a check). version: 0 = the C++ CPU code (CPU
// tensors); 3 = one CUDA kernel per factor; 4 = the fused CUDA kernel (cuda_src/kron.cu). The CPU code computes the
// same steps as the CUDA code (see the header of cuda_src/kron.cu for the algebra):
//   forward   F-step  y[b] (P, f) = x[b]ᵀ (f, P)ᵀ · W          — for W_K, …, W_1 in turn
//   backward  dW_k = Σ_b F_k[b] · dF_{k-1}[b];  dF_k[b] = W_k · dF_{k-1}[b]ᵀ;  dx = dF_K
#include "lab_common.h"

#include <torch/csrc/autograd/python_variable.h>  // THPVariable_Check / THPVariable_Unpack

#include <algorithm>
#include <cstdio>

#ifdef LAB_WITH_CUDA
#define LAB_DECLARE(T)                                                                                           \
  cudaError_t kron_forward(int, const T*, T*, const T* const*, const int*, int, int64_t, int64_t, T* const*, T*, \
                           int, int, cudaStream_t);                                                              \
  cudaError_t kron_backward(const T*, const T*, const T* const*, const int*, int, int64_t, int64_t,             \
                            const T* const*, T*, T* const*, T*, cudaStream_t);                                   \
  int64_t kron_backward_workspace(const T*, int64_t, int64_t, const int*, int);                                  \
  int64_t kron_forward_scratch(const T*, int64_t, int64_t, int);                                                 \
  void kron_fused_plan(const T*, int64_t, int64_t, const int*, int, int, int, int64_t*);
LAB_DECLARE(float)
LAB_DECLARE(double)
#undef LAB_DECLARE
#endif

namespace {

namespace py = pybind11;

constexpr int kMaxFactors = 16;  // as in cuda_src/kron.cu

// Lists of tensors arrive as Python sequences and are unpacked here, element by element, so a wrong element is
// reported by position. Names are built with snprintf, not std::string: on the H100 box (torch 2.11, gcc 13.3) a
// function that built a std::string with std::to_string and operator+ segfaulted on its first call, while the same
// module's other functions (std::vector arguments included) ran; the first version of this file did that in every
// call.
std::vector<at::Tensor> tensors(const py::sequence& seq, const char* what) {
  std::vector<at::Tensor> out;
  const size_t n = py::len(seq);
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    py::object item = seq[i];
    LAB_CHECK_TYPE(THPVariable_Check(item.ptr()), what, "[", i, "] must be a tensor, got ",
                     Py_TYPE(item.ptr())->tp_name);
    out.push_back(THPVariable_Unpack(item.ptr()));
  }
  return out;
}
constexpr int64_t kRows = 64;    // CPU: rows of a sample per task (64·f values of y stay in cache across the k loop)

struct Sizes {
  std::vector<int> f;
  int64_t B = 0, N = 0;
};

// x (batch, N) float/double contiguous; factors a non-empty list of square matrices of x's dtype and device whose
// sizes multiply to N.
Sizes check_layer(const at::Tensor& x, const std::vector<at::Tensor>& factors) {
  lab::check_dtype(x, "x", {at::kFloat, at::kDouble});
  lab::check_dim(x, "x", 2, "(batch, N)");
  lab::check_contiguous(x, "x");
  LAB_CHECK_VALUE(!factors.empty(), "factors must be a non-empty list of square matrices, got an empty list");
  LAB_CHECK_VALUE(factors.size() <= size_t(kMaxFactors), "at most ", kMaxFactors, " factors are supported, got ",
                    factors.size());
  Sizes s;
  s.B = x.size(0);
  s.N = x.size(1);
  int64_t prod = 1;
  for (size_t i = 0; i < factors.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "factors[%zu]", i);
    const at::Tensor& w = factors[i];
    lab::check_defined(w, name);
    lab::check_same_dtype(w, name, x, "x");
    lab::check_same_device(w, name, x, "x");
    lab::check_dim(w, name, 2, "(f, f)");
    LAB_CHECK_VALUE(w.size(0) == w.size(1), name, " must be square (f, f), got ", lab::shape_str(w.sizes()));
    LAB_CHECK_VALUE(w.size(0) >= 1, name, " must not be empty, got ", lab::shape_str(w.sizes()));
    lab::check_contiguous(w, name);
    LAB_CHECK_VALUE(w.size(0) <= INT32_MAX, name, " is too large for the kernels' 32-bit sizes");
    s.f.push_back(static_cast<int>(w.size(0)));
    prod = prod > (int64_t(1) << 40) ? prod : prod * w.size(0);
  }
  if (prod != s.N) {
    char dims[16 * 14];
    int n = 0;
    dims[0] = '\0';
    for (size_t i = 0; i < s.f.size() && n < int(sizeof(dims)) - 16; ++i)
      n += std::snprintf(dims + n, sizeof(dims) - size_t(n), "%s%d", i ? " x " : "", s.f[i]);
    LAB_CHECK_VALUE(false, "the factor sizes ", dims, " multiply to ", prod, ", but x has N = ", s.N,
                      " columns; x must be (batch, f_1*...*f_K)");
  }
  return s;
}

void check_like(const at::Tensor& t, const char* name, const at::Tensor& x, at::IntArrayRef shape,
                const char* layout) {
  lab::check_out(t, name, x, shape, layout);
}

void check_states(const std::vector<at::Tensor>& states, const at::Tensor& x, const Sizes& s, bool required) {
  const size_t K = s.f.size();
  if (states.empty() && !required) return;
  LAB_CHECK_VALUE(states.size() == K - 1, "states must be a list of K-1 = ", K - 1,
                    " tensors of shape (batch, N) (the intermediate states), got ", states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "states[%zu]", i);
    check_like(states[i], name, x, {s.B, s.N}, "(batch, N)");
  }
}

// ---- CPU version ------------------------------------------------------------------------------------------------
// F-step: y[b][p][j] = Σ_i x[b][i][p]·W[i][j]. Per task: kRows rows of one sample; the i-loop streams x's row i and
// W's row i while the task's block of y stays in cache; the inner j-loop is a contiguous axpy (vectorised).
template <class T>
void fstep_cpu(const T* x, const T* w, T* y, int64_t B, int64_t N, int64_t f) {
  const int64_t P = N / f, nblk = lab::ceil_div(P, kRows);
  at::parallel_for(0, B * nblk, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t / nblk, p0 = (t % nblk) * kRows, p1 = std::min(P, p0 + kRows);
      const T* xb = x + b * N;
      T* yb = y + b * N;
      std::fill(yb + p0 * f, yb + p1 * f, T(0));
      for (int64_t i = 0; i < f; ++i) {
        const T* wi = w + i * f;
        const T* xi = xb + i * P;
        for (int64_t p = p0; p < p1; ++p) {
          const T a = xi[p];
          T* yp = yb + p * f;
          for (int64_t j = 0; j < f; ++j) yp[j] += a * wi[j];
        }
      }
    }
  });
}

// R-step: out[b][i][m] = Σ_j W[i][j]·d[b][m][j] (a dot product of two contiguous rows per output).
template <class T>
void rstep_cpu(const T* d, const T* w, T* out, int64_t B, int64_t N, int64_t f) {
  const int64_t M = N / f, nblk = lab::ceil_div(M, kRows);
  at::parallel_for(0, B * nblk, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t / nblk, m0 = (t % nblk) * kRows, m1 = std::min(M, m0 + kRows);
      for (int64_t i = 0; i < f; ++i) {
        const T* wi = w + i * f;
        T* o = out + b * N + i * M;
        for (int64_t m = m0; m < m1; ++m) {
          const T* dm = d + b * N + m * f;
          T s = 0;
          for (int64_t j = 0; j < f; ++j) s += wi[j] * dm[j];
          o[m] = s;
        }
      }
    }
  });
}

// dW[i][j] = Σ_b Σ_m F[b][i][m]·D[b][m][j]; one task per row i of dW, summed in a fixed order (deterministic).
template <class T>
void dw_cpu(const T* F, const T* D, T* dw, int64_t B, int64_t N, int64_t f) {
  const int64_t M = N / f;
  at::parallel_for(0, f, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      T* o = dw + i * f;
      std::fill(o, o + f, T(0));
      for (int64_t b = 0; b < B; ++b) {
        const T* Fi = F + b * N + i * M;
        const T* Db = D + b * N;
        for (int64_t m = 0; m < M; ++m) {
          const T a = Fi[m];
          const T* dm = Db + m * f;
          for (int64_t j = 0; j < f; ++j) o[j] += a * dm[j];
        }
      }
    }
  });
}

template <class T>
void forward_cpu(const T* x, T* y, const std::vector<const T*>& w, const std::vector<int>& f, int64_t B, int64_t N,
                 const std::vector<T*>& states) {
  const int K = int(f.size());
  std::vector<T> scratch(states.empty() && K > 1 ? size_t(std::min(K - 1, 2)) * B * N : 0);
  const T* src = x;
  for (int st = 1; st <= K; ++st) {
    const int idx = K - st;  // step st applies W_{K-st+1}
    T* dst = st == K ? y : (!states.empty() ? states[K - st - 1] : scratch.data() + ((st - 1) & 1) * B * N);
    fstep_cpu(src, w[idx], dst, B, N, f[idx]);
    src = dst;
  }
}

template <class T>
void backward_cpu(const T* g, const T* x, const std::vector<const T*>& w, const std::vector<int>& f, int64_t B,
                  int64_t N, const std::vector<const T*>& states, T* dx, const std::vector<T*>& dws) {
  const int K = int(f.size());
  std::vector<T> buf(size_t(std::min(K - 1, 2)) * B * N);
  T* dF[2] = {buf.data(), buf.data() + (K >= 3 ? B * N : 0)};
  for (int k = 1; k <= K; ++k) {
    const T* D = k == 1 ? g : dF[(k - 2) & 1];
    const T* Fk = k == K ? x : states[k - 1];
    dw_cpu(Fk, D, dws[k - 1], B, N, f[k - 1]);
    rstep_cpu(D, w[k - 1], k == K ? dx : dF[(k - 1) & 1], B, N, f[k - 1]);
  }
}

template <class T> std::vector<const T*> cptrs(const std::vector<at::Tensor>& ts) {
  std::vector<const T*> v;
  for (const auto& t : ts) v.push_back(t.data_ptr<T>());
  return v;
}
template <class T> std::vector<T*> ptrs(const std::vector<at::Tensor>& ts) {
  std::vector<T*> v;
  for (const auto& t : ts) v.push_back(t.data_ptr<T>());
  return v;
}

}  // namespace

// ---- torch-facing functions ---------------------------------------------------------------------------------
// y = x · (W_K ⊗ … ⊗ W_1) into out. states: [] or the K-1 intermediate states F_1..F_{K-1} (each (batch, N)), written
// when given (the backward needs them). cfg/cols: -1/0 = automatic; else force the CUDA block configuration (0..2)
// and v4's slice width (for kron.tune()).
at::Tensor forward(const at::Tensor& x, py::sequence factors_, at::Tensor out, py::sequence states_,
                   int64_t version, int64_t cfg, int64_t cols) {
  const std::vector<at::Tensor> factors = tensors(factors_, "factors"), states = tensors(states_, "states");
  const Sizes s = check_layer(x, factors);
  check_like(out, "out", x, {s.B, s.N}, "(batch, N)");
  check_states(states, x, s, false);
  lab::check_version(x, "x", version, 3, 4, "kron");
  LAB_CHECK_VALUE(cfg >= -1 && cfg <= 2, "kron: cfg must be -1 (automatic) or 0..2, got ", cfg);
  LAB_CHECK_VALUE(cols >= 0 && cols <= 1 << 20, "kron: cols must be 0 (automatic) or a slice width, got ", cols);
  const int K = int(s.f.size());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kron_forward", [&] {
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      at::Tensor scratch;
      if (states.empty() && K > 1) {
        bool fused_fits = false;
        if (version == 4) {
          int64_t info[11];
          kron_fused_plan(x.data_ptr<scalar_t>(), s.B, s.N, s.f.data(), K, int(cfg), int(cols), info);
          fused_fits = info[0] != 0;
        }
        if (!fused_fits)
          scratch = at::empty({kron_forward_scratch(x.data_ptr<scalar_t>(), s.B, s.N, K)}, x.options());
      }
      const auto w = cptrs<scalar_t>(factors);
      auto st = ptrs<scalar_t>(states);
      LAB_CUDA_CHECK(kron_forward(int(version), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), w.data(),
                                  s.f.data(), K, s.B, s.N, st.empty() ? nullptr : st.data(),
                                  scratch.defined() ? scratch.data_ptr<scalar_t>() : nullptr, int(cfg), int(cols),
                                  LAB_STREAM()),
                     "kron forward kernel");
#else
      LAB_NO_CUDA_BUILD("kron forward");
#endif
    } else {
      forward_cpu(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), cptrs<scalar_t>(factors), s.f, s.B, s.N,
                  ptrs<scalar_t>(states));
    }
  });
  return out;
}

// Gradients of y = x · (W_K ⊗ … ⊗ W_1) for upstream gradient g: dx and dws[k] = dL/dW_{k+1}, written into the given
// tensors. states: the K-1 intermediate states the forward wrote.
at::Tensor backward(const at::Tensor& g, const at::Tensor& x, py::sequence factors_, py::sequence states_,
                    at::Tensor dx, py::sequence dws_, int64_t version) {
  const std::vector<at::Tensor> factors = tensors(factors_, "factors"), states = tensors(states_, "states"),
                                dws = tensors(dws_, "dws");
  const Sizes s = check_layer(x, factors);
  check_like(g, "g", x, {s.B, s.N}, "(batch, N)");
  check_states(states, x, s, true);
  check_like(dx, "dx", x, {s.B, s.N}, "(batch, N)");
  const int K = int(s.f.size());
  LAB_CHECK_VALUE(dws.size() == size_t(K), "dws must be a list of K = ", K, " tensors (one per factor), got ",
                    dws.size());
  for (int k = 0; k < K; ++k) {
    char name[32];
    std::snprintf(name, sizeof(name), "dws[%d]", k);
    check_like(dws[k], name, x, {s.f[k], s.f[k]}, "like factors[k]");
  }
  lab::check_version(x, "x", version, 3, 4, "kron");
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kron_backward", [&] {
    if (x.is_cuda()) {
#ifdef LAB_WITH_CUDA
      c10::cuda::CUDAGuard guard(x.device());
      const int64_t n = kron_backward_workspace(x.data_ptr<scalar_t>(), s.B, s.N, s.f.data(), K);
      at::Tensor ws = at::empty({std::max<int64_t>(n, 1)}, x.options());
      const auto w = cptrs<scalar_t>(factors);
      const auto st = cptrs<scalar_t>(states);
      auto dw = ptrs<scalar_t>(dws);
      LAB_CUDA_CHECK(kron_backward(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), w.data(), s.f.data(), K, s.B,
                                   s.N, st.empty() ? nullptr : st.data(), dx.data_ptr<scalar_t>(), dw.data(),
                                   ws.data_ptr<scalar_t>(), LAB_STREAM()),
                     "kron backward kernels");
#else
      LAB_NO_CUDA_BUILD("kron backward");
#endif
    } else {
      backward_cpu(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), cptrs<scalar_t>(factors), s.f, s.B, s.N,
                   cptrs<scalar_t>(states), dx.data_ptr<scalar_t>(), ptrs<scalar_t>(dws));
    }
  });
  return dx;
}

// What v4 would launch for a batch and factor sizes (x: any CUDA tensor of the dtype, for dtype and device):
// (fits, cfg, c, slices per sample, shared bytes per block, blocks per SM, threads, TM, TN, cost, device smem limit)
py::tuple fused_plan(const at::Tensor& x, int64_t batch, py::sequence sizes, int64_t cfg, int64_t cols) {
  lab::check_dtype(x, "x", {at::kFloat, at::kDouble});
  LAB_CHECK_VALUE(x.is_cuda(), "fused_plan: x must be a CUDA tensor (it names the device and dtype), got ",
                    x.device().str());
  const size_t nf = py::len(sizes);
  LAB_CHECK_VALUE(nf >= 1 && nf <= size_t(kMaxFactors), "sizes must list 1..", kMaxFactors, " factor sizes, got ",
                    nf);
  LAB_CHECK_VALUE(cfg >= -1 && cfg <= 2, "fused_plan: cfg must be -1 (automatic) or 0..2, got ", cfg);
  std::vector<int> f;
  int64_t N = 1;
  for (size_t i = 0; i < nf; ++i) {
    const int64_t v = py::cast<int64_t>(sizes[i]);
    LAB_CHECK_VALUE(v >= 1 && v <= INT32_MAX, "sizes must be positive 32-bit integers, got ", v);
    f.push_back(static_cast<int>(v));
    N *= v;
  }
  std::vector<int64_t> info(11, 0);
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(x.device());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kron_fused_plan", [&] {
    kron_fused_plan(x.data_ptr<scalar_t>(), batch, N, f.data(), int(f.size()), int(cfg), int(cols), info.data());
  });
#else
  LAB_NO_CUDA_BUILD("fused_plan");
#endif
  py::tuple t(info.size());
  for (size_t i = 0; i < info.size(); ++i) t[i] = py::int_(info[i]);
  return t;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Kronecker-factored linear layer y = x (W_K kron ... kron W_1); version 0 = C++ CPU code, 3 = per-factor "
            "CUDA kernels, 4 = fused CUDA kernel";
  m.def("forward", lab::bind(forward),
        "forward(x, factors, out, states, version, cfg, cols) -> out = x (W_K kron ... kron W_1)");
  m.def("backward", lab::bind(backward),
        "backward(g, x, factors, states, dx, dws, version) -> dx; dws[k] = dL/dfactors[k]");
  m.def("fused_plan", lab::bind(fused_plan),
        "fused_plan(x, batch, sizes, cfg, cols) -> (fits, cfg, c, slices, smem, blocks/SM, threads, TM, TN, cost, "
        "smem limit)");
}
