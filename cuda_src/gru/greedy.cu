// gru/greedy.cu — greedy decoding of the seq2seq model in one launch: the decoder's last rung (the stepwise decoder
// is decoder.cu + gates.cu + two cuBLAS calls a step, driven from lab/models/seq2seq.py).
//
// One cooperative launch runs every step of a greedy decode without returning to the host:
//   step t:  tok_t    = <sos> (t = 0) or argmax(logits_{t-1}); a row that has emitted <eos> emits it from then on
//            h_t      = GRU cell(gi_table[tok_t] + gi_ctx, h_{t-1})          phase A: block g owns U hidden units
//            logits_t = [emb[tok_t] | h_t] W_fc^T + fc_ctx                   phase B: block g owns R vocabulary rows
//            argmax   = each block's best (value, index) per row, merged across the blocks by one 64-bit atomicMax
//                       on a key that orders like torch.argmax (NaN largest, the first of equal values wins)
//   and it stops when every row has emitted <eos> (eos >= 0), the rest of the output filled with <eos>.
// gi_ctx (ctx W_ih_ctx^T + b_ih), fc_ctx (ctx W_fc_ctx^T + b_fc) and gi_table (emb W_ih_emb^T) are the context's and
// the embedding's shares, made before the launch (lab/models/seq2seq.py): per step only [emb | h] meets fc_out.
//
// The weights stay on chip for the whole decode. Block g keeps its U = ceil(H/G) units' rows of W_hh (r, z, n: three
// consecutive rows per unit) and its R = ceil(V/G) rows of fc_out's [emb | h] columns in shared memory. Default model
// (H 512, E 256, V 5893) on the H100's G = 132 SMs: U = 4 (12 rows x 516 floats, 24.8 KB), R = 45 (45 rows x 772
// floats, 139 KB): the decoder's 21 MB of weights are read from HBM once per decode, not once a step.
// Each phase is a small tile GEMM out[b][r] = sum_k A[b][k] W[r][k] over the block's rows (tile_gemm below): A (h_{t-1}
// or [emb[tok_t] | h_t], read from L2: other SMs wrote it) is staged in K chunks through registers into shared memory,
// a thread accumulates TB batch rows x 3 weight rows (one unit's three gates, or three vocabulary rows), and where
// the batch is small S lanes split K and meet with shuffles. Two grid barriers a step: after phase A (every h_t
// written) and after phase B (every row's argmax merged).
//
// Napkin math (default model, fp32 FMA, 132 SMs at 128 FMA/clk and 1.98 GHz):
//   batch 128: phase B is 128 x 45 x 768 = 4.4 M FMA a block = 34.6 k clk = 17.5 us a step at the FMA peak; phase A
//              128 x 12 x 512 = 0.79 M FMA = 3.1 us; each block reads h (256 KB) and [emb | h] (393 KB) from L2.
//   batch 1:   no arithmetic to speak of: two grid barriers (~1.2 us each on this H100), the L2 round trips of h and
//              of the keys, the argmax merge.
// Designs measured on the H100 (greedy_decode rows in results/, notebook 04 section 7; the numbers are printed there):
//   52d0861  A staged through registers (a division per element), the argmax one thread per row: ahead of the
//            step-by-step decoder at batch 1 and 8, behind it from 32 up, short of 3x the reference at batch 1.
//   13af2d9  gate inputs and fc_ctx loaded before the product, argmax one warp per row: batch 1 slightly faster,
//            batch 128 slower (the argmax loop was not the bulk of a step).
//   3c20150  A by cp.async.cg, FMAs in independent rounds (this file): the largest gain of the rungs at every batch
//            measured; past 3x the reference at batch 1.
//   c533b23/65a9b41  the weights by bulk copies on mbarriers, the prologue's zero fill by rows: a shorter start of
//            the launch (the one-step launch of LabSeq2Seq.step_fused depends on it most).
//   greedy_kernel<false>  the one-step launch without the pick (no argmax, no second barrier, h_out written after
//            the first): 22.1 -> 19.8 us at batch 1, 33.7 -> 31.1 at batch 8 (graph, L2 flushed; the decode unchanged).
//   wide tiles (batch >= 32 at first, now kWideBatch; make_tile, tile_gemm, phase_a, phase_b). Same-run A/B on the
//            H100, whole decodes of 30 tokens, default model, graph, L2 flushed, us (two rounds agreed within 1%):
//                                                              batch  1     8     32    64    128
//              before (narrow tiles at every batch)                   318   684   1686  2197  3234
//              w1: 8 x 6 tiles (S = 2 at 128), row groups first,      323   688   1154  1968  3042
//                  rotated chunk order
//              + ring of 3, fc_ctx in the accumulators, two threads   320   684   1182  1858  3027  <- this file
//                a row pick, gates over the S lanes
//              the same with a ring of 2                              320   684   1195  1810  3069
//            8 x 12 tiles (S = 4) lost to 8 x 6 at 32 and 128 (1351 / 3542 against 1259 / 3155 us, an earlier ring with
//            64- and 36-column chunks); the rotated order alone bought ~1% at 128. Tokens equal to the reference in
//            every run. The one-step launch (LabSeq2Seq.step_fused): 62.7 -> 47.2 us at batch 32, 73.9 -> 68.2 at 64,
//            but 101.6 -> 104.4 at 128 (slower). clock64 stamps of a dev build at batch 128 (w1's tiles, before the
//            ring) had a block's thread 0 ~53% of the decode in the products' FMA loops (at ~46% of the FMA peak
//            there), ~23% waiting at chunk barriers, ~6% in the one-warp-a-row pick and ~4% in phase A outside the
//            product (gathers, gates). The ring, the accumulators' fc_ctx, the pair pick and the spread gates together
//            bought 0.5% at 128 (3042 -> 3027), less than the pick and gates' share: what the ring or the fc_ctx
//            loads cost was not separated, and the chunk waits are not the bytes in flight alone (a ring of 2 within
//            1-3%; not profiled further).
//   the wide tiles from batch 9 (kWideBatch, was 32). The narrow tiles fall off a cliff between batch 8 and 12
//            (676 -> 1401 us; 2404 at 24), the wide ones do not. Same-run A/B, as above, two rounds (us):
//                                                    batch  1    4    8    12    16    24    32    48    64
//              wide from 32                                 319  474  676  1401  1431  2404  1175  1696  1849
//              wide from 16                                 319  475  677  1401   916  1131  1175  1693  1850
//              wide from 8                                  319  474  794   855   917  1132  1175  1693  1859
//              step-by-step decoder (LabSeq2Seq.step)       806  919 1080  1424  1454  1508  1540  1737  1788
//            (batch 9..11 not timed: 9 is the first batch past the narrow tile's 8 rows, where its time jumps)
//            The one-step launch (use_wide decides for both kernels), wide from 9 against from 32, two rounds:
//            batch 9 36.4-36.7 against 56.2 us, 12 37.8-38.0 / 55.5-55.6, 16 40.2-40.4 / 55.6,
//            24 46.4-46.7 / 86.4-86.6; 8, 32 and 64 unchanged (one code path).
//   Tried, not kept: unpadded slices, W_hh gate-major, so four bulk copies move a block's weights instead of 57 from
//            one warp (%globaltimer stamps showed that warp ~3 us late into phase A). The one-step launch gained
//            0.3 us, the 30-step decode lost 8% (243 -> 263 us at batch 1): the padding's bank spread pays every step.
//   Tried on the one-step launch, not kept (same-run A/B, graph, L2 flushed): phase B waiting for fc_out's rows after
//            staging [emb | h] (0.5 us slower at batch 1); the step's small reads (tokens, h, gate inputs, fc_ctx,
//            emb[tok]) prefetched to L2 before fc_out's copies are issued, so they would not queue behind its 18 MB
//            (1.3 us slower at batch 1, 8 us at batch 8, 16 us at batch 16: the copies start later).
// The one-step launch's floor: 132 blocks pulling 160 KB each (21 MB) into shared memory take 14.1 us from an idle
// GPU, launch included (an empty launch: 3.0 us), after the lab's write flush, whose dirty L2 lines are written back
// as the weights evict them; 10.8 us after a read flush (bulk copies, cp.async and plain loads alike, within 1.5 us;
// a dev microbenchmark on the H100). So the weights alone take ~11 us of the step at batch 1. Inside the step
// (%globaltimer stamps, L2 flushed, batch 1) fc_out's rows had landed ~15 us after the blocks started, the cell and
// the grid barrier long done (~14.5 us), and phase B ended ~19 us in: the rows land later than in the fill alone,
// and phase B's L2 round trips (A's staging, fc_ctx, the logits) follow them.
// What bounds it (ncu, notebook 04): at batch 1 the blocks wait (barrier stalls lead): two grid barriers a step and
// a chain of dependent L2 round trips; at batch 128 fc_out's tile, 8 warps an SM at ~250 registers, stalls on
// fixed-latency FMA dependences and shared-memory operand loads with the FP32 pipe far from busy.
// Limits (the plan's status, the binding's message): batch <= kMaxBatch (tokens and flags in shared memory), both
// weight slices and the staging buffers within the block's shared memory, all G blocks co-resident.
// lab:variants wide=0,1
// (built once per tile width: kUnitWide below)
#include "cooperative.cuh"
#include "lab_sm90.cuh"  // cp.async (lab_gemm.cuh), mbarrier and the bulk copy of the weights

