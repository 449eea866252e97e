"""Is the kernel right? Compare with the PyTorch reference computed in float64.

The rules (the same for every family):
- the reference runs on float64 copies of the inputs; the error is ||out - ref|| / ||ref||, and the worst element
  is bounded too: max|out - ref| / rms(ref) <= ELEMENT_FACTOR x the tolerance (a norm alone lets a few wrong elements
  through: at bf16's 3e-2, 0.02% of the elements sign-flipped), the rms taken over the reference's nonzero elements
  (a mostly-zero output, e.g. an embedding gradient over a million rows, must not shrink the scale to nothing);
- tolerances are one explicit table per dtype (TOLERANCE); a float32 version that multiplies in TF32 says so
  (`Version.precision = "tf32"`) and is held to the TF32 row;
- every check draws fresh random inputs for several seeds (never zeros);
- outputs are poisoned (NaN, or a sentinel for integers) before the kernel runs, so an element it never wrote fails
  (a version without out=, e.g. autograd's, runs with every torch.empty NaN-filled);
- NaN or Inf where the reference is finite always fails;
- a failure report lists the worst elements as (index, got, expected).
"""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from . import results
from .registry import Op, Version, shape_label

# Relative-error bounds, ||out - ref|| / ||ref||, against a float64 reference. float32 arithmetic lands near 1e-7 for
# elementwise work and ~1e-6 after long reductions; TF32 keeps 10 mantissa bits (~3e-4); fp16 11 bits (rounding
# the output alone costs ~3e-4); bf16 8 bits (~2e-3 from output rounding, more from rounded operands).
TOLERANCE: dict[str, float] = {
    "float64": 1e-12,
    "float32": 2e-5,
    "tf32": 3e-3,
    "float16": 5e-3,
    "bfloat16": 3e-2,
}
INT_SENTINEL = -(2 ** 31) + 7
# The worst element's error, in units of the reference's RMS, may be at most this many times the tolerance. Honest
# rounding stays far below it: an element's error is ~ulp(dtype) x its own size, and in a random tensor of millions of
# elements the largest is ~5-6 RMS, so the worst element sits at ~6x the norm error; a kernel that writes one element
# wrong (a sign, a stale value, a neighbour's result) is off by ~1-2 RMS: the bound is 0.9 RMS at bf16 (3e-2),
# 6e-4 RMS at float32 (2e-5).
ELEMENT_FACTOR = 30.0


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tolerance(dtype: torch.dtype, precision: str | None = None) -> float:
    return TOLERANCE[precision or dtype_name(dtype)]


@dataclass
class Comparison:
    rel_err: float
    max_abs: float
    nonfinite: int            # NaN/Inf in the output where the reference is finite (poison left unwritten, or overflow)
    worst: list[tuple[tuple[int, ...], float, float]]  # (index, got, expected)
    numel: int
    elem_err: float = 0.0     # max|out - ref| / rms(ref's nonzero elements): the worst element against its scale

    def fails(self, tol: float) -> str:
        """'' if within `tol`, else why not (NaN/Inf, the norm, or one element)."""
        if self.nonfinite:
            return f"{self.nonfinite} of {self.numel} elements non-finite (NaN/Inf: unwritten or overflow)"
        if not (self.rel_err <= tol):
            return f"relative error {self.rel_err:.2e} over tolerance {tol:.0e}"
        if not (self.elem_err <= ELEMENT_FACTOR * tol):
            at = f" at {self.worst[0][0]} (got {self.worst[0][1]!r}, expected {self.worst[0][2]!r})" if self.worst else ""
            return (f"worst element off by {self.elem_err:.2e} x rms(reference, nonzero){at}, over {ELEMENT_FACTOR:g} x the "
                    f"tolerance {tol:.0e}")
        return ""


