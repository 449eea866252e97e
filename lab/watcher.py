"""Watch a family's sources: on every save, rebuild what changed, check the versions it touches, time them, and print
one line per version against the previous run.

    python -m lab watch gru --op gru_forward --version v3        # Ctrl-C stops it
    lab.watch("gru", op="gru_forward", versions=["v3"])           # in a notebook: interrupt the cell to stop

A change to `cuda_src/<family>/v3.cu` re-checks version v3 (a unit named like a version belongs to it); a change to
the CPU unit re-checks `cpu`; a change to anything else the family builds from (its shared header, the binding,
another unit, lab_common.h) re-checks every selected version. Checks use one seed and the op's check shapes (1,
primes, odd tiles); the time is the median of CUDA events (L2 flushed) or of the CPU timer at one benchmark shape.
A build error prints as `cuda_src/...:LINE: error: ...` with the source line, and the last good build stays loaded.
Each check and timing runs in a worker process by default (lab.isolate): a kernel that faults or hangs is reported
as that version's result and the watcher goes on.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import torch

try:
    import watchfiles
except ImportError:  # a dependency, but the watcher still works without it: it polls mtimes
    watchfiles = None

from . import build, env, registry
from . import isolate as iso  # (as iso: run_versions takes a flag named isolate)


def _watched_paths(family: str) -> list[Path]:
    paths = [p for p in (env.CUDA_SRC / family, env.CPP_SRC / family) if p.is_dir()]
    if not paths:  # single-file family
        paths = [p for p in (env.CUDA_SRC / f"{family}.cu", env.CPP_SRC / f"{family}.cpp") if p.exists()]
    try:
        s = build.spec(family)
        for h in s.headers:
            if not any(h.is_relative_to(d) for d in paths if d.is_dir()):
                paths.append(h)
    except build.BuildError:
        pass
    return paths


def affected_versions(family: str, changed: list[Path], names: list[str]) -> list[str]:
    """Which of `names` (version names) a change of these files can affect."""
    out: list[str] = []
    for p in changed:
        p = Path(p)
        in_cuda = p.parent == env.CUDA_SRC / family and p.suffix == ".cu"
        in_cpu = p.parent == env.CPP_SRC / family and p.suffix == ".cpp" and p.stem != family
        if in_cuda and p.stem in names:
            hit = [p.stem]
        elif in_cpu and "cpu" in names:
            hit = ["cpu"]
        else:
            return list(names)
        out += [h for h in hit if h not in out]
    return out or list(names)


def _poll_changes(paths: list[Path], stop: threading.Event, interval: float = 0.25):
    """The fallback when watchfiles is not installed: stat the files every `interval` s."""
    def snap():
        out = {}
        for p in paths:
            for f in ([p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]):
                try:
                    st = f.stat()
                    out[f] = (st.st_mtime_ns, st.st_size)
                except OSError:
                    pass
        return out
    last = snap()
    while not stop.is_set():
        time.sleep(interval)
        now = snap()
        changed = {f for f in set(now) | set(last) if now.get(f) != last.get(f)}
        last = now
        if changed:
            yield changed


def _changes(paths: list[Path], stop: threading.Event):
    if watchfiles is None:
        yield from _poll_changes(paths, stop)
        return
    for batch in watchfiles.watch(*paths, stop_event=stop, debounce=300, raise_interrupt=True,
                                  rust_timeout=500, yield_on_timeout=True):
        if stop.is_set():
            return
        if batch:
            yield {Path(p) for _, p in batch}


def _fmt_time(us: float | None) -> str:
    return "-" if us is None else (f"{us:.1f} us" if us < 1e4 else f"{us / 1e3:.2f} ms")


def run_versions(family: str, op_names: list[str], versions: list[str] | None, device: torch.device,
                 isolate: bool, timeout: float) -> dict[tuple[str, str], dict]:
    """Check (one seed, the check shapes) and time (one bench shape) each selected version: {(op, v): result}."""
    fam = registry.get(family)
    out: dict[tuple[str, str], dict] = {}
    for op_name in op_names:
        op = fam.op(op_name)
        dtype = op.dtypes[0]
        names = [v.name for v in op.versions_for(device, dtype, versions) if not v.baseline]
        if not names:
            continue
        shapes = op.shapes_for(device)
        shape = shapes[len(shapes) // 2] if shapes else None
        jobs = [iso.Job("check", family, op_name, n, str(device), {"dtypes": [dtype], "seeds": [0]}, n)
                for n in names]
        jobs += [iso.Job("time", family, op_name, n, str(device), {"dtype": dtype, "shape": shape}, n)
                 for n in names if shape is not None]
        res = iso.run_jobs(jobs, timeout) if isolate else [iso.run_inline(j) for j in jobs]
        for job, r in zip(jobs, res):
            rec = out.setdefault((op_name, job.version), {"ok": None, "rel": None, "us": None, "problem": ""})
            if isinstance(r, iso.Failure):
                rec["ok"] = False
                rec["problem"] = rec["problem"] or r.problem
            elif job.kind == "check":
                rec["ok"] = all(c.passed for c in r)
                rec["rel"] = max((c.rel_err for c in r), default=None)
                bad = [c for c in r if not c.passed]
                if bad:
                    rec["problem"] = f"{bad[0].shape}: {bad[0].problem}"
            else:
                rec["us"] = r
    return out


def _line(op: str, v: str, now: dict, before: dict | None, multi_op: bool) -> str:
    name = f"{op}.{v}" if multi_op else v
    status = "ok  " if now["ok"] else "FAIL"
    rel = f"rel {now['rel']:.1e}" if now["rel"] is not None else "rel -"
    if before and before.get("rel") is not None and now["rel"] is not None:
        rel += f" (was {before['rel']:.1e})"
    t = _fmt_time(now["us"])
    if before and before.get("us") and now["us"]:
        t += f" (was {_fmt_time(before['us'])}, {100 * (now['us'] / before['us'] - 1):+.1f}%)"
    tail = f"  <- {now['problem']}" if now["problem"] else ""
    return f"[watch] {name:<22} {status} {rel:<28} {t}{tail}"


def watch(family: str, op: str | None = None, versions: list[str] | None = None, device=None,
          isolate: bool = True, timeout: float = 60.0, max_events: int | None = None,
          duration: float | None = None, stop: threading.Event | None = None,
          out: Callable[[str], None] = print) -> list[dict]:
    """Rebuild, check and time on every save until Ctrl-C / an interrupted cell (or max_events changes handled, or
    `duration` seconds). Returns one record per handled change: {files, built, seconds, results}."""
    device = torch.device(device or env.default_device())
    fam = registry.get(family)
    op_names = [op] if op else [o.name for o in fam.ops]
    for o in op_names:
        fam.op(o)  # a clear KeyError for an unknown op, before anything runs
    stop = stop or threading.Event()
    history: list[dict] = []
    out(f"[watch] {family} on {device.type}: building and taking a first measurement ...")
    try:
        build.load(family, verbose=False)
        last = run_versions(family, op_names, versions, device, isolate, timeout)
        for (o, v), rec in last.items():
            out(_line(o, v, rec, None, len(op_names) > 1))
    except build.BuildError as e:
        out(f"[watch] build failed (fix it and save):\n{e.summary}")
        last = {}
    paths = _watched_paths(family)
    out(f"[watch] watching {', '.join(build._rel(p) for p in paths)} (Ctrl-C / interrupt to stop)")
    t_end = time.monotonic() + duration if duration else None
    timer = None
    if t_end:
        timer = threading.Timer(duration, stop.set)
        timer.daemon = True
        timer.start()
    try:
        for changed in _changes(paths, stop):
            names = sorted({v for (_, v) in last} or {v.name for o in op_names for v in fam.op(o).versions})
            touched = affected_versions(family, sorted(changed), names)
            rel = ", ".join(sorted(build._rel(p) for p in changed))
            out(f"[watch] changed: {rel}")
            t0 = time.perf_counter()
            rec = {"files": sorted(str(p) for p in changed), "built": False, "seconds": None, "results": {}}
            try:
                build.load(family, verbose=False)
                rec["built"], rec["seconds"] = True, time.perf_counter() - t0
                out(f"[watch] rebuilt in {rec['seconds']:.1f} s; checking {', '.join(touched)}")
                now = run_versions(family, op_names, [v for v in touched if versions is None or v in versions],
                                   device, isolate, timeout)
                for key, r in now.items():
                    out(_line(key[0], key[1], r, last.get(key), len(op_names) > 1))
                last.update(now)
                rec["results"] = now
            except build.BuildError as e:
                rec["error"] = e.summary
                out(f"[watch] build failed; the last good build stays loaded:\n{e.summary}")
            history.append(rec)
            if max_events and len(history) >= max_events:
                break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if timer:
            timer.cancel()
    out("[watch] stopped")
    return history
