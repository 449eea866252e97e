// gru/cpu.cpp — the C++ CPU version of the GRU family (version 0) and the CPU loops of gru_gates and decoder_prep:
// plain pointers, no torch headers, its own unit, so editing it rebuilds this file alone. Loops run on torch's thread
// pool through lab::parallel_for. Storage and accumulate types are float or double here: the binding
// (cpp_src/gru/gru.cpp) widens float16/bfloat16 tensors to float with ATen before the call and rounds the float
// result back (the same round-to-nearest-even as static_cast<at::Half / at::BFloat16>).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "lab_unit.h"

namespace {

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
  lab::parallel_for(0, Tn * B, std::max<int64_t>(1, 16384 / (G * I)), [&](int64_t r0, int64_t r1) {
    for (int64_t n0 = 0; n0 < G; n0 += 64)
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t n = n0; n < std::min(G, n0 + 64); ++n)
          gi[size_t(r * G + n)] = dot(xa.data() + r * I, wih.data() + n * I, I) + bih[size_t(n)];
  });
  // 2. the recurrence
  std::vector<A> h(size_t(B * H)), hn(size_t(B * H));
  for (int64_t i = 0; i < B * H; ++i) h[size_t(i)] = h0 ? static_cast<A>(h0[i]) : A(0);
  for (int64_t t = 0; t < Tn; ++t) {
    lab::parallel_for(0, H, std::max<int64_t>(1, 16384 / (G * B)), [&](int64_t j0, int64_t j1) {
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

// ---- gru_gates: one cell's pointwise half, rows may be strided (h_prev and h_out may be the same memory) ---------
template <class T, class Acc>
void gates_cpu(const Acc* gip, int64_t ldgi, const Acc* ghp, int64_t ldgh, const T* bi, const T* bh, const T* hp,
               int64_t ldhp, T* ho, int64_t ldho, int64_t B, int64_t H) {
  lab::parallel_for(0, B * H, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, j = i % H;
      const Acc* x = gip + b * ldgi;
      Acc ir = x[j], iz = x[H + j], in = x[2 * H + j];
      if (bi) ir += Acc(bi[j]), iz += Acc(bi[H + j]), in += Acc(bi[2 * H + j]);
      Acc hr = Acc(bh[j]), hz = Acc(bh[H + j]), hn = Acc(bh[2 * H + j]);
      if (ghp) hr += ghp[b * ldgh + j], hz += ghp[b * ldgh + H + j], hn += ghp[b * ldgh + 2 * H + j];
      const Acc r = sigmoid(ir + hr), z = sigmoid(iz + hz), n = std::tanh(in + r * hn);
      const Acc h = hp ? Acc(hp[b * ldhp + j]) : Acc(0);
      ho[b * ldho + j] = static_cast<T>(n + z * (h - n));  // read before write: in place is fine
    }
  });
}

// torch.argmax's order, for a scan from the first index: v (at a later index) takes over from the best so far when
// it is larger or NaN, and nothing takes over from a NaN (NaN is the largest; the first maximum wins).
template <class T>
inline bool argmax_takes(T v, T best) {
  return !std::isnan(best) && (std::isnan(v) || v > best);
}

// ---- decoder_prep: the decoder step's token pick and gathers -----------------------------------------------------
// tok[b] = argmax(logits[b, :nl]) when logits is given, else tokens[b]. The binding checks every token against the
// vocabulary (with the row's name in the message) before it calls decoder_gather_cpu.
template <class T>
void decoder_tokens_cpu(const T* logits, int64_t ldl, int64_t nl, const int64_t* tokens, int64_t* tok, int64_t B) {
  for (int64_t b = 0; b < B; ++b) {
    if (logits) {  // torch.argmax order: NaN is largest, the first maximum wins
      const T* row = logits + b * ldl;
      int64_t bi = 0;
      for (int64_t i = 1; i < nl; ++i)
        if (argmax_takes(row[i], row[bi])) bi = i;
      tok[b] = bi;
    } else {
      tok[b] = tokens[b];
    }
  }
}

// xh[b, :E] = emb[tok[b]]; gi[b, :] = gi_table[tok[b]] + gi_ctx[b]
template <class T>
void decoder_gather_cpu(const int64_t* tok, const T* e, int64_t E, const T* gt, const T* gc, int64_t G, T* xp,
                        int64_t ldx, T* gp, int64_t B) {
  lab::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t = tok[b];
      for (int64_t k = 0; k < E; ++k) xp[b * ldx + k] = e[t * E + k];
      for (int64_t k = 0; k < G; ++k) gp[b * G + k] = gt[t * G + k] + gc[b * G + k];
    }
  });
}