def compare(out: torch.Tensor, ref: torch.Tensor, k_worst: int = 5, scale: torch.Tensor | None = None) -> Comparison:
    """Relative and max-abs error of `out` against `ref`; any non-finite value where ref is finite counts.

    scale: each element's own size where that is not |ref| (Op.scale: the root-sum-square of the terms an output sums):
    the errors are then relative to it, so an output whose terms cancel is held to the rounding of its terms rather
    than to its small value."""
    if out.shape != ref.shape:
        raise ValueError(f"output has shape {tuple(out.shape)}, reference has {tuple(ref.shape)}")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64).to(o.device)
    bad = ~torch.isfinite(o) & torch.isfinite(r)
    nonfinite = int(bad.sum())
    diff = (o - r).abs()
    diff = torch.where(bad, torch.full_like(diff, math.inf), diff)
    diff = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)  # both NaN/Inf alike: not a kernel error
    max_abs = float(diff.max()) if diff.numel() else 0.0
    d = o - r
    num = float(torch.linalg.vector_norm(torch.where(torch.isfinite(d), d, torch.zeros_like(d)))) if d.numel() else 0.0
    size = r if scale is None else scale.detach().to(torch.float64).to(o.device)
    den = float(torch.linalg.vector_norm(torch.where(torch.isfinite(size), size, torch.zeros_like(size)))) \
        if size.numel() else 0.0
    rel = math.inf if nonfinite else (num / den if den > 0 else num)
    nz = size[torch.isfinite(size) & (size != 0)]
    rms = float(torch.linalg.vector_norm(nz)) / math.sqrt(nz.numel()) if nz.numel() else 0.0
    elem = math.inf if nonfinite else (max_abs / rms if rms > 0 else max_abs)
    worst = []
    if diff.numel():
        flat = diff.flatten()
        k = min(k_worst, flat.numel())
        idx = torch.topk(flat, k).indices.tolist()
        for i in idx:
            nd = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), diff.shape)) if diff.dim() else ()
            worst.append((nd, float(o.flatten()[i]), float(r.flatten()[i])))
    return Comparison(rel, max_abs, nonfinite, worst, o.numel(), elem)


def root_sum_square(reference):
    """An Op.scale for outputs that are sums of products with one factor from each input they depend on (a GEMM, a
    Kronecker layer and their gradients): the reference on squared inputs is each element's Σ term², and its square
    root the size the terms' rounding grows with. An element whose terms cancel (a 1×1 factor's dW is one sum over
    B·N products) is then held to that, not to its small value."""
    def scale(*inputs):
        out = reference(*[t * t for t in inputs])
        return tuple(o.sqrt() for o in out) if isinstance(out, tuple) else out.sqrt()
    return scale


def _flat(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flat(item)]
    if x is None:
        return []
    raise TypeError(f"outputs must be tensors or tuples of tensors, got {type(x).__name__}")


def poison_like(x):
    """Empty outputs of the same structure, filled with NaN (float) or a sentinel (integer)."""
    if isinstance(x, torch.Tensor):
        fill = math.nan if x.is_floating_point() or x.is_complex() else INT_SENTINEL
        return torch.full_like(x, fill)
    return type(x)(poison_like(t) for t in x)