// cooperative_groups.h without the libcu++ headers (v3.cu says why): only this_grid().sync() is used.
#define _CG_LIMIT_INCLUDED_DEPENDENCIES
#include <cooperative_groups.h>

namespace gru {
namespace cg = cooperative_groups;

// This build's variant: the narrow (wide=0) or the wide (wide=1) instantiations, greedy_kernel<kPick, kUnitWide> for
// the decode and the one step. Built once per width so an edit compiles two kernels per unit, the units in parallel:
// a one-line edit of this file rebuilt in 11.9-12.2 s as one unit, 8.3-9.6 s as two (the 2-core CI machine; the
// narrow unit is the longer, its two kernels have ~1.5x the wide ones' instructions). The plan is the same code in
// both: the unit whose width a batch takes answers it, the other says kOtherUnit (the binding asks both:
// cpp_src/gru/gru.cpp).
#if defined(LAB_VARIANT_wide_0)
constexpr bool kUnitWide = false;
#elif defined(LAB_VARIANT_wide_1)
constexpr bool kUnitWide = true;
#else
#error "gru/greedy.cu is built per variant (// lab:variants above): -DLAB_VARIANT_wide_0 or _1"
#endif

constexpr int kStage = 4608;     // floats per staging buffer (two of them): 128 batch rows x (32 + 4) columns
constexpr int kMaxBatch = 1024;  // tokens and <eos> flags of every row in shared memory (8 KB)
constexpr int kMaxTB = 8;        // batch rows per thread, at most

struct GreedyArgs {
  // Hp, Ep: H and E rounded up to 4, the row strides of h and emb (16-byte rows for cp.async; the binding pads with
  // zero columns where they differ)
  const float* ctx;     // (B, Hp) rows ld_ctx apart: the context, h_{-1}
  const float* gi_ctx;  // (B, 3H) ctx W_ih_ctx^T + b_ih
  const float* fc_ctx;  // (B, V) ctx W_fc_ctx^T + b_fc
  const float* emb;     // (V, Ep) the decoder's embedding
  const float* gi_tab;  // (V, 3H) emb W_ih_emb^T
  const float* w_hh;    // (3H, Hp)
  const float* b_hh;    // (3H)
  const float* w_fc;    // (V, Ep + Hp) fc_out's [emb | h] columns
  float* hbuf;          // (2, B, Hp) workspace: h_t in hbuf[t & 1] (its pad columns zero)
  unsigned long long* keys;  // (2, B) workspace: the argmax of step t merges into keys[t & 1]
  int64_t* toks;        // (T, B) the output tokens, or nullptr: one step (T = 1) without the pick
  const int64_t* tok_in;  // (B) step 0's input tokens, or nullptr: <sos> (a token outside [0, V) poisons its row)
  float* logits;        // (B, V) the last step's logits, or nullptr
  float* h_out;         // (B, H) rows ld_hout apart: the last step's h (written after every read of ctx), or nullptr
  int64_t ld_ctx, ld_hout;
  int B, H, E, V, T, sos, eos;
  int Hp, Ep;
  int U, R;             // hidden units and vocabulary rows a block
  int sw;               // the wide launch's staging buffer, floats (the plan's; unused by the narrow one)
};

// The shape of one phase's tile GEMM over the block's `rows` weight rows and BT batch rows at a time.
struct Tile {
  int bt;  // batch rows a tile
  int tb;  // batch rows a thread (1, 2, 4, 8)
  int nr;  // weight rows a thread (3: one unit's r, z, n in phase A; 3 or kWideNR in phase B): TB x NR accumulators
  int nb;  // thread groups along the batch, ceil(bt / tb)
  int nv;  // thread groups along the rows, ceil(rows / nr)
  int s;   // lanes that split K (a power of two <= 32; 1 once the pairs fill the block)
  int kc;  // columns a staged chunk (a multiple of 4; bt x (kc + 4) <= sw)
  int sw;  // floats a staging buffer: kStage (narrow: two buffers), the plan's (wide: a ring of kWideStages)
  bool vfast;  // thread groups numbered row group first (the wide tiles) rather than batch group first
};

__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }

