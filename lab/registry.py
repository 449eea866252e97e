"""Kernel families register themselves here, so the CLI, the tests and the notebooks find them all the same way.

A family module in `lab/kernels/` builds a `Family` of `Op`s and calls `register()`. Adding a family touches no
central list: `lab.kernels` imports every module in its folder.

An Op is one function (square, vector_add, gru_forward, ...): how to make random inputs for a shape, the PyTorch
reference, the versions (kernels and baselines), the shapes to check and to time, and the byte and FLOP formulas
that turn a time into GB/s and TFLOP/s.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

Inputs = tuple  # positional inputs of an op, as made by Op.make_inputs


@dataclass
class Version:
    """One implementation of an op, kernel or baseline.

    fn(*inputs, out=None) for kernels (they write into `out` when given, so a check can poison it first);
    fn(*inputs) for baselines (takes_out=False).
    """
    name: str                              # "v1", "v2", "cpu", "torch", "torch.compile", "cublas", ...
    fn: Callable[..., Any]
    device: str                            # "cuda", "cpu" or "any"
    idea: str = ""                         # one line: what this version adds over the one before
    baseline: bool = False                 # PyTorch/cuBLAS/cuDNN: timed beside the kernels, not a kernel of ours
    takes_out: bool = True
    precision: str | None = None           # "tf32" where a float32 version multiplies in TF32: picks the tolerance;
                                           # at its other dtypes a version computes in the dtype (precision_at)
    dtypes: tuple[torch.dtype, ...] | None = None  # None: every dtype of the op
    graph: bool = False                    # also time it replayed from a CUDA graph (launch-bound code)
    check: bool = True                     # verify it (a baseline that *is* the reference need not be)
    inplace: bool = False                  # fn(*inputs) updates tensors among its inputs and returns them (an
                                           # optimizer step): verify hands it a fresh copy, bench times it as is
    ceiling: str | None = None             # the compute ceiling where it is not the op's (Op.compute_ceiling): a
                                           # version whose FLOPs run in cuBLAS/cuDNN GEMMs ("gemm") beside kernels
                                           # of FP32 FMAs ("fma")

    def runs_on(self, device: torch.device | str) -> bool:
        return self.device in ("any", torch.device(device).type)

    def supports(self, dtype: torch.dtype) -> bool:
        return self.dtypes is None or dtype in self.dtypes

    def precision_at(self, dtype: torch.dtype) -> str | None:
        """What this version multiplies in at `dtype` where that is not the dtype itself: `precision` on float32
        ("tf32"), else None. Precision is a dimension of a version: linear's v10 is TF32 on float32 tensors and bf16 on
        bfloat16 ones, one name."""
        return self.precision if dtype == torch.float32 else None


@dataclass
class Op:
    family: str
    name: str
    make_inputs: Callable[[dict, torch.dtype, torch.device, torch.Generator], Inputs]
    reference: Callable[..., Any]          # plain PyTorch; verify runs it on float64 copies of the inputs
    versions: list[Version]
    check_shapes: list[dict]               # small and awkward: 1, primes, non-multiples of the tile
    bench_shapes: list[dict]               # GPU sizes (big enough to fill the chip)
    cpu_bench_shapes: list[dict] | None = None  # CPU sizes (default: the smaller half of bench_shapes)
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    nbytes: Callable[[dict, torch.dtype], float] | None = None   # fewest bytes moved through memory
    flops: Callable[[dict, torch.dtype], float] | None = None    # floating-point operations (an FMA is 2)
    formula: str = ""                      # the byte/FLOP formulas in words, printed on every figure
    compute_ceiling: str | None = None     # "gemm" (cuBLAS at the version's precision) or "fma" (FP32 FMA probe):
                                           # what %peak is a fraction of; None for memory-bound ops
    size_key: str | None = None            # the shape entry plotted on the x axis of time-against-size
    baseline: str = "torch"                # the version speedups are measured against
    doc: str = ""
    scale: Callable[..., Any] | None = None  # each output element's own size, from the float64 inputs, where |ref|
                                           # is not it (verify.compare): for outputs that are sums of products of
                                           # the inputs, sqrt(reference(inputs²)), the root-sum-square of the terms

    def version(self, name: str) -> Version:
        for v in self.versions:
            if v.name == name:
                return v
        raise KeyError(f"{self.family}.{self.name} has no version {name!r}; versions: "
                       f"{', '.join(v.name for v in self.versions)}")

    def versions_for(self, device, dtype=None, names=None, kernels_only=False) -> list[Version]:
        out = []
        for v in self.versions:
            if not v.runs_on(device) or (dtype is not None and not v.supports(dtype)):
                continue
            if names and v.name not in names:
                continue
            if kernels_only and v.baseline:
                continue
            out.append(v)
        return out

    def shapes_for(self, device, kind: str = "bench") -> list[dict]:
        if kind == "check":
            return self.check_shapes
        if torch.device(device).type == "cpu":
            return self.cpu_bench_shapes or self.bench_shapes[: max(1, len(self.bench_shapes) // 2)]
        return self.bench_shapes


@dataclass
class Family:
    name: str
    title: str
    ops: list[Op]
    notebook: str | None = None
    # Extra benchmarks beyond op x version x shape (a model end to end, an optimizer step): name -> fn(device, ...)
    # returning result rows; run by `python -m lab bench` and the report.
    extras: dict[str, Callable[..., list[dict]]] = field(default_factory=dict)
    # Figures beyond the per-op ones, drawn from the family's recorded rows: fn(device_name) -> path or None; `lab plot`
    # redraws them with the rest.
    plots: list[Callable[[str | None], Any]] = field(default_factory=list)
    needs_gpu: bool = False                # nothing to run without one (the CPU code is still tested)

    def op(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"family {self.name!r} has no op {name!r}; ops: {', '.join(o.name for o in self.ops)}")


_FAMILIES: dict[str, Family] = {}
BROKEN: dict[str, str] = {}  # family modules that failed to import -> why
BROKEN_STUDIES: dict[str, str] = {}  # study modules (lab/studies/) that failed to import -> why (their family stands)
_discovered = False


EXTERNAL: dict[str, str] = {}  # family -> the file that registered it, for families outside lab/kernels/ (a test's)


def register(family: Family) -> Family:
    _FAMILIES[family.name] = family
    caller = sys._getframe(1).f_globals.get("__file__")
    if caller and Path(caller).resolve().parent != Path(__file__).resolve().parent / "kernels":
        EXTERNAL[family.name] = str(Path(caller).resolve())  # lab.isolate's workers import it too
    return family


def attach_extras(family: str, extras: dict[str, Callable[..., list[dict]]]) -> None:
    """A study (lab/studies/<name>.py: end-to-end and one-off benchmarks) attaches its benchmarks to the family
    here, so the family's module never imports its studies; `lab bench --extra` and the report run them."""
    if family not in _FAMILIES:
        raise KeyError(f"attach_extras: no family {family!r} registered yet")
    _FAMILIES[family].extras.update(extras)


