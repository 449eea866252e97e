"""Crash isolation: check or time versions in a spawned worker process, with a timeout per version.

An out-of-bounds kernel leaves the CUDA context of its process unusable ("an illegal memory access was encountered"
is sticky: every later CUDA call fails), a hung kernel never returns, and a bad CPU unit can take the interpreter
down with SIGSEGV. Run through this module, each of those becomes that version's result —
"v3: CUDA error: an illegal memory access was encountered", "v3: timed out after 30 s", "v3: worker died (SIGSEGV)"
— and the caller's process (a notebook kernel) and its CUDA context are untouched: the caller never ran the kernel.

    from lab import isolate
    results = isolate.check_op(fam.op("square"), "cuda", versions=["v2"], timeout=60)   # list of CheckResult
    rows = isolate.bench_op(fam.op("square"), "cuda", versions=["v2"], timeout=120)      # bench rows

How: one worker (multiprocessing, 'spawn' start method: a fresh interpreter, no inherited CUDA state) runs the jobs
one version at a time and sends each result back through a pipe. The parent waits for each with a timeout; if the
worker dies or times out it is killed, that version is reported as such, and a new worker takes the rest. After a
CUDA error the worker exits too (its context is gone) and a fresh one continues. The worker sees the same
environment (sources, cache: it loads the already-built modules without compiling).
"""
from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import bench, build, registry, results, verify
from .timing import time_fn
from .verify import CheckResult, dtype_name

_STICKY = ("illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
           "illegal instruction", "device-side assert", "an illegal", "CUDA error")


@dataclass
class Job:
    kind: str                      # "check" | "bench"
    family: str
    op: str
    version: str
    device: str
    kwargs: dict = field(default_factory=dict)
    label: str = ""


@dataclass
class Failure:
    """What a version did instead of returning: crashed the worker, timed out, or raised."""
    job: Job
    problem: str

    def line(self) -> str:
        return f"{self.job.label or self.job.version}: {self.problem}"


def _run_job(job: Job) -> Any:
    """One job, in this process: check -> [CheckResult]; bench -> [row]; time -> median microseconds."""
    op = registry.get(job.family).op(job.op)
    if job.kind == "check":
        return verify.check_op(op, job.device, versions=[job.version], **job.kwargs)
    if job.kind == "bench":
        with build.frozen():  # timing loops: no file checks (bench rows are recorded by the parent)
            return bench.bench_op(op, job.device, versions=[job.version], progress=False, record=False,
                                  **job.kwargs)
    if job.kind == "time":
        dtype, shape = job.kwargs["dtype"], job.kwargs["shape"]
        v = [x for x in op.versions_for(job.device, dtype, [job.version])][0]
        inputs = op.make_inputs(shape, dtype, torch.device(job.device), torch.Generator().manual_seed(1234))
        return time_fn(bench._timed_call(v, inputs), job.device).median_us   # (frozen: lab.timing)
    raise ValueError(f"unknown job kind {job.kind!r}")


def run_inline(job: Job) -> Any:
    """A job in this process (no isolation): its result, or a Failure if it raised."""
    try:
        return _run_job(job)
    except Exception as e:  # noqa: BLE001 — what a version raises is its result
        return Failure(job, f"{type(e).__name__}: {e}"[:2000])


def _worker(conn, jobs: list[Job], setup: dict) -> None:
    # A fresh interpreter: the same families (and any extra modules a caller registered) are imported here.
    os.environ.update(setup.get("env", {}))
    for path in setup.get("imports", []):
        name = f"lab_isolated_{abs(hash(path))}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    # Build/load the jobs' families now, so that a job's timeout bounds the version's run and not a cold build.
    for fam in dict.fromkeys(j.family for j in jobs):
        try:
            build.load(fam, verbose=False)
        except Exception:  # noqa: BLE001 — a family that does not build: its jobs raise the error themselves
            pass
    conn.send((0, "ready", None))
    for i, job in enumerate(jobs):
        try:
            res = _run_job(job)
            conn.send((i, "ok", res))
            sticky = job.device.startswith("cuda") and any(
                getattr(r, "problem", "") and any(s in r.problem for s in _STICKY)
                for r in (res if isinstance(res, list) else []))
        except BaseException as e:  # noqa: BLE001 — anything a version raises is its result
            msg = f"{type(e).__name__}: {e}".strip()
            conn.send((i, "raised", msg[:2000]))
            sticky = job.device.startswith("cuda") and any(s in msg for s in _STICKY)
        if sticky:
            # The CUDA context of this process is unusable now: stop, the parent starts a fresh worker.
            conn.send((i + 1, "restart", None))
            conn.close()
            os._exit(0)
    conn.send((len(jobs), "done", None))
    conn.close()