// From batch kWideBatch up both phases take the wide tiles (greedy_kernel<kPick, true>; the header's record says
// what each part bought): 8 batch rows a thread, up to kWideNR vocabulary rows a thread in phase B (3 in phase A: one
// unit's gates), K split over the S lanes left, thread groups numbered row group first (group_of), K's chunks walked
// from a different chunk in every block, the staging a ring of kWideStages buffers the plan sizes, fc_ctx in the
// accumulators, two threads a row for the pick. Per k quad a thread loads TB + NR float4s for 4 TB NR FMAs: 8 x 6
// (S = 2 at batch 128) runs 14 shared loads per 192 FMAs, the narrow 8 x 3 (S = 1) 11 per 96.
constexpr int kWideBatch = 9, kWideNR = 6;  // (the header: narrow ahead at 8, wide from 12 on)
constexpr bool kRotateChunks = true;  // the rotated chunk order (tile_gemm; an A/B switch, ~1% at batch 128)
constexpr int kWideStages = 3;  // the wide tiles' staging ring (tile_gemm)
constexpr int kWideKC = 128;    // the most columns a wide chunk (the plan sizes it to the shared memory left)
constexpr int kStaticReserve = 2048;  // bytes of a block's shared memory left to the kernel's static variables

// Whether a tile of `rows` weight rows can be wide with NR rows a thread: rows >= NR (a thread's NR rows start at
// most rows - NR: first_row) and every (batch group, row group) pair a thread of its own.
__host__ __device__ inline bool wide_fits(int B, int rows, int nr) {
  return rows >= nr && (imin(B, 128) + kMaxTB - 1) / kMaxTB * ((rows + nr - 1) / nr) <= kThreads;
}
// Both phases wide, or neither: the wide launch (greedy_kernel<kPick, true>) instantiates only the wide tiles.
__host__ __device__ inline bool use_wide(int B, int rows_a, int rows_b) {
  return B >= kWideBatch && wide_fits(B, rows_a, 3) && wide_fits(B, rows_b, 3);
}

__host__ __device__ inline Tile make_tile(int B, int rows, int K, int nr_max, bool wide, int sw) {
  Tile t;
  t.sw = wide ? sw : kStage;
  t.nr = 3;
  t.vfast = wide;
  if (wide)
    for (int nr = nr_max; nr > 3; nr /= 2)
      if (wide_fits(B, rows, nr)) {
        t.nr = nr;
        break;
      }
  t.nv = (rows + t.nr - 1) / t.nr;
  if (t.vfast) {
    t.bt = imin(B, 128);
    t.tb = kMaxTB;
  } else {
    const int per = kThreads / t.nv;  // batch groups that fit beside the row groups (>= 1: the plan keeps nv <= 256)
    t.bt = imin(B, imin(128, kMaxTB * per));
    t.tb = 1;
    while ((t.bt + t.tb - 1) / t.tb > per) t.tb *= 2;
  }
  t.nb = (t.bt + t.tb - 1) / t.tb;
  t.s = 1;
  while (t.s < 32 && t.nb * t.nv * t.s * 2 <= kThreads) t.s *= 2;
  t.kc = imin((K + 3) & ~3, (t.sw / t.bt - 4) & ~3);
  return t;
}

// Thread group p's place in a tile: batch group bg (rows bg + nb i), row group vg (weight rows from NR vg), and
// whether it owns outputs (the groups past nb nv repeat a valid one's loads and store nothing). vfast numbers the
// row groups first: a warp then spans few batch groups and many row groups, so one LDS.128 of A is 1-2 distinct
// rows (one wavefront) and one of W 8-16 (two).
struct Group {
  int bg, vg;
  bool live;
};
template <bool kWide>
__device__ __forceinline__ Group group_of(const Tile& tl, int p) {
  Group g;
  g.live = p < tl.nb * tl.nv;
  if (kWide) {  // (tl.vfast)
    g.bg = imin(p / tl.nv, tl.nb - 1);
    g.vg = p % tl.nv;
  } else {
    g.bg = p % tl.nb;
    g.vg = imin(p / tl.nb, tl.nv - 1);
  }
  return g;
}
// The first weight row of group vg: NR vg, or, in a wide tile, rows - NR for the last group where NR does not divide
// rows (it then repeats rows of the group before it, which it does not store: owns_row). The narrow tiles have NR = 3
// and rows a multiple of 3.
template <int NR, bool kWide>
__device__ __forceinline__ int first_row(int vg, int rows) { return kWide ? imin(NR * vg, rows - NR) : NR * vg; }
template <int NR, bool kWide>
__device__ __forceinline__ bool owns_row(int vg, int r) { return !kWide || r >= NR * vg; }

using lab::cp_async_commit;
using lab::cp_async_wait;
using lab::smem_u32;

// The argmax key: the float's bits made to order as unsigned (NaN, canonicalised, above +inf; -0 as +0), then the
// index complemented, so that the larger key is torch.argmax's pick. No valid key is 0 (the reset value).
__device__ __forceinline__ unsigned long long argmax_key(float v, int idx) {
  unsigned u = __float_as_uint(v);
  if (v != v) u = 0x7fc00000u;
  if (u == 0x80000000u) u = 0u;
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xffffffffu - static_cast<unsigned>(idx));
}
__device__ __forceinline__ int key_index(unsigned long long key) {
  return int(0xffffffffu - static_cast<unsigned>(key & 0xffffffffu));
}

