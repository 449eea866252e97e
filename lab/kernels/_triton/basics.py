"""basics in Triton: vector_add, out = a + b (float32, float64), one masked 1-D block per program.

What Triton does for free (its SASS for sm_90, read in notebook 01 and asserted in tests/test_triton.py): the 16-byte
loads of CUDA v2 where the pointers are 16-byte aligned and n is a multiple of 16 (it specializes on both at launch;
without n's divisibility the mask breaks the vectors up into 4-byte accesses), and the tail as a mask instead of a
scalar cleanup loop. What it does not do: the grid-stride loop (one
program per block; a 2^28 vector is 2^18 programs), which the hand-written v2 uses to launch one wave.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import check_device

BLOCK = 1024   # elements per program: 4 warps x 32 lanes x 8 elements (two 16-B loads per operand per lane at fp32)


@triton.jit
def vector_add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)   # int64: past 2^31 elements the offset must not wrap
    mask = offs < n                                        # the last block's tail
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a + b, mask=mask)


def vector_add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = a + b (same shape and dtype, contiguous, no broadcasting)."""
    if a.shape != b.shape:
        raise ValueError(f"b must have the same shape as a = {tuple(a.shape)}, got {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"a and b must both be float32 or float64, got {a.dtype} and {b.dtype}")
    out = torch.empty_like(a) if out is None else out
    if out.shape != a.shape or out.dtype != a.dtype:
        raise ValueError(f"out must have a's shape {tuple(a.shape)} and dtype {a.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    for name, t in (("a", a), ("b", b), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    check_device(a=a, b=b, out=out)
    n = a.numel()
    if n:
        vector_add_kernel[(triton.cdiv(n, BLOCK),)](a, b, out, n, BLOCK=BLOCK, num_warps=4)
    return out
