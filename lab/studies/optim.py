"""optim's studies: whole AdamW steps over real parameter lists, their figure, and the pointer-passing attempts of
the notes (the family itself, the kernels' API, reference and Ops: lab/kernels/optim.py).

    bench_gpt2_small, bench_many_small   extras of the optim family (`python -m lab bench optim --extra gpt2_small`,
                                         the report): torch's for-loop / foreach / fused / torch.compile against v1..v4
    plot_steps                           their figure (results/<device>/plots/optim_steps.png), redrawn by `lab plot`
    attempt_std_vector, attempt_host_pointers, attempt_param_limit
                                         standalone programs of cuda_src/optim_attempts/, compiled with nvcc and run in
                                         a subprocess (lab.build.compile_standalone / run_standalone): a fault there
                                         leaves this process's CUDA context usable
"""
from __future__ import annotations

import math
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import matplotlib.pyplot as plt
import torch

from .. import build, env, registry, results
from ..ceilings import ceilings, ceilings_cached
from ..plot import save_figure   # (lab.plot picks matplotlib's backend: Agg outside a notebook)
from ..timing import time_cuda
from ..kernels.optim import FAMILY, FORMULA, IDEAS, Adam, AdamW, gpt2_small_shapes, many_small_shapes


# ---- extras: whole optimizer steps on a model's parameter list ---------------------------------------------------
def _variants(quick: bool) -> list[tuple[str, Callable, bool]]:
    """(name, make optimizer from params, also time a CUDA-graph replay)."""
    lr = 1e-3
    vs = [("torch.for-loop", lambda ps: torch.optim.AdamW(ps, lr=lr, foreach=False), False),
          ("torch.foreach", lambda ps: torch.optim.AdamW(ps, lr=lr, foreach=True), False),
          ("torch.fused", lambda ps: torch.optim.AdamW(ps, lr=lr, fused=True), False),
          ("torch.fused+capturable", lambda ps: torch.optim.AdamW(ps, lr=lr, fused=True, capturable=True), True)]
    if quick:
        vs = vs[1:4]   # foreach, fused and fused+capturable: the eager and the graph baselines
    vs += [(v, (lambda v: lambda ps: AdamW(ps, lr=lr, version=v))(v), True) for v in IDEAS]
    return vs


def _row(op: str, version: str, sizes: list[int], t, nbytes: float, copy_gbps: float,
         base: tuple[str, float] | None, device, note: str = "") -> dict:
    """base: (baseline name, its median) in the row's mode (eager rows against torch.fused, graph replays against
    torch.fused+capturable replayed from a graph), or None."""
    sec = t.median_us * 1e-6
    gbps = nbytes / sec / 1e9
    return {"family": FAMILY, "op": op, "version": version,
            "shape": f"tensors={len(sizes)} numel={sum(sizes)}", "size": sum(sizes), "dtype": "float32",
            "precision": "float32", "mode": t.mode, "median_us": t.median_us, "p20_us": t.p20_us,
            "p80_us": t.p80_us, "reps": t.reps, "gbps": gbps, "tflops": None, "pct_copy_bw": 100 * gbps / copy_gbps,
            "pct_peak": None,
            "baseline": f"{base[0]} ({t.mode})" if base else None,
            "speedup": base[1] / t.median_us if base else None, "note": note,
            **results.stamp(device)}


