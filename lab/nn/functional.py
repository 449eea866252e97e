"""Functional forms of the lab's kernels (lab.nn.functional.rope)."""
from __future__ import annotations

import torch

from ..kernels import rope as _rope


def rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0,
         layout: str = "bhsd", interleaved: bool = False, version: str | None = None):
    """Rotary position embedding of q and k (one launch for both), or of q alone when k is None; differentiable in q
    and k (the backward rotates the gradients by -angle). q: (batch, heads, seq, head_dim) ("bhsd") or (batch, seq,
    heads, head_dim) ("bshd"); k may have fewer heads (grouped-query attention). cos/sin: (max_pos, head_dim / 2)
    tables (lab.kernels.rope.rope_tables), constants. Positions offset .. offset + seq - 1. Returns (q_rot, k_rot), or
    q_rot."""
    return _rope.apply_rope(q, k, cos, sin, offset, layout, interleaved, version)


rope_tables = _rope.rope_tables