// One staged chunk's products: acc[i][j] += A[row_i][4q..4q+3] . W[j][4q..4q+3] for the thread's quads q = s, s + S, ...
// < nq. The tile's operands first, then four rounds of TB x NR independent FMAs (no chain within a round).
template <int TB, int NR>
__device__ __forceinline__ void chunk_fma(float (&acc)[TB][NR], const float* As, const int (&row)[TB], const float* w,
                                          int ldw, int nq, int s, int S) {
  for (int q = s; q < nq; q += S) {
    float4 wv[NR], av[TB];
#pragma unroll
    for (int j = 0; j < NR; ++j) wv[j] = *reinterpret_cast<const float4*>(w + j * ldw + 4 * q);
#pragma unroll
    for (int i = 0; i < TB; ++i) av[i] = *reinterpret_cast<const float4*>(As + row[i] + 4 * q);
#pragma unroll
    for (int i = 0; i < TB; ++i)
#pragma unroll
      for (int j = 0; j < NR; ++j) acc[i][j] = fmaf(av[i].x, wv[j].x, acc[i][j]);
#pragma unroll
    for (int i = 0; i < TB; ++i)
#pragma unroll
      for (int j = 0; j < NR; ++j) acc[i][j] = fmaf(av[i].y, wv[j].y, acc[i][j]);
#pragma unroll
    for (int i = 0; i < TB; ++i)
#pragma unroll
      for (int j = 0; j < NR; ++j) acc[i][j] = fmaf(av[i].z, wv[j].z, acc[i][j]);
#pragma unroll
    for (int i = 0; i < TB; ++i)
#pragma unroll
      for (int j = 0; j < NR; ++j) acc[i][j] = fmaf(av[i].w, wv[j].w, acc[i][j]);
  }
}

