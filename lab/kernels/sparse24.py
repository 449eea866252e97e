"""nn.Linear with a 2:4-sparse weight: magnitude pruning, the lab's compressed format, and sparse GEMV/GEMM kernels.

Sources: cuda_src/sparse24/ (sparse24.cuh: the format, the ladder and the napkin math; compress.cu; gemv.cu: v1,
v3; v2.cu; v4.cu), cpp_src/sparse24/sparse24.cpp (binding, named checks), cpp_src/sparse24/cpu.cpp (the C++ CPU
version).

    w24 = prune(linear.weight)          # (out_features, in_features): the 2 largest magnitudes of every 4 kept
    packed = compress(w24)              # Sparse24Weight: values (N, Kp/2) + meta (N, Kp/32) int32, Kp = K up to 32
    y = linear(x, packed, bias)         # x: (..., in_features) bf16/fp16 -> (..., out_features)

Versions: 'cpu' (C++), 'v1' (SIMT: one warp per weight row; the GEMV regime), 'v2' (mma.sp tensor cores; the GEMM
regime), 'v3' (v1 with two rows per warp in flight), 'v4' (wgmma.sp fed by TMA: the Hopper GEMM); None picks by
the number of rows of x (`fastest`).
Baselines: `torch` = F.linear with the pruned weight stored dense (cuBLAS), `cusparselt` = F.linear with
torch.sparse.to_sparse_semi_structured(pruned weight), which on an H100 (sm_90) is cuSPARSELt (torch's CUTLASS path
takes sm_8x only). The accuracy cost of pruning a trained weight is not measured here: the lab checks that the
kernels compute x·Wᵀ + b for the pruned W, against float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import build
from ..registry import Family, Op, Version, register, version_number
from ._common import elem_size, randn

FAMILY = "sparse24"
GEMV_ROWS = 8    # up to this many rows of x the default is the SIMT GEMV (v1), above it v4 (tensor cores)

IDEAS = {
    "v1": "SIMT: one warp per weight row, 16 B of kept values + 2 B of metadata per lane-step, all in flight; x in "
          "shared memory, the 2 x values of a group picked by its nibble",
    "v2": "tensor cores: mma.sp.sync m16n8k32 on 128x128 tiles, ldmatrix of kept values and x, 3-stage cp.async ring",
    "v3": "v1 with two weight rows per warp in flight (at M <= 2): twice the bytes per warp at once (measured slower)",
    "v4": "tensor cores: wgmma.mma_async.sp m64n256k32 fed by TMA, a producer warpgroup and two consumers on 128x256 "
          "tiles, 5-stage mbarrier ring (Hopper; v2 where TMA cannot take x)",
}
CPU_IDEA = "C++: a dot product over the kept values of each row (half the multiplies), rows in parallel"


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


def padded_k(k: int) -> int:
    return -(-k // 32) * 32


@dataclass
class Sparse24Weight:
    """A 2:4-sparse weight (out_features, in_features) in the lab's format (cuda_src/sparse24/sparse24.cuh):
    values (N, Kp/2) hold the 2 kept elements of every group of 4, meta (N, Kp/32) int32 a nibble per group
    (i0 | i1 << 2, the kept columns in increasing order), Kp = in_features rounded up to 32. `semi` is the same weight
    as torch's semi-structured tensor where torch could make one (CUDA only; `semi_error` says why not)."""
    values: torch.Tensor
    meta: torch.Tensor
    in_features: int
    semi: object | None = None
    semi_error: str = "not made (CPU tensors, or make_semi=False)"

    @property
    def out_features(self) -> int:
        return self.values.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to_dense(self) -> torch.Tensor:
        """The (out_features, in_features) weight, decompressed in plain PyTorch (independent of the C++ code)."""
        n, kp = self.values.shape[0], self.values.shape[1] * 2
        shifts = torch.arange(0, 32, 4, device=self.meta.device, dtype=torch.int32)
        nib = ((self.meta.unsqueeze(-1) >> shifts) & 0xF).reshape(n, kp // 4).long()     # (N, Kp/4)
        v = self.values.reshape(n, kp // 4, 2)
        dense = torch.zeros(n, kp // 4, 4, dtype=self.values.dtype, device=self.values.device)
        dense.scatter_(-1, (nib & 3).unsqueeze(-1), v[..., :1])
        dense.scatter_(-1, (nib >> 2).unsqueeze(-1), v[..., 1:])
        return dense.reshape(n, kp)[:, : self.in_features]


# ---- pruning and compression --------------------------------------------------------------------------------------
def prune(w: torch.Tensor) -> torch.Tensor:
    """Magnitude 2:4 pruning along the last dim: in every aligned group of 4 (the last one zero-padded) keep the 2
    largest |w| (ties: the lower column), zero the others. w: (out_features, in_features) -> same shape and dtype."""
    if w.dim() != 2:
        raise ValueError(f"prune: weight must be 2-D (out_features, in_features), got shape {tuple(w.shape)}")
    n, k = w.shape
    kq = -(-k // 4) * 4
    g = F.pad(w, (0, kq - k)).reshape(n, kq // 4, 4)                                   # (N, groups, 4)
    order = torch.argsort(-g.abs().float(), dim=-1, stable=True)[..., :2]              # the 2 largest, stable ties
    keep = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, order, True)
    return torch.where(keep, g, torch.zeros_like(g)).reshape(n, kq)[:, :k].contiguous()


def is_24(w: torch.Tensor) -> bool:
    """Whether every aligned group of 4 along the last dim of a 2-D w holds at most 2 nonzeros."""
    n, k = w.shape
    g = F.pad(w, (0, -(-k // 4) * 4 - k)).reshape(n, -1, 4)
    return bool(((g != 0).sum(-1) <= 2).all())


def compress(w: torch.Tensor, make_semi: bool = False) -> Sparse24Weight:
    """A pruned weight (out_features, in_features), bf16 or fp16, CPU or CUDA -> Sparse24Weight. A group of 4 with
    more than 2 nonzeros is a ValueError naming it (prune first). make_semi: also make torch's semi-structured tensor
    (the `cusparselt` baseline; CUDA only)."""
    n, k = (w.shape[0], w.shape[1]) if w.dim() == 2 else (0, 0)
    kp = padded_k(k)
    values = torch.empty(n, kp // 2, dtype=w.dtype, device=w.device)    # (N, Kp/2): the kept values
    meta = torch.empty(n, kp // 32, dtype=torch.int32, device=w.device)  # (N, Kp/32): 8 nibbles a word
    ext().compress(w, values, meta)
    packed = Sparse24Weight(values, meta, k)
    if make_semi:
        if not w.is_cuda:
            packed.semi_error = "torch's semi-structured sparse tensors need CUDA"
        else:
            try:
                packed.semi = torch.sparse.to_sparse_semi_structured(w)
            except Exception as e:  # noqa: BLE001 — a shape or GPU it refuses: the baseline says so when called
                packed.semi_error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return packed


# ---- wrappers -----------------------------------------------------------------------------------------------------
def fastest(x: torch.Tensor) -> str:
    """The version for this input: 'cpu' on the CPU; on CUDA the GEMV v1 up to GEMV_ROWS rows of x, v4 above (the
    wgmma.sp GEMM, measured faster than v2 at every batch it was timed at on the H100; it runs v2 itself where TMA
    cannot take x or the GPU is not a Hopper). (v3, two rows a warp, was the default for a run and measured slower
    than v1 at batch 1 on the H100: notebook 10.)"""
    if not x.is_cuda:
        return "cpu"
    return "v1" if math.prod(x.shape[:-1]) <= GEMV_ROWS else "v4"


def linear(x: torch.Tensor, weight: Sparse24Weight, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None, version: str | None = None) -> torch.Tensor:
    """y = x @ W.T + bias with W the compressed 2:4 weight. x: (..., in_features) -> (..., out_features)."""
    if not isinstance(weight, Sparse24Weight):
        raise TypeError(f"sparse24.linear: weight must be a Sparse24Weight (from sparse24.compress), got "
                        f"{type(weight).__name__}")
    if out is None:
        out = torch.empty(*x.shape[:-1], weight.out_features, dtype=x.dtype, device=x.device)   # (..., N)
    return ext().linear(x, weight.values, weight.meta, weight.in_features, bias, out,
                        version_number(version or fastest(x)))


# ---- reference and baselines --------------------------------------------------------------------------------------
def linear_ref(x, w, packed, bias=None):
    """The pruned weight stored dense (the reference never reads the compressed format)."""
    return F.linear(x, w, bias)


def linear_torch(x, w, packed, bias=None):
    return F.linear(x, w, bias)          # dense cuBLAS on the pruned weight: what a user runs without sparsity


def linear_cusparselt(x, w, packed, bias=None):
    if packed.semi is None:
        raise ValueError(f"torch's semi-structured tensor is not available for this weight: {packed.semi_error}")
    return F.linear(x, packed.semi, bias)


# ---- ops ----------------------------------------------------------------------------------------------------------
DTYPES = (torch.bfloat16, torch.float16)


def _version(name: str) -> Version:
    fn = lambda x, w, packed, b, out=None: linear(x, packed, b, out=out, version=name)  # noqa: E731
    if name == "cpu":
        return Version("cpu", fn, "cpu", CPU_IDEA)
    return Version(name, fn, "cuda", IDEAS[name], graph=True)


def _baselines(semi: bool) -> list[Version]:
    out = [Version("torch", linear_torch, "any", "F.linear with the pruned weight stored dense (cuBLAS)",
                   baseline=True, takes_out=False, check=False, graph=True)]
    if semi:
        out.append(Version("cusparselt", linear_cusparselt, "cuda", "F.linear with torch.sparse."
                           "to_sparse_semi_structured(pruned weight): cuSPARSELt on sm_90", baseline=True,
                           takes_out=False, check=False))   # it refuses odd shapes; tested where it takes one
    return out


def _inputs(s: dict, dt: torch.dtype, dev, g: torch.Generator, semi: bool = False) -> tuple:
    # x: (M, K); w: (N, K) as nn.Linear stores it, scaled by (K/2)^-1/2 (half its entries survive pruning) so y is O(1),
    # then pruned to 2:4 and compressed (packed); bias: (N,), or None where the shape says bias=0
    x = randn((s["M"], s["K"]), dt, dev, g)
    w = prune(randn((s["N"], s["K"]), dt, dev, g, scale=max(s["K"] / 2, 1) ** -0.5))
    b = randn((s["N"],), dt, dev, g) if s.get("bias", 1) else None
    return x, w, compress(w, make_semi=semi and torch.device(dev).type == "cuda"), b


def _inputs_semi(s, dt, dev, g):
    return _inputs(s, dt, dev, g, semi=True)


def _nbytes(s: dict, dt: torch.dtype) -> float:
    kp = padded_k(s["K"])
    return (s["M"] * s["K"] + s["M"] * s["N"] + s["N"] * s.get("bias", 1) + s["N"] * kp // 2) * elem_size(dt) \
        + s["N"] * kp // 8


def _flops(s: dict, dt: torch.dtype) -> float:
    return 2 * s["M"] * s["N"] * s["K"]


def _shape(m: int, n: int, k: int, bias: int = 1) -> dict:
    return {"M": m, "N": n, "K": k, "bias": bias}


# the dense layer's FLOP count (the sparse MMA skips half); bytes: x, y, bias, the kept values and the metadata
FORMULA = "TFLOP/s = 2·M·N·K / time; bytes = (MK + MN + N + N·Kp/2)·2 + N·Kp/8 B (Kp = K up to a multiple of 32)"
# Small and awkward: 1, primes, K not a multiple of 4 (a partial last group), of 8 (v2's scalar x loads; v4 hands
# those to v2), of 32 (a padded metadata word) or of 64 (a half-empty last stage of v2 and v4); more than one
# 128 x 128 tile of v2 each way; v4: more than one 128 x 256 tile each way and more stages than its ring; no bias.
CHECK = [_shape(*s) for s in [
    (1, 1, 1), (1, 7, 5), (3, 5, 7), (2, 3, 32, 0), (1, 37, 1283, 0), (5, 129, 1281), (33, 65, 17),
    (17, 130, 96), (130, 257, 40, 0), (9, 300, 64), (257, 300, 200), (130, 129, 203, 0), (300, 260, 776)]]
# Larger, checked by the tests: M and N over a tile, K over many stages; the decoder's fc_out at batch 1.
CHECK_LARGE = [_shape(*s) for s in [(1000, 777, 513), (1, 5893, 1280), (300, 1024, 4096, 0), (8, 4096, 4096)]]

SQUARE = 4096
FC_OUT = {"N": 5893, "K": 1280}   # the seq2seq decoder's output layer (cuSPARSELt refuses this shape: see the notebook)
VERSIONS = [_version("cpu"), _version("v1"), _version("v2"), _version("v3"), _version("v4")]
OPS = [
    Op(FAMILY, "linear", _inputs_semi, linear_ref, VERSIONS + _baselines(semi=True), CHECK,
       [_shape(m, SQUARE, SQUARE) for m in (1, 8, 64, 512, 4096)], [_shape(m, 1024, 1024) for m in (1, 64)],
       DTYPES, nbytes=_nbytes, flops=_flops, formula=FORMULA, size_key="M", compute_ceiling="gemm",
       doc="a 4096 x 4096 weight pruned to 2:4 at batch M = 1 .. 4096, against dense cuBLAS and cuSPARSELt"),
    Op(FAMILY, "fc_out", _inputs, linear_ref, VERSIONS + _baselines(semi=False), CHECK,
       [_shape(m, FC_OUT["N"], FC_OUT["K"]) for m in (1, 8, 128, 1024)], [_shape(1, FC_OUT["N"], FC_OUT["K"])],
       DTYPES, nbytes=_nbytes, flops=_flops, formula=FORMULA, size_key="M", compute_ceiling="gemm",
       doc="the decoder's output layer 1280 -> 5893 pruned to 2:4, batch 1 .. 1024, against dense cuBLAS"),
]

register(Family(FAMILY, "2:4 sparse Linear: magnitude pruning, compressed format, SIMT GEMV and mma.sp tensor cores",
                OPS, notebook="notebooks/10_sparse24.ipynb"))