// ---- greedy_decode: every step of the decoder's greedy loop (the CPU version of cuda_src/gru/greedy.cu) ----------
// Rows are independent: parallel over rows, each running its own loop: the cell (gi_table[tok] + gi_ctx, h W_hh^T),
// then logits = [emb[tok] | h] W_fc^T + fc_ctx, the argmax in torch's order, <eos> kept once emitted (eos >= 0).
// tok_in: step 0's inputs instead of sos (a token outside [0, V) poisons its row with NaN, as on the GPU); logits and
// h_out: the last step's (h_out may be ctx: each row is read before it is written).
template <class T>
void greedy_cpu(const T* ctx, int64_t ld_ctx, const T* gi_ctx, const T* fc_ctx, const T* emb, const T* gi_tab,
                const T* w_hh, const T* b_hh, const T* w_fc, int64_t* toks, const int64_t* tok_in, T* logits, T* h_out,
                int64_t ld_hout, int64_t B, int64_t H, int64_t E, int64_t V, int64_t Tn, int64_t sos, int64_t eos) {
  const int64_t K = E + H, G = 3 * H;
  lab::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> x(static_cast<size_t>(K)), hn(static_cast<size_t>(H));  // x = [emb[tok] | h]
    for (int64_t b = b0; b < b1; ++b) {
      std::copy(ctx + b * ld_ctx, ctx + b * ld_ctx + H, x.begin() + E);
      int64_t tok = tok_in ? tok_in[b] : sos;
      const bool poisoned = tok < 0 || tok >= V;
      if (poisoned) tok = 0;
      bool finished = false;
      for (int64_t t = 0; t < Tn; ++t) {
        const T* gt = gi_tab + tok * G;
        const T* gc = gi_ctx + b * G;
        const T* h = x.data() + E;
        if (poisoned)
          for (int64_t k = 0; k < K; ++k) x[size_t(k)] = std::numeric_limits<T>::quiet_NaN();
        for (int64_t j = 0; j < H; ++j) {
          const T r = sigmoid(gt[j] + gc[j] + dot(h, w_hh + j * H, H) + b_hh[j]);
          const T z = sigmoid(gt[H + j] + gc[H + j] + dot(h, w_hh + (H + j) * H, H) + b_hh[H + j]);
          const T hn_ = dot(h, w_hh + (2 * H + j) * H, H) + b_hh[2 * H + j];
          const T n = std::tanh(gt[2 * H + j] + gc[2 * H + j] + r * hn_);
          hn[size_t(j)] = n + z * (h[j] - n);
        }
        std::copy(hn.begin(), hn.end(), x.begin() + E);
        std::copy(emb + tok * E, emb + (tok + 1) * E, x.begin());
        if (poisoned) std::fill(x.begin(), x.begin() + E, std::numeric_limits<T>::quiet_NaN());
        int64_t best = 0;
        T bv = T(0);
        for (int64_t v = 0; v < V; ++v) {  // torch.argmax: NaN is largest, the first max wins
          const T val = dot(x.data(), w_fc + v * K, K) + fc_ctx[b * V + v];
          if (logits && t == Tn - 1) logits[b * V + v] = val;
          if (v == 0 || argmax_takes(val, bv)) bv = val, best = v;
        }
        if (finished) best = eos;
        else if (best == eos) finished = true;
        if (toks) toks[t * B + b] = best;  // (null: one teacher-forced step, no pick wanted)
        tok = best;
      }
      if (h_out) std::copy(x.begin() + E, x.end(), h_out + b * ld_hout);
    }
  });
}

}  // namespace

LAB_CPU_UNIT()
LAB_EXPORTS(LAB_EXPORT("gru_layer_cpu_f32", gru_layer_cpu<float, float>),
            LAB_EXPORT("gru_layer_cpu_f64", gru_layer_cpu<double, double>),
            LAB_EXPORT("gru_gates_cpu_f32", gates_cpu<float, float>),
            LAB_EXPORT("gru_gates_cpu_f64", gates_cpu<double, double>),
            LAB_EXPORT("decoder_tokens_cpu_f32", decoder_tokens_cpu<float>),
            LAB_EXPORT("decoder_tokens_cpu_f64", decoder_tokens_cpu<double>),
            LAB_EXPORT("decoder_gather_cpu_f32", decoder_gather_cpu<float>),
            LAB_EXPORT("decoder_gather_cpu_f64", decoder_gather_cpu<double>),
            LAB_EXPORT("greedy_decode_cpu_f32", greedy_cpu<float>),
            LAB_EXPORT("greedy_decode_cpu_f64", greedy_cpu<double>))