// acc[i][c] = init(i, c) + sum_k A[b0 + row_i][k] * Ws[first_row(vg) + c][k], row_i = bg + nb i, k < K (a multiple of
// 4), reduced over the thread's S lanes (every lane ends with the sums; init only in the wide tiles, where lane 0's
// init counts once: the others' must be 0). src(b, k) is the address of A[b][k..k+3] (16-byte aligned): A is staged
// chunk by chunk with cp.async.cg (L2, where the other SMs' h_t is; no registers, no L1), later chunks' copies in
// flight while one multiplies. Ends with a __syncthreads(): the staging buffers are free.
//   narrow: two buffers of kStage floats, one chunk in flight behind the one multiplied (two barriers a chunk).
//   wide:   a ring of kWideStages buffers of tl.sw floats (the plan sizes them to the shared memory the weights leave),
//           kWideStages - 1 chunks in flight, one barrier a chunk. At batch 128 (default model, 132 SMs) a step
//           stages 128 x 768 floats of [emb | h] and 128 x 512 of h into every SM; clock64 stamps in a dev build had
//           thread 0 waiting at the chunk barriers for a quarter of the decode with one 18 KB chunk in flight. A ring
//           of 2 (one chunk in flight) measured within 1-3% of this ring of 3 (the header's record): those waits are
//           not the bytes in flight alone.
template <int TB, int NR, bool kWide, class SrcA, class Init>
__device__ __forceinline__ void tile_gemm(const Tile& tl, int b0, int nrows, int rows, int K, const float* Ws, int ldw,
                                          float* stage, const SrcA& src, const Init& init, float (&acc)[TB][NR]) {
  const int tid = threadIdx.x, S = tl.s, kc = tl.kc, lda = kc + 4;
  const int s = tid % S;
  const Group g = group_of<kWide>(tl, tid / S);
  int row[TB];
#pragma unroll
  for (int i = 0; i < TB; ++i) row[i] = imin(g.bg + tl.nb * i, nrows - 1) * lda;
  const float* w0 = Ws + first_row<NR, kWide>(g.vg, rows) * ldw;
#pragma unroll
  for (int i = 0; i < TB; ++i)
#pragma unroll
    for (int c = 0; c < NR; ++c) acc[i][c] = kWide ? init(i, c) : 0.f;

  const int nchunks = (K + kc - 1) / kc;
  // kWide: block g walks K's chunks from chunk g mod nchunks, so the 132 blocks do not all ask L2 for the same lines
  constexpr bool kRot = kWide && kRotateChunks;
  const int rot = kRot ? int(blockIdx.x % unsigned(nchunks)) : 0;
  auto chunk = [&](int c) { return kRot ? (c + rot < nchunks ? c + rot : c + rot - nchunks) : c; };
  auto copy = [&](int c, float* buf) {  // chunk c: rows [0, nrows) x columns [c' kc, c' kc + kc) of A into buf
    const int k0 = chunk(c) * kc, nq = imin(kc, K - k0) >> 2;
    for (int i = tid; i < nrows * nq; i += kThreads) {
      const int r = i / nq, q = i - r * nq;
      lab::cp_async16(smem_u32(buf + r * lda + 4 * q), src(b0 + r, k0 + 4 * q), 16);  // .cg: L2, coherent
    }
  };
  __syncthreads();  // the caller's last use of the staging buffers is over
  if constexpr (kWide) {
    constexpr int NS = kWideStages;
    const int sw = tl.sw;
#pragma unroll
    for (int c = 0; c < NS - 1; ++c) {  // one commit group a chunk, empty past the end: the count stays uniform
      if (c < nchunks) copy(c, stage + c * sw);
      cp_async_commit();
    }
    int slot = 0;  // chunk c's buffer: c mod NS
    for (int c = 0; c < nchunks; ++c) {
      cp_async_wait<NS - 2>();  // chunk c has landed (this thread's copies) ...
      __syncthreads();          // ... everyone's; and chunk c - 1's buffer, refilled next, is read
      const int refill = slot == 0 ? NS - 1 : slot - 1;
      if (c + NS - 1 < nchunks) copy(c + NS - 1, stage + refill * sw);
      cp_async_commit();
      const int k0 = chunk(c) * kc;
      chunk_fma<TB, NR>(acc, stage + slot * sw, row, w0 + k0, ldw, imin(kc, K - k0) >> 2, s, S);
      slot = slot + 1 == NS ? 0 : slot + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // every thread is done with the ring
  } else {
    copy(0, stage);
    cp_async_commit();
    for (int c = 0; c < nchunks; ++c) {
      if (c + 1 < nchunks) {
        copy(c + 1, stage + ((c + 1) & 1) * kStage);  // into the buffer chunk c - 1 used: every thread passed the
        cp_async_commit();                             // barrier after reading it
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // chunk c is in shared memory, every thread's copies
      const int k0 = chunk(c) * kc;
      chunk_fma<TB, NR>(acc, stage + (c & 1) * kStage, row, w0 + k0, ldw, imin(kc, K - k0) >> 2, s, S);
      __syncthreads();  // every thread is done with stage[c & 1] before chunk c + 2 is copied into it
    }
  }
  for (int off = S >> 1; off > 0; off >>= 1)
#pragma unroll
    for (int i = 0; i < TB; ++i)
#pragma unroll
      for (int c = 0; c < NR; ++c) acc[i][c] += __shfl_xor_sync(0xffffffffu, acc[i][c], off);
}

// Phase A, one batch tile: gh = h_{t-1} W_hh^T for the block's units, then the gates; h_t into hbuf[t & 1]. The
// gates' other inputs (the gathered input projection, h_{t-1}, b_hh) do not depend on the product: their loads are
// issued before it, so their L2 latency hides behind the multiply. Narrow tiles: lane 0 of a group's S lanes applies
// the gates to its TB rows; wide: lane s to rows i = s, s + S, ... (every lane holds the sums after tile_gemm), so
// the gathers and the transcendentals are spread over the S lanes rather than left to one (clock64 stamps in a dev
// build at batch 128: thread 0 spent ~7 k cycles a step in phase A outside the product).
template <int TB, bool kWide>
__device__ __forceinline__ void phase_a(const GreedyArgs& a, const Tile& tl, int b0, const float* hprev, int64_t ldp,
                                        float* hnext, const float* whh_s, int ldh, float* stage, const int* tok_s) {
  const int nrows = imin(tl.bt, a.B - b0), H = a.H, Hp = a.Hp;
  const int s = threadIdx.x % tl.s;
  const Group g = group_of<kWide>(tl, threadIdx.x / tl.s);
  const int bg = g.bg, u = g.vg, j = blockIdx.x * a.U + u;
  const bool gates = (kWide || s == 0) && g.live && u < a.U && j < H;  // this thread applies gates (to its rows)
  auto mine = [&](int i) { return !kWide || i % tl.s == s; };         // row i is this lane's
  float gi[TB][3], hp[TB], bh[3] = {0.f, 0.f, 0.f};
  if (gates) {
    bh[0] = __ldg(a.b_hh + j), bh[1] = __ldg(a.b_hh + H + j), bh[2] = __ldg(a.b_hh + 2 * H + j);
#pragma unroll
    for (int i = 0; i < TB; ++i) {
      if (!mine(i)) continue;
      const int b = b0 + imin(bg + tl.nb * i, nrows - 1), tok = tok_s[b];
      const float* gt = a.gi_tab + int64_t(tok < 0 ? 0 : tok) * 3 * H;  // tok < 0: a poisoned row (NaN below)
      const float* gc = a.gi_ctx + int64_t(b) * 3 * H;
#pragma unroll
      for (int c = 0; c < 3; ++c)
        gi[i][c] = tok < 0 ? __int_as_float(0x7fc00000) : __ldg(gt + c * H + j) + __ldg(gc + c * H + j);
      hp[i] = __ldcg(hprev + int64_t(b) * ldp + j);
    }
  }
  float acc[TB][3];  // (one unit: nr = 3, and its rows start at 3u: rows_a = 3U)
  tile_gemm<TB, 3, kWide>(tl, b0, nrows, 3 * a.U, Hp, whh_s, ldh, stage,
                          [&](int b, int k) { return hprev + int64_t(b) * ldp + k; },
                          [](int, int) { return 0.f; }, acc);
  if (!gates) return;
#pragma unroll
  for (int i = 0; i < TB; ++i) {
    const int r = bg + tl.nb * i;
    if (r >= nrows) break;
    if (!mine(i)) continue;
    const float rg = sigm(gi[i][0] + acc[i][0] + bh[0]), zg = sigm(gi[i][1] + acc[i][1] + bh[1]);
    const float ng = tanh_acc(gi[i][2] + rg * (acc[i][2] + bh[2]));
    hnext[int64_t(b0 + r) * Hp + j] = ng + zg * (hp[i] - ng);
  }
}

// Phase B, one batch tile: logits = [emb[tok] | h_t] W_fc^T + fc_ctx for the block's vocabulary rows, then each batch
// row's best (value, index) over them, merged into keys with one atomicMax.
//   narrow: the tile's fc_ctx is copied into shared memory (cp.async, no registers: the accumulators need them)
//           before the product, so its L2 latency hides behind the multiply, and added to the logits after; one warp
//           a row picks.
//   wide:   each output's owner starts its accumulator at fc_ctx (loaded before the first chunk lands: no buffer,
//           which leaves its shared memory to the staging ring), and two threads a row pick: one warp a row took
//           ~10 k cycles a step at batch 128 (16 rows a warp, one after another, each a five-level shuffle chain).
template <int TB, int NR, bool kWide, bool kPick>
__device__ __forceinline__ void phase_b(const GreedyArgs& a, const Tile& tl, int b0, const float* hcur,
                                        unsigned long long* keys, const float* wfc_s, int ldf, int rows_b,
                                        float* stage, float* fcs, const int* tok_s) {
  const int nrows = imin(tl.bt, a.B - b0), Hp = a.Hp, Ep = a.Ep, K = Ep + Hp;
  const int v0 = blockIdx.x * a.R, nvoc = imin(a.R, a.V - v0);
  const Group g = group_of<kWide>(tl, threadIdx.x / tl.s);
  const bool owner = threadIdx.x % tl.s == 0 && g.live;
  const int v1 = first_row<NR, kWide>(g.vg, rows_b);
  if constexpr (!kWide) {
    __syncthreads();  // the previous tile's argmax has read fcs
    for (int i = threadIdx.x; i < nrows * nvoc; i += kThreads)
      lab::cp_async4(smem_u32(fcs + i), a.fc_ctx + int64_t(b0 + i / nvoc) * a.V + v0 + i % nvoc, 4);  // read-only
  }
  float acc[TB][NR];
  tile_gemm<TB, NR, kWide>(tl, b0, nrows, rows_b, K, wfc_s, ldf, stage, [&](int b, int k) {
    return k < Ep ? a.emb + int64_t(imax(tok_s[b], 0)) * Ep + k : hcur + int64_t(b) * Hp + (k - Ep);
  }, [&](int i, int c) {  // (wide only) fc_ctx for the outputs this thread stores, 0 elsewhere
    const int r = g.bg + tl.nb * i, v = v1 + c;
    return owner && r < nrows && v < nvoc && owns_row<NR, kWide>(g.vg, v)
               ? __ldg(a.fc_ctx + int64_t(b0 + r) * a.V + v0 + v) : 0.f;
  }, acc);
  float* L = stage;  // (nrows, nvoc) logits of this tile (narrow: without fc_ctx)
  if (owner) {
#pragma unroll
    for (int i = 0; i < TB; ++i) {
      const int r = g.bg + tl.nb * i;
#pragma unroll
      for (int c = 0; c < NR; ++c)
        if (r < nrows && v1 + c < nvoc && owns_row<NR, kWide>(g.vg, v1 + c)) L[r * nvoc + v1 + c] = acc[i][c];
    }
  }
  if constexpr (kWide) {
    __syncthreads();
    // two threads a row: lanes 2r' and 2r'+1 take every other vocabulary row and meet with one shuffle
    const unsigned pair = 3u << (threadIdx.x & 30u);
    for (int r = threadIdx.x >> 1; r < nrows; r += kThreads / 2) {
      unsigned long long best = 0;
      for (int v = threadIdx.x & 1; v < nvoc; v += 2) {
        const float logit = L[r * nvoc + v];
        if (a.logits) a.logits[int64_t(b0 + r) * a.V + v0 + v] = logit;
        if constexpr (kPick) {
          const unsigned long long k = argmax_key(logit, v0 + v);
          best = k > best ? k : best;
        }
      }
      if constexpr (kPick) {
        const unsigned long long o = __shfl_xor_sync(pair, best, 1);
        best = o > best ? o : best;
        if ((threadIdx.x & 1) == 0) atomicMax(keys + b0 + r, best);
      }
    }
    return;
  }
  cp_async_wait<0>();  // (fcs's copies went out with the product's first chunk)
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < nrows; r += kThreads / 32) {
    unsigned long long best = 0;
    for (int v = lane; v < nvoc; v += 32) {
      const float logit = L[r * nvoc + v] + fcs[r * nvoc + v];
      if (a.logits) a.logits[int64_t(b0 + r) * a.V + v0 + v] = logit;
      if constexpr (kPick) {
        const unsigned long long k = argmax_key(logit, v0 + v);
        best = k > best ? k : best;
      }
    }
    if constexpr (kPick) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
      }
      if (lane == 0) atomicMax(keys + b0 + r, best);
    }
  }
}