def _signal_name(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def run_jobs(jobs: list[Job], timeout: float = 60.0, imports: list[str] | None = None,
             env: dict | None = None, start_timeout: float = 300.0, progress: bool = False) -> list[Any]:
    """Run jobs in worker processes; returns one entry per job: its result (a list of CheckResult or of bench
    rows) or a Failure. `timeout` bounds each job's run; `start_timeout` bounds a worker's start-up (importing torch
    and lab, building or loading the jobs' families), which ends before its first job starts."""
    ctx = mp.get_context("spawn")
    out: list[Any] = [None] * len(jobs)
    extra = [registry.EXTERNAL[j.family] for j in jobs if j.family in registry.EXTERNAL]
    setup = {"imports": list(dict.fromkeys(list(imports or []) + extra)), "env": dict(env or {})}
    start = 0
    while start < len(jobs):
        rest = jobs[start:]
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(child, rest, setup), daemon=True)
        p.start()
        child.close()
        i, restart = 0, False
        ready = _wait(parent, p, start_timeout)
        if ready is None or ready[0] == "eof":
            # start-up (imports, build) hung or crashed: the first job's result; the rest get a fresh worker
            _kill(p)
            what = (f"worker did not start within {start_timeout:g} s" if ready is None else
                    f"worker died ({_signal_name(p.exitcode)}) while starting")
            out[start] = Failure(rest[0], what)
            start += 1
            continue
        while i < len(rest):
            got = _wait(parent, p, timeout)
            if got is None:
                _kill(p)
                out[start + i] = Failure(rest[i], f"timed out after {timeout:g} s")
                i += 1
                restart = True
                break
            if got[0] == "eof":
                p.join(5)
                out[start + i] = Failure(rest[i], f"worker died ({_signal_name(p.exitcode)}) while running it")
                i += 1
                restart = True
                break
            idx, status, payload = got
            if status == "restart" or status == "done":
                restart = status == "restart"
                break
            out[start + idx] = payload if status == "ok" else Failure(rest[idx], payload)
            if progress:
                print(f"[lab] isolated {rest[idx].label or rest[idx].version}: {status}", flush=True)
            i = idx + 1
        if p.is_alive():
            p.join(10 if not restart else 2)
            _kill(p)
        start += i if i > 0 else 1
        if not restart and i >= len(rest):
            break
    return out


def _wait(conn, p, limit: float):
    """The worker's next message, ("eof",) if it died, or None after `limit` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if conn.poll(0.1):
            try:
                return conn.recv()
            except EOFError:
                return ("eof",)
        if not p.is_alive() and not conn.poll(0.05):
            return ("eof",)
    return None


def _kill(p) -> None:
    if p.is_alive():
        p.kill()
        p.join(10)


def _jobs(kind: str, op, device, versions, dtypes=None, **kwargs) -> list[Job]:
    device = str(torch.device(device))
    names = []
    for dt in (dtypes or op.dtypes):
        for v in op.versions_for(device, dt, versions):
            if v.name not in names:
                names.append(v.name)
    kw = dict(kwargs)
    if dtypes:
        kw["dtypes"] = list(dtypes)
    return [Job(kind, op.family, op.name, n, device, kw, f"{op.family}.{op.name} {n}") for n in names]


def check_op(op, device, versions=None, dtypes=None, timeout: float = 60.0, imports=None, env=None,
             **kwargs) -> list:
    """verify.check_op, one version at a time in a worker. Returns CheckResults; a version that crashed, hung or
    raised outside its checks comes back as a failed CheckResult whose problem says what happened."""
    jobs = _jobs("check", op, device, versions, dtypes, **kwargs)
    out = []
    for job, res in zip(jobs, run_jobs(jobs, timeout, imports, env)):
        if isinstance(res, Failure):
            shape = (kwargs.get("shapes") or op.check_shapes or [{}])[0]
            out.append(CheckResult(op.name, job.version, registry.shape_label(shape),
                                   dtype_name((dtypes or op.dtypes)[0]), torch.device(device).type, tol=0.0,
                                   passed=False, problem=res.problem, rel_err=float("inf")))
        else:
            out.extend(res or [])
    return out


def bench_op(op, device, versions=None, dtypes=None, timeout: float = 120.0, imports=None, env=None,
             record: bool = True, **kwargs) -> tuple[list[dict], list[Failure]]:
    """bench.bench_op, one version at a time in a worker: (rows, failures). Each worker times the baseline beside
    its version (the speedup is against the baseline of the same process); its rows are kept once."""
    jobs = _jobs("bench", op, device, versions, dtypes, **kwargs)
    rows, bad, seen_base = [], [], set()
    for res in run_jobs(jobs, timeout, imports, env):
        if isinstance(res, Failure):
            bad.append(res)
            continue
        for r in res or []:
            if r["version"] == op.baseline:
                key = (r["dtype"], r["shape"], r["mode"])
                if key in seen_base:
                    continue
                seen_base.add(key)
            rows.append(r)
    if record and rows:
        results.append(rows)
    return rows, bad


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use lab.isolate from Python, or --isolate on the CLI")