def host_us(step: Callable[[], object], reps: int = 20) -> float:
    """Median CPU time to issue one step (no synchronisation inside): what a launch-bound step costs the host."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return sorted(out)[len(out) // 2]


@build.frozen()   # (lab.timing is frozen; host_us's own loop calls the wrappers too: no file check there either)
def bench_param_list(op: str, shapes: list[tuple[int, ...]], device, record: bool = True, quick: bool = False,
                     compile_step: bool = True) -> list[dict]:
    """Time one AdamW step over the parameter list `shapes` (fp32) for every variant: torch's for-loop, foreach and
    fused, torch.compile of the step, and v1..v4 (CUDA-graph replays of v4 and torch's capturable fused too).
    Rows: GB/s = 28·numel / time. The compile time of torch.compile is its own row ('[compile]', mode 'wall')."""
    device = torch.device(device)
    if device.type != "cuda":
        print(f"[lab] optim {op}: the optimizer-step benchmarks run on CUDA only; skipped on the CPU")
        return []
    copy = ceilings(device)["copy_gbps"]
    sizes = [math.prod(s) for s in shapes]
    nbytes = 28.0 * sum(sizes)
    gen = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
    rows: list[dict] = []
    base: dict[str, tuple[str, float]] = {}   # mode -> (baseline, median): ratios within one mode
    label = f"{op}: {len(sizes)} tensors, {sum(sizes):,} params, {nbytes / 1e9:.3f} GB/step"
    print(f"[lab] optim {label}; floor at {copy:.0f} GB/s copy: {nbytes / copy / 1e6:.3f} ms", flush=True)

    def record_row(version, t, note=""):
        r = _row(op, version, sizes, t, nbytes, copy, base.get(t.mode), device, note)
        rows.append(r)
        print(f"[lab]   {version + (' (graph)' if t.mode == 'graph' else ''):<26} {t.median_us / 1e3:9.3f} ms  "
              f"{r['gbps']:7.0f} GB/s ({r['pct_copy_bw']:4.1f}% of copy)"
              + (f"  {r['speedup']:5.2f}x {r['baseline']}" if r["speedup"] else "") + (f"  {note}" if note else ""), flush=True)

    for name, make, graph in _variants(quick):
        opt = make(params)
        t = time_cuda(opt.step)
        if name == "torch.fused":
            base[t.mode] = (name, t.median_us)
        note = f"host {host_us(opt.step):.0f} us/step"
        if isinstance(opt, Adam):
            note += f", {opt.launches()[0]} launches"
        if name != "torch.fused+capturable":
            record_row(name, t, note)
        if graph:
            tg = time_cuda(opt.step, graph=True)
            if name == "torch.fused+capturable":
                base[tg.mode] = (name, tg.median_us)
            record_row(name, tg, "CUDA graph replay")
        del opt
        torch.cuda.empty_cache()
    if compile_step and not quick:
        rows += _compiled_step(op, params, sizes, nbytes, copy, device, record_row)
    del params
    torch.cuda.empty_cache()
    if record and rows:
        results.append(rows)
    return rows


def _compiled_step(op, params, sizes, nbytes, copy, device, record_row) -> list[dict]:
    """torch.compile of torch.optim.AdamW(foreach=True).step — vertical fusion by Inductor (the recipe 'Compiling
    the optimizer'); compile time with Inductor's caches off, as its own row."""
    # imported here, not at the top: Dynamo and Inductor take ~1.5 s to import, and only this benchmark uses them
    # (an `as` import: a bare `import torch.x` here would make torch local to the function)
    import torch._dynamo as dynamo
    import torch._inductor.config as inductor_config
    dynamo.reset()
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)

    @torch.compile(fullgraph=False)
    def step():
        opt.step()

    with inductor_config.patch(force_disable_caches=True):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        sec = time.perf_counter() - t0
    t = time_cuda(step)
    record_row("torch.compile", t, f"host {host_us(step):.0f} us/step; first call {sec:.1f} s (own row)")
    row = {"family": FAMILY, "op": op, "version": "torch.compile [compile]",
           "shape": f"tensors={len(sizes)} numel={sum(sizes)}", "size": sum(sizes), "dtype": "float32",
           "precision": "float32", "mode": "wall", "median_us": sec * 1e6, "p20_us": sec * 1e6, "p80_us": sec * 1e6,
           "reps": 1, "gbps": None, "tflops": None, "pct_copy_bw": None, "pct_peak": None, "speedup": None,
           "baseline": None,
           "note": "first call: Dynamo trace + Inductor compile (caches off) + one step, wall clock",
           **results.stamp(device)}
    print(f"[lab]   torch.compile first call (trace + compile + one step): {sec:.1f} s", flush=True)
    del opt, step
    dynamo.reset()
    return [row]


def bench_gpt2_small(device, record: bool = True, quick: bool = False) -> list[dict]:
    """AdamW over GPT-2 small's 148 parameter tensors (124M params, fp32): bandwidth-bound."""
    return bench_param_list("gpt2_small", gpt2_small_shapes(), device, record, quick)


def bench_many_small(device, record: bool = True, quick: bool = False) -> list[dict]:
    """AdamW over 2000 small tensors (64..8192 elements): launch-bound. torch.compile of this step compiles 2000
    tensors' worth of graph; it runs only with LAB_OPTIM_COMPILE_MANY=1 (its compile time is minutes)."""
    return bench_param_list("many_small", many_small_shapes(), device, record, quick,
                            compile_step=os.environ.get("LAB_OPTIM_COMPILE_MANY") == "1")


# ---- the figure ---------------------------------------------------------------------------------------------------
def plot_steps(rows: list[dict] | None = None, path: Path | str | None = None, device_name: str | None = None):
    """Step time and achieved bandwidth of every variant, one column per parameter list (rows: the extras' rows as
    recorded, or the newest ones in the results table of `device_name`, default the newest device's). Returns the
    figure's path (results/<device>/plots/optim_steps.png), or None without rows. `lab plot` redraws it."""
    if rows is None:
        rows = results.latest([r for r in results.read(family=FAMILY) if r["op"] in ("gpt2_small", "many_small")])
        if rows and not device_name:
            device_name = max(rows, key=lambda r: r["timestamp"] or "")["device_name"]
        rows = [r for r in rows if r["device_name"] == device_name]
    rows = [r for r in rows if r["mode"] != "wall"]
    ops = [o for o in ("gpt2_small", "many_small") if any(r["op"] == o for r in rows)]
    if not ops:
        return None
    fig, axes = plt.subplots(2, len(ops), figsize=(6.5 * len(ops), 7.5), squeeze=False)
    for j, op in enumerate(ops):
        sel = [r for r in rows if r["op"] == op]
        names = [r["version"] + (" (graph)" if r["mode"] == "graph" else "") for r in sel]
        colors = ["0.6" if r["version"].startswith("torch") else "C0" for r in sel]
        ms = [r["median_us"] / 1e3 for r in sel]
        ax = axes[0][j]
        bars = ax.bar(names, ms, color=colors)
        for b, v in zip(bars, ms):
            ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms per step (median)")
        ax.set_title(f"AdamW step, {op}: {sel[0]['shape']}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")   # names end under their bar
        ax = axes[1][j]
        gb = [r["gbps"] for r in sel]
        ax.bar(names, gb, color=colors)
        ceil = ceilings_cached(sel[0]["device_name"], sel[0]["torch"]) or {}
        if ceil.get("copy_gbps"):
            ax.axhline(ceil["copy_gbps"], color="k", lw=0.8, ls="--")
            ax.annotate(f"copy {ceil['copy_gbps']:.0f} GB/s", (0, ceil["copy_gbps"]), fontsize=7, va="bottom")
        ax.set_ylabel("achieved GB/s (28 B/param / time)")
        ax.tick_params(axis="x", labelsize=7)
        plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")   # names end under their bar
    r0 = sel[0]
    fig.text(0.01, 0.005, f"{FORMULA}\n{r0['device_name']} · torch {r0['torch']} · CUDA {r0['cuda']} · "
                          f"commit {r0['commit']} · {r0['timestamp']}", fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    if path is None:
        return save_figure(fig, "optim_steps", dpi=130, device_name=r0["device_name"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# ---- the failed attempts of the notes, in a subprocess -----------------------------------------------------------
ATTEMPTS = env.CUDA_SRC / "optim_attempts"


@dataclass
class Attempt:
    name: str
    built: bool            # nvcc accepted it
    ran: bool              # the program ran (False: not built, or no GPU)
    outcome: str           # one line: what happened
    log: str = ""          # compiler or program output


def _compile(src: str, defines: Iterable[str] = (), *, workdir: str) -> tuple[bool, str, str | None]:
    """nvcc a standalone program of cuda_src/optim_attempts/ -> (built, compiler output, binary path)."""
    out = Path(workdir) / Path(src).stem
    ok, log = build.compile_standalone(ATTEMPTS / src, out, [*defines])
    return ok, log, str(out) if ok else None


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if re.search(r"error", line, re.I):
            return re.sub(r"^\S*optim_attempts/", "", line.strip())
    return log.strip().splitlines()[-1] if log.strip() else ""


def attempt_std_vector() -> Attempt:
    """Attempt 1: pass std::vector<float*> to the kernel. nvcc refuses: its operator[] is host code."""
    with tempfile.TemporaryDirectory(prefix="lab-optim-") as tmp:
        ok, log, _ = _compile("std_vector.cu", workdir=tmp)
    return Attempt("1: std::vector<float*> as a kernel argument", ok, False,
                   "compiled (unexpected)" if ok else f"nvcc refuses: {_first_error(log)}", log)


def attempt_host_pointers() -> list[Attempt]:
    """Attempt 2: a host array of device pointers (float**) -> the kernel's first load through it faults; the same
    array copied to device memory works (the notes' 'revisit attempt 2'). Each in its own process: the fault
    leaves that process's CUDA context unusable, never this one's."""
    with tempfile.TemporaryDirectory(prefix="lab-optim-") as tmp:
        ok, log, binary = _compile("host_pointer_table.cu", workdir=tmp)
        out = []
        for mode in ("host", "device"):
            if not ok:
                out.append(Attempt(f"2: pointer table in {mode} memory", False, False, _first_error(log), log))
                continue
            if not torch.cuda.is_available():
                out.append(Attempt(f"2: pointer table in {mode} memory", True, False, "built; needs a GPU to run"))
                continue
            rc, text = build.run_standalone(binary, mode)
            line = next((ln for ln in text.splitlines() if ln.startswith("RESULT")), text[-300:])
            out.append(Attempt(f"2: pointer table in {mode} memory", True, True, line, text))
        return out


def attempt_param_limit(tensors: Iterable[int] = (255, 256, 2047, 2048)) -> list[Attempt]:
    """Attempt 3: all pointers in one struct passed by value (16 bytes per tensor + 4 for the scale). 255 tensors
    fit the classic 4 KB; 256 do not, yet compile (CUDA >= 12.1 allows 32764 bytes on Volta+); 2047 fit 32764;
    2048 do not, and nvcc says so."""
    out = []
    with tempfile.TemporaryDirectory(prefix="lab-optim-") as tmp:
        for n in tensors:
            ok, log, binary = _compile("param_limit.cu", [f"N_TENSORS={n}"], workdir=tmp)
            name = f"3: struct of {n} tensors by value ({16 * n + 4} bytes of parameters)"
            if not ok:
                out.append(Attempt(name, False, False, f"nvcc refuses: {_first_error(log)}", log))
            elif not torch.cuda.is_available():
                out.append(Attempt(name, True, False, "compiled; needs a GPU to run"))
            else:
                rc, text = build.run_standalone(binary)
                line = next((ln for ln in text.splitlines() if ln.startswith("RESULT")), text[-300:])
                out.append(Attempt(name, True, True, line, text))
    return out


registry.attach_extras(FAMILY, {"gpt2_small": bench_gpt2_small, "many_small": bench_many_small})
registry.attach_plots(FAMILY, [lambda device_name: plot_steps(device_name=device_name)])
