"""The steps `python -m lab report` and the CLI commands (check, bench, profile) share, written once: check an op's
versions, benchmark an op (validate, then benchmark), profile an op's versions, run a family's extras.

    rs = steps.check(op, dev)                       # every version against its float64 reference, three seeds
    rows = steps.benchmark(op, dev)                 # one-seed check first; a wrong version is named, not timed
    steps.profile_op(fam, op, dev)                  # a profiler table and trace per version, at the middle shape,
                                                    # and its kernels in results/<device>/profiles.csv
    rows, failed = steps.ncu_op(fam, op, dev)       # each version's kernels under Nsight Compute -> ncu.csv
    rows, failed = steps.extras(fam, dev)           # the family's extra benchmarks (studies), each one guarded

`isolate=True` runs each version in a worker process (lab.isolate): a crash or a hang is that version's result.
"""
from __future__ import annotations

import subprocess
from typing import Callable, Iterable

import torch

from . import bench, build, isolate, profile, registry, verify
from .registry import Family, Op
from .verify import CheckResult, dtype_name


def _say(msg: str) -> None:
    print(f"[lab] {msg}", flush=True)


def check(op: Op, device: torch.device, dtypes=None, versions=None, shapes=None, seeds: Iterable[int] = range(3),
          *, isolated: bool = False, timeout: float = 300, lean: bool = False,
          progress: bool = False) -> list[CheckResult]:
    """Every version of `op` (or those named) on `device` against the float64 reference."""
    if isolated:
        return isolate.check_op(op, device, versions, dtypes, timeout=timeout, shapes=shapes, seeds=seeds,
                                progress=progress, lean=lean)
    return verify.check_op(op, device, dtypes, versions, shapes, seeds=seeds, progress=progress, lean=lean)


def wrong_versions(results: Iterable[CheckResult]) -> list[str]:
    return sorted({r.version for r in results if not r.passed})


def benchmark(op: Op, device: torch.device, dtypes=None, versions=None, shapes=None, *, record: bool = True,
          validate: bool = True, skip: Iterable[str] = (), isolated: bool = False, timeout: float = 300,
          say: Callable[[str], None] = _say) -> list[dict]:
    """Validate, then benchmark: each version is checked first (one seed, the check shapes) unless validate=False
    (the caller checked already: pass the wrong ones as `skip`); a wrong version is named and not timed."""
    skip = set(skip)
    if validate:
        skip |= set(wrong_versions(check(op, device, dtypes, versions, seeds=(0,), isolated=isolated,
                                         timeout=timeout)))
    if skip:
        say(f"{op.family}.{op.name}: not timed, wrong on the check shapes: {', '.join(sorted(skip))} "
            f"(`python -m lab check {op.family} --op {op.name}` says where)")
        names = [v.name for v in op.versions_for(device, None, versions)]
        versions = [n for n in names if n not in skip]
        if not versions:
            return []
    if isolated:
        rows, failed = isolate.bench_op(op, device, versions, dtypes, timeout=timeout, shapes=shapes, record=record)
        for f in failed:
            say(f.line())
        return rows
    return bench.bench_op(op, device, dtypes, versions, shapes, record=record)


