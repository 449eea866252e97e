"""Helpers the family modules share: random inputs, version numbers, the module handle."""
from __future__ import annotations

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
