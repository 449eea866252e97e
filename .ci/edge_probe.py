#!/usr/bin/env python
"""Edge-case probe of every kernel family's public entry points.

    python .ci/edge_probe.py --device cpu|cuda [--families a,b,...] [--no-isolate] [--timeout S] [-q]

Each case runs one public wrapper (lab.kernels.<family>) with one version and one unusual input, and is reported as
  ok     the result matches a float64 PyTorch reference (computed on the CPU) within lab.verify's tolerance for the
         dtype/precision (verify.tolerance, verify.compare: norm and worst-element bounds), with the right shape,
         dtype and device, and NaN/Inf wherever the reference has them;
  error  a Python exception with a clear message (type and first line printed); where the input is valid (the
         reference computes it) the line is marked [refused valid input];
  BAD    a crash-like error (CUDA error, internal assert, an exception with no helpful message), a result for an
         input the reference refuses (e.g. an out-of-range index read silently), a wrong value, a finite value where
         the reference is NaN/Inf, NaN/Inf where the reference is finite, or a wrong shape/dtype/device.

On cuda every compiled CUDA version of each op runs (the registry's versions_for('cuda', kernels_only=True)); on cpu
the C++ CPU versions. After each CUDA case torch.cuda.synchronize() runs inside the case, so an asynchronous error is
the case's. A CUDA error that poisons the context stops that process's CUDA cases (the case is named). Each family
runs in its own subprocess (unless --no-isolate), so a segfault or hang is reported as BAD for the case that was
running, and a poisoned context stops only that family. Exit status 1 if any case is BAD.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab import registry, verify  # noqa: E402

FAMILIES = ["basics", "linear", "embedding", "rope", "kron", "optim", "gru", "sparse24"]
f16, bf16, f32, f64, i32, i64 = torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64

# An exception is crash-like (BAD) when its message says CUDA failed or an internal invariant broke, or it has no
# message that helps the caller.
CRASH_RE = re.compile(r"CUDA error|cuda runtime error|cudaError|illegal memory access|device-side assert|"
                      r"misaligned address|unspecified launch failure|illegal instruction|launch failure|"
                      r"CUBLAS_STATUS|CUDNN_STATUS|INTERNAL ASSERT|Segmentation|std::bad_alloc|basic_string|"
                      r"_M_range_check|Unknown C\+\+ exception|invalid configuration argument|"
                      r"too many resources requested|invalid argument$", re.I)
UNHELPFUL_RE = re.compile(r"^(tuple|list|string) index out of range$|has no attribute|division by zero|"
                          r"referenced before assignment|is not defined$|not subscriptable|object is not iterable|"
                          r"NoneType", re.I)
UNCLEAR_TYPES = (AttributeError, ZeroDivisionError, UnboundLocalError, NameError, AssertionError, SystemError,
                 MemoryError, RecursionError)


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:240] if s else ""


# ---- tensors ----------------------------------------------------------------------------------------------------
def flat(x) -> list:
    """The tensors of a nested output (lab.verify's flattening); an output that is not tensors comes back whole, to
    be reported."""
    try:
        return verify._flat(x)
    except TypeError:
        return [x]


def up(x):
    """float64 CPU copies of the floating tensors of a nested structure (integer tensors: CPU copies). Always copies
    (verify.upcast returns a float64 CPU tensor itself, which an in-place case would then change under the
    reference)."""
    return verify.map_tensors(lambda t: t.detach().to("cpu", torch.float64 if t.is_floating_point() else t.dtype,
                                                        copy=True), x)


def clone(x):
    return verify.fresh_copy(x)


def invalid(why: str):
    """A reference for an input that has no result: returning one is BAD."""
    def f():
        raise ValueError(why)
    return f


def misaligned(t: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """The same values at a storage offset of `offset` elements: a 16-byte vector load would be misaligned."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    v = buf[offset:].view(t.shape)
    v.copy_(t)
    return v


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values, not contiguous: last two dims transposed in memory (2-D+), or every other element (1-D)."""
    if t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    big = torch.empty(2 * t.numel(), dtype=t.dtype, device=t.device)
    big[::2] = t
    return big[::2]


def with_nan(t: torch.Tensor, where=(0,), inf_at=None) -> torch.Tensor:
    t = t.clone()
    f = t.view(-1)
    for i in where:
        f[i % f.numel()] = math.nan
    if inf_at is not None:
        for i in inf_at:
            f[i % f.numel()] = math.inf
    return t


# ---- the probe --------------------------------------------------------------------------------------------------
class Probe:
    def __init__(self, device: str, quiet: bool = False, progress: str | None = None):
        self.dev = torch.device(device)
        self.cuda = self.dev.type == "cuda"
        self.quiet = quiet
        self.progress = progress
        self.counts = {"ok": 0, "error": 0, "BAD": 0}
        self.bad: list[str] = []
        self.refused: list[str] = []
        self.skipped = 0
        self.poisoned_by: str | None = None
        self.gen = torch.Generator().manual_seed(1234)
        self.family = ""

    # inputs (drawn on the CPU from one seeded generator, then moved)
    def seed(self, s: int):
        self.gen.manual_seed(s)

    def rn(self, *shape, dtype=f32, scale=1.0, device=None):
        x = torch.randn(shape, generator=self.gen, dtype=f64) * scale
        return x.to(dtype).to(device or self.dev)

    def ri(self, lo, hi, *shape, dtype=i64, device=None):
        return torch.randint(lo, hi, shape, generator=self.gen).to(dtype).to(device or self.dev)

    def other_device(self) -> torch.device:
        return torch.device("cpu")

    def versions(self, family: str, op: str, dtype=None) -> list[registry.Version]:
        o = registry.get(family).op(op)
        return [v for v in o.versions_for(self.dev, dtype, kernels_only=True)]

    def tol(self, v: registry.Version | None, dtype) -> float:
        if dtype not in (f16, bf16, f32, f64):
            dtype = f32
        return verify.tolerance(dtype, v.precision_at(dtype) if v is not None else None)

    # reporting
    def _log(self, kind: str, text: str):
        """The progress file (isolated runs): S<tab>label when a case starts, R<tab>status<tab>line when it is
        reported, F<tab>line for a refused valid input; what the parent reads if this process dies."""
        if self.progress:
            with open(self.progress, "a") as fh:
                fh.write(f"{kind}\t{' '.join(text.splitlines())}\n")

    def _report(self, status: str, label: str, msg: str = ""):
        self.counts[status] += 1
        line = f"{status:<5} {label}" + (f"  -> {msg}" if msg else "")
        self._log("R", f"{status}\t{line}")
        if status == "BAD":
            self.bad.append(line)
        if status != "ok" or not self.quiet:
            print(line, flush=True)

    def _cuda_alive(self) -> bool:
        try:
            torch.cuda.synchronize()
            return float(torch.ones(4, device=self.dev).add_(1).sum().item()) == 8.0
        except Exception:  # noqa: BLE001
            return False

    def case(self, label: str, run, ref=None, *, dtype=None, tol=None, valid=True, scale=None, device=None,
             check=None):
        """run() -> outputs; ref() -> float64 expected outputs (or raises: the input is invalid); dtype: the expected
        output dtype (one for all, or a list); tol: float or a list per output; valid: the input is legal (a raise is
        then marked [refused valid input]); scale(): verify.compare's per-element scales; check(got) -> '' or why
        (extra checks)."""
        label = f"{self.family}: {label}"
        if self.poisoned_by is not None:
            self.skipped += 1
            return
        self._log("S", label)
        try:
            got = run()
            if self.cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            self._exception(label, e, ref, valid)
            return
        # it returned: what should it have returned?
        try:
            exp = ref() if ref is not None else None
        except Exception as e:  # noqa: BLE001
            self._report("BAD", label, f"returned a result, but the input is invalid (reference raises "
                                       f"{type(e).__name__}: {first_line(e)}); expected a clear error")
            return
        try:
            why = self._verify(got, exp, dtype, tol, scale, device or self.dev)
            if not why and check is not None:
                why = check(got)
        except Exception as e:  # noqa: BLE001
            why = f"(probe) verification raised {type(e).__name__}: {first_line(e)}"
        if why:
            self._report("BAD", label, why)
        else:
            self._report("ok", label)

    def _exception(self, label, e, ref, valid):
        msg = first_line(e)
        text = f"{type(e).__name__}: {msg}"
        crash = bool(CRASH_RE.search(str(e))) or isinstance(e, UNCLEAR_TYPES) or not msg or \
            bool(UNHELPFUL_RE.search(msg))
        if self.cuda and (crash or "CUDA" in str(e) or "cuda" in msg.lower()) and not self._cuda_alive():
            self._report("BAD", label, f"{text}  [CUDA context poisoned: the remaining CUDA cases of this process are "
                                       "skipped]")
            self.poisoned_by = label
            return
        if crash:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
            self._report("BAD", label, f"crash-like / unhelpful error: {text}{where}")
            return
        refused = False
        if valid and ref is not None:
            try:
                ref()
                refused = True
            except Exception:  # noqa: BLE001
                refused = False
        if refused:
            self.refused.append(f"{label}  -> {text}")
            self._log("F", f"{label}  -> {text}")
        self._report("error", label, text + ("  [refused valid input]" if refused else ""))

    def _verify(self, got, exp, dtype, tol, scale, device) -> str:
        gl, el = flat(got), flat(exp)
        if exp is None:
            return ""
        if len(gl) != len(el):
            return f"{len(gl)} outputs, the reference has {len(el)}"
        scales = flat(scale()) if scale is not None else None
        for i, (g, e) in enumerate(zip(gl, el)):
            tag = f"output {i}" if len(gl) > 1 else "output"
            if not isinstance(g, torch.Tensor):
                return f"{tag} is a {type(g).__name__}, not a tensor"
            if tuple(g.shape) != tuple(e.shape):
                return f"{tag} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
            dt = dtype[i] if isinstance(dtype, (list, tuple)) else dtype
            if dt is not None and g.dtype != dt:
                return f"{tag} has dtype {g.dtype}, expected {dt}"
            dev = device[i] if isinstance(device, (list, tuple)) else device
            if g.device.type != torch.device(dev).type:
                return f"{tag} is on {g.device}, expected {dev}"
            t = tol[i] if isinstance(tol, (list, tuple)) else tol
            if t is None:
                t = self.tol(None, g.dtype)
            o = g.detach().cpu()
            if not o.is_floating_point():
                if not torch.equal(o.long(), e.cpu().long()):
                    return f"{tag} differs from the reference (integers)"
                continue
            o = o.double()
            r = e.detach().cpu().double()
            nan_lost = torch.isnan(r) & ~torch.isnan(o)
            if nan_lost.any():
                j = int(nan_lost.flatten().nonzero()[0])
                idx = tuple(int(k) for k in torch.unravel_index(torch.tensor(j), r.shape))
                return (f"{tag}: {int(nan_lost.sum())} of {r.numel()} elements are not NaN where the reference is NaN "
                        f"(first at {idx}: got {o.flatten()[j].item()!r})")
            inf_lost = torch.isinf(r) & torch.isfinite(o)
            if inf_lost.any():
                j = int(inf_lost.flatten().nonzero()[0])
                return (f"{tag}: {int(inf_lost.sum())} elements finite where the reference is Inf (first flat index "
                        f"{j}: got {o.flatten()[j].item()!r}, expected {r.flatten()[j].item()!r})")
            c = verify.compare(o, r, scale=scales[i] if scales else None)
            why = c.fails(t)
            if why:
                worst = "; ".join(f"{idx}: got {a:.6g}, expected {b:.6g}" for idx, a, b in c.worst[:3])
                return f"{tag}: {why} (rel {c.rel_err:.2e}, tol {t:.0e}; worst {worst})"
        return ""

    def summary(self) -> dict:
        return {"counts": self.counts, "bad": self.bad, "refused": self.refused, "skipped": self.skipped,
                "poisoned_by": self.poisoned_by}


# =================================================================================================================
# basics: square, vector_add, stencil_1d, matmul
# =================================================================================================================
def probe_basics(P: Probe):
    from lab.kernels import basics as B
    fam = "basics"
    for dt in (f32, f64):
        for v in P.versions(fam, "square", dt):
            t, nm = P.tol(v, dt), f"square {v.name} {str(dt)[6:]}"
            for n in (1, 3, 7, 33):
                x = P.rn(n, dtype=dt)
                P.case(f"{nm} n={n}", lambda: B.square(x, version=v.name), lambda: up(x) ** 2, dtype=dt, tol=t)
            x = P.rn(3, 5, dtype=dt)
            P.case(f"{nm} 2-D (3,5)", lambda: B.square(x, version=v.name), lambda: up(x) ** 2, dtype=dt, tol=t)
            x = P.rn(0, dtype=dt)
            P.case(f"{nm} empty n=0", lambda: B.square(x, version=v.name), lambda: up(x) ** 2, dtype=dt, tol=t,
                   valid=False)
            x = P.rn(37, dtype=dt)
            xn = noncontig(x)
            P.case(f"{nm} non-contiguous x[::2]", lambda: B.square(xn, version=v.name), lambda: up(xn) ** 2,
                   dtype=dt, tol=t)
            for n in (5, 37, 1027):
                xm = misaligned(P.rn(n, dtype=dt))
                P.case(f"{nm} misaligned x (offset 1 elem) n={n}", lambda: B.square(xm, version=v.name),
                       lambda: up(xm) ** 2, dtype=dt, tol=t)
                om = misaligned(torch.zeros(n, dtype=dt, device=P.dev))
                x = P.rn(n, dtype=dt)
                P.case(f"{nm} misaligned out= n={n}", lambda: B.square(x, out=om, version=v.name),
                       lambda: up(x) ** 2, dtype=dt, tol=t)
            x = with_nan(P.rn(41, dtype=dt), (3, 17), inf_at=(9,))
            P.case(f"{nm} NaN/Inf in x", lambda: B.square(x, version=v.name), lambda: up(x) ** 2, dtype=dt, tol=t)
            x = P.rn(9, dtype=dt)
            P.case(f"{nm} out=x (in place)", lambda: B.square(x, out=x, version=v.name),
                   (lambda xx: (lambda: xx ** 2))(up(x)), dtype=dt, tol=t, valid=False)
    for v in P.versions(fam, "square"):
        for bad_dt in (i32, f16):
            x = (torch.arange(1, 8, dtype=bad_dt, device=P.dev))
            P.case(f"square {v.name} dtype {bad_dt}", lambda: B.square(x, version=v.name), lambda: up(x) ** 2,
                   dtype=bad_dt, valid=False)
        if P.cuda:
            x = P.rn(8, device="cpu")
            P.case(f"square {v.name} CPU tensor", lambda: B.square(x, version=v.name), lambda: up(x) ** 2,
                   valid=False)
            x, o = P.rn(8), torch.empty(8, device="cpu")
            P.case(f"square {v.name} out= on CPU", lambda: B.square(x, out=o, version=v.name), lambda: up(x) ** 2,
                   valid=False)
    if not P.cuda:
        x = P.rn(8)
        P.case("square version 'v2' on CPU tensors", lambda: B.square(x, version="v2"), lambda: up(x) ** 2,
               valid=False)

    for dt in (f32, f64):
        for v in P.versions(fam, "vector_add", dt):
            t, nm = P.tol(v, dt), f"vector_add {v.name} {str(dt)[6:]}"
            for n in (1, 3, 7, 33, 1029):
                a, b = P.rn(n, dtype=dt), P.rn(n, dtype=dt)
                P.case(f"{nm} n={n}", lambda: B.vector_add(a, b, version=v.name), lambda: up(a) + up(b), dtype=dt,
                       tol=t)
            a, b = P.rn(0, dtype=dt), P.rn(0, dtype=dt)
            P.case(f"{nm} n=0", lambda: B.vector_add(a, b, version=v.name), lambda: up(a) + up(b), dtype=dt, tol=t,
                   valid=False)
            for n in (6, 1030):
                a, b = misaligned(P.rn(n, dtype=dt)), P.rn(n, dtype=dt)
                P.case(f"{nm} a misaligned, b aligned n={n}", lambda: B.vector_add(a, b, version=v.name),
                       lambda: up(a) + up(b), dtype=dt, tol=t)
                a, b = P.rn(n, dtype=dt), misaligned(P.rn(n, dtype=dt), 3 if dt == f32 else 1)
                P.case(f"{nm} b misaligned n={n}", lambda: B.vector_add(a, b, version=v.name),
                       lambda: up(a) + up(b), dtype=dt, tol=t)
            a, b = P.rn(12, dtype=dt), P.rn(12, dtype=dt)
            bn = noncontig(b)
            P.case(f"{nm} non-contiguous b", lambda: B.vector_add(a, bn, version=v.name), lambda: up(a) + up(bn),
                   dtype=dt, tol=t)
            a, b = with_nan(P.rn(21, dtype=dt), (0, 20), inf_at=(5,)), with_nan(P.rn(21, dtype=dt), (7,))
            P.case(f"{nm} NaN/Inf", lambda: B.vector_add(a, b, version=v.name), lambda: up(a) + up(b), dtype=dt,
                   tol=t)
            a, b = P.rn(5, dtype=dt), P.rn(1, dtype=dt)
            P.case(f"{nm} broadcast b (1,)", lambda: B.vector_add(a, b, version=v.name), lambda: up(a) + up(b),
                   dtype=dt, tol=t, valid=False)
    for v in P.versions(fam, "vector_add"):
        a, b = P.rn(6), P.rn(6, dtype=f64)
        P.case(f"vector_add {v.name} mixed f32 + f64", lambda: B.vector_add(a, b, version=v.name),
               lambda: up(a) + up(b), dtype=f32, valid=False)
        if P.cuda:
            a, b = P.rn(6), P.rn(6, device="cpu")
            P.case(f"vector_add {v.name} b on CPU", lambda: B.vector_add(a, b, version=v.name),
                   lambda: up(a) + up(b), valid=False)

    ref_st = B.stencil_1d_ref
    for dt in (f32, f64):
        for v in P.versions(fam, "stencil_1d", dt):
            t, nm = P.tol(v, dt), f"stencil_1d {v.name} {str(dt)[6:]}"
            for n in (1, 2, 3, 6, 7, 33, 257):
                x = P.rn(n, dtype=dt)
                P.case(f"{nm} n={n}", lambda: B.stencil_1d(x, version=v.name), lambda: ref_st(up(x)), dtype=dt,
                       tol=t)
            x = P.rn(0, dtype=dt)
            P.case(f"{nm} n=0", lambda: B.stencil_1d(x, version=v.name), lambda: up(x).clone(), dtype=dt, tol=t,
                   valid=False)
            for n in (5, 300):
                xm = misaligned(P.rn(n, dtype=dt))
                P.case(f"{nm} misaligned x n={n}", lambda: B.stencil_1d(xm, version=v.name),
                       lambda: ref_st(up(xm)), dtype=dt, tol=t)
            x = with_nan(P.rn(40, dtype=dt), (20,))
            P.case(f"{nm} NaN at 20", lambda: B.stencil_1d(x, version=v.name), lambda: ref_st(up(x)), dtype=dt, tol=t)
            x = P.rn(300, dtype=dt)
            xr = up(x)
            P.case(f"{nm} out=x (aliased) n=300", lambda: B.stencil_1d(x, out=x, version=v.name),
                   lambda: ref_st(xr), dtype=dt, tol=t, valid=False)
            x = P.rn(3, 4, dtype=dt)
            P.case(f"{nm} 2-D x", lambda: B.stencil_1d(x, version=v.name), lambda: ref_st(up(x)), dtype=dt,
                   valid=False)

    for dt in (f32, f64):
        for v in P.versions(fam, "matmul", dt):
            t, nm = P.tol(v, dt), f"matmul {v.name} {str(dt)[6:]}"
            for m, k, n in ((1, 1, 1), (1, 33, 1), (3, 1, 7), (7, 3, 33), (33, 65, 3)):
                A, Bm = P.rn(m, k, dtype=dt), P.rn(k, n, dtype=dt)
                P.case(f"{nm} M,K,N={m},{k},{n}", lambda: B.matmul(A, Bm, version=v.name), lambda: up(A) @ up(Bm),
                       dtype=dt, tol=t)
            for m, k, n in ((0, 3, 4), (3, 0, 4), (3, 4, 0)):
                A, Bm = P.rn(m, k, dtype=dt), P.rn(k, n, dtype=dt)
                P.case(f"{nm} empty M,K,N={m},{k},{n}", lambda: B.matmul(A, Bm, version=v.name),
                       lambda: up(A) @ up(Bm), dtype=dt, tol=t, valid=False)
            A, Bm = P.rn(5, 6, dtype=dt), P.rn(7, 6, dtype=dt).t()
            P.case(f"{nm} B = W.t() (non-contiguous)", lambda: B.matmul(A, Bm, version=v.name),
                   lambda: up(A) @ up(Bm), dtype=dt, tol=t)
            A, Bm = misaligned(P.rn(9, 34, dtype=dt)), misaligned(P.rn(34, 33, dtype=dt))
            P.case(f"{nm} misaligned A and B", lambda: B.matmul(A, Bm, version=v.name), lambda: up(A) @ up(Bm),
                   dtype=dt, tol=t)
            A, Bm = with_nan(P.rn(6, 5, dtype=dt), (7,), inf_at=(22,)), P.rn(5, 4, dtype=dt)
            P.case(f"{nm} NaN/Inf in A", lambda: B.matmul(A, Bm, version=v.name), lambda: up(A) @ up(Bm), dtype=dt,
                   tol=t)
            A, Bm = P.rn(40, 40, dtype=dt), P.rn(40, 40, dtype=dt)
            Ar, Br = up(A), up(Bm)
            P.case(f"{nm} out=A (aliased, 40x40)", lambda: B.matmul(A, Bm, out=A, version=v.name),
                   lambda: Ar @ Br, dtype=dt, tol=t, valid=False)
    for v in P.versions(fam, "matmul"):
        A, Bm = P.rn(3, 4), P.rn(4, 5, dtype=f64)
        P.case(f"matmul {v.name} mixed f32 @ f64", lambda: B.matmul(A, Bm, version=v.name), lambda: up(A) @ up(Bm),
               valid=False)
        A, Bm = P.rn(3, 4), P.rn(5, 5)
        P.case(f"matmul {v.name} K mismatch", lambda: B.matmul(A, Bm, version=v.name), lambda: up(A) @ up(Bm),
               valid=False)
        if P.cuda:
            A, Bm = P.rn(3, 4), P.rn(4, 5, device="cpu")
            P.case(f"matmul {v.name} B on CPU", lambda: B.matmul(A, Bm, version=v.name), lambda: up(A) @ up(Bm),
                   valid=False)


# =================================================================================================================
# linear: linear (GEMM ladder), gemv
# =================================================================================================================
def probe_linear(P: Probe):
    from lab.kernels import linear as L
    fam = "linear"

    def ref(x, w, b):
        return lambda: F.linear(up(x), up(w), up(b) if b is not None else None)

    for opname, fn in (("linear", L.linear), ("gemv", L.gemv)):
        for dt in (f32, bf16):
            for v in P.versions(fam, opname, dt):
                t, nm = P.tol(v, dt), f"{opname} {v.name} {str(dt)[6:]}"

                def run(x, w, b, **kw):
                    return lambda: fn(x, w, b, version=v.name, **kw)
                for m, n, k, bias in ((1, 1, 1, 1), (1, 3, 7, 0), (3, 7, 33, 1), (7, 33, 3, 1), (2, 5, 130, 0)):
                    x, w = P.rn(m, k, dtype=dt), P.rn(n, k, dtype=dt, scale=k ** -0.5)
                    b = P.rn(n, dtype=dt) if bias else None
                    P.case(f"{nm} M,N,K={m},{n},{k} bias={bias}", run(x, w, b), ref(x, w, b), dtype=dt, tol=t)
                x, w, b = P.rn(2, 3, 9, dtype=dt), P.rn(5, 9, dtype=dt, scale=1 / 3), P.rn(5, dtype=dt)
                P.case(f"{nm} 3-D x (2,3,9)", run(x, w, b), ref(x, w, b), dtype=dt, tol=t)
                x = P.rn(9, dtype=dt)
                P.case(f"{nm} 1-D x (9,)", run(x, w, b), ref(x, w, b), dtype=dt, tol=t)
                x = P.rn(0, 9, dtype=dt)
                P.case(f"{nm} M=0", run(x, w, b), ref(x, w, b), dtype=dt, tol=t, valid=False)
                x, w0 = P.rn(4, 0, dtype=dt), P.rn(5, 0, dtype=dt)
                P.case(f"{nm} K=0 (y = bias)", run(x, w0, b), ref(x, w0, b), dtype=dt, tol=t, valid=False)
                x, wn = P.rn(4, 9, dtype=dt), P.rn(0, 9, dtype=dt)
                P.case(f"{nm} N=0", run(x, wn, None), ref(x, wn, None), dtype=dt, tol=t, valid=False)
                x = P.rn(6, 9, dtype=dt)
                xn = noncontig(x)
                P.case(f"{nm} non-contiguous x", run(xn, w, b), ref(xn, w, b), dtype=dt, tol=t)
                wt = P.rn(9, 5, dtype=dt, scale=1 / 3).t()
                P.case(f"{nm} weight = W.t() view", run(x, wt, b), ref(x, wt, b), dtype=dt, tol=t)
                for k in (9, 32, 64):
                    xm, wm = misaligned(P.rn(5, k, dtype=dt)), misaligned(P.rn(7, k, dtype=dt, scale=k ** -0.5))
                    bm = misaligned(P.rn(7, dtype=dt))
                    P.case(f"{nm} misaligned x, weight, bias K={k}", run(xm, wm, bm), ref(xm, wm, bm), dtype=dt,
                           tol=t)
                    x, w7 = P.rn(5, k, dtype=dt), P.rn(7, k, dtype=dt, scale=k ** -0.5)
                    om = misaligned(torch.zeros(5, 7, dtype=dt, device=P.dev))
                    P.case(f"{nm} misaligned out= K={k}", run(x, w7, None, out=om), ref(x, w7, None), dtype=dt,
                           tol=t)
                x = with_nan(P.rn(4, 9, dtype=dt), (10,))
                P.case(f"{nm} NaN in x", run(x, w, b), ref(x, w, b), dtype=dt, tol=t)
                x, wi = P.rn(4, 9, dtype=dt), with_nan(P.rn(5, 9, dtype=dt), (), inf_at=(3,))
                P.case(f"{nm} Inf in weight", run(x, wi, b), ref(x, wi, b), dtype=dt, tol=t)
                x, w = P.rn(40, 40, dtype=dt), P.rn(40, 40, dtype=dt, scale=40 ** -0.5)
                xr, wr = up(x), up(w)
                P.case(f"{nm} out=x (aliased, 40x40)", run(x, w, None, out=x), lambda: F.linear(xr, wr), dtype=dt,
                       tol=t, valid=False)
                x, w = P.rn(3, 9, dtype=dt), P.rn(5, 9, dtype=dt).requires_grad_()
                P.case(f"{nm} weight requires grad", run(x, w, None), ref(x, w, None), dtype=dt, tol=t, valid=False)
            if opname == "linear":
                x, w, b = P.rn(3, 9, dtype=dt), P.rn(5, 9, dtype=dt, scale=1 / 3), P.rn(5, dtype=dt)
                t = P.tol(None, dt)
                if P.cuda:
                    P.case(f"linear default version {str(dt)[6:]} M=3", lambda: L.linear(x, w, b), ref(x, w, b),
                           dtype=dt, tol=t)
                    x1 = misaligned(P.rn(1, 9, dtype=dt))
                    P.case(f"linear default version {str(dt)[6:]} M=1 misaligned", lambda: L.linear(x1, w, b),
                           ref(x1, w, b), dtype=dt, tol=t)
        for v in P.versions(fam, opname):
            nm = f"{opname} {v.name}"
            x, w = torch.ones(3, 4, dtype=i32, device=P.dev), torch.ones(5, 4, dtype=i32, device=P.dev)
            P.case(f"{nm} int32", lambda: fn(x, w, None, version=v.name), ref(x, w, None), valid=False)
            x, w = P.rn(3, 4), P.rn(5, 4, dtype=bf16)
            P.case(f"{nm} x f32, weight bf16", lambda: fn(x, w, None, version=v.name), ref(x, w, None), valid=False)
            x, w = P.rn(3, 4, dtype=f16), P.rn(5, 4, dtype=f16)
            P.case(f"{nm} float16", lambda: fn(x, w, None, version=v.name), ref(x, w, None), valid=False)
            x, w, b = P.rn(3, 4), P.rn(5, 4), P.rn(4)
            P.case(f"{nm} bias wrong shape", lambda: fn(x, w, b, version=v.name), ref(x, w, b), valid=False)
            x, w = P.rn(3, 4), P.rn(5, 6)
            P.case(f"{nm} in_features mismatch", lambda: fn(x, w, None, version=v.name), ref(x, w, None),
                   valid=False)
            x, w = torch.tensor(1.0, device=P.dev), P.rn(5, 1)
            P.case(f"{nm} 0-D x", lambda: fn(x, w, None, version=v.name), ref(x, w, None), valid=False)
            if P.cuda:
                x, w = P.rn(3, 4), P.rn(5, 4, device="cpu")
                P.case(f"{nm} weight on CPU", lambda: fn(x, w, None, version=v.name), ref(x, w, None), valid=False)
                x, w, b = P.rn(3, 4), P.rn(5, 4), P.rn(5, device="cpu")
                P.case(f"{nm} bias on CPU", lambda: fn(x, w, b, version=v.name), ref(x, w, b), valid=False)
        if not P.cuda:
            x, w = P.rn(3, 4), P.rn(5, 4)
            P.case(f"{opname} version 'v1' on CPU tensors", lambda: fn(x, w, None, version="v1"), ref(x, w, None),
                   valid=False)


# =================================================================================================================
# embedding: forward, backward, apply_embedding (autograd)
# =================================================================================================================
def probe_embedding(P: Probe):
    from lab.kernels import embedding as E
    fam = "embedding"

    def fref(idx, w, pad=None):
        return lambda: F.embedding(idx.cpu(), up(w), pad)

    def bref(g, idx, V, pad=None):
        return lambda: E.embedding_backward_ref(up(g), idx.cpu(), V, pad)

    for dt in (f32, bf16, f64):
        for v in P.versions(fam, "forward", dt):
            t, nm = P.tol(v, dt), f"forward {v.name} {str(dt)[6:]}"

            def run(idx, w, pad=None, **kw):
                return lambda: E.embedding(idx, w, pad, version=v.name, **kw)
            for V, D, shape, it in ((1, 1, (1,), i64), (5, 3, (7,), i64), (11, 33, (2, 5), i32), (3, 1, (4, 1, 2), i64),
                                    (1000, 5, (9,), i32)):
                w, idx = P.rn(V, D, dtype=dt), P.ri(0, V, *shape, dtype=it)
                P.case(f"{nm} V={V} D={D} idx{shape} {str(it)[6:]}", run(idx, w), fref(idx, w), dtype=dt, tol=t)
            w = P.rn(6, 4, dtype=dt)
            idx = torch.tensor(3, device=P.dev)
            P.case(f"{nm} 0-D idx", run(idx, w), fref(idx, w), dtype=dt, tol=t)
            for shape in ((0,), (2, 0)):
                idx = torch.zeros(shape, dtype=i64, device=P.dev)
                P.case(f"{nm} empty idx{shape}", run(idx, w), fref(idx, w), dtype=dt, tol=t, valid=False)
            for bad in (6, -1, 2 ** 40):
                idx = torch.tensor([0, 2, bad, 1], device=P.dev)
                P.case(f"{nm} index {bad} (V=6)", run(idx, w), fref(idx, w), dtype=dt, tol=t, valid=False)
            idx = torch.tensor([1, 2 ** 31 - 1], dtype=i32, device=P.dev)
            P.case(f"{nm} int32 index 2^31-1", run(idx, w), fref(idx, w), dtype=dt, tol=t, valid=False)
            idx = torch.tensor([0, 5, 6, -2, 3], device=P.dev)
            wr = up(w)

            def nan_rows(idx=idx, wr=wr):
                ok = (idx.cpu() >= 0) & (idx.cpu() < wr.shape[0])
                out = torch.full((idx.numel(), wr.shape[1]), math.nan, dtype=f64)
                out[ok] = wr[idx.cpu()[ok]]
                return out
            P.case(f"{nm} bad indices with check_indices=False (doc: NaN rows)", run(idx, w, check_indices=False),
                   nan_rows, dtype=dt, tol=t, valid=False)
            for pad in (0, -1, 5):
                idx = P.ri(0, 6, 8)
                P.case(f"{nm} padding_idx={pad}", run(idx, w, pad), fref(idx, w, pad), dtype=dt, tol=t)
            for pad in (6, -7):
                idx = P.ri(0, 6, 8)
                P.case(f"{nm} padding_idx={pad} out of range", run(idx, w, pad), fref(idx, w, pad), dtype=dt,
                       valid=False)
            idx = P.ri(0, 6, 3, 4)
            idn = noncontig(idx)
            P.case(f"{nm} non-contiguous idx", run(idn, w), fref(idn, w), dtype=dt, tol=t)
            wn = noncontig(P.rn(6, 4, dtype=dt))
            P.case(f"{nm} non-contiguous weight", run(idx, wn), fref(idx, wn), dtype=dt, tol=t)
            for D in (4, 8, 33, 64):
                wm = misaligned(P.rn(10, D, dtype=dt))
                idx = P.ri(0, 10, 13)
                P.case(f"{nm} misaligned weight D={D}", run(idx, wm), fref(idx, wm), dtype=dt, tol=t)
                om = misaligned(torch.zeros(13, D, dtype=dt, device=P.dev))
                P.case(f"{nm} misaligned out= D={D}", run(idx, wm, out=om), fref(idx, wm), dtype=dt, tol=t)
                im = misaligned(P.ri(0, 10, 13))
                P.case(f"{nm} misaligned idx D={D}", run(im, wm), fref(im, wm), dtype=dt, tol=t)
            wnan = with_nan(P.rn(6, 5, dtype=dt), (7,), inf_at=(16,))
            idx = torch.tensor([1, 3, 1, 0, 5], device=P.dev)
            P.case(f"{nm} NaN/Inf rows in weight", run(idx, wnan), fref(idx, wnan), dtype=dt, tol=t)
        for v in (P.versions(fam, "forward") if dt == f32 else []):   # dtype-independent cases: once
            nm = f"forward {v.name}"
            w = P.rn(6, 4)
            for it in (torch.int16, torch.uint8, torch.bool, f32):
                idx = torch.tensor([0, 1, 1], device=P.dev).to(it)
                P.case(f"{nm} idx dtype {it}", lambda: E.embedding(idx, w, version=v.name),
                       lambda: F.embedding(idx.cpu().long() if it != f32 else idx.cpu(), up(w)), valid=False)
            idx, wh = P.ri(0, 6, 4), P.rn(6, 4, dtype=f16)
            P.case(f"{nm} weight float16", lambda: E.embedding(idx, wh, version=v.name), fref(idx, wh), valid=False)
            wg = P.rn(6, 4).requires_grad_()
            P.case(f"{nm} weight requires grad", lambda: E.embedding(idx, wg, version=v.name), fref(idx, wg),
                   valid=False)
            P.case(f"{nm} padding_idx=True", lambda: E.embedding(idx, w, True, version=v.name), fref(idx, w, 1),
                   valid=False)
            w1 = P.rn(6)
            P.case(f"{nm} 1-D weight", lambda: E.embedding(idx, w1, version=v.name), fref(idx, w1), valid=False)
            if P.cuda:
                ic = P.ri(0, 6, 4, device="cpu")
                P.case(f"{nm} idx on CPU, weight on CUDA", lambda: E.embedding(ic, w, version=v.name), fref(ic, w),
                       valid=False)
        if not P.cuda and dt == f32:
            idx, w = P.ri(0, 6, 4), P.rn(6, 4)
            P.case("forward version 'v4' on CPU tensors", lambda: E.embedding(idx, w, version="v4"), fref(idx, w),
                   valid=False)

        for v in P.versions(fam, "backward", dt):
            t, nm = P.tol(v, dt), f"backward {v.name} {str(dt)[6:]}"

            def brun(g, idx, V, pad=None, **kw):
                return lambda: E.embedding_backward(g, idx, V, pad, version=v.name, deterministic=False, **kw)
            for V, D, shape, it in ((1, 1, (5,), i64), (1, 4, (40,), i32), (7, 3, (2, 3), i64), (5, 33, (300,), i64),
                                    (1000, 2, (7,), i32)):
                idx = P.ri(0, V, *shape, dtype=it)
                g = P.rn(*shape, D, dtype=dt)
                P.case(f"{nm} V={V} D={D} idx{shape} {str(it)[6:]}", brun(g, idx, V), bref(g, idx, V), dtype=dt,
                       tol=t)
            idx, g = torch.zeros(0, dtype=i64, device=P.dev), P.rn(0, 4, dtype=dt)
            P.case(f"{nm} no tokens (zeros)", brun(g, idx, 6), bref(g, idx, 6), dtype=dt, tol=t, valid=False)
            P.case(f"{nm} no tokens, V=0", brun(g, idx, 0), bref(g, idx, 0), dtype=dt, tol=t, valid=False)
            idx = torch.tensor(2, device=P.dev)
            g = P.rn(4, dtype=dt)
            P.case(f"{nm} 0-D idx", brun(g, idx, 6), bref(g, idx, 6), dtype=dt, tol=t)
            idx = P.ri(0, 6, 30)
            g = P.rn(30, 4, dtype=dt)
            for pad in (0, -1):
                P.case(f"{nm} padding_idx={pad}", brun(g, idx, 6, pad), bref(g, idx, 6, pad), dtype=dt, tol=t)
            for bad in (6, -1):
                ib = idx.clone()
                ib[7] = bad
                P.case(f"{nm} index {bad} (V=6)", brun(g, ib, 6), bref(g, ib, 6), dtype=dt, valid=False)
            ib = idx.clone()
            ib[7] = 6

            def dropped(g=g, ib=ib):
                keep = ib.cpu() < 6
                return E.embedding_backward_ref(up(g)[keep], ib.cpu()[keep], 6)
            P.case(f"{nm} index 6 (V=6) with check_indices=False (ref: bad token dropped)",
                   brun(g, ib, 6, check_indices=False), dropped, dtype=dt, tol=t, valid=False)
            gn = noncontig(P.rn(30, 4, dtype=dt))
            P.case(f"{nm} non-contiguous grad_out", brun(gn, idx, 6), bref(gn, idx, 6), dtype=dt, tol=t)
            for D in (4, 33, 64):
                gm = misaligned(P.rn(30, D, dtype=dt))
                P.case(f"{nm} misaligned grad_out D={D}", brun(gm, idx, 6), bref(gm, idx, 6), dtype=dt, tol=t)
            gnan = with_nan(P.rn(30, 4, dtype=dt), (9,), inf_at=(50,))
            P.case(f"{nm} NaN/Inf in grad_out", brun(gnan, idx, 6), bref(gnan, idx, 6), dtype=dt, tol=t)
            g5 = P.rn(29, 4, dtype=dt)
            P.case(f"{nm} grad_out rows != tokens", brun(g5, idx, 6), bref(g5, idx, 6), dtype=dt, valid=False)
        # autograd
        for v in P.versions(fam, "backward", dt):
            t, nm = P.tol(v, dt), f"apply_embedding {v.name} {str(dt)[6:]}"
            for pad, shape in ((None, (3, 5)), (2, (17,)), (-1, (2, 2, 3))):
                w0 = P.rn(7, 6, dtype=dt)
                idx = P.ri(0, 7, *shape)
                gy = P.rn(*shape, 6, dtype=dt)

                def arun(w0=w0, idx=idx, gy=gy, pad=pad):
                    w = w0.clone().requires_grad_()
                    y = E.apply_embedding(idx, w, pad, version=v.name)
                    (y * gy).sum().backward()
                    return y.detach(), w.grad

                def aref(w0=w0, idx=idx, gy=gy, pad=pad):
                    w = up(w0).requires_grad_()
                    y = F.embedding(idx.cpu(), w, pad)
                    (y * up(gy)).sum().backward()
                    return y.detach(), w.grad
                P.case(f"{nm} padding_idx={pad} idx{shape}", arun, aref, dtype=dt, tol=t)
            w0 = P.rn(7, 6, dtype=dt)
            idx = P.ri(0, 7, 6, 4)

            def arun_t(w0=w0, idx=idx):   # a transposed (non-contiguous) upstream gradient
                w = w0.clone().requires_grad_()
                y = E.apply_embedding(idx, w, version=v.name)
                y.transpose(0, 1).sum(-1).pow(2).sum().backward()
                return w.grad

            def aref_t(w0=w0, idx=idx):
                w = up(w0).requires_grad_()
                F.embedding(idx.cpu(), w).transpose(0, 1).sum(-1).pow(2).sum().backward()
                return w.grad
            P.case(f"{nm} non-contiguous upstream grad", arun_t, aref_t, dtype=dt, tol=t)
            if P.cuda and v.name == "v1":
                g, idx = P.rn(5, 4, dtype=dt), P.ri(0, 6, 5)
                P.case(f"backward v1 {str(dt)[6:]} deterministic=True",
                       lambda: E.embedding_backward(g, idx, 6, version="v1", deterministic=True), bref(g, idx, 6),
                       dtype=dt, tol=t, valid=False)


# =================================================================================================================
# rope: rope, rope_qk, rope_backward, apply_rope
# =================================================================================================================
def probe_rope(P: Probe):
    from lab.kernels import rope as R
    fam = "rope"

    def dims(b, h, s, d, layout):
        return (b, s, h, d) if layout == "bshd" else (b, h, s, d)

    def tables(maxpos, d, dt=f32):
        return R.rope_tables(maxpos, d, dtype=dt, device=P.dev)

    def ref1(x, c, s, off=0, layout="bhsd", il=False, inverse=False):
        if inverse:
            return lambda: R.rope_ref(up(x), up(c), -up(s), off, layout, il)
        return lambda: R.rope_ref(up(x), up(c), up(s), off, layout, il)

    for dt in (f32, f16, bf16, f64):
        for v in P.versions(fam, "rope", dt if dt != f64 else None):
            t, nm = P.tol(v, dt), f"rope {v.name} {str(dt)[6:]}"

            def run(x, c, s, off=0, layout="bhsd", il=False, **kw):
                return lambda: R.rope(x, c, s, off, layout, il, version=v.name, **kw)
            tdt = dt if dt == f64 else f32
            for b, h, sq, d, off, lay, il in ((1, 1, 1, 2, 0, "bhsd", False), (1, 1, 1, 2, 0, "bshd", True),
                                              (3, 7, 5, 6, 2, "bhsd", False), (2, 3, 7, 34, 1, "bshd", True),
                                              (1, 5, 3, 66, 0, "bshd", False), (2, 1, 9, 10, 3, "bhsd", True)):
                x = P.rn(*dims(b, h, sq, d, lay), dtype=dt)
                c, s = tables(off + sq, d, tdt)   # the table ends exactly at the last position used
                P.case(f"{nm} {lay} {'inter' if il else 'half'} b,h,s,d={b},{h},{sq},{d} off={off}",
                       run(x, c, s, off, lay, il), ref1(x, c, s, off, lay, il), dtype=dt, tol=t)
            x = P.rn(2, 3, 5, 8, dtype=dt)
            c, s = tables(5, 8, tdt)
            P.case(f"{nm} inverse=True (backward)", run(x, c, s, inverse=True), ref1(x, c, s, inverse=True),
                   dtype=dt, tol=t)
            P.case(f"{nm} rope_backward", lambda: R.rope_backward(x, c, s, version=v.name),
                   ref1(x, c, s, inverse=True), dtype=dt, tol=t)
            if dt != f64:
                ct, st = tables(5, 8, dt)
                P.case(f"{nm} tables in the tensor's dtype", run(x, ct, st), ref1(x, ct, st), dtype=dt, tol=t)
            x7 = P.rn(1, 2, 3, 7, dtype=dt)
            c7 = torch.ones(4, 3, dtype=tdt, device=P.dev)
            P.case(f"{nm} odd head_dim 7", run(x7, c7, c7), ref1(x7, c7, c7), dtype=dt, valid=False)
            x = P.rn(1, 2, 6, 8, dtype=dt)
            c, s = tables(7, 8, tdt)
            P.case(f"{nm} offset 2 past the table (7 rows, needs 8)", run(x, c, s, 2), ref1(x, c, s, 2), dtype=dt,
                   valid=False)
            P.case(f"{nm} offset -1", run(x, c, s, -1), ref1(x, c, s, -1), dtype=dt, valid=False)
            cf, sf = torch.cat([c, c], -1), torch.cat([s, s], -1)
            P.case(f"{nm} full-width (max_pos, head_dim) tables", run(x, cf, sf), ref1(x, c, s), dtype=dt,
                   valid=False)
            for shape in ((0, 2, 3, 8), (1, 2, 0, 8), (1, 0, 3, 8)):
                x0 = P.rn(*shape, dtype=dt)
                P.case(f"{nm} empty x{shape}", run(x0, c, s), ref1(x0, c, s), dtype=dt, tol=t, valid=False)
            xb = P.rn(2, 5, 3, 8, dtype=dt)               # (b, s, h, d) viewed as bhsd
            xt = xb.transpose(1, 2)
            P.case(f"{nm} non-contiguous x (bshd.transpose(1,2))", run(xt, c, s), ref1(xt, c, s), dtype=dt, tol=t)
            cn = noncontig(c)
            P.case(f"{nm} non-contiguous cos", run(xb.transpose(1, 2).contiguous(), cn, s),
                   ref1(xb.transpose(1, 2).contiguous(), cn, s), dtype=dt, tol=t)
            for d in (8, 16, 128):
                xm = misaligned(P.rn(2, 3, 4, d, dtype=dt))
                cm, sm = tables(4, d, tdt)
                P.case(f"{nm} misaligned x d={d}", run(xm, cm, sm), ref1(xm, cm, sm), dtype=dt, tol=t)
                cmm, smm = misaligned(cm), misaligned(sm)
                x2 = P.rn(2, 3, 4, d, dtype=dt)
                P.case(f"{nm} misaligned cos/sin d={d}", run(x2, cmm, smm), ref1(x2, cmm, smm), dtype=dt, tol=t)
                om = misaligned(torch.zeros(2, 3, 4, d, dtype=dt, device=P.dev))
                P.case(f"{nm} misaligned out= d={d}", run(x2, cm, sm, out=om), ref1(x2, cm, sm), dtype=dt, tol=t)
            xn = with_nan(P.rn(1, 2, 3, 8, dtype=dt), (1, 13), inf_at=(30,))
            c3, s3 = tables(3, 8, tdt)
            P.case(f"{nm} NaN/Inf in x", run(xn, c3, s3), ref1(xn, c3, s3), dtype=dt, tol=t)
            x = P.rn(2, 3, 4, 16, dtype=dt)
            c4, s4 = tables(4, 16, tdt)
            xr = up(x)
            P.case(f"{nm} out=x (in place)", run(x, c4, s4, out=x),
                   (lambda: R.rope_ref(xr, up(c4), up(s4))), dtype=dt, tol=t, valid=False)
    for v in P.versions(fam, "rope"):
        nm = f"rope {v.name}"
        x = P.rn(1, 2, 3, 8)
        c, s = tables(3, 8, f64)
        P.case(f"{nm} f32 x with f64 tables", lambda: R.rope(x, c, s, version=v.name), ref1(x, c, s), valid=False)
        c, s = tables(3, 8, bf16)
        P.case(f"{nm} f32 x with bf16 tables", lambda: R.rope(x, c, s, version=v.name), ref1(x, c, s), valid=False)
        xi = torch.ones(1, 2, 3, 8, dtype=i32, device=P.dev)
        c, s = tables(3, 8)
        P.case(f"{nm} int32 x", lambda: R.rope(xi, c, s, version=v.name), ref1(xi, c, s), valid=False)
        x3 = P.rn(2, 3, 8)
        P.case(f"{nm} 3-D x", lambda: R.rope(x3, c, s, version=v.name), ref1(x3, c, s), valid=False)
        P.case(f"{nm} layout 'bsdh'", lambda: R.rope(x, c, s, layout="bsdh", version=v.name), ref1(x, c, s),
               valid=False)
        if P.cuda:
            cc, sc = R.rope_tables(3, 8)
            P.case(f"{nm} tables on CPU", lambda: R.rope(x, cc, sc, version=v.name), ref1(x, cc, sc), valid=False)
    if not P.cuda:
        x = P.rn(1, 2, 3, 8)
        c, s = tables(3, 8)
        P.case("rope version 'v2' on CPU tensors", lambda: R.rope(x, c, s, version="v2"), ref1(x, c, s),
               valid=False)

    for dt in (f32, bf16):
        for v in P.versions(fam, "rope_qk", dt):
            t, nm = P.tol(v, dt), f"rope_qk {v.name} {str(dt)[6:]}"
            for b, h, kvh, sq, d, off, lay, il in ((1, 1, 1, 1, 2, 0, "bhsd", False), (2, 3, 5, 4, 6, 1, "bshd", True),
                                                   (3, 7, 1, 2, 34, 5, "bshd", False), (1, 6, 4, 3, 8, 0, "bhsd", True)):
                q, k = P.rn(*dims(b, h, sq, d, lay), dtype=dt), P.rn(*dims(b, kvh, sq, d, lay), dtype=dt)
                c, s = tables(off + sq, d)
                P.case(f"{nm} {lay} {'inter' if il else 'half'} q_heads={h} kv_heads={kvh} s={sq} d={d} off={off}",
                       lambda: R.rope_qk(q, k, c, s, off, lay, il, version=v.name),
                       lambda: R.rope_qk_ref(up(q), up(k), up(c), up(s), off, lay, il), dtype=dt, tol=t)
            q, k = P.rn(2, 4, 3, 16, dtype=dt), P.rn(2, 2, 3, 16, dtype=dt)
            c, s = tables(3, 16)
            qm, km = misaligned(q), misaligned(k, 3)
            P.case(f"{nm} misaligned q and k", lambda: R.rope_qk(qm, km, c, s, version=v.name),
                   lambda: R.rope_qk_ref(up(q), up(k), up(c), up(s)), dtype=dt, tol=t)
            k0 = P.rn(2, 0, 3, 16, dtype=dt)
            P.case(f"{nm} k with 0 heads", lambda: R.rope_qk(q, k0, c, s, version=v.name),
                   lambda: R.rope_qk_ref(up(q), up(k0), up(c), up(s)), dtype=dt, tol=t, valid=False)
            kb = P.rn(2, 2, 4, 16, dtype=dt)
            P.case(f"{nm} k seq mismatch", lambda: R.rope_qk(q, kb, c, s, version=v.name),
                   lambda: R.rope_qk_ref(up(q), up(kb), up(c), up(s)), dtype=dt, valid=False)
            kf = P.rn(2, 2, 3, 16, dtype=f32 if dt != f32 else bf16)
            P.case(f"{nm} k dtype differs from q", lambda: R.rope_qk(q, kf, c, s, version=v.name),
                   lambda: R.rope_qk_ref(up(q), up(kf), up(c), up(s)), dtype=dt, valid=False)
            qn = with_nan(q, (5,))
            P.case(f"{nm} NaN in q", lambda: R.rope_qk(qn, k, c, s, version=v.name),
                   lambda: R.rope_qk_ref(up(qn), up(k), up(c), up(s)), dtype=dt, tol=t)
            if P.cuda:
                kc = k.cpu()
                P.case(f"{nm} k on CPU", lambda: R.rope_qk(q, kc, c, s, version=v.name),
                       lambda: R.rope_qk_ref(up(q), up(kc), up(c), up(s)), dtype=dt, valid=False)
            # autograd through apply_rope, with a transposed upstream gradient
            q0, k0_ = P.rn(2, 5, 3, 8, dtype=dt), P.rn(2, 5, 1, 8, dtype=dt)   # bshd: (b, s, h, d)
            c, s = tables(7, 8)

            def grun(q0=q0, k0_=k0_, c=c, s=s):
                qq, kk = q0.clone().requires_grad_(), k0_.clone().requires_grad_()
                qr, kr = R.apply_rope(qq, kk, c, s, 2, "bshd", True, version=v.name)
                (qr.transpose(1, 2).square().sum() + kr.sum(2).pow(3).sum()).backward()
                return qr.detach(), kr.detach(), qq.grad, kk.grad

            def gref(q0=q0, k0_=k0_, c=c, s=s):
                qq, kk = up(q0).requires_grad_(), up(k0_).requires_grad_()
                qr = R.rope_ref(qq, up(c), up(s), 2, "bshd", True)
                kr = R.rope_ref(kk, up(c), up(s), 2, "bshd", True)
                (qr.transpose(1, 2).square().sum() + kr.sum(2).pow(3).sum()).backward()
                return qr.detach(), kr.detach(), qq.grad, kk.grad
            P.case(f"apply_rope {v.name} {str(dt)[6:]} q,k autograd (bshd, interleaved, offset 2)", grun, gref,
                   dtype=dt, tol=t)


# =================================================================================================================
# kron: forward (no autograd), kron (autograd: y, dx, dW)
# =================================================================================================================
def probe_kron(P: Probe):
    from lab.kernels import kron as K
    fam = "kron"

    def fs_(sizes, dt):
        return [P.rn(f, f, dtype=dt, scale=f ** -0.5) for f in sizes]

    def fref(x, fs):
        return lambda: K.kron_ref(up(x), *up(list(fs)))

    def fscale(x, fs):
        return lambda: verify.root_sum_square(K.kron_ref)(up(x), *up(list(fs)))

    for dt in (f32, f64, bf16):
        for v in P.versions(fam, "forward", dt):
            t, nm = P.tol(v, dt), f"forward {v.name} {str(dt)[6:]}"

            def run(x, fs, **kw):
                return lambda: K.forward(x, fs, version=v.name, **kw)
            for b, sizes in ((3, (1,)), (1, (7,)), (2, (1, 1, 1)), (3, (1, 5)), (3, (5, 1)), (5, (7, 1, 3)),
                             (7, (3, 2)), (1, (33, 2)), (2, (2,) * 16)):
                x, fs = P.rn(b, math.prod(sizes), dtype=dt), fs_(sizes, dt)
                P.case(f"{nm} batch {b} factors {'x'.join(map(str, sizes))}", run(x, fs), fref(x, fs), dtype=dt,
                       tol=t, scale=fscale(x, fs))
            x, fs = P.rn(0, 12, dtype=dt), fs_((3, 4), dt)
            P.case(f"{nm} batch 0", run(x, fs), fref(x, fs), dtype=dt, tol=t, valid=False)
            x, fs = P.rn(3, 12, dtype=dt), fs_((3, 5), dt)
            P.case(f"{nm} factor product 15 != N 12", run(x, fs), fref(x, fs), dtype=dt, valid=False)
            x, fs = P.rn(3, 12, dtype=dt), [P.rn(3, 3, dtype=dt), P.rn(4, 3, dtype=dt)]
            P.case(f"{nm} non-square factor (4,3)", run(x, fs), fref(x, fs), dtype=dt, valid=False)
            x = P.rn(3, 1, dtype=dt)
            P.case(f"{nm} empty factor list", run(x, []), fref(x, []), dtype=dt, valid=False)
            fs = fs_((1,) * 17, dt)
            P.case(f"{nm} 17 factors of size 1", run(x, fs), fref(x, fs), dtype=dt, valid=False)
            x, fs = P.rn(4, 12, dtype=dt), fs_((3, 4), dt)
            xn = noncontig(x)
            P.case(f"{nm} non-contiguous x", run(xn, fs), fref(xn, fs), dtype=dt, tol=t, scale=fscale(xn, fs))
            fn_ = [noncontig(fs[0]), fs[1]]
            P.case(f"{nm} factor W.t() view", run(x, fn_), fref(x, fn_), dtype=dt, tol=t, scale=fscale(x, fn_))
            for sizes in ((3, 4), (8, 8), (64, 64)):
                xm = misaligned(P.rn(3, math.prod(sizes), dtype=dt))
                fm = [misaligned(w) for w in fs_(sizes, dt)]
                P.case(f"{nm} misaligned x and factors {'x'.join(map(str, sizes))}", run(xm, fm), fref(xm, fm),
                       dtype=dt, tol=t, scale=fscale(xm, fm))
                x = P.rn(3, math.prod(sizes), dtype=dt)
                fs = fs_(sizes, dt)
                om = misaligned(torch.zeros_like(x))
                P.case(f"{nm} misaligned out= {'x'.join(map(str, sizes))}", run(x, fs, out=om), fref(x, fs),
                       dtype=dt, tol=t, scale=fscale(x, fs))
            x, fs = with_nan(P.rn(3, 12, dtype=dt), (5,)), fs_((3, 4), dt)
            P.case(f"{nm} NaN in x", run(x, fs), fref(x, fs), dtype=dt, tol=t, scale=fscale(x, fs))
            x, fs = P.rn(3, 12, dtype=dt), fs_((3, 4), dt)
            fs[1] = with_nan(fs[1], (), inf_at=(5,))
            P.case(f"{nm} Inf in W_2", run(x, fs), fref(x, fs), dtype=dt, tol=t)
            x, fs = P.rn(3, 16, dtype=dt), fs_((4, 4), dt)
            xr, fr = up(x), up(fs)
            P.case(f"{nm} out=x (aliased)", run(x, fs, out=x), lambda: K.kron_ref(xr, *fr), dtype=dt, tol=t,
                   valid=False)
        for v in P.versions(fam, "forward"):
            nm = f"forward {v.name}"
            x, fs = torch.ones(2, 6, dtype=i32, device=P.dev), [torch.ones(2, 2, dtype=i32, device=P.dev),
                                                                 torch.ones(3, 3, dtype=i32, device=P.dev)]
            if dt == f32:
                P.case(f"{nm} int32", lambda: K.forward(x, fs, version=v.name), fref(x, fs), valid=False)
                x, fs = P.rn(2, 6), [P.rn(2, 2, dtype=f64), P.rn(3, 3)]
                P.case(f"{nm} mixed f32 x, f64 factor", lambda: K.forward(x, fs, version=v.name), fref(x, fs),
                       valid=False)
                x, fs = P.rn(2, 6, dtype=f16), [P.rn(2, 2, dtype=f16), P.rn(3, 3, dtype=f16)]
                P.case(f"{nm} float16", lambda: K.forward(x, fs, version=v.name), fref(x, fs), valid=False)
                if not v.supports(bf16):
                    x, fs = P.rn(2, 6, dtype=bf16), [P.rn(2, 2, dtype=bf16), P.rn(3, 3, dtype=bf16)]
                    P.case(f"{nm} bfloat16 (not a tensor-core version)", lambda: K.forward(x, fs, version=v.name),
                           fref(x, fs), valid=False)
                if P.cuda:
                    x, fs = P.rn(2, 6), [P.rn(2, 2), P.rn(3, 3, device="cpu")]
                    P.case(f"{nm} factor on CPU", lambda: K.forward(x, fs, version=v.name), fref(x, fs), valid=False)
        if dt == f32 and not P.cuda:
            x, fs = P.rn(2, 6), [P.rn(2, 2), P.rn(3, 3)]
            P.case("forward version 'v2' on CPU tensors", lambda: K.forward(x, fs, version="v2"), fref(x, fs),
                   valid=False)

        # autograd (forward_backward op's versions)
        for v in P.versions(fam, "forward_backward", dt):
            t, nm = P.tol(v, dt), f"kron autograd {v.name} {str(dt)[6:]}"

            def trun(x0, fs0, g, need=(True, True), **kw):
                def f():
                    x = x0.detach().clone().requires_grad_(need[0])
                    fs = [w.detach().clone().requires_grad_(need[1]) for w in fs0]
                    y = K.kron(x, fs, v.name, **kw)
                    ins = ([x] if need[0] else []) + (fs if need[1] else [])
                    grads = torch.autograd.grad(y, ins, g)
                    return (y.detach(), *grads)
                return f

            def tref(x0, fs0, g, need=(True, True)):
                def f():
                    x = up(x0).requires_grad_(need[0])
                    fs = [up(w).requires_grad_(need[1]) for w in fs0]
                    y = K.kron_ref(x, *fs)
                    ins = ([x] if need[0] else []) + (fs if need[1] else [])
                    return (y.detach(), *torch.autograd.grad(y, ins, up(g)))
                return f

            def tscale(x0, fs0, g, need=(True, True)):
                def f():
                    out = verify.root_sum_square(K.train_ref)(up(x0), up(g), *up(list(fs0)))
                    keep = [0] + ([1] if need[0] else []) + (list(range(2, 2 + len(fs0))) if need[1] else [])
                    return [out[i] for i in keep]
                return f
            for b, sizes in ((1, (1,)), (3, (1, 5)), (2, (7,)), (4, (3, 4)), (1, (2, 3, 2)), (3, (32, 32))):
                x, fs = P.rn(b, math.prod(sizes), dtype=dt), fs_(sizes, dt)
                g = P.rn(b, math.prod(sizes), dtype=dt)
                P.case(f"{nm} batch {b} factors {'x'.join(map(str, sizes))}", trun(x, fs, g), tref(x, fs, g),
                       dtype=dt, tol=t, scale=tscale(x, fs, g))
            x, fs, g = P.rn(3, 12, dtype=dt), fs_((3, 4), dt), P.rn(3, 12, dtype=dt)
            for need in ((True, False), (False, True)):
                P.case(f"{nm} requires_grad x={need[0]} factors={need[1]}", trun(x, fs, g, need),
                       tref(x, fs, g, need), dtype=dt, tol=t, scale=tscale(x, fs, g, need))
            gn = noncontig(g)
            P.case(f"{nm} non-contiguous upstream grad", trun(x, fs, gn), tref(x, fs, gn), dtype=dt, tol=t,
                   scale=tscale(x, fs, gn))
            ge = P.rn(1, 1, dtype=dt).expand(3, 12)
            P.case(f"{nm} expanded (stride-0) upstream grad", trun(x, fs, ge), tref(x, fs, ge), dtype=dt, tol=t,
                   scale=tscale(x, fs, ge))
            xn, fn_ = noncontig(x), [noncontig(fs[0]), fs[1]]
            P.case(f"{nm} non-contiguous x and W_1", trun(xn, fn_, g), tref(xn, fn_, g), dtype=dt, tol=t,
                   scale=tscale(xn, fn_, g))
            xm, fm, gm = misaligned(x), [misaligned(w) for w in fs], misaligned(g)
            P.case(f"{nm} misaligned x, factors, grad", trun(xm, fm, gm), tref(xm, fm, gm), dtype=dt, tol=t,
                   scale=tscale(xm, fm, gm))
            x0, g0 = P.rn(0, 12, dtype=dt), P.rn(0, 12, dtype=dt)
            P.case(f"{nm} batch 0", trun(x0, fs, g0), tref(x0, fs, g0), dtype=dt, tol=t, valid=False)
            xnan = with_nan(x, (4,))
            P.case(f"{nm} NaN in x", trun(xnan, fs, g), tref(xnan, fs, g), dtype=dt, tol=t)


# =================================================================================================================
# optim: adam_step (functional), lab.optim.AdamW / Adam (drop-in optimizers)
# =================================================================================================================
def probe_optim(P: Probe):
    from lab.kernels import optim as O
    fam = "optim"
    HP = dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)

    def lists(sizes, dt=f32, dts=None, device=None):
        dts = dts or [dt] * len(sizes)
        p = [P.rn(*((n,) if isinstance(n, int) else n), dtype=d, device=device) for n, d in zip(sizes, dts)]
        g = [P.rn(*t.shape, dtype=t.dtype, device=device) for t in p]
        m = [P.rn(*t.shape, scale=0.1, device=device) for t in p]
        v = [P.rn(*t.shape, device=device).abs() * 0.01 for t in p]
        s = [torch.tensor(float(i % 5), device=device or P.dev) for i in range(len(p))]
        return [p, g, m, v, [], s]

    def step_run(L, version, amsgrad=False, maximize=False, decoupled=True, **hp):
        h = dict(HP, **hp)

        def f():
            O.adam_step(*L, lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"],
                        weight_decay=h["weight_decay"], decoupled=decoupled, amsgrad=amsgrad, maximize=maximize,
                        version=version)
            p, _, m, v, vm, s = L
            return (p, m, v) + ((vm,) if amsgrad else ()) + (s,)
        return f

    def step_ref(L, amsgrad=False, maximize=False, decoupled=True, **hp):
        snap = up(L)
        h = dict(HP, amsgrad=amsgrad, maximize=maximize, decoupled=decoupled, **hp)
        if isinstance(h["lr"], torch.Tensor):
            h["lr"] = float(h["lr"])
        return lambda: O.adam_ref(*snap, h)

    def tols(L, v, amsgrad=False):
        p = L[0]
        tp = [P.tol(v, t.dtype) for t in p]
        n = len(p)
        return tp + [P.tol(v, f32)] * (n * (3 if amsgrad else 2) + n)

    def dtypes_of(L, amsgrad=False):
        p = L[0]
        n = len(p)
        return [t.dtype for t in p] + [f32] * (n * (3 if amsgrad else 2) + n)

    for v in P.versions(fam, "adamw"):
        nm = f"adam_step {v.name}"

        def case(label, L, valid=True, **kw):
            P.case(f"{nm} {label}", step_run(L, v.name, **kw), step_ref(L, **kw), dtype=dtypes_of(L, kw.get("amsgrad")),
                   tol=tols(L, v, kw.get("amsgrad")), valid=valid)
        case("sizes 1,3,33,7", lists([1, 3, 33, 7]))
        case("one tensor of 1 element", lists([1]))
        case("2-D and 3-D params", lists([(3, 5), (2, 1, 7)]))
        def empty_step():
            O.adam_step([], [], [], [], [], [], lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                        decoupled=True, version=v.name)
            return ()   # nothing to update, nothing to compare: ok when it returns
        P.case(f"{nm} empty lists", empty_step, lambda: ())
        case("a 0-element param among others", lists([3, 0, 5]), valid=False)
        L = lists([3, 5])
        L[1][1] = None
        case("a grad that is None", L, valid=False)
        case("bf16 params (fp32 state)", lists([3, 33, 1], bf16))
        case("fp16 params (fp32 state)", lists([3, 33, 1], f16))
        case("mixed param dtypes f32/bf16/f16 in one call", lists([5, 7, 9, 1], dts=[f32, bf16, f16, f32]))
        L = lists([4])
        L[2][0] = L[2][0].to(bf16)
        case("exp_avg in bf16", L, valid=False)
        L = lists([4])
        L[1][0] = L[1][0].double()
        case("grad f64 for f32 param", L, valid=False)
        L = lists([(5, 3)])
        L = [[t.t() for t in lst] if k < 4 else lst for k, lst in enumerate(L)]   # every tensor transposed (dense)
        case("transposed (non-contiguous, dense) param and state", L)
        L = lists([(5, 3)])
        L[0][0] = L[0][0].t().contiguous().t()
        case("transposed param, contiguous grad", L, valid=False)
        L = lists([6])
        big = P.rn(12)
        L[0][0] = big[::2]
        case("strided param big[::2]", L, valid=False)
        for dt in (f32, bf16):
            L = lists([5, 37, 1030], dt)
            L = [[misaligned(t) for t in lst] if k < 4 else lst for k, lst in enumerate(L)]
            case(f"misaligned params, grads, state ({str(dt)[6:]})", L)
        L = lists([7, 9])
        L[1][0] = with_nan(L[1][0], (2,), inf_at=(5,))
        case("NaN/Inf in a grad", L)
        L = lists([7, 9])
        L[4] = [t.clone() * 1.5 for t in L[3]]
        case("amsgrad + maximize", L, amsgrad=True, maximize=True)
        case("Adam (L2 weight decay)", lists([7, 9]), decoupled=False)
        L = lists([7, 9])
        case("lr as a 1-element tensor", L, lr=torch.tensor(0.03, device=P.dev))
        L = lists([3, 3])
        L[0][1] = L[0][0]
        case("same param twice", L, valid=False)
        L = lists([3, 4])
        L[1] = L[1][:1]
        case("grads list shorter than params", L, valid=False)
        if P.cuda:
            L = lists([3, 4])
            L[5] = [s.cpu() for s in L[5]]
            case("state_steps on CPU", L, valid=False)
            L = lists([3, 4])
            L[1][1] = L[1][1].cpu()
            case("a grad on CPU", L, valid=False)
    if not P.cuda:
        case_L = lists([3])
        P.case("adam_step version 'v4' on CPU tensors", step_run(case_L, "v4"), step_ref(case_L), valid=False)

    # the drop-in optimizers against torch.optim on float64 copies
    names = [v.name for v in P.versions(fam, "adamw")]

    def opt_case(label, make_params, kw=None, steps=3, cls="AdamW", grads_none_at=(), groups=None, valid=True,
                 dts=None):
        kw = kw or {}
        seed = 1000 + zlib.crc32(label.encode())
        for vname in names:
            P.seed(seed)
            params = make_params()
            # grads laid out like their params (as autograd makes them), drawn from the case's seed
            gseq = [[(torch.empty_like(p).copy_(P.rn(*p.shape, dtype=p.dtype, device=p.device))
                      if (s, i) not in grads_none_at else None) for i, p in enumerate(params)] for s in range(steps)]
            p64 = [torch.nn.Parameter(up(p.detach())) for p in params]
            # a fresh copy with the same strides; a misaligned view (storage offset) is kept as it is
            lab_p = [torch.nn.Parameter(p.detach().clone()) if p.storage_offset() == 0 else
                     torch.nn.Parameter(p.detach()) for p in params]

            def pgroups(ps):
                if groups is None:
                    return ps
                return [dict(params=[ps[i] for i in idx], **g) for idx, g in groups]

            def run():
                Cls = getattr(O, cls)
                opt = Cls(pgroups(lab_p), version=vname, **kw)
                for s in range(steps):
                    for p, g in zip(lab_p, gseq[s]):
                        p.grad = g
                    opt.step()
                return [p.detach() for p in lab_p]

            def ref():
                Cls = getattr(torch.optim, cls)
                k2 = {a: (float(b) if isinstance(b, torch.Tensor) else b) for a, b in kw.items()}
                opt = Cls(pgroups(p64), foreach=False, **k2)
                for s in range(steps):
                    for p, g in zip(p64, gseq[s]):
                        p.grad = up(g) if g is not None else None
                    opt.step()
                return [p.detach() for p in p64]
            P.case(f"{cls} {vname} {label}", run, ref, dtype=[p.dtype for p in params],
                   tol=[P.tol(None, p.dtype) for p in params], valid=valid)

    opt_case("sizes 1,3,33 + (5,7), 3 steps", lambda: [P.rn(1), P.rn(3), P.rn(33), P.rn(5, 7)])
    opt_case("a param whose grad is None on step 0 and 2", lambda: [P.rn(3), P.rn(4), P.rn(5)],
             grads_none_at={(0, 1), (2, 1)})
    opt_case("param groups with different lr / weight_decay", lambda: [P.rn(3), P.rn(4), P.rn(5)],
             groups=[([0, 2], dict(lr=0.01, weight_decay=0.0)), ([1], dict(lr=0.2, weight_decay=0.5))])
    opt_case("transposed (non-contiguous) Parameter", lambda: [P.rn(7, 5).t(), P.rn(3)])
    opt_case("misaligned Parameter (storage offset 1)", lambda: [misaligned(P.rn(37)), misaligned(P.rn(6, 5))])
    opt_case("bf16 params", lambda: [P.rn(33, dtype=bf16), P.rn(3, 3, dtype=bf16)])
    opt_case("a 0-element param", lambda: [P.rn(0), P.rn(3)], valid=False)
    opt_case("amsgrad, maximize, Adam", lambda: [P.rn(3), P.rn(9)], cls="Adam",
             kw=dict(lr=0.02, weight_decay=0.05, amsgrad=True, maximize=True))
    opt_case("lr tensor", lambda: [P.rn(3), P.rn(9)], kw=dict(lr=torch.tensor(0.03, device=P.dev)))
    opt_case("huge lr=10 (no NaN expected)", lambda: [P.rn(5)], kw=dict(lr=10.0))
    P.case("AdamW empty parameter list", lambda: O.AdamW([]), lambda: torch.optim.AdamW([]), valid=False)
    for vname in names:
        p = torch.nn.Parameter(P.rn(4))

        def run_nograd(p=p, vname=vname):
            before = p.detach().clone()
            O.AdamW([p], version=vname).step()   # no grad at all: nothing to do
            return p.detach(), before
        P.case(f"AdamW {vname} step with no grads", run_nograd, lambda p=p: (up(p.detach()), up(p.detach())),
               dtype=f32)


# =================================================================================================================
# gru
# =================================================================================================================
def probe_gru(P: Probe):
    from lab.kernels import gru as G
    fam = "gru"

    def params_(I, H, L, dt, device=None):
        k = 1.0 / math.sqrt(H)
        out = []
        for l in range(L):
            inp = I if l == 0 else H
            for shape in ((3 * H, inp), (3 * H, H), (3 * H,), (3 * H,)):
                out.append(((torch.rand(shape, generator=P.gen, dtype=f64) * 2 - 1) * k).to(dt).to(device or P.dev))
        return out

    def ref(x, h0, ps):
        return lambda: G.gru_ref(up(x), up(h0) if h0 is not None else None, up(list(ps)))

    dts = (f32, bf16, f16, f64)
    for dt in dts:
        vs = P.versions(fam, "gru", dt)
        if dt == f64:   # float64 is not an op dtype of the registry; the docstring says cpu, v1, v2 take it
            vs = [v for v in P.versions(fam, "gru") if v.name in ("cpu", "v1", "v2")]
        for v in vs:
            t, nm = P.tol(v, dt), f"gru {v.name} {str(dt)[6:]}"

            def run(x, h0, ps, **kw):
                return lambda: G.gru(x, h0, ps, version=v.name, **kw)
            for T, B, I, H, L, h in ((1, 1, 1, 1, 1, 0), (1, 1, 1, 1, 1, 1), (3, 7, 33, 3, 1, 1), (2, 1, 5, 1, 2, 1),
                                     (4, 3, 2, 17, 1, 0), (2, 5, 3, 33, 3, 1), (6, 2, 4, 64, 1, 1)):
                x = P.rn(T, B, I, dtype=dt)
                h0 = P.rn(L, B, H, dtype=dt, scale=0.5) if h else None
                ps = params_(I, H, L, dt)
                P.case(f"{nm} T,B,I,H,L={T},{B},{I},{H},{L} h0={h}", run(x, h0, ps), ref(x, h0, ps), dtype=dt,
                       tol=t)
            ps = params_(4, 6, 1, dt)
            for shape in ((0, 2, 4), (3, 0, 4)):
                x = P.rn(*shape, dtype=dt)
                P.case(f"{nm} empty x{shape}", run(x, None, ps), ref(x, None, ps), dtype=dt, tol=t, valid=False)
            x = P.rn(3, 2, 4, dtype=dt)
            for hs in ((1, 2, 7), (2, 6), (2, 2, 6)):
                h0 = P.rn(*hs, dtype=dt)
                P.case(f"{nm} h0 of shape {hs}", run(x, h0, ps), ref(x, h0, ps), dtype=dt, valid=False)
            h0 = P.rn(1, 6, 2, dtype=dt).transpose(1, 2)   # (1, 2, 6) but not contiguous
            P.case(f"{nm} non-contiguous h0 (L,H,B).transpose(1,2)", run(x, h0, ps), ref(x, h0, ps), dtype=dt, tol=t)
            xb = P.rn(2, 3, 4, dtype=dt).transpose(0, 1)    # batch_first data seen as (seq, batch, input)
            P.case(f"{nm} non-contiguous x (batch_first.transpose(0,1))", run(xb, None, ps), ref(xb, None, ps),
                   dtype=dt, tol=t)
            psn = list(ps)
            psn[1] = noncontig(ps[1])
            P.case(f"{nm} non-contiguous w_hh", run(x, None, psn), ref(x, None, psn), dtype=dt, tol=t)
            for H in (6, 64):
                xm = misaligned(P.rn(3, 2, 4, dtype=dt))
                h0m = misaligned(P.rn(1, 2, H, dtype=dt))
                psm = [misaligned(p) for p in params_(4, H, 1, dt)]
                P.case(f"{nm} misaligned x, h0, params H={H}", run(xm, h0m, psm), ref(xm, h0m, psm), dtype=dt, tol=t)
            x = with_nan(P.rn(4, 3, 4, dtype=dt), (12 + 0,))   # t=1, batch 0
            P.case(f"{nm} NaN in x at t=1", run(x, None, ps), ref(x, None, ps), dtype=dt, tol=t)
            x = with_nan(P.rn(3, 2, 4, dtype=dt), (), inf_at=(1,))
            P.case(f"{nm} Inf in x", run(x, None, ps), ref(x, None, ps), dtype=dt, tol=t)
            h0n = with_nan(P.rn(1, 2, 6, dtype=dt), (7,))
            x = P.rn(3, 2, 4, dtype=dt)
            P.case(f"{nm} NaN in h0", run(x, h0n, ps), ref(x, h0n, ps), dtype=dt, tol=t)
            x = P.rn(5, 2, 4, dtype=dt, scale=60.0)
            P.case(f"{nm} saturating inputs (x * 60)", run(x, None, ps), ref(x, None, ps), dtype=dt, tol=t)
            x = P.rn(3, 2, 4, dtype=dt)
            P.case(f"{nm} params list of 5 tensors", run(x, None, ps + ps[:1]), ref(x, None, ps), dtype=dt,
                   valid=False)
            m = torch.nn.GRU(4, 6, 1, dtype=dt, device=P.dev)
            fw = list(m._flat_weights)
            P.case(f"{nm} nn.GRU._flat_weights (requires grad)", run(x, None, fw), ref(x, None, fw), dtype=dt, tol=t,
                   valid=False)

            def nograd(x=x, fw=fw):
                with torch.no_grad():
                    return G.gru(x, None, fw, version=v.name)
            P.case(f"{nm} nn.GRU._flat_weights under no_grad", nograd, ref(x, None, fw), dtype=dt, tol=t)
    for v in P.versions(fam, "gru"):
        nm = f"gru {v.name}"
        ps = params_(4, 6, 1, f32)
        x = torch.ones(3, 2, 4, dtype=i32, device=P.dev)
        P.case(f"{nm} int32 x", lambda: G.gru(x, None, ps, version=v.name), ref(x, None, ps), valid=False)
        x = P.rn(3, 2, 4)
        ps64 = params_(4, 6, 1, f64)
        P.case(f"{nm} f32 x with f64 params", lambda: G.gru(x, None, ps64, version=v.name), ref(x, None, ps64),
               valid=False)
        x2 = P.rn(3, 4)
        P.case(f"{nm} 2-D x (unbatched)", lambda: G.gru(x2, None, ps, version=v.name), ref(x2, None, ps),
               valid=False)
        if P.cuda:
            xc = P.rn(3, 2, 4, device="cpu")
            P.case(f"{nm} x on CPU, params on CUDA", lambda: G.gru(xc, None, ps, version=v.name), ref(xc, None, ps),
                   valid=False)
            h0c = P.rn(1, 2, 6, device="cpu")
            P.case(f"{nm} h0 on CPU", lambda: G.gru(x, h0c, ps, version=v.name), ref(x, h0c, ps), valid=False)
    if not P.cuda:
        ps, x = params_(4, 6, 1, f32), P.rn(3, 2, 4)
        P.case("gru version 'v3' on CPU tensors", lambda: G.gru(x, None, ps, version="v3"), ref(x, None, ps),
               valid=False)


# =================================================================================================================
# sparse24: prune, compress, linear
# =================================================================================================================
def probe_sparse24(P: Probe):
    from lab.kernels import sparse24 as S
    fam = "sparse24"

    def structural(x, w, b):
        """x·Wᵀ + b over the kept (nonzero) weights only: a NaN/Inf of x meets only the weights the format stores
        (dense F.linear would turn NaN·0 into NaN for every output)."""
        def f():
            xx, ww = up(x), up(w)
            prod = xx.unsqueeze(-2) * ww                     # (..., N, K)
            prod = torch.where(ww != 0, prod, torch.zeros_like(prod))
            y = prod.sum(-1)
            return y + up(b) if b is not None else y
        return f

    def ref(x, w, b):
        return lambda: F.linear(up(x), up(w), up(b) if b is not None else None)

    def mk(n, k, dt):
        w = S.prune(P.rn(n, k, dtype=dt, scale=max(k / 2, 1) ** -0.5))
        return w, S.compress(w)

    for dt in (bf16, f16):
        for v in P.versions(fam, "linear", dt):
            t, nm = P.tol(v, dt), f"linear {v.name} {str(dt)[6:]}"

            def run(x, pk, b, **kw):
                return lambda: S.linear(x, pk, b, version=v.name, **kw)
            for m, n, k, bias in ((1, 1, 1, 1), (1, 3, 4, 0), (3, 5, 7, 1), (1, 7, 33, 1), (2, 3, 64, 0),
                                  (7, 33, 100, 1)):
                x = P.rn(m, k, dtype=dt)
                w, pk = mk(n, k, dt)
                b = P.rn(n, dtype=dt) if bias else None
                P.case(f"{nm} M,N,K={m},{n},{k} bias={bias}", run(x, pk, b), ref(x, w, b), dtype=dt, tol=t)
            w, pk = mk(5, 40, dt)
            b = P.rn(5, dtype=dt)
            x = P.rn(2, 3, 40, dtype=dt)
            P.case(f"{nm} 3-D x", run(x, pk, b), ref(x, w, b), dtype=dt, tol=t)
            x = P.rn(40, dtype=dt)
            P.case(f"{nm} 1-D x", run(x, pk, b), ref(x, w, b), dtype=dt, tol=t)
            x = P.rn(0, 40, dtype=dt)
            P.case(f"{nm} M=0", run(x, pk, b), ref(x, w, b), dtype=dt, tol=t, valid=False)
            w0, pk0 = mk(5, 0, dt)
            x = P.rn(3, 0, dtype=dt)
            P.case(f"{nm} K=0 (y = bias)", run(x, pk0, b), ref(x, w0, b), dtype=dt, tol=t, valid=False)
            wn0, pkn0 = mk(0, 40, dt)
            x = P.rn(3, 40, dtype=dt)
            P.case(f"{nm} N=0", run(x, pkn0, None), ref(x, wn0, None), dtype=dt, tol=t, valid=False)
            xn = noncontig(P.rn(3, 40, dtype=dt))
            P.case(f"{nm} non-contiguous x", run(xn, pk, b), ref(xn, w, b), dtype=dt, tol=t)
            for k in (40, 64, 256):
                wk, pkk = mk(9, k, dt)
                for m in (1, 3, 17):
                    xm, bm = misaligned(P.rn(m, k, dtype=dt)), misaligned(P.rn(9, dtype=dt))
                    P.case(f"{nm} misaligned x and bias M={m} K={k}", run(xm, pkk, bm), ref(xm, wk, bm), dtype=dt,
                           tol=t)
                x = P.rn(3, k, dtype=dt)
                om = misaligned(torch.zeros(3, 9, dtype=dt, device=P.dev))
                P.case(f"{nm} misaligned out= K={k}", run(x, pkk, None, out=om), ref(x, wk, None), dtype=dt, tol=t)
            x = with_nan(P.rn(3, 40, dtype=dt), (5,), inf_at=(50,))
            P.case(f"{nm} NaN/Inf in x (structural reference)", run(x, pk, b), structural(x, w, b), dtype=dt, tol=t)
            x = P.rn(3, 40, dtype=dt)
            pkm = S.Sparse24Weight(misaligned(pk.values), pk.meta, pk.in_features)
            P.case(f"{nm} misaligned packed values", run(x, pkm, b), ref(x, w, b), dtype=dt, valid=False)
            x = P.rn(3, 41, dtype=dt)
            P.case(f"{nm} x in_features 41 != 40", run(x, pk, b), ref(x, w, b), dtype=dt, valid=False)
            x = P.rn(3, 40, dtype=dt)
            wg = P.rn(5, dtype=dt).requires_grad_()
            P.case(f"{nm} bias requires grad", run(x, pk, wg), ref(x, w, wg), dtype=dt, tol=t, valid=False)
        # compress edge cases (device-level, not per version)
        nm = f"compress {str(dt)[6:]}"
        wd = P.rn(4, 8, dtype=dt)
        P.case(f"{nm} dense (not 2:4) weight", lambda: S.compress(wd).values, invalid("a dense weight is not 2:4"),
               valid=False)
        w = S.prune(P.rn(6, 8, dtype=dt))
        wt = noncontig(w)
        P.case(f"{nm} non-contiguous pruned weight",
               lambda: S.compress(wt).to_dense(), lambda: up(wt), dtype=dt, tol=0.0, valid=False)
        wn = w.clone()
        wn[0, 0] = math.nan
        wn[0, 1] = 0
        wn[0, 2] = 0
        wn[0, 3] = 0
        P.case(f"{nm} weight with a NaN kept element (round trip)", lambda: S.compress(wn).to_dense(),
               lambda: up(wn), dtype=dt, tol=0.0, valid=False)
        wnan = P.rn(2, 8, dtype=dt)
        wnan[0, :4] = math.nan
        P.case(f"{nm} prune of a row with 4 NaNs in a group (then compress)",
               lambda: S.compress(S.prune(wnan)).to_dense(), lambda: S.prune(up(wnan)), dtype=dt, tol=0.0,
               valid=False)
    for v in P.versions(fam, "linear"):
        nm = f"linear {v.name}"
        w, pk = mk(5, 40, bf16)
        x = P.rn(3, 40)
        P.case(f"{nm} float32 x", lambda: S.linear(x, pk, None, version=v.name), ref(x, w, None), valid=False)
        x = P.rn(3, 40, dtype=f16)
        P.case(f"{nm} f16 x with bf16 weight", lambda: S.linear(x, pk, None, version=v.name), ref(x, w, None),
               valid=False)
        x = P.rn(3, 40, dtype=bf16)
        P.case(f"{nm} dense tensor as weight", lambda: S.linear(x, w, None, version=v.name), ref(x, w, None),
               valid=False)
        if P.cuda:
            xc = P.rn(3, 40, dtype=bf16, device="cpu")
            P.case(f"{nm} x on CPU, weight on CUDA", lambda: S.linear(xc, pk, None, version=v.name),
                   ref(xc, w, None), valid=False)
    if not P.cuda:
        w, pk = mk(5, 40, bf16)
        x = P.rn(3, 40, dtype=bf16)
        P.case("linear version 'v1' on CPU tensors", lambda: S.linear(x, pk, None, version="v1"), ref(x, w, None),
               valid=False)


PROBES = {"basics": probe_basics, "linear": probe_linear, "embedding": probe_embedding, "rope": probe_rope,
          "kron": probe_kron, "optim": probe_optim, "gru": probe_gru, "sparse24": probe_sparse24}


# ---- drivers ----------------------------------------------------------------------------------------------------
def run_in_process(device: str, families: list[str], quiet: bool, progress: str | None) -> dict:
    P = Probe(device, quiet, progress)
    for fam in families:
        P.family = fam
        P.seed(FAMILIES.index(fam) + 1)
        if P.poisoned_by is not None:
            continue
        t0 = time.time()
        try:
            registry.get(fam)
            PROBES[fam](P)
        except Exception as e:  # noqa: BLE001 — a build failure, or a bug in the probe: say so, go on
            P.family = fam
            P._report("BAD", f"{fam}: (probe aborted)", f"{type(e).__name__}: {first_line(e)}")
            traceback.print_exc()
        print(f"[edge] {fam}: done in {time.time() - t0:.1f} s", flush=True)
    return P.summary()


def run_isolated(device: str, families: list[str], quiet: bool, timeout: float) -> dict:
    total = {"counts": {"ok": 0, "error": 0, "BAD": 0}, "bad": [], "refused": [], "skipped": 0, "poisoned_by": []}
    for fam in families:
        fd, progress = tempfile.mkstemp(prefix=f"edge_{fam}_", suffix=".txt")
        os.close(fd)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--device", device, "--families", fam, "--child",
               "--progress-file", progress] + (["-q"] if quiet else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(ROOT))
        result, deadline, timed_out = None, time.time() + timeout, False
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            if time.time() > deadline:
                timed_out = True
                proc.kill()
                break
            if not sel.select(timeout=1.0):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("EDGE_RESULT "):
                result = json.loads(line[len("EDGE_RESULT "):])
            else:
                print(line, end="", flush=True)
        rc = proc.wait()
        log = Path(progress).read_text().splitlines() if Path(progress).exists() else []
        os.unlink(progress)
        if result is None:   # it died: count what it reported before, and name the case it was running
            result = {"counts": {"ok": 0, "error": 0, "BAD": 0}, "bad": [], "refused": [], "skipped": 0,
                      "poisoned_by": None}
            last, done = f"{fam}: (before the first case)", True
            for entry in log:
                kind, _, text = entry.partition("\t")
                if kind == "S":
                    last, done = text, False
                elif kind == "R":
                    status, _, line = text.partition("\t")
                    result["counts"][status] += 1
                    if status == "BAD":
                        result["bad"].append(line)
                    done = True
                elif kind == "F":
                    result["refused"].append(text)
            why = f"hung (killed after {timeout:.0f} s)" if timed_out else \
                f"process died with {'signal ' + str(-rc) if rc < 0 else 'exit status ' + str(rc)}"
            where = f"after {last} (between cases)" if done else last
            line = f"BAD   {where}  -> {why}; the family's remaining cases did not run"
            print(line, flush=True)
            result["counts"]["BAD"] += 1
            result["bad"].append(line)
        if result is not None:
            for k in ("ok", "error", "BAD"):
                total["counts"][k] += result["counts"][k]
            total["bad"] += result["bad"]
            total["refused"] += result["refused"]
            total["skipped"] += result["skipped"]
            if result["poisoned_by"]:
                total["poisoned_by"].append(result["poisoned_by"])
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, from " + ",".join(FAMILIES))
    ap.add_argument("--no-isolate", action="store_true", help="run every family in this process")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per family (isolated runs)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only error and BAD lines")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--progress-file", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    unknown = [f for f in fams if f not in PROBES]
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {','.join(FAMILIES)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no GPU visible")
    if a.child:
        res = run_in_process(a.device, fams, a.quiet, a.progress_file)
        print("EDGE_RESULT " + json.dumps(res), flush=True)
        return 0
    t0 = time.time()
    if a.no_isolate:
        res = run_in_process(a.device, fams, a.quiet, None)
        res["poisoned_by"] = [res["poisoned_by"]] if res["poisoned_by"] else []
    else:
        res = run_isolated(a.device, fams, a.quiet, a.timeout)
    c = res["counts"]
    n = sum(c.values())
    print()
    if res["refused"]:
        print(f"[edge] {len(res['refused'])} valid inputs refused with a clear error (not counted as BAD):")
        for line in res["refused"]:
            print("   ", line)
    if res["poisoned_by"]:
        print(f"[edge] CUDA context poisoned by: {'; '.join(res['poisoned_by'])}; {res['skipped']} later cases "
              "skipped")
    if res["bad"]:
        print(f"[edge] BAD cases ({len(res['bad'])}):")
        for line in res["bad"]:
            print("   ", line)
    print(f"[edge] {a.device}, families {','.join(fams)}, {time.time() - t0:.0f} s")
    print(f"edge probe: {n} cases, {c['ok']} ok, {c['error']} clear errors, {c['BAD']} BAD")
    return 1 if c["BAD"] else 0


if __name__ == "__main__":
    sys.exit(main())
