"""Helpers the family modules share: random inputs, version numbers, the module handle."""
from __future__ import annotations

import contextlib

import torch


def randn(shape, dtype: torch.dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Standard-normal values drawn on the CPU from `gen` (the same numbers on every device), then moved.

    Never zeros: zeros hide unwritten outputs and wrong indexing, and can even run faster than real data.
    """
    x = torch.randn(shape, generator=gen, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    if scale != 1.0:
        x = x * scale
    return x.to(dtype).to(device)


def uniform(shape, lo: float, hi: float, dtype: torch.dtype, device, gen: torch.Generator) -> torch.Tensor:
    x = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    return x.to(dtype).to(device)


def elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@contextlib.contextmanager
def matmul_tf32(enabled: bool):
    """cuBLAS float32 products with TF32 on or off for the duration: baselines must compute at the precision of the
    versions they are timed beside (strict fp32 for SIMT kernels, TF32 for the TF32 rung)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def strict_fp32():
    return matmul_tf32(False)
