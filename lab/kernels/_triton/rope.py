"""rope in Triton: the forward rotation of one tensor, either layout ('bhsd', 'bshd'), either pairing (half-split,
interleaved), float32 / float16 / bfloat16 activations with float32 or same-dtype (max_pos, D/2) tables.

A program takes BLOCK_R rows of D features and reads them as a (BLOCK_R, BLOCK_P, 2) block of (pair, member): the
pairing is only the address of member j of pair i (half-split: i + j·D/2, interleaved: 2i + j), so one kernel serves
both; tl.split / tl.join separate and rejoin the two members. Arithmetic in float32, rounded once on the store.

What Triton does for free: the vector widths (CUDA v2 chose 16-byte vectors by hand, with a scalar fallback where
D/2 is not a multiple of the vector), the masking of D/2 that is not a power of two (6, 10, 18, 40...), and the
register layout of the split/join. What it leaves to us: the row -> position arithmetic of each layout, the block of
rows per program (v2 also loads cos/sin once for 2 heads; here a table row is loaded once per row: L1/L2 serve the
repeats).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import check_device

ELEMS = 4096   # elements per program (BLOCK_R rows x 2·BLOCK_P features): ~16 KB of float32 in flight per program


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, rows, seq, heads, offset,
                HALF: tl.constexpr, BHSD: tl.constexpr, INTERLEAVED: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)     # rows: (BLOCK_R,)
    p = tl.arange(0, BLOCK_P)                                               # pairs: (BLOCK_P,)
    j = tl.arange(0, 2)                                                     # member of a pair
    if BHSD:
        s = r % seq                                                         # row = (b·H + h)·S + s
    else:
        s = (r // heads) % seq                                              # row = (b·S + s)·H + h
    pos = offset + s
    if INTERLEAVED:
        col = 2 * p[:, None] + j[None, :]                                   # (x[2i], x[2i+1])
    else:
        col = p[:, None] + HALF * j[None, :]                                # (x[i], x[i + D/2])
    idx = r[:, None, None] * (2 * HALF) + col[None, :, :]                   # (BLOCK_R, BLOCK_P, 2)
    ok = (r[:, None, None] < rows) & (p[None, :, None] < HALF) & (j[None, None, :] < 2)
    x = tl.load(x_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    x1, x2 = tl.split(x)                                                    # (BLOCK_R, BLOCK_P) each
    t = pos[:, None] * HALF + p[None, :]
    t_ok = (r[:, None] < rows) & (p[None, :] < HALF)
    c = tl.load(cos_ptr + t, mask=t_ok, other=0.0).to(tl.float32)
    sn = tl.load(sin_ptr + t, mask=t_ok, other=0.0).to(tl.float32)
    y = tl.join(x1 * c - x2 * sn, x2 * c + x1 * sn)                         # x·cos + rotate(x)·sin
    tl.store(y_ptr + idx, y.to(y_ptr.dtype.element_ty), mask=ok)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0, layout: str = "bhsd",
         interleaved: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """x rotated by the angles of positions offset + s. x: (batch, heads, seq, D) 'bhsd' or (batch, seq, heads, D)
    'bshd', contiguous; cos, sin: (max_pos, D/2), float32 or x's dtype, max_pos >= offset + seq."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D ({layout}), got {x.dim()}-D")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"head_dim must be even, got {d}")
    seq, heads = (x.shape[2], x.shape[1]) if layout == "bhsd" else (x.shape[1], x.shape[2])
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[1] != d // 2 or t.shape[0] < offset + seq:
            raise ValueError(f"{name} must have shape (max_pos >= offset + seq = {offset + seq}, head_dim/2 = "
                             f"{d // 2}), got {tuple(t.shape)}")
        if t.dtype not in (torch.float32, x.dtype):
            raise TypeError(f"{name} must be float32 or x's dtype {x.dtype}, got {t.dtype}")
    out = torch.empty_like(x) if out is None else out
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    for name, t in (("x", x), ("cos", cos), ("sin", sin), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    check_device(x=x, cos=cos, sin=sin, out=out)
    rows = x.numel() // d if d else 0
    if rows == 0:
        return out
    block_p = triton.next_power_of_2(d // 2)
    block_r = max(1, min(ELEMS // (2 * block_p), triton.next_power_of_2(rows)))
    rope_kernel[(triton.cdiv(rows, block_r),)](x, cos, sin, out, rows, seq, heads, offset,
                                              HALF=d // 2, BHSD=layout == "bhsd", INTERLEAVED=bool(interleaved),
                                              BLOCK_R=block_r, BLOCK_P=block_p, num_warps=4)
    return out
