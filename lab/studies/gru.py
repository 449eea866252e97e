"""The GRU's study: could the fp32 input projection run on tensor cores at fp32 accuracy (3xTF32)?

Issue 14's strict-fp32 goal at batch 256 (>= 1.5x cuDNN) is missed by the input projection, x (T*B, I) @ W_ih^T
(3H, I), the cuBLAS fp32 GEMM before v4's persistent kernel: notebook 03 profiles it at ~150 us of ~670. The design
studied here splits each fp32 operand into a TF32 high part and the remainder, a = a_hi + a_lo, and keeps three of the
four products (a_lo b_lo is below fp32's rounding):

    x W^T ~= x_hi W_hi^T + x_hi W_lo^T + x_lo W_hi^T

either as one TF32 GEMM with K tripled, [x_hi | x_hi | x_lo] @ [W_hi | W_lo | W_hi]^T, or as three TF32 GEMMs
accumulated into one output (the small products then never meet the large one inside a tensor-core accumulation).
Napkin math at batch 256 (M = 7680, N = 1536, K = 256): 6.0 GFLOP in fp32; 18.1 GFLOP in TF32, ~45 us at cuBLAS's
~400 TFLOP/s TF32 rate on this GPU, against ~120 us for fp32 at its ~51 TFLOP/s.

`proj_3xtf32_study` times, CUDA-graph replay with the L2 flushed, side by side in one run: the projection as v3/v4
run it today (proj.cu's kernel up to 512 rows on Hopper, cuBLAS fp32 above), the two 3xTF32 forms with their
operands split beforehand (the split pass is left out: a lower bound on the design's time), one plain TF32 GEMM (the
precision the design must not fall to), and the whole encoder (v4 and strict-fp32 cuDNN). It prints each form's
error against a float64 product and the best ratio to cuDNN the design could give: v4's time with today's projection
replaced by the fastest 3xTF32 form. `python -m lab.studies.gru` runs it (a GPU is needed).
"""
from __future__ import annotations

import torch

from ..kernels import gru as kgru
from ..timing import time_fn


def split_tf32(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a = hi + lo exactly, hi with TF32's 10 mantissa bits (the low 13 bits of the fp32 word cleared: truncation, so
    |lo| < 2^-10 |a|), lo the fp32 remainder (which the TF32 GEMM rounds again: an error of ~2^-21 |a|). For finite
    float32 values (an infinity's remainder is NaN)."""
    hi = (a.view(torch.int32) & -8192).view(torch.float32)
    return hi, a - hi


def _mm(tf32: bool):
    """a (M, K) @ b (N, K)^T on cuBLAS, TF32 allowed or not for this call only."""
    def f(a, b):
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            return torch.mm(a, b.t())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    return f


_fp32, _tf32 = _mm(False), _mm(True)


def _three(xh, xl, wh, wl):
    """x_hi W_hi^T + x_hi W_lo^T + x_lo W_hi^T as three TF32 GEMMs into one output (beta = 1: the sums in fp32)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        r = torch.mm(xh, wh.t())
        r.addmm_(xh, wl.t())
        return r.addmm_(xl, wh.t())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def proj_3xtf32_study(batches=(8, 64, 128, 256), seq: int = 30, inp: int = 256, hidden: int = 512,
                      seed: int = 0) -> list[dict]:
    """One row per batch: times in us (graph replay, L2 flushed), each projection's relative error against float64,
    and the encoder's ratio to strict-fp32 cuDNN today and with the fastest 3xTF32 form in place of the projection."""
    dev = torch.device("cuda")
    rows = []
    for B in batches:
        g = torch.Generator(device="cpu").manual_seed(seed + B)
        x, h0, params = kgru.make_inputs(kgru._shape(seq, B, inp, hidden), torch.float32, dev, g)  # x: (T, B, I)
        w = params[0]                                      # W_ih: (3H, I)
        x2 = x.view(seq * B, inp)                          # (T*B, I)
        xh, xl = split_tf32(x2)
        wh, wl = split_tf32(w)
        a3 = torch.cat([xh, xh, xl], 1)                    # (T*B, 3I)
        b3 = torch.cat([wh, wl, wh], 1)                    # (3H, 3I)
        # today's route (cpp_src/gru/gru.cpp: own_proj): proj.cu's kernel up to 128 rows, and up to 512 on Hopper
        # (its bulk-copy kernel); cuBLAS's fp32 GEMM otherwise
        M = x2.shape[0]
        own = M <= 128 or (M <= 512 and torch.cuda.get_device_capability(dev)[0] == 9)
        today = (lambda: kgru.input_projection(x2, w)) if own else (lambda: _fp32(x2, w))
        forms = {
            "proj today": today,
            "tf32 (1 GEMM)": lambda: _tf32(x2, w),
            "3xtf32, K tripled": lambda: _tf32(a3, b3),
            "3xtf32, 3 GEMMs": lambda: _three(xh, xl, wh, wl),
        }
        ref = x2.double() @ w.double().t()
        row = {"batch": B, "M": seq * B}
        for name, fn in forms.items():
            r = fn()
            row[f"{name} err"] = ((r.double() - ref).norm() / ref.norm()).item()
            row[f"{name} us"] = time_fn(fn, dev, graph=True).median_us
        row["v4 us"] = time_fn(lambda: kgru.gru(x, h0, params, version="v4"), dev, graph=True).median_us
        row["cuDNN fp32 us"] = time_fn(lambda: kgru.gru_torch(x, h0, params), dev, graph=True).median_us
        best = min(row["3xtf32, K tripled us"], row["3xtf32, 3 GEMMs us"])
        row["v4 / cuDNN today"] = row["cuDNN fp32 us"] / row["v4 us"]
        row["bound with 3xtf32"] = row["cuDNN fp32 us"] / (row["v4 us"] - row["proj today us"] + best)
        rows.append(row)
        print(f"batch {B:4d} (M = {seq * B}): " + " | ".join(
            f"{n} {row[n + ' us']:6.1f} us err {row[n + ' err']:.1e}" for n in forms), flush=True)
        print(f"    v4 {row['v4 us']:.1f} us, cuDNN fp32 {row['cuDNN fp32 us']:.1f} us: {row['v4 / cuDNN today']:.2f}x "
              f"today; with the fastest 3xTF32 form (split pass not counted) at most {row['bound with 3xtf32']:.2f}x",
              flush=True)
    return rows


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("python -m lab.studies.gru: the 3xTF32 projection study needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    proj_3xtf32_study()