def profile_shape(op: Op, device: torch.device) -> dict:
    """The shape an op is profiled at by default: its middle bench shape on this device."""
    shapes = op.shapes_for(device)
    return shapes[len(shapes) // 2]


def ours_and_baseline(op: Op) -> list[str]:
    """The names of our versions (vN) of `op` and of the baselines their ratios are against (op.baseline, and the
    baseline of another precision where a version of ours declares one, e.g. TF32): what
    `lab profile --ours` profiles. The other baselines can cost more than everything else under ncu (optim's for-loop
    Adam launches a few kernels per tensor, 148 tensors at its profile shape, each replayed)."""
    # a version multiplying in another precision (TF32) is held against the first baseline of that precision
    # (bench.reference_baseline's rule)
    precs = {v.precision for v in op.versions if not v.baseline and v.precision}
    firsts = {next(v.name for v in op.versions if v.baseline and v.precision == p)
              for p in precs if any(v.baseline and v.precision == p for v in op.versions)}
    return [v.name for v in op.versions if not v.baseline or v.name == op.baseline or v.name in firsts]


def _key(fam: Family, op: Op, v, dt: torch.dtype, shape: dict) -> dict:
    """The columns that name a measurement, as results.csv names it."""
    return {"family": fam.name, "op": op.name, "version": v.name, "shape": registry.shape_label(shape),
            "dtype": dtype_name(dt), "precision": bench.precision_of(v, dt)}


def profile_op(fam: Family, op: Op, device: torch.device, dtypes=None, versions=None, shape: dict | None = None,
               *, record: bool = True) -> list[tuple[str, str, str]]:
    """A profiler table and a trace file per version at `shape` (default: the op's middle bench shape), per dtype
    (default: the op's first), and (record=True) the profiled calls split by kernel, each kernel once with its
    category, appended to results/<device>/profiles.csv (lab.plot.plot_profile draws them). Returns (title, table,
    trace path) per profiled version."""
    shape = shape or profile_shape(op, device)
    out, rows = [], []
    for dt in dtypes or op.dtypes[:1]:
        inputs = op.make_inputs(shape, dt, device, torch.Generator().manual_seed(0))
        for v in op.versions_for(device, dt, versions):
            name = f"{fam.name}_{op.name}_{v.name}_{dtype_name(dt)}_{device.type}".replace(".", "-")
            table, trace, stats = profile.profile_kernels(bench._timed_call(v, inputs), name, device.type, active=3)
            rows += profile.kernel_rows(stats, _key(fam, op, v, dt, shape), not v.baseline, device.type, reps=3)
            out.append((f"{fam.name}.{op.name} {v.name} {dtype_name(dt)} {registry.shape_label(shape)}", table,
                        trace))
    if record:
        profile.record(rows)
    return out


def ncu_op(fam: Family, op: Op, device: torch.device, dtypes=None, versions=None, shape: dict | None = None,
           *, record: bool = True, say: Callable[[str], None] = _say) -> tuple[list[dict], list[str]]:
    """Each version of `op` (or those named) at `shape` (default: the profile shape), per dtype (default: the op's
    first), under Nsight Compute in a child process (lab.profile.ncu): one row per kernel launch of the profiled
    call, appended to results/<device>/ncu.csv. Returns (rows, the versions ncu failed on with why)."""
    shape = shape or profile_shape(op, device)
    rows, failed = [], []
    for dt in dtypes or op.dtypes[:1]:
        for v in op.versions_for(device, dt, versions):
            say(f"ncu {fam.name}.{op.name} {v.name} {dtype_name(dt)} {registry.shape_label(shape)}")
            cmd = profile.ncu_command(fam.name, op.name, v.name, dtype_name(dt), shape)
            name = f"{fam.name}_{op.name}_{v.name}_{dtype_name(dt)}".replace(".", "-")
            try:
                rows += profile.ncu(cmd, _key(fam, op, v, dt, shape), not v.baseline, device.type,
                                    record_rows=record, name=name, say=say)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:   # one version's failure is its result
                say(f"ncu {fam.name}.{op.name} {v.name} FAILED: {e}")
                failed.append(f"{fam.name}.{op.name} {v.name}: {e}")
    return rows, failed


def ncu_target(op: Op, device: torch.device, dtype: torch.dtype, version: str, shape: dict) -> None:
    """What ncu profiles (the child of lab.profile.ncu): the version once to warm up (build, allocate, autotune),
    then once between cudaProfilerStart and cudaProfilerStop, inside an NVTX range named after it."""
    v = op.version(version)
    inputs = op.make_inputs(shape, dtype, device, torch.Generator().manual_seed(0))
    call = bench._timed_call(v, inputs)
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    with torch.cuda.nvtx.range(f"{op.family}.{op.name} {version}"):
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def extras(fam: Family, device: torch.device, *, record: bool = True, quick: bool = False,
           only: Iterable[str] | None = None, say: Callable[[str], None] = _say) -> tuple[list[dict], list[str]]:
    """The family's extra benchmarks (lab/studies/<family>.py attaches them). One that raises is reported and the
    rest go on. Returns (rows, the names of the extras that failed with why)."""
    rows: list[dict] = []
    failed: list[str] = []
    only = set(only) if only else None
    for name, fn in fam.extras.items():
        if only is not None and name not in only:
            continue
        say(f"{fam.name} extra: {name}")
        try:
            with build.frozen():   # timed calls go through the wrappers: no source-file check per call (see bench)
                rows += fn(device, record=record, quick=quick)
        except Exception as e:  # an extra that fails says why; the run goes on
            say(f"{fam.name} extra {name} FAILED: {type(e).__name__}: {e}")
            failed.append(f"{fam.name}.{name}: failed with {type(e).__name__}: {e}")
    return rows, failed