def attach_plots(family: str, plots: list[Callable[[str | None], Any]]) -> None:
    """A study's figures, drawn from the family's recorded rows: fn(device_name) -> path or None; `lab plot` redraws
    them with the family's own."""
    if family not in _FAMILIES:
        raise KeyError(f"attach_plots: no family {family!r} registered yet")
    _FAMILIES[family].plots.extend(plots)


def _import_all(package: str, folder: Path, broken: dict[str, str]) -> None:
    for m in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
        if m.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"{package}.{m.name}")
        except Exception as e:  # one broken module must not take the others down; say which and why
            broken[m.name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"lab: module {package.replace('.', '/')}/{m.name}.py failed to import ({broken[m.name]}); "
                          "it is skipped", stacklevel=3)


def _discover() -> None:
    """Import every family module (lab/kernels/*.py registers its family), then lab/studies/*.py (the studies, which
    attach their benchmarks and figures to the families they study; they import the models of lab/models/)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    here = Path(__file__).resolve().parent
    _import_all(f"{__package__}.kernels", here / "kernels", BROKEN)
    _import_all(f"{__package__}.studies", here / "studies", BROKEN_STUDIES)   # a study shares its family's name


def families() -> list[Family]:
    _discover()
    return sorted(_FAMILIES.values(), key=lambda f: f.name)


def get(name: str) -> Family:
    _discover()
    if name in BROKEN:
        raise KeyError(f"family {name!r} failed to import: {BROKEN[name]}")
    if name not in _FAMILIES:
        raise KeyError(f"no kernel family {name!r}; families: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]


def version_number(version: str, tensor: torch.Tensor | None = None) -> int:
    """'cpu' -> 0 (the C++ CPU code), 'v3' -> 3: the integer the C++ bindings take."""
    if version == "cpu":
        return 0
    m = re.fullmatch(r"v(\d+)", version)
    if not m:
        raise ValueError(f"version must be 'cpu' or 'v<N>', got {version!r}")
    return int(m.group(1))


def shape_label(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())
