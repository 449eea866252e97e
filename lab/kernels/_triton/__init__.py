"""Triton versions of the families' kernels, written here: one module per family (basics.py, linear.py, rope.py,
optim.py), each with its @triton.jit kernels and the launcher that checks the inputs and picks the grid.

The folder starts with "_" so the registry's discovery (lab/kernels/*, names without a leading underscore) never
takes it for a family. A family module imports its Triton module only when triton imports (`MISSING is None`) and
registers a version named `triton` (STYLE.md: baselines are named for what they are) through `version()`.

Without triton the version is still listed, on no device, with the reason in its idea: it is skipped, not failed.
On a machine without a GPU the versions (device "cuda") are skipped like every CUDA version; the kernels still run on
CPU tensors in Triton's interpreter, TRITON_INTERPRET=1, which triton reads when @triton.jit decorates: the variable
must be set before a kernel module is imported (tests/test_triton.py runs them in a child process so).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from ...registry import Version

try:
    import triton  # noqa: F401  (the kernel modules import it again; here only: does it import?)
    MISSING: str | None = None
except ImportError as e:   # an optional dependency: the families stand without it
    MISSING = f"triton is not importable ({e}); pip install triton (Linux, CUDA)"

NO_DEVICE = "none"   # Version.device where triton is missing: runs_on() is False everywhere, so it is skipped


def interpreting() -> bool:
    """Triton's interpreter is on (TRITON_INTERPRET=1 when the kernels were decorated): CPU tensors are accepted."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_device(**tensors: torch.Tensor | None) -> None:
    """Every tensor on CUDA (any device under the interpreter), all on one device."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not interpreting() and not t.is_cuda:
            raise ValueError(f"{name} is on the {t.device.type.upper()}: the Triton kernels run on CUDA tensors "
                             "(CPU tensors only in Triton's interpreter, TRITON_INTERPRET=1)")
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise ValueError(f"{name} must be on the same device as {first[0]} ({first[1]}), got {t.device}")


def _missing(*args: Any, **kwargs: Any):
    raise RuntimeError(MISSING)


def version(fn: Callable[..., Any], idea: str, name: str = "triton", **kw: Any) -> Version:
    """The Version of a Triton kernel: a baseline by name (not a rung of ours), checked like every version, timed
    beside the CUDA rungs; on no device where triton does not import, and saying why."""
    kw = {"baseline": True, "check": True, **kw}
    if MISSING:
        return Version(name, _missing, NO_DEVICE, f"{idea} [skipped: {MISSING}]", **kw)
    return Version(name, fn, "cuda", idea, **kw)