#define LAB_TB_DISPATCH(tb, CALL) \
  switch (tb) {                   \
    case 1: CALL(1); break;       \
    case 2: CALL(2); break;       \
    case 4: CALL(4); break;       \
    default: CALL(8); break;      \
  }

// kPick false: one teacher-forced step (T = 1, toks null: LabSeq2Seq.step_fused) without the argmax. After the
// first barrier every read of ctx is over, so each block writes its units of h_t into h_out and the launch ends after
// phase B: no second barrier, no token decode (1.8 us of the 22 us one-step launch at batch 1 on the H100). A
// template, not a flag: with a run-time flag the decode's own code came out slower (243 -> 249 us at batch 1).
template <bool kPick, bool kWide>
__global__ void __launch_bounds__(kThreads, 1) greedy_kernel(const GreedyArgs a) {
  extern __shared__ __align__(16) float smem[];
  const int B = a.B, H = a.H, Hp = a.Hp, K = a.Ep + a.Hp, tid = threadIdx.x;
  const int ldh = Hp + 4, ldf = K + 4;  // 4 floats of padding: rows 4 banks apart
  const int rows_a = 3 * a.U, rows_b = 3 * ((a.R + 2) / 3);
  float* whh_s = smem;                        // (3U, ldh): unit u's r, z, n rows at 3u, 3u + 1, 3u + 2
  float* wfc_s = whh_s + rows_a * ldh;        // (rows_b, ldf)
  float* stage = wfc_s + rows_b * ldf;        // narrow: (2, kStage); wide: (kWideStages, sw)
  // kWide: the launcher chose this instantiation by use_wide (the same test): the tiles are wide here
  const Tile ta = make_tile(B, rows_a, Hp, 3, kWide, a.sw), tbl = make_tile(B, rows_b, K, kWideNR, kWide, a.sw);
  float* fcs = stage + (kWide ? kWideStages * a.sw : 2 * kStage);  // narrow: (tbl.bt, R), a batch tile's fc_ctx
  int* tok_s = reinterpret_cast<int*>(fcs + (kWide ? 0 : tbl.bt * a.R));  // (B) this step's input tokens
  int* fin_s = tok_s + B;                                    // (B) rows that have emitted <eos>

  // The block's weights into shared memory, zero past the matrix (the tiles read whole float4s up to the padding).
  // On sm_90a thread 0 starts one bulk copy per row (W_hh's rows complete on one mbarrier, fc_out's on another), so
  // fc_out's 139 KB are still arriving while phase A of the first step runs; elsewhere plain loads.
  const int j0 = blockIdx.x * a.U, v0 = blockIdx.x * a.R;
  const int nhh = 3 * imax(0, imin(a.U, H - j0)), nfc = imax(0, imin(a.R, a.V - v0));  // rows with weights
#ifdef LAB_SM90A
  __shared__ __align__(8) unsigned long long bars[2];
  const uint32_t bar_a = smem_u32(bars), bar_b = smem_u32(bars + 1);
  if (tid == 0) {
    lab::mbar_init(bar_a, 1);
    lab::mbar_init(bar_b, 1);
    lab::mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0) {  // the byte counts first, so no copy can complete a phase early
    lab::mbar_expect_tx(bar_a, uint32_t(nhh) * Hp * 4);
    lab::mbar_expect_tx(bar_b, uint32_t(nfc) * K * 4);
  }
  __syncthreads();
  if (tid < 32) {  // one warp issues the copies, a row a lane at a time
    for (int r = tid; r < nhh; r += 32)
      lab::bulk_load(smem_u32(whh_s + r * ldh), a.w_hh + (int64_t(r % 3) * H + j0 + r / 3) * Hp, Hp * 4, bar_a);
    for (int r = tid; r < nfc; r += 32)
      lab::bulk_load(smem_u32(wfc_s + r * ldf), a.w_fc + int64_t(v0 + r) * K, K * 4, bar_b);
  }
  // What the copies do not write: the 4 pad columns of every row, and the rows past the matrix (by rows, not by
  // element: a division per element of the 139 KB slice cost microseconds).
  for (int r = tid; r < rows_a; r += kThreads)
    *reinterpret_cast<float4*>(whh_s + r * ldh + Hp) = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r = tid; r < rows_b; r += kThreads)
    *reinterpret_cast<float4*>(wfc_s + r * ldf + K) = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i = nhh * ldh + tid; i < rows_a * ldh; i += kThreads) whh_s[i] = 0.f;
  for (int i = nfc * ldf + tid; i < rows_b * ldf; i += kThreads) wfc_s[i] = 0.f;