def map_tensors(fn, x):
    """fn applied to every tensor of a nested structure (tuples, lists, dicts); other values pass through."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(map_tensors(fn, t) for t in x)
    if isinstance(x, dict):
        return {k: map_tensors(fn, v) for k, v in x.items()}
    return x


def fresh_copy(x):
    """Clones of the tensors in a nested structure (for versions that update their inputs in place)."""
    return map_tensors(lambda t: t.detach().clone(), x)


def upcast(x, device=None):
    """float64 copies of the floating-point tensors in a nested structure (moved to `device` if given)."""
    return map_tensors(lambda t: t.detach().to(device=device, dtype=torch.float64 if t.is_floating_point()
                                               else t.dtype), x)


@dataclass
class CheckResult:
    op: str
    version: str
    shape: str
    dtype: str
    device: str
    tol: float
    rel_err: float = 0.0
    max_abs: float = 0.0
    passed: bool = True
    seeds: int = 0
    torch_rel_err: float | None = None   # the PyTorch baseline's own error at this dtype, for scale
    problem: str = ""
    worst: list = field(default_factory=list)

    def line(self) -> str:
        status = "ok  " if self.passed else "FAIL"
        te = f"  torch {self.torch_rel_err:.1e}" if self.torch_rel_err is not None else ""
        return (f"{status} {self.op:<14} {self.version:<14} {self.dtype:<9} {self.shape:<28} rel {self.rel_err:.1e} "
                f"(tol {self.tol:.0e})  max|d| {self.max_abs:.1e}{te}" + (f"  <- {self.problem}" if self.problem else ""))

    def details(self) -> str:
        rows = [f"    at {idx}: got {g!r}, expected {e!r}" for idx, g, e in self.worst]
        return "\n".join([self.line()] + rows)


@contextlib.contextmanager
def _empty_is_poisoned():
    """Every torch.empty in the block comes back NaN-filled (integers: their max), on the CPU as on the GPU: PyTorch's
    fill_uninitialized_memory, which acts only in deterministic mode (warn_only: no op refuses to run; the warnings
    that mode gives for nondeterministic ops are not ours to show). For a version that allocates its own outputs
    (autograd, no out=): an element it never writes is NaN. (Refilling the freed blocks of a first run, as before,
    relied on the caching allocator handing them back: the CPU's malloc made no such promise — on the H100 host a
    freed 16 KB block came back holding other data.)"""
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was[0], warn_only=was[1])
            torch.utils.deterministic.fill_uninitialized_memory = fill


def run_version(v: Version, inputs: tuple, poison: bool = True):
    """Run a version; for kernels, into poisoned outputs (with out=), or with every torch.empty NaN-filled (without).
    Returns (outputs, problem-or-'')."""
    if not poison or v.inplace or (v.baseline and not v.takes_out):   # a baseline that takes out= (Triton's) is
        return v.fn(*inputs), ""                                       # poisoned like a kernel
    if not v.takes_out:
        with _empty_is_poisoned():
            return v.fn(*inputs), ""
    probe = v.fn(*inputs)                # learn the output structure
    out = poison_like(probe)
    got = v.fn(*inputs, out=out)
    for a, b in zip(_flat(got), _flat(out)):
        if a.data_ptr() != b.data_ptr():
            return got, "did not write into the out= tensors it was given"
    return got, ""


def check_version(op: Op, v: Version, shape: dict, dtype: torch.dtype, device: torch.device | str,
                  seeds: Iterable[int] = (0, 1, 2), lean: bool = False) -> CheckResult:
    """lean: the float64 reference runs on the CPU and the baseline is not run for scale, so the only kernels launched
    on the GPU are the version's own (for compute-sanitizer, which instruments every launch: the optimizer family's
    references and baselines are thousands of launches a check)."""
    device = torch.device(device)
    res = CheckResult(op.name, v.name, shape_label(shape), dtype_name(dtype), device.type,
                      tol=tolerance(dtype, v.precision_at(dtype)))
    base = None
    if op.baseline and op.baseline != v.name and not lean:
        cands = [b for b in op.versions_for(device, dtype) if b.name == op.baseline]
        base = cands[0] if cands else None
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        inputs = op.make_inputs(shape, dtype, device, gen)
        ref = op.reference(*upcast(inputs, "cpu" if lean else None))
        scales = _flat(op.scale(*upcast(inputs, "cpu" if lean else None))) if op.scale else None
        try:
            got, problem = run_version(v, fresh_copy(inputs) if v.inplace else inputs)
        except Exception as e:  # a kernel that raises on valid input is a failed check, reported, not a crash
            res.passed, res.problem, res.rel_err = False, f"raised {type(e).__name__}: {e}"[:300], math.inf
            return res
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        res.seeds += 1
        if problem:
            res.passed, res.problem = False, problem
        outs, refs = _flat(got), _flat(ref)
        if len(outs) != len(refs):
            res.passed, res.problem = False, f"{len(outs)} outputs, reference has {len(refs)}"
            return res
        for i, (o, r) in enumerate(zip(outs, refs)):
            if lean:
                o = o.cpu()   # compared where the reference is: no comparison kernels on the GPU either
            if not o.is_floating_point():
                c = Comparison(0.0 if torch.equal(o.cpu(), r.cpu()) else math.inf,
                               float((o.cpu().long() - r.cpu().long()).abs().max()) if o.numel() else 0.0,
                               int((o.cpu() == INT_SENTINEL).sum()), [], o.numel())
            else:
                c = compare(o, r, scale=scales[i] if scales else None)
            if c.rel_err > res.rel_err or (math.isnan(c.rel_err)):
                res.rel_err, res.worst = c.rel_err, c.worst
            res.max_abs = max(res.max_abs, c.max_abs)
            if c.nonfinite:
                res.passed = False
                res.problem = res.problem or f"{c.nonfinite} of {c.numel} elements NaN/Inf (unwritten or overflow)"
            elif c.rel_err <= res.tol and c.fails(res.tol):   # the norm passes, one element does not
                res.passed = False
                res.problem = res.problem or c.fails(res.tol)
                res.worst = c.worst
        if base is not None:
            bgot = base.fn(*(fresh_copy(inputs) if base.inplace else inputs))
            err = max(compare(o, r, scale=scales[i] if scales else None).rel_err
                      for i, (o, r) in enumerate(zip(_flat(bgot), refs)) if o.is_floating_point()) \
                if any(o.is_floating_point() for o in _flat(bgot)) else 0.0
            res.torch_rel_err = max(res.torch_rel_err or 0.0, err)
    if not (res.rel_err <= res.tol):
        res.passed = False
        res.problem = res.problem or f"relative error {res.rel_err:.2e} over tolerance {res.tol:.0e}"
    return res


def check_op(op: Op, device: torch.device | str, dtypes=None, versions=None, shapes=None,
             seeds: Iterable[int] = (0, 1, 2), progress: bool = False, lean: bool = False) -> list[CheckResult]:
    """Every (version, dtype, shape) of an op that runs on `device` (lean: see check_version; lean checks our kernels
    only, not baselines: compute-sanitizer is for our code, and racecheck over Triton's kernels ran past 200 s)."""
    out = []
    for dtype in dtypes or op.dtypes:
        if dtype not in op.dtypes:
            continue
        for v in op.versions_for(device, dtype, versions):
            if not v.check or (lean and v.baseline and not versions):
                continue
            for shape in shapes or op.check_shapes:
                r = check_version(op, v, shape, dtype, device, seeds, lean=lean)
                out.append(r)
                if progress or not r.passed:
                    print(("  " if r.passed else "") + (r.line() if r.passed else r.details()), flush=True)
    return out


def assert_op_passes(op: Op, device, **kwargs) -> list[CheckResult]:
    """For tests: check every version of `op` on `device` (kwargs as check_op); fail with every failure's details."""
    rs = check_op(op, device, **kwargs)
    if not rs:
        raise AssertionError(f"{op.family}.{op.name}: no version ran on {device}")
    bad = [r.details() for r in rs if not r.passed]
    if bad:
        raise AssertionError("\n".join(bad))
    return rs


CHECK_COLUMNS = ["family", "op", "version", "dtype", "shape", "device", "device_name", "seeds", "rel_err", "max_abs",
                 "tol", "torch_rel_err", "passed", "problem", "torch", "commit", "timestamp", "run_id"]


def record(results_: list[CheckResult], family: str, device) -> None:
    """Append check outcomes to results/<device>/checks.csv (the evidence behind 'verified')."""
    st = results.stamp(device)
    rows = [{"family": family, "op": r.op, "version": r.version, "dtype": r.dtype, "shape": r.shape,
             "device": r.device, "device_name": st["device_name"], "seeds": r.seeds, "rel_err": r.rel_err,
             "max_abs": r.max_abs, "tol": r.tol, "torch_rel_err": r.torch_rel_err, "passed": r.passed,
             "problem": r.problem, "torch": st["torch"], "commit": st["commit"], "timestamp": st["timestamp"],
             "run_id": st["run_id"]} for r in results_]
    if rows:
        results.append(rows, columns=CHECK_COLUMNS, name="checks.csv")


def assert_close(out: Any, ref: Any, dtype: torch.dtype, precision: str | None = None, what: str = "output",
                 scale: Any = None) -> None:
    """For tests: raise AssertionError with the worst elements unless every output is within tolerance (scale: as
    compare's, one per output)."""
    tol = tolerance(dtype, precision)
    scales = _flat(scale) if scale is not None else None
    for i, (o, r) in enumerate(zip(_flat(out), _flat(ref))):
        c = compare(o, r, scale=scales[i] if scales else None)
        why = c.fails(tol)
        if why:
            worst = "\n".join(f"  at {idx}: got {g!r}, expected {e!r}" for idx, g, e in c.worst)
            raise AssertionError(f"{what}[{i}]: {why} (relative error {c.rel_err:.3e}, tolerance {tol:.0e})\n{worst}")
