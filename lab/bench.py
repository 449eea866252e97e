"""How fast is each version? The sweep over an op's versions, dtypes and shapes, and the tables that show it.

bench_op times every (version, dtype, shape) of an op with lab.timing, beside the baselines its ratios need (in the
same launch mode and precision), reads each time against the device's ceilings (lab.ceilings) as GB/s, TFLOP/s and
percentages, and appends the rows to the results table. compare_table and summary_table print them.

Layers: lab.timing (events, L2 flush, graphs, CPU timing) <- lab.ceilings (copy, GEMM and FMA ceilings) <- here.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.utils.benchmark as tbench
from torch.utils.benchmark.utils.common import Measurement, TaskSpec

from . import results
from .ceilings import ceilings, peak_for
from .registry import Op, Version, shape_label
from .timing import time_fn
from .verify import dtype_name


def _timed_call(v: Version, inputs: tuple) -> Callable[[], object]:
    if v.takes_out:
        out = v.fn(*inputs)               # allocate once; the timed calls write into it
        return lambda: v.fn(*inputs, out=out)
    return lambda: v.fn(*inputs)


def precision_of(v: Version, dtype: torch.dtype) -> str:
    """What a version computes in: its declared precision ("tf32") or its dtype's name."""
    return v.precision_at(dtype) or dtype_name(dtype)


def reference_baseline(op: Op, device, dtype: torch.dtype, precision: str) -> Version | None:
    """The baseline a `precision` row of `op` is compared with: op.baseline when it computes in that precision, else
    the first baseline version that does (linear's TF32 rungs against `torch.tf32`, not strict-fp32 cuBLAS); None
    when no baseline computes in it (no ratio is better than one against another precision)."""
    cands = [v for v in op.versions_for(device, dtype) if v.baseline and precision_of(v, dtype) == precision]
    named = [v for v in cands if v.name == op.baseline]
    return (named or cands or [None])[0]


def assign_speedups(rows: list[dict]) -> list[dict]:
    """speedup = the reference baseline's median / the row's median, within one (dtype, shape, mode, precision):
    graph rows against the baseline replayed from a graph, eager against eager, TF32 against TF32. A row without
    such a baseline row gets None. Each row's `baseline` names the baseline and the mode ("torch.tf32 (graph)").
    Rows must carry `_ref` (the reference baseline's name for their precision, or None)."""
    base = {(r["dtype"], r["shape"], r["mode"], r["precision"]): r["median_us"] for r in rows
            if r.get("_ref") and r["version"] == r["_ref"]}
    for r in rows:
        ref = r.pop("_ref", None)
        b = base.get((r["dtype"], r["shape"], r["mode"], r["precision"])) if ref else None
        r["baseline"] = f"{ref} ({r['mode']})" if ref else None
        r["speedup"] = b / r["median_us"] if b else None
    return rows