#else
  for (int i = tid; i < rows_a * ldh; i += kThreads) {
    const int r = i / ldh, c = i % ldh;
    whh_s[i] = (r < nhh && c < Hp) ? a.w_hh[(int64_t(r % 3) * H + j0 + r / 3) * Hp + c] : 0.f;
  }
  for (int i = tid; i < rows_b * ldf; i += kThreads) {
    const int r = i / ldf, c = i % ldf;
    wfc_s[i] = (r < nfc && c < K) ? a.w_fc[int64_t(v0 + r) * K + c] : 0.f;
  }
#endif
  for (int b = tid; b < B; b += kThreads) {  // step 0's input: <sos>, or the given tokens (outside [0, V): -1)
    const int64_t tok = a.tok_in ? a.tok_in[b] : a.sos;
    tok_s[b] = tok >= 0 && tok < a.V ? int(tok) : -1;
    fin_s[b] = 0;
  }

  const bool has_units = j0 < H, has_rows = v0 < a.V;
  cg::grid_group grid = cg::this_grid();
  for (int t = 0;; ++t) {
    if (t > 0) {
      grid.sync();  // h_{t-1} and every block's argmax of step t-1 are in L2
      // The output of step t-1 is the input of step t. Every block decodes every row (the same keys, so the same
      // decision to stop everywhere); block 0 writes the tokens.
      const unsigned long long* kp = a.keys + ((t - 1) & 1) * B;
      int alive = 0;
      for (int b = tid; b < B; b += kThreads) {
        int tok = key_index(__ldcg(kp + b));
        if (a.eos >= 0) {
          if (fin_s[b]) tok = a.eos;
          else if (tok == a.eos) fin_s[b] = 1;
          alive |= !fin_s[b];
        }
        tok_s[b] = tok;
        if (blockIdx.x == 0) a.toks[int64_t(t - 1) * B + b] = tok;
      }
      const bool any_alive = __syncthreads_or(alive);
      if (t == a.T) {  // every read of ctx is over (h_out may be ctx): the last h into h_out, each block its units
        if (a.h_out && has_units) {
          const float* hl = a.hbuf + int64_t((t - 1) & 1) * B * Hp;
          const int nu = imin(a.U, H - j0);
          for (int i = tid; i < B * nu; i += kThreads)
            a.h_out[int64_t(i / nu) * a.ld_hout + j0 + i % nu] = __ldcg(hl + int64_t(i / nu) * Hp + j0 + i % nu);
        }
        return;
      }
      if (a.eos >= 0 && !any_alive) {  // every row has emitted <eos>: the rest is <eos>
        if (blockIdx.x == 0)
          for (int64_t i = int64_t(t) * B + tid; i < int64_t(a.T) * B; i += kThreads) a.toks[i] = a.eos;
        return;
      }
    } else {
      __syncthreads();
    }
    // keys[t & 1] last held step t-2's argmax, decoded before this step's first barrier: reset it for phase B.
    if (blockIdx.x == 0)
      for (int b = tid; b < B; b += kThreads) a.keys[(t & 1) * B + b] = 0ull;
    const float* hprev = t == 0 ? a.ctx : a.hbuf + int64_t((t - 1) & 1) * B * Hp;
    const int64_t ldp = t == 0 ? a.ld_ctx : Hp;
    float* hnext = a.hbuf + int64_t(t & 1) * B * Hp;
#ifdef LAB_SM90A
    if (t == 0) lab::mbar_wait(bar_a, 0);  // W_hh's rows have landed
#endif
    if (has_units) {
      for (int b0 = 0; b0 < B; b0 += ta.bt) {
#define LAB_PHASE_A(TB) phase_a<TB, false>(a, ta, b0, hprev, ldp, hnext, whh_s, ldh, stage, tok_s)
        if constexpr (kWide)
          phase_a<kMaxTB, true>(a, ta, b0, hprev, ldp, hnext, whh_s, ldh, stage, tok_s);
        else
          LAB_TB_DISPATCH(ta.tb, LAB_PHASE_A)
#undef LAB_PHASE_A
      }
    }
    grid.sync();  // every unit of h_t is written
    if constexpr (!kPick) {
      if (a.h_out && has_units) {
        const int nu = imin(a.U, H - j0);
        for (int i = tid; i < B * nu; i += kThreads)
          a.h_out[int64_t(i / nu) * a.ld_hout + j0 + i % nu] = __ldcg(hnext + int64_t(i / nu) * Hp + j0 + i % nu);
      }
    }
#ifdef LAB_SM90A
    if (t == 0) lab::mbar_wait(bar_b, 0);  // fc_out's rows have landed
#endif
    if (has_rows) {
      unsigned long long* keys = a.keys + (t & 1) * B;
      for (int b0 = 0; b0 < B; b0 += tbl.bt) {
#define LAB_PHASE_B(TB) phase_b<TB, 3, false, kPick>(a, tbl, b0, hnext, keys, wfc_s, ldf, rows_b, stage, fcs, tok_s)
#define LAB_PHASE_W(NR) phase_b<kMaxTB, NR, true, kPick>(a, tbl, b0, hnext, keys, wfc_s, ldf, rows_b, stage, fcs, tok_s)
        if constexpr (kWide) {
          if (tbl.nr == kWideNR)
            LAB_PHASE_W(kWideNR);
          else
            LAB_PHASE_W(3);
        } else {
          LAB_TB_DISPATCH(tbl.tb, LAB_PHASE_B)
        }
#undef LAB_PHASE_W
#undef LAB_PHASE_B
      }
    }
    if constexpr (!kPick) return;
  }
}
#undef LAB_TB_DISPATCH

// ---- plan and launcher ------------------------------------------------------------------------------------------
// info (kInfo entries, the binding names them): blocks, units_per_block, rows_per_block, smem_bytes, smem_optin,
// max_coresident, then phase A's and phase B's (rows_per_thread, k_lanes, batch_tile, k_chunk), then their weight
// rows a thread (nr).
constexpr int kInfo = 16;
constexpr int kOtherUnit = 6;  // (the binding's kGreedyOtherUnit)
struct GreedyPlan {
  int status = 0;  // 0 fits; 1 batch > kMaxBatch; 2 shared memory; 3 not co-resident; 4 no cooperative launch; 5 CUDA
                   // error; kOtherUnit: the batch takes the other unit's width (ask it)
  int blocks = 0, U = 0, R = 0, smem = 0, optin = 0, coresident = 0;
  bool wide = false;  // greedy_kernel<kPick, true>
  int sw = 0;         // the wide ring's buffer, floats
  Tile ta{}, tb{};
};

