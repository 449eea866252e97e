"""CUDA basics: square, vector add, a radius-3 1D stencil with a shared-memory halo, and a tiled matmul.

Sources: cuda_src/basics/ (basics.cuh: what the units share; one unit per op: square.cu, vector_add.cu,
stencil_1d.cu, matmul.cu), cpp_src/basics/ (basics.cpp: the binding with the named checks; cpu.cpp: the CPU versions,
no torch headers).
Every wrapper takes `version`: 'v1', 'v2' (CUDA) or 'cpu' (the C++ CPU code); `out` is optional.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import build
from ..registry import Family, Op, Version, register, version_number
from . import _triton
from ._common import elem_size, randn, strict_fp32

if _triton.MISSING is None:   # optional: without triton the `triton` versions are listed on no device, with why
    from ._triton import basics as triton_basics

FAMILY = "basics"
RADIUS = 3


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


def _default(x: torch.Tensor, cuda: str = "v2") -> str:
    return cuda if x.is_cuda else "cpu"


# ---- wrappers ---------------------------------------------------------------------------------------------------
def square(x: torch.Tensor, out: torch.Tensor | None = None, version: str | None = None) -> torch.Tensor:
    """out = x * x (float32/float64, contiguous)."""
    out = torch.empty_like(x) if out is None else out
    return ext().square(x, out, version_number(version or _default(x)))


def vector_add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
               version: str | None = None) -> torch.Tensor:
    """out = a + b (same shape, no broadcasting)."""
    out = torch.empty_like(a) if out is None else out
    # v4: level with torch.add and Triton at 2^26-2^28 on the H100 where v2 is not (notebook 01, results/)
    return ext().vector_add(a, b, out, version_number(version or _default(a, "v4")))


def stencil_1d(x: torch.Tensor, out: torch.Tensor | None = None, version: str | None = None) -> torch.Tensor:
    """out[i] = x[i-3] + ... + x[i+3], zeros outside the array. x: (n,)."""
    out = torch.empty_like(x) if out is None else out
    return ext().stencil_1d(x, out, version_number(version or _default(x)))


def matmul(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
           version: str | None = None) -> torch.Tensor:
    """out = A @ B. A: (M, K), B: (K, N), out: (M, N)."""
    if out is None:
        m = A.shape[0] if A.dim() == 2 else 0
        n = B.shape[1] if B.dim() == 2 else 0
        out = torch.empty(m, n, dtype=A.dtype, device=A.device)
    return ext().matmul(A, B, out, version_number(version or _default(A)))


# ---- references (plain PyTorch; verify runs them in float64) ------------------------------------------------------
def square_ref(x):
    return torch.square(x)


def vector_add_ref(a, b):
    return torch.add(a, b)


def stencil_1d_ref(x):
    # x: (n,) -> conv1d wants (batch, channels, n); a ones(7) filter with zero padding 3 is the stencil
    w = torch.ones(1, 1, 2 * RADIUS + 1, dtype=x.dtype, device=x.device)
    return F.conv1d(x.view(1, 1, -1), w, padding=RADIUS).view(-1)


def matmul_ref(A, B):
    return torch.mm(A, B)


def vector_add_triton(a, b, out=None):
    return triton_basics.vector_add(a, b, out=out)


def matmul_torch(A, B):
    with strict_fp32():
        return torch.mm(A, B)


# ---- ops --------------------------------------------------------------------------------------------------------
def _kernel_versions(fn, ideas: dict[str, str]) -> list[Version]:
    vs = [Version("cpu", lambda *a, out=None: fn(*a, out=out, version="cpu"), "cpu", "C++ with at::parallel_for")]
    for name, idea in ideas.items():
        vs.append(Version(name, (lambda n: lambda *a, out=None: fn(*a, out=out, version=n))(name), "cuda", idea))
    return vs


def _n_inputs(k):
    return lambda s, dt, dev, g: tuple(randn((s["n"],), dt, dev, g) for _ in range(k))


N_CHECK = [{"n": n} for n in (1, 2, 3, 7, 31, 256, 257, 4099, 65537, 1000003)]
N_BENCH = [{"n": 1 << p} for p in (12, 16, 20, 22, 24, 26, 28)]
N_BENCH_CPU = [{"n": 1 << p} for p in (12, 16, 20, 22, 24)]
DT = (torch.float32, torch.float64)

OPS = [
    Op(FAMILY, "square", _n_inputs(1), square_ref,
       _kernel_versions(square, {"v1": "one thread per element", "v2": "16-byte loads in a grid-stride loop"})
       + [Version("torch", torch.square, "any", "torch.square", baseline=True, takes_out=False, check=False)],
       N_CHECK, N_BENCH, N_BENCH_CPU, DT,
       nbytes=lambda s, dt: 2 * s["n"] * elem_size(dt), flops=lambda s, dt: s["n"],
       formula="GB/s = 2·n·sizeof(dtype) / time (read x, write y)", size_key="n"),
    Op(FAMILY, "vector_add", _n_inputs(2), vector_add_ref,
       _kernel_versions(vector_add, {"v1": "one thread per element", "v2": "16-byte loads in a grid-stride loop",
                                     "v3": "grid fills every SM, two 16-byte loads in flight per operand",
                                     "v4": "no grid-stride loop: one block per 1024-float tile"})
       + [Version("torch", torch.add, "any", "torch.add", baseline=True, takes_out=False, check=False),
          _triton.version(vector_add_triton, "Triton: one masked 1024-element block per program "
                          "(lab/kernels/_triton/basics.py)")],
       N_CHECK, N_BENCH, N_BENCH_CPU, DT,
       nbytes=lambda s, dt: 3 * s["n"] * elem_size(dt), flops=lambda s, dt: s["n"],
       formula="GB/s = 3·n·sizeof(dtype) / time (read a, b; write c)", size_key="n"),
    Op(FAMILY, "stencil_1d", _n_inputs(1), stencil_1d_ref,
       _kernel_versions(stencil_1d, {"v1": "7 global reads per output",
                                     "v2": "block tile + halo staged in shared memory"})
       + [Version("torch", stencil_1d_ref, "any", "F.conv1d with a ones(7) filter", baseline=True,
                  takes_out=False, check=False)],
       N_CHECK, N_BENCH, N_BENCH_CPU, DT,
       nbytes=lambda s, dt: 2 * s["n"] * elem_size(dt), flops=lambda s, dt: 2 * RADIUS * s["n"],
       formula="GB/s = 2·n·sizeof(dtype) / time; FLOP = 6·n adds", size_key="n"),
    Op(FAMILY, "matmul",
       lambda s, dt, dev, g: (randn((s["M"], s["K"]), dt, dev, g), randn((s["K"], s["N"]), dt, dev, g)),
       matmul_ref,
       _kernel_versions(matmul, {"v1": "one thread per C element, K-loop from global memory",
                                 "v2": "32x32 shared-memory tiles: 32x reuse of every load"})
       + [Version("torch", matmul_torch, "any", "torch.mm (cuBLAS, TF32 off)", baseline=True, takes_out=False,
                  check=False)],
       [{"M": m, "K": k, "N": n} for m, k, n in
        [(1, 1, 1), (1, 7, 1), (3, 5, 7), (33, 17, 65), (100, 77, 51), (128, 128, 128), (257, 129, 31),
         (64, 1000, 3)]],
       [{"M": n, "K": n, "N": n} for n in (128, 256, 512, 1024, 2048, 4096)],
       [{"M": n, "K": n, "N": n} for n in (128, 256, 512)], DT,
       nbytes=lambda s, dt: (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"]) * elem_size(dt),
       flops=lambda s, dt: 2 * s["M"] * s["N"] * s["K"],
       formula="TFLOP/s = 2·M·N·K / time; bytes = (MK + KN + MN)·sizeof(dtype)", size_key="M",
       compute_ceiling="gemm"),
]

register(Family(FAMILY, "CUDA basics: square, vector add, 1D stencil, tiled matmul", OPS,
                notebook="notebooks/01_cuda_basics.ipynb"))