def bench_op(op: Op, device: torch.device | str, dtypes=None, versions=None, shapes=None, graph: bool | None = None,
             record: bool = True, progress: bool = True, note: str = "") -> list[dict]:
    """Time every (version, dtype, shape) of `op` on `device`, with the baselines its ratios need timed beside it in
    the same modes; returns (and records) rows. Speedups: see assign_speedups."""
    device = torch.device(device)
    ceil = ceilings(device)
    rows: list[dict] = []
    shapes = shapes or op.shapes_for(device)
    dtypes = [d for d in (dtypes or op.dtypes) if d in op.dtypes]
    todo = [(d, s, v) for d in dtypes for s in shapes for v in op.versions_for(device, d, versions)]

    def graphed(v: Version) -> bool:
        return device.type == "cuda" and (v.graph if graph is None else graph)

    # Each precision's reference baseline, timed in every mode a version of that precision is timed in.
    refs: dict[tuple, Version | None] = {}
    force_graph: set[tuple] = set()   # (dtype, ref name): the baseline also replayed from a graph
    for d, _, v in list(todo):
        prec = precision_of(v, d)
        if (d, prec) not in refs:
            refs[(d, prec)] = reference_baseline(op, device, d, prec)
        ref = refs[(d, prec)]
        if ref is None:
            continue
        if not any(x is ref and xd == d for xd, _, x in todo):
            todo += [(d, s, ref) for s in shapes]
        if graphed(v) and not graphed(ref):
            force_graph.add((d, ref.name))
    todo.sort(key=lambda t: (dtypes.index(t[0]), shapes.index(t[1]), not t[2].baseline))
    inputs_cache: dict[tuple, tuple] = {}
    for i, (dtype, shape, v) in enumerate(todo):
        key = (dtype, shape_label(shape))
        if key not in inputs_cache:
            inputs_cache.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            inputs_cache[key] = op.make_inputs(shape, dtype, device, torch.Generator().manual_seed(1234))
        inputs = inputs_cache[key]
        forced = (dtype, v.name) in force_graph
        modes = [False] + ([True] if graphed(v) or forced else [])
        for use_graph in modes:
            try:
                # (lab.timing runs under build.frozen: the wrappers' per-call source-file check is not timed)
                t = time_fn(_timed_call(v, inputs), device, graph=use_graph)
            except Exception as e:  # noqa: BLE001 — a baseline replayed only for the ratios: say so, go on
                if not (use_graph and forced):
                    raise
                print(f"[lab] {op.family}.{op.name} {v.name}: no graph replay ({type(e).__name__}: {e}); graph rows "
                      f"of {dtype_name(dtype)} get no speedup", flush=True)
                continue
            nb = op.nbytes(shape, dtype) if op.nbytes else None
            fl = op.flops(shape, dtype) if op.flops else None
            sec = t.median_us * 1e-6
            gbps = nb / sec / 1e9 if nb else None
            tflops = fl / sec / 1e12 if fl else None
            peak = peak_for(ceil, dtype, v.precision_at(dtype), v.ceiling or op.compute_ceiling)
            row = {
                "family": op.family, "op": op.name, "version": v.name, "shape": shape_label(shape),
                "size": shape.get(op.size_key) if op.size_key else None, "dtype": dtype_name(dtype),
                "precision": precision_of(v, dtype), "mode": t.mode,
                "median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us, "reps": t.reps,
                "gbps": gbps, "tflops": tflops,
                "pct_copy_bw": 100 * gbps / ceil["copy_gbps"] if gbps else None,
                "pct_peak": 100 * tflops / peak if tflops and peak else None,
                "baseline": None, "speedup": None, "_ref": getattr(refs.get((dtype, precision_of(v, dtype))),
                                                                    "name", None),
                "note": note, **results.stamp(device),
                # the repetition's two parts (GPU rows): an eager row whose host_us passes gpu_us is host-bound
                "gpu_us": statistics.median(t.gpu_us) if t.gpu_us else None,
                "host_us": statistics.median(t.host_us) if t.host_us else None,
            }
            rows.append(row)
            if progress:
                extra = f"  {gbps:7.1f} GB/s" if gbps else ""
                extra += f"  {tflops:6.2f} TFLOP/s" if tflops else ""
                print(f"[lab] ({i + 1}/{len(todo)}) {op.family}.{op.name} {v.name:<14} {dtype_name(dtype):<8} "
                      f"{shape_label(shape):<24} {t.median_us:10.2f} us ({t.mode}){extra}", flush=True)
    assign_speedups(rows)
    if record and rows:
        results.append(rows)
    return rows


def compare_table(rows: list[dict], title: str = "") -> str:
    """A torch.utils.benchmark.Compare table: shapes as rows, versions (and graph replays) as columns."""
    ms = []
    for r in rows:
        col = r["version"] + (" (graph)" if r["mode"] == "graph" else "")
        spec = TaskSpec(stmt=f"{r['op']}", setup="", label=title or f"{r['family']}.{r['op']} {r['dtype']} "
                        f"on {r['device_name']}", sub_label=r["shape"], description=col,
                        env=r["dtype"], num_threads=1)
        # Compare shows the median of raw times; the row carries the median, so one raw time per row suffices
        ms.append(Measurement(number_per_run=1, raw_times=[r["median_us"] * 1e-6], task_spec=spec))
    cmp = tbench.Compare(ms)
    cmp.trim_significant_figures()
    return str(cmp)


def summary_table(rows: list[dict]) -> str:
    """Plain-text table of the rows with rate columns (what Compare cannot show). 'GPU us' is the median of the GPU's
    part of each repetition (CUDA rows timed since it was recorded): a repetition's time is the larger of the GPU's
    and the host's, so where 'median us' is above it, the host's issue of the call set the time (small eager calls,
    and graph replays of short kernels, whose launch costs the host microseconds)."""
    lines = [f"{'op':<14} {'version':<16} {'dtype':<8} {'shape':<26} {'median us':>10} {'GPU us':>9} {'GB/s':>8} "
             f"{'%copy':>6} {'TFLOP/s':>8} {'%peak':>6} {'speedup':>8}"]
    for r in rows:
        col = r["version"] + (" (graph)" if r["mode"] == "graph" else "")
        f = lambda x, fmt: (fmt % x) if x is not None else "-"
        lines.append(f"{r['op']:<14} {col:<16} {r['dtype']:<8} {r['shape']:<26} {r['median_us']:>10.2f} "
                     f"{f(r.get('gpu_us'), '%9.2f'):>9} {f(r['gbps'], '%8.1f'):>8} {f(r['pct_copy_bw'], '%5.1f'):>6} "
                     f"{f(r['tflops'], '%8.2f'):>8} {f(r['pct_peak'], '%5.1f'):>6} {f(r['speedup'], '%7.2fx'):>8}")
    return "\n".join(lines)