// This unit's kernels (the plan has checked that the batch takes this unit's width).
inline const void* kernel_for(bool pick) {
  return pick ? reinterpret_cast<const void*>(greedy_kernel<true, kUnitWide>)
              : reinterpret_cast<const void*>(greedy_kernel<false, kUnitWide>);
}

inline GreedyPlan plan(int B, int H, int E, int V) {
  GreedyPlan p;
  p.blocks = lab::sm_count();
  p.U = int(lab::ceil_div(H, p.blocks));
  p.R = int(lab::ceil_div(V, p.blocks));
  const int Hp = (H + 3) & ~3, K = ((E + 3) & ~3) + Hp, ldh = Hp + 4, ldf = K + 4, rows_b = 3 * ((p.R + 2) / 3);
  const int64_t fixed = 4 * (int64_t(3 * p.U) * ldh + int64_t(rows_b) * ldf) + 8 * int64_t(B);  // weights, tokens
  auto finish = [&](int64_t stage_bytes) {
    p.ta = make_tile(B, 3 * p.U, Hp, 3, p.wide, p.sw);
    p.tb = make_tile(B, rows_b, K, kWideNR, p.wide, p.sw);
    const int64_t smem = fixed + stage_bytes;
    p.smem = int(smem > (int64_t(1) << 30) ? (int64_t(1) << 30) : smem);
  };
  p.wide = false;
  finish(4 * (2 * int64_t(kStage) + int64_t(make_tile(B, rows_b, K, 3, false, 0).bt) * p.R));
  if (B > kMaxBatch) return p.status = 1, p;
  if ((p.status = cooperative_device(&p.optin)) != 0) return p;
  if (use_wide(B, 3 * p.U, rows_b)) {
    // The wide ring: kWideStages buffers of bt x (kc + 4) floats, kc a multiple of 4 up to kWideKC, sized to what the
    // weights leave of the block's shared memory (less kStaticReserve for the kernel's static shared memory). Too
    // little left for kc = 4, or for the tile's logits (bt x R, over the ring): the narrow launch.
    const int bt = imin(B, 128);
    const int64_t per = (int64_t(p.optin) - fixed - kStaticReserve) / (4 * kWideStages);
    int kc = imin(kWideKC, imax(0, int(per / bt) - 4));
    kc &= kc >= 32 ? ~31 : ~3;  // 8 quads a chunk per 8 lanes splitting K: no lane takes one more quad than another
    if (kc >= 4 && int64_t(kWideStages) * bt * (kc + 4) >= int64_t(bt) * p.R) {
      p.wide = true;
      p.sw = bt * (kc + 4);
      finish(4 * int64_t(kWideStages) * p.sw);
    }
  }
  if (p.wide != kUnitWide) return p.status = kOtherUnit, p;
  // Both instantiations this batch takes (the decode's and the one step's) must fit: the smaller of their limits.
  p.coresident = 1 << 30;
  for (const void* k : {kernel_for(true), kernel_for(false)}) {
    cudaFuncAttributes fa{};  // the kernel's static shared memory (mbarriers, cooperative groups) counts too
    if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) return p.status = 5, p;
    if (p.U > kThreads || rows_b / 3 > kThreads || int64_t(p.smem) + fa.sharedSizeBytes > p.optin)
      return p.status = 2, p;
    int co = 0;
    if (coresident_blocks(k, p.smem, &co) != 0) return p.status = 5, p;
    p.coresident = imin(p.coresident, co);
  }
  if (p.coresident < p.blocks) return p.status = 3, p;
  return p;
}

}  // namespace gru

// Launchers (called from cpp_src/gru/gru.cpp), one pair per variant: "gru_greedy_plan@0" / "gru_greedy@0" (narrow),
// "@1" (wide).
int gru_greedy_plan(int B, int H, int E, int V, int* info) {
  const gru::GreedyPlan p = gru::plan(B, H, E, V);
  const int v[gru::kInfo] = {p.blocks, p.U, p.R, p.smem, p.optin, p.coresident, p.ta.tb, p.ta.s, p.ta.bt, p.ta.kc,
                             p.tb.tb, p.tb.s, p.tb.bt, p.tb.kc, p.ta.nr, p.tb.nr};
  for (int i = 0; i < gru::kInfo; ++i) info[i] = v[i];
  return p.status;
}

// All float32, 16-byte aligned; Hp, Ep = H, E rounded up to 4: ctx (B, Hp) rows ld_ctx apart (a multiple of 4), emb
// (V, Ep), w_hh (3H, Hp), w_fc (V, Ep + Hp), their pad columns zero. hbuf: (2, B, Hp) workspace, pad columns zero;
// keys: 2 B of workspace; toks: (T, B) int64 out, or nullptr: one step (T = 1) without the pick. tok_in (B) or
// nullptr (<sos>); logits (B, V) or nullptr; h_out (B, H) rows ld_hout apart or nullptr (written only when the decode
// runs all T steps: eos = -1).
cudaError_t gru_greedy(const float* ctx, const float* gi_ctx, const float* fc_ctx, const float* emb,
                       const float* gi_tab, const float* w_hh, const float* b_hh, const float* w_fc, float* hbuf,
                       unsigned long long* keys, int64_t* toks, const int64_t* tok_in, float* logits, float* h_out,
                       int64_t ld_ctx, int64_t ld_hout, int B, int H, int E, int V, int T, int sos, int eos,
                       cudaStream_t stream) {
  using namespace gru;
  if (B == 0 || T == 0) return cudaSuccess;
  if (!toks && T != 1) return cudaErrorInvalidValue;  // (the binding passes null only for one step)
  const GreedyPlan p = plan(B, H, E, V);
  if (p.status != 0) return cudaErrorInvalidConfiguration;  // the binding checks the plan first (and picks the unit)
  const GreedyArgs a{ctx,  gi_ctx, fc_ctx, emb,    gi_tab, w_hh, b_hh, w_fc, hbuf, keys, toks, tok_in, logits,
                     h_out, ld_ctx, ld_hout, B, H, E, V, T, sos, eos, (H + 3) & ~3, (E + 3) & ~3, p.U, p.R, p.sw};
  void* args[] = {const_cast<GreedyArgs*>(&a)};
  const void* kernel = kernel_for(toks != nullptr);
  return launch_cooperative(kernel, p.blocks, p.smem, stream, args);
}

LAB_EXPORTS(LAB_EXPORT("gru_greedy_plan", gru_greedy_plan), LAB_EXPORT("gru_greedy", gru_greedy))
